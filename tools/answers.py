"""The answers' process: the only process of the grader where the learner's code runs; and the judge's handle on it.

tools.judge forks it once the checker is imported, before the judge holds anything worth taking (the key that
signs results, a check's cases and their expected values). It runs the notebook's setup and puzzle cells, then
each simulated run the judge's checks ask for, with the learner's function, and sends back what the run did
(tools.evidence): it never judges. The judge compares, in a process the learner's code cannot reach: not
dumpable (no /proc/PID/mem, fds or ptrace for a process without capabilities, which the sandbox's are), and
holding no file the answers' process inherits.

Requests go from the judge to this process pickled (the judge is trusted here); replies come back as evidence,
which the judge reads as data only.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import sys
import time
from typing import Any, NoReturn, Optional

from tools.evidence import Unreadable, error_message, read_run, receive, result_message, send

PR_SET_DUMPABLE = 4


class AnswersGone(Exception):
    """The answers' process ended (the learner's code exited, crashed or was killed)."""


def dumpable(flag: bool) -> None:
    """Not dumpable: processes of the same user without capabilities cannot read this one's memory or files
    (/proc/PID/mem, /proc/PID/fd) nor ptrace it."""
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, int(flag), 0, 0, 0)
    except (OSError, AttributeError):          # not Linux: only the folder method runs there, which contains nothing
        pass


class Answers:
    """The judge's handle on the answers' process."""

    def __init__(self, pid: int, requests: int, replies: int) -> None:
        self.pid, self.requests, self.replies = pid, requests, replies
        self.imported = set(sys.modules)        # what both processes have imported (they share it from the fork)

    @classmethod
    def start(cls) -> "Answers":
        """Fork the answers' process (call it with the checker imported, before any secret or case exists)."""
        requests_read, requests_write = os.pipe()
        replies_read, replies_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(requests_write)
                os.close(replies_read)
                _leave_the_judges_files(requests_read, replies_write)
                serve(requests_read, replies_write)
            finally:
                os._exit(70)
        os.close(requests_read)
        os.close(replies_write)
        return cls(pid, requests_write, replies_read)

    def close(self, wait: float = 2.0) -> None:
        """No more requests: the answers' process ends; reaped if it does within `wait` seconds (its CPU time then
        counts in the sandbox's), else left to the sandbox, which ends with the judge."""
        os.close(self.requests)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                if os.waitpid(self.pid, os.WNOHANG)[0]:
                    return
            except ChildProcessError:
                return
            time.sleep(0.01)

    def _ask(self, request: tuple) -> bytes:
        try:
            send(self.requests, pickle.dumps(request))
            reply = receive(self.replies)
        except (BrokenPipeError, ConnectionResetError):
            reply = None
        if reply is None:
            raise AnswersGone(f"the notebook's process ended ({self._how_it_ended()}) while {request[0]!r} ran")
        return reply

    def _how_it_ended(self) -> str:
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            return "ended"
        if os.WIFSIGNALED(status):
            return f"killed by signal {os.WTERMSIG(status)}"
        return f"exit code {os.WEXITSTATUS(status)}"

    def load(self, cells: dict, names: list[str]) -> tuple[dict[str, str], set[str], Optional[str]]:
        """Run the notebook's setup and puzzle cells there: ({puzzle: the error its cell raised}, the puzzles
        defined as functions, the setup cell's error if it raised)."""
        reply = _json(self._ask(("load", cells, names)))
        errors, defined, setup = reply.get("errors"), reply.get("defined"), reply.get("setup")
        if not (isinstance(errors, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in errors.items())
                and isinstance(defined, list) and all(isinstance(n, str) for n in defined)
                and (setup is None or isinstance(setup, str))):
            raise Unreadable("the notebook's cells were run, but what came back is not their outcome")
        return {k: v[:500] for k, v in errors.items()}, set(defined), setup[:500] if setup else None

    def run(self, notebook: str, puzzle: str, wrapped: bool, world_size: int, args: tuple, kwargs: dict):
        """lib.sim.run there, on the learner's function (as the puzzle wraps it, if `wrapped`): its SimResult,
        or the error it raised, raised here."""
        from lib.sim import CostModel
        # The modules the judge imported since (building the case, as a check in one process would have): imported
        # there too before the run, or their first import would happen inside a simulated rank.
        modules = sorted(set(sys.modules) - self.imported)
        self.imported.update(modules)
        reply = self._ask(("run", notebook, puzzle, wrapped, world_size, args, kwargs, modules))
        result, error = read_run(reply, kwargs.get("cost") or CostModel())
        if error is not None:
            raise error
        return result

    def changes(self) -> list[str]:
        """What the learner's code has changed of the checker there so far (tools.fingerprint)."""
        changes = _json(self._ask(("changes",))).get("changes")
        if not (isinstance(changes, list) and all(isinstance(c, str) for c in changes)):
            raise Unreadable("a list of the checker's changes that is not a list of text")
        return [c[:200] for c in changes]


def _json(reply: bytes) -> dict:
    try:
        found = json.loads(reply)
    except (ValueError, RecursionError):
        found = None
    if not isinstance(found, dict):
        raise Unreadable("a reply that is not a JSON object")
    return found


# ---- inside the answers' process ---------------------------------------------------------------------------
def _leave_the_judges_files(*keep: int) -> None:
    """Nothing of the judge's open files stays: its stdin (the key) and stdout (its results) become /dev/null;
    stderr, the log, stays."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    for fd in range(3, max(keep)):
        if fd not in keep:
            try:
                os.close(fd)
            except OSError:
                pass
    os.closerange(max(keep) + 1, 2**16)


def _import(modules: list[str]) -> None:
    for name in modules:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except BaseException:                       # a module made at run time, not importable by name
                pass


def serve(requests: int, replies: int) -> NoReturn:
    """Answer the judge's requests until it closes the pipe."""
    import puzzles
    from lib.checker.puzzle import one_thread
    from lib.notebook.cells import load_answers
    from lib.sim import run
    from tools.fingerprint import changes, fingerprint

    dumpable(True)                                  # nothing to hide here: as any process
    before = fingerprint()
    namespace: dict[str, Any] = {}
    while (message := receive(requests)) is not None:
        request = pickle.loads(message)
        if request[0] == "load":
            _, cells, names = request
            reply: dict[str, Any] = {"errors": {}, "defined": [], "setup": None}
            try:
                namespace, reply["errors"] = load_answers(cells)
            except BaseException as e:                  # the setup cell raised
                reply["setup"] = f"{type(e).__name__}: {e}"
            reply["defined"] = [name for name in names if callable(namespace.get(name))]
            send(replies, json.dumps(reply).encode())
        elif request[0] == "changes":
            send(replies, json.dumps({"changes": changes(before)}).encode())
        else:
            _, notebook, name, wrapped, world_size, args, kwargs, modules = request
            _import(modules)
            try:
                fn = namespace.get(name)
                if wrapped:
                    fn = next(p for m in puzzles.MODULES if m.NOTEBOOK == notebook for p in m.PUZZLES
                              if p.name == name).wrap(fn)
                with one_thread():                      # the learner's prints go to /dev/null (fd 1)
                    result = run(fn, world_size, *args, **kwargs)
                reply_bytes = result_message(result)
            except BaseException as e:                  # the run's error, sent for the judge to raise
                reply_bytes = error_message(e)
            send(replies, reply_bytes)
    sys.stdout.flush()
    os._exit(0)
