"""Matching and executing the communication of simulated ranks.

Every call is *posted* by one rank and *completes* once all its participants have posted:
the last member of a collective, or the second side of a send/recv pair. Completion
computes the results (from the inputs as they are at that moment, like a real transfer),
prices the transfer with the cost model, and records it. A rank sees the results in its
buffers only when it waits on the work, as with real asynchronous ops.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.distributed

from lib.sim.context import current_rank
from lib.sim.cost import bus_factor, ring_traffic
from lib.sim.errors import CollectiveMismatch, InvalidCall
from lib.sim.links import earliest
from lib.sim.tracker import in_host_memory


Deliver = Callable[[], None]
_NON_GROUP_MEMBER = torch.distributed.GroupMember.NON_GROUP_MEMBER


class Group:
    """A process group: an ordered set of global ranks sharing a collective sequence."""

    def __init__(self, gid: int, ranks: tuple[int, ...]) -> None:
        self.gid = gid
        self.ranks = ranks
        self.pending: dict[int, dict[int, "Call"]] = {}   # sequence number -> rank -> call
        self.next_seq: dict[int, int] = {r: 0 for r in ranks}
        # how the group reads in the trace and in messages: every collective records it for each member
        self._label = "WORLD" if gid == 0 else f"group {gid} (ranks {', '.join(map(str, ranks))})"

    def size(self) -> int:
        return len(self.ranks)

    def rank_of(self, global_rank: int) -> int:
        return self.ranks.index(global_rank) if global_rank in self.ranks else -1

    def __repr__(self) -> str:
        return self._label

    def __eq__(self, other) -> bool:
        """On a rank outside the group, the group equals dist.GroupMember.NON_GROUP_MEMBER: what torch's new_group
        returns there."""
        if isinstance(other, int) and not isinstance(other, bool) and other == _NON_GROUP_MEMBER:
            rank = current_rank()
            return rank is not None and rank not in self.ranks
        return self is other

    __hash__ = object.__hash__

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"a process group has no attribute {name!r}: ask dist about it "
                             "(dist.get_process_group_ranks(group), dist.get_rank(group), dist.get_world_size(group)).")


_DESCRIBED: dict[tuple, str] = {}        # (shape, dtype) -> how it reads: every message's text names its tensor


def describe_tensor(t: torch.Tensor) -> str:
    key = (t.shape, t.dtype)
    text = _DESCRIBED.get(key)
    if text is None:
        if len(_DESCRIBED) > 10_000:
            _DESCRIBED.clear()
        text = _DESCRIBED[key] = f"{tuple(t.shape)} {str(t.dtype).replace('torch.', '')}"
    return text


@dataclass(eq=False, slots=True)            # slots: a third less to build, and a check builds one per message
class Call:
    """One rank's part in one communication."""

    rank: int
    name: str
    text: str                        # how the call reads in messages, e.g. "send(dst=1, (4,) float32)"
    post_time: float
    order: int                       # global posting order, for any-source receives
    receives: bool                   # whether the rank must wait to see its results
    group: Optional[Group] = None
    seq: int = -1
    signature: tuple = ()
    payload: object = None
    peer: Optional[int] = None       # p2p: the other side (None: any source)
    tag: int = 0
    complete: bool = False
    end_time: float = 0.0
    deliver: Optional[Deliver] = None
    waited: bool = False
    waiting_on: list[int] = field(default_factory=list)
    failed: Optional[BaseException] = None   # a peer died: waiting on the call raises this
    nth: int = 0                     # p2p with a named peer: its place among this rank's calls of its kind to that peer


class Work:
    """What an async call returns: `wait()` blocks until the transfer is done and shows its results."""

    __slots__ = ("_runtime", "_call")

    def __init__(self, runtime, call: Call) -> None:
        self._runtime = runtime
        self._call = call

    def wait(self, timeout=None) -> bool:
        self._runtime.wait_call(self._call)
        return True

    def is_completed(self) -> bool:
        return self._call.complete

    def is_success(self) -> bool:
        return self._call.complete

    def __repr__(self) -> str:
        call = self._call
        return f"<Work {call.text} on rank {call.rank}: {'done' if call.complete else 'pending'}>"


_grad_enabled, _set_grad_enabled = torch.is_grad_enabled, torch._C._set_grad_enabled


def _copy(dst: torch.Tensor, src: torch.Tensor) -> Deliver:
    def deliver() -> None:
        enabled = _grad_enabled()         # torch.no_grad() without its Python layers (one delivery per message)
        _set_grad_enabled(False)
        try:
            dst.copy_(src if src.shape == dst.shape else src.reshape(dst.shape))   # a reshape costs microseconds
        finally:
            _set_grad_enabled(enabled)
    return deliver


class Communicator:
    """Posting, matching and completing calls for one simulated run."""

    def __init__(self, runtime) -> None:
        self.rt = runtime
        self.world = Group(0, tuple(range(runtime.world_size)))
        self.groups: list[Group] = [self.world]
        self.group_calls: dict[int, int] = {}            # rank -> how many new_group calls
        # Posted, unmatched, in posting order: sends by their destination, receives by their rank. A message looks
        # only at its peer's (a few calls), not at every rank's: at hundreds of ranks the scan was the cost.
        self._sends_to: dict[int, list[Call]] = {}
        self._recvs_at: dict[int, list[Call]] = {}
        self.order = 0
        self.unmatched_at_exit: list[Call] = []
        # (op, bytes, ranks) or, for a message, (bytes, src, dst) -> seconds, by the cost model
        self._durations: dict[tuple, float] = {}
        self.posted: Counter = Counter()                 # (rank, peer, "send" or "recv") -> messages posted

    # ---- groups -------------------------------------------------------------------
    def new_group(self, me: int, ranks) -> Group:
        ranks = tuple(sorted(range(self.rt.world_size) if ranks is None else (int(r) for r in ranks)))
        bad = [r for r in ranks if not 0 <= r < self.rt.world_size]
        if bad or len(set(ranks)) != len(ranks) or not ranks:
            raise InvalidCall(f"rank {me} called new_group(ranks={list(ranks)}): ranks must be distinct "
                              f"and between 0 and {self.rt.world_size - 1}.")
        k = self.group_calls.get(me, 0) + 1
        self.group_calls[me] = k
        if k < len(self.groups):
            group = self.groups[k]
            if group.ranks != ranks:
                raise CollectiveMismatch(
                    f"rank {me}'s new_group call #{k} asks for ranks {list(ranks)}, but another rank's "
                    f"call #{k} asked for {list(group.ranks)}.\nHint: every rank must call new_group "
                    "for every group, members or not, in the same order and with the same ranks.")
            return group
        group = Group(k, ranks)
        self.groups.append(group)
        return group

    def uneven_new_groups(self) -> Optional[str]:
        """Which ranks made fewer new_group calls than the others, or None. torch.distributed requires every rank
        to call new_group for every group, members or not (a rank that skips one names its later groups
        differently from the others, and their first collective together hangs)."""
        counts = {r: self.group_calls.get(r, 0) for r in range(self.rt.world_size) if not self.rt.ranks[r].dead}
        most = max(counts.values())
        behind = {r: k for r, k in counts.items() if k < most}
        if not behind:
            return None
        done = [r for r, k in counts.items() if k == most]
        missing = ", ".join(str(g) for g in self.groups[min(behind.values()) + 1:])
        return (f"rank(s) {', '.join(f'{r} ({k})' for r, k in behind.items())} made fewer new_group calls than "
                f"rank(s) {', '.join(map(str, done))} ({most}): {missing} not created on every rank.\nHint: every "
                "rank must call new_group for every group, members or not, in the same order: torch.distributed "
                "requires it, and where one rank skips a call the others hang in their first collective together.")

    def resolve(self, me: int, group: Optional[Group], what: str) -> Group:
        group = self.world if group is None else group
        if not isinstance(group, Group):
            raise InvalidCall(f"rank {me} passed group={group!r} to {what}: pass a group made by dist.new_group.")
        if me not in group.ranks:
            raise InvalidCall(f"rank {me} called {what} on {group}, which it is not a member of.\n"
                              "Hint: only the members of a group take part in its collectives; "
                              "guard the call with `if rank in ranks:` (torch.distributed would skip the call on "
                              "a non-member with a warning and leave its tensors as they were).")
        return group

    # ---- collectives --------------------------------------------------------------
    def post_collective(self, me: int, name: str, group: Group, *, text: str, signature: tuple,
                        payload: object, nbytes: int, finish: Callable[[dict[int, object]], dict[int, Deliver]],
                        root: Optional[int] = None,
                        traffic: Optional[Callable[[dict[int, object]], dict[int, tuple[float, float]]]] = None
                        ) -> Call:
        """Post rank `me`'s part; the last member to arrive runs `finish` on everyone's payloads. `traffic`, where
        the bytes differ by rank (an all-to-all with uneven splits), gives each rank's (sent, received) from the
        payloads; an all_to_all posted without one carries lists (outputs, inputs) and each rank is charged the
        slots it sends to and receives from the others (slot_traffic); otherwise each rank's share of `nbytes`
        follows the ring (lib.sim.cost.ring_traffic)."""
        self._refuse_host_memory(me, payload, text)
        if traffic is None and name == "all_to_all":
            traffic = slot_traffic(group)
        state = self.rt.ranks[me]
        seq = group.next_seq[me]
        group.next_seq[me] = seq + 1
        call = Call(me, name, text, state.clock, self._next_order(), receives=True, group=group, seq=seq,
                    signature=(name,) + signature, payload=payload)
        calls = group.pending.setdefault(seq, {})
        for other in calls.values():
            if other.signature != call.signature:
                raise CollectiveMismatch(
                    f"collective #{seq + 1} on {group}: rank {other.rank} called {other.text}, "
                    f"but rank {me} called {text}.\n"
                    "Hint: every rank of a group must call the same collectives, in the same order, "
                    "with tensors of the same shape and dtype (and the same op and root): on real ranks gloo "
                    "returns garbage or aborts, and NCCL, the backend the simulated ranks stand for, hangs or "
                    "corrupts memory.")
            break
        calls[me] = call
        if len(calls) < group.size():
            return call
        del group.pending[seq]
        payloads = {r: c.payload for r, c in calls.items()}
        exact = traffic(payloads) if traffic is not None else None
        deliveries = finish(payloads)
        members = [self.rt.ranks[r] for r in group.ranks]
        if exact is not None:           # timed by the busiest rank's bytes, as if every rank moved as many
            nbytes = max(max(pair) for pair in exact.values()) / max(bus_factor(name, group.size()), 1e-30)
        duration = self._collective_time(name, nbytes, group.ranks)
        links = [link for m in members for link in (m.outgoing, m.incoming)]
        start = earliest(links, max(c.post_time for c in calls.values()), duration)
        end = start + duration
        for link in links:
            link.book(start, end)
        root_pos = group.rank_of(root) if root is not None else 0
        for pos, m in enumerate(members):
            sent, received = exact[m.rank] if exact is not None else ring_traffic(name, nbytes, group.size(), pos,
                                                                                  root_pos)
            c = calls[m.rank]
            c.complete, c.end_time, c.deliver = True, end, deliveries.get(m.rank)
            c.payload = None               # the buffers are the rank's; the call must not keep them alive
            self.rt.record(m.rank, name, str(group), None, sent, received, start, end)
        return call

    def _collective_time(self, name: str, nbytes: float, ranks: tuple[int, ...]) -> float:
        """The cost model's time for a collective, kept per (op, bytes, group): a training loop repeats the same
        few collectives, and the model's arithmetic walks the group's nodes and sites each time."""
        key = (name, nbytes, ranks)
        duration = self._durations.get(key)
        if duration is None:
            duration = self._durations[key] = self.rt.cost.collective_time(name, nbytes, ranks)
        return duration

    def waiting_for(self, call: Call) -> list[int]:
        """The ranks whose posting `call` still needs."""
        if call.complete:
            return []
        if call.group is not None and call.seq >= 0 and call.name not in ("send", "recv"):
            arrived = call.group.pending.get(call.seq, {})
            return [r for r in call.group.ranks if r not in arrived]
        if call.peer is None:
            return [r for r in range(self.rt.world_size) if r != call.rank]
        return [call.peer]

    # ---- point to point -----------------------------------------------------------
    def post_send(self, me: int, tensor: torch.Tensor, dst: int, tag: int, text: str) -> Call:
        self._check_peer(me, dst, "send")
        self._refuse_host_memory(me, tensor, text)
        call = Call(me, "send", text, self.rt.ranks[me].clock, self._next_order(), receives=False,
                    payload=tensor, peer=dst, tag=tag, nth=self._count(me, dst, "send"))
        waiting = self._recvs_at.get(dst, ())
        for i, recv in enumerate(waiting):
            if recv.peer in (me, None) and recv.tag == tag:
                del waiting[i]
                self._match(call, recv)
                return call
        self._sends_to.setdefault(dst, []).append(call)
        return call

    def post_recv(self, me: int, tensor: torch.Tensor, src: Optional[int], tag: int, text: str) -> Call:
        if src is not None:
            self._check_peer(me, src, "recv")
        self._refuse_host_memory(me, tensor, text)
        call = Call(me, "recv", text, self.rt.ranks[me].clock, self._next_order(), receives=True,
                    payload=tensor, peer=src, tag=tag, nth=self._count(me, src, "recv") if src is not None else 0)
        waiting = self._sends_to.get(me, ())
        for i, send in enumerate(waiting):
            if src in (send.rank, None) and send.tag == tag:
                del waiting[i]
                self._match(send, call)
                return call
        self._recvs_at.setdefault(me, []).append(call)
        return call

    def _count(self, me: int, peer: int, kind: str) -> int:
        self.rt.ranks[me].p2p_log.append((kind, peer))
        self.posted[(me, peer, kind)] += 1
        return self.posted[(me, peer, kind)]

    @property
    def sends(self) -> list[Call]:
        """Every posted, unmatched send, in posting order."""
        return sorted((c for calls in self._sends_to.values() for c in calls), key=lambda c: c.order)

    @property
    def recvs(self) -> list[Call]:
        """Every posted, unmatched receive, in posting order."""
        return sorted((c for calls in self._recvs_at.values() for c in calls), key=lambda c: c.order)

    def _match(self, send: Call, recv: Call) -> None:
        data, buf = send.payload, recv.payload
        if data.dtype != buf.dtype or data.numel() != buf.numel():
            raise CollectiveMismatch(
                f"rank {send.rank} sent {describe_tensor(data)} to rank {recv.rank}, but rank {recv.rank} "
                f"receives into {describe_tensor(buf)} ({recv.text}). " + _what_gloo_does(data, buf) +
                "\nHint: a recv buffer must have the same number of elements and the same dtype as the send.")
        with self.rt.untracked():
            copy = data.detach().clone()            # detached: a clone of it records no autograd graph
        recv.peer = send.rank
        recv.deliver = _copy(buf, copy)
        send.payload = recv.payload = None     # matched: the call must not keep the rank's tensors alive
        nbytes = data.nbytes
        s, r = self.rt.ranks[send.rank], self.rt.ranks[recv.rank]
        key = (nbytes, send.rank, recv.rank)
        duration = self._durations.get(key)
        if duration is None:
            duration = self._durations[key] = self.rt.cost.p2p_time(nbytes, send.rank, recv.rank)
        start = earliest((s.outgoing, r.incoming), max(send.post_time, recv.post_time), duration)
        end = start + duration
        s.outgoing.book(start, end)
        r.incoming.book(start, end)
        for c in (send, recv):
            c.complete, c.end_time = True, end
        self.rt.record(send.rank, "send", "p2p", recv.rank, nbytes, 0, start, end)
        self.rt.record(recv.rank, "recv", "p2p", send.rank, 0, nbytes, start, end)

    def _check_peer(self, me: int, peer, what: str) -> None:
        n = self.rt.world_size
        if not isinstance(peer, int) or not 0 <= peer < n:
            raise InvalidCall(f"rank {me} called {what} with peer {peer!r}: ranks go from 0 to {n - 1}.\n"
                              "Hint: work out the peer of the first and of the last rank by hand: "
                              "each has a neighbour on one side only, unless your algorithm wraps around.")
        if peer == me:
            raise InvalidCall(f"rank {me} called {what} to itself: a rank cannot {what} to its own rank.")

    def _refuse_host_memory(self, me: int, payload: object, text: str) -> None:
        """A communication of a tensor in host memory (lib.host()) stops the run: the simulated ranks stand for GPUs,
        and NCCL, their backend, refuses a CPU tensor ("No backend type associated with device type cpu")."""
        tracker = self.rt.ranks[me].tracker
        for t in _tensors_in(payload):
            if in_host_memory(tracker, t):
                raise InvalidCall(
                    f"rank {me} called {text} on a {describe_tensor(t)} tensor in host memory. The simulated ranks "
                    "stand for GPUs, whose backend (NCCL) refuses a CPU tensor: \"No backend type associated with "
                    "device type cpu\".\nHint: bring it to the device first (.to(lib.device())), communicate it "
                    "there, then move what you keep back to lib.host().")

    def _next_order(self) -> int:
        self.order += 1
        return self.order

    # ---- a rank that died ---------------------------------------------------------
    def bury(self, dead: int, error: Callable[[Call], BaseException], when: float) -> None:
        """Fail every posted call that needs `dead` (its groups' pending collectives, messages to or from it) and
        forget the calls it left behind: the calls complete at `when`, and waiting on call c raises error(c)."""
        failed: list[Call] = []
        for g in self.groups:
            if dead in g.ranks:
                for seq in list(g.pending):
                    failed += [c for c in g.pending.pop(seq).values() if c.rank != dead]
        failed += [c for c in self.sends + self.recvs if c.peer == dead and c.rank != dead]
        for posted in (self._sends_to, self._recvs_at):
            for rank, calls in posted.items():
                posted[rank] = [c for c in calls if dead not in (c.rank, c.peer)]
        for c in failed:
            c.complete, c.failed, c.payload = True, error(c), None
            c.end_time = max(c.post_time, when)

    # ---- end of run ---------------------------------------------------------------
    def leftovers(self) -> Optional[str]:
        """What was posted but never matched once every rank returned, or None."""
        lines = []
        for s in self.sends:
            lines.append(f"rank {s.rank}'s {s.text} was never received: rank {s.peer} returned without "
                         f"a matching recv (tag {s.tag}).")
        for r in self.recvs:
            who = f"rank {r.peer}" if r.peer is not None else "any rank"
            lines.append(f"rank {r.rank}'s {r.text} never got a message: {who} returned without sending it.")
        for g in self.groups:
            for seq, calls in g.pending.items():
                missing = [r for r in g.ranks if r not in calls]
                first = next(iter(calls.values()))
                lines.append(f"rank(s) {', '.join(map(str, sorted(calls)))} called {first.text} as collective "
                             f"#{seq + 1} on {g}, but rank(s) {', '.join(map(str, missing))} "
                             "returned without calling it.")
        return "\n".join(lines) or None


def _what_gloo_does(data: torch.Tensor, buf: torch.Tensor) -> str:
    """What a real backend makes of a message that does not fit its buffer, for the refusal to say."""
    if data.nbytes < buf.nbytes:
        return ("gloo would fill the first bytes of the buffer and leave the rest as it was (NCCL, the backend the "
                "simulated ranks stand for, hangs or corrupts).")
    if data.nbytes == buf.nbytes:
        return ("gloo would copy the bytes and reinterpret them as the buffer's dtype, without a word (NCCL, the "
                "backend the simulated ranks stand for, hangs or corrupts).")
    return ("gloo aborts the receiving process (SIGABRT); NCCL, the backend the simulated ranks stand for, hangs or "
            "corrupts.")


def _tensors_in(payload: object) -> list[torch.Tensor]:
    """The tensors of a call's payload (a tensor, or tuples and lists of them and of split sizes)."""
    if isinstance(payload, torch.Tensor):
        return [payload]
    if isinstance(payload, (list, tuple)):
        return [t for item in payload for t in _tensors_in(item)]
    return []


def slot_traffic(group: Group) -> Callable[[dict[int, object]], dict[int, tuple[float, float]]]:
    """Each rank's (bytes sent, bytes received) in a list-form all_to_all (payloads (outputs, inputs)): the slots
    it sends to the other ranks and those it receives from them; its own slot stays put, as in
    all_to_all_single."""
    def traffic(payloads: dict[int, object]) -> dict[int, tuple[float, float]]:
        out = {}
        for r, (outputs, inputs) in payloads.items():
            mine = group.rank_of(r)
            out[r] = (float(sum(t.nbytes for i, t in enumerate(inputs) if i != mine)),
                      float(sum(t.nbytes for i, t in enumerate(outputs) if i != mine)))
        return out
    return traffic
