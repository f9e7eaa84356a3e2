"""replace_data: every wire format swaps an image's bytes in place and declares the new type."""

from __future__ import annotations

import copy

import orjson
import pytest

from trimflow._imageinfo import sniff_base64
from trimflow.formats import FORMATS
from trimflow.testing import b64, image

from .cases import CASES

NEW = b64(image(20, 10, "WEBP", seed=9))
# How each format declares the type of the new bytes (Ollama declares none).
DECLARED = {
    "openai-chat": "image/webp",
    "openai-responses": "image/webp",
    "anthropic": "image/webp",
    "gemini": "image/webp",
    "bedrock-converse": "image/webp",
    "ollama": None,
}


def inline_images(fmt: str, body: dict) -> list:
    return [m for m in FORMATS[fmt].find_media(body) if m.kind == "image" and not m.remote]


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_each_inline_image_gets_the_new_bytes_and_type(fmt: str) -> None:
    body, _ = CASES[fmt]
    pristine = copy.deepcopy(body)
    module = FORMATS[fmt]
    before = module.find_media(body)
    targets = inline_images(fmt, body)
    assert targets, "each case has an inline image"
    out = module.replace_data(body, {m.path: (NEW, "image/webp") for m in targets})
    assert body == pristine  # the input is untouched
    after = module.find_media(out)
    # The same media at the same places, in the same order: only the bytes moved.
    assert [(m.kind, m.path) for m in after] == [(m.kind, m.path) for m in before]
    for old, new in zip(before, after, strict=True):
        if old.path in {t.path for t in targets}:
            assert new.data[new.data_offset :] == NEW
            assert new.declared_mime == DECLARED[fmt]
            assert sniff_base64(new.data[new.data_offset :]).mime == "image/webp"
            assert new.detail == old.detail  # OpenAI's detail (a token cost input) is kept
        else:
            assert new.data == old.data and new.declared_mime == old.declared_mime
    orjson.dumps(out)  # still plain JSON


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_one_image_replaced_leaves_its_neighbours_alone(fmt: str) -> None:
    body, _ = CASES[fmt]
    module = FORMATS[fmt]
    first = inline_images(fmt, body)[0]
    out = module.replace_data(body, {first.path: (NEW, "image/jpeg")})
    changed = [m for m in module.find_media(out) if m.data != next(o for o in module.find_media(body) if o.path == m.path).data]
    assert [m.path for m in changed] == [first.path]
    # Placeholders still work on a body whose bytes were swapped (the engine does both).
    dropped = module.replace_media(out, {first.path: "[gone]"})
    assert first.path not in {m.path for m in module.find_media(dropped)} or fmt == "ollama"
    assert b"[gone]" in orjson.dumps(dropped)
