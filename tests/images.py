"""Requests with images and checks on what the engine sends: shared by the tests of the engine and the policy.

Images are real (Pillow); a check decodes what was sent, so a limit is met by the bytes, not by a count.
"""

from __future__ import annotations

import base64
import io
import random

import orjson
from PIL import Image

from trimflow import prune_request
from trimflow.formats import FORMATS
from trimflow.testing import data_url, image

from .helpers import encode, rules_with, url_for

MiB = 2**20
FIVE_MB = 5 * MiB
MIME = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}


def chat_with_images(count: int, *, text_last: bool = False) -> dict:
    """An OpenAI chat history with `count` images, one per user turn, each image distinct."""
    messages = []
    for i in range(count):
        shot = image(40 + i, 30, "PNG", seed=i)
        content = [{"type": "text", "text": f"turn {i}"}, {"type": "image_url", "image_url": {"url": data_url(shot, "image/png")}}]
        messages.append({"role": "user", "content": content})
        messages.append({"role": "assistant", "content": f"answer {i}"})
    if text_last:
        messages.append({"role": "user", "content": "and now?"})
    return {"model": "gpt-4o", "messages": messages}


def reshuffled_chat(urls: list[str], turn: int, seed: int = 0) -> dict:
    """Turn `turn` of an aider-like OpenAI chat: every image the user added (`urls`, oldest first) in one early user
    message, each after its file name, in an order that changes on every request; a system prompt with the time,
    which changes too; then one question and answer per turn."""
    order = list(range(len(urls)))
    random.Random(seed * 7919 + turn).shuffle(order)
    content: list[dict] = []
    for i in order:
        content += [{"type": "text", "text": f"Image file: shot{i}.png"}, {"type": "image_url", "image_url": {"url": urls[i], "detail": "high"}}]
    messages: list[dict] = [
        {"role": "system", "content": f"Act as an expert software developer.\n- Current date/time: 2026-01-01T10:{turn:02d}:00"},
        {"role": "user", "content": content},
        {"role": "assistant", "content": "Ok."},
    ]
    for n in range(1, turn):
        messages += [{"role": "user", "content": f"what changed in shot{n - 1}.png?"}, {"role": "assistant", "content": f"answer {n}"}]
    messages.append({"role": "user", "content": f"what changed in shot{turn - 1}.png?"})
    return {"model": "gpt-4o", "messages": messages}


def images_left(body: bytes, wire_format: str = "openai-chat") -> list[str]:
    """The data of the images still in a body, oldest first."""
    return [m.data for m in FORMATS[wire_format].find_media(orjson.loads(body)) if m.kind == "image"]


def anthropic(*images: tuple[str, str]) -> dict:
    """A Claude conversation with one image (base64, media type) per user turn."""
    messages: list[dict] = []
    for n, (data, mime) in enumerate(images, 1):
        if n > 1:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": f"ok {n - 1}"}]})
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": f"turn {n}"},
                    {"type": "image", "source": {"type": "base64", "media_type": mime, "data": data}},
                ],
            }
        )
    return {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": messages}


def chat(*urls: str) -> dict:
    return {
        "model": "gpt-4o",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": f"turn {n}"}, {"type": "image_url", "image_url": {"url": u}}]}
            for n, u in enumerate(urls, 1)
        ],
    }


def prune_with(fmt: str, body: dict | bytes, mode: str = "enforce", **limits):
    """The engine's outcome for `body` sent to `fmt`'s endpoint, with these limits as the defaults."""
    raw = body if isinstance(body, bytes) else encode(body)
    return prune_request(url_for(fmt), {}, raw, rules_with(**limits), mode)


def sent(fmt: str, body: bytes) -> list:
    """The images a body carries, oldest first."""
    return [m for m in FORMATS[fmt].find_media(orjson.loads(body)) if m.kind == "image"]


def payload(media) -> str:
    return media.data[media.data_offset :]


def decoded(media) -> Image.Image:
    im = Image.open(io.BytesIO(base64.b64decode(payload(media))))
    im.load()
    return im


def check_image(fmt: str, media, *, max_side: int | None = None, max_bytes: int | None = None) -> Image.Image:
    """Decode the image: within its limits, and its part declares what the bytes really are."""
    im = decoded(media)
    if max_side is not None:
        assert max(im.size) <= max_side, im.size
    if max_bytes is not None:
        assert len(payload(media)) <= max_bytes
    if fmt != "ollama":  # Ollama declares no type
        assert media.declared_mime == MIME[im.format], (media.declared_mime, im.format)
    return im


def texts(body: bytes) -> list[str]:
    """Every text an Anthropic or OpenAI chat body holds, in order."""
    return [part["text"] for m in orjson.loads(body)["messages"] for part in m["content"] if isinstance(part, dict) and part.get("type") == "text"]
