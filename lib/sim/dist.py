"""`dist` for a simulated rank: the torch.distributed functions the course uses, same names,
same arguments, same in-place semantics. A puzzle written against it runs unchanged on
real ranks with `torch.distributed` itself."""

from __future__ import annotations

import functools
import inspect
import math
import re
from typing import Callable, Optional, Sequence

import torch
import torch.distributed as _td

from lib.errors import PuzzleError
from lib.sim.comm import Call, Communicator, Group, Work, _copy, describe_tensor
from lib.sim.errors import CollectiveMismatch, InvalidCall
from lib.sim.in_flight import RECEIVING, SENDING, UNSPECIFIED
from lib.sim.objects import OBJECT_CALLS, ObjectCollectives, refuse_unknown
from lib.sim.ownership import learner_line
from lib.units import ordinal
from lib.sim.reduction import REDUCERS, reduce_tensors


ReduceOp = _td.ReduceOp          # the real enum, so `dist.ReduceOp.SUM` means one thing in both worlds

BACKEND = "nccl"       # what get_backend() answers: the backend the simulated ranks stand for (docs/DIFFERENCES.md)


_OP_NAMES: dict = {}          # ReduceOp -> its name; str() of the enum costs microseconds, and every reduction asks


def _op_name(op) -> str:
    name = _OP_NAMES.get(op)
    if name is None:
        name = _OP_NAMES[op] = str(op).split(".")[-1]
    return name


def _rule(method):
    """Errors the simulator raises inside a dist call end the run: a learner's try/except can't hide them."""
    @functools.wraps(method)
    def wrapper(self: "SimDist", *args, **kwargs):
        self._rt.check_view(self._rt.ranks[self._rank])
        try:
            return method(self, *args, **kwargs)
        except PuzzleError as e:
            self._rt.fail(e)
    return wrapper


def _guessed_splits(rank: int, receives: list[int]) -> str:
    """An all-to-all's receiving side sized from its own sends: said, with why no rank can size it alone."""
    return (f" Rank {rank}'s output_split_sizes {receives} are its own input_split_sizes: it expects from each rank "
            "as many rows as it sends that rank, but what another rank sends depends on that rank's data, which "
            f"rank {rank} cannot see.\nHint: rank r's output_split_sizes[s] must equal rank s's input_split_sizes[r]: "
            "exchange the split sizes first, an all_to_all_single of each rank's input_split_sizes, and take what "
            "arrives as output_split_sizes.")


def _swapped_splits(rank: int, me: int, nth: str, inp: torch.Tensor, output_split_sizes, input_split_sizes) -> None:
    """Refuse an all_to_all_single whose two split lists are each other's: the input splits do not add up to the
    input's rows, the output splits do, and both hold the same rows for the rank itself (`me`, its index in the
    group: what a rank sends itself is what it receives from itself, swapped or not; an input split wrong there,
    the rank's own rows left out, is no swap)."""
    if output_split_sizes is None or input_split_sizes is None:
        return
    rows = inp.shape[0] if inp.dim() else 0
    outs, ins = [int(s) for s in output_split_sizes], [int(s) for s in input_split_sizes]
    if sum(ins) != rows and sum(outs) == rows and len(outs) == len(ins) > me and outs[me] == ins[me]:
        raise InvalidCall(
            f"rank {rank}'s {nth} all-to-all (all_to_all_single) has input_split_sizes={ins}, adding up to "
            f"{sum(ins)}, not the input's {rows} rows, and output_split_sizes={outs}, adding up to {rows}: the two "
            "are swapped. input_split_sizes[s] is how many of the input's rows go to rank s (what this rank sends), "
            "output_split_sizes[s] how many arrive from rank s, in torch's order all_to_all_single(output, input, "
            "output_split_sizes, input_split_sizes); an exchange's way back (a combine, a backward) takes the way "
            "there's splits the other way round.")


class P2POp:
    """A point-to-point op for `batch_isend_irecv`, as `torch.distributed.P2POp`."""

    def __init__(self, op: Callable, tensor: torch.Tensor, peer: Optional[int] = None, group=None, tag: int = 0,
                 group_peer: Optional[int] = None) -> None:
        self.op, self.tensor, self.peer = op, tensor, peer
        self.group, self.tag, self.group_peer = group, tag, group_peer


class _Namespace(type):
    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"dist.group (and dist.GroupMember) has WORLD and NON_GROUP_MEMBER, not {name!r}: the "
                             "groups a rank uses are those dist.new_group returns.")


class _GroupNamespace(metaclass=_Namespace):
    WORLD = None
    NON_GROUP_MEMBER = _td.GroupMember.NON_GROUP_MEMBER   # what new_group returns to a non-member on real ranks


class SimDist(ObjectCollectives):
    """The `dist` object one simulated rank receives: torch.distributed's functions the course uses, same names and
    arguments, on the simulated runtime."""

    ReduceOp = ReduceOp
    P2POp = P2POp
    Backend = _td.Backend
    group = _GroupNamespace
    GroupMember = _GroupNamespace

    def __init__(self, runtime, rank: int) -> None:
        self._rt = runtime
        self._rank = rank
        self._comm: Communicator = runtime.comm

    def __repr__(self) -> str:
        return f"<simulated torch.distributed, rank {self._rank} of {self._rt.world_size}>"

    def __getattr__(self, name: str):                  # a name this dist lacks: what to use instead
        refuse_unknown(name)

    # ---- who am I -----------------------------------------------------------------
    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def get_backend(self, group=None) -> str:
        return BACKEND

    @_rule
    def get_rank(self, group: Optional[Group] = None) -> int:
        return self._group(group).rank_of(self._rank)

    @_rule
    def get_world_size(self, group: Optional[Group] = None) -> int:
        g = self._group(group)
        return g.size() if self._rank in g.ranks else -1     # as torch: -1 outside the group

    @_rule
    def new_group(self, ranks: Optional[Sequence[int]] = None, timeout=None, backend=None, pg_options=None,
                  use_local_synchronization: bool = False, group_desc=None, device_id=None,
                  sort_ranks: bool = True) -> Group:
        return self._comm.new_group(self._rank, ranks)

    @_rule
    def get_process_group_ranks(self, group: Optional[Group]) -> list[int]:
        return list(self._group(group).ranks)

    @_rule
    def get_global_rank(self, group: Optional[Group], group_rank: int) -> int:
        return self._group(group).ranks[group_rank]

    @_rule
    def get_group_rank(self, group: Optional[Group], global_rank: int) -> int:
        return self._group(group).rank_of(global_rank)

    def _group(self, group) -> Group:
        if group is None:
            return self._comm.world
        if not isinstance(group, Group):
            raise InvalidCall(f"rank {self._rank} passed group={group!r}: pass a group made by dist.new_group.")
        return group

    # ---- helpers ------------------------------------------------------------------
    def _tensor(self, t, what: str, arg: str = "tensor") -> torch.Tensor:
        if t is None:
            raise InvalidCall(f"rank {self._rank} called {what} with {arg}=None{learner_line()}: it takes a "
                              f"torch.Tensor. {_none_reading(learner_line(), arg)}")
        if not isinstance(t, torch.Tensor):
            raise InvalidCall(f"rank {self._rank} called {what} with {arg}={type(t).__name__}: "
                              "it takes a torch.Tensor.")
        if not t.is_contiguous():
            raise InvalidCall(
                f"rank {self._rank} called {what} with a non-contiguous {arg} of shape {tuple(t.shape)} "
                "(a transpose, an expand() or a strided slice). NCCL, the backend the simulated ranks stand for, "
                "refuses it: \"Tensors must be contiguous\" (gloo accepts it in some calls and copies).\n"
                "Hint: communicate a contiguous tensor (`.contiguous()` makes a copy; copy the "
                "result back into the view if you need it there).")
        return t

    def _readable(self, t: torch.Tensor, what: str) -> None:
        """Refuse a dist call that reads a buffer left unspecified (lib.sim.in_flight)."""
        rules = self._rt.ranks[self._rank].tracker.buffers
        if rules.marks:
            broken = rules.check_read(t, f"passed it to {what}")
            if broken is not None:
                raise broken

    def _overwritten(self, t: torch.Tensor) -> None:
        rules = self._rt.ranks[self._rank].tracker.buffers
        if rules.marks:
            rules.overwritten(t)

    def _written(self, t, what: str) -> torch.Tensor:
        """A tensor a collective overwrites in place: not one autograd is tracking, whose backward would then pass the
        gradient through the collective as if it were not there (real torch warns it silently misleads)."""
        t = self._tensor(t, what)
        if t.grad_fn is not None:
            raise InvalidCall(
                f"rank {self._rank} called {what} in place on a tensor autograd is tracking: autograd does not see "
                "a collective, so backward passes the gradient straight through it, right only by accident (torch "
                "warns: 'silently incorrect behavior', deprecated).\n"
                "Hint: put the collective inside a torch.autograd.Function whose backward says what "
                "the gradient is (Megatron's g: all-reduce in forward, identity in backward), or communicate a "
                "detached copy.")
        return t

    def _root(self, group: Group, root, group_root, arg: str, what: str) -> int:
        if group_root is not None:
            if not 0 <= group_root < group.size():
                raise InvalidCall(f"rank {self._rank} called {what} with group_{arg}={group_root}: "
                                  f"{group} has {group.size()} ranks.")
            return group.ranks[group_root]
        if root is None:
            raise InvalidCall(f"rank {self._rank} called {what} without {arg}=: name the root rank.")
        if root not in group.ranks:
            raise InvalidCall(f"rank {self._rank} called {what} with {arg}={root}, which is not in {group}. "
                              f"{arg} is a global rank.")
        return root

    def _finish(self, call: Call, async_op: bool):
        self._rt.post(call)
        if async_op:
            return Work(self._rt, call)
        self._rt.wait_call(call)
        return None

    def _collective(self, name: str, group, *, text: str, signature: tuple, payload, nbytes: int,
                    finish, async_op: bool, root: Optional[int] = None, traffic=None):
        g = self._comm.resolve(self._rank, group, name)
        if self._rt.faults:
            self._rt.communicating(g.ranks, text)
        self._rt.close_compute(self._rt.me())
        call = self._comm.post_collective(self._rank, name, g, text=text, signature=signature, payload=payload,
                                          nbytes=nbytes, finish=finish, root=root, traffic=traffic)
        if async_op and isinstance(payload, torch.Tensor):       # all_reduce, broadcast, reduce: the backend's now
            kind = SENDING if root == self._rank and name == "broadcast" else RECEIVING
            self._rt.ranks[self._rank].tracker.buffers.mark(payload, kind, text, key=call)
        return self._finish(call, async_op)

    def _check_op(self, op, t: Optional[torch.Tensor] = None) -> None:
        if op not in REDUCERS:
            name = _op_name(op) if isinstance(op, (ReduceOp, ReduceOp.RedOpType)) else repr(op)
            bitwise = name in ("BAND", "BOR", "BXOR")
            raise InvalidCall(
                f"rank {self._rank}: ReduceOp.{name} " + (
                    "is a bitwise reduction, and NCCL, the backend the simulated ranks stand for, has none "
                    f"(\"Cannot use ReduceOp.{name} with NCCL\"); gloo computes it." if bitwise else
                    "is not one the simulated ranks support.") +
                "\nHint: use dist.ReduceOp.SUM, AVG, PRODUCT, MIN or MAX" +
                (" (a bitwise AND of 0/1 flags is their MIN, an OR their MAX)." if bitwise else "."))
        if op == ReduceOp.AVG and t is not None and not (t.is_floating_point() or t.is_complex()):
            raise InvalidCall(f"rank {self._rank}: ReduceOp.AVG on a {describe_tensor(t)} tensor: an average of "
                              "integers is not an integer, and torch.distributed rejects it. Use SUM and divide "
                              "a floating-point copy.")

    @staticmethod
    def _reduce(tensors: list[torch.Tensor], op) -> torch.Tensor:
        return reduce_tensors(tensors, op)

    @staticmethod
    def _nbytes(t: torch.Tensor) -> int:
        return t.nbytes

    # ---- collectives --------------------------------------------------------------
    @_rule
    def barrier(self, group=None, async_op: bool = False, device_ids=None, timeout=None):
        return self._collective("barrier", group, text="barrier()", signature=(), payload=None, nbytes=0,
                                finish=lambda p: {}, async_op=async_op)

    @_rule
    def all_reduce(self, tensor, op=ReduceOp.SUM, group=None, async_op: bool = False):
        t = self._written(tensor, "all_reduce")
        self._check_op(op, t)
        self._readable(t, "all_reduce")

        def finish(payloads):
            with self._rt.untracked():
                total = self._reduce([payloads[r] for r in sorted(payloads)], op)
            return {r: _copy(payloads[r], total) for r in payloads}
        return self._collective("all_reduce", group, text=f"all_reduce({describe_tensor(t)}, {_op_name(op)})",
                                signature=(tuple(t.shape), t.dtype, _op_name(op)), payload=t, nbytes=self._nbytes(t),
                                finish=finish, async_op=async_op)

    @_rule
    def broadcast(self, tensor, src: Optional[int] = None, group=None, async_op: bool = False,
                  group_src: Optional[int] = None):
        t = self._written(tensor, "broadcast")
        g = self._comm.resolve(self._rank, group, "broadcast")
        root = self._root(g, src, group_src, "src", "broadcast")
        if root == self._rank:
            self._readable(t, "broadcast")
        else:
            self._overwritten(t)

        def finish(payloads):
            with self._rt.untracked():
                data = payloads[root].detach().clone()
            return {r: _copy(payloads[r], data) for r in payloads if r != root}
        return self._collective("broadcast", g, text=f"broadcast({describe_tensor(t)}, src={root})",
                                signature=(tuple(t.shape), t.dtype, root), payload=t, nbytes=self._nbytes(t),
                                finish=finish, async_op=async_op, root=root)

    @_rule
    def reduce(self, tensor, dst: Optional[int] = None, op=ReduceOp.SUM, group=None, async_op: bool = False,
               group_dst: Optional[int] = None):
        t = self._written(tensor, "reduce")
        self._check_op(op, t)
        self._readable(t, "reduce")
        g = self._comm.resolve(self._rank, group, "reduce")
        root = self._root(g, dst, group_dst, "dst", "reduce")
        text = f"reduce({describe_tensor(t)}, dst={root}, {_op_name(op)})"

        def finish(payloads):
            with self._rt.untracked():
                total = self._reduce([payloads[r] for r in sorted(payloads)], op)
            return {r: _copy(payloads[r], total) if r == root else _spoil(payloads[r]) for r in payloads}
        if self._rank != root:        # unspecified from here on, as torch documents it: refused on read
            self._rt.ranks[self._rank].tracker.buffers.mark(t, UNSPECIFIED, text)
        return self._collective("reduce", g, text=text,
                                signature=(tuple(t.shape), t.dtype, root, _op_name(op)), payload=t,
                                nbytes=self._nbytes(t), finish=finish, async_op=async_op, root=root)

    @_rule
    def all_gather(self, tensor_list, tensor, group=None, async_op: bool = False):
        t = self._tensor(tensor, "all_gather")
        self._readable(t, "all_gather")
        g = self._comm.resolve(self._rank, group, "all_gather")
        outs = self._list(tensor_list, g, "all_gather", "tensor_list", like=t)

        def finish(payloads):
            with self._rt.untracked():
                datas = [payloads[r][1].detach().clone() for r in g.ranks]
            return {r: _copy_all(payloads[r][0], datas) for r in payloads}
        return self._collective("all_gather", g, text=f"all_gather({describe_tensor(t)})",
                                signature=(tuple(t.shape), t.dtype), payload=(outs, t),
                                nbytes=self._nbytes(t) * g.size(), finish=finish, async_op=async_op)

    @_rule
    def all_gather_into_tensor(self, output_tensor, input_tensor, group=None, async_op: bool = False):
        return self._gather_into("all_gather_into_tensor", output_tensor, input_tensor, group, async_op)

    @_rule
    def all_gather_single(self, output_tensor, input_tensor, group=None, async_op: bool = False):
        return self._gather_into("all_gather_single", output_tensor, input_tensor, group, async_op)

    def _gather_into(self, what, output_tensor, input_tensor, group, async_op):
        out = self._tensor(output_tensor, what, "output_tensor")
        inp = self._tensor(input_tensor, what, "input_tensor")
        g = self._comm.resolve(self._rank, group, what)
        if not _concatenated(out, inp, g.size()):
            raise InvalidCall(f"rank {self._rank} called {what} with input {describe_tensor(inp)} and output "
                              f"{describe_tensor(out)}: the output must be world_size ({g.size()}) inputs of the "
                              "same dtype concatenated along dim 0 (gloo rejects a stacked (N, ...) output).")

        def finish(payloads):
            with self._rt.untracked():
                data = torch.cat([payloads[r][1].detach().reshape(-1) for r in g.ranks])
            return {r: _copy(payloads[r][0], data) for r in payloads}
        return self._collective("all_gather", g, text=f"{what}({describe_tensor(inp)})",
                                signature=(tuple(inp.shape), inp.dtype), payload=(out, inp), nbytes=self._nbytes(out),
                                finish=finish, async_op=async_op)

    @_rule
    def reduce_scatter(self, output, input_list, op=ReduceOp.SUM, group=None, async_op: bool = False):
        out = self._tensor(output, "reduce_scatter", "output")
        self._check_op(op, out)
        g = self._comm.resolve(self._rank, group, "reduce_scatter")
        ins = self._list(input_list, g, "reduce_scatter", "input_list", like=out)

        def finish(payloads):
            with self._rt.untracked():
                parts = {r: self._reduce([payloads[s][1][i] for s in g.ranks], op) for i, r in enumerate(g.ranks)}
            return {r: _copy(payloads[r][0], parts[r]) for r in payloads}
        return self._collective("reduce_scatter", g, text=f"reduce_scatter({describe_tensor(out)}, {_op_name(op)})",
                                signature=(tuple(out.shape), out.dtype, _op_name(op)), payload=(out, ins),
                                nbytes=self._nbytes(out) * g.size(), finish=finish, async_op=async_op)

    @_rule
    def reduce_scatter_tensor(self, output, input, op=ReduceOp.SUM, group=None, async_op: bool = False):
        return self._scatter_from("reduce_scatter_tensor", output, input, op, group, async_op)

    @_rule
    def reduce_scatter_single(self, output, input, op=ReduceOp.SUM, group=None, async_op: bool = False):
        return self._scatter_from("reduce_scatter_single", output, input, op, group, async_op)

    def _scatter_from(self, what, output, input, op, group, async_op):
        out = self._tensor(output, what, "output")
        inp = self._tensor(input, what, "input")
        self._check_op(op, inp)
        g = self._comm.resolve(self._rank, group, what)
        if not _concatenated(inp, out, g.size()):
            raise InvalidCall(f"rank {self._rank} called {what} with input {describe_tensor(inp)} and output "
                              f"{describe_tensor(out)}: the input must be world_size ({g.size()}) outputs of the "
                              "same dtype concatenated along dim 0 (gloo rejects a stacked (N, ...) input).")

        def finish(payloads):
            with self._rt.untracked():
                total = self._reduce([payloads[r][1].reshape(g.size(), -1) for r in g.ranks], op)  # (N, chunk) per rank
            return {r: _copy(payloads[r][0], total[i]) for i, r in enumerate(g.ranks)}
        return self._collective("reduce_scatter", g, text=f"{what}({describe_tensor(inp)}, {_op_name(op)})",
                                signature=(tuple(inp.shape), inp.dtype, _op_name(op)), payload=(out, inp),
                                nbytes=self._nbytes(inp), finish=finish, async_op=async_op)

    @_rule
    def all_to_all_single(self, output, input, output_split_sizes=None, input_split_sizes=None, group=None,
                          async_op: bool = False):
        out = self._tensor(output, "all_to_all_single", "output")
        inp = self._tensor(input, "all_to_all_single", "input")
        g = self._comm.resolve(self._rank, group, "all_to_all_single")
        n = g.size()
        nth = ordinal(self._rt.ranks[self._rank].calls["all_to_all"] + 1)
        _swapped_splits(self._rank, g.ranks.index(self._rank), nth, inp, output_split_sizes, input_split_sizes)
        in_splits = self._splits(input_split_sizes, inp, n, "input", out)
        out_splits = self._splits(output_split_sizes, out, n, "output", inp)

        def finish(payloads):
            with self._rt.untracked():
                chunks = {r: list(payloads[r][1].detach().split(payloads[r][2])) for r in g.ranks}
                # Every rank receiving as it sends: each sized its side from its own sends (one rank alike by chance,
                # beside others that exchanged their counts, is not the mistake)
                guessed = all(payloads[r][2] == payloads[r][3] for r in g.ranks)
                deliveries = {}
                for i, r in enumerate(g.ranks):
                    for j, s in enumerate(g.ranks):
                        if payloads[s][2][i] != payloads[r][3][j]:
                            raise CollectiveMismatch(
                                f"all_to_all_single on {g}: rank {s} sends {payloads[s][2][i]} rows to rank {r}, "
                                f"but rank {r} expects {payloads[r][3][j]} rows from rank {s} "
                                "(its output_split_sizes)." + (_guessed_splits(r, payloads[r][3]) if guessed else
                                "\nHint: rank r's output_split_sizes[s] must equal rank s's input_split_sizes[r]."))
                    data = torch.cat([chunks[s][i] for s in g.ranks]) if n else None
                    deliveries[r] = _copy(payloads[r][0], data)
            return deliveries

        row = inp.element_size() * math.prod(inp.shape[1:])

        def traffic(payloads):
            """Each rank's bytes: the rows it sends to and receives from the other ranks (its own stay put)."""
            return {r: (row * (sum(payloads[r][2]) - payloads[r][2][i]),
                        row * (sum(payloads[r][3]) - payloads[r][3][i])) for i, r in enumerate(g.ranks)}
        rows = inp.shape[0] if inp.dim() else 1
        return self._collective("all_to_all", g, text=f"all_to_all_single({describe_tensor(inp)})",
                                signature=(tuple(inp.shape[1:]), inp.dtype), payload=(out, inp, in_splits, out_splits),
                                nbytes=self._nbytes(inp) if rows else 0, finish=finish, async_op=async_op,
                                traffic=traffic)

    @_rule
    def all_to_all(self, output_tensor_list, input_tensor_list, group=None, async_op: bool = False):
        g = self._comm.resolve(self._rank, group, "all_to_all")
        outs = self._list(output_tensor_list, g, "all_to_all", "output_tensor_list")
        ins = self._list(input_tensor_list, g, "all_to_all", "input_tensor_list")

        def finish(payloads):
            with self._rt.untracked():
                deliveries = {}
                for i, r in enumerate(g.ranks):
                    datas = []
                    for s in g.ranks:
                        sent, buf = payloads[s][1][i], payloads[r][0][g.rank_of(s)]
                        if sent.numel() != buf.numel() or sent.dtype != buf.dtype:
                            raise CollectiveMismatch(
                                f"all_to_all on {g}: rank {s} sends {describe_tensor(sent)} to rank {r}, whose "
                                f"output_tensor_list[{g.rank_of(s)}] is {describe_tensor(buf)}.")
                        datas.append(sent.detach().clone())
                    deliveries[r] = _copy_all(payloads[r][0], datas)
            return deliveries
        dtype = ins[0].dtype if ins else None
        return self._collective("all_to_all", g, text="all_to_all()", signature=(dtype,), payload=(outs, ins),
                                nbytes=sum(self._nbytes(t) for t in ins), finish=finish, async_op=async_op)

    @_rule
    def gather(self, tensor, gather_list=None, dst: Optional[int] = None, group=None, async_op: bool = False,
               group_dst: Optional[int] = None):
        t = self._tensor(tensor, "gather")
        g = self._comm.resolve(self._rank, group, "gather")
        root = self._root(g, dst, group_dst, "dst", "gather")
        if self._rank != root and gather_list is not None:
            raise InvalidCall(f"rank {self._rank} passed gather_list to gather(dst={root}): only the destination "
                              "rank may (torch.distributed raises ValueError). Pass gather_list=None elsewhere.")
        outs = self._list(gather_list, g, "gather", "gather_list", like=t) if self._rank == root else None

        def finish(payloads):
            with self._rt.untracked():
                datas = [payloads[r][1].detach().clone() for r in g.ranks]
            return {root: _copy_all(payloads[root][0], datas)}
        return self._collective("gather", g, text=f"gather({describe_tensor(t)}, dst={root})",
                                signature=(tuple(t.shape), t.dtype, root), payload=(outs, t),
                                nbytes=self._nbytes(t) * g.size(), finish=finish, async_op=async_op, root=root)

    @_rule
    def scatter(self, tensor, scatter_list=None, src: Optional[int] = None, group=None, async_op: bool = False,
                group_src: Optional[int] = None):
        t = self._tensor(tensor, "scatter")
        g = self._comm.resolve(self._rank, group, "scatter")
        root = self._root(g, src, group_src, "src", "scatter")
        if self._rank != root and scatter_list is not None:
            raise InvalidCall(f"rank {self._rank} passed scatter_list to scatter(src={root}): only the source "
                              "rank may (torch.distributed raises ValueError). Pass scatter_list=None elsewhere.")
        ins = self._list(scatter_list, g, "scatter", "scatter_list", like=t) if self._rank == root else None

        def finish(payloads):
            with self._rt.untracked():
                datas = [x.detach().clone() for x in payloads[root][1]]
            return {r: _copy(payloads[r][0], datas[i]) for i, r in enumerate(g.ranks)}
        return self._collective("scatter", g, text=f"scatter({describe_tensor(t)}, src={root})",
                                signature=(tuple(t.shape), t.dtype, root), payload=(t, ins),
                                nbytes=self._nbytes(t) * g.size(), finish=finish, async_op=async_op, root=root)

    def _list(self, tensors, g: Group, what: str, arg: str, like: Optional[torch.Tensor] = None):
        if not isinstance(tensors, (list, tuple)) or len(tensors) != g.size():
            got = f"{len(tensors)} tensors" if isinstance(tensors, (list, tuple)) else type(tensors).__name__
            raise InvalidCall(f"rank {self._rank} called {what} with {arg} of {got}; it needs one tensor per rank "
                              f"of the group ({g.size()}).")
        for i, t in enumerate(tensors):
            self._tensor(t, what, f"{arg}[{i}]")
            if like is not None and (t.numel() != like.numel() or t.dtype != like.dtype):
                raise InvalidCall(f"rank {self._rank} called {what} with {arg}[{i}] of {describe_tensor(t)}; "
                                  f"each must match {describe_tensor(like)}.")
        return list(tensors)

    def _splits(self, sizes, t: torch.Tensor, n: int, which: str, other: torch.Tensor) -> list[int]:
        """`which`'s split sizes, checked against its rows; `other`, the call's other tensor, tells where a size
        that does not fit came from (on the way back of an exchange, input and output swap)."""
        rows = t.shape[0] if t.dim() else 0
        if sizes is None:
            if rows % n:
                raise InvalidCall(f"rank {self._rank} called all_to_all_single with an {which} of {rows} rows and no "
                                  f"{which}_split_sizes: {rows} rows do not split evenly over {n} ranks.")
            return [rows // n] * n
        sizes = [int(s) for s in sizes]
        if len(sizes) != n or sum(sizes) != rows or min(sizes) < 0:
            said = (f"rank {self._rank} called all_to_all_single with {which}_split_sizes={sizes}: it needs {n} "
                    f"non-negative sizes adding up to the {which}'s {rows} rows.")
            others = other.shape[0] if other.dim() else 0
            if len(sizes) == n and min(sizes) >= 0 and which == "output" and rows == others:
                said += (f" They add up to {sum(sizes)}, and the output has the input's {rows} rows: a buffer sized "
                         "for the other direction's exchange (on the way back the input and output swap). Size the "
                         "output from output_split_sizes.")
            elif len(sizes) == n and min(sizes) >= 0 and which == "input" and sum(sizes) == others:
                said += (f" They add up to the output's {others} rows: the other direction's splits (on the way back "
                         "the input and output splits swap). Pass input_split_sizes for the rows this input holds.")
            elif len(sizes) == n and min(sizes) >= 0:
                said += f" They add up to {sum(sizes)}: size the {which} from them, or pass the sizes of its rows."
            raise InvalidCall(said)
        return sizes

    # ---- point to point -----------------------------------------------------------
    def _peer(self, group, peer, group_peer, what: str) -> int:
        if group is None and group_peer is None:
            return peer
        g = self._comm.resolve(self._rank, group, what)
        if group_peer is not None:
            return g.ranks[group_peer]
        if peer is not None and peer not in g.ranks:
            raise InvalidCall(f"rank {self._rank} called {what} with peer {peer} outside {g}.")
        return peer

    def _post_send(self, tensor, dst, group, tag, group_dst, what):
        t = self._tensor(tensor, what)
        self._readable(t, what)
        dst = self._peer(group, dst, group_dst, what)
        if self._rt.faults:
            self._rt.communicating((dst,), f"{what}(dst={dst})")
        self._rt.close_compute(self._rt.ranks[self._rank])
        return self._rt.post(self._comm.post_send(self._rank, t, dst, tag, f"{what}(dst={dst}, {describe_tensor(t)})"))

    def _post_recv(self, tensor, src, group, tag, group_src, what):
        t = self._tensor(tensor, what)
        self._overwritten(t)
        src = self._peer(group, src, group_src, what)
        if self._rt.faults:
            self._rt.communicating(() if src is None else (src,), f"{what}(src={src})")
        self._rt.close_compute(self._rt.ranks[self._rank])
        where = "any" if src is None else src
        return self._rt.post(self._comm.post_recv(self._rank, t, src, tag,
                                                  f"{what}(src={where}, {describe_tensor(t)})"))

    @_rule
    def send(self, tensor, dst: Optional[int] = None, group=None, tag: int = 0,
             group_dst: Optional[int] = None) -> None:
        self._rt.wait_call(self._post_send(tensor, dst, group, tag, group_dst, "send"))

    @_rule
    def recv(self, tensor, src: Optional[int] = None, group=None, tag: int = 0, group_src: Optional[int] = None) -> int:
        call = self._post_recv(tensor, src, group, tag, group_src, "recv")
        self._rt.wait_call(call)
        return call.peer

    @_rule
    def isend(self, tensor, dst: Optional[int] = None, group=None, tag: int = 0,
              group_dst: Optional[int] = None) -> Work:
        return self._isend(tensor, dst, group, tag, group_dst)

    def _isend(self, tensor, dst, group, tag, group_dst) -> Work:
        """Post a send the rank waits on later: its tensor is the backend's until then (writes refused)."""
        call = self._post_send(tensor, dst, group, tag, group_dst, "isend")
        self._rt.ranks[self._rank].tracker.buffers.mark(tensor, SENDING, call.text, key=call)
        return Work(self._rt, call)

    @_rule
    def irecv(self, tensor, src: Optional[int] = None, group=None, tag: int = 0,
              group_src: Optional[int] = None) -> Work:
        return self._irecv(tensor, src, group, tag, group_src)

    def _irecv(self, tensor, src, group, tag, group_src) -> Work:
        """Post a receive the rank waits on later: its buffer is the backend's until then (reads refused)."""
        call = self._post_recv(tensor, src, group, tag, group_src, "irecv")
        self._rt.ranks[self._rank].tracker.buffers.mark(tensor, RECEIVING, call.text, key=call)
        return Work(self._rt, call)

    @_rule
    def batch_isend_irecv(self, p2p_op_list) -> list[Work]:
        works = []
        for p in p2p_op_list:
            if not isinstance(p, P2POp):
                raise InvalidCall(f"rank {self._rank}: batch_isend_irecv takes a list of dist.P2POp, "
                                  f"got {type(p).__name__}.")
            kind = getattr(p.op, "__name__", "")
            if kind not in ("isend", "irecv"):
                raise InvalidCall(f"rank {self._rank}: a P2POp's op must be dist.isend or dist.irecv, got {p.op!r}.")
            if kind == "isend":
                works.append(self._isend(p.tensor, p.peer, p.group, p.tag, p.group_peer))
            else:
                works.append(self._irecv(p.tensor, p.peer, p.group, p.tag, p.group_peer))
        return works


for _name in OBJECT_CALLS:
    setattr(SimDist, _name, _rule(getattr(ObjectCollectives, _name)))


def _concatenated(big: torch.Tensor, part: torch.Tensor, n: int) -> bool:
    """`big` is n copies of `part`'s shape concatenated along dim 0: the layout every backend takes."""
    if big.dtype != part.dtype:
        return False
    if part.dim() == 0:
        return tuple(big.shape) == (n,)
    return big.dim() == part.dim() and big.shape[0] == n * part.shape[0] and big.shape[1:] == part.shape[1:]


def _spoil(buffer: torch.Tensor):
    """A non-destination rank's reduce buffer: unspecified on real backends, NaN here where its dtype has one (its
    reads are refused besides: lib.sim.in_flight)."""
    if not buffer.is_floating_point():
        return None

    def deliver() -> None:
        buffer.detach().fill_(float("nan"))
    return deliver


def _copy_all(dsts: list[torch.Tensor], srcs: list[torch.Tensor]):
    copies = [_copy(d, s) for d, s in zip(dsts, srcs)]

    def deliver() -> None:
        for c in copies:
            c()
    return deliver


def _none_reading(line: str, arg: str) -> str:
    """What a None handed to dist as `arg` most likely is, read from the learner's expression for it: a .grad backward
    never made (or a name that held one), or an entry of a list that no step had filled yet."""
    said = _argument(line.partition("(`")[2].removesuffix("`)"), arg)
    if ".grad" in said or not re.search(r"\w\s*\[", said):
        return ("A None is most often a .grad backward never reached: the tensor was detached, or never made to "
                "require grad (a tensor received from another rank needs .requires_grad_() before the forward uses "
                "it), or .grad was read before backward ran.")
    return ("The entry it names holds None: no earlier step wrote that slot (a list made as [None] * N is filled "
            "only where a step stores into it), so the index sent is not one already received or owned"
            + (", or the list was filled with .grad before backward had run." if "grad" in said else "."))


def _argument(source: str, arg: str) -> str:
    """The learner's expression for dist's argument `arg` in a call of dist in `source` (by keyword, or by its place
    in SimDist's signature); the whole source where no such call is found. Read by brackets, not compiled: a line
    that does not parse alone (`for req in [...]:`) makes compile() open a file, which a rank may not do."""
    for found in re.finditer(r"\.(\w+)\(", source):
        method = inspect.unwrap(getattr(SimDist, found.group(1), None) or len)
        if not hasattr(method, "__code__"):
            continue
        parts, depth, start = [], 0, found.end()
        for at in range(found.end(), len(source)):
            c = source[at]
            depth += c in "([{"
            if c in ")]}" and depth == 0 or c == "," and depth == 0:
                parts.append(source[start:at].strip())
                start = at + 1
                if c != ",":
                    break
            depth -= c in ")]}"
        named = {k.strip(): v for k, v in (p.split("=", 1) for p in parts if re.match(r"\w+\s*=[^=]", p))}
        if arg in named:
            return named[arg].strip()
        code = method.__code__
        names = code.co_varnames[:code.co_argcount]
        place = names.index(arg) - 1 if arg in names else -1                                  # less self
        plain = [p for p in parts if not re.match(r"\w+\s*=[^=]", p)]
        if 0 <= place < len(plain):
            return plain[place]
    return source
