"""The SPMD runtime: N simulated ranks in one process, one running at a time.

Each rank is a thread, but only one holds the baton: a rank runs until it must wait for a
communication, then hands control back to the scheduler, which resumes the next rank
that can make progress (lowest rank first, round robin). Switching only at communication
makes every run deterministic and makes deadlock a plain fact: every live rank is waiting and no
wait can be satisfied.

Ranks behave like processes: each owns what it allocates (lib.sim.ownership), starts from a copy of
the global random state as a forked process would, has its own environment variables (lib.sim.environ), and
every thread is joined before `run` returns.
"""

from __future__ import annotations

import copy
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from lib.errors import PuzzleError, RankFailed
from lib import guard
from lib.sim import context, threads
from lib.sim.environ import own_environments
from lib.sim.comm import Call, Communicator
from lib.sim.context import current_rank
from lib.sim.cost import CostModel
from lib.sim.dist import SimDist
from lib.sim.errors import (CollectiveMismatch, Deadlock, InvalidCall, OutOfView, RankDied, SharedMemory,
                            SimTimeout)
from lib.sim.links import Link
from lib.sim.output import labelled_output
from lib.units import ordinal
from lib.whose_code import ENGINE
from lib.sim.ownership import SHARE_NOTHING, Ownership
from lib.sim.result import Event, RankStats, SimResult, event
from lib.sim.tracker import UNTRACKED as _UNTRACKED, RankTracker, tracking_switched_off

_RNG = torch.default_generator
_JOIN_TIMEOUT = 10.0     # seconds for every rank thread to finish once the run is over


class _Abort(BaseException):
    """Unwinds a rank's thread when the run is over; BaseException so `except Exception` can't keep it."""


class _Died(BaseException):
    """Unwinds the thread of a rank that dies by an injected fault; BaseException, so it cannot be caught."""


@dataclass(frozen=True)
class PerRank:
    """An argument that differs per rank: rank r receives `values[r]`."""

    values: Sequence[Any]


def per_rank(values: Sequence[Any]) -> PerRank:
    """Mark an argument of `run` as one value per rank, e.g. `per_rank([x0, x1, x2, x3])`."""
    return PerRank(list(values))


class RankState:
    """Everything the runtime knows about one rank."""

    def __init__(self, rank: int, runtime: "Runtime") -> None:
        self.rank = rank
        self.clock = 0.0                 # simulated seconds
        self.segment_start = 0.0         # start of the compute stretch now running
        self.outgoing = Link()           # when this rank's links are busy sending and receiving
        self.incoming = Link()
        self.bytes_sent = 0.0
        self.bytes_received = 0.0
        self.calls: Counter[str] = Counter()
        self.posted: list[Call] = []
        self.waiting: Optional[Call] = None
        self.finished = False
        self.dead = False                # stopped by an injected fault
        self.told_of_failure = False     # a RankDied has been raised to it (lib.real.faults.failure_known)
        self.comm_calls = 0              # communication calls made so far (faults count them)
        self.p2p_log: list[tuple[str, Optional[int]]] = []      # see RankStats.p2p_log
        self.stuck = False               # its thread would not stop when interrupted
        self.result: Any = None
        self.abort = False
        # The baton: held (locked) while the rank waits, released by whoever hands it the baton. A bare lock, which
        # another thread may release: half the CPU of a threading.Semaphore per switch, and a check switches ranks
        # at every collective.
        self.resume = threading.Lock()
        self.resume.acquire()
        self.thread: Optional[threading.Thread] = None
        self.rng: Optional[torch.Tensor] = None     # the global random state while another rank runs
        self.tracker = RankTracker(on_work=self._add_work, clock=self, on_transfer=self._transfer,
                                   on_violation=runtime.fail, limit=runtime.memory_limit / runtime.world_size,
                                   rank=rank, ownership=runtime.ownership)
        self._runtime = runtime

    def _add_work(self, flops: float, nbytes: float, on_host: bool) -> None:
        if self._runtime._aborting:      # the run is ending: stop at this op, should an interrupt have been lost
            raise _Abort()               # (one raised inside a weakref callback is printed and ignored)
        self.clock += self._runtime.cost.compute_time(flops, on_host, nbytes)

    def _transfer(self, nbytes: int, to_host: bool) -> None:
        """A host-device copy: blocks the rank for nbytes over PCIe, drawn as a transfer."""
        self._runtime.close_compute(self)
        op = "to_host" if to_host else "to_device"
        start, self.clock = self.clock, self.clock + self._runtime.cost.transfer_time(nbytes)
        self._runtime.events.append(event(self.rank, op, "pcie", None, nbytes, start, self.clock))
        self.calls[op] += 1
        self.segment_start = self.clock


class Runtime:
    """One simulated run of `fn` on `world_size` ranks."""

    def __init__(self, world_size: int, cost: CostModel, timeout: float, memory_limit: float,
                 faults: Optional[dict[int, int]] = None, read_arguments: bool = False) -> None:
        self.world_size = world_size
        self.read_arguments = read_arguments
        self.faults = dict(faults or {})             # rank -> the communication call (1 = first) it dies at
        self.cost = cost
        self.timeout = timeout
        self.memory_limit = memory_limit
        self.ownership = Ownership()
        self.ranks = [RankState(r, self) for r in range(world_size)]
        self.comm = Communicator(self)
        self.events: list[Event] = []
        self.error: Optional[BaseException] = None
        self.running: Optional[RankState] = None     # the rank holding the baton
        self._aborting = False
        self._yielded = threading.Semaphore(0)
        self._start_rng = torch.get_rng_state()      # every rank starts from it, as forked processes would
        self._start_threads = torch.get_num_threads()
        self.hand_to_rank: Callable[[Any], Any] = lambda value: value   # what a rank's code is handed: the guard's

    @property
    def ending(self) -> bool:
        """Whether the run is stopping: it failed, or its ranks are being stopped."""
        return self.error is not None or self._aborting

    # ---- called from rank threads -------------------------------------------------
    def me(self) -> RankState:
        return self.ranks[current_rank()]

    def fail(self, error: PuzzleError) -> None:
        """Stop the run with `error` (raised where a rank broke a rule); the learner can't catch it."""
        if self.error is None:
            self.error = error
        raise _Abort()

    def untracked(self):
        """The runtime's own temporaries (message copies, reductions) are not the rank's memory. torch's own guard,
        not a generator around it: a check enters it several times per communication call."""
        return _UNTRACKED()

    def check_view(self, state: RankState) -> None:
        """Stop the run if the rank's ops escape its tracker (checked at every dist call and at return)."""
        off = tracking_switched_off(state.tracker)
        if off:
            from lib.sim.ownership import learner_line
            self.fail(OutOfView(
                f"rank {state.rank} reached a dist call or returned while {off}{learner_line()}: work done meanwhile "
                "ran outside the simulator's view, so its time, FLOPs and memory would not count.\nHint: compute with "
                "torch's ordinary ops, without switching dispatch modes off."))

    def close_compute(self, state: RankState) -> None:
        """End the compute stretch before a communication, as a timeline event."""
        if state.clock > state.segment_start:
            self.events.append(event(state.rank, "compute", "compute", None, 0, state.segment_start, state.clock))
        state.segment_start = state.clock

    def record(self, rank: int, op: str, group: str, peer: Optional[int], sent: float, received: float,
               start: float, end: float) -> None:
        state = self.ranks[rank]
        state.bytes_sent += sent
        state.bytes_received += received
        state.calls[op] += 1
        self.events.append(event(rank, op, group, peer, sent or received, start, end))

    def communicating(self, peers: Sequence[int], text: str) -> None:
        """Before a communication call that needs `peers`, in a run with faults (a run without pays nothing): the
        calling rank dies here if a fault says so, and the call fails at once if a peer has died (as gloo reports
        a closed connection)."""
        state = self.me()
        state.comm_calls += 1
        if self.faults.get(state.rank) == state.comm_calls:
            raise _Died()
        dead = next((p for p in peers if self.ranks[p].dead), None)
        if dead is not None:
            state.told_of_failure = True
            raise self._died_error(dead, state.rank, text)

    def _died_error(self, dead: int, rank: int, text: str) -> RankDied:
        return RankDied(dead, f"rank {rank}'s {text} needs rank {dead}, which died at its communication call "
                              f"#{self.faults[dead]} (an injected fault).\nHint: catch the error (a RuntimeError, "
                              f"as torch.distributed raises), then carry on without rank {dead}: a group of the "
                              "survivors (dist.new_group) and the last checkpoint.")

    def _bury(self, state: RankState) -> None:
        """Rank `state` died: fail the calls that need it, waking the ranks that wait on them."""
        state.dead = True
        self.close_compute(state)
        self.comm.bury(state.rank, lambda call: self._died_error(state.rank, call.rank, call.text), state.clock)

    def post(self, call: Call) -> Call:
        self.ranks[call.rank].posted.append(call)          # posted by its own rank: call.rank is the caller's
        return call

    def wait_call(self, call: Call) -> None:
        state = self.me()
        if call.rank != state.rank:
            self.fail(InvalidCall(f"rank {state.rank} waited on a work object of rank {call.rank}."))
        self.close_compute(state)
        while not call.complete:
            state.waiting = call
            self._yield(state)
        state.waiting = None
        if state.tracker.buffers.marks:
            state.tracker.buffers.lift(call)              # the tensor of an async call is the rank's again
        if call.name == "recv" and not call.waited and call.failed is None:
            state.p2p_log.append(("waited", call.peer))     # the sender, also of a receive from any source
        call.waited = True
        if call.failed is not None:
            state.clock = max(state.clock, call.end_time)
            state.segment_start = state.clock
            state.told_of_failure = True
            raise call.failed
        if call.deliver is not None:
            with _UNTRACKED():
                call.deliver()
            call.deliver = None
        state.clock = max(state.clock, call.end_time)
        state.segment_start = state.clock

    def _yield(self, state: RankState) -> None:
        with _UNTRACKED():                       # torch.get_rng_state without its Python layer: one per switch
            state.rng = _RNG.get_state()
        self._hand_off(state)
        state.resume.acquire()
        if state.abort:
            raise _Abort()
        with _UNTRACKED():                       # torch.set_rng_state without its Python layer, which clones it
            _RNG.set_state(state.rng)

    def _hand_off(self, state: RankState) -> None:
        """Pass the baton to the next rank that can run (cyclic order from `state`), or back to the
        scheduler when none can: the run is over, failed, or deadlocked. One thread wake-up per switch."""
        if self.error is None and not self._aborting:
            n = self.world_size
            for step in range(1, n + 1):
                other = self.ranks[(state.rank + step) % n]
                if not other.finished and (other.waiting is None or other.waiting.complete):
                    self.running = other
                    other.resume.release()
                    return
        self.running = None
        self._yielded.release()

    # ---- rank threads -------------------------------------------------------------
    def _rank_main(self, state: RankState, fn: Callable, args: tuple, kwargs: dict, make_dist: Callable) -> None:
        # One intra-op thread per rank (a per-thread setting): only one rank runs at a time, on tiny tensors,
        # where a second thread only spins; on a busy 2-core machine that spinning cost more than the work.
        torch.set_num_threads(1)
        state.resume.acquire()
        try:
            if state.abort:
                return
            with self.untracked():
                torch.set_rng_state(self._start_rng)
            with state.tracker:
                memo: dict = {}
                largest = state.tracker.largest
                with self.untracked():     # the originals are the run's own: only the runtime reads them
                    mine = copy.deepcopy(([a.values[state.rank] if isinstance(a, PerRank) else a for a in args],
                                          {k: v.values[state.rank] if isinstance(v, PerRank) else v
                                           for k, v in kwargs.items()}), memo)
                state.tracker.adopt_copies(memo, largest)
                if self.read_arguments:
                    state.tracker.watch_arguments(mine[0])
                del memo
                hand = self.hand_to_rank
                mine = [hand(a) for a in mine[0]], {k: hand(v) for k, v in mine[1].items()}
                state.result = fn(hand(make_dist(self, state.rank)), *mine[0], **mine[1])
                del mine
                self.check_view(state)
                if state.tracker.buffers.marks:
                    broken = state.tracker.buffers.check_result(state.result)
                    if broken is not None:
                        self.fail(broken)
                self.close_compute(state)
        except _Abort:
            pass
        except _Died:
            self._bury(state)
        except PuzzleError as e:          # a sim rule broken inside a helper the learner called
            if self.error is None:
                self.error = e
        except BaseException as e:         # the learner's code raised
            if self.error is None:
                failure = RankFailed(state.rank, f"{type(e).__name__}: {e}{_hint_for(e)}", _learner_traceback(e), e)
                failure.posted = dict(self.comm.posted)
                self.error = failure
        finally:
            state.finished = True
            self._hand_off(state)

    def run(self, fn: Callable, args: tuple, kwargs: dict, make_dist: Callable, protect: Any = None) -> None:
        if current_rank() is not None:
            raise InvalidCall("lib.sim.run was called from inside a simulated rank; run it from top-level code.")
        self.ownership.protect((args, kwargs, protect))
        _dismiss_ended()
        with guard.around_run(self) as self.hand_to_rank:
            try:
                self._start_and_schedule(fn, args, kwargs, make_dist)
            finally:
                for state in self.ranks:     # a thread that would not stop stays its rank
                    if state.thread is not None and state.thread.is_alive():
                        _LEFT_RUNNING.append(state.thread)
                    elif state.thread is not None:
                        context.dismiss(state.thread)
        torch.set_rng_state(self._start_rng)  # the caller's random state is its own, as a parent process's
        torch.set_num_threads(self._start_threads)     # and so is its number of intra-op threads
        if self.error is not None:
            raise self.error
        uneven = self.comm.uneven_new_groups()
        if uneven:
            raise CollectiveMismatch(uneven)
        leftovers = self.comm.leftovers()
        if leftovers:
            raise CollectiveMismatch("the run ended with communication left unmatched:\n" + leftovers +
                                     "\nHint: every send needs a recv on the other side, and every member "
                                     "of a group must call each of its collectives.")
        self._check_waited()

    def _start_and_schedule(self, fn: Callable, args: tuple, kwargs: dict, make_dist: Callable) -> None:
        for state in self.ranks:
            state.thread = _RankThread(target=self._rank_main, args=(state, fn, args, kwargs, make_dist),
                                       name=f"sim-rank-{state.rank}", daemon=True)
            state.thread.start()
            context.admit(state.thread, state.rank, self, state.tracker)
            state.thread.begun.wait(_JOIN_TIMEOUT)
        deadline = time.monotonic() + self.timeout
        with labelled_output(current_rank), own_environments(self.world_size):
            try:
                self._schedule(deadline)
            except BaseException as e:
                if self.error is None and isinstance(e, PuzzleError):
                    self.error = e
                elif not isinstance(e, PuzzleError):
                    self._stop_threads()
                    raise                    # KeyboardInterrupt: stop every rank, then let it through
            self._stop_threads()

    def _schedule(self, deadline: float) -> None:
        """Start rank 0; the ranks pass the baton among themselves and wake us when none can run. Meanwhile
        watch the rank holding the baton: past the deadline it is stopped, and so is one that blocks."""
        self.running = self.ranks[0]
        self.ranks[0].resume.release()
        watch = threads.ProgressWatch()
        while not self._yielded.acquire(timeout=threads.POLL):
            running = self.running
            if running is None:
                continue
            if time.monotonic() > deadline:
                self._stop(running)
                raise SimTimeout(
                    f"rank {running.rank} ran for more than {self.timeout:g} s without returning or communicating."
                    "\nHint: look for a loop whose condition never changes, e.g. a `while` waiting for data that "
                    "only a communication call would bring.")
            if watch.blocked(running.thread):
                line, inside = threads.where(running.thread)
                self._stop(running)
                raise SharedMemory(
                    f"rank {running.rank} is blocked outside dist" + (f" at {line}" if line else "")
                    + (f", waiting in {inside}" if inside else "") + ": it uses no CPU and makes no dist call. "
                    "Only one simulated rank runs at a time, so whatever it waits for (a queue, a lock, an Event, a "
                    "flag set by another rank) can never come. " + SHARE_NOTHING + "\nHint: exchange data between "
                    "ranks with dist (send/recv, broadcast, all_reduce), not through Python objects or threads.")
        if self.error is None and any(not s.finished for s in self.ranks):
            raise Deadlock(self._deadlock_report(), self._receives_waited(),
                           frozenset((c.rank, c.peer) for s in self.ranks for c in (*s.posted, s.waiting)
                                     if c is not None and c.name == "send" and not c.complete),
                           posted=self.comm.posted)

    def _stop(self, state: RankState) -> None:
        """Interrupt the rank holding the baton, and wait (briefly) for it to hand the baton back."""
        self._aborting = True            # so that the interrupted rank hands the baton back to us
        if state.thread is not None:
            for _ in range(3):           # again, should the learner's code catch the first one
                threads.interrupt(state.thread, _Abort)
                if self._yielded.acquire(timeout=1.0):
                    return
            state.stuck = True

    def _stop_threads(self) -> None:
        """End every rank thread: those waiting for the baton leave at once; then join them all."""
        self._aborting = True
        for state in self.ranks:
            if not state.finished and state.thread is not None and state is not self.running:
                state.abort = True
                state.resume.release()
        stuck = [s.thread for s in self.ranks if s.stuck]       # interrupted in vain: do not wait long
        alive = threads.join_all([s.thread for s in self.ranks if s.thread is not None and not s.stuck], _JOIN_TIMEOUT)
        alive += threads.join_all(stuck, 0.5)
        for t in alive:
            line, inside = threads.where(t)
            note = (f"\n(The thread of {t.name.replace('sim-', '')} could not be stopped: it is blocked"
                    + (f" at {line}" if line else "") + (f" in {inside}" if inside else "")
                    + ". It will stay until the kernel restarts.)")
            if self.error is None:
                self.error = OutOfView(note.strip("()\n"))
            else:
                self.error.args = (f"{self.error.args[0] if self.error.args else self.error}{note}",)

    # ---- diagnostics --------------------------------------------------------------
    def _deadlock_report(self) -> str:
        def doing(r: int) -> str:
            s = self.ranks[r]
            if s.finished:
                return "has already returned"
            return f"is blocked in {s.waiting.text}" if s.waiting is not None else "is running"

        lines = ["every rank is blocked and none can proceed:"]
        kinds = set()
        for s in self.ranks:
            if s.finished:
                lines.append(f"  rank {s.rank} has returned")
                continue
            call = s.waiting
            kinds.add(call.name)
            peers = self.comm.waiting_for(call)
            if call.peer is None and call.name == "recv":
                lines.append(f"  rank {s.rank} waits in {call.text} for a message from any rank")
                continue
            needs = "; ".join(f"rank {p}, which {doing(p)}" for p in peers)
            lines.append(f"  rank {s.rank} waits in {call.text} for {needs}")
        returned = [s.rank for s in self.ranks if s.finished]
        if returned:
            hint = (f"rank(s) {', '.join(map(str, returned))} returned while others still expected them "
                    "in a communication: every rank must make the same sequence of calls.")
        elif kinds <= {"send"} and all(s.waiting.text.startswith("isend") for s in self.ranks if not s.finished):
            hint = self._isends_waited()
        elif kinds <= {"send"}:
            hint = ("a blocking send waits until the receiver posts its recv (on gloo and NCCL alike). When every "
                    "rank sends first, nobody receives. Use dist.isend / dist.irecv (then .wait()), "
                    "dist.batch_isend_irecv, or let even ranks send first and odd ranks receive first.")
        else:
            hint = ("ranks wait for each other in a cycle. Every rank of a group must call that group's "
                    "collectives in the same order, and each send must meet its recv.")
        uneven = self.comm.uneven_new_groups()
        if uneven:           # a rank that skipped a new_group call is the likely cause
            return "\n".join(lines) + "\nAlso, " + uneven
        return "\n".join(lines + self._peers_disagree()) + "\nHint: " + hint

    def _isends_waited(self) -> str:
        """Every rank waits on an isend of its own: the sends are already non-blocking, and each rank reached the
        wait before the recv its peer's message needs. Where two ranks sent each other several messages both ways
        under one tag, one more possible cause is said as such: the run cannot tell two kinds of message apart."""
        sent = [c for s in self.ranks for c in s.posted if c.name == "send" and c.peer is not None]
        pairs = {frozenset((c.rank, c.peer)) for c in sent}
        both_ways = [sorted(pair) for pair in pairs if len(pair) == 2 and all(
            sum(1 for c in sent if c.rank == a and c.peer == b) > 1 for a, b in (sorted(pair), sorted(pair)[::-1]))]
        said = ("every rank waits on the .wait() of an isend of its own (the sends are already non-blocking), which "
                "completes only when the peer posts the matching recv, and each reached that wait before posting the "
                "recv its peer's message needs. Post the receives a step needs before waiting on a send (irecv "
                "first, or dist.batch_isend_irecv), and check that both ranks run their steps in the schedule's "
                "order.")
        if both_ways and len({c.tag for c in sent}) == 1:
            a, b = both_ways[0]
            said += (f" Also, every message here carried tag {sent[0].tag}, and ranks {a} and {b} sent each other "
                     "several in both directions: if one direction carries two kinds of message (activations and "
                     "gradients), a recv takes whichever arrived first, not the one it was posted for, and the two "
                     "ranks' schedules drift apart. Then give each kind its own tag (tag= on both the send and its "
                     "recv), or receive in exactly the order the peer sends.")
        return said

    def _receives_waited(self) -> tuple:
        """(rank, peer, which message it waits for, how many the peer sent it, how many it sent the peer) for each
        rank blocked in a receive from a named peer."""
        posted = self.comm.posted
        return tuple((s.rank, s.waiting.peer, s.waiting.nth, posted[(s.waiting.peer, s.rank, "send")],
                      posted[(s.rank, s.waiting.peer, "send")])
                     for s in self.ranks if not s.finished and s.waiting is not None and s.waiting.name == "recv"
                     and s.waiting.peer is not None and s.waiting.nth)

    def _peers_disagree(self) -> list[str]:
        """Where a sender and its receiver disagree on who is whose peer (or on the tag), or two ranks each wait
        to receive from the other: the wrong peer named, not only who waits on whom."""
        def sends(r: int) -> list:
            s = self.ranks[r]
            out = [c for c in s.posted if c.name == "send" and not c.complete] if not s.finished else []
            if s.waiting is not None and s.waiting.name == "send" and s.waiting not in out:
                out.append(s.waiting)
            return out

        said = []
        for s in self.ranks:
            call = s.waiting
            if s.finished or call is None or call.peer is None or call.name not in ("recv", "send"):
                continue
            other = self.ranks[call.peer]
            if call.name == "recv":
                theirs = sends(call.peer)
                if any(c.peer == s.rank and c.tag != call.tag for c in theirs):
                    said.append(f"rank {s.rank} waits for tag {call.tag} from rank {call.peer}, which sends it "
                                "another tag: tags must match.")
                elif theirs and all(c.peer != s.rank for c in theirs):
                    dsts = ", ".join(str(c.peer) for c in theirs)
                    said.append(f"rank {s.rank} waits for a message from rank {call.peer}, but rank {call.peer} "
                                f"sends to rank {dsts}: the two sides disagree on who is whose neighbour (one "
                                "side's rank + 1 where the other's is rank - 1?).")
                elif not theirs and other.waiting is not None and other.waiting.name == "recv" \
                        and other.waiting.peer == s.rank and s.rank < call.peer:
                    said.append(f"ranks {s.rank} and {call.peer} each wait to receive from the other and neither "
                                "has a message on its way to the other: one of them must send first (or both post "
                                "isend before they receive).")
            elif other.waiting is not None and other.waiting.name == "recv" and other.waiting.peer not in (
                    None, s.rank) and not any(c.peer == s.rank for c in sends(call.peer)):
                said.append(f"rank {s.rank} sends to rank {call.peer}, but rank {call.peer} waits for a message "
                            f"from rank {other.waiting.peer}: the two sides disagree on who is whose neighbour.")
        blocked = [s for s in self.ranks if not s.finished and s.waiting is not None]
        if not said and len(blocked) == len(self.ranks) and all(s.waiting.name == "recv" for s in blocked) \
                and not any(sends(s.rank) for s in blocked):
            said.append("every rank waits to receive and none has sent: each recv needs a send posted by its peer "
                        "(send before receiving on some ranks, or post isend first).")
        return (["Where the peers disagree:"] + [f"  {line}" for line in said]) if said else []

    def _check_waited(self) -> None:
        for state in self.ranks:
            for call in state.posted if not state.dead else ():
                if call.name == "send" and not call.waited:
                    raise InvalidCall(
                        f"rank {state.rank} returned without waiting on its {call.text}, "
                        f"{_place_among(call, state.posted)}. On real ranks a process that returns with a send in "
                        "flight may close its connection before the data has left: gloo fails now and then with "
                        "\"Connection closed by peer\", or hangs where the work object was dropped before a barrier."
                        "\nHint: keep the work object isend returns and call .wait() on it before the rank returns.")
                if call.receives and not call.waited:
                    raise InvalidCall(
                        f"rank {state.rank} returned without waiting on its {call.text}, "
                        f"{_place_among(call, state.posted)}. In real torch.distributed the result may not have "
                        f"arrived yet; and if nothing needed it, the call was issued for nothing"
                        f"{_UNNEEDED.get(call.name, '')}.\n"
                        "Hint: keep the work object that async_op=True / isend / irecv returns and call .wait(), "
                        "or issue only the calls whose results the rank uses.")

    def result(self) -> SimResult:
        stats = [RankStats(rank=s.rank, bytes_sent=s.bytes_sent, bytes_received=s.bytes_received,
                           peak_memory=s.tracker.peak, clock=s.clock, flops=s.tracker.flops,
                           host_peak_memory=s.tracker.host_peak, host_flops=s.tracker.host_flops,
                           calls=dict(s.calls), memory=list(s.tracker.samples), outside_bytes=s.tracker.outside,
                           largest_tensor=s.tracker.largest, p2p_log=tuple(s.p2p_log),
                           argument_reads=tuple(s.tracker.reads.bytes) if s.tracker.reads else ())
                 for s in self.ranks]
        trace = sorted(self.events, key=lambda e: (e.start, e.rank, e.end))
        return SimResult([s.result for s in self.ranks], stats, trace, self.cost)


# An async call issued and never waited on, when nothing needed it: what it often is, by the call's kind
_UNNEEDED = {"all_gather": " (a prefetch of a layer done already, say: in backward the walk goes the other way)",
             "recv": " (a receive posted ahead for a message the schedule never needs)"}


def _place_among(call: Call, posted: list[Call]) -> str:
    """Where a call stands among its rank's calls, for finding it in the code: "the 14th of its 26 all_gather calls,
    posted right after its 1st reduce_scatter"."""
    mine = [c for c in posted if c.name == call.name]
    text = f"the {ordinal(mine.index(call) + 1)} of its {len(mine)} {call.name} calls"
    before = posted[:posted.index(call)]
    other = next((c for c in reversed(before) if c.name != call.name), None)
    if other is None:
        return text + ", posted before any other call"
    nth = sum(c.name == other.name for c in before[:before.index(other) + 1])
    return text + f", posted after its {ordinal(nth)} {other.name}"


_LEFT_RUNNING: list[threading.Thread] = []     # ranks' threads that would not stop: each stays its rank while it lives


def _dismiss_ended() -> None:
    """Forget the ranks' threads left running by earlier runs that have ended since (a new thread may take the id)."""
    for thread in [t for t in _LEFT_RUNNING if not t.is_alive()]:
        context.dismiss(thread)
        _LEFT_RUNNING.remove(thread)


class _RankThread(threading.Thread):
    """A rank's thread. It lets go of what it runs once it starts: threading.current_thread(), which the rank's code
    may call, would hand out the rank's state (its tracker, the runtime)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.begun = threading.Event()

    def run(self) -> None:
        target, args = self._target, self._args
        del self._target, self._args, self._kwargs
        self.begun.set()
        target(*args)


def _learner_traceback(e: BaseException) -> str:
    """The traceback without the simulator's or torch's frames: what a learner needs to see."""
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if not f.filename.startswith(ENGINE)]
    text = "".join(traceback.format_list(frames))
    return "Traceback (most recent call last):\n" + text + "".join(traceback.format_exception_only(e))


def _hint_for(e: BaseException) -> str:
    """Mistakes common enough to deserve a pointer of their own."""
    if "not compiled with CUDA" in str(e):
        return ("\nHint: the simulated ranks stand for GPUs on NCCL (dist.get_backend() says 'nccl'), but their "
                "tensors live on lib.device(): choose a tensor's device with lib.device(), not from the backend's "
                "name.")
    if "process group has not been initialized" in str(e):
        return ("\nHint: inside a puzzle, call the `dist` your function receives (dist.all_reduce(...)), "
                "not torch.distributed: the simulator hands each rank its own `dist`.")
    return ""


# All simulated ranks share this machine's memory: a run that keeps growing is stopped, not left to
# take the notebook's kernel down with it.
MEMORY_LIMIT = 4 * 2**30


def run(fn: Callable, world_size: int, *args, cost: Optional[CostModel] = None, timeout: float = 30.0,
        memory_limit: float = MEMORY_LIMIT, protect: Any = None, faults: Optional[dict[int, int]] = None,
        read_arguments: bool = False, **kwargs) -> SimResult:
    """Run `fn(dist, *args, **kwargs)` on `world_size` simulated ranks and return what they did.

    Every rank gets its own deep copy of the arguments (wrap one in `per_rank([...])` to
    give each rank its own value); no rank may read the originals, nor any tensor in `protect`
    (a check's expected results). Raises Deadlock, CollectiveMismatch, InvalidCall, SimTimeout,
    SharedMemory, OutOfView or RankFailed (all PuzzleErrors) with a message that names the ranks.
    `memory_limit` (bytes, all ranks together, shared equally) stops a run whose tensors keep growing.
    `faults` {rank: k} makes `rank` die at its k-th communication call (k = 1: its first): it stops there (its
    result is None), and every call of another rank that needs it raises RankDied, which the rank may catch.
    `read_arguments` measures the bytes each rank's ops read of each positional argument (RankStats.argument_reads;
    a cost on every op, so only when asked).
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise InvalidCall(f"world_size must be a positive integer, got {world_size!r}.")
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, PerRank) and len(a.values) != world_size:
            raise InvalidCall(f"per_rank(...) holds {len(a.values)} values for {world_size} ranks.")
    bad = {r: k for r, k in (faults or {}).items()
           if not (isinstance(r, int) and 0 <= r < world_size and isinstance(k, int) and k >= 1)}
    if bad:
        raise InvalidCall(f"faults={faults!r}: each maps a rank (0 to {world_size - 1}) to the communication call "
                          "(1 = its first) at which it dies.")
    runtime = Runtime(world_size, cost or CostModel(), timeout, memory_limit, faults, read_arguments)
    runtime.run(fn, args, kwargs, SimDist, protect)
    return runtime.result()
