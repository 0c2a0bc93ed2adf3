"""Run one Python command in the strongest sandbox this machine allows, without Docker.

1. bubblewrap (`bwrap`), where installed and namespaces work;
2. else mount, PID, network, IPC and UTS namespaces (and, run by an ordinary user, a user namespace)
   made by util-linux's `unshare`, the file system built by tools/nsinit.py;
3. else a plain folder, with a warning that says what is not contained.

In 1 and 2 the command sees: the system's programs and libraries and this Python (read-only), the
packages it is given at /course (read-only), a private writable /grading and /tmp (in memory),
/proc/sys read-only, nothing else of the host's files; no network; its own PID namespace, in which
it is process 1, so every process it starts dies with it. It never holds a privilege over the host:
run by an ordinary user, it is that user in a user namespace with no capability; run by root, the
sandbox is built as root (root reaches every folder it shows) and the command then runs as nobody
(SANDBOX_UID), with no capability, no way to regain one (no_new_privs), in no user namespace of ours,
so that no user id inside is root's on the host. In every method: a memory limit for all its
processes together (a cgroup where the machine lets us make one, else their memory added up from
/proc every POLL_SECONDS, else per process), and a wall-clock limit that is never waited past.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from tools.cgroups import MAX_PROCESSES, Cgroup, notebook_cgroup
from tools.nsinit import PIVOT_ROOT

METHODS = ("bubblewrap", "namespaces", "folder")
ENGINE, PRIVATE = "/course", "/grading"          # where the packages and the private folder are, inside
PRIVATE_BYTES = TMP_BYTES = 512 * 2**20          # in-memory folders (they count against the memory limit)
OUTPUT_BYTES = 16 * 2**20                        # the most any file the command writes may hold
POLL_SECONDS = 0.1                               # how often the memory is added up where there is no cgroup
SANDBOX_UID = 65534                              # nobody: who the command runs as when root grades
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
          "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d")


@dataclass(frozen=True)
class Isolation:
    """The method a sandbox uses, why stronger ones were not available, and its memory limit's kind."""

    method: str
    memory: str                      # "cgroup v2", "cgroup v1", "polled" or "per process"
    why_not: tuple[str, ...] = ()    # e.g. "bubblewrap: not installed"
    answer_key: Optional[str] = None # where graded code could still import the answer key from, if anywhere
    processes_limited: bool = False  # a cgroup also limits the number of processes
    as_root: bool = False            # the grader runs as root: the command runs as nobody (not in a folder)

    def uncontained(self) -> list[str]:
        """What graded code can still reach or do, said plainly."""
        gaps = []
        if self.answer_key:
            gaps.append(f"the answer key, importable inside from {self.answer_key} (install the course with "
                        "`pip install -e .`, which leaves solutions/ out)")
        if self.method == "folder":
            gaps += ["your files: the code runs as you and can read and write whatever you can, the answer key "
                     "included (by absolute path)", "the network"]
            if self.as_root:
                gaps.append("root's privileges: the code runs as root, with every power over this machine")
            if not self.memory.startswith("cgroup"):
                gaps.append("processes that detach from the notebook (double fork) and outlive it")
        if self.memory == "per process":
            gaps.append("memory in total: the limit holds per process, so N processes may use N times it")
        if not self.processes_limited:
            gaps.append("the number of processes: a fork bomb slows this machine down until the timeout")
        gaps.append("the simulator's meters inside the answers' process (bytes, FLOPs, memory, who sent what): code "
                    "written to tamper with them is flagged for review, in the common cases, not prevented "
                    "(see docs/TRUST.md)")
        return gaps

    def describe(self) -> str:
        walls = "read-only engine, private folder, none of your files, no network, own PID namespace"
        user = "" if self.as_root else "user, "
        what = {"bubblewrap": f"bubblewrap ({walls})",
                "namespaces": f"{user}mount, PID and network namespaces via unshare ({walls})",
                "folder": "a folder only, NOT an operating-system sandbox"}[self.method]
        if self.as_root and self.method != "folder":
            what += f"; run by root, the notebook runs as nobody (uid {SANDBOX_UID}) with no capability"
        memory = {"per process": "for each process",
                  "polled": "for the whole notebook (no cgroup here: the grader adds up its processes' memory "
                            f"every {POLL_SECONDS:g} s)"}.get(self.memory, f"for the whole notebook ({self.memory})")
        text = f"isolation: {what}; memory limit {memory}"
        if self.processes_limited:
            text += f", at most {MAX_PROCESSES} processes"
        if self.why_not:
            text += f"\n  (not used: {'; '.join(self.why_not)})"
        return text + "".join(f"\n  not contained: {gap}" for gap in self.uncontained())


@dataclass
class Finished:
    """How a sandboxed command ended and what it wrote to stdout (capped) and stderr (the tail)."""

    returncode: Optional[int]
    timed_out: bool
    out_of_memory: bool
    output: bytes
    errors: str


@dataclass
class Spec:
    """The sandbox's file system and command, one description for bubblewrap and for nsinit."""

    read_only: list[tuple[str, str]] = field(default_factory=list)   # (host path, path inside)
    symlinks: list[tuple[str, str]] = field(default_factory=list)    # (target, path inside)
    tmpfs: list[tuple[str, int, int]] = field(default_factory=list)  # (path inside, bytes, mode)
    cwd: str = PRIVATE
    argv: list[str] = field(default_factory=list)

    def bwrap(self, bwrap: str, setpriv: str, as_root: bool) -> list[str]:
        if as_root:          # no user namespace: bwrap builds as root, then setpriv makes the command nobody
            argv = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        else:
            argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
        # --as-pid-1: no bubblewrap process inside that keeps the grader's stdin and stdout open for the command
        argv += ["--die-with-parent", "--new-session", "--as-pid-1", "--hostname", "sandbox"]
        # The private folders first, so that a read-only folder inside one (a virtual environment under /tmp)
        # is mounted on top of it rather than hidden by it.
        for path, size, mode in self.tmpfs:
            argv += ["--size", str(size), "--perms", f"{mode:04o}", "--tmpfs", path]
        for folder in self.folders_above():         # bubblewrap makes them 0700, which nobody cannot pass
            argv += ["--perms", "0755", "--dir", folder]
        for source, target in self.read_only:
            argv += ["--ro-bind", source, target]
        for target, path in self.symlinks:
            argv += ["--symlink", target, path]
        command = privileges_dropped(setpriv, as_root) + self.argv if as_root else self.argv
        return argv + ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev", "--remount-ro", "/",
                       "--chdir", self.cwd, "--", *command]

    def folders_above(self) -> list[str]:
        """The folders the read-only ones are mounted in, outermost first, other than / and the private folders."""
        private = {path for path, _, _ in self.tmpfs}
        above = {str(parent) for _, target in self.read_only for parent in Path(target).parents}
        return sorted(above - private - {"/"}, key=lambda folder: (folder.count("/"), folder))

    def unshare(self, unshare: str, setpriv: str, root: Path, as_root: bool) -> list[str]:
        spec = {"root": str(root), "read_only": self.read_only, "symlinks": self.symlinks, "tmpfs": self.tmpfs,
                "shm_bytes": TMP_BYTES, "cwd": self.cwd, "command": privileges_dropped(setpriv, as_root) + self.argv,
                "user_namespace": not as_root, "host_user_namespace": os.readlink("/proc/self/ns/user")}
        user = [] if as_root else ["--user", "--map-root-user"]
        return [unshare, *user, "--mount", "--pid", "--fork", "--kill-child", "--net", "--ipc", "--uts",
                "--", sys.executable, "-S", "-I", str(Path(__file__).with_name("nsinit.py")), json.dumps(spec)]


def grading_as_root() -> bool:
    """Whether the grader runs as root: the sandbox's command then runs as nobody (SANDBOX_UID)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0


def privileges_dropped(setpriv: str, as_root: bool) -> list[str]:
    """setpriv's command line that runs what follows with no capability in any set and no_new_privs (nothing
    it executes can regain one), and, for root, as nobody without supplementary groups."""
    who = [f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups"] if as_root else []
    return [setpriv, *who, "--no-new-privs", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all",
            "--securebits=+noroot,+noroot_locked,+no_setuid_fixup,+no_setuid_fixup_locked,+keep_caps_locked", "--"]


def _python_dirs() -> list[str]:
    """The folders this Python needs: its installation and its virtual environment, if any."""
    dirs = {os.path.abspath(p) for p in (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)}
    dirs.add(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    covered = [d for d in SYSTEM if os.path.isdir(d) and not os.path.islink(d)]
    return sorted(d for d in dirs if not any(d == c or d.startswith(c + "/") for c in covered))


def site_packages() -> list[str]:
    """Where this Python's installed packages are (added by hand: graded code runs with `python -S`)."""
    import sysconfig
    return sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})


class Sandbox:
    """One command's sandbox: `packages` (name -> folder) read-only at `engine`, a private folder at `home`."""

    def __init__(self, isolation: Isolation, packages: dict[str, Path]) -> None:
        self.isolation = isolation
        self.packages = packages
        self.tmp = Path(tempfile.mkdtemp(prefix="grade-"))
        if isolation.method == "folder":
            self.engine, self.home = str(self.tmp / "code"), str(self.tmp / "work")
            for name, folder in packages.items():
                shutil.copytree(folder, self.tmp / "code" / name, ignore=shutil.ignore_patterns("__pycache__"))
            os.mkdir(self.home)
        else:
            self.engine, self.home = ENGINE, PRIVATE

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    def env(self) -> dict[str, str]:
        tmp = "/tmp" if self.isolation.method != "folder" else self.home
        return {"PATH": "/usr/bin:/bin", "HOME": self.home, "TMPDIR": tmp, "LANG": "C.UTF-8", "MPLBACKEND": "Agg",
                "MPLCONFIGDIR": f"{self.home}/.matplotlib", "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
                "COURSE_STRICT": "1"}

    def _spec(self, argv: list[str]) -> Spec:
        spec = Spec(argv=argv)
        for path in SYSTEM:
            if os.path.islink(path):
                spec.symlinks.append((os.readlink(path), path))
            elif os.path.exists(path):
                spec.read_only.append((path, path))
        spec.read_only += [(d, d) for d in _python_dirs()]
        spec.read_only += [(str(folder), f"{ENGINE}/{name}") for name, folder in self.packages.items()]
        spec.tmpfs += [(PRIVATE, PRIVATE_BYTES, 0o1777), ("/tmp", TMP_BYTES, 0o1777)]   # nobody's too, when root grades
        return spec

    def command(self, python_args: list[str]) -> list[str]:
        argv = [sys.executable, *python_args]
        setpriv = os.path.realpath(shutil.which("setpriv") or "setpriv")
        if self.isolation.method == "bubblewrap":
            return self._spec(argv).bwrap(shutil.which("bwrap"), setpriv, self.isolation.as_root)
        if self.isolation.method == "namespaces":
            root = self.tmp / "root"
            root.mkdir(exist_ok=True)
            return self._spec(argv).unshare(shutil.which("unshare"), setpriv, root, self.isolation.as_root)
        return argv

    def run(self, python_args: list[str], stdin: bytes, timeout: float, memory_bytes: int) -> Finished:
        """Run `python python_args...` inside; kill it and everything it started after `timeout` seconds."""
        cgroup = notebook_cgroup(memory_bytes) if self.isolation.memory.startswith("cgroup") else None

        def limits() -> None:                  # in the child, before exec: inherited by all it starts
            if cgroup is not None:
                cgroup.join()
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            resource.setrlimit(resource.RLIMIT_FSIZE, (OUTPUT_BYTES, OUTPUT_BYTES))

        # Anonymous files, not pipes: a process that keeps a pipe open cannot make us wait for it.
        with tempfile.TemporaryFile() as inp, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            inp.write(stdin)
            inp.seek(0)
            child = subprocess.Popen(self.command(python_args), stdin=inp, stdout=out, stderr=err, env=self.env(),
                                     cwd=self.home if self.isolation.method == "folder" else self.tmp,
                                     start_new_session=True, close_fds=True, preexec_fn=limits)
            try:
                polled = cgroup is None and self.isolation.memory != "per process"
                timed_out, over = _watch(child, timeout, memory_bytes if polled else None)
            finally:
                _kill_all(child, cgroup)
            out_of_memory = over or (cgroup is not None and cgroup.out_of_memory())
            if cgroup is not None:
                cgroup.remove()
            out.seek(0)
            output = out.read(OUTPUT_BYTES)
            err.seek(max(0, err.seek(0, os.SEEK_END) - 4000))
            errors = err.read().decode(errors="replace")
        return Finished(None if timed_out else child.returncode, timed_out, out_of_memory, output, errors)


def _watch(child: subprocess.Popen, timeout: float, memory_bytes: Optional[int]) -> tuple[bool, bool]:
    """Wait for the command to end: (whether it ran past `timeout`, whether its processes together went over
    `memory_bytes`, when given, the limit a cgroup would otherwise keep)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            child.wait(timeout=min(POLL_SECONDS, max(0.0, deadline - time.monotonic())))
            return False, False
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() >= deadline:
            return True, False
        if memory_bytes is not None and sum(map(_memory_of, [child.pid, *_descendants(child.pid)])) > memory_bytes:
            return False, True


def _memory_of(pid: int) -> int:
    """A process's proportional set size (shared pages split among their users), in bytes; 0 once gone."""
    for name, key in (("smaps_rollup", "Pss:"), ("status", "VmRSS:")):
        try:
            for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            continue
    return 0


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


def _kill_all(child: subprocess.Popen, cgroup: Optional[Cgroup]) -> None:
    """SIGKILL the command and everything it started: its cgroup, its process tree, its session."""
    if cgroup is not None:
        cgroup.kill()
    for pid in [child.pid, *_descendants(child.pid)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except OSError:
        pass
    child.wait()


PROBE = """
import importlib.util, json, os, sys
sys.path[:0] = [{engine!r}] + {site!r}
for folder in {site!r}:
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.startswith("__editable__") and name.endswith("_finder.py"):
            try:
                __import__(name[:-3]).install()   # what graded code could do to reach the answer key
            except Exception:
                pass
spec = importlib.util.find_spec("solutions")
origin = spec.origin if spec is not None and spec.origin and os.path.exists(spec.origin) else None
key = {answer_key!r} if os.path.exists({answer_key!r}) else None
print(json.dumps({{"pid": os.getpid(), "engine": os.path.isdir({engine!r} + "/lib"), "answer_key": origin or key}}))
"""


def probe(isolation: Isolation, packages: dict[str, Path], answer_key: Path) -> dict:
    """Start a sandbox and look around inside: {"pid", "engine", "answer_key"}, or {"error": why it failed}."""
    with Sandbox(isolation, packages) as box:
        code = PROBE.format(engine=box.engine, site=site_packages(), answer_key=str(answer_key))
        done = box.run(["-S", "-c", code], b"", timeout=120, memory_bytes=2**31)
    try:
        return json.loads(done.output.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        lines = done.errors.strip().splitlines() or [f"exit code {done.returncode}"]
        return {"error": lines[-1][:300]}


def available(method: str) -> Optional[str]:
    """None when `method`'s tools are on this machine, else why not."""
    if method == "folder":
        return None
    if platform.system() != "Linux":
        return "Linux only"
    missing = [tool for tool in ("unshare", "setpriv") if not shutil.which(tool)]   # setpriv serves both
    if method == "bubblewrap":
        if not shutil.which("bwrap"):
            return "not installed (Debian/Ubuntu: apt-get install bubblewrap)"
        return f"{' and '.join(missing)} not found (util-linux)" if "setpriv" in missing and grading_as_root() else None
    if missing:
        return f"{' and '.join(missing)} not found (util-linux)"
    return None if platform.machine() in PIVOT_ROOT else f"no pivot_root number known for {platform.machine()}"


def memory_kind() -> tuple[str, bool]:
    """How this machine limits a notebook's memory (a cgroup, polling /proc, or per process), and whether
    it limits the number of its processes too."""
    cgroup = notebook_cgroup(2**30)
    if cgroup is None:
        return "polled" if Path("/proc/self/smaps_rollup").exists() else "per process", False
    limits_processes = cgroup.limits_processes
    cgroup.remove()
    return cgroup.version, limits_processes


def choose_isolation(packages: dict[str, Path], answer_key: Path, method: str = "auto") -> Isolation:
    """The strongest method that works here (or exactly `method`), checked by starting a sandbox."""
    memory, processes_limited = memory_kind()
    why_not: list[str] = []
    for candidate in METHODS if method == "auto" else (method,):
        reason = available(candidate)
        if reason is None:
            trying = Isolation(candidate, memory, processes_limited=processes_limited, as_root=grading_as_root())
            found = probe(trying, packages, answer_key)
            reason = found.get("error") or (None if found.get("engine") else "the engine is not visible inside")
        if reason is None:
            visible = found.get("answer_key") if candidate != "folder" else None   # a folder hides nothing anyway
            return Isolation(candidate, memory, tuple(why_not), visible, processes_limited, trying.as_root)
        why_not.append(f"{candidate}: {reason}")
    what = "no sandbox works here" if method == "auto" else f"{method} does not work here"
    raise RuntimeError(f"{what}: {'; '.join(why_not)}")
