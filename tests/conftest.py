"""Settings for the whole suite."""

from __future__ import annotations

import os

MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto` (pyproject's addopts): one worker per core this process may use, at most MAX_WORKERS. Each worker
    runs tests that start real ranks (up to 8 processes) and whole notebooks in a kernel of their own; past a few
    workers they only wait on each other, and the launches' timeouts get closer."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores, MAX_WORKERS))
