"""formats._base, the helpers every format module uses: media from a URL, and edits that copy only the containers on
their paths and never touch the input. Data URLs and a MIME type's kind: tests/test_media.py."""

from __future__ import annotations

import copy

from trimflow.formats import DOCUMENT, IMAGE, Media
from trimflow.formats._base import dicts, rebuild, replace_images, replace_parts, url_media


def test_url_media_reads_a_data_url_and_takes_anything_else_for_remote() -> None:
    inline = url_media(IMAGE, ("p", 0), "data:image/png;base64,AAAA", "high")
    assert inline == Media(IMAGE, ("p", 0), "data:image/png;base64,AAAA", 22, "image/png", "high")
    assert (inline.remote, inline.wire_bytes, inline.base64_prefix(2)) == (False, 26, "AA")
    remote = url_media(IMAGE, ("p", 1), "https://example.invalid/a.png")
    assert remote == Media(IMAGE, ("p", 1), None, 0, None, None)
    assert (remote.remote, remote.wire_bytes, remote.base64_prefix(8)) == (True, 0, "")
    assert url_media(IMAGE, ("p", 2), 42) is None and url_media(IMAGE, ("p", 3), None) is None


def test_url_media_takes_the_kind_from_an_image_parts_data_url() -> None:
    # An image part carrying a PDF or audio is that, not an image; a file part stays a document whatever it holds.
    assert url_media(IMAGE, (), "data:application/pdf;base64,JVBE").kind == DOCUMENT
    assert url_media(IMAGE, (), "data:audio/wav;base64,UklG").kind == "audio"
    assert url_media(IMAGE, (), "data:;base64,AAAA").kind == IMAGE  # no type declared: as the part says
    assert url_media(DOCUMENT, (), "data:image/png;base64,AAAA").kind == DOCUMENT


def test_rebuild_copies_only_the_containers_on_the_edited_paths() -> None:
    body = {"messages": [{"content": ["a", "b"]}, {"content": ["c"]}], "tools": [{"name": "t"}], "n": 1}
    pristine = copy.deepcopy(body)
    out = rebuild(body, {("messages", 0, "content", 1): str.upper})
    assert out == {"messages": [{"content": ["a", "B"]}, {"content": ["c"]}], "tools": [{"name": "t"}], "n": 1}
    assert body == pristine  # the input is untouched
    assert out is not body and out["messages"] is not body["messages"] and out["messages"][0] is not body["messages"][0]
    assert out["messages"][1] is body["messages"][1] and out["tools"] is body["tools"]  # off the path: shared


def test_rebuild_applies_every_edit_once_and_the_empty_path_is_the_whole_node() -> None:
    body = {"a": [1, 2, 3], "b": {"c": 4}}
    out = rebuild(body, {("a", 0): lambda v: v * 10, ("a", 2): lambda v: v * 100, ("b", "c"): lambda v: -v})
    assert out == {"a": [10, 2, 300], "b": {"c": -4}}
    assert rebuild(body, {(): lambda _: "replaced"}) == "replaced"
    assert rebuild(body, {}) == body


def test_replace_parts_and_replace_images_hand_the_old_part_to_the_format() -> None:
    body = {"parts": [{"kind": "img", "keep": 1}, {"kind": "text"}]}
    out = replace_parts(body, {("parts", 0): "[gone]"}, lambda old, text: {"text": text, "kept": old["keep"]})
    assert out["parts"] == [{"text": "[gone]", "kept": 1}, {"kind": "text"}]
    out = replace_images(body, {("parts", 0): ("QUJD", "image/jpeg")}, lambda old, data, mime: {**old, "data": data, "mime": mime})
    assert out["parts"][0] == {"kind": "img", "keep": 1, "data": "QUJD", "mime": "image/jpeg"}
    assert body == {"parts": [{"kind": "img", "keep": 1}, {"kind": "text"}]}


def test_dicts_yields_the_mappings_of_a_list_with_their_index_and_nothing_from_anything_else() -> None:
    assert dicts([{"a": 1}, "x", None, {"b": 2}, [3]]) == [(0, {"a": 1}), (3, {"b": 2})]
    for malformed in (None, "text", {"a": 1}, 7):
        assert dicts(malformed) == []
