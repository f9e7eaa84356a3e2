"""A scripted model for the fake provider: it makes an agent CLI look at screenshots with its own image tool.

`FakeProvider(script=AgentScript(shots, final))` answers each request that offers the agent's image tool
with a call of that tool on the next screenshot in `shots` (absolute paths), one per turn, and once every
screenshot has been looked at, with the text `final`:

- Claude Code (Anthropic Messages): a `tool_use` of `Read` with `file_path`;
- Codex (OpenAI Responses): a `function_call` of `view_image` with `path`;
- Gemini CLI (Gemini): a `functionCall` of `read_file` with `file_path`;
- on OpenAI chat completions, a `tool_calls` entry of the first image tool the request offers: pi's and
  OpenClaw's `read` with `path`, opencode's and Kilo Code's `read` with `filePath`, Qwen Code's `read_file`
  with `file_path`, Cline's `read_files` with `files: [{path}]` (a tool whose arguments are not declared matches by its name alone).
- Hermes Agent (OpenAI chat completions): a `tool_calls` entry of `vision_analyze` with `image_url` (and the
  `question` it requires).

With `recall`, once every screenshot has been looked at, the model calls the recall tool an MCP server offers
(a tool named `...recall_image`, docs/how-it-works.md#recall) twice before its final text: first with an id no
placeholder names (UNKNOWN_ID: the tool's error comes back), then with the first id a placeholder in the request names.
An agent that starts its MCP servers beside its first turns (Codex) may not offer the tool yet: the model then looks at
the last screenshot again, turn after turn, for at most RECALL_WAIT seconds.

`AddedImagesScript` plays the model of an agent with no image tool, whose user adds the screenshots (aider's
`/add`): it answers each chat completion with a short text, and `final` once the user's last message names the
last screenshot.

Which screenshot comes next is read from the request itself, the tool results it carries (tool_result
blocks, function_call_output items, functionResponse parts, tool messages), so the script holds no state and any replay
of a conversation gets the same answer. A request that does not offer the tool (a title, a classifier, a
token count) is not scripted: the fake provider answers it as usual. Answers come as JSON or streamed, in
each API's own event sequence, with the usage the fake provider worked out.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

import orjson

from ..formats._base import dicts
from ._fake_usage import FakeUsage
from ._replies import ResponsesEvents, anthropic_message, anthropic_usage, chat_usage, gemini_usage, new_id, responses_message, responses_object, sse

Scripted = tuple[str, list[bytes]]
"""(content type, frames): one frame when the answer is not streamed, one event per frame when it is."""

SSE = "text/event-stream; charset=utf-8"
JSON = "application/json"


@dataclass(frozen=True, slots=True)
class ImageTool:
    """An agent's tool that reads an image file: its name and the argument that takes the path."""

    name: str
    path_argument: str
    entry: str | None = None  # the path goes in a list of entries, each {entry: path}, under path_argument
    other_arguments: tuple[tuple[str, str], ...] = ()  # arguments the tool requires besides the path, as given
    namespace: str | None = None  # a Responses tool declared in a namespace (Codex's MCP tools): its call names it

    def arguments(self, path: str) -> dict[str, Any]:
        return {self.path_argument: [{self.entry: path}] if self.entry is not None else path, **dict(self.other_arguments)}


# Per format, the image tools of the agents that speak it: a request is answered with the first it offers.
TOOLS: dict[str, tuple[ImageTool, ...]] = {
    "anthropic": (ImageTool("Read", "file_path"),),
    "openai-responses": (ImageTool("view_image", "path"),),
    "gemini": (ImageTool("read_file", "file_path"),),
    "openai-chat": (
        ImageTool("vision_analyze", "image_url", other_arguments=(("question", "What does this screenshot show?"),)),
        ImageTool("read", "path"),
        ImageTool("read", "filePath"),
        ImageTool("read_file", "file_path"),
        ImageTool("read_files", "files", entry="path"),
    ),
}


UNKNOWN_ID = "aaaaaaaaaa"  # an id no placeholder names
RECALL_WAIT = 60.0  # seconds the model waits for the recall tool to be offered, looking at the last screenshot again
_RECALL_ID = re.compile(rb'recall_image\(\\"([a-z2-7]{10})\\"\)')  # as a placeholder's text reads inside JSON


class AgentScript:
    """The fake provider's `script` hook (see the module docstring). `calls` counts the image tool calls it made,
    `recalled` the ids it asked the recall tool for."""

    def __init__(self, shots: Sequence[str], final: str, recall: bool = False) -> None:
        self.shots = list(shots)
        self.final = final
        self.calls = 0
        self.recall = recall
        self.recalled: list[str] = []
        self._waiting_since: float | None = None

    def __call__(self, fmt: str, request: dict[str, Any], usage: FakeUsage, stream: bool, sse: bool) -> Scripted | None:
        tool = image_tool(fmt, request)
        if tool is None:
            return None
        done = tool_results(fmt, request)
        call = None
        if done < len(self.shots):
            call = tool.arguments(self.shots[done])
            self.calls += 1
        elif self.recall and len(self.recalled) < 2:
            recall = recall_tool(fmt, request)
            named = _RECALL_ID.findall(orjson.dumps(request))
            if recall is not None and named:
                wanted = named[0].decode() if self.recalled else UNKNOWN_ID
                self.recalled.append(wanted)
                tool, call = recall, {"id": wanted}
            elif named and self._still_waiting():
                call = tool.arguments(self.shots[-1])
        model = request.get("model")
        model = model if isinstance(model, str) else "fake-model"
        if fmt == "anthropic":
            return _anthropic(model, tool, call, self.final, usage, stream)
        if fmt == "openai-responses":
            return _responses(request, model, tool, call, self.final, usage, stream)
        if fmt == "openai-chat":
            return _chat(request, model, tool, call, self.final, usage, stream)
        return _gemini(model, tool, call, self.final, usage, stream, sse)

    def _still_waiting(self) -> bool:
        """Whether the model goes on waiting for the recall tool (RECALL_WAIT from the first request it waited on)."""
        now = time.monotonic()
        if self._waiting_since is None:
            self._waiting_since = now
        return now - self._waiting_since < RECALL_WAIT


class AddedImagesScript:
    """The fake provider's `script` hook for an agent whose user adds the screenshots (see the module docstring).
    `answers` counts the chat completions it answered."""

    def __init__(self, shots: Sequence[str], final: str) -> None:
        self.last = PurePath(shots[-1]).name
        self.final = final
        self.answers = 0

    def __call__(self, fmt: str, request: dict[str, Any], usage: FakeUsage, stream: bool, sse: bool) -> Scripted | None:
        if fmt != "openai-chat" or offered_tools(fmt, request):
            return None
        self.answers += 1
        text = self.final if self.last in last_user_text(request) else "Noted."
        model = request.get("model")
        return _chat(request, model if isinstance(model, str) else "fake-model", None, None, text, usage, stream)


def last_user_text(request: dict[str, Any]) -> str:
    """The text of the last user message of a chat completion request."""
    users = [m for _, m in dicts(request.get("messages")) if m.get("role") == "user"]
    if not users:
        return ""
    content = users[-1].get("content")
    if isinstance(content, str):
        return content
    return " ".join(str(part.get("text")) for _, part in dicts(content) if part.get("type") == "text")


def recall_tool(fmt: str, request: dict[str, Any]) -> ImageTool | None:
    """The recall tool an MCP server offers (Claude Code: `mcp__trimflow__recall_image`; Codex: `recall_image` in the
    namespace `mcp__trimflow`), or None."""
    for name in offered_tools(fmt, request):
        if name.endswith("recall_image"):
            return ImageTool(name, "id")
    for _, declared in dicts(request.get("tools")):
        if declared.get("type") == "namespace":
            for _, inner in dicts(declared.get("tools")):
                if inner.get("name") == "recall_image":
                    return ImageTool("recall_image", "id", namespace=str(declared.get("name")))
    return None


def image_tool(fmt: str, request: dict[str, Any]) -> ImageTool | None:
    """The agent's image tool among those the request offers, or None."""
    offered = offered_tools(fmt, request)
    for tool in TOOLS.get(fmt, ()):
        arguments = offered.get(tool.name)
        if arguments is not None and (not arguments or tool.path_argument in arguments):
            return tool
    return None


def offered_tools(fmt: str, request: dict[str, Any]) -> dict[str, set[str]]:
    """The tools the request offers the model: name -> the names of its arguments (empty when not declared)."""
    tools = request.get("tools")
    if not isinstance(tools, list):
        return {}
    if fmt == "gemini":
        declared = [d for t in tools if isinstance(t, dict) for d in t.get("functionDeclarations") or []]
    elif fmt == "openai-chat":  # {"type": "function", "function": {"name", "parameters"}}
        declared = [t["function"] for t in tools if isinstance(t, dict) and isinstance(t.get("function"), dict)]
    else:
        declared = list(tools)
    offered: dict[str, set[str]] = {}
    for d in declared:
        if isinstance(d, dict):
            schema = d.get("parameters") or d.get("parametersJsonSchema") or d.get("input_schema")
            properties = schema.get("properties") if isinstance(schema, dict) else None
            offered[str(d.get("name"))] = set(properties) if isinstance(properties, dict) else set()
    return offered


def tool_results(fmt: str, request: dict[str, Any]) -> int:
    """How many tool results the conversation holds: the calls answered so far."""
    if fmt == "anthropic":
        return sum(
            1 for _, message in dicts(request.get("messages")) for _, block in dicts(message.get("content")) if block.get("type") == "tool_result"
        )
    if fmt == "openai-responses":
        return sum(1 for _, item in dicts(request.get("input")) if item.get("type") == "function_call_output")
    if fmt == "openai-chat":
        return sum(1 for _, message in dicts(request.get("messages")) if message.get("role") == "tool")
    return sum(1 for _, content in dicts(request.get("contents")) for _, part in dicts(content.get("parts")) if "functionResponse" in part)


def _json(data: Any) -> bytes:
    return orjson.dumps(data)


# --- Anthropic Messages ------------------------------------------------------------------------------------


def _anthropic(model: str, tool: ImageTool, call: dict[str, Any] | None, final: str, usage: FakeUsage, stream: bool) -> Scripted:
    if call is not None:
        block: dict[str, Any] = {"type": "tool_use", "id": new_id("toolu_"), "name": tool.name, "input": call}
        stop = "tool_use"
    else:
        block, stop = {"type": "text", "text": final}, "end_turn"
    if not stream:
        return JSON, [_json(anthropic_message(new_id("msg_"), model, [block], stop, anthropic_usage(usage, usage.output_tokens)))]
    start = anthropic_message(new_id("msg_"), model, [], None, anthropic_usage(usage, 1))
    empty = {**block, "input": {}} if call is not None else {"type": "text", "text": ""}
    delta = {"type": "input_json_delta", "partial_json": orjson.dumps(call).decode()} if call is not None else {"type": "text_delta", "text": final}
    frames = [
        sse({"type": "message_start", "message": start}, "message_start"),
        sse({"type": "content_block_start", "index": 0, "content_block": empty}, "content_block_start"),
        sse({"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta"),
        sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        sse(
            {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": {"output_tokens": usage.output_tokens}},
            "message_delta",
        ),
        sse({"type": "message_stop"}, "message_stop"),
    ]
    return SSE, frames


# --- OpenAI Responses --------------------------------------------------------------------------------------


def _responses(
    request: dict[str, Any], model: str, tool: ImageTool, call: dict[str, Any] | None, final: str, usage: FakeUsage, stream: bool
) -> Scripted:
    rid = new_id("resp_")
    if call is not None:
        item: dict[str, Any] = {
            "id": new_id("fc_"),
            "type": "function_call",
            "status": "completed",
            "call_id": new_id("call_"),
            "name": tool.name,
            "arguments": orjson.dumps(call).decode(),
        }
        if tool.namespace is not None:
            item["namespace"] = tool.namespace
    else:
        item = responses_message(new_id("msg_"), final, "completed")
    if not stream:
        return JSON, [_json(responses_object(rid, request, model, "completed", [item], usage))]
    events = ResponsesEvents(rid, request, model)
    frames = events.started()
    if call is not None:
        frames += [
            events.event("response.output_item.added", output_index=0, item={**item, "status": "in_progress", "arguments": ""}),
            events.event("response.function_call_arguments.delta", item_id=item["id"], output_index=0, delta=item["arguments"]),
            events.event("response.function_call_arguments.done", item_id=item["id"], output_index=0, arguments=item["arguments"]),
            events.event("response.output_item.done", output_index=0, item=item),
        ]
    else:
        message, item = events.text_message(item["id"], [final])
        frames += message
    frames.append(events.completed([item], usage))
    return SSE, frames


# --- OpenAI chat completions ----------------------------------------------------------------------------


def _chat(
    request: dict[str, Any], model: str, tool: ImageTool | None, call: dict[str, Any] | None, text: str, usage: FakeUsage, stream: bool
) -> Scripted:
    """A call of `tool` with `call` as its arguments, or (no call) the answer `text`."""
    cid, created = new_id("chatcmpl-"), int(time.time())
    tool_calls: list[dict[str, Any]] | None = None
    if tool is not None and call is not None:
        tool_calls = [{"id": new_id("call_"), "type": "function", "function": {"name": tool.name, "arguments": orjson.dumps(call).decode()}}]
    finish = "tool_calls" if tool_calls else "stop"
    if not stream:
        message: dict[str, Any] = {"role": "assistant", "content": None if tool_calls else text, "refusal": None}
        if tool_calls:
            message["tool_calls"] = tool_calls
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
        reply = {"id": cid, "object": "chat.completion", "created": created, "model": model, "choices": [choice], "usage": chat_usage(usage)}
        return JSON, [_json(reply)]
    opts = request.get("stream_options")
    include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))

    def chunk(delta: dict[str, Any] | None, finish_reason: str | None, usage_field: Any = None) -> bytes:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
        data: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": choices}
        if include_usage:
            data["usage"] = usage_field  # null on every chunk but the last, as real streams send it
        return sse(data)

    if tool_calls:
        (called,) = tool_calls
        opening = {**called, "index": 0, "function": {"name": tool.name if tool else "", "arguments": ""}}
        frames = [
            chunk({"role": "assistant", "content": None, "tool_calls": [opening]}, None),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": called["function"]["arguments"]}}]}, None),
        ]
    else:
        frames = [chunk({"role": "assistant", "content": "", "refusal": None}, None), chunk({"content": text}, None)]
    frames.append(chunk({}, finish))
    if include_usage:
        frames.append(chunk(None, None, chat_usage(usage)))
    frames.append(b"data: [DONE]\n\n")
    return SSE, frames


# --- Gemini ------------------------------------------------------------------------------------------------


def _gemini(model: str, tool: ImageTool, call: dict[str, Any] | None, final: str, usage: FakeUsage, stream: bool, sse: bool) -> Scripted:
    part: dict[str, Any] = {"functionCall": {"name": tool.name, "args": call}} if call is not None else {"text": final}
    chunk = {
        "candidates": [{"content": {"parts": [part], "role": "model"}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": gemini_usage(usage, final=True),
        "modelVersion": model.removeprefix("models/"),
        "responseId": new_id("resp-"),
    }
    if not stream:
        return JSON, [_json(chunk)]
    if sse:
        return SSE, [b"data: " + _json(chunk) + b"\r\n\r\n"]
    return "application/json; charset=UTF-8", [b"[" + _json(chunk), b"]"]
