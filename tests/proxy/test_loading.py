"""How mitmproxy loads trimflow: addon/mitm.py and trimflow/proxy/mitmdump_script.py each build one `addons`
list when mitmdump loads them, in the order the hooks must run; importing trimflow builds nothing and leaves
mitmproxy's classes as they are; and only trimflow.proxy imports mitmproxy."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from mitmproxy.addons import script
from mitmproxy.test import taddons

from trimflow import proxy
from trimflow.proxy import recover

from ..helpers import ROOT, load_addon_module

PACKAGE = ROOT / "addon" / "trimflow"
ORDER = [
    proxy.GeminiKeyHeader,
    proxy.Recover,
    proxy.Prune,
    proxy.WebSocket,
    proxy.Simulate,
    proxy.SendOnce,
    proxy.Clicks,
    proxy.Metrics,
    recover.HoldErrorAnswers,
    proxy.HoldRefusals,
    proxy.Prometheus,
    proxy.OpenTelemetry,
    proxy.ShareConversations,
    proxy.Recall,
    proxy.KeepMemory,
    proxy.UpstreamAuthPipe,
    proxy.Options,
]
OPTIONS = {
    "trimflow_rules",
    "trimflow_rules_check",
    "trimflow_mode",
    "trimflow_max_decoded_bytes",
    "trimflow_simulate",
    "trimflow_profiles",
    "trimflow_metrics",
    "trimflow_keep_memory",
    "trimflow_websocket",
    "trimflow_recover",
    "trimflow_retries",
    "trimflow_learned",
    "trimflow_learned_ttl",
    "trimflow_limit_errors",
    "trimflow_prometheus",
    "trimflow_otel",
    "trimflow_clicks",
    "trimflow_conversations",
    "trimflow_state",
    "trimflow_state_password_file",
    "trimflow_state_deadline",
    "trimflow_recall",
    "trimflow_recall_size",
    "trimflow_recall_conversation_size",
    "trimflow_recall_lifetime",
    "trimflow_send_once",
    "trimflow_send_once_lifetime",
    "trimflow_send_once_deadline",
    "trimflow_upstream_auth_fd",
}


async def test_mitm_py_exports_the_addons_in_hook_order_sharing_one_state() -> None:
    module = load_addon_module()  # as `mitmdump -s addon/mitm.py` does: a file, not an importable module
    assert [type(a) for a in module.addons] == ORDER
    assert len({id(a.flows) for a in module.addons if hasattr(a, "flows")}) == 1
    assert not set(map(id, module.addons)) & set(map(id, load_addon_module().addons))  # each load builds its own
    fresh = proxy.make_addons()
    with taddons.context(*fresh) as tctx:  # each registers under its own name and declares its own options
        assert {name for name in tctx.options.keys() if name.startswith("trimflow_")} == OPTIONS
        assert all(tctx.master.addons.get(a.name) is a for a in fresh)


def test_the_installed_script_exports_the_same_list() -> None:
    module = script.load_script(str(PACKAGE / "proxy" / "mitmdump_script.py"))  # mitmproxy's own script loader
    assert module is not None and [type(a) for a in module.addons] == ORDER


# Run in a fresh interpreter, so that what earlier tests imported or ran makes no difference. mitmproxy's modules
# are imported first, as mitmdump has them, and every attribute of their classes noted; then every module of
# trimflow is imported (the mitmdump script included: it builds the addons). Anything trimflow assigned onto a
# mitmproxy class shows as a changed attribute, or as a function of trimflow's in one.
IMPORT_EVERYTHING = """
import importlib, inspect, json, pkgutil, sys
import mitmproxy.addons, mitmproxy.proxy.layers, mitmproxy.proxy.layers.http, mitmproxy.tools.dump

def classes():
    for name, module in list(sys.modules.items()):
        if module is not None and (name == "mitmproxy" or name.startswith("mitmproxy.")):
            yield from (v for v in vars(module).values() if inspect.isclass(v) and v.__module__ == name)

before = {cls: dict(vars(cls)) for cls in classes()}
import trimflow
names = ["trimflow"] + [m.name for m in pkgutil.walk_packages(trimflow.__path__, "trimflow.")]
for name in names:
    importlib.import_module(name)
changed = sorted(
    f"{cls.__module__}.{cls.__qualname__}.{attr}"
    for cls, attrs in before.items()
    for attr in set(attrs) | set(vars(cls))
    if attrs.get(attr, before) is not vars(cls).get(attr, before)
)
trimflows = sorted(
    f"{cls.__module__}.{cls.__qualname__}.{attr}"
    for cls in classes()
    for attr, value in vars(cls).items()
    if inspect.isfunction(value) and (value.__module__ or "").startswith("trimflow")
)
print(json.dumps({"imported": names, "changed": changed, "trimflows": trimflows}))
"""


def test_importing_every_module_of_trimflow_leaves_mitmproxys_classes_as_they_are() -> None:
    done = subprocess.run([sys.executable, "-c", IMPORT_EVERYTHING], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    modules = {module_name(path) for path in PACKAGE.rglob("*.py") if path.name != "__main__.py"} | {"trimflow.__main__"}
    assert set(found["imported"]) == modules  # every module, the mitmdump script and recover's hold included
    assert (found["changed"], found["trimflows"]) == ([], [])


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def mitmproxy_imports(path: Path) -> list[int]:
    """Lines importing mitmproxy at any nesting level, except under `if TYPE_CHECKING:` (annotations only)."""
    found: list[int] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.extend(node.lineno for alias in node.names if alias.name.split(".")[0] == "mitmproxy")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "mitmproxy":
            found.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name) and node.args:
            name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
            first = node.args[0]
            if name in ("import_module", "__import__") and isinstance(first, ast.Constant) and str(first.value).startswith("mitmproxy"):
                found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def test_only_trimflow_proxy_imports_mitmproxy() -> None:
    outside = {
        f"{path.relative_to(PACKAGE)}:{line}"
        for path in PACKAGE.rglob("*.py")
        if "proxy" not in path.relative_to(PACKAGE).parts[:1]
        for line in mitmproxy_imports(path)
    }
    assert outside == set()
    assert mitmproxy_imports(PACKAGE / "proxy" / "prune.py")  # the walk does find imports


def test_the_walk_finds_nested_imports_and_skips_type_checking_ones(tmp_path) -> None:
    module = tmp_path / "module.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mitmproxy import http\n"
        "def read():\n    from mitmproxy.io import FlowReader\n    import mitmproxy.http\n"
        "class C:\n    def m(self):\n        importlib.import_module('mitmproxy.io')\n"
    )
    assert mitmproxy_imports(module) == [5, 6, 9]


def test_the_engine_and_tools_import_and_prune_without_mitmproxy(tmp_path) -> None:
    code = (
        "import sys\n"
        "sys.modules['mitmproxy'] = None  # any import of mitmproxy now fails\n"
        "import trimflow, trimflow._engine, trimflow._rules, trimflow.cli._prune, trimflow.audit, trimflow.testing\n"
        "from trimflow.testing import PATHS, image, session_body\n"
        "import orjson\n"
        "body = orjson.dumps(session_body('openai-chat', 5, image(64, 48, 'PNG', seed=3), 'image/png'))\n"
        "rules = trimflow._rules.builtin_rules()\n"
        "outcome = trimflow.prune_request('https://api.openai.com' + PATHS['openai-chat'], {}, body, rules.with_limits(max_images=2))\n"
        "print(outcome.record.images_before, outcome.record.images_after)\n"
        "try:\n"
        "    import trimflow.proxy\n"
        "except ImportError:\n"
        "    print('no proxy')\n"
        "print(trimflow.audit.main([sys.argv[1]]))\n"
    )
    dump = tmp_path / "flows.mitm"
    dump.write_bytes(b"recorded elsewhere")
    done = subprocess.run([sys.executable, "-c", code, str(dump)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["5 2", "no proxy"] and done.stdout.split("\n")[2] != "0"
    assert f"{dump}: reading a mitmproxy dump or HAR file needs mitmproxy (pip install mitmproxy)" in done.stderr
