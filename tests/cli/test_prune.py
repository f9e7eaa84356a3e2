"""`python -m trimflow prune` (trimflow.cli._prune), called in-process: host from a Host header, limit flags, bad input."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import orjson
import pytest

from trimflow._policy import count_pruned
from trimflow._rules_file import DEFAULT_RULES_PATH, load_rules
from trimflow.cli._prune import main
from trimflow.formats import FORMATS, IMAGE
from trimflow.testing import image, session_body

SHOT = image(200, 120, "PNG", seed=11)
BODY = orjson.dumps(session_body("openai-chat", 5, SHOT, "image/png"))


def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[bytes], args: list[str], body: bytes = BODY):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(body)))
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def host_rules(tmp_path: Path) -> str:
    path = tmp_path / "rules.yaml"
    path.write_text("defaults:\n  max_images: 8\nrules:\n  - name: openai\n    match: {host: api.openai.com}\n    max_images: 2\n")
    return str(path)


def test_a_host_header_names_the_host_as_it_does_for_the_proxy(tmp_path, monkeypatch, capsys) -> None:
    # As in transparent mode: the URL names an address, the Host header the API.
    url = "https://203.0.113.5/v1/chat/completions"
    code, _, err = run(monkeypatch, capsys, ["--url", url, "--rules", host_rules(tmp_path), "--header", "Host: api.openai.com"])
    record = orjson.loads(err.strip().splitlines()[-1])
    assert code == 0 and (record["rule"], record["host"], record["images_after"]) == ("openai", "api.openai.com", 2)
    code, _, err = run(monkeypatch, capsys, ["--url", url, "--rules", host_rules(tmp_path)])
    record = orjson.loads(err.strip().splitlines()[-1])
    assert code == 0 and (record["rule"], record["host"], record["images_after"]) == ("defaults", "203.0.113.5", 5)


def test_the_shipped_rules_apply_without_a_rules_file(monkeypatch, capsys) -> None:
    body = orjson.dumps(session_body("openai-chat", 10, SHOT, "image/png"))
    code, out, err = run(monkeypatch, capsys, ["--url", "https://api.openai.com/v1/chat/completions"], body)
    record = orjson.loads(err.strip().splitlines()[-1])
    limits = load_rules(DEFAULT_RULES_PATH).limits_for("api.openai.com", "/v1/chat/completions", orjson.loads(body)["model"])
    assert code == 0 and record["rule"] == limits.rule and limits.max_images == 8
    # The cap broken, the cut moves: down to the low-water mark (3 of 8).
    assert (record["images_before"], record["images_after"]) == (10, 10 - count_pruned(10, limits.at_low_water()))
    assert limits.low_water is not None and record["images_after"] == 3
    assert orjson.loads(out)["model"] == orjson.loads(body)["model"]


def _one_turn(fmt: str, model: str, images: int) -> bytes:
    """A request of `images` distinct screenshots to `model`, as a conversation new to the proxy sends it."""
    body = session_body(fmt, images, SHOT, "image/png")
    if fmt == "gemini":
        return orjson.dumps(body)
    return orjson.dumps({**body, "model": model})


_GEMINI_URL = "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent"
_CARD = [
    # (format, model, url, cap, floor): the caps the shipped rules promise, and what a cut leaves at least.
    ("gemini", "gemini-2.5-flash", _GEMINI_URL, 10, 5),
    ("openai-chat", "gpt-4o", "https://api.openai.com/v1/chat/completions", 8, 3),
    ("openai-chat", "gpt-4.1-mini", "https://api.openai.com/v1/chat/completions", 8, 3),
    ("anthropic", "claude-sonnet-4-6", "https://api.anthropic.com/v1/messages", 8, 3),
]


@pytest.mark.parametrize(("fmt", "model", "url", "cap", "floor"), _CARD)
def test_the_shipped_rules_send_a_fresh_conversation_at_its_cap_untouched(monkeypatch, capsys, fmt, model, url, cap, floor) -> None:
    for images in range(1, cap + 1):
        body = _one_turn(fmt, model, images)
        code, out, err = run(monkeypatch, capsys, ["--url", url], body)
        record = orjson.loads(err.strip().splitlines()[-1])
        assert code == 0 and (record["images_before"], record["images_after"]) == (images, images), (model, images)
        assert out.encode() == body, f"{model}, {images} images: forwarded byte for byte"


@pytest.mark.parametrize(("fmt", "model", "url", "cap", "floor"), _CARD)
def test_the_shipped_rules_cut_a_request_over_its_cap_to_between_floor_and_cap(monkeypatch, capsys, fmt, model, url, cap, floor) -> None:
    body = _one_turn(fmt, model, cap + 2)
    code, out, err = run(monkeypatch, capsys, ["--url", url], body)
    record = orjson.loads(err.strip().splitlines()[-1])
    assert code == 0 and floor <= record["images_after"] <= cap, (model, record["images_after"])
    shots = [m.data for m in FORMATS[fmt].find_media(orjson.loads(body)) if m.kind == IMAGE]
    sent = [m.data for m in FORMATS[fmt].find_media(orjson.loads(out)) if m.kind == IMAGE]
    assert sent == shots[len(shots) - len(sent) :], "the newest images are the ones kept"


def test_a_body_that_is_not_json_exits_2_with_one_line_and_no_output(monkeypatch, capsys) -> None:
    code, out, err = run(monkeypatch, capsys, ["--url", "https://api.openai.com/v1/chat/completions"], b"{not json")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and err.startswith("trimflow prune: ")


def test_max_images_keeps_exactly_that_many_unless_a_batch_is_given(monkeypatch, capsys) -> None:
    """The shipped rules cut to their low-water mark (3 of gpt-4o's 8); a cap given on the command line is for this one
    request: that many, or in the batches given with it."""
    body = orjson.dumps(session_body("openai-chat", 10, SHOT, "image/png"))
    url = ["--url", "https://api.openai.com/v1/chat/completions"]
    for flags, kept in (([], 3), (["--max-images", "5"], 5), (["--max-images", "8"], 8), (["--max-images", "5", "--prune-batch", "3"], 4)):
        code, _, err = run(monkeypatch, capsys, [*url, *flags], body)
        assert code == 0 and orjson.loads(err.strip().splitlines()[-1])["images_after"] == kept, flags
    code, out, err = run(monkeypatch, capsys, [*url, "--prune-batch", "0"], body)
    assert code == 2 and not out and "--prune-batch takes a whole number >= 1" in err
