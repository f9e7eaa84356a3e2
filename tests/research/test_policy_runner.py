"""The policy runner: reference sessions through the engine under each policy, billed by the prompt cache model."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from .cache_sessions import REFERENCE_SESSIONS
from .policy_runner import POLICIES, PolicyResult, main, run_policy

ROOT = Path(__file__).resolve().parents[2]
POLICY = {p.name: p for p in POLICIES}
SESSION = {s.name: s for s in REFERENCE_SESSIONS}


@pytest.fixture(scope="module")
def shipped() -> dict[str, PolicyResult]:
    return {s.name: run_policy(s, POLICY["shipped defaults"]) for s in REFERENCE_SESSIONS}


def test_the_shipped_rules_never_breach_a_cap(shipped: dict[str, PolicyResult]) -> None:
    for name, result in shipped.items():
        assert result.requests == SESSION[name].length
        assert result.breaches == {}, name


def test_every_turn_adds_up(shipped: dict[str, PolicyResult]) -> None:
    for result in shipped.values():
        for turn in result.turns:
            u = turn.usage
            assert u.cache_read_tokens + u.cache_write_tokens + u.uncached_tokens == u.prompt_tokens
            assert min(u.cache_read_tokens, u.cache_write_tokens, u.uncached_tokens) >= 0
        assert result.cache_read_tokens + result.cache_write_tokens + result.uncached_tokens == result.input_tokens
        assert result.images_sent == sum(t.images for t in result.turns)


def test_what_pruning_costs_on_the_computer_use_session() -> None:
    session = SESSION["computer-use"]
    none, rolling, batch = (run_policy(session, POLICY[name]) for name in ("no pruning", "rolling (batch 1)", "batch 6"))
    # Without pruning the 9th screenshot on breaks a gateway's cap of 8, and the prefix never breaks.
    assert none.breaches == {"generic-8": 52} and none.broken_turns == 0 and none.images_sent == sum(range(1, 61))
    # Rolling moves the cut every turn from the 9th: nearly every turn rewrites the history after it.
    assert rolling.broken_turns >= 45 and rolling.cache_write_tokens > 3 * batch.cache_write_tokens
    assert rolling.cost is not None and none.cost is not None and batch.cost is not None
    assert rolling.cost > none.cost > batch.cost
    assert all(t.images <= 8 for t in rolling.turns + batch.turns)


def test_the_shipped_rules_meet_the_cache_targets_on_the_computer_use_session(shipped: dict[str, PolicyResult]) -> None:
    """Against rolling keep-8 and no pruning at all: at most a third of rolling's cache writes, a cost no higher
    than the cheaper of the two, and the cached prefix broken on at most one turn in six."""
    session = SESSION["computer-use"]
    rolling, none, ours = run_policy(session, POLICY["rolling (batch 1)"]), run_policy(session, POLICY["no pruning"]), shipped["computer-use"]
    assert 3 * ours.cache_write_tokens <= rolling.cache_write_tokens
    assert ours.cost is not None and rolling.cost is not None and none.cost is not None
    assert ours.cost <= min(rolling.cost, none.cost)
    assert 6 * ours.broken_turns <= ours.requests


def test_the_command_prints_one_table_per_session(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--policies", "--session", "chat", "--policy", "no pruning", "--policy", "batch 6"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("chat (gpt-4o):")
    header = next(line for line in out.splitlines() if line.startswith("| policy"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "policy",
        "requests",
        "images sent",
        "input tokens",
        "cache-write",
        "cache-read",
        "cost",
        "floor",
        "x optimum",
        "x optimum, by length",
        "broken-prefix turns",
        "limits breached",
    ]
    # Batches of 6 send 3 images after a cut and cost more than the cheapest schedule keeping as many; the
    # line under the table gives the optimum at each floor (no pruning never cuts: held to the cap of 8).
    batch = next(line for line in out.splitlines() if line.startswith("| batch 6 "))
    cells = [c.strip() for c in batch.strip("|").split("|")]
    assert cells[7] == "3" and float(cells[8]) >= 1.0 and float(cells[9]) >= 1.0
    assert "Optimum under a cap of 8 images, by floor" in out and "a cut): floor 3: $" in out and "; floor 8: $" in out
    assert "| no pruning " in out and "| batch 6 " in out and "generic-8 x13" in out
    assert main(["--policies", "--session", "chat", "--policy", "batch 6", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["session"] == "chat" and row["policy"] == "batch 6" and row["requests"] == 15
    assert row["cache_read_tokens"] + row["cache_write_tokens"] + row["uncached_tokens"] == row["input_tokens"]
    assert row["optimum_floor"] == 3 and 0 < row["optimum_cost"] <= row["cost_usd"] and row["turns_over_cap"] == 0
    assert row["cost_vs_optimum"] == pytest.approx(row["cost_usd"] / row["optimum_cost"], rel=0.01)


def test_scripts_replay_hands_policies_to_the_runner_beside_the_bench() -> None:
    done = subprocess.run(
        [str(ROOT / "scripts" / "replay"), "--policies", "--session", "gemini", "--policy", "batch 8"], capture_output=True, timeout=600
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert done.stdout.decode().startswith("gemini (gemini-2.5-flash):")


def test_the_packages_replay_says_where_the_policies_run(capsys: pytest.CaptureFixture[str]) -> None:
    """The wheel ships no reference sessions: `python -m trimflow replay --policies` names the command that has them."""
    from trimflow.testing._replay import main as replay_main

    assert replay_main(["--policies", "--session", "gemini"]) == 2
    assert capsys.readouterr().err == "replay: --policies runs from a source checkout: scripts/replay --policies (docs/caching.md)\n"


def test_two_instances_behind_round_robin_cut_as_one_under_the_shipped_rules() -> None:
    """Each instance sees every other turn. The shipped rules' cold cut needs each conversation's last turn: sharing
    it (a file of last turns, as instances on one host do by default) the pair forwards what one instance forwards,
    turn by turn, and is billed the same; each with its own memory only, the two cut differently, the cached prefix
    breaks, and the pair costs more. The request-only example needs no memory: the pair cuts as one either way."""
    for name in ("idle", "chat", "claude-code"):
        one, two = (run_policy(SESSION[name], POLICY["shipped defaults"], instances=n) for n in (1, 2))
        assert [(t.images, t.body_bytes, t.usage) for t in two.turns] == [(t.images, t.body_bytes, t.usage) for t in one.turns], name
        assert one.cost is not None and two.cost == one.cost
    one, apart = (run_policy(SESSION["idle"], POLICY["shipped defaults"], instances=n, shared=False) for n in (1, 2))
    assert one.cost is not None and apart.cost is not None
    assert apart.cost > 1.2 * one.cost and apart.broken_turns > one.broken_turns
    one, apart = (run_policy(SESSION["idle"], POLICY["request-only example"], instances=n, shared=False) for n in (1, 2))
    assert [(t.images, t.body_bytes, t.usage) for t in apart.turns] == [(t.images, t.body_bytes, t.usage) for t in one.turns]
    with pytest.raises(ValueError, match="instances must be at least 1"):
        run_policy(SESSION["chat"], POLICY["shipped defaults"], instances=0)
