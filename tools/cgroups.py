"""A memory and process-count limit for everything one graded notebook starts: a cgroup of its own.

cgroup v2 where a cgroup with the memory controller is ours to manage (root, or a delegated
`systemd-run --user --scope -p Delegate=yes` scope); else cgroup v1's memory hierarchy where it
is writable (root on a cgroup v1 or hybrid machine, as in many containers); else none, and the
caller falls back to a per-process limit and says so. Linux only; elsewhere there is none.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from pathlib import Path
from typing import Optional

_names = itertools.count()
MAX_PROCESSES = 256                     # per notebook, where a cgroup can count them


def _mounts() -> list[tuple[str, Path, str, set[str]]]:
    """(root within the hierarchy, mount point, fstype, super options) of each cgroup mount."""
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields, _, fs = line.partition(" - ")
        fields, fs = fields.split(), fs.split()
        if len(fs) >= 3 and fs[0] in ("cgroup", "cgroup2"):
            found.append((fields[3], Path(fields[4]), fs[0], set(fs[2].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under "" its cgroup v2 path."""
    paths = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _where(mount: tuple[str, Path, str, set[str]], path: str) -> Path:
    root, point = mount[0], mount[1]
    relative = os.path.relpath(path, root) if path.startswith(root) else path
    return point if relative == "." else point / relative.lstrip("/")


def _words(path: Path) -> set[str]:
    try:
        return set(path.read_text().split())
    except OSError:
        return set()


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK)


class Cgroup:
    """One notebook's cgroup (one folder in v2; one per controller in v1)."""

    def __init__(self, version: str, folders: list[Path]) -> None:
        self.version = version
        self.folders = folders

    @property
    def limits_processes(self) -> bool:
        """Whether the number of processes is limited too (a fork bomb stops at the limit)."""
        return any((folder / "pids.max").exists() for folder in self.folders)

    def join(self) -> None:
        """Move the calling process in (run in the child between fork and exec)."""
        for folder in self.folders:
            (folder / "cgroup.procs").write_text(str(os.getpid()))

    def out_of_memory(self) -> bool:
        """Whether the kernel killed a process here for going over the memory limit."""
        events = self.folders[0] / ("memory.events" if self.version == "cgroup v2" else "memory.oom_control")
        try:
            for line in events.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
        except (OSError, ValueError):
            pass
        return False

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in (self.folders[0] / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def kill(self) -> None:
        """SIGKILL everything inside, including processes that detached from the notebook."""
        kill_file = self.folders[0] / "cgroup.kill"
        if kill_file.exists():
            try:
                kill_file.write_text("1")
                return
            except OSError:
                pass
        for _ in range(100):                      # a process may fork while being killed
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.01)

    def remove(self, wait: float = 5.0) -> None:
        """Kill what is left, then remove the folders (a folder goes once its last process is reaped)."""
        self.kill()
        deadline = time.monotonic() + wait
        for folder in self.folders:
            while True:
                try:
                    folder.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.02)


def _v2(limit: int, max_pids: int, name: str) -> Optional[Cgroup]:
    """A child of the nearest cgroup (ours or an ancestor) that hands out the memory controller and
    that we may write to; ancestors need their cgroup.procs writable to move a process across."""
    mount = next((m for m in _mounts() if m[2] == "cgroup2"), None)
    own = _own_paths().get("")
    if mount is None or own is None:
        return None
    here = _where(mount, own)
    for parent in [here, *here.parents]:
        if mount[1] not in (parent, *parent.parents):
            break
        if "memory" in _words(parent / "cgroup.subtree_control") and _writable(parent) \
                and _writable(parent / "cgroup.procs"):
            folder = parent / name
            try:
                folder.mkdir()
                (folder / "memory.max").write_text(str(limit))
                if (folder / "memory.swap.max").exists():
                    (folder / "memory.swap.max").write_text("0")
                if (folder / "pids.max").exists():
                    (folder / "pids.max").write_text(str(max_pids))
            except OSError:
                Cgroup("cgroup v2", [folder]).remove(wait=0)
                continue
            return Cgroup("cgroup v2", [folder])
    return None


def _v1(limit: int, max_pids: int, name: str) -> Optional[Cgroup]:
    """Children of our cgroups in v1's memory hierarchy (required) and pids hierarchy (if writable)."""
    own = _own_paths()
    mounts = {c: m for m in _mounts() if m[2] == "cgroup" for c in m[3] if c in ("memory", "pids")}
    if "memory" not in mounts or "memory" not in own:
        return None
    memory = _where(mounts["memory"], own["memory"]) / name
    try:
        memory.mkdir()
        (memory / "memory.limit_in_bytes").write_text(str(limit))
        if (memory / "memory.memsw.limit_in_bytes").exists():     # no swapping past the limit either
            (memory / "memory.memsw.limit_in_bytes").write_text(str(limit))
    except OSError:
        Cgroup("cgroup v1", [memory]).remove(wait=0)
        return None
    folders = [memory]
    if "pids" in mounts and "pids" in own:
        pids = _where(mounts["pids"], own["pids"]) / name
        try:
            pids.mkdir()
            (pids / "pids.max").write_text(str(max_pids))
            folders.append(pids)
        except OSError:
            Cgroup("cgroup v1", [pids]).remove(wait=0)
    return Cgroup("cgroup v1", folders)


def notebook_cgroup(limit_bytes: int, max_pids: int = MAX_PROCESSES) -> Optional[Cgroup]:
    """A fresh cgroup limiting memory (and the number of processes where possible), or None."""
    name = f"course-grade-{os.getpid()}-{next(_names)}"
    return _v2(limit_bytes, max_pids, name) or _v1(limit_bytes, max_pids, name)
