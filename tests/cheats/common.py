"""Cheats that apply to every puzzle, written once and bound to each puzzle by the notebooks' catalogues."""

from __future__ import annotations

import random
import threading

import torch

ANSWER_KEY = "case was being built inside the function under check"
DISPATCH_OFF = "outside the simulator's view"
THREAD = "thread"


def answer_key(puzzle):
    """Rebuild the check's own case from the seed the real cell used to use, and return its expected result."""
    def cheat(*args):
        dist = args[0] if puzzle.takes_dist else None
        n = dist.get_world_size() if dist is not None else 1
        case = puzzle.make_case(random.Random(f"{puzzle.name}:0"), n)
        return case.expected[dist.get_rank() if dist is not None else 0]
    cheat.__name__ = f"{puzzle.name}_from_answer_key"
    return cheat


def cases_key(puzzle):
    """Ask the puzzle for its cases (expected results included) and return the one matching this rank."""
    def cheat(*args):
        dist = args[0] if puzzle.takes_dist else None
        return puzzle.cases()[0].expected[dist.get_rank() if dist is not None else 0]
    cheat.__name__ = f"{puzzle.name}_from_cases"
    return cheat


def dispatch_off(solution):
    """The reference solution with torch's dispatch (and so the tracker) switched off."""
    def cheat(*args):
        with torch._C._DisableTorchDispatch():
            return solution(*args)
    cheat.__name__ = f"{solution.__name__}_with_dispatch_off"
    return cheat


def in_a_thread(solution):
    """The reference solution run in a helper thread, where the rank's tracker does not look."""
    def cheat(*args):
        out = []
        worker = threading.Thread(target=lambda: out.append(solution(*args)))
        worker.start()
        worker.join()
        return out[0]
    cheat.__name__ = f"{solution.__name__}_in_a_thread"
    return cheat


def under_identity_hooks(solution):
    """`solution` under identity saved-tensor hooks nested inside the check's own, which used to hide every
    saved activation from the memory tracker (give it a version that keeps too much)."""
    def cheat(*args):
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            return solution(*args)
    cheat.__name__ = f"{solution.__name__}_under_identity_hooks"
    return cheat


def everywhere(module) -> list[tuple]:
    """The cheats every puzzle of a notebook must reject: its answer key (through make_case and through
    cases()), and its reference solution with the work hidden from the tracker (dispatch off, a thread)."""
    import importlib

    solutions = importlib.import_module(f"solutions.{module.__name__.rsplit('.', 1)[-1]}")
    found = []
    for puzzle in module.PUZZLES:
        solution = getattr(solutions, puzzle.name)
        found += [(puzzle.name, answer_key(puzzle), ANSWER_KEY), (puzzle.name, cases_key(puzzle), ANSWER_KEY),
                  (puzzle.name, dispatch_off(solution), DISPATCH_OFF), (puzzle.name, in_a_thread(solution), THREAD)]
    return found
