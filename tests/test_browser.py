"""End to end in a real JupyterLab and a real browser: what a learner does, done by headless Chromium.

The other notebook tests run cells through nbclient, which never renders anything. This one starts
JupyterLab, opens notebook 02 (solved) in Chromium driven by Playwright, runs a puzzle's check cell
and reads its verdict from the page, moves a slider of the collective cost explorer and sees the
figure redrawn, and keeps screenshots of both.

It needs Chromium (Debian: `apt-get install chromium`; .ci/run installs it) and the `playwright`
package (a test extra), but not Playwright's own browsers: `playwright install` is never run.
Without them the test fails in CI (`$CI` set) and skips elsewhere.

Screenshots go to the test's tmp dir, and to `$TEST_ARTIFACTS` when that is set (.ci/run sets it).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import NamedTuple

import nbformat
import pytest

from lib.notebook.cells import solve

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "02_data_parallel.ipynb"
CHROMIUM_ARGS = [
    "--no-sandbox",                      # as root, Chromium refuses to start with its sandbox
    "--disable-gpu",
    # No traffic of its own: on a closed network those connections are refused and only slow things.
    "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update",
    "--disable-sync",
]
# A cell's input prompt once the kernel has run it: "[7]:" (while running "[*]:", never run "[ ]:").
RAN = re.compile(r"^\[\d+\]:$")
# The status bar's kernel item once a kernel is connected and idle: "Python 3 (ipykernel) | Idle".
KERNEL_IDLE = re.compile(r"^(?!No Kernel).+ \| Idle$")


def _unavailable(reason: str) -> None:
    """A missing browser or Playwright fails the test in CI and skips it on a developer's machine."""
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI is set, so this is a failure, not a skip)", pytrace=False)
    pytest.skip(reason)


def find_chromium() -> str | None:
    """$CHROMIUM, else `chromium` / `chromium-browser` on PATH, else Debian's /usr/bin/chromium."""
    for candidate in (os.environ.get("CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser"),
                      "/usr/bin/chromium"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port() -> int:
    """A port nothing listens on now. JupyterLab gets port_retries=0, so losing a race fails loudly."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.25):
    """Poll `predicate` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def _get(url: str, method: str = "GET") -> bytes | None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=5) as r:
            return r.read()
    except OSError:
        return None


def write_settings(settings_dir: Path) -> None:
    """JupyterLab user settings for a test: every cell in the DOM, no news or update pop-ups.

    By default JupyterLab 4 virtualises long notebooks (windowing), so cells far down the page may not
    be rendered until scrolled to; 'none' attaches them all and locators find them."""
    for plugin, values in {
        "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
        "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    }.items():
        path = settings_dir / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


def _processes_with(marker: str) -> list[int]:
    """Pids whose environment holds `marker` (the server and everything it started). Linux only."""
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:                   # gone meanwhile, or not ours to read
            pass
    return [pid for pid in pids if pid != os.getpid()]


def start_lab(root_dir: Path, work: Path) -> tuple[subprocess.Popen, str, str]:
    """Start JupyterLab on root_dir; return (process, base URL, token) once /api/status answers.

    The server runs `sys.executable`, so its kernels import this checkout's `lib` and `puzzles` (also
    put on PYTHONPATH, for runs without the editable install). Jupyter's config, data, runtime and
    IPython dirs point into `work`, so a developer's own settings and kernels play no part, and
    MPLBACKEND is unset so that the kernel draws inline figures as a learner's would."""
    port, token = free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               JUPYTER_CONFIG_DIR=str(work / "config"), JUPYTER_DATA_DIR=str(work / "data"),
               JUPYTER_RUNTIME_DIR=str(work / "runtime"), IPYTHONDIR=str(work / "ipython"),
               COURSE_BROWSER_TEST=token)  # the marker teardown looks for
    write_settings(work / "settings")
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
           f"--ServerApp.port={port}", "--ServerApp.port_retries=0", f"--ServerApp.token={token}",
           f"--ServerApp.root_dir={root_dir}", f"--LabApp.user_settings_dir={work / 'settings'}",
           f"--LabApp.workspaces_dir={work / 'workspaces'}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(work / "jupyterlab.log", "w")
    proc = subprocess.Popen(cmd, env=env, cwd=root_dir, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    log.close()
    base = f"http://127.0.0.1:{port}"

    def up():
        if proc.poll() is not None:
            raise AssertionError(f"JupyterLab exited with {proc.returncode}:\n{lab_log(work)}")
        return _get(f"{base}/api/status?token={token}")

    try:
        wait_for(up, 90, "JupyterLab's /api/status")
    except BaseException:
        stop_lab(proc, base, token)
        raise
    return proc, base, token


def stop_lab(proc: subprocess.Popen, base: str, token: str) -> None:
    """Shut JupyterLab down and leave nothing behind.

    Kernels run in sessions of their own, so killing the server's process group would not reach
    them: first ask the server to shut down (it stops its kernels), then kill what is left of the
    server's group, then any process that still carries the server's environment marker."""
    if proc.poll() is None:
        _get(f"{base}/api/shutdown?token={token}", method="POST")
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    if Path("/proc").is_dir():
        for pid in _processes_with(f"COURSE_BROWSER_TEST={token}"):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def lab_log(work: Path, chars: int = 3000) -> str:
    try:
        return (work / "jupyterlab.log").read_text()[-chars:]
    except OSError:
        return "(no log)"


class Lab(NamedTuple):
    notebook_url: str   # the notebook in JupyterLab, token included
    cells: int          # how many cells the notebook has
    work: Path          # JupyterLab's settings, runtime files and log


@pytest.fixture
def lab(tmp_path):
    """A running JupyterLab whose root holds notebook 02 with every puzzle solved."""
    root_dir, work = tmp_path / "notebooks", tmp_path / "jupyter"
    root_dir.mkdir()
    work.mkdir()
    solutions = importlib.import_module("solutions.data_parallel")
    solved = solve(nbformat.read(ROOT / "notebooks" / NOTEBOOK, as_version=4), solutions)
    nbformat.write(solved, root_dir / NOTEBOOK)
    proc, base, token = start_lab(root_dir, work)
    try:
        yield Lab(f"{base}/lab/tree/{NOTEBOOK}?token={token}", len(solved.cells), work)
    finally:
        stop_lab(proc, base, token)


# --- driving the notebook page ----------------------------------------------------------------


def code_cell(page, first_line: str):
    """The one code cell whose source contains `first_line` (a line near its top: CodeMirror
    renders only the lines it shows, and short cells show all of theirs)."""
    cell = page.locator(".jp-Notebook .jp-CodeCell").filter(
        has=page.locator(".jp-InputArea-editor", has_text=first_line))
    assert cell.count() == 1, f"expected one code cell containing {first_line!r}, found {cell.count()}"
    return cell


def run_cell_containing(page, first_line: str, timeout: float = 60):
    """Select the code cell containing `first_line`, run it with Ctrl+Enter, wait until the kernel has run it.

    Clicking the input prompt selects the cell in command mode, where Ctrl+Enter is "run selected
    cell, stay on it". Done when the prompt shows a new execution count ("[*]:" while it runs)."""
    cell = code_cell(page, first_line)
    prompt = cell.locator(".jp-InputPrompt")
    before = prompt.inner_text().strip()
    cell.scroll_into_view_if_needed()
    prompt.click()
    page.keyboard.press("Control+Enter")

    def ran():
        now = prompt.inner_text().strip()
        return RAN.match(now) and now != before

    wait_for(ran, timeout, f"the cell {first_line!r} to run (prompt still {prompt.inner_text().strip()!r})")
    return cell


def open_notebook(page, url: str, cells: int, timeout: float = 90) -> None:
    """Load the notebook page; return once all `cells` cells are on it and its kernel is idle.

    Neither the first cell nor the toolbar's kernel indicator is enough: JupyterLab first shows a
    one-cell placeholder, and the indicator says "idle" before any kernel exists. The status bar goes
    "No Kernel | Initializing", "Python 3 (ipykernel) | Initializing", Connecting, Busy, then Idle."""
    page.goto(url)
    wait_for(lambda: page.locator(".jp-Notebook .jp-Cell").count() == cells, timeout,
             f"the notebook's {cells} cells to be on the page")
    page.locator(".jp-StatusBar-TextItem").filter(has_text=KERNEL_IDLE).first.wait_for(timeout=timeout * 1000)


def save_artifact(path: Path) -> Path:
    """Copy a screenshot to $TEST_ARTIFACTS when set (CI keeps that folder); return where it lies."""
    dest = os.environ.get("TEST_ARTIFACTS")
    if not dest:
        return path
    Path(dest).mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy2(path, Path(dest) / path.name))


# --- the test ----------------------------------------------------------------------------------


@pytest.fixture
def chromium() -> str:
    """Chromium's path, once Chromium and Playwright are known to be there (before JupyterLab starts)."""
    path = find_chromium()
    if path is None:
        _unavailable("no Chromium (install it: apt-get install chromium; or set $CHROMIUM to its path)")
    try:
        importlib.import_module("playwright.sync_api")
        problem = None
    except ImportError as e:
        problem = f"playwright is not importable ({e}); it is in the test extra: pip install -e '.[test]'"
    if problem:                           # outside the except: no chained traceback in the report
        _unavailable(problem)
    return path


@pytest.mark.slow
def test_check_cell_and_widget_in_real_jupyterlab(chromium, lab, tmp_path):
    """`chromium` comes first: without a browser, the test stops before JupyterLab starts."""
    from playwright.sync_api import sync_playwright

    shots = tmp_path / "screenshots"
    shots.mkdir()
    saved: list[Path] = []
    start, timings = time.monotonic(), []

    def screenshot(page, name: str) -> None:
        path = shots / f"{name}.png"
        page.screenshot(path=str(path))
        saved.append(save_artifact(path))

    def lap(what: str) -> None:
        timings.append(f"{what} at {time.monotonic() - start:.1f}s")

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(60_000)
        try:
            open_notebook(page, lab.notebook_url, lab.cells)
            lap("notebook open, kernel idle")

            # A check cell: the imports, the three ring puzzles (ring_all_reduce calls the other two),
            # then the check. The real cells in between start processes; test_notebooks runs those.
            for first_line in ("import torch.nn.functional as F", "def ring_reduce_scatter(dist, x):",
                               "def ring_all_gather(dist, chunk):", "def ring_all_reduce(dist, x):"):
                run_cell_containing(page, first_line)
            check = run_cell_containing(page, "P.ring_all_reduce.check(ring_all_reduce);", timeout=90)
            verdict = check.locator(".jp-OutputArea-output").first
            verdict.wait_for()
            assert "✓ ring_all_reduce is correct" in verdict.inner_text(), verdict.inner_text()
            lap("check cell passed")
            check.scroll_into_view_if_needed()
            screenshot(page, "1-check-cell-passed")

            # The collective cost explorer: move the N slider one notch with the keyboard.
            explorer = run_cell_containing(page, "collective_cost_explorer()", timeout=90)
            figure = explorer.locator(".widget-output img")
            readout = explorer.locator(".widget-output pre").last
            figure.wait_for()
            before_src, before_text = figure.get_attribute("src"), readout.inner_text()
            assert "over 8 ranks" in before_text, before_text
            lap("explorer drawn")
            explorer.scroll_into_view_if_needed()
            screenshot(page, "2-explorer-before")
            handle = explorer.locator(".widget-slider").filter(has_text="N (ranks)").locator(".noUi-handle")
            handle.focus()
            page.keyboard.press("ArrowRight")     # RANKS: ..., 6, 8, 12, 16, ...
            wait_for(lambda: "over 12 ranks" in readout.inner_text(), 30,
                     "the explorer's readout to say 12 ranks")
            wait_for(lambda: figure.get_attribute("src") not in (None, before_src), 30,
                     "the explorer's figure to be redrawn")
            lap("explorer redrawn for N=12")
            explorer.scroll_into_view_if_needed()
            screenshot(page, "3-explorer-after-slider")
        except BaseException:
            failure = shots / "failure.png"
            try:
                page.screenshot(path=str(failure))
                saved.append(save_artifact(failure))
            except Exception as e:            # keep the original error, not this one
                print(f"no failure screenshot: {e}")
            print(f"JupyterLab log (end):\n{lab_log(lab.work)}")
            raise
        finally:
            print("timings:", *timings, sep="\n  ")
            print("screenshots:", *saved, sep="\n  ")
            browser.close()
