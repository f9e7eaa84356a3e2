"""formats.ollama: images are bare base64 strings in a message's `images`; a dropped one leaves the list and its
note joins the message's content, and new bytes replace the string in place."""

from __future__ import annotations

from trimflow.formats import FORMATS
from trimflow.testing import b64

from .cases import CASES, JPEG

OLLAMA = FORMATS["ollama"]
NEW = b64(JPEG)


def test_a_dropped_image_leaves_images_and_its_note_joins_content() -> None:
    body, _ = CASES["ollama"]
    out = OLLAMA.replace_media(body, {("messages", 0, "images", 0): "[one]", ("messages", 2, "images", 0): "[three]"})
    assert out["messages"][0]["images"] == [b64(JPEG)]
    assert out["messages"][0]["content"] == "look\n[one]"
    # An empty message gets the note alone, never empty content.
    assert out["messages"][2]["content"] == "[three]"
    assert out["messages"][2]["images"] == [5]


def test_new_bytes_replace_the_string_in_place() -> None:
    oll = {"messages": [{"role": "user", "content": "hi", "images": ["AAAA", "BBBB"]}]}
    out = OLLAMA.replace_data(oll, {("messages", 0, "images", 1): (NEW, "image/jpeg")})
    assert out["messages"][0] == {"role": "user", "content": "hi", "images": ["AAAA", NEW]}
