"""A notebook opened alone, as Colab opens one: its first cell installs the course at the notebook's version and
what the host lacks; where the course is importable it does nothing. And the torch range: `import lib` refuses a
torch older than lib.real.compat.OLDEST_TORCH, saying what to do.

Colab cannot be reached from the course's machines, so the slow tests emulate it with Colab's own versions: a
virtual environment holding what tests/colab_pip_freeze.txt lists (Colab's `pip freeze` at a named commit of
googlecolab/backend-info: matplotlib 3.10.0, numpy 2.1.3, ipykernel 6.17.1, IPython 7.34.0, ipywidgets 7.7.1 and
the rest, each installed from PyPI at Colab's version), a folder holding only the notebook, and the repository
as a git remote (a bare repository in a temporary folder, its address put in place of the course's GitHub
address by git's `url.<base>.insteadOf`). What differs from Colab: the Python is the tests' own (3.11 in CI;
Colab's is 3.13), and torch is the course's 2.13.0 for the CPU, linked in (Colab's is 2.11.0+cu128, a CUDA
build for Python 3.13 that cannot be installed here; tests/test_devices.py runs the course with the names 2.11
lacks hidden). There, every notebook runs its first cell, its cells up to its first check that shows a
picture (the puzzles solved, the real cells left out) and its first widget; one notebook runs on a host that
lacks cloudpickle, which the first cell must then install.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from queue import Empty
from time import monotonic
from unittest import mock

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from nbclient.util import run_sync

import lib.real.compat
import puzzles
from lib.notebook.cells import puzzle_cells, solve
from tools import course_notebooks
from tools.hosted import DISTRIBUTION, REPOSITORY, badges, binder_url, colab_url, first_cell, missing, requirements

ROOT = Path(__file__).resolve().parents[1]
FREEZE = Path(__file__).with_name("colab_pip_freeze.txt")    # Colab's versions, and where they come from
LACKING = "cloudpickle"          # a pin Colab has: a host without it must get it from the first cell


def _first_code_cell(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    return next(c for c in nb.cells if c.cell_type == "code")


# ---- the cells and badges are stamped, and say the same as tools.hosted ------------------------------------


@pytest.mark.parametrize("path", course_notebooks(), ids=lambda p: p.stem)
def test_every_notebook_starts_with_the_badges_and_the_first_cell(path):
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[0].source == badges(path.stem), "run `python -m tools.stamp`"
    assert colab_url(path.stem) in nb.cells[0].source and binder_url(path.stem) in nb.cells[0].source
    assert _first_code_cell(nb).source == first_cell(), "run `python -m tools.stamp`"


@pytest.mark.parametrize("path", course_notebooks(), ids=lambda p: p.stem)
def test_the_first_cell_fetches_what_the_badges_open(path):
    """The notebook's engine comes from the repository and ref its Colab and Binder badges open it from."""
    nb = nbformat.read(path, as_version=4)
    repository, ref = re.search(r'"git\+(https://github\.com/[^@"]+)@([^"]+)"', _first_code_cell(nb).source).groups()
    owner_repo = repository.removeprefix("https://github.com/")
    assert f"https://colab.research.google.com/github/{owner_repo}/blob/{ref}/notebooks/{path.name})" \
        in nb.cells[0].source
    assert f"https://mybinder.org/v2/gh/{owner_repo}/{ref}?labpath=notebooks%2F{path.name})" in nb.cells[0].source


@pytest.mark.parametrize("path", course_notebooks(), ids=lambda p: p.stem)
def test_every_notebook_names_its_kernel_as_ipykernel_does(path):
    """JupyterLab rewrites a kernelspec that differs from the kernel's own, marking the notebook changed as it opens."""
    from ipykernel.kernelspec import KERNEL_NAME, get_kernel_dict

    own = get_kernel_dict()
    assert nbformat.read(path, as_version=4).metadata.kernelspec == {
        "name": KERNEL_NAME, "display_name": own["display_name"], "language": own["language"]}, "python -m tools.stamp"


def test_readme_course_map_opens_every_notebook_in_colab_and_the_course_in_binder():
    readme = (ROOT / "README.md").read_text()
    course_map = readme.split("\n## Course map", 1)[1].split("\n## ", 1)[0]
    for path in course_notebooks():
        row = next((line for line in course_map.splitlines() if line.startswith(f"| {path.stem[:2]} ")), "")
        assert colab_url(path.stem) in row, f"README's course map: no Colab badge for {path.stem}"
    assert binder_url() in course_map


def test_the_first_cell_does_nothing_where_the_course_is_importable(tmp_path, monkeypatch):
    """As under ./course lab: no fetch, no install, no import of the course, sys.path untouched."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"the first cell ran {a}"))
    path, modules = list(sys.path), set(sys.modules)
    exec(compile(first_cell(), "<first cell>", "exec"), {})
    assert sys.path == path and not list(tmp_path.iterdir())
    assert not {m for m in set(sys.modules) - modules if m.split(".")[0] in ("lib", "puzzles", "tools", "torch")}


def test_missing_names_only_the_pins_not_installed_and_never_the_hosts_server(monkeypatch):
    installed = {"torch": "2.11.0", "numpy": "1.26.4", "jupyterlab": None, "ipykernel": None}

    def version(name):
        if installed.get(name) is None:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(importlib.metadata, "version", version)
    pins = ["torch==2.13.0", "numpy==2.4.6", "cloudpickle==3.1.2", "jupyterlab==4.6.6", "ipykernel==7.4.0"]
    assert missing(pins) == ["cloudpickle==3.1.2"]        # an older torch or numpy is the host's to keep


# ---- the torch range ---------------------------------------------------------------------------------------


def test_torch_range_says_which_versions_run():
    oldest = ".".join(map(str, lib.real.compat.OLDEST_TORCH))
    pinned = lib.real.compat.PINNED_TORCH
    for version in (oldest + ".0", f"{oldest}.0a0+git1234", "2.13.0+cpu", pinned, "2.14.1", "3.0.0"):
        assert lib.real.compat.torch_problem(version) is None, version
    for version in ("2.10.1+cu121", "2.9.0", "1.13.1"):
        problem = lib.real.compat.torch_problem(version)
        assert f"needs torch {oldest} or newer" in problem and version in problem
        assert f"pip install torch=={lib.real.compat.PINNED_TORCH}" in problem and "./course lab" in problem


def test_the_pinned_torch_is_pyprojects_and_runs_here():
    assert f"torch=={lib.real.compat.PINNED_TORCH}" in requirements(ROOT / "pyproject.toml")
    lib.real.compat.require_supported_torch()          # the torch the suite runs on is in the range


def test_an_older_torch_is_refused_with_what_to_do(monkeypatch):
    import torch

    monkeypatch.setattr(torch, "__version__", "2.10.0")
    with pytest.raises(lib.real.compat.UnsupportedTorch, match=r"needs torch 2\.11 or newer.*has torch 2\.10\.0"):
        lib.real.compat.require_supported_torch()


@pytest.mark.slow
def test_import_lib_refuses_an_older_torch_before_anything_else_fails():
    code = "import torch; torch.__version__ = '2.10.0'; import lib"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("lib.real.compat.UnsupportedTorch: the course needs torch 2.11 or newer"), \
        done.stderr[-2000:]


# ---- Colab, emulated ---------------------------------------------------------------------------------------


def _git(*args: str, cwd: Path) -> None:
    subprocess.run(["git", "-c", "user.name=course", "-c", "user.email=course@localhost", *args], cwd=cwd,
                   check=True, capture_output=True)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A commit of this checkout's files, solutions too, on the branch the first cell fetches."""
    ref = colab_url("x").split("/blob/")[1].split("/")[0]
    src = tmp_path_factory.mktemp("checkout")
    for part in ("lib", "puzzles", "tools", "solutions"):
        shutil.copytree(ROOT / part, src / part, ignore=shutil.ignore_patterns("__pycache__"))
    for part in ("pyproject.toml", "README.md", "postBuild"):
        shutil.copy(ROOT / part, src)
    _git("init", "-q", "-b", ref, cwd=src)
    _git("add", "-A", cwd=src)
    _git("commit", "-q", "-m", "the course", cwd=src)
    return src


@pytest.fixture(scope="module")
def remote(checkout, tmp_path_factory) -> Path:
    """The repository as the first cell reaches it: a bare clone of `checkout`."""
    bare = tmp_path_factory.mktemp("remote") / "course.git"
    _git("clone", "-q", "--bare", str(checkout), str(bare), cwd=checkout)
    _git("config", "uploadpack.allowFilter", "true", cwd=bare)
    return bare


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def colab_pins() -> dict[str, str]:
    """Colab's versions as tests/colab_pip_freeze.txt lists them: name -> version."""
    lines = [ln for ln in FREEZE.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return {_canonical(ln.split("==")[0]): ln.split("==")[1] for ln in lines}


def _kernel(venv: Path) -> None:
    kernels = venv / "share" / "jupyter" / "kernels" / "host"
    kernels.mkdir(parents=True)
    (kernels / "kernel.json").write_text(
        '{"argv": ["%s", "-m", "ipykernel_launcher", "-f", "{connection_file}"], "display_name": "host", '
        '"language": "python"}' % (venv / "bin" / "python"))


def _site(venv: Path) -> Path:
    return next(venv.glob("lib/python*/site-packages"))


@pytest.fixture(scope="module")
def colab(tmp_path_factory) -> Path:
    """A virtual environment with Colab's versions: every line of FREEZE but torch installed by pip at its version,
    without dependencies (FREEZE lists them), and the course's torch linked in from the tests' environment."""
    venv = tmp_path_factory.mktemp("colab") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pins = [f"{name}=={version}" for name, version in colab_pins().items() if name != "torch"]
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", *pins],
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.name.split("-")[0] in ("torch", "torchgen", "functorch"):
            (_site(venv) / entry.name).symlink_to(entry)
    _kernel(venv)
    return venv


def _linked(colab: Path, venv: Path, left_out: tuple[str, ...] = ()) -> Path:
    """A virtual environment whose packages are `colab`'s, less `left_out` and less the course if it was installed
    there: a host of its own, where the first cell installs the course afresh."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    course = ("lib", "puzzles", "tools", _canonical(DISTRIBUTION).replace("-", "_"))
    for entry in _site(colab).iterdir():
        if entry.name not in course and not entry.name.startswith((*course[-1:], *left_out)):
            (_site(venv) / entry.name).symlink_to(entry.resolve())
    _kernel(venv)
    return venv


@pytest.fixture(scope="module")
def colab_host(colab, tmp_path_factory) -> Path:
    """Colab's versions, the course not installed: shared by the notebooks' runs (the first installs the course)."""
    return _linked(colab, tmp_path_factory.mktemp("colab-host") / "venv")


@pytest.fixture
def host(colab, tmp_path) -> Path:
    """Colab's versions less LACKING, the course not installed."""
    return _linked(colab, tmp_path / "host", (LACKING,))


def _host_env(host: Path, remote: Path) -> dict[str, str]:
    """The host's environment: no course on PYTHONPATH, a home of its own, the course's address leading to `remote`."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "JUPYTER_PATH", "COURSE_STRICT")}
    env.update(HOME=str(host.parent / "home"), MPLBACKEND="Agg", JUPYTER_PATH=str(host / "share" / "jupyter"),
               GIT_CONFIG_COUNT="1", GIT_CONFIG_KEY_0=f"url.file://{remote}.insteadOf", GIT_CONFIG_VALUE_0=REPOSITORY)
    return env


class _Client(NotebookClient):
    """nbclient waits for a cell's reply in one poll of the cell's whole timeout. A wake-up that pyzmq's asyncio
    poller misses then costs all of it: the reply sits unread until the timeout's last look finds it (seen in CI:
    notebooks 03, 05 and 06 waited 600 s after their widget cell, their kernels idle). Polling in slices of a few
    seconds reads such a message within one slice."""

    SLICE_S = 5.0

    async def async_start_new_kernel_client(self):
        kc = await super().async_start_new_kernel_client()
        for channel in (kc.shell_channel, kc.iopub_channel):
            channel.get_msg = _in_slices(channel.get_msg, self.SLICE_S)
        return kc

    # setup_kernel calls this one: nbclient binds it to its own async_start_new_kernel_client, not to an override
    start_new_kernel_client = run_sync(async_start_new_kernel_client)


def _in_slices(get_msg, slice_s: float):
    """get_msg(timeout) as polls of at most `slice_s` seconds each, raising Empty only once `timeout` is spent."""
    async def get(timeout=None):
        deadline = None if timeout is None else monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - monotonic())
            try:
                return await get_msg(timeout=slice_s if left is None else min(slice_s, left))
            except Empty:
                if left is not None and left <= slice_s:
                    raise
    return get


def _run_hosted(nb: nbformat.NotebookNode, folder: Path, host: Path, remote: Path) -> nbformat.NotebookNode:
    """Execute `nb` in `folder` with the host's kernel, the course's address leading to `remote`."""
    env = _host_env(host, remote)
    with mock.patch.dict(os.environ, JUPYTER_PATH=env["JUPYTER_PATH"]):   # where jupyter_client finds the kernel
        client = _Client(nb, kernel_name="host", timeout=600, resources={"metadata": {"path": str(folder)}})
        client.execute(env=env, cwd=str(folder))
    return nb


def _text(cell: nbformat.NotebookNode) -> str:
    """What a cell showed: printed text, results, and an error's name and message (without the colours)."""
    return "".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
                   + (f"{o.ename}: {o.evalue}" if o.output_type == "error" else "") for o in cell.get("outputs", []))


@pytest.mark.slow
def test_a_notebook_opened_alone_installs_the_course_and_what_the_host_lacks_then_runs_a_check_and_real_cell(
        tmp_path, host, remote):
    import solutions.data_parallel as S

    path = ROOT / "notebooks" / "02_data_parallel.ipynb"
    nb = solve(nbformat.read(path, as_version=4), S)
    real = next(i for i, c in enumerate(nb.cells) if "real" in c.metadata.get("tags", []))
    name = next(iter(puzzle_cells(nb)))
    assert f"P.{name}.real(" in nb.cells[real].source
    nb.cells = nb.cells[:real + 1]                   # up to the first puzzle's real cell, solved
    folder = tmp_path / "content"                    # Colab's working directory: the notebook alone
    folder.mkdir()
    nbformat.write(nb, folder / path.name)
    done = _run_hosted(nb, folder, host, remote)
    first = _first_code_cell(done)
    assert f"installing what this machine lacks: {LACKING}==" in _text(first)
    assert f"course: {DISTRIBUTION} 0.1.0 from {REPOSITORY} (commit " in _text(first), _text(first)
    installed = {p.name for p in _site(host).iterdir() if not p.is_symlink()}
    assert {"lib", "puzzles", "tools"} <= installed and "solutions" not in installed     # never the answer key
    check = next(c for c in done.cells if "check" in c.metadata.get("tags", []))
    assert f"✓ {name} is correct" in _text(check), _text(check)
    assert "✓" in _text(done.cells[real]) and "Error" not in _text(done.cells[real]), _text(done.cells[real])


@pytest.mark.slow
def test_a_notebook_opened_alone_with_an_older_torch_says_what_to_do_in_its_first_cell(tmp_path, host, remote):
    nb = nbformat.read(ROOT / "notebooks" / "02_data_parallel.ipynb", as_version=4)
    older = nbformat.v4.new_code_cell("import torch\ntorch.__version__ = '2.10.0'  # the host's torch, emulated")
    nb.cells = [older, _first_code_cell(nb)]
    folder = tmp_path / "content"
    folder.mkdir()
    with pytest.raises(CellExecutionError):
        _run_hosted(nb, folder, host, remote)
    said = _text(nb.cells[1])
    assert "UnsupportedTorch: the course needs torch 2.11 or newer" in said and "has torch 2.10.0" in said, said
    assert "%pip install torch==" in said and "Restart session" in said


@pytest.mark.slow
def test_binder_installs_the_checkout_and_the_first_cell_then_does_nothing(checkout, host, remote):
    """Binder's way: repo2docker runs postBuild in the repository, then JupyterLab opens notebooks/."""
    env = _host_env(host, remote)
    env["PATH"] = f"{host / 'bin'}{os.pathsep}{env['PATH']}"
    built = subprocess.run(["bash", "postBuild"], cwd=checkout, capture_output=True, text=True, timeout=600, env=env)
    assert built.returncode == 0, built.stderr[-3000:]
    folder = checkout / "notebooks"
    folder.mkdir(exist_ok=True)
    code = first_cell() + "\nimport puzzles; print(puzzles.__file__)"
    done = subprocess.run([str(host / "bin" / "python"), "-c", code], cwd=folder, capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == f"{checkout / 'puzzles' / '__init__.py'}\n"       # nothing fetched, nothing said


def _outputs(cell: nbformat.NotebookNode, kind: str) -> list:
    return [o for o in cell.get("outputs", []) if kind in o.get("data", {})]


@pytest.mark.slow
@pytest.mark.parametrize("path", course_notebooks(), ids=lambda p: p.stem)
def test_every_notebook_runs_on_colabs_versions(path, tmp_path, colab_host, remote):
    """The first cell, the cells up to the first check that shows a picture (puzzles solved, real cells left out),
    and the first widget, in one kernel on Colab's versions: an error in any of them fails the test."""
    module = next(m for m in puzzles.MODULES if m.NOTEBOOK == path.stem)
    solutions = importlib.import_module(f"solutions.{module.__name__.split('.')[-1]}")
    nb = solve(nbformat.read(path, as_version=4), solutions)
    folder = tmp_path / "content"
    folder.mkdir()
    env = _host_env(colab_host, remote)
    pictured = checked = None
    with mock.patch.dict(os.environ, JUPYTER_PATH=env["JUPYTER_PATH"]):
        client = _Client(nb, kernel_name="host", timeout=600, resources={"metadata": {"path": str(folder)}})
        with client.setup_kernel(env=env, cwd=str(folder)):
            for index, cell in enumerate(nb.cells):
                tags = cell.metadata.get("tags", [])
                if cell.cell_type != "code" or "real" in tags or "widget" in tags:
                    continue
                client.execute_cell(cell, index)
                errors = [o for o in cell.outputs if o.output_type == "error" or "Traceback" in o.get("text", "")]
                # IPython shows an error raised while displaying a picture, and the cell still ends "ok": nbclient
                # raises only for the latter, so the outputs are read too.
                assert not errors, f"cell {index} of {path.name}:\n{_text(cell)[-3000:]}"
                if "check" in tags:
                    checked = cell
                    if _outputs(cell, "image/png"):
                        pictured = cell
                        break
            widget = next(i for i, c in enumerate(nb.cells) if "widget" in c.metadata.get("tags", []))
            client.execute_cell(nb.cells[widget], widget)
    assert pictured is not None, f"no check of {path.name} showed a picture; the last: {checked and checked.outputs}"
    assert "✓" in _text(pictured), _text(pictured)
    assert _outputs(nb.cells[widget], "application/vnd.jupyter.widget-view+json"), nb.cells[widget].outputs
    versions = subprocess.run([str(colab_host / "bin" / "python"), "-c", "import matplotlib, numpy, ipywidgets, "
                               "ipykernel; print(matplotlib.__version__, numpy.__version__, ipywidgets.__version__, "
                               "ipykernel.__version__)"], capture_output=True, text=True, env=env).stdout.split()
    pins = colab_pins()
    assert versions == [pins["matplotlib"], pins["numpy"], pins["ipywidgets"], pins["ipykernel"]]
