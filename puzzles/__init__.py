"""The problem set: one module per notebook. `ALL` lists every puzzle of the course, in order."""

from puzzles import data_parallel, memory

MODULES = [memory, data_parallel]
ALL = [p for m in MODULES for p in m.PUZZLES]

__all__ = ["ALL", "MODULES", "memory", "data_parallel"]
