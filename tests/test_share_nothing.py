"""Ranks share nothing: programs that pass data between simulated ranks through Python memory are stopped
with a message naming both ranks, and each of them also breaks (or gives another answer) on real processes.

Every pattern "sums x over the ranks" without communicating it, the way a learner might by accident.
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import io
import logging
import os
import queue
import sys
import threading
import traceback
import typing
import warnings

import pytest
import torch

import lib
import lib.guard.offlimits
import lib.sim
import lib.guard.boundary
import lib.sim.context
from lib.errors import RankFailed
from lib.sim import OutOfView, SharedMemory, per_rank
from lib.sim.ownership import Ownership

WORLD = 2


def _xs() -> list[torch.Tensor]:
    return [torch.arange(4, dtype=torch.float32) + 10 * r for r in range(WORLD)]


EXPECTED = sum(_xs())


# ---- the catalogue ---------------------------------------------------------------------------------------
_board: dict = {}


def module_dict(dist, x):
    """The issue's ring all-reduce: tensors left on a module-level dict, a token passed around the ring."""
    rank, world = dist.get_rank(), dist.get_world_size()
    _board.setdefault(world, {})[rank] = x.clone()
    tok = torch.zeros(1)
    if rank == 0:
        dist.send(tok, 1)
        dist.recv(tok, 1)
    else:
        dist.recv(tok, 0)
        dist.send(tok, 0)
    return torch.stack([_board[world][r].double() for r in range(world)]).sum(0).to(x.dtype)


def _make_closure():
    seen = []

    def closure_list(dist, x):
        seen.append(x.clone())
        dist.barrier()
        return sum(seen[-dist.get_world_size():])
    return closure_list


closure_list = _make_closure()


class Shelf:
    items: list = []


def class_attribute(dist, x):
    Shelf.items.append(x.clone())
    dist.barrier()
    return sum(Shelf.items[-dist.get_world_size():])


NOTEBOOK_MODEL = torch.nn.Linear(4, 1, bias=False)
torch.nn.init.ones_(NOTEBOOK_MODEL.weight)


def notebook_model(dist, x):
    """Trains the model defined in the notebook instead of its own copy: one shared object for every rank."""
    loss = NOTEBOOK_MODEL(x).sum()
    loss.backward()
    with torch.no_grad():
        NOTEBOOK_MODEL.weight -= 0.1 * NOTEBOOK_MODEL.weight.grad
    return NOTEBOOK_MODEL.weight.detach().clone()


MADE_OUTSIDE_THE_RUN = torch.zeros(4)


def default_argument(dist, x, total=MADE_OUTSIDE_THE_RUN):
    total += x
    dist.barrier()
    return total.clone()


LATEST = None


def global_statement(dist, x):
    global LATEST
    mine, LATEST = x.clone(), (LATEST if LATEST is not None else torch.zeros(4))
    previous = LATEST
    LATEST = mine
    dist.barrier()
    return previous + mine


SHARED_MODULE = torch.nn.Module()


def module_attribute(dist, x):
    """A tensor stored on an nn.Module attribute that every rank sees."""
    if dist.get_rank() == 0:
        SHARED_MODULE.cache = x.clone()
    dist.barrier()
    return SHARED_MODULE.cache + x if dist.get_rank() == 1 else x


GENERATOR = torch.Generator().manual_seed(0)


def shared_generator(dist, x):
    """Noise from a generator made in the notebook: the same numbers on every real rank, not here."""
    return x + torch.randn(4, generator=GENERATOR)


_cache: dict = {}


def cache_between_steps(dist, x):
    """Step 1 caches a tensor in a global; step 2 reads the neighbour's cached one."""
    rank, world = dist.get_rank(), dist.get_world_size()
    _cache[rank] = x * 2
    dist.barrier()
    return x + _cache[(rank + 1) % world]


_mailbox: queue.Queue = queue.Queue()


def queue_between_ranks(dist, x):
    """Rank 1 waits for rank 0's tensor on a queue.Queue: it blocks, and nothing can come."""
    if dist.get_rank() == 0:
        dist.barrier()
        _mailbox.put(x.clone())
        return x
    return x + _mailbox.get()


_ready = threading.Event()


def event_between_ranks(dist, x):
    """Rank 0 waits on an Event that rank 1 should set."""
    if dist.get_rank() == 0:
        _ready.wait()
    else:
        _ready.set()
    return x


CATALOGUE = [
    (module_dict, "read a tensor that rank"),
    (closure_list, "read a tensor that rank"),
    (class_attribute, "read a tensor that rank"),
    (notebook_model, "wrote in place into a tensor"),
    (default_argument, "rank 0 wrote in place into a tensor made outside the run"),
    (global_statement, "read a tensor that rank"),
    (module_attribute, "read a tensor that rank"),
    (shared_generator, "rank 1 drew random numbers from a torch.Generator that rank 0 also used"),
    (cache_between_steps, "read a tensor that rank"),
    (queue_between_ranks, "rank 1 is blocked outside dist"),
    (event_between_ranks, "rank 0 is blocked outside dist"),
]


def _forget() -> None:
    """Empty every shared place, so that a pattern starts from what a fresh notebook would hold."""
    global LATEST
    _board.clear()
    _cache.clear()
    Shelf.items.clear()
    _ready.clear()
    vars(SHARED_MODULE).pop("cache", None)
    LATEST = None
    while not _mailbox.empty():
        _mailbox.get_nowait()


@pytest.fixture(autouse=True)
def fresh_state():
    _forget()
    yield


@pytest.mark.parametrize("fn,words", CATALOGUE, ids=[f.__name__ for f, _ in CATALOGUE])
def test_sharing_is_stopped_in_simulation(fn, words):
    with pytest.raises(SharedMemory) as info:
        lib.sim.run(fn, WORLD, per_rank(_xs()), timeout=20.0)
    message = str(info.value)
    assert words in message, message
    assert "Hint:" in message
    if "read a tensor" in words:
        assert "send it with dist" in message


def test_the_message_points_at_the_learners_line():
    with pytest.raises(SharedMemory) as info:
        lib.sim.run(module_dict, WORLD, per_rank(_xs()))
    assert "test_share_nothing.py" in str(info.value)
    assert "_board[world][r]" in str(info.value)


def test_the_issue_example_fails_the_ring_all_reduce_check(capsys):
    """The ring all-reduce of the issue passed all five cases before; now the check says why it cannot."""
    from puzzles.data_parallel import ring_all_reduce

    def sharing_ring(dist, x):
        rank, world = dist.get_rank(), dist.get_world_size()
        _board.setdefault(world, {})[rank] = x.clone()
        tok = torch.zeros(1)
        for _ in range(2):
            if rank % 2 == 0:
                dist.send(tok, (rank + 1) % world)
                dist.recv(tok, (rank - 1) % world)
            else:
                dist.recv(tok, (rank - 1) % world)
                dist.send(tok, (rank + 1) % world)
        x.copy_(torch.stack([_board[world][r].double() for r in range(world)]).sum(0).to(x.dtype))
        return x

    assert ring_all_reduce.check(sharing_ring, strict=False, show=False) is False
    out = capsys.readouterr().out
    assert "SharedMemory" in out and "read a tensor that rank" in out


def environment_between_ranks(dist, x):
    """Rank 0 leaves its numbers in an environment variable for rank 1 (threads share os.environ)."""
    if dist.get_rank() == 0:
        os.environ["COURSE_TEST_SHARED_X"] = ",".join(str(v) for v in x.tolist())
        dist.barrier()
        return x
    dist.barrier()
    return x + torch.tensor([float(v) for v in os.environ["COURSE_TEST_SHARED_X"].split(",")])


def test_environment_variables_are_each_ranks_own():
    """A variable set by rank 0 is not there for rank 1, as in processes; the KeyError says why; the caller's
    environment is the real one again afterwards, without what the ranks set."""
    with pytest.raises(RankFailed) as info:
        lib.sim.run(environment_between_ranks, WORLD, per_rank(_xs()))
    message = str(info.value)
    assert "rank 1" in message and "which rank 0 set during the run" in message
    assert "Send the value with dist" in message
    assert "COURSE_TEST_SHARED_X" not in os.environ and type(os.environ) is os._Environ

    def own_and_others(dist):
        rank = dist.get_rank()
        os.environ[f"COURSE_TEST_RANK_{rank}"] = str(rank)
        dist.barrier()
        return (os.environ[f"COURSE_TEST_RANK_{rank}"], os.environ.get(f"COURSE_TEST_RANK_{1 - rank}"),
                os.environ.get("PATH") == PATH)
    PATH = os.environ.get("PATH")
    assert lib.sim.run(own_and_others, WORLD).results == [("0", None, True), ("1", None, True)]
    assert not any(k.startswith("COURSE_TEST_RANK_") for k in os.environ)


@pytest.mark.slow
def test_environment_between_ranks_fails_on_real_processes_too():
    outcome = _real(environment_between_ranks)
    assert isinstance(outcome, RankFailed) and "KeyError" in str(outcome), outcome


def file_between_ranks(dist, x, path):
    """Rank 0 writes its numbers to a file that rank 1 reads: it works between processes of one machine, not
    across machines, and the simulator would count none of it."""
    if dist.get_rank() == 0:
        with open(path, "w") as f:
            f.write(",".join(str(v) for v in x.tolist()))
        dist.barrier()
        return x
    dist.barrier()
    return x + torch.tensor([float(v) for v in path.read_text().split(",")])


_OPEN_KEPT_FROM_BEFORE_THE_RUN, _GETFRAME_KEPT_FROM_BEFORE_THE_RUN = open, sys._getframe


def file_through_the_c_originals(dist, path, which):
    """open as a module-level alias kept from outside the run, and the C functions behind open and os.open."""
    import _io
    import posix
    opened = [_OPEN_KEPT_FROM_BEFORE_THE_RUN, _io.open, lambda p, mode: posix.open(p, posix.O_RDONLY)][which]
    return opened(path, "r")


def frame_through_an_alias(dist, x):
    return x + len(_GETFRAME_KEPT_FROM_BEFORE_THE_RUN(1).f_locals)


def test_files_and_frames_are_refused_however_reached(tmp_path):
    (tmp_path / "x.txt").write_text("1")
    for which in range(3):
        with pytest.raises(OutOfView, match="rank 0 called open .a file. at test_share_nothing.py"):
            lib.sim.run(file_through_the_c_originals, 1, tmp_path / "x.txt", which)
    with pytest.raises(OutOfView, match="called sys._getframe at test_share_nothing.py"):
        lib.sim.run(frame_through_an_alias, WORLD, per_rank(_xs()))


def frame_through_the_engines_blind_read(dist, x):
    """lib.guard.audit.caller_file reads frames with the audit hook passing over them: an int whose __add__ runs
    while it reads would take a frame unseen (and through f_back the check's own)."""
    from lib.guard.audit import caller_file

    class Depth(int):
        def __add__(self, other):
            return int(sys._getframe(0).f_back is not None) + other
    caller_file(Depth(1))
    return x


def test_the_engines_blind_frame_read_runs_nothing_of_the_callers():
    with pytest.raises(RankFailed, match="caller_file"):
        lib.sim.run(frame_through_the_engines_blind_read, WORLD, per_rank(_xs()))


def test_files_are_out_of_the_simulators_view(tmp_path):
    with pytest.raises(OutOfView) as info:
        lib.sim.run(file_between_ranks, WORLD, per_rank(_xs()), tmp_path / "x.txt")
    assert "rank 0 called open (a file)" in str(info.value) and "Hint:" in str(info.value)
    assert not (tmp_path / "x.txt").exists()
    with pytest.raises(OutOfView, match="rank 1 called open"):        # pathlib's reads too
        lib.sim.run(lambda dist, p: p.read_text() if dist.get_rank() else "", WORLD, tmp_path)
    assert (tmp_path / "y.txt").write_text("outside a run, files are files") > 0


def storage_bytes_into_a_buffer(dist, x):
    """Saved bytes written to a Python buffer, where the memory tracker does not look (read back later)."""
    buffer = io.BytesIO()
    x.untyped_storage()._write_file(buffer, True, True, x.element_size())
    return x


def tensor_over_outside_bytes(dist, x):
    return x + torch.frombuffer(bytearray(x.numel() * x.element_size()), dtype=x.dtype)


def storage_over_outside_bytes(dist, x):
    return x + torch.UntypedStorage.from_buffer(bytearray(4), dtype=torch.uint8).size()


@pytest.mark.parametrize("fn,what", [(storage_bytes_into_a_buffer, "_write_file"),
                                     (tensor_over_outside_bytes, "torch.frombuffer"),
                                     (storage_over_outside_bytes, "from_buffer")])
def test_bytes_outside_torch_are_refused(fn, what):
    with pytest.raises(OutOfView) as info:
        lib.sim.run(fn, WORLD, per_rank(_xs()))
    assert "rank 0 called" in str(info.value) and what in str(info.value) and "Hint:" in str(info.value)


# ---- the simulator's own objects: the frames below the function and the dispatch-mode stack -----------------
def frame_below(dist, x):
    """Every rank's inputs (and the rank's meters) from the simulator's frame under the function."""
    return x + len(sys._getframe(1).f_locals)


def inspect_frame_below(dist, x):
    return x + len(inspect.currentframe().f_back.f_locals)


def inspect_stack(dist, x):
    return x + len(inspect.stack())


def walk_the_stack(dist, x):
    return x + len(list(traceback.walk_stack(None)))


def rewrite_the_peak(dist, x):
    """Its own memory tracker, found on torch's dispatch-mode stack, told that its peak is its current bytes."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    big = torch.zeros(10_000)
    del big
    for mode in _get_current_dispatch_mode_stack():
        if hasattr(mode, "peak"):
            mode.peak = mode.current
    return x


def meters_behind_dist(dist, x):
    """The rank's bytes sent, reached through the simulator's objects behind dist."""
    dist._rt.ranks[dist.get_rank()].bytes_sent = 0
    return x


def engine_behind_dist(dist, x):
    """The rank's engine, the one slot of the dist it holds (every rank's runtime behind it)."""
    dist._engine._rt.ranks[dist.get_rank()].bytes_sent = 0
    return x


def underscore_of_dist(dist, x):
    return x + len(str(dist._))


def vars_of_dist(dist, x):
    return x + len(vars(dist))


def work_handles_runtime(dist, x):
    peer = 1 - dist.get_rank()
    work = dist.isend(x, peer)
    dist.recv(torch.empty_like(x), peer)
    work._runtime.ranks[dist.get_rank()].bytes_sent = 0
    return x


def dispatch_stack_at(dist, x):
    torch._C._get_dispatch_stack_at(0)
    return x


def originals_as_a_list(dist, x):
    """The run's original arguments (every rank's inputs), read without an op: Tensor.tolist()."""
    return torch.tensor(ORIGINALS[1 - dist.get_rank()].tolist()) + x


ORIGINALS = _xs()


# ---- doors Python's C code opens, refused by the audit hook (lib.guard.audit) whichever way they are reached ------
def traceback_frame(dist, x):
    try:
        raise LookupError
    except LookupError as e:
        return x + len(e.__traceback__.tb_frame.f_back.f_locals)


def generator_frame(dist, x):
    def walk():
        yield
    steps = walk()
    next(steps)
    return x + len(steps.gi_frame.f_back.f_locals)


def inspect_trace(dist, x):
    try:
        raise LookupError
    except LookupError:
        return x + len(inspect.trace()[0].frame.f_back.f_locals)


def walk_the_traceback(dist, x):
    try:
        raise LookupError
    except LookupError as e:
        return x + len([frame.f_back for frame, _ in traceback.walk_tb(e.__traceback__)])


def slots_of_dist(dist, x):
    """object.__getstate__ of a slotted object: its slots, the engine among them."""
    return x + len(dist.__getstate__()[1])


def pickled_work(dist, x):
    return x + len(dist.isend(x, 1 - dist.get_rank()).__reduce_ex__(2))


def collector_objects(dist, x):
    import gc
    return x + len(gc.get_objects())


def collector_through_an_alias(dist, x):
    """The collector's C function kept from before the run, as a closure cell or `__wrapped__` would keep it."""
    return x + len(_REFERRERS(x))


_REFERRERS = __import__("gc").get_referrers


def profiler(dist, x):
    sys.setprofile(lambda frame, event, arg: None)
    sys.setprofile(None)
    return x


# ---- the engine's own doors: its context, its handles, its private names, its untracked block ------------------------
def leaving_the_rank(dist, x):
    """A rank that left its rank (once lib.sim.context.leave()) would switch off every guard asking current_rank()."""
    lib.sim.context.dismiss(threading.current_thread())
    return x + len(sys._current_frames())


def the_ranks_tracker(dist, x):
    lib.sim.context.current_tracker().peak = 0
    return x


def the_runtime(dist, x):
    lib.sim.context.current_runtime().me().bytes_sent = 0
    return x


def the_ranks_registry(dist, x):
    lib.sim.context._ranks.clear()
    return x


def the_watchs_own_setter(dist, x):
    lib.guard.offlimits._SETPROFILE(None)
    return x


def the_dispatch_stack_kept_by_the_engine(dist, x):
    import lib.guard.boundary
    lib.guard.boundary._DISPATCH_STACK_AT(0).peak = 0
    return x


def vars_of_an_engine_module(dist, x):
    return x + len(vars(lib.sim.context))


def engine_through_the_slot_descriptor(dist, x):
    """The class's slot descriptor reads the slot around dist's own guard."""
    type(dist)._engine.__get__(dist)._rt.ranks[dist.get_rank()].bytes_sent = 0
    return x


def engine_through_the_classs_dict(dist, x):
    return x + len(vars(type(dist)))


def work_handles_slot_descriptor(dist, x):
    peer = 1 - dist.get_rank()
    work = dist.isend(x, peer)
    dist.recv(torch.empty_like(x), peer)
    type(work)._runtime.__get__(work).ranks[dist.get_rank()].bytes_sent = 0
    return x


def engine_read_statically(dist, x):
    """inspect.getattr_static reads a class's __dict__ around every __getattribute__."""
    return inspect.getattr_static(dist, "_engine").__get__(dist)


def untracked_block(dist, x):
    with lib.guard.boundary.untracked():
        return x @ torch.ones(4, 4)


def tracer_through_the_library(dist, x):
    """A profiler set by Python's library (an ExitStack's callback) instead of the rank's own line."""
    import contextlib
    with contextlib.ExitStack() as stack:
        stack.callback(sys.setprofile, lambda frame, event, arg: None)
    return x


def a_process(dist, x):
    import subprocess
    subprocess.run(["true"])
    return x


def disguised_as_the_engine(dist, x):
    """Code compiled under an engine file's name, which every guard asking whose code it is would take for the
    engine's own."""
    namespace = {}
    exec(compile("def peek():\n    return lib.sim.context.current_tracker()\n", lib.sim.context.__file__, "exec"),
         {"lib": lib}, namespace)
    return x + namespace["peek"]().flops


def a_nested_run(dist, x):
    """A simulation of its own inside the rank: its ranks' work would be nobody's."""
    from lib.sim.runtime import Runtime
    from lib.sim.cost import CostModel
    from lib.sim.dist import SimDist
    Runtime(1, CostModel(), 5.0, 2**30).run(lambda d: x @ torch.ones(4, 4), (), {}, SimDist)
    return x


@pytest.mark.parametrize("fn,what", [(leaving_the_rank, "dismiss a rank's thread"),
                                     (the_ranks_tracker, "current_tracker()"), (the_runtime, "current_runtime()"),
                                     (the_ranks_registry, "lib.sim.context._ranks"),
                                     (the_watchs_own_setter, "lib.guard.offlimits._SETPROFILE"),
                                     (the_dispatch_stack_kept_by_the_engine, "lib.guard.boundary._DISPATCH_STACK_AT"),
                                     (vars_of_an_engine_module, "lib.sim.context.__dict__"),
                                     (engine_through_the_slot_descriptor, "type(dist)._engine"),
                                     (engine_through_the_classs_dict, "type(dist).__dict__"),
                                     (work_handles_slot_descriptor, "type(work)._runtime"),
                                     (engine_read_statically, "inspect.getattr_static"),
                                     (untracked_block, "untracked()"),
                                     (tracer_through_the_library, "sys.setprofile"),
                                     (a_process, "subprocess.Popen"),
                                     (disguised_as_the_engine, "compiled code as")])
def test_the_engines_own_doors_are_shut(fn, what):
    with pytest.raises(OutOfView) as info:
        lib.sim.run(fn, WORLD, per_rank(_xs()))
    message = str(info.value)
    assert message.startswith(("rank 0 ", "rank 1 ")) and what in message and "test_share_nothing.py" in message
    assert "Hint:" in message


def test_a_run_inside_a_rank_is_refused():
    with pytest.raises(lib.sim.InvalidCall, match="from inside a simulated rank"):
        lib.sim.run(a_nested_run, WORLD, per_rank(_xs()))


def test_a_ranks_thread_holds_none_of_the_engines_state_nor_a_tracer_set_before_the_run():
    seen = []

    def spy(frame, event, arg):
        seen.append(frame)
    threading.setprofile(spy)
    try:
        result = lib.sim.run(lambda dist, x: (hasattr(threading.current_thread(), "_args"), sys.getprofile()), WORLD,
                             per_rank(_xs()))
    finally:
        threading.setprofile(None)
    assert result.results == [(False, None)] * WORLD and not seen


def test_a_rank_reads_its_own_clock_and_flops_as_numbers():
    def prog(dist):
        a = torch.ones(8, 8)
        before = lib.sim.context.flops()
        a @ a
        return lib.sim.context.flops() - before, lib.sim.context.clock() > 0
    assert lib.sim.run(prog, WORLD).results == [(2 * 8 ** 3, True)] * WORLD


@pytest.mark.parametrize("fn,what", [(frame_below, "sys._getframe"), (inspect_frame_below, "inspect.currentframe"),
                                     (inspect_stack, "inspect.stack"), (walk_the_stack, "traceback.walk_stack"),
                                     (rewrite_the_peak, "_get_current_dispatch_mode_stack"),
                                     (dispatch_stack_at, "_get_dispatch_stack_at"),
                                     (meters_behind_dist, "dist._rt"), (vars_of_dist, "dist.__dict__"),
                                     (engine_behind_dist, "dist._engine"),
                                     (underscore_of_dist, "dist._ "),
                                     (work_handles_runtime, "work._runtime"),
                                     (slots_of_dist, "dist.__getstate__"), (pickled_work, "work.__reduce_ex__"),
                                     # Python's C code's doors, refused by the audit hook however reached
                                     (traceback_frame, "tb_frame (the frame of a traceback)"),
                                     (generator_frame, "gi_frame (the frame of a generator)"),
                                     (inspect_trace, "tb_frame"), (walk_the_traceback, "tb_frame"),
                                     (collector_objects, "gc.get_objects"),
                                     (collector_through_an_alias, "gc.get_referrers"),
                                     (profiler, "sys.setprofile")])
def test_the_simulators_own_objects_are_refused(fn, what):
    with pytest.raises(OutOfView) as info:
        lib.sim.run(fn, WORLD, per_rank(_xs()))
    message = str(info.value)
    assert message.startswith(("rank 0 ", "rank 1 ")) and what in message and "test_share_nothing.py" in message
    assert "Hint:" in message


def test_the_patches_do_not_hand_out_what_they_guard():
    """functools.wraps would leave the original one attribute away (`__wrapped__`)."""
    def patched():
        return [torch.Tensor.numpy, torch.Tensor.tolist, torch.Tensor.data_ptr, torch.frombuffer,
                threading.Thread.start, torch._C._DisableTorchDispatch, torch.save]
    with lib.guard.boundary.guarding():          # as while a run lasts
        during = patched()
    assert all(getattr(p, "_lib_sim_patch", False) for p in during)
    assert not [p for p in during if hasattr(p, "__wrapped__")]
    assert not [p for p in patched() if getattr(p, "_lib_sim_patch", False)]


def test_frames_and_the_collector_work_outside_a_rank():
    import gc
    try:
        raise LookupError
    except LookupError as e:
        assert e.__traceback__.tb_frame.f_code.co_name == "test_frames_and_the_collector_work_outside_a_rank"
    assert gc.get_referrers(WORLD) is not None and inspect.trace() == []


def test_tolist_of_the_originals_is_a_read_of_the_runs_tensors():
    with pytest.raises(SharedMemory) as info:
        lib.sim.run(originals_as_a_list, WORLD, per_rank(ORIGINALS))
    assert "Tensor.tolist()" in str(info.value) and "tensor of the run itself" in str(info.value)


def libraries_reading_their_callers_frame(dist, x):
    """Python's library reads frames for its own bookkeeping (logging, namedtuple, typing, dataclasses, warnings,
    a traceback printed in an except): allowed inside a rank."""
    logging.getLogger("tests.share_nothing").debug("rank %d", dist.get_rank())
    Pair = collections.namedtuple("Pair", "a b")
    Named = typing.NamedTuple("Named", [("a", int)])
    Made = dataclasses.make_dataclass("Made", ["a"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.warn("a warning from inside a rank", stacklevel=2)
    try:
        raise ValueError("caught")
    except ValueError:
        traceback.format_exc()
    return x + Pair(1, 2).a + Named(1).a + Made(1).a + len(x.tolist())


def test_libraries_reading_frames_still_run_and_frames_work_outside_a_rank():
    result = lib.sim.run(libraries_reading_their_callers_frame, WORLD, per_rank(_xs()))
    assert torch.equal(result.results[1], _xs()[1] + 7)

    def here():
        return sys._getframe().f_code.co_name, sys._getframe(1).f_code.co_name, inspect.currentframe().f_code.co_name
    assert here() == ("here", "test_libraries_reading_frames_still_run_and_frames_work_outside_a_rank", "here")


# ---- what stays allowed ------------------------------------------------------------------------------------
TABLE = torch.arange(4, dtype=torch.float32)


def reads_a_constant(dist, x):
    return x + TABLE                        # a global read by every rank, as a forked process may


def own_global_cache(dist, x):
    _cache[dist.get_rank()] = x * 2         # each rank reads back only what it stored itself
    dist.barrier()
    return _cache[dist.get_rank()] + 1


def own_generator(dist, x):
    g = torch.Generator().manual_seed(1)
    return x + torch.randn(4, generator=g)


def global_rng(dist, x):
    return x + torch.randn(4)               # every rank starts from the caller's random state


ALLOWED = [reads_a_constant, own_global_cache, own_generator, global_rng]


@pytest.mark.parametrize("fn", ALLOWED)
def test_what_processes_may_do_still_runs(fn):
    lib.sim.run(fn, WORLD, per_rank(_xs()))


@pytest.mark.slow
@pytest.mark.parametrize("fn", ALLOWED)
def test_what_processes_may_do_gives_the_real_answer(fn):
    torch.manual_seed(123)
    simulated = lib.sim.run(fn, WORLD, per_rank(_xs())).results
    torch.manual_seed(123)
    real = _real(fn)
    for r in range(WORLD):
        torch.testing.assert_close(simulated[r], real[r])


def test_global_rng_is_per_rank_and_leaves_the_caller_alone():
    torch.manual_seed(7)
    expected = torch.randn(4)
    torch.manual_seed(7)
    result = lib.sim.run(lambda dist: torch.randn(4), 3)
    for r in range(3):
        assert torch.equal(result.results[r], expected)      # each rank starts from the caller's state
    assert torch.equal(torch.randn(4), expected)             # and the caller's state is untouched


# ---- the same programs on real processes ---------------------------------------------------------------------
def _real(fn):
    """fn on real gloo processes, each given its own x: the results, or the error a rank raised."""
    def main(dist):
        return fn(dist, _xs()[dist.get_rank()])
    try:
        return lib.launch(main, WORLD, timeout=8.0)
    except (RankFailed, lib.LaunchError) as e:
        return e


def _shared_answer(fn, monkeypatch):
    """What the simulator would answer if it let the ranks share memory (None where it would hang)."""
    with monkeypatch.context() as m:
        m.setattr(Ownership, "check", lambda *args: None)
        try:
            return lib.sim.run(fn, WORLD, per_rank(_xs()), timeout=20.0).results
        except SharedMemory:
            return None                       # blocked on another rank: it would hang


@pytest.mark.slow
@pytest.mark.parametrize("fn", [f for f, _ in CATALOGUE], ids=[f.__name__ for f, _ in CATALOGUE])
def test_sharing_breaks_on_real_processes(fn, monkeypatch):
    """What simulation stops would not have worked: on real processes each pattern raises, hangs, or gives
    another answer than sharing memory gave."""
    shared = _shared_answer(fn, monkeypatch)
    _forget()
    outcome = _real(fn)
    if isinstance(outcome, Exception):
        return
    assert shared is not None, f"{fn.__name__} hangs through shared memory, yet returned on real ranks"
    assert any(not torch.equal(outcome[r], shared[r]) for r in range(WORLD)), \
        f"{fn.__name__} gives the shared-memory answer on real ranks too"
