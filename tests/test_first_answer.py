"""The first answer comes without the costs it does not need: the progress cell reads saved notebooks without
nbformat (and its jsonschema), a notebook imports its own puzzle module only, the stub is answered without building
cases, and torch's first-use imports wait until after the first answer (lib.notebook.warm_up). No timing is asserted:
bench/first_answer.py measures it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import puzzles
from bench.first_answer import FirstAnswer, Seconds, table
from lib.checker.puzzle import UNATTEMPTED
from lib.errors import is_the_stub
from lib.notebook.warm_up import MODULES
from lib.notebook.cells import puzzle_cells, source, up_to_first_check
from tools import NOTEBOOKS, ROOT, course_notebooks

DEFERRED = tuple(MODULES.values())
NEVER = ("nbformat", "jsonschema", "rfc3987_syntax")


def _python(code: str, cwd: Path = ROOT) -> dict:
    """Run `code` in a fresh interpreter on this checkout; it prints one JSON line last, returned here."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg",
                                            "COURSE_STRICT": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_progress_cell_imports_neither_nbformat_nor_other_notebooks_puzzles():
    seen = _python(f"""
        import io, json, sys
        from contextlib import redirect_stdout
        from tools.progress import progress
        with redirect_stdout(io.StringIO()) as out:
            progress("02_data_parallel")
        print(json.dumps({{"out": out.getvalue(), "modules": sorted(m for m in sys.modules if m.split(".")[0] in
                          {list(NEVER)!r} or m.startswith("puzzles.") or m in {list(DEFERRED)!r})}}))
        """, cwd=NOTEBOOKS)
    assert "02_data_parallel: 0 of 6 solved" in seen["out"]
    assert seen["modules"] == ["puzzles.data_parallel"]


def test_each_course_notebook_finds_its_own_puzzle_module():
    for path in course_notebooks():
        module = puzzles.of_notebook(path.stem)
        assert module is not None and module.NOTEBOOK == path.stem
    assert {m.NOTEBOOK for m in puzzles.MODULES} == {p.stem for p in course_notebooks()}
    assert puzzles.of_notebook("10_not_yet") is None and puzzles.of_notebook("scratch") is None
    assert puzzles.of_notebook("02_zero") is None                # the number and the name must agree


def _function(cell_source: str):
    namespace: dict = {}
    exec(compile(cell_source, "<cell>", "exec"), namespace)
    return next(v for k, v in namespace.items() if callable(v) and not k.startswith("__"))


def test_the_shipped_stubs_are_recognised_and_nothing_that_might_not_raise_is():
    for path in course_notebooks():
        for name, cell in puzzle_cells(json.loads(path.read_text())).items():
            assert is_the_stub(_function(source(cell))), f"{path.stem}: {name}"
    for code in ("def f(dist, x):\n    x = x + 1\n    raise NotImplementedError\n",
                 "def f(dist, x):\n    raise NotImplementedError('later')\n",
                 "def f(dist, x):\n    raise NotImplementedError\n    yield x\n",
                 "async def f(dist, x):\n    raise NotImplementedError\n",
                 "NotImplementedError = ValueError\ndef f(dist, x):\n    raise NotImplementedError\n"):
        assert not is_the_stub(_function(code)), code
    assert not is_the_stub(lambda dist, x: x) and not is_the_stub(print)


def _stub(dist, *args):
    raise NotImplementedError


def _stub_after_work(dist, *args):
    """Not recognised without running (it works first): its answer comes from running the cases."""
    args = list(args)
    raise NotImplementedError


@pytest.mark.parametrize("puzzle", puzzles.ALL, ids=[p.name for p in puzzles.ALL])
def test_the_stub_answered_without_cases_says_what_running_them_says(puzzle):
    known, ran = puzzle.evaluate(_stub, seed=0), puzzle.evaluate(_stub_after_work, seed=0)
    assert known.status == ran.status == UNATTEMPTED
    assert known.message == ran.message


def _notebook_in_a_shell(path: Path) -> dict:
    """The notebook's cells up to its first check in an IPython shell that defers as a kernel does, then one cell
    more: which deferred modules were imported before the first answer and after it, and what it printed."""
    return _python(f"""
        import io, json, sys
        from contextlib import redirect_stdout
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance()
        seen = []                             # the modules as each cell ends, before the warm-up's hook starts it
        shell.events.register("post_run_cell", lambda result: seen.append(set(sys.modules)))
        from lib.notebook import warm_up as first_use
        first_use.in_kernel()                 # lib.checker.puzzle does this in a notebook kernel (a ZMQ shell)
        deferred, never = {list(DEFERRED)!r}, {list(NEVER)!r}
        for cell in {up_to_first_check(json.loads(path.read_text()))!r}:
            with redirect_stdout(io.StringIO()) as out:
                result = shell.run_cell(cell)
            result.raise_error()
        before = sorted(m for m in deferred + never if m in seen[-1])
        shell.run_cell("pass")
        after = sorted(m for m in deferred + never if m in sys.modules)
        import gc
        print(json.dumps({{"answer": out.getvalue(), "before": before, "after": after,
                          "uses": first_use._warm_up.uses, "drawn": first_use._warm_up.drawn,
                          "frozen": gc.get_freeze_count()}}))
        """, cwd=NOTEBOOKS)


@pytest.mark.slow
@pytest.mark.parametrize("path", course_notebooks(), ids=[p.stem for p in course_notebooks()])
def test_the_first_answer_comes_before_torchs_first_use_imports(path):
    seen = _notebook_in_a_shell(path)
    assert "is not solved yet" in seen["answer"]
    assert "torch._dynamo" not in seen["before"]
    assert not set(NEVER) & set(seen["after"])
    # After the first answer, the warm-up imported what the notebook's checks will meet, and drew the throwaway
    # figure on the shell's thread, before the next cell ran.
    assert {MODULES[use] for use in seen["uses"]} <= set(seen["after"]) and seen["drawn"]
    # and then froze the objects made so far (torch's, matplotlib's) out of the collector's full collections
    assert seen["frozen"] > 100_000


def test_a_fork_and_the_next_cell_wait_for_the_warm_up(tmp_path):
    (tmp_path / "slow_module.py").write_text("import time\ntime.sleep(0.3)\nDONE = True\n")
    seen = _python(f"""
        import json, os, sys
        sys.path.insert(0, {str(tmp_path)!r})
        from IPython.core.interactiveshell import InteractiveShell
        shell = InteractiveShell.instance()
        from lib.notebook import warm_up as first_use
        first_use.MODULES["slow"] = "slow_module"
        first_use.in_kernel()
        first_use.import_ahead("slow")
        deferred = "slow_module" in sys.modules
        shell.run_cell("from lib.notebook import warm_up; warm_up.answered()")     # a check answered in this cell
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:                          # the child: the module whole, or none of it
            os.write(w, b"1" if getattr(sys.modules.get("slow_module"), "DONE", False) else b"0")
            os._exit(0)
        os.waitpid(pid, 0)
        in_child = os.read(r, 1) == b"1"
        shell.run_cell("import sys; done = sys.modules['slow_module'].DONE")
        print(json.dumps({{"deferred": deferred, "in_child": in_child, "next_cell": shell.user_ns.get("done")}}))
        """)
    assert seen == {"deferred": False, "in_child": True, "next_cell": True}


def test_outside_a_kernel_first_use_imports_at_once():
    seen = _python("""
        import json, sys
        from lib.notebook.warm_up import import_ahead
        import_ahead("explicit_gradient")
        print(json.dumps("torch.fx.experimental.symbolic_shapes" in sys.modules))
        """)
    assert seen is True


def test_the_first_answer_table_compares_each_notebook_with_import_torch():
    torch_alone = Seconds(2.0, 2.0, 3)
    rows = [FirstAnswer("02_data_parallel", 8, Seconds(5.0, 3.9, 3), Seconds(3.0, 2.5, 3), answer="○ not yet"),
            FirstAnswer("03_zero", 5, Seconds(6.0, 4.2, 3), Seconds(3.0, 2.5, 3), Seconds(7.0, 5.0, 3))]
    lines = table(rows, torch_alone, Seconds(5.0, 3.0, 3)).splitlines()
    assert "4.00 s of CPU here" in lines[0]
    assert "| 02_data_parallel | 8 | 5.00 s | 3.90 s | 1.95× (met) | 2.50 s | - | - | ○ not yet |" in lines
    assert any(line.startswith("| 03_zero |") and "2.10× (missed)" in line and "7.00 s | 5.00 s" in line
               for line in lines)
    assert "JupyterLab" in lines[-1]
    earlier = FirstAnswer("02_data_parallel", 8, Seconds(5.0, 3.9, 3), Seconds(3.0, 2.5, 3), answer="○ not yet",
                          before=Seconds(9.0, 7.0, 3))
    lines = table([earlier], torch_alone, before="commit abc1234").splitlines()
    assert "Before: commit abc1234" in lines[0] and "| before: CPU |" in lines[2]
    assert "| 1.95× (met) | 2.50 s | 7.00 s (3.50×) | - | - | ○ not yet |" in lines[4]


def test_the_first_answer_cells_end_at_the_first_check():
    for path in course_notebooks():
        nb = json.loads(path.read_text())
        cells = up_to_first_check(nb)
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        hosted = "tools/hosted" in cells[0] or "Opened alone" in cells[0]     # the hosts' first cell (tools.stamp)
        assert "progress(" in cells[1 if hosted else 0] and cells == [source(c) for c in code[:len(cells)]]
        assert "check" in code[len(cells) - 1]["metadata"]["tags"]
        assert not any("check" in c["metadata"].get("tags", []) for c in code[:len(cells) - 1])
