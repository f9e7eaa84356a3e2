"""trimflow._placeholder.render: every template field filled from the image's wire form and header, unknown
sizes and types said plainly, remote media, and the same text for the same image on every turn."""

from __future__ import annotations

import base64

import orjson
import pytest

from trimflow import DEFAULT_PLACEHOLDER, prune, prune_request
from trimflow._human import format_size
from trimflow._imageinfo import sniff_base64
from trimflow._placeholder import PLACEHOLDER_FIELDS, REPEAT_FIELDS, MediaFacts, render, rescale_note
from trimflow._recall import IdMemo, image_id
from trimflow.formats import FORMATS, Media
from trimflow.testing import b64, data_url, image, session_body

from .helpers import encode, rules_with, url_for

EVERY_FIELD = " ".join(f"{name}={{{name}}}" for name in PLACEHOLDER_FIELDS)


def facts_in(fmt: str, body: dict) -> list[MediaFacts]:
    """The media of a real body as the engine sees them: found by the format, header sniffed, numbered."""
    media = [m for m in FORMATS[fmt].find_media(body) if m.kind == "image"]
    return [MediaFacts(m, n, None if m.remote else sniff_base64(m.base64_prefix(4096))) for n, m in enumerate(media, 1)]


def test_every_field_of_an_inline_image() -> None:
    png = image(300, 200, "PNG", seed=1)
    body = {
        "model": "gpt-4o",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": data_url(image(10, 10, "PNG", seed=2), "image/png")}},
                    {"type": "image_url", "image_url": {"url": data_url(png, "image/png")}},
                ],
            }
        ],
    }
    second = facts_in("openai-chat", body)[1]
    text = render(EVERY_FIELD, second, "too many images")
    wire = len(data_url(png, "image/png"))
    size = f"{round(len(png) / 1024)}KB" if len(png) >= 1024 else f"{len(png)}B"
    assert (
        text == f"kind=image ordinal=2 mime=image/png dims=300x200 size={size} bytes={wire} width=300 height=200 reason=too many images id="
    )  # recall off: no id


def test_size_is_the_decoded_size_and_bytes_the_wire_length() -> None:
    raw = bytes(range(256)) * 40  # 10 KB of something
    media = Media("image", ("messages", 0), b64(raw), declared_mime="image/png")
    facts = MediaFacts(media, 1, None)
    assert render("{size} {bytes}", facts, "r") == f"10KB {len(b64(raw))}"
    in_url = Media("image", ("messages", 0), data_url(raw, "image/png"), data_offset=len("data:image/png;base64,"))
    assert render("{size} {bytes}", MediaFacts(in_url, 1, None), "r") == f"10KB {len(data_url(raw, 'image/png'))}"  # the header is not data


def test_bytes_that_are_no_known_image_keep_the_declared_type_and_unknown_dims() -> None:
    media = Media("image", ("x",), b64(b"not an image at all" * 10), declared_mime="image/webp")
    facts = MediaFacts(media, 1, sniff_base64(media.base64_prefix(4096)))
    assert facts.info is None
    assert render("{mime} {dims} {width}x{height}", facts, "r") == "image/webp unknown size ?x?"


def test_no_declared_type_and_no_header_says_unknown_type() -> None:
    media = Media("image", ("x",), b64(b"\x00" * 64))
    assert render("{mime}", MediaFacts(media, 1, None), "r") == "unknown type"


def test_the_sniffed_type_wins_over_the_declared_one() -> None:
    jpeg = image(64, 32, "JPEG", seed=3)
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(jpeg, "image/png")}}]}]}
    [facts] = facts_in("openai-chat", body)
    assert render("{mime} {dims}", facts, "r") == "image/jpeg 64x32"


def test_remote_media_has_no_size_and_no_dims() -> None:
    body = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}}]}],
    }
    [facts] = facts_in("openai-chat", body)
    assert facts.media.remote
    assert render(DEFAULT_PLACEHOLDER, facts, "too many images") == "[trimflow: image #1 omitted (unknown type, unknown size, remote)]"
    assert render("{bytes} {width}", facts, "r") == "0 ?"


def test_a_repeat_names_the_later_ordinal() -> None:
    [facts] = facts_in(
        "openai-chat",
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(image(20, 10, "PNG", seed=5), "image/png")}}]}
            ]
        },
    )
    assert "later" in REPEAT_FIELDS and "later" not in PLACEHOLDER_FIELDS
    assert render("#{ordinal} as #{later}", facts, "repeated", later=4) == "#1 as #4"


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_the_same_image_gets_the_same_text_on_every_turn(fmt: str) -> None:
    shot = image(120, 80, "PNG", seed=8)
    first_turns = [facts_in(fmt, session_body(fmt, turns, shot, "image/png"))[0] for turns in (2, 5, 9)]
    texts = {render(DEFAULT_PLACEHOLDER, facts, "too many images") for facts in first_turns}
    assert len(texts) == 1
    [text] = texts
    assert text.startswith("[trimflow: image #1 omitted (") and "120x80" in text
    assert b64(shot)[:16] not in text


def test_the_engine_writes_the_rendered_text_where_the_image_was() -> None:
    shot = image(90, 60, "PNG", seed=9)
    body = session_body("anthropic", 3, shot, "image/png")
    [first, *_] = facts_in("anthropic", body)
    expected = render(DEFAULT_PLACEHOLDER, first, "too many images")
    out = orjson.loads(prune_request(url_for("anthropic"), {}, encode(body), rules_with(max_images=2)).body)
    assert {"type": "text", "text": expected} in out["messages"][0]["content"]
    assert base64.b64encode(shot).decode() not in expected


# -- recall (trimflow._recall): the id a placeholder names


def _recall_ids() -> IdMemo:
    return IdMemo()


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_with_recall_on_the_default_names_the_id_the_same_on_every_turn(fmt: str) -> None:
    shot = image(120, 80, "PNG", seed=8)
    memo = _recall_ids()
    texts = set()
    for turns in (2, 5, 9):
        [facts, *_] = facts_in(fmt, session_body(fmt, turns, shot, "image/png"))
        texts.add(render(DEFAULT_PLACEHOLDER, MediaFacts(facts.media, facts.ordinal, facts.info, memo.ids(b"owner")), "too many images"))
    assert texts == {f'[trimflow: image #1 omitted (image/png, 120x80, {format_size(len(shot))}); recall_image("{image_id(shot)}") brings it back]'}


def test_with_recall_off_no_placeholder_offers_it() -> None:
    shot = image(120, 80, "PNG", seed=8)
    [facts] = facts_in("openai-chat", session_body("openai-chat", 1, shot, "image/png"))
    text = render(DEFAULT_PLACEHOLDER, facts, "too many images")
    assert "recall" not in text and text == DEFAULT_PLACEHOLDER.format(
        kind="image", ordinal=1, mime="image/png", dims="120x80", size=format_size(len(shot)), reason=""
    )
    assert render("[{id}]", facts, "r") == "[]"  # a rule's own template naming {id}: empty with recall off


def test_a_rules_own_template_and_a_rescale_note_name_the_id_with_recall_on() -> None:
    shot = image(400, 300, "PNG", seed=3)
    [facts] = facts_in("openai-chat", session_body("openai-chat", 1, shot, "image/png"))
    with_ids = MediaFacts(facts.media, facts.ordinal, facts.info, _recall_ids().ids(b"owner"))
    assert render("gone: {id}", with_ids, "r") == f"gone: {image_id(shot)}"
    assert rescale_note(with_ids, 200, 150).endswith(f'(scale 0.5); recall_image("{image_id(shot)}") brings the original]')
    assert "recall" not in rescale_note(facts, 200, 150)
    # A remote image has no bytes here: the plain placeholder, no id.
    remote = MediaFacts(Media("image", ("x",), None), 2, None, _recall_ids().ids(b"owner"))
    assert "recall" not in render(DEFAULT_PLACEHOLDER, remote, "r")


def test_the_engine_keeps_the_images_whose_text_names_them() -> None:
    body = session_body("anthropic", 6, image(90, 60, "PNG", seed=9), "image/png")
    shots = [image(90, 60, "PNG", seed=s) for s in range(6)]
    for message, shot in zip((m for m in body["messages"] if m["role"] == "user"), shots, strict=False):
        for block in message["content"]:
            if block.get("type") == "image":
                block["source"]["data"] = b64(shot)
    rules = rules_with(max_images=2)
    target = rules.target_for_url(url_for("anthropic"), {})
    outcome = prune(target, {}, encode(body), rules, recall=_recall_ids().ids(b"owner"))
    texts = [b["text"] for m in orjson.loads(outcome.body)["messages"] for b in m["content"] if b.get("type") == "text" and "trimflow" in b["text"]]
    assert [k.id for k in outcome.kept] == [image_id(s) for s in shots[:4]]
    assert all(f'recall_image("{k.id}")' in t for k, t in zip(outcome.kept, texts, strict=True))
    plain = prune(target, {}, encode(body), rules_with(max_images=2, placeholder="[gone #{ordinal}]"), recall=_recall_ids().ids(b"owner"))
    assert plain.kept == [] and plain.record is not None and plain.record.pruned == 4  # nothing named: nothing kept
    assert prune(target, {}, encode(body), rules).kept == []  # recall off
