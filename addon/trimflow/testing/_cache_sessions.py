"""Reference sessions, and what each pruning policy costs on them against the prompt cache model.

Twelve sessions, built deterministically with real Pillow screenshots (1280x800 PNG, distinct within a
session, 220-310 KB like a real desktop's; made once per run), each a list of turns: the request body as the
agent sends it (whole history, the agent's own `cache_control`), the think time before it (some gaps past the
5-minute TTL) and the tokens of the answer it gets. Six shapes (steady computer use, a Claude Code-style coding
session, chat pasting 3 screenshots a message, a Gemini browser agent, and pauses past the TTL every 15 turns
on two of them), each on Anthropic's cache and on an automatic one: OpenAI chat, OpenAI Responses (Codex,
computer use) or Gemini. docs/caching.md lists them.

- computer-use: Anthropic, 60 turns, a screenshot per turn in a `tool_result`, `cache_control` on the
  system prompt and on the last block, as Claude Code does;
- claude-code: Anthropic, 80 requests of a coding session (a long system prompt and tool definitions,
  file reads, shell output) that reads 20 screenshots;
- chat: OpenAI chat, a user pasting 3 screenshots into each of 15 messages;
- gemini: a Gemini 2.5 Flash browser agent, 40 turns, a screenshot per turn after each function call.

`run_policy` sends every turn of a session through the engine under one policy (a rules file with overrides),
in process, as one proxy remembers the conversation or as several behind a round-robin balancer do, then the
body the engine forwards through the cache model at the session's simulated time, and adds up what the
provider would bill. `python -m trimflow replay --policies` prints the tables.
"""

from __future__ import annotations

import argparse
import functools
import io
import random
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from PIL import Image, ImageDraw, ImageFont

from .._conversation import Conversations
from .._engine import prune
from .._limit_profiles import Profile, check, load_profiles
from .._prices import Price, PriceTable, load_prices
from .._rules import Rules
from .._rules_file import DEFAULT_RULES_PATH, load_rules
from .._tokens import text_tokens
from ..formats import FORMATS, IMAGE
from ._cache_model import CacheModel, CacheUsage, TooManyBreakpoints, prompt_of
from ._optimum import Optimum, Ratios, optima, policy_floor, price_for, ratios, session_cap
from ._synthetic import b64, data_url

__all__ = [
    "POLICIES",
    "REFERENCE_SESSIONS",
    "Policy",
    "PolicyResult",
    "ReferenceSession",
    "Turn",
    "TurnResult",
    "desktop_screenshot",
    "main",
    "run_policy",
    "turn_images",
]

SCREEN = (1280, 800)

# --- screenshots ----------------------------------------------------------------------------------------------

_WORDS = (
    "the of and to in is for on that with file edit view settings save cancel open project search results page "
    "window terminal build test run error warning info user account billing network deploy branch commit review "
    "close help tools format insert table chart export import preview share invite members status ready"
).split()


@functools.cache
def desktop_screenshot(seed: int) -> bytes:
    """A 1280x800 PNG like a desktop screenshot: a title bar, a sidebar, text in a main pane, buttons and a
    photo-like panel. Each seed draws a different screen; the same seed always the same bytes (cached per run)."""
    rng = random.Random(seed)
    width, height = SCREEN
    shade = rng.randrange(226, 246)
    img = Image.new("RGB", SCREEN, (shade, shade, shade + 4 if shade < 250 else shade))
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default()
    draw.rectangle((0, 0, width, 28), fill=(40, 40, 48))
    draw.text((12, 8), f"Window {seed} - " + " ".join(rng.choice(_WORDS) for _ in range(3)), fill=(230, 230, 230), font=font)
    draw.rectangle((0, 28, 220, height), fill=(248, 248, 250))
    for y in range(44, height - 20, 22):
        draw.text((16, y), " ".join(rng.choice(_WORDS) for _ in range(3)).title(), fill=(60, 60, 70), font=font)
    for y in range(50, height - 210, 18):
        line = " ".join(rng.choice(_WORDS) for _ in range(rng.randrange(4, 18)))
        draw.text((240, y), line, fill=(rng.randrange(0, 90),) * 3, font=font)
    panel_w, panel_h = rng.randrange(300, 420), rng.randrange(160, 200)
    x, y = rng.randrange(240, width - panel_w), height - panel_h - 10
    gradient = Image.linear_gradient("L").resize((panel_w, panel_h)).convert("RGB")
    speckle = Image.frombytes("RGB", (panel_w, panel_h), rng.randbytes(panel_w * panel_h * 3))
    img.paste(Image.blend(gradient, speckle, 0.35), (x, y))
    for _ in range(6):
        bx, by = rng.randrange(240, width - 150), rng.randrange(40, height - 60)
        colour = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        draw.rounded_rectangle((bx, by, bx + rng.randrange(60, 140), by + 28), 6, fill=colour)
    out = io.BytesIO()
    img.save(out, "PNG")
    return out.getvalue()


@functools.cache
def _shot_b64(seed: int) -> str:
    return b64(desktop_screenshot(seed))


# --- sessions -------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Turn:
    """One request of a session: the body as the agent sends it, the seconds since the previous request
    (0 for the first) and the tokens of the answer (the assistant message the next request carries)."""

    body: bytes
    think: float
    output_tokens: int


@dataclass(frozen=True)
class ReferenceSession:
    """A reference session: its turns are built on demand (`turns()`), so only one body is held at a time."""

    name: str
    description: str
    fmt: str
    host: str
    path: str
    model: str
    length: int  # requests
    profiles: tuple[str, ...]  # rules/profiles.yaml: the limits a request of this session must not break
    build: Callable[[], Iterator[Turn]] = field(repr=False)

    def turns(self) -> Iterator[Turn]:
        return self.build()


def _filler(topic: str, kilobytes: float, seed: int) -> str:
    """Instructions of about `kilobytes` KB: numbered sentences, so no two sessions share a prompt by accident."""
    rng = random.Random(seed)
    out: list[str] = []
    size, n = 0, 0
    while size < kilobytes * 1024:
        n += 1
        words = " ".join(rng.choice(_WORDS) for _ in range(rng.randrange(8, 20)))
        sentence = f"{n}. When you {topic}, mind the {words}. "
        out.append(sentence)
        size += len(sentence)
    return "".join(out)


def _tokens(value: Any) -> int:
    return text_tokens(len(orjson.dumps(value)))


def _think(rng: random.Random, turn: int, low: float, high: float, gaps: Mapping[int, float]) -> float:
    if turn == 1:
        return 0.0
    return gaps.get(turn, round(rng.uniform(low, high), 1))


def _claude_image(seed: int) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": _shot_b64(seed)}}


def _cache_last_block(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with `cache_control` on the last block of the last one, as Claude Code sends them
    (copies: earlier turns' breakpoints are not kept)."""
    last = messages[-1]
    content = list(last["content"])
    content[-1] = {**content[-1], "cache_control": {"type": "ephemeral"}}
    return [*messages[:-1], {**last, "content": content}]


_CU_GAPS = {21: 420.0, 45: 660.0}  # the user stepped away: past the 5-minute TTL
_IDLE_GAPS = {16: 420.0, 31: 900.0, 46: 600.0}  # a pause past the TTL every 15 turns


def _computer_use(gaps: Mapping[int, float] = _CU_GAPS, seed: str = "computer-use") -> Iterator[Turn]:
    rng = random.Random(seed)
    system = [{"type": "text", "text": _filler("operate the computer", 6, 1), "cache_control": {"type": "ephemeral"}}]
    tools = [
        {"type": "computer_20250124", "name": "computer", "display_width_px": SCREEN[0], "display_height_px": SCREEN[1], "display_number": 1},
        {"type": "bash_20250124", "name": "bash"},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
    ]
    task = "Open the billing page of the admin console, export last month's invoices as CSV and attach the file to the open ticket."
    messages: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": task}, _claude_image(0)]}]
    for turn in range(1, 61):
        body = {"model": "claude-sonnet-4-6", "max_tokens": 4096, "system": system, "tools": tools, "messages": _cache_last_block(messages)}
        x, y = rng.randrange(SCREEN[0]), rng.randrange(SCREEN[1])
        tool_id = f"toolu_{turn:04d}"
        action = {"action": "left_click", "coordinate": [x, y]}
        assistant = {
            "role": "assistant",
            "content": [
                {"type": "text", "text": f"Step {turn}: the screen shows the {rng.choice(_WORDS)} view; I will click at ({x}, {y})."},
                {"type": "tool_use", "id": tool_id, "name": "computer", "input": action},
            ],
        }
        yield Turn(orjson.dumps(body), _think(rng, turn, 4, 12, gaps), _tokens(assistant["content"]))
        result = {"type": "tool_result", "tool_use_id": tool_id, "content": [_claude_image(turn)]}
        messages += [assistant, {"role": "user", "content": [result]}]


# Episodes of the coding session: requests per user prompt (80 in all); a prompt after a long pause.
_CC_EPISODES = (6, 9, 5, 12, 8, 7, 10, 6, 9, 8)
_CC_PAUSES = {3: 480.0, 7: 1500.0}  # episode index -> seconds before its prompt: past the TTL


def _claude_code() -> Iterator[Turn]:
    rng = random.Random("claude-code")
    system = [
        {"type": "text", "text": "You are Claude Code, a command line coding agent."},
        {"type": "text", "text": _filler("change code", 14, 2), "cache_control": {"type": "ephemeral"}},
    ]
    tools = [
        {
            "name": name,
            "description": _filler(f"use {name}", 2, 10 + i),
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}, "arg": {"type": "string"}}, "required": ["path"]},
        }
        for i, name in enumerate(("Read", "Write", "Edit", "Bash", "Grep", "Glob", "TodoWrite", "WebFetch", "Task", "NotebookEdit"))
    ]
    steps = sum(_CC_EPISODES) - len(_CC_EPISODES)  # requests that carry a tool result
    screenshot_steps = set(rng.sample(range(steps), 20))
    messages: list[dict[str, Any]] = []
    step = shots = 0
    turn = 0
    for episode, length in enumerate(_CC_EPISODES):
        prompt = f"Task {episode + 1}: fix the layout bug on the {rng.choice(_WORDS)} page; the screenshots are in shots/."
        messages.append({"role": "user", "content": [{"type": "text", "text": prompt}]})
        for k in range(length):
            turn += 1
            if k == 0:
                think = 0.0 if turn == 1 else _CC_PAUSES.get(episode, round(rng.uniform(40, 200), 1))
            else:
                think = round(rng.uniform(3, 15), 1)
            body = {"model": "claude-sonnet-4-6", "max_tokens": 32000, "system": system, "tools": tools, "messages": _cache_last_block(messages)}
            if k == length - 1:
                answer = {"role": "assistant", "content": [{"type": "text", "text": _filler("report", 1.2, 100 + turn)}]}
                yield Turn(orjson.dumps(body), think, _tokens(answer["content"]))
                messages.append(answer)
                continue
            tool_id = f"toolu_{turn:04d}"
            reads_shot = step in screenshot_steps
            name = "Read" if reads_shot or rng.random() < 0.5 else rng.choice(("Bash", "Grep", "Edit"))
            target = f"shots/screen-{shots + 1:02d}.png" if reads_shot else f"src/module_{rng.randrange(40)}.py"
            assistant = {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Let me look at {target}."},
                    {"type": "tool_use", "id": tool_id, "name": name, "input": {"path": target}},
                ],
            }
            yield Turn(orjson.dumps(body), think, _tokens(assistant["content"]))
            if reads_shot:
                shots += 1
                content: Any = [_claude_image(shots)]
            else:
                content = _filler("read the output", rng.uniform(0.5, 6), 1000 + turn)
            messages += [assistant, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_id, "content": content}]}]
            step += 1


_CHAT_GAPS = {6: 420.0, 11: 1200.0}


def _chat() -> Iterator[Turn]:
    rng = random.Random("chat")
    messages: list[dict[str, Any]] = [{"role": "system", "content": _filler("answer questions about screenshots", 1.5, 3)}]
    for turn in range(1, 16):
        urls = [data_url(desktop_screenshot(3 * (turn - 1) + i), "image/png") for i in range(3)]
        images = [{"type": "image_url", "image_url": {"url": url, "detail": "auto"}} for url in urls]
        question = {"type": "text", "text": f"Message {turn}: what changed between these three screens, and what should I click?"}
        messages.append({"role": "user", "content": [question, *images]})
        body = {"model": "gpt-4o", "messages": messages, "max_tokens": 1024}
        answer = {"role": "assistant", "content": _filler("compare screens", rng.uniform(0.8, 1.6), 2000 + turn)}
        yield Turn(orjson.dumps(body), _think(rng, turn, 60, 240, _CHAT_GAPS), _tokens(answer))
        messages = [*messages, answer]


_GEMINI_GAPS = {15: 360.0, 31: 540.0}


def _gemini(gaps: Mapping[int, float] = _GEMINI_GAPS, turns: int = 40, seed: str = "gemini") -> Iterator[Turn]:
    rng = random.Random(seed)
    system = {"parts": [{"text": _filler("browse for the user", 4, 4)}]}
    tools = [{"functionDeclarations": [{"name": "click_at", "description": "Click at x, y of the page.", "parameters": {"type": "object"}}]}]
    task = "Find the cheapest direct flight from Lisbon to Oslo next Friday and fill in the booking form."
    shot = {"inline_data": {"mime_type": "image/png", "data": _shot_b64(0)}}
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": task}, shot]}]
    for turn in range(1, turns + 1):
        body = {"systemInstruction": system, "tools": tools, "contents": contents}
        x, y = rng.randrange(SCREEN[0]), rng.randrange(SCREEN[1])
        call = {"role": "model", "parts": [{"functionCall": {"name": "click_at", "args": {"x": x, "y": y}}}]}
        yield Turn(orjson.dumps(body), _think(rng, turn, 3, 10, gaps), _tokens(call["parts"]))
        response = {"functionResponse": {"name": "click_at", "response": {"url": f"https://flights.example/step/{turn}"}}}
        screen = {"inline_data": {"mime_type": "image/png", "data": _shot_b64(turn)}}
        contents = [*contents, call, {"role": "user", "parts": [response, screen]}]


def _openai_image(seed: int) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": data_url(desktop_screenshot(seed), "image/png"), "detail": "auto"}}


def _computer_use_openai(gaps: Mapping[int, float] = _CU_GAPS, seed: str = "computer-use-openai") -> Iterator[Turn]:
    """Computer use on OpenAI chat: a function call per turn, its result as a tool message and the screen after
    it in a user message (chat tool messages carry no images)."""
    rng = random.Random(seed)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "computer",
                "description": _filler("use the computer tool", 1, 5),
                "parameters": {"type": "object", "properties": {"action": {"type": "string"}, "x": {"type": "integer"}, "y": {"type": "integer"}}},
            },
        }
    ]
    task = "Open the billing page of the admin console, export last month's invoices as CSV and attach the file to the open ticket."
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": _filler("operate the computer", 6, 1)},
        {"role": "user", "content": [{"type": "text", "text": task}, _openai_image(0)]},
    ]
    for turn in range(1, 61):
        body = {"model": "gpt-4o", "max_tokens": 4096, "tools": tools, "messages": messages}
        x, y = rng.randrange(SCREEN[0]), rng.randrange(SCREEN[1])
        call_id = f"call_{turn:04d}"
        arguments = orjson.dumps({"action": "left_click", "x": x, "y": y}).decode()
        assistant = {
            "role": "assistant",
            "content": f"Step {turn}: the screen shows the {rng.choice(_WORDS)} view; I will click at ({x}, {y}).",
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "computer", "arguments": arguments}}],
        }
        yield Turn(orjson.dumps(body), _think(rng, turn, 4, 12, gaps), _tokens(assistant))
        screen = {"role": "user", "content": [{"type": "text", "text": f"Screen after step {turn}."}, _openai_image(turn)]}
        messages = [*messages, assistant, {"role": "tool", "tool_call_id": call_id, "content": "clicked"}, screen]


_CHAT_ANTHROPIC_GAPS = {5: 480.0, 10: 900.0}


def _chat_anthropic() -> Iterator[Turn]:
    """A user pasting 3 screenshots into each of 15 messages, on Anthropic, the breakpoint on the last block."""
    rng = random.Random("chat-anthropic")
    system = [{"type": "text", "text": _filler("answer questions about screenshots", 5, 6), "cache_control": {"type": "ephemeral"}}]
    messages: list[dict[str, Any]] = []
    for turn in range(1, 16):
        question = {"type": "text", "text": f"Message {turn}: what changed between these three screens, and what should I click?"}
        messages.append({"role": "user", "content": [question, *(_claude_image(3 * (turn - 1) + i) for i in range(3))]})
        body = {"model": "claude-sonnet-4-6", "max_tokens": 2048, "system": system, "messages": _cache_last_block(messages)}
        answer = {"role": "assistant", "content": [{"type": "text", "text": _filler("compare screens", rng.uniform(0.8, 1.6), 3000 + turn)}]}
        yield Turn(orjson.dumps(body), _think(rng, turn, 60, 240, _CHAT_ANTHROPIC_GAPS), _tokens(answer["content"]))
        messages.append(answer)


def _coding_openai() -> Iterator[Turn]:
    """The coding session of _claude_code on OpenAI chat: tools as functions, results as tool messages, each
    screenshot read in a user message after its tool message."""
    for turn in _claude_code():
        body = orjson.loads(turn.body)
        system = " ".join(block["text"] for block in body["system"])
        tools = [
            {"type": "function", "function": {"name": t["name"], "description": t["description"], "parameters": t["input_schema"]}}
            for t in body["tools"]
        ]
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        for message in body["messages"]:
            messages += _openai_messages(message)
        out = {"model": "gpt-4o", "max_tokens": 16384, "tools": tools, "messages": messages}
        yield Turn(orjson.dumps(out), turn.think, turn.output_tokens)


def _openai_messages(message: dict[str, Any]) -> list[dict[str, Any]]:
    """One Anthropic message of _claude_code as the OpenAI chat messages an agent sends for it."""
    blocks = message["content"]
    if message["role"] == "assistant":
        text = " ".join(b["text"] for b in blocks if b["type"] == "text")
        calls = [
            {"id": b["id"], "type": "function", "function": {"name": b["name"], "arguments": orjson.dumps(b["input"]).decode()}}
            for b in blocks
            if b["type"] == "tool_use"
        ]
        return [{"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}]
    out: list[dict[str, Any]] = []
    for block in blocks:
        if block["type"] == "text":
            out.append({"role": "user", "content": block["text"]})
        elif isinstance(block["content"], str):
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": block["content"]})
        else:
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": "the image follows"})
            images = [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b['source']['data']}"}} for b in block["content"]]
            out.append({"role": "user", "content": images})
    return out


def _responses_screenshot(seed: int) -> dict[str, Any]:
    return {"type": "computer_screenshot", "image_url": data_url(desktop_screenshot(seed), "image/png")}


def _computer_use_responses(gaps: Mapping[int, float] = _CU_GAPS, seed: str = "computer-use-responses") -> Iterator[Turn]:
    """Computer use on OpenAI Responses with the whole history in `input` (no previous_response_id): a
    `computer_call` per turn, the screen after it as the `computer_call_output`'s `computer_screenshot`."""
    rng = random.Random(seed)
    tools = [{"type": "computer_use_preview", "display_width": SCREEN[0], "display_height": SCREEN[1], "environment": "browser"}]
    task = "Open the billing page of the admin console, export last month's invoices as CSV and attach the file to the open ticket."
    items: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [{"type": "input_text", "text": task}, {"type": "input_image", "image_url": data_url(desktop_screenshot(0), "image/png")}],
        }
    ]
    instructions = _filler("operate the computer", 6, 1)
    for turn in range(1, 61):
        body = {"model": "gpt-5", "instructions": instructions, "tools": tools, "input": items, "store": False, "truncation": "auto"}
        x, y = rng.randrange(SCREEN[0]), rng.randrange(SCREEN[1])
        call_id = f"call_{turn:04d}"
        answer: list[dict[str, Any]] = [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"Step {turn}: I will click at ({x}, {y})."}]},
            {"type": "computer_call", "call_id": call_id, "action": {"type": "click", "button": "left", "x": x, "y": y}, "pending_safety_checks": []},
        ]
        yield Turn(orjson.dumps(body), _think(rng, turn, 4, 12, gaps), _tokens(answer))
        items = [*items, *answer, {"type": "computer_call_output", "call_id": call_id, "output": _responses_screenshot(turn)}]


def _codex() -> Iterator[Turn]:
    """The coding session of _claude_code as Codex sends it over HTTP to OpenAI Responses: the whole history in
    `input` every turn (store false), tools as functions, each screenshot read coming back in the
    `function_call_output`'s output array as an `input_image` (its view_image tool)."""
    for turn in _claude_code():
        body = orjson.loads(turn.body)
        tools = [
            {"type": "function", "name": t["name"], "description": t["description"], "parameters": t["input_schema"], "strict": False}
            for t in body["tools"]
        ]
        items: list[dict[str, Any]] = []
        for message in body["messages"]:
            items += _responses_items(message)
        instructions = " ".join(block["text"] for block in body["system"])
        out = {
            "model": "gpt-5-codex",
            "instructions": instructions,
            "tools": tools,
            "input": items,
            "store": False,
            "stream": True,
            "prompt_cache_key": "codex-reference",
        }
        yield Turn(orjson.dumps(out), turn.think, turn.output_tokens)


def _responses_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """One Anthropic message of _claude_code as the Responses input items Codex sends for it."""
    blocks = message["content"]
    out: list[dict[str, Any]] = []
    if message["role"] == "assistant":
        for b in blocks:
            if b["type"] == "text":
                out.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": b["text"]}]})
            else:
                out.append({"type": "function_call", "call_id": b["id"], "name": b["name"], "arguments": orjson.dumps(b["input"]).decode()})
        return out
    for block in blocks:
        if block["type"] == "text":
            out.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": block["text"]}]})
        elif isinstance(block["content"], str):
            out.append({"type": "function_call_output", "call_id": block["tool_use_id"], "output": block["content"]})
        else:
            images = [{"type": "input_image", "image_url": f"data:image/png;base64,{b['source']['data']}"} for b in block["content"]]
            out.append({"type": "function_call_output", "call_id": block["tool_use_id"], "output": images})
    return out


_ANTHROPIC_PROFILES = (
    "anthropic-32mb",
    "anthropic-100-media",
    "anthropic-image-5mb",
    "anthropic-image-8000px",
    "anthropic-many-image-2000px",
    "generic-8",
)
_OPENAI_PROFILES = ("azure-50", "generic-8")

REFERENCE_SESSIONS: tuple[ReferenceSession, ...] = (
    ReferenceSession(
        "computer-use",
        "Anthropic computer use: 60 turns, a 1280x800 screenshot per turn in a tool_result, cache_control on the system prompt and the last block",
        "anthropic",
        "api.anthropic.com",
        "/v1/messages",
        "claude-sonnet-4-6",
        60,
        _ANTHROPIC_PROFILES,
        _computer_use,
    ),
    ReferenceSession(
        "claude-code",
        "Claude Code-style coding session: 80 requests, 10 prompts, file reads and shell output, 20 screenshots read",
        "anthropic",
        "api.anthropic.com",
        "/v1/messages",
        "claude-sonnet-4-6",
        sum(_CC_EPISODES),
        _ANTHROPIC_PROFILES,
        _claude_code,
    ),
    ReferenceSession(
        "chat",
        "OpenAI chat: 15 user messages, each pasting 3 screenshots",
        "openai-chat",
        "api.openai.com",
        "/v1/chat/completions",
        "gpt-4o",
        15,
        _OPENAI_PROFILES,
        _chat,
    ),
    ReferenceSession(
        "gemini",
        "Gemini 2.5 Flash browser agent: 40 turns, a screenshot after each function call",
        "gemini",
        "generativelanguage.googleapis.com",
        "/v1beta/models/gemini-2.5-flash:generateContent",
        "gemini-2.5-flash",
        40,
        ("copilot-gemini-10",),
        _gemini,
    ),
    ReferenceSession(
        "computer-use-openai",
        "computer use on OpenAI chat: 60 turns, a function call per turn and the screen after it in a user message",
        "openai-chat",
        "api.openai.com",
        "/v1/chat/completions",
        "gpt-4o",
        60,
        _OPENAI_PROFILES,
        _computer_use_openai,
    ),
    ReferenceSession(
        "idle",
        "computer-use with the user away past the 5-minute TTL every 15 turns",
        "anthropic",
        "api.anthropic.com",
        "/v1/messages",
        "claude-sonnet-4-6",
        60,
        _ANTHROPIC_PROFILES,
        functools.partial(_computer_use, _IDLE_GAPS, "idle"),
    ),
    ReferenceSession(
        "idle-openai",
        "computer-use-openai with the user away past the TTL every 15 turns",
        "openai-chat",
        "api.openai.com",
        "/v1/chat/completions",
        "gpt-4o",
        60,
        _OPENAI_PROFILES,
        functools.partial(_computer_use_openai, _IDLE_GAPS, "idle-openai"),
    ),
    ReferenceSession(
        "chat-anthropic",
        "Anthropic chat: 15 user messages, each pasting 3 screenshots, the breakpoint on the last block",
        "anthropic",
        "api.anthropic.com",
        "/v1/messages",
        "claude-sonnet-4-6",
        15,
        _ANTHROPIC_PROFILES,
        _chat_anthropic,
    ),
    ReferenceSession(
        "claude-code-openai",
        "claude-code's session on OpenAI chat: 80 requests, 20 screenshots read",
        "openai-chat",
        "api.openai.com",
        "/v1/chat/completions",
        "gpt-4o",
        sum(_CC_EPISODES),
        _OPENAI_PROFILES,
        _coding_openai,
    ),
    ReferenceSession(
        "gemini-idle",
        "the Gemini browser agent over 60 turns, away past the TTL every 15 turns (a cap of 10)",
        "gemini",
        "generativelanguage.googleapis.com",
        "/v1beta/models/gemini-2.5-flash:generateContent",
        "gemini-2.5-flash",
        60,
        ("copilot-gemini-10",),
        functools.partial(_gemini, _IDLE_GAPS, 60, "gemini-idle"),
    ),
    ReferenceSession(
        "codex",
        "claude-code's session as Codex sends it to OpenAI Responses: 80 requests, 20 screenshots in function_call_output",
        "openai-responses",
        "api.openai.com",
        "/v1/responses",
        "gpt-5-codex",
        sum(_CC_EPISODES),
        _OPENAI_PROFILES,
        _codex,
    ),
    ReferenceSession(
        "computer-use-responses",
        "computer use on OpenAI Responses: 60 turns, a computer_call per turn and its computer_screenshot, history in input",
        "openai-responses",
        "api.openai.com",
        "/v1/responses",
        "gpt-5",
        60,
        _OPENAI_PROFILES,
        _computer_use_responses,
    ),
)


# --- policies -------------------------------------------------------------------------------------------------

_OFF = {"low_water": None, "cache_ttl": None}
# One cap for every model (8; 10 for Gemini, below): the policies compared with each other and with the shipped
# rules' voluntary caps by model.
_CAP_8 = {"max_images": 8}
_GEMINI_10 = {"gemini": {"max_images": 10}}
CACHE_AWARE_RULES = DEFAULT_RULES_PATH.parent / "examples" / "cache-aware.yaml"


@dataclass(frozen=True)
class Policy:
    """A way to prune: the shipped rules (or the rules file `path`) with `overrides` forced on the defaults and
    every rule (None: as the file has them), and for a session of a wire format in `by_format`, that format's
    overrides on top (a provider whose cache prices call for other settings)."""

    name: str
    overrides: Mapping[str, Any] | None
    by_format: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    path: Path | None = None

    def rules(self, base: Rules, fmt: str | None = None) -> Rules:
        if self.path is not None:
            base = load_rules(self.path)
        rules = base if self.overrides is None else base.with_limits(**self.overrides)
        extra = self.by_format.get(fmt) if fmt is not None else None
        return rules if extra is None else rules.with_limits(**extra)


POLICIES: tuple[Policy, ...] = (
    Policy("no pruning", {"max_images": None, "max_body_bytes": None, "max_est_tokens": None, **_OFF}),
    Policy("rolling (batch 1)", {**_CAP_8, "prune_batch": 1, **_OFF}, _GEMINI_10),
    Policy("batch 4", {**_CAP_8, "prune_batch": 4, **_OFF}, _GEMINI_10),
    Policy("batch 6", {**_CAP_8, "prune_batch": 6, **_OFF}, _GEMINI_10),
    Policy("batch 8", {**_CAP_8, "prune_batch": 8, **_OFF}, _GEMINI_10),
    Policy("low-water 0.5", {**_CAP_8, "prune_batch": 1, "low_water": 0.5, "cache_ttl": None}, _GEMINI_10),
    Policy("low-water 0.5 + cache_ttl 5m", {**_CAP_8, "prune_batch": 1, "low_water": 0.5, "cache_ttl": 300.0}, _GEMINI_10),
    # Batches of 6, and a conversation idle past the TTL cut to their floor at once: a low-water mark of 0.45
    # is 3 of 8 (batch 6's floor) and 4 of 10.
    Policy("batch 6 + cold cut", {**_CAP_8, "prune_batch": 6, "low_water": 0.45, "cache_ttl": 300.0}, _GEMINI_10),
    # The cold cut at each cap's batch-6 floor (3 of 8, 5 of 10), and on OpenAI chat, whose cache reads cost half
    # the input price on gpt-4o and writes nothing extra, cuts in batches of 3 above a voluntary cap of 5 (the same
    # floor of 3): holding an image costs more there than moving the cut.
    Policy(
        "cache-aware candidate",
        {**_CAP_8, "prune_batch": 6, "low_water": 0.4, "cache_ttl": 300.0},
        {"gemini": {"max_images": 10, "low_water": 0.5}, "openai-chat": {"max_images": 5, "prune_batch": 3, "low_water": 0.6}},
    ),
    # The shipped rules with the cold cut, at the same floors: rules/examples/cache-aware.yaml as it is.
    Policy("cache-aware example", None, path=CACHE_AWARE_RULES),
    Policy("shipped defaults", None),
)


# --- the runner -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TurnResult:
    """One request as forwarded and billed: `broken` when it read less than the previous request left
    in a cache that was still warm; `breaches` the profiles the forwarded request breaks."""

    turn: int
    at: float  # simulated seconds since the session started
    images: int
    body_bytes: int
    usage: CacheUsage
    output_tokens: int
    cost: float | None
    broken: bool
    breaches: tuple[str, ...]


@dataclass
class PolicyResult:
    """What one session cost under one policy, turn by turn and summed."""

    session: str
    policy: str
    model: str
    turns: list[TurnResult]

    @property
    def requests(self) -> int:
        return len(self.turns)

    @property
    def images_sent(self) -> int:
        return sum(t.images for t in self.turns)

    @property
    def input_tokens(self) -> int:
        return sum(t.usage.prompt_tokens for t in self.turns)

    @property
    def cache_write_tokens(self) -> int:
        return sum(t.usage.cache_write_tokens for t in self.turns)

    @property
    def cache_read_tokens(self) -> int:
        return sum(t.usage.cache_read_tokens for t in self.turns)

    @property
    def uncached_tokens(self) -> int:
        return sum(t.usage.uncached_tokens for t in self.turns)

    @property
    def cost(self) -> float | None:
        costs = [t.cost for t in self.turns]
        return None if any(c is None for c in costs) else sum(c for c in costs if c is not None)

    @property
    def broken_turns(self) -> int:
        return sum(t.broken for t in self.turns)

    @property
    def breaches(self) -> dict[str, int]:
        """Turns that break each profile."""
        out: dict[str, int] = {}
        for t in self.turns:
            for name in t.breaches:
                out[name] = out.get(name, 0) + 1
        return out

    def summary(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "policy": self.policy,
            "model": self.model,
            "requests": self.requests,
            "images_sent": self.images_sent,
            "input_tokens": self.input_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "uncached_tokens": self.uncached_tokens,
            "cost_usd": None if self.cost is None else round(self.cost, 4),
            "broken_prefix_turns": self.broken_turns,
            "limits_breached": self.breaches,
        }


def turn_images(session: ReferenceSession) -> list[int]:
    """The images each turn of `session` holds as the agent sends it, before any cut."""
    module = FORMATS[session.fmt]
    return [sum(1 for m in module.find_media(orjson.loads(t.body)) if m.kind == IMAGE) for t in session.turns()]


REFUSED = "cache_control over 4"  # a breach: the provider refuses a fifth breakpoint


def run_policy(
    session: ReferenceSession,
    policy: Policy,
    *,
    base: Rules | None = None,
    prices: PriceTable | None = None,
    profiles: Sequence[Profile] | None = None,
    instances: int = 1,
) -> PolicyResult:
    """Every turn of `session` through the engine under `policy`, then through the cache model at the
    session's simulated time. The conversations are remembered as the proxy remembers them, on the same clock;
    with `instances` above 1, as that many proxies behind a round-robin balancer remember them: each its own
    memory, turn k going to instance k mod `instances`, one provider cache for all."""
    if instances < 1:
        raise ValueError(f"instances must be at least 1, got {instances}")
    rules = policy.rules(base if base is not None else load_rules(DEFAULT_RULES_PATH), session.fmt)
    price = (prices if prices is not None else load_prices()).for_model(session.model)
    if profiles is None:
        known = load_profiles()
        profiles = [known.get(name) for name in session.profiles]
    now = 0.0
    cache = CacheModel(lambda: now)
    memories = [Conversations(clock=lambda: now) for _ in range(instances)]
    module = FORMATS[session.fmt]
    target = rules.target(session.host, session.path)
    if target is None:
        raise ValueError(f"{session.name}: {session.host}{session.path} is not an LLM request under these rules")
    headers = {"host": session.host, "content-type": "application/json"}
    results: list[TurnResult] = []
    warm: tuple[float, int] | None = None  # (expiry, tokens) of the prefix the previous request left cached
    for number, turn in enumerate(session.turns(), start=1):
        now += turn.think
        conversations = memories[(number - 1) % instances]
        outcome = prune(target, headers, turn.body, rules, memory=conversations)
        record, history = outcome.record, outcome.history
        if record is not None and history is not None:
            conversations.assign(history, record.kind, cut=outcome.cut)
        body = outcome.body
        parsed = orjson.loads(body)
        media = module.find_media(parsed)
        breaches = [v.profile for p in profiles if (v := check(p, body, media, model=session.model, parsed=parsed)) is not None]
        prompt = prompt_of(session.fmt, session.path, parsed, media)
        try:
            usage = cache.use(prompt) if prompt is not None else CacheUsage(0)
        except TooManyBreakpoints:
            usage, breaches = CacheUsage(0), [*breaches, REFUSED]
        broken = warm is not None and now < warm[0] and usage.cache_read_tokens < warm[1]
        warm = (now + usage.stored_ttl, usage.stored_tokens) if usage.stored_tokens else None
        cost = None if price is None else price.cost(usage.uncached_tokens, usage.cache_write_tokens, usage.cache_read_tokens, turn.output_tokens)
        images = sum(1 for m in media if m.kind == IMAGE)
        results.append(TurnResult(number, now, images, len(body), usage, turn.output_tokens, cost, broken, tuple(breaches)))
    return PolicyResult(session.name, policy.name, session.model, results)


# --- the table ------------------------------------------------------------------------------------------------

_COLUMNS = (
    "policy",
    "requests",
    "images sent",
    "input tokens",
    "cache-write",
    "cache-read",
    "cost",
    "floor",
    "x optimum",
    "x optimum, by length",
    "broken-prefix turns",
    "limits breached",
)


def table(
    session: ReferenceSession,
    results: Sequence[PolicyResult],
    floors: Mapping[str, int],
    best: Mapping[int, Optimum],
    against: Mapping[str, Ratios],
    price: Price,
) -> str:
    """One session's results as a Markdown table (readable as text too), with each policy's floor and its cost
    over the optimum's at that floor (`against`, by policy name, priced with `price`) at full length and
    averaged over the lengths."""
    rows = [_COLUMNS]
    for r in results:
        cost = "-" if r.cost is None else f"${r.cost:,.2f}"
        breached = ", ".join(f"{name} x{n}" for name, n in r.breaches.items()) or "none"
        rows.append(
            (
                r.policy,
                f"{r.requests}",
                f"{r.images_sent:,}",
                f"{r.input_tokens:,}",
                f"{r.cache_write_tokens:,}",
                f"{r.cache_read_tokens:,}",
                cost,
                f"{floors[r.policy]}",
                f"{against[r.policy].full:.3f}",
                f"{against[r.policy].averaged:.3f}",
                f"{r.broken_turns}",
                breached,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    numeric = set(range(1, 11))

    def line(row: Sequence[str]) -> str:
        cells = [cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i]) for i, cell in enumerate(row)]
        return "| " + " | ".join(cells) + " |"

    rule = "|" + "|".join("-" * (w + 1) + (":" if i in numeric else "-") for i, w in enumerate(widths)) + "|"
    title = f"{session.name} ({session.model}): {session.description}"
    cap = next(iter(best.values())).cap
    each = "; ".join(f"floor {f}: {_dollars(o.cost)}, the cut moved on {o.moves} turns" for f, o in sorted(best.items()))
    cheapest = f"Optimum under a cap of {cap} images, by floor (the fewest images a policy sends after a cut): {each}."
    if any(r.cost is None for r in results):
        cheapest += f" Ratios priced as {price.family}."
    return "\n".join([title, "", line(rows[0]), rule, *(line(row) for row in rows[1:]), "", cheapest])


def _dollars(cost: float) -> str:
    return f"${cost:,.2f}" if cost >= 0.1 else f"${cost:,.4f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="replay --policies",
        description="Run the reference sessions through each pruning policy in process, against a model of the "
        "providers' prompt caching, and print per session and policy: requests, images sent, input tokens, "
        "cache-write and cache-read tokens, cost, the policy's floor (the fewest images it sends after a cut) and "
        "its cost over the cheapest cut schedule at that floor (at full length, and averaged over the session's "
        "lengths), turns whose cached prefix broke, and limits breached.",
    )
    parser.add_argument("--policies", action="store_true", required=True, help="this mode (the other replay options do not apply)")
    parser.add_argument("--session", action="append", choices=[s.name for s in REFERENCE_SESSIONS], help="only this session (repeatable)")
    parser.add_argument("--policy", action="append", choices=[p.name for p in POLICIES], help="only this policy (repeatable)")
    parser.add_argument("--json", action="store_true", help="print one JSON array of summaries instead of tables")
    args = parser.parse_args(argv)
    sessions = [s for s in REFERENCE_SESSIONS if not args.session or s.name in args.session]
    policies = [p for p in POLICIES if not args.policy or p.name in args.policy]
    base, prices = load_rules(DEFAULT_RULES_PATH), load_prices()
    summaries: list[dict[str, Any]] = []
    for n, session in enumerate(sessions):
        results = []
        for policy in policies:
            print(f"replay: {session.name}: {policy.name}", file=sys.stderr, flush=True)
            results.append(run_policy(session, policy, base=base, prices=prices))
        print(f"replay: {session.name}: the cheapest schedules", file=sys.stderr, flush=True)
        images = turn_images(session)
        cap = session_cap(session, base)
        floors = {r.policy: policy_floor(r, images, cap) for r in results}
        best = optima(session, floors.values(), base=base, prices=prices)
        price = price_for(session, prices)
        against = {r.policy: ratios(r, best[floors[r.policy]], price) for r in results}
        if args.json:
            for r in results:
                summary = r.summary()
                summary.update(
                    optimum_floor=floors[r.policy],
                    optimum_cost=round(best[floors[r.policy]].cost, 4),
                    cost_vs_optimum=round(against[r.policy].full, 4),
                    cost_vs_optimum_by_length=round(against[r.policy].averaged, 4),
                    turns_over_cap=against[r.policy].cap_broken,
                )
                summaries.append(summary)
        else:
            print(("\n" if n else "") + table(session, results, floors, best, against, price), flush=True)
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(summaries, option=orjson.OPT_INDENT_2) + b"\n")
    return 0
