"""trimflow.cli._launch without processes: the command line (`run [OPTIONS] -- COMMAND`), each agent's setup (mode,
environment, command line; the user's upstream stays the upstream, no file of theirs is edited), and the summary
read back from a metrics JSONL. The processes (exit status, signals, ports, the real CLIs) are in tests/e2e."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import stat
import subprocess
import tomllib
from pathlib import Path

import orjson
import pytest
import yaml

from trimflow import load_rules, prune_request
from trimflow.cli._launch import (
    CA_VARIABLES,
    LAUNCHER_FILE,
    LaunchError,
    Setup,
    agent_of,
    ca_bundle,
    clean_stale_runs,
    codex_overrides,
    finish_run_dir,
    mitmdump_confdir,
    new_run_dir,
    parse,
    private_folder,
    setup_for,
    summary,
    without_option,
)
from trimflow._rules import DEFAULT_RULES_PATH
from trimflow.testing import PATHS, image, session_body

LISTEN = "http://127.0.0.1:41234"


# --- the command line ----------------------------------------------------------------------------------------


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
        (["--agent", "cursor", "--", "cursor"], "--agent takes one of claude, codex, gemini, proxy, not 'cursor'"),
        (["-p", "eighty", "--", "claude"], "the listen port must be a number, not 'eighty'"),
    ],
)
def test_what_the_launcher_decides_itself_is_refused_in_one_line(args: list[str], message: str) -> None:
    with pytest.raises(LaunchError, match=message) as caught:
        parse(args)
    assert "\n" not in str(caught.value) and caught.value.status == 2


@pytest.mark.parametrize(
    ("command", "chosen", "agent"),
    [
        (["claude", "-p", "hi"], None, "claude"),
        (["/opt/tools/node_modules/.bin/codex", "exec"], None, "codex"),
        (["gemini.js"], None, "gemini"),
        (["python", "agent.py"], None, "proxy"),
        (["proxy"], None, "proxy"),
        (["./my-claude-wrapper"], "claude", "claude"),
    ],
)
def test_the_agent_is_named_by_the_command_unless_chosen(command: list[str], chosen: str | None, agent: str) -> None:
    assert agent_of(command, chosen) == agent


# --- Claude Code ---------------------------------------------------------------------------------------------


def test_claude_goes_through_reverse_mode_to_anthropic(tmp_path: Path) -> None:
    setup = setup_for("claude", ["claude", "-p", "hi"], {}, LISTEN, tmp_path)
    assert (setup.mode, setup.env, setup.command) == ("reverse:https://api.anthropic.com", {"ANTHROPIC_BASE_URL": LISTEN}, ["claude", "-p", "hi"])
    assert not setup.ca_bundle and not setup.options


def test_claudes_own_base_url_stays_the_upstream_with_its_path(tmp_path: Path) -> None:
    env = {"ANTHROPIC_BASE_URL": "https://gateway.example/anthropic/"}
    setup = setup_for("claude", ["claude"], env, LISTEN, tmp_path)
    assert setup.mode == "reverse:https://gateway.example"
    assert setup.env == {"ANTHROPIC_BASE_URL": f"{LISTEN}/anthropic"}


def test_a_base_url_that_is_not_http_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match=r"'unix:/run/anthropic\.sock' is not an http"):
        setup_for("claude", ["claude"], {"ANTHROPIC_BASE_URL": "unix:/run/anthropic.sock"}, LISTEN, tmp_path)


# --- Codex ---------------------------------------------------------------------------------------------------


def config_values(command: list[str]) -> dict[str, object]:
    """The -c overrides as Codex reads them: each value as TOML."""
    return {key: tomllib.loads(f"v = {raw}")["v"] for key, raw in codex_overrides(command).items()}


def test_codex_gets_a_responses_provider_over_http_and_the_websocket_refused(tmp_path: Path) -> None:
    command = ["codex", "exec", "--skip-git-repo-check", "--", "look"]
    setup = setup_for("codex", command, {"OPENAI_API_KEY": "sk-x"}, LISTEN, tmp_path, home=tmp_path)
    assert setup.mode == "reverse:https://api.openai.com"
    assert setup.command[0] == "codex" and setup.command[-4:] == command[1:]  # the overrides go before the subcommand
    values = config_values(setup.command)
    assert values["model_provider"] == "trimflow"
    assert values["model_providers.trimflow"] == {
        "name": "trimflow",
        "base_url": f"{LISTEN}/v1",
        "wire_api": "responses",
        "env_key": "OPENAI_API_KEY",
        "supports_websockets": False,
    }
    assert setup.options == {"trimflow_websocket": "refuse"}


@pytest.mark.parametrize(
    ("config", "env", "args", "upstream"),
    [
        ("", {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}, [], "http://127.0.0.1:9/v1"),
        ('openai_base_url = "https://proxy.corp/openai/v1"\n', {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}, [], "https://proxy.corp/openai/v1"),
        ('openai_base_url = "https://proxy.corp/openai/v1"\n', {}, ["-c", 'openai_base_url="https://cli.example/v1"'], "https://cli.example/v1"),
    ],
)
def test_codexs_base_url_stays_the_upstream(tmp_path: Path, config: str, env: dict[str, str], args: list[str], upstream: str) -> None:
    (tmp_path / ".codex").mkdir()
    (tmp_path / ".codex" / "config.toml").write_text(config)
    setup = setup_for("codex", ["codex", *args, "exec", "hi"], {"OPENAI_API_KEY": "sk-x", **env}, LISTEN, tmp_path, home=tmp_path)
    origin, _, path = upstream.partition("//")[2].partition("/")
    assert setup.mode == f"reverse:{upstream.split('//')[0]}//{origin}"
    assert config_values(setup.command)["model_providers.trimflow"]["base_url"] == f"{LISTEN}/{path}"  # type: ignore[index]
    assert setup.upstream == upstream


def test_codexs_own_provider_is_pointed_at_the_proxy_in_place(tmp_path: Path) -> None:
    """CODEX_HOME's provider keeps everything of its own (its key variable, headers, query); only where it
    goes, its wire API and its WebSocket change."""
    (tmp_path / "config.toml").write_text(
        'model_provider = "azure"\n[model_providers.azure]\nname = "Azure"\nbase_url = "https://me.openai.azure.com/openai"\n'
        'env_key = "AZURE_OPENAI_API_KEY"\nquery_params = { api-version = "2025-04-01-preview" }\nsupports_websockets = true\n'
    )
    setup = setup_for("codex", ["codex", "exec", "hi"], {"CODEX_HOME": str(tmp_path)}, LISTEN, tmp_path)
    assert setup.mode == "reverse:https://me.openai.azure.com"
    assert config_values(setup.command) == {
        "model_providers.azure.base_url": f"{LISTEN}/openai",
        "model_providers.azure.wire_api": "responses",
        "model_providers.azure.supports_websockets": False,
    }


def test_codex_without_an_api_key_uses_its_sign_in_through_forward_mode(tmp_path: Path) -> None:
    setup = setup_for("codex", ["codex"], {}, LISTEN, tmp_path, home=tmp_path)
    assert (setup.mode, setup.command, setup.ca_bundle) == ("regular", ["codex"], True)
    assert setup.options == {"trimflow_websocket": "refuse"}
    assert setup.notes and "forward mode" in setup.notes[0]


# --- Gemini CLI ----------------------------------------------------------------------------------------------


def test_gemini_without_settings_gets_a_private_home_selecting_the_api_key(tmp_path: Path) -> None:
    user = tmp_path / "home" / ".gemini"
    user.mkdir(parents=True)
    (user / "GEMINI.md").write_text("be brief")
    env = {"GEMINI_API_KEY": "AIza-x", "GOOGLE_GEMINI_BASE_URL": "http://127.0.0.1:9"}
    setup = setup_for("gemini", ["gemini", "-p", "hi"], env, LISTEN, tmp_path / "run", home=tmp_path / "home")
    assert setup.mode == "reverse:http://127.0.0.1:9"
    private = Path(setup.env["GEMINI_CLI_HOME"]) / ".gemini"
    assert setup.env["GOOGLE_GEMINI_BASE_URL"] == LISTEN and setup.private_dirs == [private.parent]
    assert json.loads((private / "settings.json").read_text()) == {"security": {"auth": {"selectedType": "gemini-api-key"}}}
    # Sessions and history land in the user's own folder; its other files are theirs, linked.
    assert {p.name: p.resolve() for p in private.iterdir() if p.is_symlink()} == {n: user / n for n in ("GEMINI.md", "history", "tmp")}
    assert not (user / "settings.json").exists()


def test_geminis_settings_are_kept_with_comments_and_only_the_auth_type_added(tmp_path: Path) -> None:
    user = tmp_path / ".gemini"
    user.mkdir()
    text = '{\n  // mine\n  "general": {"vimMode": true}, /* and this */ "security": {"folderTrust": {"enabled": false}}, "url": "http://x//y"\n}\n'
    (user / "settings.json").write_text(text)
    setup = setup_for("gemini", ["gemini"], {"GEMINI_API_KEY": "AIza-x"}, LISTEN, tmp_path / "run", home=tmp_path)
    written = json.loads((Path(setup.env["GEMINI_CLI_HOME"]) / ".gemini" / "settings.json").read_text())
    assert written == {
        "general": {"vimMode": True},
        "security": {"folderTrust": {"enabled": False}, "auth": {"selectedType": "gemini-api-key"}},
        "url": "http://x//y",
    }
    assert (user / "settings.json").read_text() == text  # theirs, untouched


def test_gemini_already_on_its_api_key_needs_no_private_home(tmp_path: Path) -> None:
    (tmp_path / ".gemini").mkdir()
    (tmp_path / ".gemini" / "settings.json").write_text('{"security": {"auth": {"selectedType": "gemini-api-key"}}}')
    setup = setup_for("gemini", ["gemini"], {"GEMINI_API_KEY": "AIza-x"}, LISTEN, tmp_path / "run", home=tmp_path)
    assert setup.mode == "reverse:https://generativelanguage.googleapis.com"
    assert setup.env == {"GOOGLE_GEMINI_BASE_URL": LISTEN} and not setup.private_dirs


@pytest.mark.parametrize(
    ("settings", "env", "why"),
    [
        ('{"security": {"auth": {"selectedType": "oauth-personal"}}}', {"GEMINI_API_KEY": "AIza-x"}, "its settings select 'oauth-personal'"),
        ("{}", {}, "no GEMINI_API_KEY"),
    ],
)
def test_gemini_signed_in_otherwise_goes_through_forward_mode(tmp_path: Path, settings: str, env: dict[str, str], why: str) -> None:
    (tmp_path / ".gemini").mkdir()
    (tmp_path / ".gemini" / "settings.json").write_text(settings)
    setup = setup_for("gemini", ["gemini"], env, LISTEN, tmp_path / "run", home=tmp_path)
    assert setup.mode == "regular" and setup.ca_bundle and why in setup.notes[0]


# --- any other command ---------------------------------------------------------------------------------------


def test_any_other_command_gets_the_proxy_variables(tmp_path: Path) -> None:
    setup = setup_for("proxy", ["python", "agent.py"], {}, LISTEN, tmp_path)
    assert setup.mode == "regular" and setup.ca_bundle
    assert setup.env == dict.fromkeys(("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"), LISTEN)


def test_a_proxy_the_user_had_stays_their_way_out(tmp_path: Path) -> None:
    setup = setup_for("proxy", ["python", "agent.py"], {"https_proxy": "http://corp-proxy:3128"}, LISTEN, tmp_path)
    assert setup.mode == "upstream:http://corp-proxy:3128" and setup.env["https_proxy"] == LISTEN


def test_the_ca_bundle_holds_the_users_cas_and_mitmproxys(tmp_path: Path) -> None:
    theirs, ours = tmp_path / "theirs.pem", tmp_path / "ca.pem"
    theirs.write_text("-----BEGIN CERTIFICATE-----\nTHEIRS\n-----END CERTIFICATE-----")
    ours.write_text("-----BEGIN CERTIFICATE-----\nMITM\n-----END CERTIFICATE-----\n")
    bundle = ca_bundle(ours, {"SSL_CERT_FILE": str(theirs)}, tmp_path / "bundle.pem").read_text()
    assert bundle.index("THEIRS") < bundle.index("MITM") and bundle.count("BEGIN CERTIFICATE") == 2
    assert len(CA_VARIABLES) == 4


# --- the summary ---------------------------------------------------------------------------------------------


def records(turns: int, usage: int) -> list[bytes]:
    """Metrics lines of an OpenAI chat session of `turns` turns pruned by the default rules, each answered with `usage` tokens."""
    rules = load_rules(DEFAULT_RULES_PATH)
    shot = image(64, 48, "PNG", seed=1)
    lines = []
    for turn in range(1, turns + 1):
        body = orjson.dumps(session_body("openai-chat", turn, shot, "image/png"))
        record = prune_request(f"https://api.openai.com{PATHS['openai-chat']}", {}, body, rules).record
        assert record is not None
        record = dataclasses.replace(record, status=200, usage_input_tokens=usage, conversation="c0ffee00", turn=turn)
        lines.append(orjson.dumps(record.to_dict()) + b"\n")
    return lines


def test_the_summary_counts_this_runs_records_only(tmp_path: Path) -> None:
    metrics, log = tmp_path / "mine.jsonl", tmp_path / "run.log"
    earlier, ours = records(3, 1000), records(10, 500)
    metrics.write_bytes(b"".join(earlier + ours))
    setup = Setup("proxy", "regular", ["python", "agent.py"])
    lines = summary(metrics, len(b"".join(earlier)), setup, 0, log)
    assert lines[0] == "trimflow: python exited 0; 10 LLM requests in 1 conversation through trimflow"
    conversation = lines[1]
    assert "conversation c0ffee00 (openai-chat, " in conversation and "10 turns, 10 requests" in conversation
    sent = sum(orjson.loads(line)["images_after"] for line in ours)
    pruned = sum(orjson.loads(line)["pruned"] for line in ours)
    assert pruned > 0 and sent + pruned == sum(range(1, 11))  # turn N sends N screenshots
    assert f"images sent {sent}, pruned {pruned}" in conversation and "reported in 5,000" in conversation
    assert lines[-1].startswith(f"trimflow: every turn: scripts/audit {metrics}")
    assert not (tmp_path / "run.jsonl").exists()  # the slice it read is gone


def test_a_run_with_no_llm_request_says_so(tmp_path: Path) -> None:
    lines = summary(tmp_path / "none.jsonl", 0, Setup("proxy", "regular", ["true"]), 3, tmp_path / "run.log")
    assert lines == [f"trimflow: true exited 3; no LLM request went through trimflow (proxy log: {tmp_path / 'run.log'})"]


# --- credentials, the run's files, stale runs ----------------------------------------------------------------

SECRET = "s3cr%40t"  # a password as a URL carries it: "s3cr@t" percent-encoded


@pytest.mark.parametrize(
    ("theirs", "mode", "auth"),
    [
        (f"http://corp-user:{SECRET}@corp-proxy:3128", "upstream:http://corp-proxy:3128", "corp-user:s3cr@t"),
        (f"corp-user:{SECRET}@corp-proxy:3128", "upstream:http://corp-proxy:3128", "corp-user:s3cr@t"),  # no scheme: http
        ("http://corp%5Cuser@corp-proxy:3128/", "upstream:http://corp-proxy:3128/", "corp\\user:"),
        ("corp-proxy:3128", "upstream:http://corp-proxy:3128", None),
    ],
)
def test_the_credentials_of_the_users_proxy_leave_the_mode_for_upstream_auth(tmp_path: Path, theirs: str, mode: str, auth: str | None) -> None:
    setup = setup_for("proxy", ["python", "agent.py"], {"HTTPS_PROXY": theirs}, LISTEN, tmp_path)
    assert (setup.mode, setup.upstream_auth) == (mode, auth)
    assert setup.env["HTTPS_PROXY"] == LISTEN and "s3cr" not in repr(dataclasses.replace(setup, upstream_auth=None))


def test_a_proxy_password_without_a_user_is_refused_without_showing_it(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as caught:
        setup_for("proxy", ["python", "agent.py"], {"HTTPS_PROXY": f"http://:{SECRET}@corp-proxy:3128"}, LISTEN, tmp_path)
    assert str(caught.value) == "trimflow run: the proxy http://corp-proxy:3128 in HTTPS_PROXY has a password but no user name"


def test_a_base_urls_credentials_stay_with_the_agent_in_the_url_it_gets_for_the_proxy(tmp_path: Path) -> None:
    env = {"ANTHROPIC_BASE_URL": f"https://team:{SECRET}@gateway.example/anthropic"}
    setup = setup_for("claude", ["claude"], env, LISTEN, tmp_path)
    assert setup.mode == "reverse:https://gateway.example" and setup.upstream == "https://gateway.example/anthropic"
    assert setup.env == {"ANTHROPIC_BASE_URL": f"http://team:{SECRET}@127.0.0.1:41234/anthropic"}
    assert setup.upstream_auth is None  # reverse mode: the agent's own Authorization header is left alone


@pytest.mark.parametrize(
    ("config", "env"),
    [
        ("", {"OPENAI_API_KEY": "sk-x", "OPENAI_BASE_URL": f"https://team:{SECRET}@gateway.example/v1"}),
        (f'model_provider = "corp"\n[model_providers.corp]\nbase_url = "https://team:{SECRET}@gateway.example/v1"\n', {}),
    ],
)
def test_codex_with_credentials_in_its_base_url_goes_through_forward_mode_keeping_them_off_its_command_line(
    tmp_path: Path, config: str, env: dict[str, str]
) -> None:
    (tmp_path / ".codex").mkdir()
    (tmp_path / ".codex" / "config.toml").write_text(config)
    setup = setup_for("codex", ["codex", "exec", "hi"], env, LISTEN, tmp_path, home=tmp_path)
    assert setup.mode == "regular" and setup.command == ["codex", "exec", "hi"]
    assert "holds credentials" in setup.notes[-1] and "s3cr" not in " ".join(setup.notes)


def test_a_bad_base_url_is_refused_without_its_credentials(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as caught:
        setup_for("claude", ["claude"], {"ANTHROPIC_BASE_URL": f"ftp://team:{SECRET}@gateway.example/"}, LISTEN, tmp_path)
    assert str(caught.value) == "trimflow run: 'ftp://gateway.example/' is not an http(s) URL"


@pytest.mark.parametrize("mode", [0o600, 0o640])
def test_geminis_settings_copy_keeps_the_mode_of_the_users_file(tmp_path: Path, mode: int) -> None:
    (tmp_path / ".gemini").mkdir()
    settings = tmp_path / ".gemini" / "settings.json"
    settings.write_text('{"mcpServers": {"tools": {"headers": {"Authorization": "Bearer t"}}}}')
    settings.chmod(mode)
    setup = setup_for("gemini", ["gemini"], {"GEMINI_API_KEY": "AIza-x"}, LISTEN, tmp_path / "run", home=tmp_path)
    private = Path(setup.env["GEMINI_CLI_HOME"]) / ".gemini"
    assert stat.S_IMODE((private / "settings.json").stat().st_mode) == mode
    assert stat.S_IMODE(private.stat().st_mode) == 0o700


def test_mitmdumps_confdir_of_the_run_holds_the_users_config_and_the_credentials_readable_by_them_alone(tmp_path: Path) -> None:
    user, run_dir = tmp_path / "user-confdir", tmp_path / "run"
    user.mkdir()
    run_dir.mkdir()
    (user / "config.yaml").write_text("ssl_insecure: false\nscripts: [mine.py]\nupstream_cert: false\n")
    confdir = mitmdump_confdir(run_dir, user, "corp-user:s3cr@t: x")
    assert stat.S_IMODE(confdir.stat().st_mode) == 0o700
    config = confdir / "config.yaml"
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert yaml.safe_load(config.read_text()) == {
        "ssl_insecure": False,
        "scripts": [str(user / "mine.py")],  # mitmproxy reads them relative to the file that names them
        "upstream_cert": False,
        "confdir": str(user),  # the CA stays the user's
        "upstream_auth": "corp-user:s3cr@t: x",
    }


def test_a_users_confdir_option_makes_way_for_the_runs(tmp_path: Path) -> None:
    args = ["--set", "confdir=/c", "-q", "--set=confdir=/d", "--set", "confdirx=1", "--set=trimflow_mode=observe"]
    assert without_option(args, "confdir") == ["-q", "--set", "confdirx=1", "--set=trimflow_mode=observe"]


def test_the_runs_folder_is_made_private_and_refused_when_it_is_someone_elses(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o755)
    runs.chmod(0o755)
    private_folder(runs)
    assert stat.S_IMODE(runs.stat().st_mode) == 0o700
    (tmp_path / "a-file").write_text("")
    with pytest.raises(LaunchError, match=r"cannot make .*a-file/runs \(Not a directory\)"):
        private_folder(tmp_path / "a-file" / "runs")
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 4321, 4321)
        with pytest.raises(LaunchError, match="is not a folder of yours"):
            private_folder(theirs)


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_the_folders_of_runs_whose_launcher_is_gone_are_removed_keeping_what_the_agent_wrote(tmp_path: Path) -> None:
    user, runs = tmp_path / "home" / ".gemini", tmp_path / "runs"
    user.mkdir(parents=True)
    (user / "GEMINI.md").write_text("mine")
    runs.mkdir()
    pid = dead_pid()
    stale = runs / f"20261124-112213-gemini-{pid}"
    stale.mkdir()
    (stale / LAUNCHER_FILE).write_text(f"{socket.gethostname()} {pid} 12345\n")
    setup_for("gemini", ["gemini"], {"GEMINI_API_KEY": "AIza-x"}, LISTEN, stale, home=tmp_path / "home")
    private = stale / "gemini-home" / ".gemini"
    (private / "trustedFolders.json").write_text("{}")  # new
    (private / "GEMINI.md").unlink()  # a link the agent replaced with a file of its own
    (private / "GEMINI.md").write_text("the agent's")
    live = new_run_dir(runs, f"20261124-112214-claude-{os.getpid()}")  # this process: running
    reused = runs / f"20261124-112215-claude-{os.getpid()}"  # this pid, but another process's start time
    reused.mkdir()
    (reused / LAUNCHER_FILE).write_text(f"{socket.gethostname()} {os.getpid()} 1\n")
    elsewhere = runs / f"20261124-112217-claude-{dead_pid()}"  # a launcher on another machine sharing the home
    elsewhere.mkdir()
    (elsewhere / LAUNCHER_FILE).write_text(f"not-{socket.gethostname()} {elsewhere.name.rpartition('-')[2]} 1\n")
    older = runs / f"20261124-112216-codex-{dead_pid()}"  # an older launcher's folder, with no marker
    older.mkdir()
    lines = clean_stale_runs(runs)
    kept = runs / f"{stale.name}.gemini"
    assert lines == [f"trimflow run: Gemini CLI wrote GEMINI.md, trustedFolders.json in its private settings folder, not in {user}: kept in {kept}"]
    assert sorted(p.name for p in runs.iterdir()) == sorted([kept.name, live.name, elsewhere.name])
    assert (kept / "GEMINI.md").read_text() == "the agent's" and (user / "GEMINI.md").read_text() == "mine"
    assert stat.S_IMODE(kept.stat().st_mode) == 0o700


def test_a_run_whose_agent_changed_nothing_leaves_no_folder_and_no_line(tmp_path: Path) -> None:
    (tmp_path / "home" / ".gemini").mkdir(parents=True)
    (tmp_path / "home" / ".gemini" / "GEMINI.md").write_text("mine")
    run_dir = new_run_dir(tmp_path, "20261124-112213-gemini-1")
    setup_for("gemini", ["gemini"], {"GEMINI_API_KEY": "AIza-x"}, LISTEN, run_dir, home=tmp_path / "home")
    assert finish_run_dir(run_dir) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]
    assert (tmp_path / "home" / ".gemini" / "GEMINI.md").read_text() == "mine"  # links removed, never followed


def test_the_ca_bundle_is_the_users_alone(tmp_path: Path) -> None:
    ours = tmp_path / "ca.pem"
    ours.write_text("-----BEGIN CERTIFICATE-----\nMITM\n-----END CERTIFICATE-----\n")
    bundle = ca_bundle(ours, {"SSL_CERT_FILE": str(tmp_path / "none.pem")}, tmp_path / "bundle.pem")
    assert stat.S_IMODE(bundle.stat().st_mode) == 0o600
