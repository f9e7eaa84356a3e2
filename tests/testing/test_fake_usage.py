"""trimflow.testing._fake_usage: the fake provider's token estimate, from the body alone: long base64 runs (either
alphabet) count as images, not text; each image marker of every format counts once."""

from __future__ import annotations

import base64
import math

import orjson

from trimflow.testing._fake_usage import IMAGE_TOKENS, REPLY_TEXT, base64_bytes, count_images, estimate_usage

PAYLOAD = base64.b64encode(bytes(range(256)) * 4).decode()  # 1,368 characters


def test_long_base64_runs_are_image_data_in_either_alphabet() -> None:
    assert base64_bytes(PAYLOAD.encode()) == len(PAYLOAD)
    url_safe = PAYLOAD.replace("+", "-").replace("/", "_")
    assert base64_bytes(b'{"data":"' + url_safe.encode() + b'"}') == len(url_safe)
    assert base64_bytes(b"x" * 255) == 0  # a short run is text


def test_the_estimate_counts_text_by_bytes_and_each_image_at_a_fixed_price() -> None:
    body = orjson.dumps(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "image", "source": {"data": PAYLOAD}}]}]}
    )
    usage = estimate_usage(body)
    assert count_images(body) == usage.images == 1
    assert usage.input_tokens == math.ceil((len(body) - len(PAYLOAD)) / 4) + IMAGE_TOKENS
    assert usage.output_tokens == math.ceil(len(REPLY_TEXT) / 4) and usage.total_tokens == usage.input_tokens + usage.output_tokens
