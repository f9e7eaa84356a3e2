"""Screens an agent looks at, and the sessions of an agent that works from a user's mock-up: real images drawn
with Pillow, and the whole-history request bodies a computer-use agent sends in each wire format.

`app_screen` draws one screen of a desktop app (a title bar with a clock, a sidebar, text, buttons, a picture);
its `variant` draws the same screen as the agent sees it again a moment later: the cursor moved, the clock a
minute on, a spinner at another frame. `distinct_screens` are screens that differ in what they show (other pages
of one app, the same page scrolled, a dialog opened, another app): what a look-alike test must tell apart.
`agent_session` is an agent's turns: the user's first message with a mock-up, then one screenshot a turn where the
format puts a tool's output (or, on OpenAI chat, in a user message of its own right after the tool's).
"""

from __future__ import annotations

import functools
import io
import random
from collections.abc import Iterator, Sequence
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from ._synthetic import b64, data_url

__all__ = ["CHANGES", "agent_session", "app_screen", "distinct_screens", "mockup", "repeating_screens"]

_WORDS = (
    "account billing invoices export settings profile team members search results orders shipping returns "
    "dashboard report chart revenue customers products inventory draft publish review status ready pending"
).split()

# The ways a screen looks different without showing anything new (`app_screen`'s variant).
CURSOR, CLOCK, SPINNER = "cursor", "clock", "spinner"
CHANGES = (CURSOR, CLOCK, SPINNER)
_SPINNER_DOTS = ((1, 0), (0.7, 0.7), (0, 1), (-0.7, 0.7), (-1, 0), (-0.7, -0.7), (0, -1), (0.7, -0.7))


@functools.lru_cache(maxsize=256)
def app_screen(
    seed: int,
    size: tuple[int, int] = (1280, 800),
    variant: int = 0,
    change: str = CURSOR,
    *,
    page: int = 0,
    scroll: int = 0,
    dialog: bool = False,
    typed: str = "",
    fmt: str = "PNG",
) -> bytes:
    """One screen of app `seed`: its `page`, scrolled `scroll` lines, with a `dialog` open, `typed` in its search field.
    `variant` > 0 draws it again with one `change`: the cursor elsewhere, the clock `variant` minutes on, the spinner
    at another frame. The same arguments always give the same bytes."""
    width, height = size
    scale = width / 1280
    app = random.Random(seed)
    content = random.Random(seed * 1000 + page)
    shade = app.randrange(236, 250)
    img = Image.new("RGB", size, (shade, shade, shade))
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=max(8, round(13 * scale)))
    big = ImageFont.load_default(size=max(10, round(22 * scale)))

    def px(value: float) -> int:
        return round(value * scale)

    bar = (app.randrange(20, 80), app.randrange(20, 80), app.randrange(40, 110))
    draw.rectangle((0, 0, width, px(32)), fill=bar)
    title = " ".join(app.choice(_WORDS) for _ in range(2)).title()
    draw.text((px(12), px(8)), f"{title} - {content.choice(_WORDS).title()}", fill=(235, 235, 235), font=font)
    minutes = 9 * 60 + 41 + (variant if change == CLOCK else 0)
    draw.text((width - px(60), px(8)), f"{minutes // 60:02d}:{minutes % 60:02d}", fill=(235, 235, 235), font=font)
    draw.rectangle((0, px(32), px(220), height), fill=(app.randrange(225, 240),) * 3)
    for k, y in enumerate(range(px(52), height - px(30), px(30))):
        if k == page % 12:
            draw.rectangle((0, y - px(6), px(220), y + px(20)), fill=bar)
        draw.text((px(18), y), app.choice(_WORDS).title(), fill=(60, 60, 70), font=font)
    draw.rounded_rectangle((px(240), px(44), px(640), px(72)), px(6), outline=(150, 150, 160), fill=(255, 255, 255))
    draw.text((px(250), px(50)), typed or "Search", fill=(30, 30, 30) if typed else (160, 160, 160), font=font)
    draw.text((px(240), px(84)), content.choice(_WORDS).title() + " " + content.choice(_WORDS), fill=(20, 20, 30), font=big)
    lines = [" ".join(content.choice(_WORDS) for _ in range(content.randrange(5, 16))) for _ in range(40)]
    for k, line in enumerate(lines[scroll : scroll + 22]):
        draw.text((px(240), px(124 + 22 * k)), line, fill=(content.randrange(0, 90),) * 3, font=font)
    panel = Image.linear_gradient("L").resize((px(320), px(180))).convert("RGB")
    tint = Image.new("RGB", panel.size, (content.randrange(256), content.randrange(256), content.randrange(256)))
    img.paste(Image.blend(panel, tint, 0.5), (width - px(360), height - px(220)))
    for _ in range(4):
        bx, by = content.randrange(px(240), width - px(520)), content.randrange(height - px(180), height - px(40))
        draw.rounded_rectangle((bx, by, bx + px(110), by + px(28)), px(6), fill=(content.randrange(256), content.randrange(256), 200))
    if dialog:
        draw.rectangle((width // 4, height // 4, 3 * width // 4, 3 * height // 4), fill=(255, 255, 255), outline=(90, 90, 90), width=px(2))
        draw.text((width // 4 + px(20), height // 4 + px(20)), "Export " + content.choice(_WORDS) + "?", fill=(0, 0, 0), font=big)
        draw.rounded_rectangle(
            (3 * width // 4 - px(130), 3 * height // 4 - px(50), 3 * width // 4 - px(20), 3 * height // 4 - px(16)), px(6), fill=bar
        )
    if change == SPINNER and variant:
        cx, cy, r = width // 2, height // 2, px(18)
        for dot, (dx, dy) in enumerate(_SPINNER_DOTS):
            x, y = cx + round(r * dx), cy + round(r * dy)
            grey = 40 if dot == variant % 8 else 190
            draw.ellipse((x - px(3), y - px(3), x + px(3), y + px(3)), fill=(grey, grey, grey))
    where = random.Random(seed * 7919 + (variant if change == CURSOR else 0))
    cx, cy = where.randrange(px(240), width - px(40)), where.randrange(px(90), height - px(40))
    arrow = [
        (cx, cy),
        (cx, cy + px(19)),
        (cx + px(5), cy + px(14)),
        (cx + px(9), cy + px(22)),
        (cx + px(12), cy + px(20)),
        (cx + px(8), cy + px(13)),
        (cx + px(14), cy + px(13)),
    ]
    draw.polygon(arrow, fill=(0, 0, 0), outline=(255, 255, 255))
    out = io.BytesIO()
    img.save(out, fmt, **({"quality": 75} if fmt in ("JPEG", "WEBP") else {}))
    return out.getvalue()


def _distinct(count: int) -> list[dict[str, Any]]:
    """The app_screen arguments of `distinct_screens`."""
    out: list[dict[str, Any]] = []
    app = 0
    while len(out) < count:
        out += [{"seed": app}, {"seed": app, "page": 1}, {"seed": app, "scroll": 8}, {"seed": app, "dialog": True}]
        app += 1
    return out[:count]


def distinct_screens(count: int, size: tuple[int, int] = (1280, 800), fmt: str = "PNG") -> list[bytes]:
    """`count` screens that each show something the others do not, the hard cases first: one app's pages, the same
    page scrolled, with a dialog open; then other apps. (A few characters typed into a field, `app_screen`'s `typed`,
    is not among them: a small edit, which a later screen shows too.)"""
    return [app_screen(size=size, fmt=fmt, **kwargs) for kwargs in _distinct(count)]


def repeating_screens(count: int, size: tuple[int, int] = (1280, 800), every: int = 3) -> tuple[list[bytes], list[int]]:
    """`count` screenshots of which every `every`-th shows the screen before it again, with the cursor moved or the
    clock a minute on (by turns), the others distinct; and the screen each shows (equal numbers: the same screen)."""
    shots: list[bytes] = []
    screens: list[int] = []
    params = _distinct(count)
    for k in range(count):
        if k % every == every - 1:
            change = (CURSOR, CLOCK)[(k // every) % 2]
            shots.append(app_screen(size=size, variant=1, change=change, **params[screens[-1]]))
            screens.append(screens[-1])
        else:
            screen = len(set(screens))
            shots.append(app_screen(size=size, **params[screen]))
            screens.append(screen)
    return shots, screens


@functools.lru_cache(maxsize=8)
def mockup(seed: int = 0, size: tuple[int, int] = (800, 600)) -> bytes:
    """A design mock-up a user attaches: grey boxes and labels on white, as a wireframe tool draws them."""
    rng = random.Random(f"mockup-{seed}")
    img = Image.new("RGB", size, (255, 255, 255))
    draw = ImageDraw.Draw(img)
    font = ImageFont.load_default(size=16)
    width = size[0]
    draw.rectangle((0, 0, width, 60), fill=(220, 220, 220))
    draw.text((20, 20), "Invoices - mock-up v" + str(seed + 1), fill=(0, 0, 0), font=font)
    for k in range(rng.randrange(4, 7)):
        y = 90 + 80 * k
        draw.rectangle((40, y, width - 40, y + 60), outline=(120, 120, 120), width=2)
        draw.line((40, y, width - 40, y + 60), fill=(200, 200, 200))
        draw.text((60, y + 20), rng.choice(_WORDS).title(), fill=(60, 60, 60), font=font)
    out = io.BytesIO()
    img.save(out, "PNG")
    return out.getvalue()


_TASK = "Build the invoices page like the picture, then check it in the browser after each change."


def agent_session(fmt: str, first: bytes | None, shots: Sequence[bytes], model: str) -> Iterator[dict[str, Any]]:
    """The bodies an agent sends, whole history each: the user's task with `first` attached (a mock-up; None: the
    task alone), then one
    request a turn after each screenshot of `shots` (PNG) came back where `fmt` puts a tool's output: an Anthropic
    `tool_result`, an OpenAI chat tool message and a user message of the screenshot alone, a Responses
    `computer_call_output`, a Gemini `functionResponse` with the screen beside it. Turn k's body holds k - 1 shots."""
    build = {"anthropic": _anthropic, "openai-chat": _openai_chat, "openai-responses": _responses, "gemini": _gemini}[fmt]
    return build(first, shots, model)


def _anthropic(first: bytes | None, shots: Sequence[bytes], model: str) -> Iterator[dict[str, Any]]:
    def block(data: bytes) -> dict[str, Any]:
        return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(data)}}

    task = [{"type": "text", "text": _TASK}, *([block(first)] if first is not None else [])]
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    for turn, shot in enumerate([*shots, None], start=1):
        yield {"model": model, "max_tokens": 1024, "messages": messages}
        if shot is None:
            return
        call = {"type": "tool_use", "id": f"toolu_{turn:03d}", "name": "computer", "input": {"action": "screenshot"}}
        result = {"type": "tool_result", "tool_use_id": call["id"], "content": [block(shot)]}
        messages = [*messages, {"role": "assistant", "content": [call]}, {"role": "user", "content": [result]}]


def _openai_chat(first: bytes | None, shots: Sequence[bytes], model: str) -> Iterator[dict[str, Any]]:
    def part(data: bytes) -> dict[str, Any]:
        return {"type": "image_url", "image_url": {"url": data_url(data, "image/png")}}

    task = [{"type": "text", "text": _TASK}, *([part(first)] if first is not None else [])]
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    for turn, shot in enumerate([*shots, None], start=1):
        yield {"model": model, "messages": messages}
        if shot is None:
            return
        call = {"id": f"call_{turn:03d}", "type": "function", "function": {"name": "screenshot", "arguments": "{}"}}
        messages = [
            *messages,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "the screenshot follows"},
            {"role": "user", "content": [part(shot)]},
        ]


def _responses(first: bytes | None, shots: Sequence[bytes], model: str) -> Iterator[dict[str, Any]]:
    task: list[dict[str, Any]] = [{"type": "input_text", "text": _TASK}]
    if first is not None:
        task.append({"type": "input_image", "image_url": data_url(first, "image/png")})
    items: list[dict[str, Any]] = [{"role": "user", "content": task}]
    for turn, shot in enumerate([*shots, None], start=1):
        yield {"model": model, "input": items, "store": False}
        if shot is None:
            return
        call = {"type": "computer_call", "call_id": f"call_{turn:03d}", "action": {"type": "screenshot"}, "pending_safety_checks": []}
        output = {
            "type": "computer_call_output",
            "call_id": call["call_id"],
            "output": {"type": "computer_screenshot", "image_url": data_url(shot, "image/png")},
        }
        items = [*items, call, output]


def _gemini(first: bytes | None, shots: Sequence[bytes], model: str) -> Iterator[dict[str, Any]]:
    def part(data: bytes) -> dict[str, Any]:
        return {"inline_data": {"mime_type": "image/png", "data": b64(data)}}

    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": _TASK}, *([part(first)] if first is not None else [])]}]
    for turn, shot in enumerate([*shots, None], start=1):
        yield {"contents": contents}
        if shot is None:
            return
        call = {"role": "model", "parts": [{"functionCall": {"name": "screenshot", "args": {"turn": turn}}}]}
        response = {"functionResponse": {"name": "screenshot", "response": {"ok": True}}}
        contents = [*contents, call, {"role": "user", "parts": [response, part(shot)]}]
