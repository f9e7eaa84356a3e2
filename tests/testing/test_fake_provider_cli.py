"""trimflow.testing._fake_provider_cli: `python -m trimflow fake-provider` listens on loopback only and logs one line per
request with sizes and counts, never a key, the query, the prompt or the image."""

from __future__ import annotations

import base64
import io
import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest
from PIL import Image

from trimflow.testing import FakeProvider
from trimflow.testing._fake_provider_cli import main

_PNG = io.BytesIO()
Image.effect_noise((64, 64), 64).convert("RGB").save(_PNG, "PNG")
PNG_B64 = base64.b64encode(_PNG.getvalue()).decode()
DATA_URL = f"data:image/png;base64,{PNG_B64}"


def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str, bytes]:
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.headers["content-type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["content-type"], e.read()


def test_refuses_non_loopback() -> None:
    with pytest.raises(ValueError, match="loopback"):
        FakeProvider(host="0.0.0.0")
    assert main(["--host", "0.0.0.0", "--port", "0"]) == 2


def test_cli_logs_sizes_but_no_secrets() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "trimflow", "fake-provider", "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = proc.stderr.readline()
        assert first.startswith("fake-provider listening on http://127.0.0.1:"), first
        url = first.split(" on ", 1)[1].strip()
        prompt = "SECRET-PROMPT-TEXT what is in this image?"
        body = json.dumps(
            {
                "model": "gpt-4o",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": prompt},
                            {"type": "image_url", "image_url": {"url": DATA_URL}},
                        ],
                    }
                ],
            }
        ).encode()
        headers = {"authorization": "Bearer sk-SECRETKEY123", "x-api-key": "sk-ant-SECRETKEY456"}
        status, _, _ = post(url + "/v1/chat/completions?key=QUERYSECRET789", body, headers)
        assert status == 200
    finally:
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=10)
    assert proc.returncode == 0
    log = first + rest
    line = next(line for line in log.splitlines() if "/v1/chat/completions" in line)
    assert "POST /v1/chat/completions 200 openai-chat" in line
    assert f"body={len(body)}B" in line and "images=1" in line
    for secret in ("SECRETKEY", "QUERYSECRET", "SECRET-PROMPT", PNG_B64[100:140], "Bearer", "key="):
        assert secret not in log, secret
