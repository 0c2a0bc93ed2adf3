"""Real ranks: run an SPMD function in N processes with torch.distributed initialised.

`launch(fn, 4)` calls `fn(torch.distributed)` in 4 processes (gloo on CPU, NCCL with one GPU per rank)
and returns the results by rank. It is made for notebook cells: functions defined in a cell work, each
rank's output comes back labelled `[rank r]`, a failing rank raises RankFailed with its traceback, a hang
ends in LaunchError after `timeout` seconds, and no process outlives the call.

When a rank dies, real torch.distributed does not go on without it: its process group is broken (gloo raises
"Connection closed by peer" in the peers' next collective, NCCL waits until its timeout), a new group needs every
process of the old one, and torchrun (TorchElastic) restarts the whole job from its last checkpoint. So here too a
rank that fails ends the launch; the simulator injects faults a program can survive (`lib.sim.run(...,
faults=...)`), and lib.real.faults emulates them on real processes for the puzzle that needs it.
"""

from __future__ import annotations

import datetime
import faulthandler
import linecache
import os
import pickle
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.parallel  # noqa: F401  (imported before forking so ranks inherit it instead of each paying ~2 s)

from lib.real.backends import nccl_shortfall, visible_gpus
from lib.real.compat import supply_newer_names
from lib.errors import LaunchError, RankFailed
from lib.whose_code import ENGINE

__all__ = ["launch", "current_backend"]

# Messages a rank sees when a peer died or closed its connections: consequences, never the root cause.
_CONSEQUENCE = re.compile(
    r"connection closed by peer|connection reset by peer|broken pipe|socket closed|"
    r"connection refused|ECONNRESET|EPIPE|failed to pass monitoredBarrier|received errors while waiting",
    re.IGNORECASE,
)
# TORCH_DISTRIBUTED_DEBUG=DETAIL describes each side of a mismatch as a CollectiveFingerPrint(...).
_FINGERPRINT = re.compile(r"Rank (\d+) is running collective: CollectiveFingerPrint\(.*?OpType=(\w+), "
                          r"TensorShape=\[([^\]]*)\], TensorDtypes=(\w+)")
_OP_NAMES = {"ALLREDUCE": "all_reduce", "ALLGATHER": "all_gather", "_ALLGATHER_BASE": "all_gather_into_tensor",
             "REDUCE_SCATTER": "reduce_scatter", "_REDUCE_SCATTER_BASE": "reduce_scatter_tensor",
             "ALLTOALL": "all_to_all", "ALLTOALL_BASE": "all_to_all_single"}
_TERMINATE_GRACE_S = 0.5  # after SIGTERM, how long ranks get before SIGKILL
_ROOT_CAUSE_WAIT_S = 0.5  # after a "peer closed" failure, how long to wait for the rank that caused it


def current_backend() -> str | None:
    """The backend of this process's default process group ("gloo", "nccl"), or None if there is none."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    return str(dist.get_backend())


def launch(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    backend: str | None = None,
    timeout: float = 60.0,
    start_method: str | None = None,
    debug: bool = False,
    **kwargs: Any,
) -> list:
    """Run `fn(torch.distributed, *args, **kwargs)` on `world_size` real ranks; return the results by rank.

    backend: "gloo" or "nccl"; by default NCCL when there is one GPU per rank, else gloo.
    timeout: seconds for the whole run; past it every rank is stopped and LaunchError says who was stuck.
    start_method: "fork" (fast, the default for gloo on Linux) or "spawn" (fresh interpreters; fn and args
    travel with cloudpickle, so notebook-defined functions still work).
    debug: set TORCH_DISTRIBUTED_DEBUG=DETAIL so mismatched collectives raise instead of returning garbage.
    Off by default: DETAIL counts point-to-point calls in its collective sequence numbers, so it rejects
    correct programs whose ranks send different numbers of messages (a parameter server, a pipeline).
    These four names are launch's own; every other keyword goes to fn.
    """
    if not callable(fn):
        raise LaunchError(f"launch needs a function to run on every rank, got {type(fn).__name__}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise LaunchError(f"world_size must be a whole number of ranks, at least 1; got {world_size!r}")
    if not timeout > 0:
        raise LaunchError(f"timeout is in seconds and must be positive; got {timeout!r}")
    backend = _pick_backend(world_size, backend)
    method = _pick_start_method(backend, start_method)

    workdir = tempfile.mkdtemp(prefix="lib-launch-")
    # A fresh file:// rendezvous per launch: no port to pick, and two launches can never meet.
    job = _Job(world_size, backend, Path(workdir, "rendezvous").as_uri(), float(timeout), debug, workdir)
    ranks: list[_Rank] = []
    try:
        if method == "fork":
            _fork_ranks(job, fn, args, kwargs, ranks)
        else:
            _spawn_ranks(job, fn, args, kwargs, ranks)
        outcome = _supervise(job, ranks)
        if isinstance(outcome, Exception):
            raise outcome  # from here, so the caller's traceback stays one frame deep in this module
        return outcome
    finally:
        # Also reached on KeyboardInterrupt (the notebook's stop button): nothing may outlive the call,
        # not even when the button is pressed again while we clean up.
        while True:
            try:
                _stop(ranks)
                break
            except KeyboardInterrupt:
                continue
        for r in ranks:
            _drain(r)
            os.close(r.fd)
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class _Job:
    world_size: int
    backend: str
    init_method: str
    timeout: float
    debug: bool
    workdir: str

    def path(self, kind: str, rank: int) -> str:
        return os.path.join(self.workdir, f"{kind}-{rank}")


@dataclass
class _Rank:
    """The parent's view of one rank: its process, its output pipe, and how it ended."""

    rank: int
    pid: int
    fd: int
    popen: subprocess.Popen | None = None
    returncode: int | None = None
    ended_at: float = 0.0
    stopped_by_us: bool = False
    partial: bytes = b""
    eof: bool = False
    report: tuple | None = field(default=None, repr=False)

    def poll(self) -> int | None:
        """The exit code once the process has ended (minus the signal number if killed), else None."""
        if self.returncode is not None:
            return self.returncode
        if self.popen is not None:
            code = self.popen.poll()
        else:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by someone else: the report file says how it went
                pid, status = self.pid, 0
            code = os.waitstatus_to_exitcode(status) if pid else None
        if code is not None:
            self.returncode, self.ended_at = code, time.time()
        return code

    def send(self, sig: int) -> None:
        """Signal the rank's whole session, so processes the rank started go too."""
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError, AttributeError):
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass


def _pick_backend(world_size: int, backend: str | None) -> str:
    """NCCL when every rank can have a GPU of its own, else gloo; an impossible request is refused here,
    before any process starts (NCCL would fail later, deep inside, with "Duplicate GPU detected")."""
    gpus = visible_gpus()
    if backend is None:
        return "nccl" if gpus >= world_size else "gloo"
    if backend not in ("gloo", "nccl"):
        raise LaunchError(f"unknown backend {backend!r}: use 'gloo' (CPU) or 'nccl' (one GPU per rank)")
    shortfall = nccl_shortfall(world_size, gpus) if backend == "nccl" else None
    if shortfall:
        on_nccl = f", or ask for world_size={gpus} or less to run on NCCL" if gpus else ""
        raise LaunchError(f"NCCL cannot run {world_size} ranks here: {shortfall}. world_size={world_size} runs on "
                          f"gloo: pass backend='gloo' (or leave backend out){on_nccl}.")
    return backend


def _pick_start_method(backend: str, start_method: str | None) -> str:
    """fork for gloo on Linux where no GPU is visible (fast); spawn otherwise. Where a GPU is visible, a process's
    first backward starts autograd's threads for the devices (even on CPU tensors: a notebook's simulated check
    does), and a forked rank's backward then fails ("Unable to handle autograd's threading in combination with
    fork-based multiprocessing"; seen on an H200 with torch 2.11)."""
    can_fork = sys.platform.startswith("linux")  # on macOS, fork breaks system frameworks
    if start_method is None:
        return "fork" if can_fork and backend == "gloo" and not visible_gpus() else "spawn"
    if start_method not in ("fork", "spawn"):
        raise LaunchError(f"unknown start_method {start_method!r}: use 'fork' or 'spawn'")
    if start_method == "fork" and not can_fork:
        raise LaunchError(f"start_method='fork' is not safe on {sys.platform}; use start_method='spawn'")
    if start_method == "fork" and backend == "nccl":
        raise LaunchError("CUDA does not survive fork: NCCL ranks need start_method='spawn' (the default)")
    return start_method


# ---- starting ranks -------------------------------------------------------------------------------


def _fork_ranks(job: _Job, fn: Callable, args: tuple, kwargs: dict, ranks: list[_Rank]) -> None:
    parent = os.getpid()
    for rank in range(job.world_size):
        read_fd, write_fd = os.pipe()
        try:
            with warnings.catch_warnings():
                # Python 3.12+ warns on every fork from a threaded process; the child guards against the
                # known deadlocks (a fresh stdout, a one-thread torch pool) and touches no other lock.
                warnings.filterwarnings("ignore", "This process .* is multi-threaded", DeprecationWarning)
                pid = os.fork()
        except BaseException:
            os.close(read_fd)
            os.close(write_fd)
            raise
        if pid == 0:
            try:
                for r in ranks:  # the pipes of ranks started before this one are not ours
                    os.close(r.fd)
                os.close(read_fd)
                _become_rank(parent, write_fd)
                _rank_main(job, rank, fn, args, kwargs)
            finally:
                os._exit(1)
        ranks.append(_Rank(rank, pid, read_fd))  # first, so that a KeyboardInterrupt now still reaps it
        os.close(write_fd)
        os.set_blocking(read_fd, False)


def _spawn_ranks(job: _Job, fn: Callable, args: tuple, kwargs: dict, ranks: list[_Rank]) -> None:
    import cloudpickle  # only this path needs it: it pickles notebook functions by value

    try:
        payload = cloudpickle.dumps((fn, args, kwargs))
    except Exception as exc:
        raise LaunchError(
            f"could not send the function and its arguments to new processes ({exc}); "
            "pass tensors, numbers, strings, lists or dicts, or use start_method='fork'"
        ) from exc
    with open(os.path.join(job.workdir, "payload"), "wb") as f:
        pickle.dump(sys.path, f)
        pickle.dump(job, f)
        f.write(payload)
    boot = (
        "import importlib, pickle, sys\n"
        f"f = open({os.path.join(job.workdir, 'payload')!r}, 'rb')\n"
        "sys.path[:0] = pickle.load(f)\n"  # the caller's sys.path first, so this module and fn's modules import
        f"importlib.import_module({__name__!r})._spawned(f, {os.getpid()})\n"
    )
    for rank in range(job.world_size):
        read_fd, write_fd = os.pipe()
        try:
            popen = subprocess.Popen(
                [sys.executable, "-c", boot],
                stdin=subprocess.DEVNULL,
                stdout=write_fd,
                stderr=write_fd,
                env=dict(os.environ, RANK=str(rank)),
                start_new_session=True,  # its own process group: killing it takes its children too
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        ranks.append(_Rank(rank, popen.pid, read_fd, popen))
        os.set_blocking(read_fd, False)


def _spawned(payload: Any, parent: int) -> None:
    """Entry point of a spawned rank (see the bootstrap in _spawn_ranks)."""
    rank = int(os.environ["RANK"])
    try:
        _become_rank(parent, None)
        job = pickle.load(payload)
        fn, args, kwargs = pickle.load(payload)
        payload.close()
        _rank_main(job, rank, fn, args, kwargs)
    finally:
        os._exit(1)


def _become_rank(parent: int, write_fd: int | None) -> None:
    """Detach from the caller: own session, die with the caller, output into our pipe, no Ctrl-C."""
    if write_fd is not None:  # forked; a spawned rank got its session and pipe from Popen
        os.setsid()
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: if the caller dies hard, so do we
        if os.getppid() != parent:
            os._exit(1)
    # The caller stops us; its own SIGINT/SIGTERM handlers (Jupyter's, pytest's) must not run here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # A notebook's sys.stdout writes to the kernel, not to fd 1: talk to our pipe instead.
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)


# ---- inside a rank --------------------------------------------------------------------------------


def _rank_main(job: _Job, rank: int, fn: Callable, args: tuple, kwargs: dict) -> None:
    code = _run_rank(job, rank, fn, args, kwargs)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)  # skip the caller's atexit handlers, inherited through fork


def _run_rank(job: _Job, rank: int, fn: Callable, args: tuple, kwargs: dict) -> int:
    # First of all: a forked child's first multi-threaded op can hang forever on the caller's thread pool.
    torch.set_num_threads(1)
    supply_newer_names()  # torch.distributed names an older torch lacks, from their older equivalents, in this rank
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(job.world_size), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(job.world_size)
    )
    if job.debug:
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        dist.set_debug_level(dist.DebugLevel.DETAIL)  # torch read the variable at import, before the fork
    stacks = open(job.path("stack", rank), "w")
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)  # where a hung rank is stuck
    try:
        if job.backend == "nccl":
            torch.cuda.set_device(rank)
        # The launch's watchdog fires first; this timeout only frees ranks whose caller vanished.
        dist.init_process_group(
            job.backend,
            init_method=job.init_method,
            rank=rank,
            world_size=job.world_size,
            timeout=datetime.timedelta(seconds=job.timeout + 30),
            device_id=torch.device("cuda", rank) if job.backend == "nccl" else None,
        )
        # gloo's init returns on a rank before every pair of ranks is connected: a rank whose function sends
        # nothing could finish and close its connections while a slower one still connects ("Connection closed by
        # peer" in init_process_group, 2 of 188 launches of a 4-rank run without communication).
        dist.barrier()
        value = fn(dist, *args, **kwargs)
    except BaseException as exc:
        _write_report(job, rank, _error_report(exc))
        return 1  # no destroy_process_group: closing the connections is how the others learn
    try:
        data = pickle.dumps(("ok", _to_cpu(value)))
    except Exception as exc:
        message = (
            f"{type(exc).__name__}: the return value ({type(value).__name__}) could not be sent back to the caller: "
            f"{exc}. Return tensors, numbers, strings, or lists/tuples/dicts of them."
        )
        _write_report(job, rank, ("error", message, "", False, time.time()))
        return 1
    _write_report(job, rank, data)
    dist.destroy_process_group()
    return 0


def _to_cpu(value: Any) -> Any:
    """Make a result safe to send: CPU, detached from autograd, without the rest of a larger storage."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.layout == torch.strided and value.untyped_storage().nbytes() > value.nbytes:
            value = value.clone()
        return value
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    if isinstance(value, tuple):
        items = [_to_cpu(v) for v in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    return value


def _learners_frames(info: traceback.TracebackException) -> None:
    """Keep only the learner's frames, in the exception and in those it was raised from (all of them where none is
    the learner's): the course's engine (the launcher, the check that calls the learner's function) and torch's own
    (where a collective or a kernel raised, below the learner's call of it) have nothing for a learner to read."""
    seen = set()
    while info is not None and id(info) not in seen:
        seen.add(id(info))
        learners = [f for f in info.stack if not str(Path(f.filename).resolve()).startswith(ENGINE)]
        info.stack = traceback.StackSummary.from_list(learners or list(info.stack))
        info = info.__cause__ or info.__context__


def _error_report(exc: BaseException) -> tuple:
    """("error", message, traceback of the learner's code, is it a consequence, when). The traceback keeps the
    learner's frames; where the message explains a cryptic error in a line of its own, the raw text goes."""
    info = traceback.TracebackException.from_exception(exc)
    _learners_frames(info)
    message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    consequence = bool(_CONSEQUENCE.search(message))
    explained = _explain_mismatch(message)
    tb = "".join(info.format()) if explained is None else \
        "Traceback (most recent call last):\n" + "".join(info.stack.format())
    return ("error", explained or message, tb, consequence, time.time())


def _explain_mismatch(message: str) -> str | None:
    """Say in one line what TORCH_DISTRIBUTED_DEBUG=DETAIL found, instead of two pages of fingerprints."""
    sides = _FINGERPRINT.findall(message)
    if len(sides) != 2:
        return None
    (me, *mine), (other, *theirs) = sides

    def called(op: str, shape: str, dtype: str) -> str:
        return f"{_OP_NAMES.get(op, op.lower())} on a {dtype.lower()} tensor of shape [{shape}]"

    return (
        f"RuntimeError: mismatched collectives: rank {me} called {called(*mine)} while rank {other} "
        f"called {called(*theirs)}. Every rank must call the same collectives in the same order, "
        "with tensors of the same shape and dtype."
    )


def _write_report(job: _Job, rank: int, report: tuple | bytes) -> None:
    data = report if isinstance(report, bytes) else pickle.dumps(report)
    tmp = job.path("report.tmp", rank)
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, job.path("report", rank))  # whole or absent, never half-written


# ---- watching ranks from the caller ---------------------------------------------------------------


def _supervise(job: _Job, ranks: list[_Rank]) -> list | Exception:
    """Relay output until every rank has ended, one has failed, or time is up: the results or the error."""
    deadline = time.monotonic() + job.timeout
    failed_at: float | None = None
    with selectors.DefaultSelector() as selector:
        for r in ranks:
            selector.register(r.fd, selectors.EVENT_READ, r)
        while True:
            for key, _ in selector.select(timeout=0.05):
                _pump(key.data)
                if key.data.eof:
                    selector.unregister(key.fd)
            for r in ranks:
                r.poll()
                _collect(job, r)
            failures = [r for r in ranks if _failed(r)]
            if failures:
                failed_at = failed_at or time.monotonic()
                # A "connection closed" failure is caused by another rank: give that one a moment to report.
                running = any(r.returncode is None for r in ranks)
                if not running or any(not r.report[3] for r in failures):
                    break
                if time.monotonic() > failed_at + _ROOT_CAUSE_WAIT_S:
                    break
            elif all(r.returncode is not None for r in ranks):
                return [r.report[1] for r in ranks]
            if time.monotonic() > deadline:
                return _timeout_error(job, ranks)
    _stop(ranks)
    for r in ranks:
        _collect(job, r)  # a rank may have failed on its own while we stopped the others
        _drain(r)
    return _root_cause(ranks)


def _failed(r: _Rank) -> bool:
    return r.report is not None and r.report[0] != "ok"


def _collect(job: _Job, r: _Rank) -> None:
    """Read how an ended rank finished; a rank we stopped without a report of its own did not fail."""
    if r.report is None and r.returncode is not None:
        if not r.stopped_by_us or os.path.exists(job.path("report", r.rank)):
            r.report = _read_report(job, r)


def _read_report(job: _Job, r: _Rank) -> tuple:
    try:
        with open(job.path("report", r.rank), "rb") as f:
            return pickle.load(f)
    except FileNotFoundError:
        pass
    except Exception as exc:  # the result pickled in the rank but does not unpickle here
        return ("error", f"{type(exc).__name__}: its return value could not be read back: {exc}", "", False, r.ended_at)
    code = r.returncode
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        why = {
            "SIGKILL": "the process was killed (out of memory, or something called os.kill)",
            "SIGSEGV": "the process crashed in native code",
            "SIGABRT": "the process aborted in native code (its last lines of output say why)",
        }.get(name, "the process was killed")
        message = f"signal {name}: {why} before its function returned"
    else:
        message = f"SystemExit: the process exited with code {code} before its function returned (os._exit?)"
    return ("error", message, "", False, r.ended_at)


def _root_cause(ranks: list[_Rank]) -> RankFailed:
    """The error to show: the first rank that failed on its own, not one that lost a peer."""
    first = min((r for r in ranks if _failed(r)), key=lambda r: (r.report[3], r.report[4], r.rank))
    _, message, tb, consequence, _ = first.report
    returned = [r.rank for r in ranks if r.report is not None and r.report[0] == "ok"]
    if consequence and returned:  # nobody failed on their own: someone left while the others waited
        message += (
            f"\n{_ranks(returned)} had already returned while rank {first.rank} waited for "
            f"{'it' if len(returned) == 1 else 'them'} in a collective: every rank must call the same "
            "collectives in the same order (no collective inside `if rank == ...:`), and every recv needs a send."
        )
    return RankFailed(first.rank, message, tb)


def _timeout_error(job: _Job, ranks: list[_Rank]) -> LaunchError:
    stuck = [r for r in ranks if r.returncode is None]
    for r in stuck:
        try:
            os.kill(r.pid, signal.SIGUSR1)  # each writes its Python stacks (see _run_rank)
        except ProcessLookupError:
            pass
    stack_files = [Path(job.path("stack", r.rank)) for r in stuck]
    give_up = time.monotonic() + 1.0
    while time.monotonic() < give_up and not all(f.exists() and f.stat().st_size for f in stack_files):
        time.sleep(0.05)
    time.sleep(0.05)  # let the last dump finish
    done = [r.rank for r in ranks if r.returncode is not None]
    lines = [
        f"launch timed out after {job.timeout:g} s: {_ranks(r.rank for r in stuck)} had not finished"
        + (f" ({_ranks(done)} returned)." if done else ".")
    ]
    places = [_where_stuck(job.path("stack", r.rank)) for r in stuck]
    for r, where in zip(stuck, places):
        lines.append(f"  rank {r.rank} was " + (f"at {where}" if where else "still starting up, before its function"))
    if any(places):
        lines.append(
            "A rank waiting in a collective that another rank never calls waits forever: check that every rank "
            "calls the same collectives in the same order (no collective inside `if rank == ...:`), and that "
            "every send has a matching recv. If the work is only slow, pass a larger timeout=."
        )
    else:
        lines.append("Starting the ranks counts toward timeout= (a fresh interpreter spends seconds importing "
                     "torch): pass a larger timeout=.")
    return LaunchError("\n".join(lines))


def _ranks(numbers: Any) -> str:
    numbers = list(numbers)
    return ("rank " if len(numbers) == 1 else "ranks ") + ", ".join(map(str, numbers))


def _where_stuck(stack_file: str) -> str | None:
    """The innermost frame of the learner's code in a faulthandler dump, as `file:line in fn: source`."""
    try:
        text = Path(stack_file).read_text()
    except OSError:
        return None
    torch_dir = os.path.dirname(torch.__file__)
    frame = re.compile(r'File "(.*)", line (\d+) in (\S+)')
    for block in text.split("\n\n"):
        frames = frame.findall(block)  # most recent call first, down to this module's _run_rank
        if not any(f == __file__ and name == "_run_rank" for f, _, name in frames):
            continue  # not the rank's main thread
        for filename, line, name in frames:
            if filename == __file__:
                break  # below the learner's function: it was still starting up
            if not filename.startswith(torch_dir):
                source = linecache.getline(filename, int(line)).strip()
                return f"{os.path.basename(filename)}:{line} in {name}" + (f":  {source}" if source else "")
    return None


def _pump(r: _Rank) -> None:
    """Print the rank's complete lines, labelled, to the caller's sys.stdout (a notebook cell's output)."""
    while True:
        try:
            chunk = os.read(r.fd, 65536)
        except BlockingIOError:
            break
        except OSError:
            chunk = b""
        if not chunk:
            r.eof = True
            break
        *lines, r.partial = (r.partial + chunk).split(b"\n")
        for line in lines:
            print(f"[rank {r.rank}] {line.decode('utf-8', 'replace').rstrip()}")


def _drain(r: _Rank) -> None:
    """Print what an ended rank left in its pipe, including a last line without a newline."""
    if not r.eof:
        _pump(r)
    if r.partial:
        print(f"[rank {r.rank}] {r.partial.decode('utf-8', 'replace').rstrip()}")
        r.partial = b""


def _stop(ranks: list[_Rank]) -> None:
    """Terminate the ranks still running, kill them after a short grace, and reap every one."""
    running = [r for r in ranks if r.poll() is None]
    for r in running:
        r.stopped_by_us = True
        r.send(signal.SIGTERM)
    grace_end = time.monotonic() + _TERMINATE_GRACE_S
    while any(r.poll() is None for r in running) and time.monotonic() < grace_end:
        time.sleep(0.01)
    for r in running:
        if r.poll() is None:
            r.send(signal.SIGKILL)
            if r.popen is not None:
                r.popen.wait()
            else:
                os.waitpid(r.pid, 0)
            r.returncode = -signal.SIGKILL
