"""Per-image limits end to end: the Anthropic profiles a provider enforces per image fail a request
as sent (observe) and pass once trimflow shrinks the images (enforce), through a real mitmdump."""

from __future__ import annotations

import base64
import http.client
import io
from pathlib import Path

import orjson
import pytest
from PIL import Image

from trimflow.testing import FakeProvider, b64, image

from ..mitmdump import Mitmdump

pytestmark = pytest.mark.e2e

# rules/examples/anthropic-max.yaml's per-image limits, for any host (that file matches api.anthropic.com).
RULES = """\
defaults:
  max_images: 100
  max_body_bytes: 64MiB
  keep_recent: 1
  max_image_bytes: 5MiB
  max_image_side: 8000
  many_images_threshold: 20
  many_images_max_side: 2000
"""


def anthropic_body(images: list[bytes], mime: str) -> bytes:
    blocks = [{"type": "image", "source": {"type": "base64", "media_type": mime, "data": b64(shot)}} for shot in images]
    return orjson.dumps(
        {
            "model": "claude-sonnet-4-6",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": [*blocks, {"type": "text", "text": "What changed?"}]}],
        }
    )


def post(port: int, body: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.request("POST", "/v1/messages", body, {"content-type": "application/json", "x-api-key": "test-key"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def provider():
    with FakeProvider() as fake:
        yield fake


def run_through_proxy(tmp_path: Path, provider: FakeProvider, mode: str, profile: str, body: bytes) -> tuple[int, bytes]:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    options = {"trimflow_rules": str(rules), "trimflow_mode": mode, "trimflow_simulate": profile}
    with Mitmdump(tmp_path / mode, "--mode", f"reverse:{provider.url}", options=options) as proxy:
        return post(proxy.port, body)


def sent_images(provider: FakeProvider) -> list[tuple[int, int, int]]:
    """(base64 length, width, height) of each image the provider received, decoded with Pillow."""
    blocks = provider.received[-1].json()["messages"][0]["content"]
    out = []
    for block in blocks:
        if block["type"] == "image":
            data = block["source"]["data"]
            with Image.open(io.BytesIO(base64.b64decode(data))) as img:
                assert Image.MIME[img.format] == block["source"]["media_type"]
                out.append((len(data), *img.size))
    return out


def test_an_image_over_5_mb_fails_as_sent_and_passes_shrunk(tmp_path: Path, provider: FakeProvider) -> None:
    big = image(1500, 1100, "PNG", seed=41)  # noise: ~4.9 MB of PNG, ~6.6 MB of base64
    assert len(b64(big)) > 5 * 2**20
    body = anthropic_body([image(320, 200, "PNG", seed=42), big], "image/png")

    status, answer = run_through_proxy(tmp_path, provider, "observe", "anthropic-image-5mb", body)
    assert status == 400
    message = orjson.loads(answer)["error"]["message"]
    assert message.startswith("messages.0.content.1.image.source.base64: image exceeds 5 MB maximum:")

    before = len(provider.received)
    status, _ = run_through_proxy(tmp_path, provider, "enforce", "anthropic-image-5mb", body)
    assert status == 200 and len(provider.received) == before + 1
    images = sent_images(provider)
    assert len(images) == 2 and all(length <= 5 * 2**20 for length, _, _ in images)


def test_many_images_over_2000_px_fail_as_sent_and_pass_shrunk(tmp_path: Path, provider: FakeProvider) -> None:
    screens = [image(2500, 1400, "JPEG", seed=50 + i, noise=0.05) for i in range(25)]
    body = anthropic_body(screens, "image/jpeg")

    status, answer = run_through_proxy(tmp_path, provider, "observe", "anthropic-many-image-2000px", body)
    assert status == 400
    assert "exceed max allowed size for many-image requests: 2000 pixels" in orjson.loads(answer)["error"]["message"]

    status, _ = run_through_proxy(tmp_path, provider, "enforce", "anthropic-many-image-2000px", body)
    assert status == 200
    images = sent_images(provider)
    assert len(images) == 25 and all(max(w, h) <= 2000 for _, w, h in images)
