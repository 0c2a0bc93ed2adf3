"""The student release: the course as shipped, without the answer key.

    python -m tools.release DEST

Copies the notebooks (as shipped: stubs, no outputs), the engine, the problem set, the tools,
the install files, the README and the documents it links (docs/) into DEST, and leaves out solutions/,
the tests (they need the solutions) and the benchmarks. The README loses what only the course repository
has: the parts between `<!-- course only -->` and `<!-- end course only -->`, and the lines marked
`[course only]`, so the documents for instructors and the benchmarks, linked only there, stay behind; the `course`
script loses its commands that need what is left out (tests, benchmarks, the instructors' tools): the lines
between `# course only {` and `# } course only`.
A release can be checked with `python -m tools.release --verify DEST`.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from tools import ROOT

SHIPPED = ["README.md", "course", "pyproject.toml", "environment.yml", "postBuild", ".gitignore", "lib", "puzzles",
           "tools", "notebooks"]
WITHHELD = ["solutions", "tests", "bench", ".ci"]
COURSE_ONLY = re.compile(r"<!-- course only -->\n.*?<!-- end course only -->\n", re.S)
COURSE_ONLY_LINE = "[course only]"
COURSE_ONLY_COMMANDS = re.compile(r"^[ \t]*# course only \{\n.*?^[ \t]*# \} course only\n", re.S | re.M)
# What a student README must not send a student to: commands and folders the release does not have.
NOT_IN_A_RELEASE = ["./course test", "solutions.", "solutions/", "bench", "tests/", COURSE_ONLY_LINE, "course only -->"]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def student_readme(text: str) -> str:
    """The course README without the parts about what the release leaves out."""
    text = COURSE_ONLY.sub("", text)
    return "".join(line for line in text.splitlines(keepends=True) if COURSE_ONLY_LINE not in line)


def student_course(text: str) -> str:
    """The `course` script with only the commands a release can run."""
    return COURSE_ONLY_COMMANDS.sub("", text)


def local_links(markdown: str) -> list[str]:
    """The files of the course a markdown text links to (`docs/TRUST.md`), not web pages."""
    return sorted({target for target in LINK.findall(markdown) if "://" not in target})


def make_release(dest: Path) -> Path:
    if dest.exists() and any(dest.iterdir()):
        raise SystemExit(f"release: {dest} exists and is not empty; choose a new folder")
    dest.mkdir(parents=True, exist_ok=True)
    for name in SHIPPED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints"))
        elif name == "README.md":
            (dest / name).write_text(student_readme(source.read_text()))
        elif name == "course":
            (dest / name).write_text(student_course(source.read_text()))
            (dest / name).chmod(source.stat().st_mode)
        else:
            shutil.copy2(source, dest / name)
    for link in local_links((dest / "README.md").read_text()):
        if (ROOT / link).is_file() and not (dest / link).exists():
            (dest / link).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / link, dest / link)
    problems = verify(dest)
    if problems:
        raise SystemExit("release: " + "; ".join(problems))
    return dest


def verify(dest: Path) -> list[str]:
    """What would make `dest` leak the answers or fail to work: empty when it is a good release."""
    problems = [f"{name}/ must not be shipped" for name in WITHHELD if (dest / name).exists()]
    for path in (dest / "lib").rglob("*.py"):
        text = path.read_text()
        if "import solutions" in text or "from solutions" in text:
            problems.append(f"{path.relative_to(dest)} imports the solutions")
    readme = (dest / "README.md").read_text() if (dest / "README.md").exists() else ""
    problems += [f"README.md mentions {word!r}, which the release has not" for word in NOT_IN_A_RELEASE
                 if word in readme]
    problems += [f"README.md links {link}, which the release has not" for link in local_links(readme)
                 if (ROOT / link).exists() and not (dest / link).exists()]
    for path in (dest / "notebooks").glob("*.ipynb"):
        if '"outputs": [\n' in path.read_text() and '"output_type"' in path.read_text():
            problems.append(f"{path.name} carries outputs")
    return problems + _imports_alone(dest)


def _imports_alone(dest: Path) -> list[str]:
    """The release's problem set imported in a fresh interpreter that sees the release and the installed packages,
    not this repository: a puzzle module that needs the solutions (or anything else left out) fails here."""
    if not (dest / "puzzles").is_dir():
        return ["puzzles/ is missing"]
    site = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    probe = ("import sys; sys.path[:0] = [sys.argv[1]] + sys.argv[2:]\n"
             "import importlib.util, puzzles\n"
             "print(len(puzzles.ALL), importlib.util.find_spec('solutions') is None)")
    done = subprocess.run([sys.executable, "-S", "-c", probe, str(dest.resolve()), *site], capture_output=True,
                          text=True, timeout=300, cwd=dest)
    words = done.stdout.split()
    if done.returncode != 0 or len(words) != 2:
        last = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return [f"the release's puzzles do not import on their own: {last[0]}"]
    if words[1] != "True":
        return ["the release can import a solutions package"]
    return []


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.release", description=__doc__.split("\n\n")[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--verify", action="store_true", help="check an existing release instead of making one")
    args = parser.parse_args()
    if args.verify:
        problems = verify(args.dest)
        print("\n".join(problems) or "release looks right")
        sys.exit(1 if problems else 0)
    print(f"student release written to {make_release(args.dest)}")


if __name__ == "__main__":
    main()
