"""The problem set: one module per notebook. `ALL` lists every puzzle of the course, in order.

`MODULES` and `ALL` import every puzzle module when first read: a notebook that imports its own module
(`from puzzles import zero`) pays for that one only."""

import importlib
import importlib.util
from types import ModuleType
from typing import Optional

# The course in order; a module not written yet is simply not there (its notebook is "coming").
COURSE = ["memory", "data_parallel", "zero", "tensor_parallel", "pipeline", "three_d", "moe", "ring_attention",
          "beyond", "trainer"]

__all__ = ["ALL", "MODULES", "COURSE", "of_notebook"]


def _modules() -> list[ModuleType]:
    return [importlib.import_module(f"puzzles.{name}") for name in COURSE
            if importlib.util.find_spec(f"puzzles.{name}") is not None]


def __getattr__(name: str):
    if name == "MODULES":
        value = _modules()
    elif name == "ALL":
        value = [p for m in globals().get("MODULES") or __getattr__("MODULES") for p in m.PUZZLES]
    else:
        raise AttributeError(f"module 'puzzles' has no attribute {name!r}")
    globals()[name] = value
    return value


def of_notebook(notebook: str) -> Optional[ModuleType]:
    """The puzzle module of a notebook such as "03_zero", importing no other (notebook NN is the course's NNth);
    None for a notebook that is not the course's."""
    number = notebook[:2]
    if not number.isdigit() or not 1 <= int(number) <= len(COURSE):
        return None
    name = f"puzzles.{COURSE[int(number) - 1]}"
    module = importlib.import_module(name) if importlib.util.find_spec(name) is not None else None
    return module if getattr(module, "NOTEBOOK", None) == notebook else None
