"""The Python agents behind trimflow: Hermes Agent and aider, at the versions scripts/setup pins (each in a venv of
its own in .tools/venvs/), each run as a user runs it, `scripts/run -- AGENT` (python -m trimflow run -- AGENT):
forward mode, the agent's HTTPS_PROXY and CA variables set by the launcher, the fake provider serving HTTPS as
localhost, in a network namespace with loopback only (tests/e2e/agent_session.py).

Hermes Agent looks at one new screenshot a turn with its own image tool (`vision_analyze`, which attaches the image
to the conversation when the model is declared vision-capable). aider has no image tool: the user adds one
screenshot a turn (`/add screen-NN.png`, typed on its standard input) and asks about it, and aider sends every image
added so far again on each request, in the order of a set of their paths, which changes as it grows. The test picks
the hash seed that puts the screenshot just added first on the first request over the cap, so that keeping images
by position would cut it there: trimflow as it was before it aged images by arrival fails at that request.

For each: the agent exits 0 with the final answer; no request the provider gets holds more images than the shipped
rules' cap for that host and model, while the agent sent more (trimflow's records of each request as received, which
must count every screenshot the agent had); the newest screenshot arrives byte for byte on every request, and an
image cut once never comes back; the launcher's summary is what the provider received.

They skip without the venvs (scripts/setup --agent-clis) or without `unshare -n` (root); TRIMFLOW_REQUIRE_AGENT_CLIS=1,
which .ci/run sets, makes either a failure.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .agent_session import (
    AGENT_VENVS,
    FINAL,
    FORWARD_LAUNCHER_ARGS,
    PROMPT,
    ROOT,
    VENV_COMMANDS,
    assert_one_conversation,
    assert_summary_is_what_the_provider_received,
    launcher_records,
    need_venv,
    python_pins,
    run_session,
    shipped_cap,
    summary_figures,
    turns,
)

pytestmark = pytest.mark.e2e

MODEL = "gpt-4o"
CHAT_PATH = "/v1/chat/completions"


def records(result: dict[str, Any]) -> list[dict[str, Any]]:
    """trimflow's metrics records of the run's LLM requests, in order (the file the summary names)."""
    return [r for r in launcher_records(result["stderr"]) if r.get("format") is not None]


def assert_capped(result: dict[str, Any], newest: list[str | None], sent: list[int]) -> None:
    """Exit 0 with the final answer; request i carried the screenshot `newest[i]` (None: no image) as the file holds
    it, and the agent sent `sent[i]` images on it, trimflow's records say; no request held more than the cap, and the
    agent sent more; an image cut once never came back."""
    output = f"stdout:\n{result['stdout'][-2000:]}\nstderr:\n{result['stderr'][-3000:]}"
    assert result["returncode"] == 0, output
    assert FINAL in result["stdout"], output
    llm = turns(result)
    assert len(llm) == len(newest), [(r["method"], r["path"], len(r["images"])) for r in llm]
    limit = shipped_cap(MODEL, CHAT_PATH)
    went = [r["images"] for r in llm]
    assert max(len(images) for images in went) <= limit
    for i, (images, shot) in enumerate(zip(went, newest, strict=True)):
        assert shot in images if shot is not None else not images, f"request {i + 1}: the newest screenshot did not arrive as sent"
    cut: set[str] = set()
    for i, images in enumerate(went):
        assert not cut & set(images), f"request {i + 1}: an image cut before came back"
        cut |= {shot for earlier in went[:i] for shot in earlier} - set(images)
    assert cut, "nothing was cut"
    recorded = records(result)
    assert [r["images_before"] for r in recorded] == sent
    assert [r["images_after"] for r in recorded] == [len(images) for images in went]
    assert max(sent) > limit  # the agent sent more than the cap: without trimflow the provider would hold them all


def summary_totals(stderr: str, agent: str, requests: int) -> tuple[int, int]:
    """(images sent, pruned) over the run, from the launcher's summary: its `all:` line when it lists several
    conversations, else its one conversation line; and the run's line counts `requests` LLM requests."""
    head = re.search(rf"^trimflow: {agent} exited 0; {requests} LLM requests in (\d+) conversations? through trimflow$", stderr, re.MULTILINE)
    assert head is not None, stderr[-3000:]
    total = [line.replace("all:", "conversation", 1) for line in stderr.splitlines() if line.startswith("trimflow:   all: ")]
    sent, pruned, _ = summary_figures("\n".join(total) if int(head.group(1)) > 1 else stderr)
    return sent, pruned


# --- Hermes Agent ------------------------------------------------------------------------------------------------

# A custom OpenAI-compatible endpoint; `supports_vision` makes vision_analyze attach the image to the conversation
# (else it asks an auxiliary model for a description); `context_length` spares it a lookup on openrouter.ai. No
# update check runs in one-shot mode (-z); HERMES_DISABLE_LAZY_INSTALLS keeps it from pip-installing at run time.
HERMES_CONFIG = f"""model:
  provider: custom
  base_url: {{provider}}/v1
  api_key: sk-test-hermes-agent
  default: {MODEL}
  supports_vision: true
  context_length: 128000
"""
HERMES_ENV = {"HERMES_HOME": "{work}/hermes", "HERMES_DISABLE_LAZY_INSTALLS": "1"}


def test_hermes_agent_through_the_launcher(tmp_path: Path) -> None:
    need_venv("hermes")
    shots = shipped_cap(MODEL, CHAT_PATH) + 3
    result = run_session(
        tmp_path,
        shots=shots,
        tls=True,
        venv="hermes",
        launcher_args=FORWARD_LAUNCHER_ARGS,
        command=["hermes", "-z", PROMPT],
        env=HERMES_ENV,
        files={"hermes/config.yaml": HERMES_CONFIG},
    )
    assert result["tool_calls"] == shots
    # The first request has no image; each one after carries the screenshot its tool call read last, at the end.
    assert_capped(result, [None, *result["shots"]], list(range(shots + 1)))
    assert all(r["images"][-1] == shot for r, shot in zip(turns(result)[1:], result["shots"], strict=True))
    assert_summary_is_what_the_provider_received(result, "hermes")


# --- aider ------------------------------------------------------------------------------------------------------

AIDER_ENV = {"OPENAI_API_BASE": "{provider}/v1", "OPENAI_API_KEY": "sk-test-aider", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
# No git repository, no analytics or update check, plain line input (the user's lines come on standard input).
AIDER_ARGS = ["--model", MODEL, "--no-git", "--no-analytics", "--no-check-update", "--no-show-release-notes", "--no-show-model-warnings"]
AIDER_INPUT = ["--no-fancy-input", "--no-pretty", "--yes-always"]


# aider's images go in the order of a set of their paths, which the hash seed decides; this one's order, growing
# one path a turn, as aider's own Python iterates it.
SET_ORDER = "import sys\nadded = set()\nfor path in sys.argv[1:]:\n    added.add(path)\nprint(*added, sep='\\n')"


def seed_putting_the_newest_first(paths: list[str]) -> int:
    """A PYTHONHASHSEED under which aider, holding `paths`, sends the last of them first: where trimflow keeping
    images by position would cut it first."""
    python = AGENT_VENVS / "aider" / "bin" / "python"
    for seed in range(500):
        env = {"PYTHONHASHSEED": str(seed), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        order = subprocess.run([python, "-c", SET_ORDER, *paths], env=env, capture_output=True, text=True, check=True).stdout.split("\n")
        if order[0] == paths[-1]:
            return seed
    raise AssertionError("no hash seed in 500 puts the newest path first")


def test_aider_through_the_launcher_keeps_the_screenshot_just_added(tmp_path: Path) -> None:
    """aider re-sends every added image in an order that changes as they grow: trimflow ages each by when it first
    came. The hash seed is chosen so that on the first request over the cap the screenshot just added comes first,
    where the oldest by position would be."""
    need_venv("aider")
    shots = shipped_cap(MODEL, CHAT_PATH) + 3
    names = [f"screen-{i:02d}.png" for i in range(1, shots + 1)]
    over = [str((tmp_path / "work" / name).resolve()) for name in names[: shipped_cap(MODEL, CHAT_PATH) + 1]]
    seed = seed_putting_the_newest_first(over)
    typed = "".join(f"/add {name}\nWhat changed in {name}?\n" for name in names)
    result = run_session(
        tmp_path,
        shots=shots,
        tls=True,
        venv="aider",
        added_images=True,
        input=typed,
        launcher_args=FORWARD_LAUNCHER_ARGS,
        command=["aider", *AIDER_ARGS, *AIDER_INPUT],
        env={**AIDER_ENV, "PYTHONHASHSEED": str(seed)},
    )
    assert result["answers"] == shots
    assert_capped(result, result["shots"], list(range(1, shots + 1)))
    assert (
        turns(result)[shipped_cap(MODEL, CHAT_PATH)]["images"][0] == result["shots"][shipped_cap(MODEL, CHAT_PATH)]
    )  # sent first, as the seed had it, and kept
    # Each request rewrites aider's early history (the time in its system prompt, its images reshuffled, one more
    # among them): still one conversation, numbered 1..N in the records and the exit summary.
    assert_one_conversation(records(result), result["stderr"], "aider")
    sent, pruned = summary_totals(result["stderr"], "aider", shots)
    assert sent == sum(len(r["images"]) for r in turns(result))
    assert pruned == sum(r["images_before"] - r["images_after"] for r in records(result)) > 0


def test_the_versions_docs_agents_md_names_are_the_ones_scripts_setup_pins() -> None:
    docs = (ROOT / "docs" / "agents.md").read_text()
    for requirement in python_pins().values():
        package, version = requirement.split("==")
        assert f"`{package}` {version}" in docs or f"`{package}=={version}`" in docs, requirement
    assert set(python_pins()) == set(VENV_COMMANDS)
