"""Every Python the README names: a fresh virtual environment per Python (and torch) with the course's pinned
dependencies, the time and disk space the install takes, then the tests run there.

    python -m bench.pythons                                   # 3.11, 3.12, 3.13; pytest -m "not slow"
    python -m bench.pythons --python 3.12 --torch 2.11.0 -- tests/test_devices.py -m "not slow"
    python -m bench.pythons --venvs /big/disk --keep          # keep the environments (several GB each)
    python -m bench.pythons --python 3.13 --reuse /big/disk/course-py3.13-...   # the tests again, after a fix

Everything after `--` goes to pytest (run with `-n 0` from the repository root). The course is installed in
the environment as ./course installs it (editable, solutions/ left out), not put on PYTHONPATH, which tests of
the student release would see.
The environments go to a temporary folder outside the repository and are removed after each run unless
--keep. Each row replaces the earlier row of the same Python and torch in bench/results/pythons.{json,md}.
pip downloads with --no-cache-dir, so the time is a first install's, as a learner's machine sees it
(torch from the registry; where pip's configuration points at a local wheel, as for 3.11 on the course's
machines, the row says so).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.hosted import requirements

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "pythons"
PYTHONS = ("3.11", "3.12", "3.13")
SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")


def interpreter(version: str) -> str:
    """`python3.X` from PATH, else from pyenv's versions folder."""
    found = shutil.which(f"python{version}")
    if found and subprocess.run([found, "-c", ""], capture_output=True).returncode == 0:
        return found
    for candidate in sorted((Path.home() / ".pyenv" / "versions").glob(f"{version}.*/bin/python{version}")):
        return str(candidate)
    raise SystemExit(f"no python{version} on PATH or in ~/.pyenv/versions")


def disk_bytes(folder: Path) -> int:
    """Bytes the folder takes on disk (allocated blocks, as du counts them)."""
    return sum(os.lstat(Path(d) / f).st_blocks * 512 for d, _, files in os.walk(folder) for f in files)


class InstallFailed(Exception):
    """pip could not install the pins on this Python: the row says why instead of a test count."""


def timed_pip(python: Path, *args: str) -> float:
    start = time.perf_counter()
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-cache-dir", "--disable-pip-version-check",
                           *args], capture_output=True, text=True)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR:")]
        raise InstallFailed(errors[-1] if errors else done.stderr.strip().splitlines()[-1])
    return time.perf_counter() - start


def _version(python: Path) -> str:
    return subprocess.run([str(python), "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True, check=True).stdout.strip()


def probe(python: Path) -> dict:
    """What the environment's torch is: version, CUDA build, the file it came from."""
    code = ("import json, platform, torch; print(json.dumps({'python': platform.python_version(), "
            "'torch': torch.__version__, 'cuda': torch.version.cuda}))")
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_tests(python: Path, pytest_args: list[str], timeout: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"MPLBACKEND": "Agg"}
    start = time.perf_counter()
    done = subprocess.run([str(python), "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-rfE",
                           *pytest_args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    counts = {word.rstrip("s") if word.startswith("error") else word: int(n)
              for n, word in SUMMARY.findall(done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "")}
    failed = [line.split(" - ")[0] for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    return {"exit": done.returncode, "seconds": round(time.perf_counter() - start, 1), "counts": counts,
            "failed": failed, "tail": done.stdout[-3000:] + done.stderr[-1000:]}


def install(folder: Path, version: str, torch_version: str) -> dict:
    """A fresh venv in `folder` with torch, the other pins and the course: how long each part took, its size."""
    start = time.perf_counter()
    subprocess.run([interpreter(version), "-m", "venv", str(folder)], check=True)
    python = folder / "bin" / "python"
    venv_s = time.perf_counter() - start
    others = [p for p in requirements(ROOT / "pyproject.toml", ("test",)) if not p.startswith("torch==")]
    others_s = timed_pip(python, *others)           # first: a pin this Python cannot have fails in seconds
    without_torch = disk_bytes(folder)
    torch_s = timed_pip(python, f"torch=={torch_version}")
    torch_bytes = disk_bytes(folder) - without_torch
    timed_pip(python, "--no-deps", "-e", str(ROOT))
    return {"venv_s": round(venv_s, 1), "torch_install_s": round(torch_s, 1), "torch_bytes": torch_bytes,
            "others_install_s": round(others_s, 1), "total_bytes": disk_bytes(folder)}


def measure(version: str, torch_version: str, venvs: Path, pytest_args: list[str], keep: bool,
            timeout: int, reuse: Path | None = None) -> dict:
    """One Python: a fresh venv (or `reuse`, a kept one, with its earlier row's install figures), the tests;
    the venv removed unless `keep`."""
    folder = reuse or Path(tempfile.mkdtemp(prefix=f"course-py{version}-torch{torch_version}-", dir=venvs))
    try:
        python = folder / "bin" / "python"
        try:
            installed = earlier(probe(python)) if reuse else install(folder, version, torch_version)
        except InstallFailed as e:
            print(f"python {version}, torch {torch_version}: the install failed: {e}", flush=True)
            return {"python": _version(python), "torch": torch_version, "cuda": None, "install_error": str(e),
                    "when": time.strftime("%Y-%m-%d %H:%M")}
        row = {**probe(python), **installed, "pytest_args": pytest_args,
               "tests": run_tests(python, pytest_args, timeout), "when": time.strftime("%Y-%m-%d %H:%M"),
               "load_average_at_end": list(os.getloadavg())}
        print(f"python {row['python']}, torch {row['torch']}: {row['tests']['counts']} "
              f"in {row['tests']['seconds']} s; install {row['torch_install_s'] + row['others_install_s']:.0f} s, "
              f"{row['total_bytes'] / 2**30:.2f} GiB", flush=True)
        return row
    finally:
        if keep or reuse:
            print(f"kept {folder}")
        else:
            shutil.rmtree(folder, ignore_errors=True)


def earlier(found: dict) -> dict:
    """The install figures of the saved row of the same Python and torch."""
    saved = json.loads(RESULTS.with_suffix(".json").read_text())
    row = next(r for r in saved if (r["python"], r["torch"]) == (found["python"], found["torch"]))
    return {k: row[k] for k in ("venv_s", "torch_install_s", "torch_bytes", "others_install_s", "total_bytes")}


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def table(rows: list[dict]) -> str:
    """One line per row: the install's time and size, the tests' counts and time (or why pip failed)."""
    lines = ["| Python | torch (from PyPI) | torch: install, disk | the rest: install | environment on disk "
             "| tests | tests: time |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "install_error" in r:
            lines.append(f"| {r['python']} | {r['torch']} | - | - | - | install failed: {r['install_error']} | - |")
            continue
        counts = ", ".join(f"{n} {word}" for word, n in r["tests"]["counts"].items() if word != "deselected")
        lines.append(f"| {r['python']} | {r['torch']} | {r['torch_install_s']:.0f} s, {_gib(r['torch_bytes'])} "
                     f"| {r['others_install_s']:.0f} s | {_gib(r['total_bytes'])} | {counts} "
                     f"| {r['tests']['seconds']:.0f} s |")
    failures = [f"- Python {r['python']}, torch {r['torch']}: {f}" for r in rows for f in r.get("tests", {}).get(
        "failed", [])]
    tests = sorted({" ".join(r["pytest_args"]) for r in rows if "pytest_args" in r})
    return "\n".join(lines + [""] + [f"Tests run: `{t}`" for t in tests]
                     + (["", "Failed:"] + failures if failures else [])) + "\n"


def save(rows: list[dict], into: Path = RESULTS) -> list[dict]:
    """Merge `rows` into the saved ones (one per Python and torch) and rewrite the JSON and the table."""
    path = into.with_suffix(".json")
    saved = json.loads(path.read_text()) if path.exists() else []
    key = lambda r: (tuple(map(int, r["python"].split("."))), r["torch"])  # noqa: E731
    merged = {key(r): r for r in saved + rows}
    ordered = [merged[k] for k in sorted(merged)]
    path.write_text(json.dumps(ordered, indent=1) + "\n")
    into.with_suffix(".md").write_text(
        "# Every Python the README names (`python -m bench.pythons`)\n\n"
        "A fresh virtual environment per row: torch, then the other pins of pyproject.toml (with the test extra), "
        "then the tests named, run with `-n 0`. Install times are a first download (pip --no-cache-dir) on "
        "the machine and the day in the JSON, which also keeps each run's failures and load.\n\n" + table(ordered))
    return ordered


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ours, pytest_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    ap = argparse.ArgumentParser(prog="python -m bench.pythons", description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", nargs="+", default=list(PYTHONS), help="versions, e.g. 3.10 3.12 (default: all)")
    ap.add_argument("--torch", default=next(p for p in requirements(ROOT / "pyproject.toml")
                                             if p.startswith("torch==")).split("==")[1],
                    help="torch version to install (default: the pinned one)")
    ap.add_argument("--venvs", type=Path, help="where to make the environments (default: the system's temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the environments")
    ap.add_argument("--reuse", type=Path, help="run the tests again in an environment kept earlier (one --python)")
    ap.add_argument("--timeout", type=int, default=7200, help="seconds for each Python's tests")
    args = ap.parse_args(ours)
    rows = [measure(v, args.torch, args.venvs, pytest_args or ["-m", "not slow"], args.keep, args.timeout,
                    args.reuse) for v in args.python]
    print(table(save(rows)))


if __name__ == "__main__":
    main()
