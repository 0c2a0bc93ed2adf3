"""The install story holds together: equal pins everywhere, and README, ./course and CI agree."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pip ships the same parser
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(requirements: list[str], where: str) -> dict[str, str]:
    """Map normalised name -> version; every requirement must be an exact `name==version`."""
    pins: dict[str, str] = {}
    for req in requirements:
        m = PIN.match(req.strip())
        assert m, f"{where}: {req!r} is not pinned as name==version"
        name = _name(m.group(1))
        assert name not in pins, f"{where}: {name} is listed twice"
        pins[name] = m.group(2)
    return pins


CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def pyproject_pins(extras: bool = True) -> dict[str, str]:
    """The pins of pyproject.toml: the dependencies, and with `extras` the optional ones (the test tools)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values() if extras else ():
        reqs += extra
    return _pins(reqs, "pyproject.toml")


def environment_pip_lines() -> list[str]:
    """The lines of environment.yml's `pip:` list, `- ` taken off (no YAML library needed)."""
    reqs: list[str] = []
    pip_indent = None
    for line in (ROOT / "environment.yml").read_text().splitlines():
        text = line.split("#", 1)[0].rstrip()
        if not text.strip():
            continue
        indent = len(text) - len(text.lstrip())
        if text.strip() == "- pip:":
            pip_indent = indent
        elif pip_indent is not None:
            if indent <= pip_indent:
                pip_indent = None
            else:
                assert text.strip().startswith("- "), f"environment.yml: unexpected line {line!r}"
                reqs.append(text.strip()[2:])
    assert reqs, "environment.yml has no pip: list"
    return reqs


def environment_pins() -> dict[str, str]:
    """The `- name==version` lines of environment.yml's `pip:` list (its pip options left out)."""
    return _pins([r for r in environment_pip_lines() if not r.startswith("-")], "environment.yml")


def readme_start_commands() -> list[str]:
    """The commands of the first code block under README's `## Start`, comments stripped."""
    readme = (ROOT / "README.md").read_text()
    start = readme.split("\n## Start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```[a-z]*\n(.*?)```", start, re.S)
    assert block, "README's Start section has no code block"
    return [ln.split("#", 1)[0].strip() for ln in block.group(1).splitlines() if ln.strip()]


def test_environment_yml_pins_are_pyprojects_dependencies_without_the_test_tools():
    """Binder's image (environment.yml) holds what a learner uses, at the course's versions."""
    assert environment_pins() == pyproject_pins(extras=False)
    assert not set(environment_pins()) & {"nbgrader", "playwright", "ruff", "pytest"}


def test_environment_yml_takes_torchs_cpu_build():
    """PyPI's torch for Linux is the CUDA build (about 4.6 GiB); PyTorch's CPU index has the CPU build of the same
    version (2.13.0+cpu, which pip prefers to 2.13.0 for `torch==2.13.0`)."""
    assert f"--extra-index-url {CPU_INDEX}" in environment_pip_lines()


def test_environment_yml_python_is_311():
    assert "- python=3.11\n" in (ROOT / "environment.yml").read_text()


def test_torch_pinned_to_2_13_0_in_both():
    assert pyproject_pins()["torch"] == "2.13.0"
    assert environment_pins()["torch"] == "2.13.0"


def test_readme_start_has_the_two_commands():
    assert readme_start_commands() == ["./course lab", "./course test"]


def test_ci_runs_the_readme_test_command():
    test_cmd = [c for c in readme_start_commands() if c.startswith("./course test")]
    assert test_cmd == ["./course test"]
    ci_lines = [ln.split("#", 1)[0].strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_cmd[0] in ci_lines, ".ci/run does not run the README's test command as a line of its own"


def test_scripts_are_executable_and_parse():
    assert os.access(ROOT / "course", os.X_OK), "./course is not executable"
    for script in ("course", ".ci/run"):
        res = subprocess.run(["bash", "-n", str(ROOT / script)], capture_output=True, text=True)
        assert res.returncode == 0, f"bash -n {script}: {res.stderr}"


def test_course_without_a_command_prints_usage():
    res = subprocess.run([str(ROOT / "course")], capture_output=True, text=True, timeout=30)
    assert res.returncode == 2
    assert "./course lab" in res.stderr and "./course test" in res.stderr


def test_the_suite_says_why_it_skipped_a_test(tmp_path):
    """The README promises "skipped, with a note": pytest's summary shows each skip's reason (addopts' -rs)."""
    (tmp_path / "test_skip.py").write_text("import pytest\n\n\ndef test_a():\n    pytest.skip('no Chromium here')\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir",
                           str(tmp_path), "-p", "no:cacheprovider", "-n", "0", str(tmp_path / "test_skip.py")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert "SKIPPED [1] test_skip.py:5: no Chromium here" in done.stdout, done.stdout[-2000:]
