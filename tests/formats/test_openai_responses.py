"""formats.openai_responses: a placeholder is input_text, in a tool's output too; a WebSocket response.create is
read at the top level or nested; new bytes go in the data URL with the detail kept; a computer-use screenshot is an
image, and its placeholder a card."""

from __future__ import annotations

import base64
import io

import orjson
from PIL import Image

from trimflow import parse_rules, prune_request
from trimflow._imageinfo import sniff_base64
from trimflow._tokens import text_tokens
from trimflow.formats import FORMATS
from trimflow.formats._card import CARD_HEIGHT, CARD_WIDTH, card
from trimflow.testing import b64, count_images, data_url, image

from .cases import CASES, JPEG, PNG

RESPONSES = FORMATS["openai-responses"]
NEW = b64(JPEG)


def test_the_placeholder_is_input_text_in_tool_output_too() -> None:
    body, _ = CASES["openai-responses"]
    out = RESPONSES.replace_media(body, {("input", 2, "output", 1): "[gone]"})
    assert out["input"][2]["output"][1] == {"type": "input_text", "text": "[gone]"}
    assert out["input"][2]["call_id"] == "c1"


def test_a_custom_tools_screenshots_are_found_and_replaced_like_a_functions() -> None:
    """Codex returns screenshots from its JavaScript `exec` tool as a custom tool's output parts."""
    shot = {"type": "input_image", "image_url": data_url(PNG, "image/png")}
    body = {
        "model": "gpt-5.1-codex",
        "input": [
            {"type": "custom_tool_call", "call_id": "c1", "name": "exec", "input": "await screenshot()"},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "done"}, shot]},
            {"type": "custom_tool_call_output", "call_id": "c2", "output": "plain text"},
        ],
    }
    assert [(m.kind, m.path) for m in RESPONSES.find_media(body)] == [("image", ("input", 1, "output", 1))]
    out = RESPONSES.replace_media(body, {("input", 1, "output", 1): "[gone]"})
    assert out["input"][1]["output"] == [{"type": "input_text", "text": "done"}, {"type": "input_text", "text": "[gone]"}]
    assert out["input"][2] == body["input"][2]


def test_websocket_response_create_is_read_at_top_level_or_nested() -> None:
    item = {"role": "user", "content": [{"type": "input_image", "image_url": data_url(PNG, "image/png")}]}
    flat = {"type": "response.create", "model": "gpt-5", "input": [item]}
    nested = {"type": "response.create", "response": {"model": "gpt-5", "input": [item]}}
    assert [m.path for m in RESPONSES.find_media(flat)] == [("input", 0, "content", 0)]
    assert [m.path for m in RESPONSES.find_media(nested)] == [("response", "input", 0, "content", 0)]
    out = RESPONSES.replace_media(nested, {("response", "input", 0, "content", 0): "[gone]"})
    assert out["response"]["input"][0]["content"][0]["type"] == "input_text"


def test_new_bytes_go_in_the_data_url_and_the_detail_stays() -> None:
    resp = {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}]}]}
    out = RESPONSES.replace_data(resp, {("input", 0, "content", 0): (NEW, "image/jpeg")})
    assert out["input"][0]["content"][0] == {"type": "input_image", "image_url": "data:image/jpeg;base64," + NEW, "detail": "low"}


def _computer_use(shot_url: str, detail: str | None = "high") -> dict:
    screenshot = {"type": "computer_screenshot", "image_url": shot_url, **({"detail": detail} if detail else {})}
    return {
        "model": "computer-use-preview",
        "tools": [{"type": "computer_use_preview", "display_width": 1024, "display_height": 768, "environment": "browser"}],
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "open the settings"}]},
            {"type": "computer_call", "call_id": "c1", "action": {"type": "screenshot"}, "pending_safety_checks": []},
            {"type": "computer_call_output", "call_id": "c1", "output": screenshot},
        ],
        "truncation": "auto",
    }


def test_a_computer_screenshot_is_an_image_with_its_detail() -> None:
    body = _computer_use(data_url(PNG, "image/png"), "original")
    [shot] = RESPONSES.find_media(body)
    assert (shot.kind, shot.path, shot.declared_mime, shot.detail) == ("image", ("input", 2, "output"), "image/png", "original")
    assert shot.data is not None and shot.data[shot.data_offset :] == b64(PNG)


def test_a_computer_screenshot_by_file_id_or_url_is_remote() -> None:
    body = _computer_use("https://example.invalid/shot.png", None)
    [shot] = RESPONSES.find_media(body)
    assert shot.remote and shot.kind == "image"


def test_new_bytes_go_in_the_screenshots_data_url_and_it_stays_a_screenshot() -> None:
    body = _computer_use(data_url(PNG, "image/png"))
    out = RESPONSES.replace_data(body, {("input", 2, "output"): (NEW, "image/jpeg")})
    assert out["input"][2] == {
        "type": "computer_call_output",
        "call_id": "c1",
        "output": {"type": "computer_screenshot", "image_url": "data:image/jpeg;base64," + NEW, "detail": "high"},
    }
    assert body["input"][2]["output"]["image_url"] == data_url(PNG, "image/png")  # the input is untouched


def test_a_pruned_screenshot_becomes_a_card_showing_the_placeholder_and_is_never_found_again() -> None:
    """A computer_call_output takes only a screenshot: the placeholder's text is drawn on a small one-bit PNG."""
    body = _computer_use(data_url(PNG, "image/png"))
    out = RESPONSES.replace_media(body, {("input", 2, "output"): "[trimflow: image #1 omitted]"})
    item = out["input"][2]
    assert (item["type"], item["call_id"]) == ("computer_call_output", "c1")
    shot = item["output"]
    assert (shot["type"], shot["detail"]) == ("computer_screenshot", "high")
    assert shot["image_url"].startswith("data:image/png;base64,")
    card_bytes = base64.b64decode(shot["image_url"].split(",", 1)[1])
    with Image.open(io.BytesIO(card_bytes)) as im:
        assert (im.format, im.size) == ("PNG", (CARD_WIDTH, CARD_HEIGHT))
        assert im.convert("L").getextrema() == (0, 255)  # the text is drawn on it
    assert len(shot["image_url"]) < 2000
    assert RESPONSES.find_media(out) == []  # a card is a placeholder, not an image to count or prune again
    # The same text gives the same bytes (prompt caches); another text another card.
    again = RESPONSES.replace_media(body, {("input", 2, "output"): "[trimflow: image #1 omitted]"})
    other = RESPONSES.replace_media(body, {("input", 2, "output"): "[trimflow: image #2 omitted]"})
    assert again == out and other["input"][2]["output"]["image_url"] != shot["image_url"]


def test_a_screenshot_that_only_starts_like_a_png_is_still_an_image() -> None:
    """Only the card's fixed head (its marking chunk included) makes a screenshot a placeholder."""
    ordinary = base64.b64encode(base64.b64decode(card("x"))[:33] + b"\x00\x00\x00\x00IDAT").decode()
    body = _computer_use("data:image/png;base64," + ordinary)
    assert [m.path for m in RESPONSES.find_media(body)] == [("input", 2, "output")]


def _session(shots: int, side: tuple[int, int] = (64, 48)) -> dict:
    items: list[dict] = [{"role": "user", "content": [{"type": "input_text", "text": "open the settings"}]}]
    for n in range(shots):
        shot = data_url(image(*side, "PNG", seed=n), "image/png")
        items.append({"type": "computer_call", "call_id": f"c{n}", "action": {"type": "screenshot"}, "pending_safety_checks": []})
        items.append({"type": "computer_call_output", "call_id": f"c{n}", "output": {"type": "computer_screenshot", "image_url": shot}})
    return {"model": "computer-use-preview", "input": items, "truncation": "auto"}


def test_computer_screenshots_are_counted_capped_estimated_and_pruned_once() -> None:
    body = orjson.dumps(_session(10))
    rules = parse_rules("defaults:\n  max_images: 4\n  prune_batch: 2\n  keep_recent: 1\n")
    out = prune_request("https://api.openai.com/v1/responses", {}, body, rules)
    record = out.record
    assert record is not None and (record.images_before, record.images_after, record.pruned_for_count) == (10, 4, 6)
    sent = orjson.loads(out.body)
    shots = [item["output"] for item in sent["input"] if item.get("type") == "computer_call_output"]
    assert all(s["type"] == "computer_screenshot" for s in shots) and len(shots) == 10
    assert [s["image_url"] == orig["output"]["image_url"] for s, orig in zip(shots, orjson.loads(body)["input"][2::2], strict=True)] == [
        False
    ] * 6 + [True] * 4
    assert count_images(out.body) == 10  # the provider still sees ten screenshots: six of them cards
    # Image tokens by the computer-use model's tiles, the base64 not as text: a 64x48 screenshot costs 65 + 129.
    text_only = len(body) - sum(len(s["output"]["image_url"]) for s in orjson.loads(body)["input"][2::2])
    assert record.est_tokens_before == text_tokens(text_only) + 10 * (65 + 129)
    # Pruned once: the proxy's own output goes through unchanged.
    again = prune_request("https://api.openai.com/v1/responses", {}, out.body, rules)
    assert again.record is not None and again.record.images_before == 4 and again.body == out.body


def test_a_screenshot_over_the_byte_limit_is_shrunk_in_place() -> None:
    body = orjson.dumps(_session(1, (1600, 1000)))
    before = len(orjson.loads(body)["input"][2]["output"]["image_url"])
    rules = parse_rules(f"defaults:\n  max_image_bytes: {before // 3}\n")
    out = prune_request("https://api.openai.com/v1/responses", {}, body, rules)
    assert out.record is not None and out.record.shrunk == 1
    shot = orjson.loads(out.body)["input"][2]["output"]
    assert shot["type"] == "computer_screenshot" and len(shot["image_url"]) < before
    assert sniff_base64(shot["image_url"].split(",", 1)[1]).mime == shot["image_url"][5:].split(";", 1)[0]
