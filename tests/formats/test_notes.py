"""add_notes and the rescale note: every format that carries images puts an image's note in that image's own
message (or the tool result holding it), after every part, so no other part moves; the engine writes one for each
image shrunk to other dimensions, the same on every turn, counts it, and a rule turns it off."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from trimflow import parse_rules, prune_request
from trimflow.formats import FORMATS
from trimflow.testing import PATHS, b64, image, session_body

from .cases import CASES

IMAGE_FORMATS = sorted(FORMATS)


def message_of(path: tuple) -> tuple:
    return path[:2]  # messages[m], input[i], contents[c]


@pytest.mark.parametrize("fmt", IMAGE_FORMATS)
def test_a_note_sits_in_its_images_message_and_moves_no_part(fmt: str) -> None:
    body, _ = CASES[fmt]
    pristine = copy.deepcopy(body)
    module = FORMATS[fmt]
    before = module.find_media(body)
    inline = [m for m in before if m.kind == "image" and not m.remote and m.path[-1] != "output"]
    notes = {m.path: f"[note {n}]" for n, m in enumerate(inline)}
    out = module.add_notes(body, notes)
    assert body == pristine  # the input is untouched
    # Every media is where it was, with the same bytes: appending moved nothing.
    assert [(m.kind, m.path, m.data) for m in module.find_media(out)] == [(m.kind, m.path, m.data) for m in before]
    messages = {message_of(m.path) for m in inline}
    items = out[next(iter(messages))[0]]
    for index, item in enumerate(items):
        text = orjson.dumps(item)
        mine = [n for path, n in notes.items() if message_of(path) == (next(iter(messages))[0], index)]
        assert all(n.encode() in text for n in mine), (index, mine)
        if not mine:
            assert item == pristine[next(iter(messages))[0]][index]  # other messages are untouched
    orjson.dumps(out)


@pytest.mark.parametrize("fmt", sorted(set(IMAGE_FORMATS) - {"ollama"}))
def test_the_note_is_the_last_part_of_the_list_holding_the_image(fmt: str) -> None:
    body, _ = CASES[fmt]
    module = FORMATS[fmt]
    first = next(m for m in module.find_media(body) if m.kind == "image" and not m.remote)
    out = module.add_notes(body, {first.path: "[the note]"})
    holder: Any = out
    for key in first.path[:-1]:
        holder = holder[key]
    assert isinstance(holder, list) and "[the note]" in orjson.dumps(holder[-1]).decode()


def test_ollama_notes_join_the_message_text() -> None:
    body, _ = CASES["ollama"]
    module = FORMATS["ollama"]
    first = next(m for m in module.find_media(body) if m.kind == "image")
    out = module.add_notes(body, {first.path: "[the note]"})
    message = out[first.path[0]][first.path[1]]
    assert message["content"].endswith("\n[the note]") and message["images"] == body[first.path[0]][first.path[1]]["images"]


def test_gemini_puts_a_function_responses_note_in_its_contents_parts() -> None:
    """functionResponse.parts take only media: the note goes to the parts of the content holding it."""
    shot = b64(image(32, 24, "PNG"))
    body = {
        "contents": [
            {"role": "user", "parts": [{"text": "look"}]},
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "screenshot", "response": {}, "parts": [{"inlineData": {"mimeType": "image/png", "data": shot}}]}}
                ],
            },
        ]
    }
    module = FORMATS["gemini"]
    [media] = module.find_media(body)
    out = module.add_notes(body, {media.path: "[the note]"})
    assert out["contents"][1]["parts"][-1] == {"text": "[the note]"}
    assert out["contents"][1]["parts"][0] == body["contents"][1]["parts"][0]


def test_a_computer_screenshot_gets_no_note_its_item_takes_no_text() -> None:
    shot = {"type": "computer_screenshot", "image_url": "data:image/png;base64," + b64(image(32, 24, "PNG"))}
    body = {"model": "computer-use-preview", "input": [{"type": "computer_call_output", "call_id": "c1", "output": shot}]}
    assert FORMATS["openai-responses"].add_notes(body, {("input", 0, "output"): "[the note]"}) == body


# --- the engine writes them -------------------------------------------------------------------------------------

WIDE = image(1200, 600, "PNG", seed=5, noise=0.1)
NOTE = b"[trimflow: image #2 was resized from 1200x600 to 400x200 (scale 0.3333)]"


def rules(note: bool = True):
    return parse_rules(f"defaults:\n  max_image_side: 400\n  rescale_note: {'true' if note else 'false'}\n")


@pytest.mark.parametrize("fmt", IMAGE_FORMATS)
def test_a_rescaled_image_gets_its_note_the_same_on_every_turn(fmt: str) -> None:
    small = image(300, 200, "PNG", seed=6)
    body = session_body(fmt, 2, small, "image/png")
    module = FORMATS[fmt]
    paths = [m.path for m in module.find_media(body) if m.kind == "image"]
    body = module.replace_data(body, {paths[1]: (b64(WIDE), "image/png")})  # the second screenshot is too wide
    url = f"https://api.example.test{PATHS[fmt]}"
    out = prune_request(url, {}, orjson.dumps(body), rules())
    record = out.record
    assert record is not None and (record.shrunk, record.images_rescaled, record.images_after) == (1, 1, 2)
    assert out.body.count(NOTE) == 1
    sent = orjson.loads(out.body)
    # In the second image's message, and the first image's message is as it came.
    assert NOTE in orjson.dumps(sent[paths[1][0]][paths[1][1]])
    assert sent[paths[0][0]][paths[0][1]] == body[paths[0][0]][paths[0][1]]
    assert [m.path for m in module.find_media(sent) if m.kind == "image"] == paths
    # The next turn repeats the same bytes for this part of the history (prompt caches).
    again = prune_request(url, {}, orjson.dumps(body), rules())
    assert again.body == out.body
    quiet = prune_request(url, {}, orjson.dumps(body), rules(note=False))
    assert quiet.record is not None and quiet.record.images_rescaled == 1 and NOTE not in quiet.body


def test_an_image_that_keeps_its_size_gets_no_note() -> None:
    """Over the byte limit but rescued by an encoding at full size: nothing to say about coordinates."""
    body = session_body("anthropic", 1, WIDE, "image/png")
    limit = len(b64(WIDE)) * 2 // 3
    out = prune_request("https://api.example.test/v1/messages", {}, orjson.dumps(body), parse_rules(f"defaults:\n  max_image_bytes: {limit}\n"))
    assert out.record is not None and (out.record.shrunk, out.record.images_rescaled) == (1, 0)
    assert b"was resized" not in out.body


def test_in_a_computer_use_request_the_note_asks_for_coordinates_in_the_image_as_sent() -> None:
    # The proxy maps the answer's clicks back (trimflow._clicks): a model that scaled its coordinates by the note's
    # sizes itself would be mapped twice.
    small = image(300, 200, "PNG", seed=6)
    body = session_body("anthropic", 2, small, "image/png")
    module = FORMATS["anthropic"]
    paths = [m.path for m in module.find_media(body) if m.kind == "image"]
    body = module.replace_data(body, {paths[1]: (b64(WIDE), "image/png")})
    url = f"https://api.example.test{PATHS['anthropic']}"
    plain = prune_request(url, {}, orjson.dumps(body), rules())
    body["tools"] = [{"type": "computer_20250124", "name": "computer", "display_width_px": 1200, "display_height_px": 600}]
    computer = prune_request(url, {}, orjson.dumps(body), rules())
    assert NOTE in plain.body and b"coordinates" not in plain.body
    assert computer.body.count(NOTE[:-1] + b"; answer coordinates in this image's pixels]") == 1
