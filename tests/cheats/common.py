"""Cheats that apply to every puzzle, written once and bound to each puzzle by the notebooks' catalogues."""

from __future__ import annotations

import contextlib
import random
import sys
import threading

import torch

import lib.guard.offlimits
import lib.guard.boundary
import lib.sim.context

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


def leaving_the_rank(puzzle):
    """Leave the rank's context (once lib.sim.context.leave(), now dismiss), so that every guard asking
    current_rank() is off, then read the check's case from every thread's frames."""
    def cheat(*args):
        rank = args[0].get_rank() if puzzle.takes_dist else 0
        lib.sim.context.dismiss(threading.current_thread())
        for frame in sys._current_frames().values():
            while frame is not None:
                case = frame.f_locals.get("case")
                if hasattr(case, "expected"):
                    return case.expected[rank]
                frame = frame.f_back
    cheat.__name__ = f"{puzzle.name}_outside_its_rank"
    return cheat


def meters_rewritten(solution):
    """The reference solution, its meters (peak memory, largest tensor, FLOPs, argument reads, clock, bytes sent)
    then rewritten through the engine's handles: what revives any shortcut over a budget."""
    def cheat(*args):
        tracker, runtime = lib.sim.context.current_tracker(), lib.sim.context.current_runtime()
        out = solution(*args)
        tracker.peak = tracker.largest = tracker.flops = 0
        runtime.me().bytes_sent = runtime.me().clock = 0
        return out
    cheat.__name__ = f"{solution.__name__}_its_meters_rewritten"
    return cheat


def engine_through_the_slot(solution):
    """The engine behind dist, through the class's slot descriptor (around dist's private-attribute guard): the rank's
    bytes sent wiped after the reference solution."""
    def cheat(dist, *args):
        engine = type(dist)._engine.__get__(dist)
        out = solution(dist, *args)
        engine._rt.ranks[dist.get_rank()].bytes_sent = 0
        return out
    cheat.__name__ = f"{solution.__name__}_through_dists_slot"
    return cheat


def watch_off_and_back_on(solution):
    """The off-limits watch switched off with the original sys.setprofile the watch keeps, and switched back on by a
    contextlib.ExitStack callback, so that the check finds it in place at the end."""
    def cheat(*args):
        with contextlib.ExitStack() as stack:
            stack.callback(lib.guard.offlimits._SETPROFILE, lib.guard.offlimits._GETPROFILE())
            lib.guard.offlimits._SETPROFILE(None)
            return solution(*args)
    cheat.__name__ = f"{solution.__name__}_with_the_watch_off"
    return cheat


def untracked_work(solution):
    """The reference solution inside the engine's own untracked() block, where no op is counted."""
    def cheat(*args):
        with lib.guard.boundary.untracked():
            return solution(*args)
    cheat.__name__ = f"{solution.__name__}_untracked"
    return cheat


def state_of_its_thread(solution):
    """The rank's state from the arguments its Thread object was started with: the tracker's peak reset."""
    def cheat(*args):
        state = threading.current_thread()._args[0]
        out = solution(*args)
        state.tracker.peak = 0
        return out
    cheat.__name__ = f"{solution.__name__}_via_its_thread"
    return cheat


LEFT_THE_RANK = "dismiss a rank's thread"
HANDLES = ("current_tracker()", "current_runtime()")
WATCH = ("lib.guard.offlimits._SETPROFILE", "sys.setprofile")
SLOT = ("dist._engine", "type(dist)._engine", "no attribute '_engine'")   # dist, or a wrapper around it


def everywhere(module) -> list[tuple]:
    """The cheats every puzzle of a notebook must reject: its answer key (through make_case, through cases(), and
    from the check's frames after leaving the rank), its reference solution with the work hidden from the tracker
    (dispatch off, a thread, the engine's untracked block) or its meters rewritten (through the engine's handles,
    dist's slot, its thread), and the off-limits watch switched off."""
    import importlib

    solutions = importlib.import_module(f"solutions.{module.__name__.rsplit('.', 1)[-1]}")
    found = []
    for puzzle in module.PUZZLES:
        solution = getattr(solutions, puzzle.name)
        found += [(puzzle.name, answer_key(puzzle), ANSWER_KEY), (puzzle.name, cases_key(puzzle), ANSWER_KEY),
                  (puzzle.name, dispatch_off(solution), DISPATCH_OFF), (puzzle.name, in_a_thread(solution), THREAD)]
        found += [(puzzle.name, leaving_the_rank(puzzle), LEFT_THE_RANK),
                  (puzzle.name, meters_rewritten(solution), HANDLES),
                  (puzzle.name, watch_off_and_back_on(solution), WATCH),
                  (puzzle.name, untracked_work(solution), "untracked()"),
                  (puzzle.name, state_of_its_thread(solution), "no attribute '_args'")]
        if puzzle.takes_dist:
            found.append((puzzle.name, engine_through_the_slot(solution), SLOT))
    return found
