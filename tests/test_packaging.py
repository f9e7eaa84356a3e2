"""The built package carries the shipped rules and finds them, away from any checkout."""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from PIL import Image

import trimflow
from trimflow import _limit_profiles
from trimflow._policy import count_pruned
from trimflow._rules_file import load_rules

ROOT = Path(__file__).resolve().parents[1]


def test_a_checkout_reads_the_documented_rules_folder() -> None:
    assert (ROOT / "addon" / "trimflow" / "rules").resolve() == ROOT / "rules"
    assert trimflow.DEFAULT_RULES_PATH == ROOT / "rules" / "default.yaml"
    assert _limit_profiles.DEFAULT_PROFILES_PATH == ROOT / "rules" / "profiles.yaml"


def _ten_images_body() -> bytes:
    parts = []
    for i in range(10):
        out = io.BytesIO()
        Image.new("RGB", (8 + i, 8), (i * 20, 0, 0)).save(out, "PNG")
        url = "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": parts}]}).encode()


def test_the_wheel_ships_the_rules_and_prunes_with_them_from_an_empty_folder(tmp_path: Path) -> None:
    source = tmp_path / "source"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("addon", "rules"):
        shutil.copytree(ROOT / name, source / name, symlinks=True, ignore=skip)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(tmp_path / "dist"), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = (tmp_path / "dist").glob("trimflow-*.whl")
    installed = tmp_path / "installed"
    with zipfile.ZipFile(wheel) as archive:
        for name in ("default.yaml", "profiles.yaml", "examples/vllm.yaml"):
            assert archive.read(f"trimflow/rules/{name}") == (ROOT / "rules" / name).read_bytes()
        assert "trimflow/py.typed" in archive.namelist()  # type checkers read the package's annotations (PEP 561)
        archive.extractall(installed)

    empty = tmp_path / "empty"
    empty.mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "trimflow", "prune", "--url", "https://api.openai.com/v1/chat/completions"],
        input=_ten_images_body(),
        capture_output=True,
        cwd=empty,
        env={"PYTHONPATH": str(installed)},
        check=True,
    )
    record = json.loads(run.stderr.decode().strip().splitlines()[-1])
    limits = load_rules(ROOT / "rules" / "default.yaml").limits_for("api.openai.com", "/v1/chat/completions", "gpt-4o")
    assert (record["rule"], record["images_before"], record["images_after"]) == (limits.rule, 10, 10 - count_pruned(10, limits.at_low_water()))
    where = subprocess.run(
        [sys.executable, "-c", "import trimflow; print(trimflow.DEFAULT_RULES_PATH)"],
        capture_output=True,
        cwd=empty,
        env={"PYTHONPATH": str(installed)},
        check=True,
        text=True,
    )
    assert Path(where.stdout.strip()) == installed / "trimflow" / "rules" / "default.yaml"
