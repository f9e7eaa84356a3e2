"""The tests mirror the package: addon/trimflow/<sub>/[_]<name>.py is tested in tests/<sub>/test_<name>.py.
Test modules share code through helper modules (cases.py, helpers.py, bombs.py), never by importing one another,
and the package never imports from the tests. Read with ast, not by importing anything."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
ADDON = ROOT / "addon"
PACKAGE = ADDON / "trimflow"
LAYOUT_DOC = ROOT / "docs" / "development.md"

# Modules tested through another file instead of one named after them, each with the reason. Keep it short:
# a module with logic of its own gets its own test file.
TESTED_ELSEWHERE = {
    # The launcher's error and its exit statuses: test_launch checks the statuses and the one line its main returns.
    "cli/_launch_error.py": "tests/cli/test_launch.py",
    # Three lines that hand mitmdump the package's addons: what can go wrong is how mitmproxy loads it, which
    # test_loading checks with mitmproxy's own script loader (and the e2e runs start mitmdump with it).
    "proxy/mitmdump_script.py": "tests/proxy/test_loading.py",
}


def python_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path, base: Path) -> str:
    """The dotted name `path` imports as when `base` is on sys.path (a package's __init__ is the package)."""
    parts = list(path.relative_to(base).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def walk(node: ast.AST, at_runtime: bool) -> Iterator[ast.AST]:
    """`node` and every node under it; with `at_runtime`, not those under `if TYPE_CHECKING:` (never executed)."""
    yield node
    for child in ast.iter_child_nodes(node):
        if at_runtime and isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            for branch in child.orelse:
                yield from walk(branch, at_runtime)
        else:
            yield from walk(child, at_runtime)


def import_statements(path: Path, base: Path, at_runtime: bool = False) -> Iterator[tuple[int, str, list[str]]]:
    """(line, absolute dotted module, names) for every import in `path`, nested ones included: `import m` gives
    (m, []), `from m import x, y` gives (m, [x, y]) (x may be a module); relative imports are resolved. With
    `at_runtime`, the imports under `if TYPE_CHECKING:` (for annotations only) are left out."""
    name = module_name(path, base)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in walk(ast.parse(path.read_text(encoding="utf-8"), str(path)), at_runtime):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: up level-1 packages from the module's own
                up = package[: len(package) - (node.level - 1)]
                module = ".".join(up + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            yield node.lineno, module, [alias.name for alias in node.names]


def imports(path: Path, base: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute dotted name) for every import in `path`; `from m import x` gives m and m.x (x may be a module)."""
    for line, module, names in import_statements(path, base):
        yield line, module
        for name in names:
            yield line, f"{module}.{name}"


def is_test_module(dotted: str) -> bool:
    parts = dotted.split(".")
    return parts[0] == "tests" and any(part.startswith("test_") for part in parts)


def test_the_import_reader_resolves_relative_imports(tmp_path: Path) -> None:
    """The checks below are only as good as this: every spelling of importing a test module is caught."""
    (tmp_path / "tests" / "formats").mkdir(parents=True)
    probe = tmp_path / "tests" / "formats" / "test_probe.py"
    probe.write_text(
        "from .test_formats import CASES\nfrom . import test_other, cases\nfrom ..test_rules import load\n"
        "from .. import helpers\nimport tests.test_engine\nfrom tests.hostile.test_hostile import X\n"
        "from tests.formats import test_formats as t\nfrom .cases import PNG\nimport os\n"
    )
    found = list(imports(probe, tmp_path))
    assert sorted({name for _, name in found if is_test_module(name)}) == [
        "tests.formats.test_formats",
        "tests.formats.test_formats.CASES",
        "tests.formats.test_other",
        "tests.hostile.test_hostile",
        "tests.hostile.test_hostile.X",
        "tests.test_engine",
        "tests.test_rules",
        "tests.test_rules.load",
    ]
    assert {name for _, name in found if not is_test_module(name)} == {
        "tests.formats",
        "tests.formats.cases",
        "tests",
        "tests.helpers",
        "tests.formats.cases.PNG",
        "os",
    }


def test_no_module_under_tests_imports_a_test_module() -> None:
    """Importing a test module runs its module-level code and, with `import *` or a name that starts with
    test_, collects its tests twice; shared cases belong in a helper module."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: imports {name}"
        for path in python_files(TESTS)
        for line, name in imports(path, ROOT)
        if is_test_module(name)
    ]
    assert offenders == []


def test_the_package_never_imports_from_the_tests() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: imports {name}"
        for path in python_files(ADDON)
        for line, name in imports(path, ADDON)
        if name == "tests" or name.startswith("tests.")
    ]
    assert offenders == []


def package_modules() -> list[Path]:
    return [p for p in python_files(PACKAGE) if p.name not in ("__init__.py", "__main__.py")]


def mirror(module: Path) -> Path:
    """tests/<sub>/test_<name>.py for addon/trimflow/<sub>/[_]<name>.py."""
    relative = module.relative_to(PACKAGE)
    return TESTS / relative.parent / f"test_{relative.stem.lstrip('_')}.py"


def test_every_module_has_a_test_file_named_after_it() -> None:
    missing = [
        f"{module.relative_to(ROOT)}: no {mirror(module).relative_to(ROOT)}"
        for module in package_modules()
        if not mirror(module).is_file() and module.relative_to(PACKAGE).as_posix() not in TESTED_ELSEWHERE
    ]
    assert missing == []


@pytest.mark.parametrize(("module", "tested_in"), sorted(TESTED_ELSEWHERE.items()))
def test_each_module_tested_elsewhere_is_named_where_it_is_tested(module: str, tested_in: str) -> None:
    """The allow-list stays true: the module exists, has no test file of its own (else drop the entry), and
    the test file it names exists and names it."""
    path = PACKAGE / module
    assert path.is_file(), f"{module} is gone: drop it from TESTED_ELSEWHERE"
    assert not mirror(path).is_file(), f"{module} has {mirror(path).relative_to(ROOT)}: drop it from TESTED_ELSEWHERE"
    assert path.stem in (ROOT / tested_in).read_text(encoding="utf-8")


def test_every_folder_of_tests_is_a_package() -> None:
    """The relative imports between tests and their helpers need packages, and so do test files of the same
    name in two folders (tests/test_metrics_file.py and tests/proxy/test_metrics.py)."""
    folders = {path.parent for path in python_files(TESTS)}
    assert sorted(str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").is_file()) == []


def import_graph(root: Path, base: Path) -> dict[str, set[str]]:
    """Module -> the modules of the package under `root` it imports when it runs, at the top or inside a function
    alike (a lazy import is still a dependency; one under `if TYPE_CHECKING:` is not). `from p import m` is an edge
    to p.m when m is a module, else to p; a package's own __init__ run by importing one of its modules is Python's
    doing, not an edge."""
    modules = {module_name(path, base): path for path in python_files(root)}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for _, module, names in import_statements(path, base, at_runtime=True):
            submodules = [f"{module}.{item}" for item in names if f"{module}.{item}" in modules]
            targets.update(submodules)
            if module in modules and len(submodules) < len(names or [module]):
                targets.add(module)
        graph[name] = targets - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle as [a, b, ..., a], or [] when there is none (depth-first, in sorted order: the same answer each run)."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str]:
        if node in path:
            return path[path.index(node) :] + [node]
        if node in done:
            return []
        path.append(node)
        for target in sorted(graph.get(node, ())):
            cycle = visit(target)
            if cycle:
                return cycle
        path.pop()
        done.add(node)
        return []

    for node in sorted(graph):
        cycle = visit(node)
        if cycle:
            return cycle
    return []


def test_the_import_graph_sees_lazy_imports_and_finds_a_cycle(tmp_path: Path) -> None:
    """The check below is only as good as this: a cycle closed by an import inside a function is found, and importing
    a package's module (or a name of the package) is told apart from importing the package."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from .core import VALUE\n")
    (package / "core.py").write_text("import os\nVALUE = 1\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "run.py").write_text("from .. import core\n\ndef main():\n    from . import launch\n    return launch\n")
    (package / "sub" / "launch.py").write_text("from . import run\nfrom .. import VALUE\n")
    (package / "core.py").write_text("import os\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub import run\nVALUE = 1\n")
    graph = import_graph(package, tmp_path)
    assert graph == {
        "pkg": {"pkg.core"},
        "pkg.core": set(),
        "pkg.sub": set(),
        "pkg.sub.run": {"pkg.core", "pkg.sub.launch"},
        "pkg.sub.launch": {"pkg", "pkg.sub.run"},
    }
    assert find_cycle(graph) == ["pkg.sub.launch", "pkg.sub.run", "pkg.sub.launch"]
    (package / "sub" / "launch.py").write_text("from .. import VALUE\n")
    assert find_cycle(import_graph(package, tmp_path)) == []


def test_no_import_cycle_among_trimflows_modules() -> None:
    """A cycle makes the import order matter and ties modules that should stand apart (the launcher and `run`
    each importing the other): a module both need belongs in a third one."""
    assert find_cycle(import_graph(PACKAGE, ADDON)) == []


def layout_rows(text: str) -> dict[str, str]:
    """The module table of the Layout section: path under addon/trimflow -> its job."""
    section = text.partition("\n## Layout\n")[2].partition("\n## ")[0]
    rows = re.findall(r"^\| `([^`]+)` \| (.*?) ?\|$", section, flags=re.MULTILINE)
    return dict(rows)


def test_the_layout_reader_reads_the_module_table() -> None:
    text = (
        "# Development\n\n## Layout\n\n| module | its job |\n|---|---|\n| `_engine.py` | the pipeline |\n"
        "| `cli/_run.py` | `run`: mitmdump |\n| `formats/_base.py` |  |\n\n## Commands\n\n| `prune` | `scripts/prune` | x |\n"
    )
    assert layout_rows(text) == {"_engine.py": "the pipeline", "cli/_run.py": "`run`: mitmdump", "formats/_base.py": ""}


def test_the_layout_doc_lists_every_module_of_the_package_with_its_job() -> None:
    """docs/development.md is the map a newcomer reads first: every module in it exists, every module of the tree is
    in it, once, with its job."""
    text = LAYOUT_DOC.read_text(encoding="utf-8")
    rows = layout_rows(text)
    tree = {path.relative_to(PACKAGE).as_posix() for path in python_files(PACKAGE)}
    assert sorted(set(rows) - tree) == [], "listed in docs/development.md but not in addon/trimflow"
    assert sorted(tree - set(rows)) == [], "in addon/trimflow but not listed in docs/development.md"
    assert [path for path, job in rows.items() if not job.strip()] == []
    listed = re.findall(r"^\| `([^`]+\.py)` \|", text, flags=re.MULTILINE)
    assert len(listed) == len(set(listed)), "a module listed twice"


def test_the_package_docstring_names_every_subpackage() -> None:
    docstring = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))) or ""
    subpackages = sorted(folder.name for folder in PACKAGE.iterdir() if (folder / "__init__.py").is_file())
    assert "repair" in subpackages and "cli" in subpackages
    assert [name for name in subpackages if f"`trimflow.{name}`" not in docstring] == []


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    stack = [start]
    while stack:
        for target in graph.get(stack.pop(), ()):
            if target not in seen:
                seen.add(target)
                stack.append(target)
    return seen


def test_the_limits_and_the_rules_stand_apart_from_the_planner() -> None:
    """Reading rules needs the Limits schema, not the planner that applies it (nor, through it, the image codec)."""
    graph = import_graph(PACKAGE, ADDON)
    for module in ("trimflow._limits", "trimflow._rules"):
        assert not reachable(graph, module) & {"trimflow._policy", "trimflow._shrink", "trimflow._engine"}, module
