"""The reference sessions the cut schedules are priced on.

Twelve sessions, built deterministically with real Pillow screenshots (1280x800 PNG, distinct within a
session, 220-310 KB like a real desktop's; made once per run), each a list of turns: the request body as the
agent sends it (whole history, the agent's own `cache_control`), the think time before it (some gaps past the
5-minute TTL) and the tokens of the answer it gets. Six shapes (steady computer use, a Claude Code-style coding
session, chat pasting 3 screenshots a message, a Gemini browser agent, and pauses past the TTL every 15 turns
on two of them), each on Anthropic's cache and on an automatic one: OpenAI chat, OpenAI Responses (Codex,
computer use) or Gemini. docs/caching.md lists them; tests.research.policy_runner prices each policy on them.
"""

from __future__ import annotations

import functools
import io
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from PIL import Image, ImageChops, ImageDraw, ImageFont

from trimflow._tokens import text_tokens
from trimflow.testing import b64, data_url

__all__ = ["REFERENCE_SESSIONS", "SCREEN", "ReferenceSession", "Turn", "desktop_screenshot"]


SCREEN = (1280, 800)

# --- screenshots ----------------------------------------------------------------------------------------------

_WORDS = (
    "the of and to in is for on that with file edit view settings save cancel open project search results page "
    "window terminal build test run error warning info user account billing network deploy branch commit review "
    "close help tools format insert table chart export import preview share invite members status ready"
).split()


@functools.cache
def desktop_screenshot(seed: int, size: tuple[int, int] = SCREEN) -> bytes:
    """A PNG like a desktop screenshot, 1280x800 unless `size` says: a title bar, a sidebar, text in a main pane,
    buttons and a photo-like panel. A larger `size` draws the same layout at its scale, as a HiDPI display does
    (2880x1800: 2.25x, the text antialiased at that size). Each seed draws a different screen; the same seed and
    size always the same bytes (cached per run)."""
    rng = random.Random(seed)
    width, height = size
    scale = width / SCREEN[0]

    def px(value: int) -> int:
        return round(value * scale)

    shade = rng.randrange(226, 246)
    img = Image.new("RGB", size, (shade, shade, shade + 4 if shade < 250 else shade))
    draw = ImageDraw.Draw(img)
    font = _font(px(11)) if size != SCREEN else ImageFont.load_default()
    draw.rectangle((0, 0, width, px(28)), fill=(40, 40, 48))
    draw.text((px(12), px(8)), f"Window {seed} - " + " ".join(rng.choice(_WORDS) for _ in range(3)), fill=(230, 230, 230), font=font)
    draw.rectangle((0, px(28), px(220), height), fill=(248, 248, 250))
    for y in range(px(44), height - px(20), px(22)):
        draw.text((px(16), y), " ".join(rng.choice(_WORDS) for _ in range(3)).title(), fill=(60, 60, 70), font=font)
    for y in range(px(50), height - px(210), px(18)):
        line = " ".join(rng.choice(_WORDS) for _ in range(rng.randrange(4, 18)))
        draw.text((px(240), y), line, fill=(rng.randrange(0, 90),) * 3, font=font)
    panel_w, panel_h = rng.randrange(px(300), px(420)), rng.randrange(px(160), px(200))
    x, y = rng.randrange(px(240), width - panel_w), height - panel_h - px(10)
    gradient = Image.linear_gradient("L").resize((panel_w, panel_h)).convert("RGB")
    speckle = Image.frombytes("RGB", (panel_w, panel_h), rng.randbytes(panel_w * panel_h * 3))
    img.paste(Image.blend(gradient, speckle, 0.35), (x, y))
    for _ in range(6):
        bx, by = rng.randrange(px(240), width - px(150)), rng.randrange(px(40), height - px(60))
        colour = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        draw.rounded_rectangle((bx, by, bx + rng.randrange(px(60), px(140)), by + px(28)), px(6), fill=colour)
    if size != SCREEN:
        # A HiDPI desktop's translucent title bar and sidebar (macOS's vibrancy): the colour with a grain of one level.
        for box in ((0, 0, width, px(28)), (0, px(28), px(220), height)):
            _grain(img, box, rng)
    out = io.BytesIO()
    img.save(out, "PNG")
    return out.getvalue()


_ONE_LEVEL = bytes(b % 3 for b in range(256))  # random bytes to 0, 1 or 2: a grain of -1, 0 or +1 once offset


def _grain(img: Image.Image, box: tuple[int, int, int, int], rng: random.Random) -> None:
    """Each pixel in `box` one level lighter, darker or the same, at random."""
    w, h = box[2] - box[0], box[3] - box[1]
    grain = Image.frombytes("L", (w, h), rng.randbytes(w * h).translate(_ONE_LEVEL))
    img.paste(ImageChops.add(img.crop(box), Image.merge("RGB", (grain, grain, grain)), 1, -1), box)


def _font(pixels: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """Pillow's own font at `pixels` (antialiased, as a HiDPI screen draws text); its fixed bitmap font where this Pillow
    has no scalable one."""
    try:
        return ImageFont.load_default(size=pixels)
    except (TypeError, ImportError, OSError):  # Pillow before 10.1, or built without FreeType
        return ImageFont.load_default()


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


@dataclass(frozen=True, kw_only=True)
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
        name="computer-use",
        description="Anthropic computer use: 60 turns, a 1280x800 screenshot per turn in a tool_result, "
        "cache_control on the system prompt and the last block",
        fmt="anthropic",
        host="api.anthropic.com",
        path="/v1/messages",
        model="claude-sonnet-4-6",
        length=60,
        profiles=_ANTHROPIC_PROFILES,
        build=_computer_use,
    ),
    ReferenceSession(
        name="claude-code",
        description="Claude Code-style coding session: 80 requests, 10 prompts, file reads and shell output, 20 screenshots read",
        fmt="anthropic",
        host="api.anthropic.com",
        path="/v1/messages",
        model="claude-sonnet-4-6",
        length=sum(_CC_EPISODES),
        profiles=_ANTHROPIC_PROFILES,
        build=_claude_code,
    ),
    ReferenceSession(
        name="chat",
        description="OpenAI chat: 15 user messages, each pasting 3 screenshots",
        fmt="openai-chat",
        host="api.openai.com",
        path="/v1/chat/completions",
        model="gpt-4o",
        length=15,
        profiles=_OPENAI_PROFILES,
        build=_chat,
    ),
    ReferenceSession(
        name="gemini",
        description="Gemini 2.5 Flash browser agent: 40 turns, a screenshot after each function call",
        fmt="gemini",
        host="generativelanguage.googleapis.com",
        path="/v1beta/models/gemini-2.5-flash:generateContent",
        model="gemini-2.5-flash",
        length=40,
        profiles=("copilot-gemini-10",),
        build=_gemini,
    ),
    ReferenceSession(
        name="computer-use-openai",
        description="computer use on OpenAI chat: 60 turns, a function call per turn and the screen after it in a user message",
        fmt="openai-chat",
        host="api.openai.com",
        path="/v1/chat/completions",
        model="gpt-4o",
        length=60,
        profiles=_OPENAI_PROFILES,
        build=_computer_use_openai,
    ),
    ReferenceSession(
        name="idle",
        description="computer-use with the user away past the 5-minute TTL every 15 turns",
        fmt="anthropic",
        host="api.anthropic.com",
        path="/v1/messages",
        model="claude-sonnet-4-6",
        length=60,
        profiles=_ANTHROPIC_PROFILES,
        build=functools.partial(_computer_use, _IDLE_GAPS, "idle"),
    ),
    ReferenceSession(
        name="idle-openai",
        description="computer-use-openai with the user away past the TTL every 15 turns",
        fmt="openai-chat",
        host="api.openai.com",
        path="/v1/chat/completions",
        model="gpt-4o",
        length=60,
        profiles=_OPENAI_PROFILES,
        build=functools.partial(_computer_use_openai, _IDLE_GAPS, "idle-openai"),
    ),
    ReferenceSession(
        name="chat-anthropic",
        description="Anthropic chat: 15 user messages, each pasting 3 screenshots, the breakpoint on the last block",
        fmt="anthropic",
        host="api.anthropic.com",
        path="/v1/messages",
        model="claude-sonnet-4-6",
        length=15,
        profiles=_ANTHROPIC_PROFILES,
        build=_chat_anthropic,
    ),
    ReferenceSession(
        name="claude-code-openai",
        description="claude-code's session on OpenAI chat: 80 requests, 20 screenshots read",
        fmt="openai-chat",
        host="api.openai.com",
        path="/v1/chat/completions",
        model="gpt-4o",
        length=sum(_CC_EPISODES),
        profiles=_OPENAI_PROFILES,
        build=_coding_openai,
    ),
    ReferenceSession(
        name="gemini-idle",
        description="the Gemini browser agent over 60 turns, away past the TTL every 15 turns (a cap of 10)",
        fmt="gemini",
        host="generativelanguage.googleapis.com",
        path="/v1beta/models/gemini-2.5-flash:generateContent",
        model="gemini-2.5-flash",
        length=60,
        profiles=("copilot-gemini-10",),
        build=functools.partial(_gemini, _IDLE_GAPS, 60, "gemini-idle"),
    ),
    ReferenceSession(
        name="codex",
        description="claude-code's session as Codex sends it to OpenAI Responses: 80 requests, 20 screenshots in function_call_output",
        fmt="openai-responses",
        host="api.openai.com",
        path="/v1/responses",
        model="gpt-5-codex",
        length=sum(_CC_EPISODES),
        profiles=_OPENAI_PROFILES,
        build=_codex,
    ),
    ReferenceSession(
        name="computer-use-responses",
        description="computer use on OpenAI Responses: 60 turns, a computer_call per turn and its computer_screenshot, history in input",
        fmt="openai-responses",
        host="api.openai.com",
        path="/v1/responses",
        model="gpt-5",
        length=60,
        profiles=_OPENAI_PROFILES,
        build=_computer_use_responses,
    ),
)
