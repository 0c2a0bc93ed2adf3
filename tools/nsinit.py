"""Inside fresh namespaces made by `unshare` (mount, PID, network, IPC, UTS, and a user namespace
when an ordinary user grades): build the sandbox's file system, pivot into it, and run the command
through setpriv, which leaves it no capability (and, when root grades, makes it nobody).

    unshare [--user --map-root-user] --mount --pid --fork --kill-child --net --ipc --uts \\
        -- python -S -I tools/nsinit.py SPEC

SPEC is the JSON of tools.sandbox.Spec. What bubblewrap does for itself, done with the standard
library alone (this runs before the sandbox exists, so it imports nothing of the course).
"""

import ctypes
import json
import os
import platform
import socket
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
# statvfs's f_flag bits and the mount flags they stand for: a read-only remount of a bind mount
# made inside a user namespace must keep the flags the original mount has, or it is refused.
LOCKED_FLAGS = {os.ST_NOSUID: MS_NOSUID, os.ST_NODEV: MS_NODEV, os.ST_NOEXEC: MS_NOEXEC,
                os.ST_NOATIME: MS_NOATIME, os.ST_NODIRATIME: MS_NODIRATIME, os.ST_RELATIME: MS_RELATIME}
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "arm64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
DEVICES = ("null", "zero", "full", "random", "urandom")

libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source, target: str, fstype, flags: int, data=None) -> None:
    encode = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data)),
           f"mount {target}")


def _make_target(source: str, target: str) -> None:
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()


def bind_read_only(source: str, target: str) -> None:
    _make_target(source, target)
    mount(source, target, None, MS_BIND)
    flags = os.statvfs(target).f_flag
    kept = sum(ms for st, ms in LOCKED_FLAGS.items() if flags & st)
    mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | kept)


def _no_nested_user_namespaces(proc: str, host_user_namespace: str) -> None:
    """No nested user namespace to regain privileges in: a limit of this user namespace's own, written only
    once it is certain that this is not the host's (where the same file is the whole machine's setting)."""
    if os.readlink("/proc/self/ns/user") == host_user_namespace:
        raise OSError("nsinit: still in the host's user namespace; refusing to change its settings")
    with open(proc + "/sys/user/max_user_namespaces", "w") as f:
        f.write("0")


def build(spec: dict) -> None:
    root = spec["root"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)              # nothing we mount leaks out
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    for path, size, mode in spec["tmpfs"]:            # first: a read-only folder inside one (a virtual
        os.makedirs(root + path, exist_ok=True)       # environment under /tmp) goes on top, not under it
        mount("tmpfs", root + path, "tmpfs", MS_NOSUID | MS_NODEV, f"mode={mode:o},size={size}")
    for source, target in spec["read_only"]:
        bind_read_only(source, root + target)
    for target, path in spec["symlinks"]:
        os.symlink(target, root + path)
    os.makedirs(root + "/proc")
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if spec["user_namespace"]:
        _no_nested_user_namespaces(root + "/proc", spec["host_user_namespace"])
    bind_read_only(root + "/proc/sys", root + "/proc/sys")   # no kernel setting can be written from inside
    dev = root + "/dev"
    os.makedirs(dev)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID, "mode=0755,size=64k")
    for name in DEVICES:
        open(f"{dev}/{name}", "w").close()
        mount(f"/dev/{name}", f"{dev}/{name}", None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{dev}/{name}")
    os.makedirs(dev + "/shm")
    mount("tmpfs", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV, f"mode=1777,size={spec['shm_bytes']}")
    os.chdir(root)
    _check(libc.syscall(PIVOT_ROOT[platform.machine()], b".", b"."), "pivot_root")
    _check(libc.umount2(b".", MNT_DETACH), "umount the old root")   # the host's file system is gone
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    socket.sethostname("sandbox")


def main() -> None:
    spec = json.loads(sys.argv[1])
    os.umask(0o022)                                   # the folders made here can be passed by nobody
    build(spec)
    os.chdir(spec["cwd"])
    os.execv(spec["command"][0], spec["command"])   # setpriv's, which drops every privilege, then the command


if __name__ == "__main__":
    main()
