"""Synthetic screenshot sessions: real images and whole-history request bodies, as agents send them.

Used by the tests, `scripts/replay` and `scripts/bench`, so all of them exercise the same shapes.
"""

from __future__ import annotations

import base64
import functools
import io
import random
from typing import Any

from PIL import Image

from .. import _media
from ..formats import anthropic, bedrock, gemini, ollama, openai_chat, openai_responses

MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}


@functools.lru_cache(maxsize=64)
def image(width: int, height: int, fmt: str = "PNG", seed: int = 0, noise: float = 1.0) -> bytes:
    """A real image: a gradient with `noise` (0..1) of random pixels, which sets how well it compresses."""
    rng = random.Random(seed)
    base = Image.linear_gradient("L").resize((width, height)).convert("RGB")
    if noise > 0:
        speckle = Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))
        base = Image.blend(base, speckle, noise)
    out = io.BytesIO()
    kwargs: dict[str, Any] = {"quality": 80} if fmt in ("JPEG", "WEBP") else {}
    base.save(out, fmt, **kwargs)
    return out.getvalue()


@functools.lru_cache(maxsize=64)
def screenshot(kilobytes: int, fmt: str = "WEBP", seed: int = 0) -> bytes:
    """An image of about `kilobytes` KB (within ~15%), like one screenshot of an agent's screen."""
    # Noisy WEBP/JPEG at quality 80 costs about 1.2 bytes per pixel, PNG about 3: size the canvas from that.
    per_pixel = 3.0 if fmt == "PNG" else 1.2
    target = kilobytes * 1024
    side = max(8, int((target / per_pixel) ** 0.5))
    for _ in range(6):
        data = image(side * 16 // 9, side, fmt, seed)
        ratio = target / len(data)
        if 0.9 < ratio < 1.1:
            break
        side = max(8, int(side * ratio**0.5))
    return data


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def data_url(data: bytes, mime: str) -> str:
    """`data` as a base64 data URL, as the formats write one."""
    return _media.data_url(b64(data), mime)


def session_body(wire_format: str, turns: int, shot: bytes, mime: str = "image/webp", model: str | None = None) -> dict[str, Any]:
    """The body an agent sends on turn `turns`: every earlier turn re-sent with its screenshot."""
    build = _BUILDERS[wire_format]
    return build(turns, shot, mime, model)


def _question(turn: int) -> str:
    return f"Turn {turn}: here is my screen. What should I click next?"


def _answer(turn: int) -> str:
    return f"On turn {turn} I see the settings page; click Save."


def _openai_chat(turns: int, shot: bytes, mime: str, model: str | None) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a desktop assistant."}]
    for turn in range(1, turns + 1):
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": _question(turn)},
                    {"type": "image_url", "image_url": {"url": data_url(shot, mime), "detail": "auto"}},
                ],
            }
        )
        if turn < turns:
            messages.append({"role": "assistant", "content": _answer(turn)})
    return {"model": model or "gpt-4o", "messages": messages, "max_tokens": 512}


def _openai_responses(turns: int, shot: bytes, mime: str, model: str | None) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for turn in range(1, turns + 1):
        items.append(
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": _question(turn)},
                    {"type": "input_image", "image_url": data_url(shot, mime), "detail": "auto"},
                ],
            }
        )
        if turn < turns:
            items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": _answer(turn)}]})
    return {"model": model or "gpt-4.1", "instructions": "You are a desktop assistant.", "input": items}


def _anthropic(turns: int, shot: bytes, mime: str, model: str | None) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for turn in range(1, turns + 1):
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": {"type": "base64", "media_type": mime, "data": b64(shot)}},
                    {"type": "text", "text": _question(turn)},
                ],
            }
        )
        if turn < turns:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": _answer(turn)}]})
    return {"model": model or "claude-sonnet-4-5", "max_tokens": 1024, "system": "You are a desktop assistant.", "messages": messages}


def _gemini(turns: int, shot: bytes, mime: str, model: str | None) -> dict[str, Any]:
    contents: list[dict[str, Any]] = []
    for turn in range(1, turns + 1):
        contents.append({"role": "user", "parts": [{"text": _question(turn)}, {"inline_data": {"mime_type": mime, "data": b64(shot)}}]})
        if turn < turns:
            contents.append({"role": "model", "parts": [{"text": _answer(turn)}]})
    return {"systemInstruction": {"parts": [{"text": "You are a desktop assistant."}]}, "contents": contents}


def _bedrock(turns: int, shot: bytes, mime: str, model: str | None) -> dict[str, Any]:
    fmt = mime.split("/", 1)[1]
    messages: list[dict[str, Any]] = []
    for turn in range(1, turns + 1):
        messages.append({"role": "user", "content": [{"text": _question(turn)}, {"image": {"format": fmt, "source": {"bytes": b64(shot)}}}]})
        if turn < turns:
            messages.append({"role": "assistant", "content": [{"text": _answer(turn)}]})
    return {"system": [{"text": "You are a desktop assistant."}], "messages": messages, "inferenceConfig": {"maxTokens": 512}}


def _ollama(turns: int, shot: bytes, mime: str, model: str | None) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a desktop assistant."}]
    for turn in range(1, turns + 1):
        messages.append({"role": "user", "content": _question(turn), "images": [b64(shot)]})
        if turn < turns:
            messages.append({"role": "assistant", "content": _answer(turn)})
    return {"model": model or "llava:13b", "messages": messages, "stream": False}


_BUILDERS = {
    openai_chat.NAME: _openai_chat,
    openai_responses.NAME: _openai_responses,
    anthropic.NAME: _anthropic,
    gemini.NAME: _gemini,
    bedrock.NAME: _bedrock,
    ollama.NAME: _ollama,
}

# A request path for each format, for tools that send synthetic sessions.
PATHS = {
    openai_chat.NAME: "/v1/chat/completions",
    openai_responses.NAME: "/v1/responses",
    anthropic.NAME: "/v1/messages",
    gemini.NAME: "/v1beta/models/gemini-2.5-flash:generateContent",
    bedrock.NAME: "/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse",
    ollama.NAME: "/api/chat",
}
