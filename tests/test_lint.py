"""ruff, configured in pyproject.toml, over the course's code: the README's test command lints too."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    beside = Path(sys.executable).with_name("ruff")          # the venv's own, installed by the test extras
    found = str(beside) if beside.exists() else shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: it comes with the test extras (pip install -e '.[test]')")
    return [found]


def test_the_code_passes_ruff():
    out = subprocess.run([*_ruff(), "check", "--no-cache", "lib", "puzzles", "solutions", "tools", "tests", "bench"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]


def test_ruff_would_catch_an_unused_import(tmp_path):
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    (tmp_path / "m.py").write_text("import os\n")
    out = subprocess.run([*_ruff(), "check", "--no-cache", "m.py"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 1 and "F401" in out.stdout
