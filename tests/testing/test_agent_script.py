"""trimflow.testing._agent_script: the fake provider, scripted, asks for one screenshot per turn through the
agent's own image tool (on chat completions, the one of the agent whose tool the request offers) and then answers
the final text; read by the real SDKs (anthropic, openai, google-genai),
JSON and streamed, so the answers are ones a real client parses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from google import genai
from google.genai import types

from trimflow.testing import REPLY_TEXT, FakeProvider
from trimflow.testing._agent_script import AddedImagesScript, AgentScript, tool_results

SHOTS = ["/work/shots/1.png", "/work/shots/2.png"]
FINAL = "done: looked at both screenshots"


@pytest.fixture(scope="module")
def provider() -> Iterator[FakeProvider]:
    with FakeProvider(script=AgentScript(SHOTS, FINAL)) as p:
        yield p


# --- Claude Code: Read ---------------------------------------------------------------------------------------

READ = {"name": "Read", "description": "Reads a file", "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}}


def claude_turn(client: anthropic.Anthropic, messages: list[dict[str, Any]], stream: bool) -> Any:
    args: dict[str, Any] = {"model": "claude-opus-5", "max_tokens": 100, "messages": messages, "tools": [READ]}
    if stream:
        with client.messages.stream(**args) as events:
            return events.get_final_message()
    return client.messages.create(**args)


@pytest.mark.parametrize("stream", [False, True])
def test_claude_reads_each_screenshot_then_gets_the_final_text(provider: FakeProvider, stream: bool) -> None:
    client = anthropic.Anthropic(base_url=provider.url, api_key="test-key", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "look at the screen"}]
    for shot in SHOTS:
        reply = claude_turn(client, messages, stream)
        (block,) = reply.content
        assert (reply.stop_reason, block.type, block.name, block.input) == ("tool_use", "tool_use", "Read", {"file_path": shot})
        messages += [
            {"role": "assistant", "content": [block.model_dump()]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "an image"}]},
        ]
    reply = claude_turn(client, messages, stream)
    assert (reply.stop_reason, reply.content[0].text) == ("end_turn", FINAL)
    assert reply.usage.input_tokens > 0


def test_a_request_without_the_tool_gets_the_usual_reply(provider: FakeProvider) -> None:
    client = anthropic.Anthropic(base_url=provider.url, api_key="test-key", max_retries=0)
    reply = client.messages.create(model="claude-haiku-4-5", max_tokens=10, messages=[{"role": "user", "content": "a title please"}])
    assert reply.content[0].text == REPLY_TEXT


# --- Codex: view_image --------------------------------------------------------------------------------------

VIEW_IMAGE = {"type": "function", "name": "view_image", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}


def codex_turn(client: openai.OpenAI, items: list[dict[str, Any]], stream: bool) -> Any:
    args: dict[str, Any] = {"model": "gpt-5", "input": items, "tools": [VIEW_IMAGE]}
    if not stream:
        return client.responses.create(**args)
    events = list(client.responses.create(**args, stream=True))
    assert events[-1].type == "response.completed"
    return events[-1].response


@pytest.mark.parametrize("stream", [False, True])
def test_codex_views_each_screenshot_then_gets_the_final_text(provider: FakeProvider, stream: bool) -> None:
    client = openai.OpenAI(base_url=provider.url + "/v1", api_key="test-key", max_retries=0)
    items: list[dict[str, Any]] = [{"role": "user", "content": "look at the screen"}]
    for shot in SHOTS:
        (call,) = codex_turn(client, items, stream).output
        assert (call.type, call.name, json.loads(call.arguments)) == ("function_call", "view_image", {"path": shot})
        items += [call.model_dump(exclude_none=True), {"type": "function_call_output", "call_id": call.call_id, "output": "an image"}]
    assert codex_turn(client, items, stream).output_text == FINAL


# --- Gemini CLI: read_file ----------------------------------------------------------------------------------

READ_FILE = types.Tool(
    function_declarations=[
        types.FunctionDeclaration(name="read_file", parameters_json_schema={"type": "object", "properties": {"file_path": {"type": "string"}}})
    ]
)


@pytest.mark.parametrize("stream", [False, True])
def test_gemini_reads_each_screenshot_then_gets_the_final_text(provider: FakeProvider, stream: bool) -> None:
    with genai.Client(api_key="test-key", http_options=types.HttpOptions(base_url=provider.url)) as client:
        config = types.GenerateContentConfig(tools=[READ_FILE])
        contents: list[types.Content] = [types.Content(role="user", parts=[types.Part(text="look at the screen")])]

        def turn() -> types.GenerateContentResponse:
            if stream:
                (chunk,) = list(client.models.generate_content_stream(model="gemini-2.5-flash", contents=contents, config=config))
                return chunk
            return client.models.generate_content(model="gemini-2.5-flash", contents=contents, config=config)

        for shot in SHOTS:
            reply = turn()
            (call,) = reply.function_calls or []
            assert (call.name, call.args) == ("read_file", {"file_path": shot})
            response = types.Part.from_function_response(name="read_file", response={"output": "an image"})
            contents += [reply.candidates[0].content, types.Content(role="user", parts=[response])]
        assert turn().text == FINAL


# --- chat completions: each agent's image tool, picked by its name and argument -----------------------------


def chat_tool(name: str, argument: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    properties = {argument: schema or {"type": "string"}}
    return {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": properties}}}


CHAT_TOOLS = {
    "pi": (chat_tool("read", "path"), {"path": SHOTS[0]}),
    "opencode": (chat_tool("read", "filePath"), {"filePath": SHOTS[0]}),
    "qwen": (chat_tool("read_file", "file_path"), {"file_path": SHOTS[0]}),
    "cline": (chat_tool("read_files", "files", {"type": "array"}), {"files": [{"path": SHOTS[0]}]}),
}


def chat_turn(client: openai.OpenAI, messages: list[dict[str, Any]], tools: list[dict[str, Any]], stream: bool) -> Any:
    args: dict[str, Any] = {"model": "gpt-4o", "messages": messages, **({"tools": tools} if tools else {})}
    if not stream:
        return client.chat.completions.create(**args).choices[0].message
    with client.chat.completions.stream(**args, stream_options={"include_usage": True}) as events:
        final = events.get_final_completion()
    assert final.usage is not None and final.usage.prompt_tokens > 0
    return final.choices[0].message


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_agent_reads_each_screenshot_then_gets_the_final_text(provider: FakeProvider, stream: bool) -> None:
    client = openai.OpenAI(base_url=provider.url + "/v1", api_key="test-key", max_retries=0)
    tools = [chat_tool("bash", "command"), CHAT_TOOLS["pi"][0]]  # other tools offered first
    messages: list[dict[str, Any]] = [{"role": "user", "content": "look at the screen"}]
    for shot in SHOTS:
        message = chat_turn(client, messages, tools, stream)
        (call,) = message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)) == ("read", {"path": shot})
        messages += [message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "an image"}]
    message = chat_turn(client, messages, tools, stream)
    assert (message.content, message.tool_calls) == (FINAL, None)


@pytest.mark.parametrize("agent", sorted(CHAT_TOOLS))
def test_each_chat_agents_tool_is_called_with_its_own_argument(provider: FakeProvider, agent: str) -> None:
    client = openai.OpenAI(base_url=provider.url + "/v1", api_key="test-key", max_retries=0)
    tool, arguments = CHAT_TOOLS[agent]
    (call,) = chat_turn(client, [{"role": "user", "content": "look"}], [tool], stream=False).tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (tool["function"]["name"], arguments)


def test_a_chat_tool_of_that_name_with_other_arguments_is_not_scripted(provider: FakeProvider) -> None:
    client = openai.OpenAI(base_url=provider.url + "/v1", api_key="test-key", max_retries=0)
    message = chat_turn(client, [{"role": "user", "content": "look"}], [chat_tool("read", "url")], stream=False)
    assert (message.content, message.tool_calls) == (REPLY_TEXT, None)


def test_the_next_screenshot_is_counted_from_the_tool_results_in_the_request() -> None:
    assert tool_results("anthropic", {"messages": [{"role": "user", "content": [{"type": "tool_result"}, {"type": "text"}]}] * 2}) == 2
    assert tool_results("openai-responses", {"input": [{"type": "function_call"}, {"type": "function_call_output"}]}) == 1
    assert tool_results("gemini", {"contents": [{"parts": [{"functionCall": {}}]}, {"parts": [{"functionResponse": {}}]}]}) == 1
    assert tool_results("openai-chat", {"messages": [{"role": "assistant"}, {"role": "tool"}, {"role": "tool"}]}) == 2
    assert tool_results("anthropic", {"messages": "not a list"}) == 0


# --- Hermes Agent: vision_analyze (OpenAI chat completions) --------------------------------------------------

VISION_ANALYZE = {
    "type": "function",
    "function": {
        "name": "vision_analyze",
        "parameters": {"type": "object", "properties": {"image_url": {"type": "string"}, "question": {"type": "string"}}},
    },
}


@pytest.mark.parametrize("stream", [False, True])
def test_hermes_analyzes_each_screenshot_then_gets_the_final_text(provider: FakeProvider, stream: bool) -> None:
    client = openai.OpenAI(base_url=provider.url + "/v1", api_key="test-key", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "look at the screen"}]
    for shot in SHOTS:
        message = chat_turn(client, messages, [VISION_ANALYZE], stream)
        (call,) = message.tool_calls
        assert (call.function.name, json.loads(call.function.arguments)["image_url"]) == ("vision_analyze", shot)
        assert json.loads(call.function.arguments)["question"]  # the tool requires one
        messages += [message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": "an image"}]
    message = chat_turn(client, messages, [VISION_ANALYZE], stream)
    assert (message.content, message.tool_calls) == (FINAL, None)


# --- aider: the user adds the screenshots ----------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_an_agent_whose_user_adds_screenshots_gets_the_final_text_once_the_last_is_named(stream: bool) -> None:
    script = AddedImagesScript(SHOTS, FINAL)
    with FakeProvider(script=script) as p:
        client = openai.OpenAI(base_url=p.url + "/v1", api_key="test-key", max_retries=0)
        first = chat_turn(client, [{"role": "user", "content": [{"type": "text", "text": "What changed in 1.png?"}]}], [], stream)
        last = chat_turn(client, [{"role": "user", "content": "What changed in 2.png?"}], [], stream)
        other = chat_turn(client, [{"role": "user", "content": "2.png"}], [VISION_ANALYZE], stream)  # an image tool: not this script's
    assert (first.content, last.content, script.answers) == ("Noted.", FINAL, 2)
    assert other.content == REPLY_TEXT
