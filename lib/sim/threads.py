"""Rank threads from the scheduler's side: is the rank holding the baton computing or blocked, and how
to stop a thread and make sure it is gone.

Only one rank runs at a time, so a rank that holds the baton but neither uses CPU nor waits for one is waiting
for something outside `dist` (a queue, a lock, an Event, a sleep loop): nothing will ever come, since no other
rank can run to provide it. A thread that waits for a CPU (a machine busy with other work) is not blocked.
A thread is stopped by raising an exception in it; a thread asleep in a wait is woken
first where the wait is a `threading.Condition` (Event, Queue, Semaphore and Barrier all wait on one).
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time
from pathlib import Path
from typing import Iterable, Optional

from lib.whose_code import ENGINE

BLOCKED_AFTER = 3.0      # seconds holding the baton without using CPU before a rank counts as blocked
POLL = 0.25              # how often the scheduler looks at the running rank
IDLE_SHARE = 0.05        # a thread using less than this share of a core is waiting, not computing
                         # (a loop around time.sleep(0.01) uses about 0.5%) ...
READY_SHARE = 0.5        # ... unless it spends more than this share of the time ready to run, waiting for a CPU
                         # that other work holds (a sleep loop waits for one only briefly after each wake-up)


def cpu_time(thread: threading.Thread) -> Optional[float]:
    """CPU seconds the thread has used, or None where the platform cannot tell (macOS)."""
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
    except (AttributeError, OSError, TypeError):
        return None


def queued_time(thread: threading.Thread) -> float:
    """Seconds the thread has spent ready to run but waiting for a CPU, where Linux tells it (else 0). On a machine
    busy with other work (a low-priority process among busy ones gets about 1% of a core) a computing thread uses
    little CPU but waits for one all the while; a blocked thread does neither."""
    try:
        with open(f"/proc/self/task/{thread.native_id}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError, TypeError):
        return 0.0


class ProgressWatch:
    """Tells, poll after poll, whether the thread holding the baton has stopped using or waiting for a CPU."""

    def __init__(self) -> None:
        self._thread: Optional[threading.Thread] = None
        self._cpu: Optional[float] = None
        self._queued = 0.0
        self._sampled = self._since = time.monotonic()

    def blocked(self, thread: Optional[threading.Thread]) -> bool:
        now = time.monotonic()
        cpu = cpu_time(thread) if thread is not None else None
        queued = queued_time(thread) if thread is not None else 0.0
        span = now - self._sampled
        busy = self._cpu is not None and cpu is not None and (
            cpu - self._cpu > IDLE_SHARE * span or cpu - self._cpu + queued - self._queued > READY_SHARE * span)
        if cpu is None or thread is not self._thread or self._cpu is None or busy:
            self._since = now
        self._thread, self._cpu, self._queued, self._sampled = thread, cpu, queued, now
        return now - self._since > BLOCKED_AFTER


_THREAD_START = ("_bootstrap", "_bootstrap_inner", "run")   # every thread's outermost frames: not a wait


def where(thread: threading.Thread) -> tuple[str, str]:
    """(the learner's line the thread is at, the library call it waits in), from its current frames."""
    frame = sys._current_frames().get(thread.ident)
    learner, inside = "", ""
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.startswith(ENGINE):
            pass
        elif Path(filename).name in ("threading.py", "queue.py", "selectors.py", "socket.py"):
            if frame.f_code.co_name not in _THREAD_START:
                inside = inside or f"{Path(filename).stem}.{frame.f_code.co_name}"
        elif not learner:
            import linecache
            source = linecache.getline(filename, frame.f_lineno).strip()
            learner = f"{Path(filename).name}:{frame.f_lineno}" + (f": {source}" if source else "")
        frame = frame.f_back
    return learner, inside


def interrupt(thread: threading.Thread, exception: type) -> None:
    """Raise `exception` in the thread at its next Python instruction, waking it from a Condition wait."""
    if thread.ident is None or not thread.is_alive():
        return
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(exception))
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        waiting = frame.f_locals.get("self") if frame.f_code.co_name == "wait" else None
        if isinstance(waiting, threading.Condition) and waiting.acquire(timeout=0.1):
            try:
                waiting.notify_all()
            finally:
                waiting.release()
        frame = frame.f_back


def join_all(threads: Iterable[threading.Thread], timeout: float) -> list[threading.Thread]:
    """Join every thread within `timeout` seconds in all; return those still alive."""
    deadline = time.monotonic() + timeout
    alive = []
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            alive.append(t)
    return alive
