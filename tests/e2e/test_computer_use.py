"""OpenAI computer use through a real mitmdump: the openai SDK's Responses client sends a computer-use session whose
screenshots come back as `computer_call_output` items; trimflow counts, caps, shrinks and estimates them like any
other image, JSON and SSE alike."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator

import openai
import pytest
from PIL import Image

from trimflow.formats import FORMATS
from trimflow.testing import REPLY_TEXT, FakeProvider, b64, count_images

from .. import shrink_bench
from .helpers import OPENAI_KEY, Proxy, direct_http_client, replace_text, start_proxy, stop_all

pytestmark = pytest.mark.e2e

RESPONSES = FORMATS["openai-responses"]
LIMIT = 200 * 1024  # of base64 per image: the 2x screenshot is over it as PNG, well under it as lossless WebP


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, provider: FakeProvider) -> Iterator[Proxy]:
    workdir = tmp_path_factory.mktemp("computer-use")
    # The byte limit alone (`native_size` off): the size the model sees is tested in test_clicks.
    rules = replace_text(workdir / "rules.yaml", f"defaults:\n  max_images: 3\n  keep_recent: 1\n  max_image_bytes: {LIMIT}\n  native_size: false\n")
    started = start_proxy(workdir, "--mode", f"reverse:{provider.url}", rules=rules)
    yield started
    stop_all(started.mitm)


@pytest.fixture(scope="module")
def screens() -> list[bytes]:
    """Four 1x screens of the session, then the current one from a 2x display."""
    return [shrink_bench.screenshot(kind, 1, seed=n).png() for n, kind in enumerate(("ui", "code", "ui", "code"))] + [
        shrink_bench.screenshot("ui", 2, seed=9).png()
    ]


def session(screens: list[bytes]) -> list[dict]:
    items: list[dict] = [{"role": "user", "content": [{"type": "input_text", "text": "Open the network settings."}]}]
    for n, png in enumerate(screens):
        items.append(
            {
                "type": "computer_call",
                "id": f"cu_{n}",
                "call_id": f"call_{n}",
                "action": {"type": "screenshot"},
                "pending_safety_checks": [],
                "status": "completed",
            }
        )
        items.append(
            {
                "type": "computer_call_output",
                "call_id": f"call_{n}",
                "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64," + b64(png)},
            }
        )
    return items


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_computer_use_screenshots_are_capped_and_shrunk_at_full_size(proxy: Proxy, fresh: FakeProvider, screens: list[bytes], stream: bool) -> None:
    tools = [{"type": "computer_use_preview", "display_width": 2880, "display_height": 1800, "environment": "mac"}]
    with openai.OpenAI(api_key=OPENAI_KEY, base_url=f"{proxy.url}/v1", http_client=direct_http_client(), max_retries=0, timeout=60) as client:
        with proxy.expect_records(1) as records:
            args = {"model": "computer-use-preview", "tools": tools, "input": session(screens), "truncation": "auto"}
            if stream:
                events = list(client.responses.create(**args, stream=True))
                assert events[-1].type == "response.completed"
                text = events[-1].response.output_text
            else:
                text = client.responses.create(**args).output_text
    assert text == REPLY_TEXT
    [received] = fresh.received
    sent = received.json()
    outputs = [item["output"] for item in sent["input"] if item.get("type") == "computer_call_output"]
    assert len(outputs) == 5 and all(o["type"] == "computer_screenshot" for o in outputs)
    # The provider sees five screenshots: the two oldest are cards showing their placeholders, three are images.
    assert count_images(received.body) == 5
    assert [m.path[1] for m in RESPONSES.find_media(sent)] == [6, 8, 10]
    for card in outputs[:2]:
        with Image.open(io.BytesIO(base64.b64decode(card["image_url"].split(",", 1)[1]))) as im:
            assert im.size == (720, 20)
    # The newest, over the limit as PNG, goes at its full size as lossless WebP: every pixel kept.
    newest = outputs[-1]["image_url"]
    assert newest.startswith("data:image/webp;base64,") and len(newest) - len("data:image/webp;base64,") <= LIMIT
    with Image.open(io.BytesIO(base64.b64decode(newest.split(",", 1)[1]))) as im:
        assert im.size == (2880, 1800)
        assert im.convert("RGB").tobytes() == Image.open(io.BytesIO(screens[-1])).convert("RGB").tobytes()
    assert outputs[2:4] == [{"type": "computer_screenshot", "image_url": "data:image/png;base64," + b64(png)} for png in screens[2:4]]
    [record] = records
    assert (record["images_before"], record["images_after"], record["pruned_for_count"], record["shrunk"], record["images_rescaled"]) == (
        5,
        3,
        2,
        1,
        0,
    )
    # Image tokens by the computer-use model's tiles, the base64 never counted as text.
    assert record["est_tokens_before"] < 10_000 and record["est_tokens_after"] < record["est_tokens_before"]
    assert record["status"] == 200 and record["usage_input_tokens"] is not None
