"""The user's commands, run as the user runs them: `scripts/run` (the proxy) and `scripts/prune` (offline)."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import orjson
import pytest

from trimflow._policy import count_pruned
from trimflow._rules_file import DEFAULT_RULES_PATH, load_rules
from trimflow.formats import FORMATS
from trimflow.testing import FakeProvider

from ..helpers import wait_for
from ..mitmdump import listening_port
from .helpers import ROOT, assert_pruned_upstream, image_payloads, post, session, shots, write_rules

pytestmark = pytest.mark.e2e


# --- scripts/run --------------------------------------------------------------------------------------------


@dataclass
class Running:
    process: subprocess.Popen[bytes]
    workdir: Path

    def log(self) -> str:
        return (self.workdir / "run.log").read_text(errors="replace")

    def port(self) -> int:
        """The port it listens on, once it does: given port 0, mitmdump says in its log which one it got."""

        def listening() -> int | None:
            assert self.process.poll() is None, self.log()
            return listening_port(self.log())

        return wait_for(listening, "scripts/run listening", 30)


@pytest.fixture(scope="module", autouse=True)
def run_script(tmp_path_factory: pytest.TempPathFactory, provider: FakeProvider) -> Iterator[Running]:
    """scripts/run, launched when this module starts so mitmdump boots while the scripts/prune tests run."""
    workdir = tmp_path_factory.mktemp("run")
    command = [
        str(ROOT / "scripts" / "run"),
        "--listen-port",
        "0",
        "--mode",
        f"reverse:{provider.url}",
        # Its own confdir: the test must not create a CA in the user's ~/.mitmproxy.
        "--set",
        f"confdir={workdir / 'confdir'}",
        "--set",
        f"trimflow_metrics={workdir / 'metrics.jsonl'}",
    ]
    with open(workdir / "run.log", "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workdir)
    yield Running(process, workdir)
    if process.poll() is None:
        process.kill()
        process.wait()


# --- scripts/prune ------------------------------------------------------------------------------------------

OPENAI_URL = "https://api.openai.com/v1/chat/completions"
GEMINI_URL = "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-pro:generateContent"


def prune(cwd: Path, *args: str, stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(ROOT / "scripts" / "prune"), *args], input=stdin, capture_output=True, cwd=cwd, timeout=60)


def last_record(result: subprocess.CompletedProcess[bytes]) -> dict:
    return json.loads(result.stderr.decode().strip().splitlines()[-1])


def test_prune_writes_the_pruned_body_and_the_record_from_any_directory(tmp_path: Path) -> None:
    images = shots(5, seed=32)
    result = prune(tmp_path, "--url", OPENAI_URL, "--max-images", "2", stdin=orjson.dumps(session("openai-chat", images)))
    assert result.returncode == 0, result.stderr
    assert image_payloads("openai-chat", orjson.loads(result.stdout)) == images[-2:]
    record = last_record(result)
    assert (record["format"], record["images_before"], record["images_after"]) == ("openai-chat", 5, 2)
    assert record["body_bytes_after"] == len(result.stdout)


@pytest.mark.parametrize(
    ("url", "body", "why"),
    [
        (OPENAI_URL, b"this is not json {", "json"),
        ("https://example.com/upload", b'{"hello": "world", "files": [1, 2]}', "no known llm format"),
    ],
    ids=["not-json", "unknown-url-non-llm-body"],
)
def test_prune_refuses_with_exit_2_and_one_line(tmp_path: Path, url: str, body: bytes, why: str) -> None:
    result = prune(tmp_path, "--url", url, stdin=body)
    assert result.returncode == 2
    assert result.stdout == b""
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and why in lines[0].lower(), lines


def test_prune_max_images_none_keeps_every_image(tmp_path: Path) -> None:
    images = shots(12, seed=33)
    result = prune(tmp_path, "--url", OPENAI_URL, "--max-images", "none", stdin=orjson.dumps(session("openai-chat", images)))
    assert result.returncode == 0, result.stderr
    assert image_payloads("openai-chat", orjson.loads(result.stdout)) == images
    assert last_record(result)["pruned"] == 0


def test_prune_max_body_bytes_takes_binary_sizes(tmp_path: Path) -> None:
    images = shots(4, seed=34, width=480, height=480)  # ~690 KB each, ~920 KB as base64: a 3.7 MB body
    body = orjson.dumps(session("anthropic", images))
    assert len(body) > 3 * 1024 * 1024
    result = prune(tmp_path, "--url", "https://api.anthropic.com/v1/messages", "--max-images", "none", "--max-body-bytes", "2MiB", stdin=body)
    assert result.returncode == 0, result.stderr
    record = last_record(result)
    assert len(result.stdout) == record["body_bytes_after"] <= 2 * 1024 * 1024
    assert record["pruned_for_body"] == record["pruned"] == 2
    assert image_payloads("anthropic", orjson.loads(result.stdout)) == images[-2:]


def test_prune_rejects_a_malformed_size(tmp_path: Path) -> None:
    result = prune(tmp_path, "--url", OPENAI_URL, "--max-body-bytes", "2 parsecs", stdin=b"{}")
    assert result.returncode == 2 and result.stdout == b""
    assert "--max-body-bytes" in result.stderr.decode()


# Twelve images: over every model's cap in the shipped rules (10 for Gemini, 8 for the rest), cut down to the rule's
# low-water mark (5 of 10, 3 of 8).
@pytest.mark.parametrize(("url", "wire_format"), [(GEMINI_URL, "gemini"), (OPENAI_URL, "openai-chat")])
def test_prune_without_flags_applies_the_default_rules(tmp_path: Path, url: str, wire_format: str) -> None:
    images = shots(12, seed=35)
    body = session(wire_format, images)
    path = urlsplit(url).path
    limits = load_rules(DEFAULT_RULES_PATH).limits_for(urlsplit(url).hostname or "", path, FORMATS[wire_format].model(body, path))
    kept = 12 - count_pruned(12, limits.at_low_water())
    assert limits.max_images is not None and kept < limits.max_images < 12
    assert kept == (5 if wire_format == "gemini" else 3)
    result = prune(tmp_path, "--url", url, stdin=orjson.dumps(body))
    assert result.returncode == 0, result.stderr
    assert image_payloads(wire_format, orjson.loads(result.stdout)) == images[-kept:]
    record = last_record(result)
    assert (record["images_after"], record["rule"]) == (kept, limits.rule)


def test_prune_uses_a_rules_file_and_names_the_line_of_a_bad_one(tmp_path: Path) -> None:
    images = shots(5, seed=36)
    rules = write_rules(tmp_path / "rules.yaml", 3)
    result = prune(tmp_path, "--url", OPENAI_URL, "--rules", "rules.yaml", stdin=orjson.dumps(session("openai-chat", images)))
    assert result.returncode == 0, result.stderr
    assert image_payloads("openai-chat", orjson.loads(result.stdout)) == images[-3:]

    rules.write_text("defaults:\n  max_images: many\n")
    result = prune(tmp_path, "--url", OPENAI_URL, "--rules", str(rules), stdin=orjson.dumps(session("openai-chat", images)))
    assert result.returncode == 2 and result.stdout == b""
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and f"{rules}:2:" in lines[0] and "max_images" in lines[0]


# --- scripts/fix --------------------------------------------------------------------------------------------


def test_fix_applies_ruffs_own_fixes_and_formatting_to_the_paths_given(tmp_path: Path) -> None:
    messy = tmp_path / "messy.py"
    messy.write_text("import os\nimport sys\nx = {'a':1}\nprint( sys.argv )\n")
    done = subprocess.run([str(ROOT / "scripts" / "fix"), str(messy)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert messy.read_text() == 'import sys\n\nx = {"a": 1}\nprint(sys.argv)\n'  # the unused import gone, formatted


# --- scripts/run, last: it had the whole module to boot ----------------------------------------------------


def test_run_serves_on_the_given_port_with_the_default_rules_and_stops_on_ctrl_c(run_script: Running, provider: FakeProvider) -> None:
    port = run_script.port()  # the port given, 0: the one the kernel picked, from its "listening at" line
    provider.clear()
    images = shots(10, seed=31)
    status, _ = post(port, "/v1/chat/completions", orjson.dumps(session("openai-chat", images)))
    assert status == 200
    # rules/default.yaml: a cap of 5 for gpt-4o, cut down to its low-water mark of 3.
    assert_pruned_upstream(provider, "openai-chat", images, 3)
    assert f"trimflow: rules from {ROOT / 'rules' / 'default.yaml'}" in run_script.log()

    run_script.process.send_signal(signal.SIGINT)
    assert run_script.process.wait(15) == 0
    record = json.loads((run_script.workdir / "metrics.jsonl").read_text().splitlines()[-1])
    assert (record["images_before"], record["images_after"], record["status"]) == (10, 3, 200)
