"""The problem set: one module per notebook. `ALL` lists every puzzle of the course, in order."""

import importlib
import importlib.util

# The course in order; a module not written yet is simply not there (its notebook is "coming").
COURSE = ["memory", "data_parallel", "zero", "tensor_parallel", "pipeline", "three_d", "moe", "ring_attention",
          "beyond"]

MODULES = [importlib.import_module(f"puzzles.{name}") for name in COURSE
           if importlib.util.find_spec(f"puzzles.{name}") is not None]
ALL = [p for m in MODULES for p in m.PUZZLES]

__all__ = ["ALL", "MODULES", "COURSE"]
