"""trimflow.cli._agents: each agent's setup (mode, environment, command line; the user's upstream stays the upstream,
no file of theirs is edited, credentials never reach a command line). The processes (exit status, signals, ports,
the real CLIs) are in tests/e2e."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import tomllib
from pathlib import Path

import pytest
import yaml

from trimflow.cli import _agents
from trimflow.cli._agents import FORWARD_AGENTS, PENDING, agent_of, codex_overrides, proxy_environment, setup_for
from trimflow.cli._launch_error import LaunchError

LISTEN = "http://127.0.0.1:41234"
SECRET = "s3cr%40t"  # a password as a URL carries it: "s3cr@t" percent-encoded


@pytest.mark.parametrize(
    ("command", "chosen", "agent"),
    [
        (["claude", "-p", "hi"], None, "claude"),
        (["/opt/tools/node_modules/.bin/codex", "exec"], None, "codex"),
        (["gemini.js"], None, "gemini"),
        (["python", "agent.py"], None, "proxy"),
        (["proxy"], None, "proxy"),
        (["./my-claude-wrapper"], "claude", "claude"),
        (["/opt/tools/bin/opencode", "run"], None, "opencode"),
        (["qwen"], None, "qwen"),
        (["./wrapper"], "hermes", "hermes"),
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
    ("agent", "command", "env"),
    [
        ("claude", ["claude", "-p", "hi"], {"ANTHROPIC_BASE_URL": f"https://user:{SECRET}@gateway.example/anthropic"}),
        ("codex", ["codex", "exec", "--", "look"], {"OPENAI_API_KEY": "sk-x"}),
        ("gemini", ["gemini"], {"GEMINI_API_KEY": "k"}),
        ("proxy", ["python", "agent.py"], {}),
    ],
)
def test_a_setup_made_before_the_port_is_known_is_the_setup_at_the_port(tmp_path: Path, agent: str, command: list[str], env: dict) -> None:
    """The launcher makes the setup before mitmdump binds the port the kernel picks, and gives the agent that port."""
    pending = setup_for(agent, command, env, PENDING, tmp_path / "pending", home=tmp_path)
    direct = setup_for(agent, command, env, LISTEN, tmp_path / "direct", home=tmp_path)
    bound = pending.at(LISTEN)
    assert (bound.mode, bound.command, bound.options, bound.upstream) == (direct.mode, direct.command, direct.options, direct.upstream)
    assert bound.env == {name: value.replace(str(tmp_path / "direct"), str(tmp_path / "pending")) for name, value in direct.env.items()}
    assert "invalid" not in repr((bound.command, bound.env))


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


def test_mitmdump_gets_no_proxy_variable_that_holds_credentials() -> None:
    """Its environment is in /proc for the user's every process; its way out is its mode, its credentials a pipe's."""
    theirs = {
        "HTTPS_PROXY": f"http://corp-user:{SECRET}@corp-proxy:3128",
        "https_proxy": f"corp-user:{SECRET}@corp-proxy:3128",
        "HTTP_PROXY": f"http://corp-user:{SECRET}@corp-proxy:3128",
        "http_proxy": "http://corp-proxy:3128",
        "ALL_PROXY": f"socks5h://corp-user:{SECRET}@corp-proxy:1080",
        "all_proxy": "socks5h://corp-proxy:1080",
        "NO_PROXY": "localhost,127.0.0.1",
        "PATH": "/usr/bin",
        "GIT_AUTHOR_EMAIL": "me@example.com",  # not a proxy variable
    }
    assert proxy_environment(theirs) == {
        "http_proxy": "http://corp-proxy:3128",
        "all_proxy": "socks5h://corp-proxy:1080",
        "NO_PROXY": "localhost,127.0.0.1",
        "PATH": "/usr/bin",
        "GIT_AUTHOR_EMAIL": "me@example.com",
    }


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


# --- recall: the run's MCP server registered ------------------------------------------------------------------

SERVER = ["/venv/bin/python", "-m", "trimflow", "mcp", "--store", "/home/u/.mitmproxy/trimflow-recall", "--token-file", "/run/recall-token"]


@pytest.mark.parametrize(
    ("command", "expected_tail"),
    [
        (["claude", "-p", "look"], ["-p", "look", "--mcp-config", "{file}", "--allowedTools", "mcp__trimflow__recall_image"]),
        (["claude"], ["--mcp-config", "{file}", "--allowedTools", "mcp__trimflow__recall_image"]),
        (["claude", "-p", "--", "-look"], ["-p", "--mcp-config", "{file}", "--allowedTools", "mcp__trimflow__recall_image", "--", "-look"]),
    ],
)
def test_claude_gets_the_runs_server_in_a_private_mcp_config_after_its_own_arguments(
    tmp_path: Path, command: list[str], expected_tail: list[str]
) -> None:
    setup = setup_for("claude", command, {}, LISTEN, tmp_path, recall=SERVER)
    config = tmp_path / "claude-mcp.json"
    assert setup.command == ["claude", *(str(config) if item == "{file}" else item for item in expected_tail)]
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    server = json.loads(config.read_text())["mcpServers"]["trimflow"]
    assert server == {"type": "stdio", "command": SERVER[0], "args": SERVER[1:], "alwaysLoad": True}


@pytest.mark.parametrize("env", [{"OPENAI_API_KEY": "sk-x"}, {}])  # reverse mode, and forward mode (its sign-in)
def test_codex_gets_the_runs_server_as_an_override_before_its_subcommand(tmp_path: Path, env: dict[str, str]) -> None:
    setup = setup_for("codex", ["codex", "exec", "hi"], env, LISTEN, tmp_path, home=tmp_path, recall=SERVER)
    assert setup.command[1] == "-c" and setup.command[-2:] == ["exec", "hi"]
    overrides = {key: tomllib.loads(f"v = {value}")["v"] for key, value in codex_overrides(setup.command).items()}
    assert overrides["mcp_servers.trimflow"] == {
        "command": SERVER[0],
        "args": SERVER[1:],
        "startup_timeout_sec": 30,
        "default_tools_approval_mode": "approve",
    }


def test_gemini_gets_the_runs_server_in_its_private_settings_beside_the_users_own(tmp_path: Path) -> None:
    (tmp_path / ".gemini").mkdir()
    theirs = '{"security": {"auth": {"selectedType": "gemini-api-key"}}, "mcpServers": {"docs": {"command": "docs-server"}}}'
    (tmp_path / ".gemini" / "settings.json").write_text(theirs)
    setup = setup_for("gemini", ["gemini"], {"GEMINI_API_KEY": "AIza-x"}, LISTEN, tmp_path / "run", home=tmp_path, recall=SERVER)
    written = json.loads((Path(setup.env["GEMINI_CLI_HOME"]) / ".gemini" / "settings.json").read_text())
    assert written["mcpServers"] == {"docs": {"command": "docs-server"}, "trimflow": {"command": SERVER[0], "args": SERVER[1:], "trust": True}}
    assert (tmp_path / ".gemini" / "settings.json").read_text() == theirs  # theirs, untouched


def test_without_recall_no_agent_gets_a_server(tmp_path: Path) -> None:
    assert setup_for("claude", ["claude"], {}, LISTEN, tmp_path).command == ["claude"]
    assert not any("mcp_servers" in item for item in setup_for("codex", ["codex"], {"OPENAI_API_KEY": "k"}, LISTEN, tmp_path, home=tmp_path).command)
    assert not (tmp_path / "claude-mcp.json").exists()


# --- recall for the coding agents in forward mode ------------------------------------------------------------


def tree(folder: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under `folder`."""
    return {str(path.relative_to(folder)): path.read_bytes() if path.is_file() else None for path in sorted(folder.rglob("*"))}


@pytest.mark.parametrize(("agent", "variable"), [("opencode", "OPENCODE_CONFIG_CONTENT"), ("kilo", "KILO_CONFIG_CONTENT")])
def test_opencode_and_kilo_get_the_runs_server_in_their_inline_config_beside_the_users_own(tmp_path: Path, agent: str, variable: str) -> None:
    theirs = '{"mcp": {"docs": {"type": "local", "command": ["docs-server"]}}, // theirs\n "share": "disabled"}'
    (tmp_path / "run").mkdir()
    before = tree(tmp_path)
    setup = setup_for(agent, [agent, "run", "hi"], {variable: theirs}, LISTEN, tmp_path / "run", home=tmp_path, recall=SERVER)
    assert setup.ca_bundle and setup.command == [agent, "run", "hi"] and not setup.notes  # forward mode, as before
    config = json.loads(setup.env[variable])
    assert config["mcp"] == {"docs": {"type": "local", "command": ["docs-server"]}, "trimflow": {"type": "local", "command": SERVER, "enabled": True}}
    assert config["share"] == "disabled"
    assert tree(tmp_path) == before  # nothing written: a variable of the agent's environment


def test_an_inline_config_that_is_not_json_is_left_alone_and_said(tmp_path: Path) -> None:
    setup = setup_for("opencode", ["opencode"], {"OPENCODE_CONFIG_CONTENT": "{not json"}, LISTEN, tmp_path, recall=SERVER)
    assert "OPENCODE_CONFIG_CONTENT" not in setup.env
    why = "OPENCODE_CONFIG_CONTENT is not a JSON object"
    assert setup.notes == [f"trimflow run: recall_image is not registered with opencode: {why} (docs/agents.md#recall)"]


def test_qwen_gets_the_runs_server_in_a_system_settings_file_of_the_run_keeping_the_systems_own(tmp_path: Path) -> None:
    system = tmp_path / "etc" / "settings.json"
    system.parent.mkdir()
    system.write_text('{"mcpServers": {"docs": {"command": "docs-server"}}, /* the administrator */ "telemetry": {"enabled": false}}')
    (tmp_path / "run").mkdir()
    before = tree(tmp_path / "etc")
    setup = setup_for("qwen", ["qwen", "mcp", "list"], {"QWEN_CODE_SYSTEM_SETTINGS_PATH": str(system)}, LISTEN, tmp_path / "run", recall=SERVER)
    assert setup.ca_bundle and setup.command == ["qwen", "mcp", "list"] and not setup.notes  # no option its subcommands refuse
    copy = Path(setup.env["QWEN_CODE_SYSTEM_SETTINGS_PATH"])
    assert copy.parent == tmp_path / "run" and stat.S_IMODE(copy.stat().st_mode) == 0o600
    written = json.loads(copy.read_text())
    assert written["mcpServers"] == {
        "docs": {"command": "docs-server"},
        "trimflow": {"command": SERVER[0], "args": SERVER[1:], "trust": True, "alwaysLoadTools": True},
    }
    assert written["telemetry"] == {"enabled": False}
    assert setup.env["QWEN_CODE_SYSTEM_DEFAULTS_PATH"] == str(tmp_path / "etc" / "system-defaults.json")  # where it was
    assert tree(tmp_path / "etc") == before


def test_qwen_without_system_settings_gets_the_server_alone_and_its_defaults_path_stays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_agents, "QWEN_SYSTEM_SETTINGS", tmp_path / "etc" / "qwen-code" / "settings.json")
    env = {"QWEN_CODE_SYSTEM_DEFAULTS_PATH": "/srv/defaults.json"}
    setup = setup_for("qwen", ["qwen"], env, LISTEN, tmp_path, recall=SERVER)
    assert json.loads(Path(setup.env["QWEN_CODE_SYSTEM_SETTINGS_PATH"]).read_text()) == {
        "mcpServers": {"trimflow": {"command": SERVER[0], "args": SERVER[1:], "trust": True, "alwaysLoadTools": True}}
    }
    assert setup.env["QWEN_CODE_SYSTEM_DEFAULTS_PATH"] == "/srv/defaults.json"


def test_qwen_with_system_settings_it_cannot_read_is_left_alone_and_said(tmp_path: Path) -> None:
    system = tmp_path / "settings.json"
    system.write_text("[1, 2]")  # not an object
    (tmp_path / "run").mkdir()
    setup = setup_for("qwen", ["qwen"], {"QWEN_CODE_SYSTEM_SETTINGS_PATH": str(system)}, LISTEN, tmp_path / "run", recall=SERVER)
    assert "QWEN_CODE_SYSTEM_SETTINGS_PATH" not in setup.env and not list((tmp_path / "run").iterdir())
    assert setup.notes == [f"trimflow run: recall_image is not registered with qwen: cannot read {system} (docs/agents.md#recall)"]


def test_hermes_gets_the_runs_server_in_a_managed_scope_of_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_agents, "HERMES_MANAGED_DIR", tmp_path / "etc-hermes")  # none on this machine
    (tmp_path / "run").mkdir()
    setup = setup_for("hermes", ["hermes", "-z", "hi"], {"HERMES_HOME": str(tmp_path / "hermes")}, LISTEN, tmp_path / "run", recall=SERVER)
    assert setup.ca_bundle and setup.command == ["hermes", "-z", "hi"] and not setup.notes
    managed = Path(setup.env["HERMES_MANAGED_DIR"])
    assert managed.parent == tmp_path / "run" and os.listdir(managed) == ["config.yaml"]
    config = yaml.safe_load((managed / "config.yaml").read_text())
    assert config == {"mcp_servers": {"trimflow": {"command": SERVER[0], "args": SERVER[1:]}}}  # merged over theirs by Hermes
    assert not (tmp_path / "hermes").exists()


@pytest.mark.parametrize("theirs", ["env", "etc"])
def test_an_administrators_managed_scope_for_hermes_is_not_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, theirs: str) -> None:
    (tmp_path / "etc-hermes").mkdir()
    monkeypatch.setattr(_agents, "HERMES_MANAGED_DIR", tmp_path / "etc-hermes" if theirs == "etc" else tmp_path / "none")
    env = {"HERMES_MANAGED_DIR": str(tmp_path / "etc-hermes")} if theirs == "env" else {}
    setup = setup_for("hermes", ["hermes"], env, LISTEN, tmp_path, recall=SERVER)
    assert "HERMES_MANAGED_DIR" not in setup.env
    assert setup.notes == [
        f"trimflow run: recall_image is not registered with hermes: its managed scope ({tmp_path / 'etc-hermes'}) is an administrator's,"
        " which the launcher does not replace (docs/agents.md#recall)"
    ]


@pytest.mark.parametrize("agent", ["pi", "cline", "openclaw"])
def test_an_agent_that_takes_no_server_for_one_run_gets_one_line_and_its_setup_as_before(tmp_path: Path, agent: str) -> None:
    setup = setup_for(agent, [agent, "-p", "hi"], {}, LISTEN, tmp_path, recall=SERVER)
    assert setup == dataclasses.replace(setup_for(agent, [agent, "-p", "hi"], {}, LISTEN, tmp_path), notes=setup.notes)
    (note,) = setup.notes
    assert note.startswith(f"trimflow run: recall_image is not registered with {agent}: ") and note.endswith("(docs/agents.md#recall)")
    assert not list(tmp_path.iterdir())


def test_gemini_signed_in_otherwise_gets_one_line_for_recall(tmp_path: Path) -> None:
    setup = setup_for("gemini", ["gemini"], {}, LISTEN, tmp_path, home=tmp_path, recall=SERVER)
    why = "it signs in without an API key"
    assert setup.ca_bundle and setup.notes[-1] == f"trimflow run: recall_image is not registered with gemini: {why} (docs/agents.md#recall)"


@pytest.mark.parametrize("agent", FORWARD_AGENTS)
def test_without_recall_the_forward_agents_get_forward_mode_alone(tmp_path: Path, agent: str) -> None:
    setup = setup_for(agent, [agent], {}, LISTEN, tmp_path, home=tmp_path)
    assert setup.mode == "regular" and setup.ca_bundle and not setup.notes
    assert set(setup.env) == {"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"}
    assert not list(tmp_path.iterdir())
