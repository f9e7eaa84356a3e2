"""trimflow._history: what a request's conversation digests to (payloads as written, alike parsed as a skeleton or
whole; media and trimflow's placeholders left out), the session ids that name one, a Responses answer's id, and an
image's key and CRC-32. How the digests number conversations: tests/test_conversation.py."""

from __future__ import annotations

import json

import orjson
import pytest

from trimflow import prune_request
from trimflow._body import Payload, parse
from trimflow._history import History, history_of, image_crc, image_key, response_id_of, session_key
from trimflow._placeholder import PLACEHOLDER_PREFIX
from trimflow.formats import HistoryParts, Media
from trimflow.testing import PATHS, b64, data_url, image, session_body

from .helpers import rules_with

HOST = "api.example.test"
SHOT = image(24, 16, "PNG", seed=4)


def history(body: dict | bytes, fmt: str) -> History:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    outcome = prune_request(f"https://{HOST}{PATHS[fmt]}", {}, raw, rules_with())
    assert outcome.history is not None
    return outcome.history


def test_a_payload_is_digested_as_written_alike_in_a_skeleton_and_parsed_whole() -> None:
    # A payload's bytes are hashed in place: two that differ only in the middle are two messages, and a message digests
    # the same in a body parsed as a skeleton (large, with clean strings) as in one parsed whole (small).
    def body(middle: str) -> dict:
        return {"model": "m", "messages": [{"role": "user", "content": "x" * 2000 + middle + "y" * 2000}, {"role": "user", "content": "z" * 9000}]}

    p, q = history(body("P" * 20000), "openai-chat"), history(body("Q" * 20000), "openai-chat")
    assert p.messages[0] != q.messages[0]
    assert p.messages[1] == q.messages[1]
    alone = {"model": "m", "messages": body("P" * 8000)["messages"][:1]}
    assert not parse(orjson.dumps(alone)).is_skeleton and parse(orjson.dumps(body("P" * 8000))).is_skeleton
    assert history(alone, "openai-chat").prefixes[0] == history(body("P" * 8000), "openai-chat").prefixes[0]


def test_a_history_orjson_cannot_write_still_gets_stable_digests() -> None:
    def body(seed: int) -> bytes:  # over 64 bits: orjson refuses it
        return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi", "seed": seed}]}).encode()

    assert history(body(2**70), "openai-chat").messages == history(body(2**70), "openai-chat").messages
    assert history(body(2**71), "openai-chat").messages != history(body(2**70), "openai-chat").messages


def test_headers_come_before_body_fields_and_body_fields_before_metadata() -> None:
    body = {"prompt_cache_key": "cache-7", "metadata": {"user_id": "user_abc_session_1"}}
    by_header = session_key({"session_id": "s-1"}, body)
    assert by_header == session_key({"session_id": "s-1"}, {})
    by_field = session_key({}, body)
    assert by_field not in (None, by_header) and by_field == session_key({}, {"prompt_cache_key": "cache-7"})
    by_user = session_key({}, {"metadata": body["metadata"]})
    assert by_user not in (None, by_field, by_header)


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({"session_id": ""}, {}),  # an empty header names nothing
        ({}, {"prompt_cache_key": ""}),
        ({}, {"conversation": 5}),  # a field that is not text names nothing
        ({}, {"metadata": {"user_id": 7}}),
        ({}, {"metadata": "user_abc"}),
    ],
)
def test_empty_or_odd_ids_name_nothing(headers: dict, body: dict) -> None:
    assert session_key(headers, body) is None


def test_the_answer_names_its_id_first() -> None:
    assert response_id_of(b'{"id":"resp_abc","object":"response","output":[{"id":"msg_1"}]}') == "resp_abc"
    sse = b'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_sse","status":"in_progress"}}\n\n'
    assert response_id_of(sse) == "resp_sse"
    assert response_id_of(b'{"object":"list"}') is None


def test_image_payloads_never_reach_a_digest_input() -> None:
    # Media parts are left out before anything is hashed: two sessions with other screenshots are one history.
    other = session_body("anthropic", 3, image(24, 16, "PNG", seed=99), "image/png")
    assert b64(image(24, 16, "PNG", seed=99)) != b64(SHOT)
    assert history(other, "anthropic").messages == history(session_body("anthropic", 3, SHOT, "image/png"), "anthropic").messages


def test_an_image_key_reads_the_ends_and_the_crc_the_whole_payload_but_for_a_png() -> None:
    png = b64(image(64, 40, "PNG", seed=1))
    jpeg = "/9j/" + "A" * 5000
    other = jpeg[:2500] + "B" + jpeg[2501:]  # one character in the middle: same length, same ends
    assert image_key(Media("image", (), jpeg)) == image_key(Media("image", (), other))
    assert image_crc(Media("image", (), jpeg)) != image_crc(Media("image", (), other))
    assert image_crc(Media("image", (), png)) == 0 and image_key(Media("image", (), png)) != image_key(Media("image", (), jpeg))
    url = "data:image/jpeg;base64," + jpeg  # the payload, not its data URL's header
    in_url = Media("image", (), url, len(url) - len(jpeg))
    assert (image_key(in_url), image_crc(in_url)) == (image_key(Media("image", (), jpeg)), image_crc(Media("image", (), jpeg)))
    body = b'{"x":"' + jpeg.encode() + b'"}'  # a payload the skeleton left in the body reads as the same string
    in_place = Media("image", (), Payload(body, 6, 6 + len(jpeg)))
    assert (image_key(in_place), image_crc(in_place)) == (image_key(Media("image", (), jpeg)), image_crc(Media("image", (), jpeg)))


def test_the_tools_digest_ignores_moved_cache_breakpoints_and_sees_a_changed_tool() -> None:
    def tools_of(body: dict) -> int:
        parts = HistoryParts(body, body.get("system"), body["messages"], ("messages",))
        return history_of("h", {}, parts, [], lambda out: out).tools

    tool = {"name": "click", "description": "Click at x, y.", "input_schema": {"type": "object"}}
    plain = {"system": "s", "tools": [tool, {**tool, "name": "type"}], "messages": []}
    marked = {**plain, "tools": [tool, {**tool, "name": "type", "cache_control": {"type": "ephemeral"}}]}
    bedrock = {**plain, "toolConfig": {"tools": [{"toolSpec": tool}, {"cachePoint": {"type": "default"}}]}}
    del bedrock["tools"]
    bedrock_plain = {**bedrock, "toolConfig": {"tools": [{"toolSpec": tool}]}}
    changed = {**plain, "tools": [tool, {**tool, "name": "type", "description": "Type text."}]}
    assert tools_of(plain) == tools_of(marked) != tools_of(changed)
    assert tools_of(bedrock) == tools_of(bedrock_plain) != 0
    assert tools_of({"system": "s", "messages": []}) == 0


def test_a_message_seen_before_still_leaves_out_a_breakpoint_it_gains() -> None:
    # Messages seen clean are not searched again; the same message with a breakpoint is other JSON, and is.
    message = {"role": "user", "content": [{"type": "text", "text": "the log tail " * 50}]}
    body = {"model": "m", "max_tokens": 9, "messages": [message]}
    first, again = history(body, "anthropic"), history(body, "anthropic")
    message["content"][0]["cache_control"] = {"type": "ephemeral"}
    marked = history(body, "anthropic")
    assert first.messages == again.messages == marked.messages


def test_a_text_body_digests_its_messages_as_a_body_with_media_does() -> None:
    # A body parsed whole with no media (a text body) has its messages written and hashed in one pass; the same
    # messages in a body with an image take the general path: their digests agree, a breakpoint and trimflow's
    # placeholder for the image left out alike.
    def text(n: int) -> dict:
        return {"role": "tool", "tool_call_id": f"call_{n}", "content": json.dumps({"n": n, "lines": ['a\n"b"'] * 40})}

    shot = {"type": "image_url", "image_url": {"url": data_url(SHOT, "image/png")}}
    placeholder = {"type": "text", "text": PLACEHOLDER_PREFIX + " image 1 removed]"}
    marked = {"type": "text", "text": "look", "cache_control": {"type": "ephemeral"}}
    plain = {"type": "text", "text": "look"}
    with_media = {"model": "m", "messages": [text(1), {"role": "user", "content": [plain, shot]}, text(2)]}
    as_text = {"model": "m", "messages": [text(1), {"role": "user", "content": [marked, placeholder]}, text(2)]}
    assert not parse(orjson.dumps(as_text)).is_skeleton
    for _ in range(2):  # messages new, then seen clean before
        assert history(as_text, "openai-chat").messages == history(with_media, "openai-chat").messages
    assert history(as_text, "openai-chat").origin == history(with_media, "openai-chat").origin
