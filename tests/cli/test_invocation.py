"""trimflow.cli._invocation: the launcher's command line, `run [OPTIONS] -- COMMAND`: what goes to mitmdump, what the
launcher reads itself, and what it refuses in one line."""

from __future__ import annotations

import pytest

from trimflow.cli._invocation import parse
from trimflow.cli._launch_error import LaunchError


def test_options_before_the_double_dash_go_to_mitmdump_and_the_rest_is_the_command() -> None:
    invocation = parse(["--set", "trimflow_mode=observe", "-q", "--", "claude", "-p", "hi", "--", "x"])
    assert invocation.command == ["claude", "-p", "hi", "--", "x"]
    assert invocation.mitmdump_args == ["--set", "trimflow_mode=observe", "-q"]
    assert (invocation.agent, invocation.port, invocation.metrics) == (None, None, None)


@pytest.mark.parametrize(
    ("options", "port"),
    [
        (["-p", "9000"], 9000),
        (["-p9001"], 9001),
        (["--listen-port=9002"], 9002),
        (["--listen-port", "9003"], 9003),
        (["--set", "listen_port=9004"], 9004),
        (["--set=listen_port=9005"], 9005),
    ],
)
def test_a_listen_port_given_in_any_of_mitmdumps_forms_is_the_port(options: list[str], port: int) -> None:
    invocation = parse([*options, "--", "claude"])
    assert invocation.port == port
    assert invocation.mitmdump_args  # still handed on: mitmdump reads it as it always does


def test_the_launchers_own_options_are_read_and_kept_from_mitmdump() -> None:
    invocation = parse(["--agent", "proxy", "--set", "trimflow_metrics=m.jsonl", "--set", "confdir=/c", "--", "python", "agent.py"])
    assert (invocation.agent, invocation.metrics, invocation.confdir) == ("proxy", "m.jsonl", "/c")
    assert "--agent" not in invocation.mitmdump_args and "proxy" not in invocation.mitmdump_args


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--"], "nothing to run after --"),
        (["--mode", "reverse:https://api.openai.com", "--", "codex"], "leave --mode out"),
        (["-mregular", "--", "codex"], "leave --mode out"),
        (["--agent", "cursor", "--", "cursor"], "--agent takes one of claude, codex, gemini, opencode, .*, proxy, not 'cursor'"),
        (["-p", "eighty", "--", "claude"], "the listen port must be a number, not 'eighty'"),
    ],
)
def test_what_the_launcher_decides_itself_is_refused_in_one_line(args: list[str], message: str) -> None:
    with pytest.raises(LaunchError, match=message) as caught:
        parse(args)
    assert "\n" not in str(caught.value) and caught.value.status == 2
