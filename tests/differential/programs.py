"""Small SPMD programs of the torch.distributed API, as a learner might write them, awkward ones included: each runs
on simulated ranks and on real gloo processes (tests/test_two_worlds.py), and the two must agree.

A program is a plain function `prog(dist)` returning plain values (tensors, numbers, strings, lists), with
- its world size;
- its label: SAME (the same results, or both worlds refuse it), or DELIBERATE: the simulator refuses it on purpose,
  with a message holding `words` (it stands for NCCL and says what gloo would do), or answers otherwise on purpose
  (`words` empty, `note` says why); docs/DIFFERENCES.md lists them all;
- where it runs on gloo: BATCH (with every program of its world size in one launch), ALONE (its own short launch:
  it may crash gloo, hang it, or leave its connections unusable), or SIM_ONLY;
- runs: how many times it runs on gloo (races: gloo is not deterministic there).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import torch

SAME, DELIBERATE = "same", "deliberate"
BATCH, ALONE, SIM_ONLY = "batch", "alone", "sim only"


@dataclass(frozen=True)
class Program:
    name: str
    fn: Callable
    world: int
    label: str
    words: tuple[str, ...]
    gloo: str
    runs: int
    note: str


PROGRAMS: list[Program] = []


def program(world: int = 2, label: str = SAME, words: tuple[str, ...] = (), gloo: str = BATCH, runs: int = 1,
            note: str = "", name: str = ""):
    def add(fn: Callable) -> Callable:
        PROGRAMS.append(Program(name or fn.__name__, fn, world, label, tuple(words), gloo, runs, note))
        return fn
    return add


def _x(rank: int, k: int, shape=(4,), dtype=torch.float32) -> torch.Tensor:
    """Rank- and program-dependent values, the same in both worlds (a generator of its own)."""
    g = torch.Generator().manual_seed(1000 * k + rank)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g).to(dtype)
    if dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype == torch.uint8:
        return torch.randint(0, 60, shape, generator=g).to(dtype)
    return torch.randint(-40, 40, shape, generator=g).to(dtype)


# ---- who am I -------------------------------------------------------------------------------------

@program(world=3)
def rank_and_size(dist):
    return dist.get_rank(), dist.get_world_size(), dist.is_initialized(), dist.is_available()


@program(world=4)
def rank_and_size_4(dist):
    return dist.get_rank(), dist.get_world_size(dist.group.WORLD)


@program()
def torchrun_environment(dist):
    return [os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")]


@program()
def environment_rank_matches(dist):
    return int(os.environ["RANK"]) == dist.get_rank()


@program(label=DELIBERATE, note="get_backend() answers 'nccl', the backend the simulated ranks stand for")
def backend_name(dist):
    return dist.get_backend()


@program()
def backend_names(dist):
    return str(dist.Backend.NCCL), str(dist.Backend.GLOO)


@program(world=3)
def world_group_ranks(dist):
    return dist.get_process_group_ranks(dist.group.WORLD)


# ---- all_reduce: every op on every dtype ---------------------------------------------------------

_OPS = ("SUM", "PRODUCT", "MIN", "MAX", "AVG")
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.int8,
           torch.uint8)


def _all_reduce_program(op: str, dtype: torch.dtype, k: int) -> Callable:
    def prog(dist):
        t = _x(dist.get_rank(), k, (5,), dtype)
        if op == "PRODUCT" and dtype.is_floating_point:
            t = t.abs() + 0.5
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        return t
    return prog


for _k, (_op, _dtype) in enumerate((o, d) for o in _OPS for d in _DTYPES):
    _integer = not _dtype.is_floating_point
    _name = f"all_reduce_{_op.lower()}_{str(_dtype).replace('torch.', '')}"
    # AVG of integers: torch refuses it on every rank, and gloo's connections are unusable after it
    program(world=3 if _k % 2 else 2, gloo=ALONE if _op == "AVG" and _integer else BATCH, name=_name)(
        _all_reduce_program(_op, _dtype, 100 + _k))


@program(world=4)
def all_reduce_sum_float16_four(dist):
    t = torch.tensor([1.0, 1000.0, 0.1, 3.0], dtype=torch.float16) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return t


@program()
def all_reduce_complex(dist):
    t = _x(dist.get_rank(), 7, (3,), torch.complex64)
    dist.all_reduce(t)
    return t


@program()
def all_reduce_int8_wraps(dist):
    t = torch.tensor([100, -100], dtype=torch.int8)
    dist.all_reduce(t)
    return t


@program()
def all_reduce_max_bool(dist):
    t = torch.tensor([dist.get_rank() == 0, False, True])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t


def _extreme(op: str, mine: list, theirs: list) -> Callable:
    """MIN or MAX where rank 0 holds `mine` and the others `theirs`: NaNs and signed zeros."""
    def prog(dist):
        t = torch.tensor(mine if dist.get_rank() == 0 else theirs)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        return t, torch.signbit(t)
    return prog


_NAN = float("nan")
for _name, _op, _mine, _theirs in (("max_nan_on_rank_1", "MAX", [1.0, 2.0], [_NAN, 2.0]),
                                    ("max_nan_on_rank_0", "MAX", [_NAN, 2.0], [1.0, 2.0]),
                                    ("min_nan_on_rank_1", "MIN", [1.0, 2.0], [_NAN, 2.0]),
                                    ("min_signed_zeros", "MIN", [0.0, -0.0], [-0.0, 0.0]),
                                    ("max_signed_zeros", "MAX", [0.0, -0.0], [-0.0, 0.0])):
    program(name=_name)(_extreme(_op, _mine, _theirs))


def _bitwise(op: str) -> Callable:
    def prog(dist):
        t = torch.tensor([12, 10, 7], dtype=torch.int64) + dist.get_rank()
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        return t
    return prog


for _op in ("BAND", "BOR", "BXOR"):
    program(label=DELIBERATE, words=("NCCL", f"ReduceOp.{_op}", "gloo computes it"),
            name=f"all_reduce_{_op.lower()}")(_bitwise(_op))


@program()
def all_reduce_scalar(dist):
    t = torch.tensor(float(dist.get_rank() + 1))
    dist.all_reduce(t)
    return t


@program()
def all_reduce_empty(dist):
    t = torch.zeros(0)
    dist.all_reduce(t)
    return t


@program()
def all_reduce_into_slice(dist):
    big = torch.arange(8.0) * (dist.get_rank() + 1)
    dist.all_reduce(big[2:6])
    return big


@program()
def all_reduce_row_of_matrix(dist):
    m = torch.ones(3, 4) * (dist.get_rank() + 1)
    dist.all_reduce(m[1])
    return m


@program(label=DELIBERATE, words=("NCCL", "Tensors must be contiguous"))
def all_reduce_transposed(dist):
    m = (torch.arange(6.0).reshape(2, 3) + dist.get_rank()).t()
    dist.all_reduce(m)
    return m


@program(label=DELIBERATE, words=("NCCL", "Tensors must be contiguous"))
def all_reduce_expanded(dist):
    t = torch.tensor([1.0 + dist.get_rank()]).expand(3)
    dist.all_reduce(t)
    return t


@program(label=DELIBERATE, words=("NCCL", "Tensors must be contiguous"))
def all_reduce_column(dist):
    m = torch.ones(3, 4) * (dist.get_rank() + 1)
    dist.all_reduce(m[:, 1])
    return m


@program()
def all_reduce_leaf_requiring_grad(dist):
    w = torch.ones(3, requires_grad=True)
    with torch.no_grad():
        w.mul_(dist.get_rank() + 1)
        dist.all_reduce(w)
    return w.detach()


@program()
def all_reduce_grad_of_model(dist):
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    x = torch.ones(4, 3) * (dist.get_rank() + 1)
    layer(x).sum().backward()
    for p in layer.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    return [p.grad for p in layer.parameters()]


@program()
def all_reduce_returns_none(dist):
    return dist.all_reduce(torch.ones(2)) is None


# ---- async collectives --------------------------------------------------------------------------

@program()
def all_reduce_async_wait(dist):
    t = _x(dist.get_rank(), 30)
    work = dist.all_reduce(t, async_op=True)
    done = work.wait()
    return t, done


@program(world=3)
def two_async_then_wait(dist):
    a, b = _x(dist.get_rank(), 31), _x(dist.get_rank(), 32)
    wa = dist.all_reduce(a, op=dist.ReduceOp.MAX, async_op=True)
    wb = dist.broadcast(b, src=2, async_op=True)
    wb.wait()
    wa.wait()
    return a, b


@program(label=DELIBERATE, words=("before its wait()", "half-reduced"), runs=2)
def read_async_all_reduce_before_wait(dist):
    t = torch.ones(1000) * (dist.get_rank() + 1)
    work = dist.all_reduce(t, async_op=True)
    early = t[:3].clone()
    work.wait()
    return early, t[:3]


@program(label=DELIBERATE, words=("before its wait()", "half-received"), runs=2)
def read_irecv_buffer_before_wait(dist):
    buf = torch.zeros(3)
    if dist.get_rank() == 0:
        dist.send(torch.ones(3), 1)
        return "sent"
    work = dist.irecv(buf, 0)
    early = buf.sum()
    work.wait()
    return early, buf


@program()
def async_broadcast_root_reads(dist):
    t = torch.ones(3) * (dist.get_rank() + 1)
    work = dist.broadcast(t, src=0, async_op=True)
    seen = t.sum() if dist.get_rank() == 0 else torch.tensor(3.0)
    work.wait()
    return seen, t


@program()
def is_completed_after_wait(dist):
    w = dist.all_reduce(torch.ones(2), async_op=True)
    w.wait()
    return w.is_completed()


@program()
def barrier_async(dist):
    dist.barrier(async_op=True).wait()
    return "ok"


# ---- broadcast, reduce ----------------------------------------------------------------------------

@program(world=3)
def broadcast_from_last(dist):
    t = _x(dist.get_rank(), 40)
    dist.broadcast(t, src=2)
    return t


@program()
def broadcast_int(dist):
    t = torch.tensor([dist.get_rank() * 7, 3])
    dist.broadcast(t, 1)
    return t


@program()
def broadcast_parameter(dist):
    p = torch.nn.Parameter(torch.ones(3) * (dist.get_rank() + 2))
    with torch.no_grad():
        dist.broadcast(p, src=0)
    return p.detach(), p.requires_grad


@program()
def broadcast_into_slice(dist):
    big = torch.zeros(6) + dist.get_rank()
    dist.broadcast(big[1:4], src=1)
    return big


@program(label=DELIBERATE, words=("NCCL", "Tensors must be contiguous"))
def broadcast_transposed(dist):
    m = (torch.arange(6.0).reshape(2, 3) * (dist.get_rank() + 1)).t()
    dist.broadcast(m, src=0)
    return m


@program(world=3)
def reduce_read_at_root(dist):
    t = _x(dist.get_rank(), 50)
    dist.reduce(t, dst=1)
    return t if dist.get_rank() == 1 else None


@program(world=3)
def reduce_max_to_0(dist):
    t = _x(dist.get_rank(), 51)
    dist.reduce(t, 0, op=dist.ReduceOp.MAX)
    return t if dist.get_rank() == 0 else "not read"


@program(label=DELIBERATE, words=("unspecified", "gloo leaves partial sums", "NCCL"))
def reduce_read_everywhere(dist):
    t = _x(dist.get_rank(), 52)
    dist.reduce(t, dst=0)
    return t.sum()


@program(label=DELIBERATE, words=("unspecified", "returned it", "NCCL"))
def reduce_returned_everywhere(dist):
    t = _x(dist.get_rank(), 53)
    dist.reduce(t, dst=0)
    return t


@program()
def reduce_then_broadcast(dist):
    t = _x(dist.get_rank(), 54)
    dist.reduce(t, dst=0)
    dist.broadcast(t, src=0)
    return t


@program()
def reduce_then_overwrite(dist):
    t = _x(dist.get_rank(), 55)
    dist.reduce(t, dst=1)
    if dist.get_rank() != 1:
        t.zero_()
    return t


# ---- gathers and scatters ------------------------------------------------------------------------

@program(world=3)
def all_gather_list(dist):
    out = [torch.empty(2, 2) for _ in range(3)]
    dist.all_gather(out, _x(dist.get_rank(), 60, (2, 2)))
    return out


@program(world=4)
def all_gather_into_tensor(dist):
    out = torch.empty(8, 3)
    dist.all_gather_into_tensor(out, _x(dist.get_rank(), 61, (2, 3)))
    return out


@program()
def all_gather_single_2_13(dist):
    out = torch.empty(4)
    dist.all_gather_single(out, _x(dist.get_rank(), 65, (2,)))
    return out


@program()
def reduce_scatter_single_2_13(dist):
    out = torch.empty(2)
    dist.reduce_scatter_single(out, _x(dist.get_rank(), 66, (4,)), op=dist.ReduceOp.MAX)
    return out


@program(label=DELIBERATE, words=("NCCL", "Tensors must be contiguous"))
def all_gather_into_tensor_transposed_input(dist):
    out = torch.empty(6, 2)
    dist.all_gather_into_tensor(out, _x(dist.get_rank(), 62, (2, 3)).t())
    return out


@program(gloo=ALONE)
def all_gather_into_tensor_stacked_output(dist):
    out = torch.empty(2, 2, 3)
    dist.all_gather_into_tensor(out, _x(dist.get_rank(), 63, (2, 3)))
    return out


@program(world=3)
def reduce_scatter_list(dist):
    out = torch.empty(2)
    dist.reduce_scatter(out, [_x(dist.get_rank(), 64 + i, (2,)) for i in range(3)])
    return out


@program(world=4)
def reduce_scatter_tensor_sum(dist):
    out = torch.empty(2, 2)
    dist.reduce_scatter_tensor(out, _x(dist.get_rank(), 68, (8, 2)))
    return out


@program()
def reduce_scatter_tensor_avg(dist):
    out = torch.empty(3)
    dist.reduce_scatter_tensor(out, _x(dist.get_rank(), 69, (6,)), op=dist.ReduceOp.AVG)
    return out


@program(label=DELIBERATE, words=("NCCL", "Tensors must be contiguous"))
def reduce_scatter_tensor_transposed_input(dist):
    out = torch.empty(2, 2)
    dist.reduce_scatter_tensor(out, _x(dist.get_rank(), 70, (2, 4)).t())
    return out


@program(world=3)
def gather_to_last(dist):
    rank = dist.get_rank()
    bufs = [torch.empty(3) for _ in range(3)] if rank == 2 else None
    dist.gather(_x(rank, 71, (3,)), bufs, dst=2)
    return bufs


@program(world=3)
def scatter_from_1(dist):
    rank = dist.get_rank()
    out = torch.empty(2)
    parts = [_x(1, 72 + i, (2,)) for i in range(3)] if rank == 1 else None
    dist.scatter(out, parts, src=1)
    return out


@program(gloo=ALONE)
def gather_list_off_root(dist):
    dist.gather(torch.ones(1), [torch.zeros(1), torch.zeros(1)], dst=0)
    return "gathered"


# ---- all_to_all ---------------------------------------------------------------------------------------

@program(world=4)
def all_to_all_single_even(dist):
    out = torch.empty(8)
    dist.all_to_all_single(out, _x(dist.get_rank(), 80, (8,)))
    return out


@program(world=3)
def all_to_all_single_uneven(dist):
    rank = dist.get_rank()
    send = [(rank + j) % 3 + 1 for j in range(3)]                 # rows rank sends to j
    recv = [(j + rank) % 3 + 1 for j in range(3)]                 # rows j sends to rank
    out = torch.empty(sum(recv), 2)
    dist.all_to_all_single(out, _x(rank, 81, (sum(send), 2)), recv, send)
    return out


@program(world=3)
def all_to_all_lists(dist):
    rank = dist.get_rank()
    outs = [torch.empty(2) for _ in range(3)]
    dist.all_to_all(outs, [_x(rank, 82 + j, (2,)) for j in range(3)])
    return outs


# ---- point to point ----------------------------------------------------------------------------------

@program(world=4)
def send_recv_ring(dist):
    rank, n = dist.get_rank(), dist.get_world_size()
    t, buf = _x(rank, 90), torch.empty(4)
    if rank % 2 == 0:
        dist.send(t, (rank + 1) % n)
        dist.recv(buf, (rank - 1) % n)
    else:
        dist.recv(buf, (rank - 1) % n)
        dist.send(t, (rank + 1) % n)
    return buf


@program(world=3)
def recv_returns_sender(dist):
    rank = dist.get_rank()
    if rank == 0:
        buf = torch.empty(2)
        got = [dist.recv(buf, src=s) for s in (1, 2)]
        return got
    dist.send(torch.ones(2) * rank, 0)
    return rank


@program()
def recv_any_source(dist):
    if dist.get_rank() == 0:
        buf = torch.empty(3)
        src = dist.recv(buf)
        return buf, src
    dist.send(_x(1, 91, (3,)), 0)
    return "sent"


@program()
def tags_out_of_order(dist):
    if dist.get_rank() == 0:
        a, b = dist.isend(torch.ones(2), 1, tag=1), dist.isend(torch.ones(2) * 2, 1, tag=2)
        a.wait()
        b.wait()
        return "sent"
    second, first = torch.empty(2), torch.empty(2)
    dist.recv(second, 0, tag=2)
    dist.recv(first, 0, tag=1)
    return first, second


@program(world=4)
def isend_irecv_ring(dist):
    rank, n = dist.get_rank(), dist.get_world_size()
    buf = torch.empty(4)
    works = [dist.isend(_x(rank, 92), (rank + 1) % n), dist.irecv(buf, (rank - 1) % n)]
    for w in works:
        w.wait()
    return buf


@program(world=3)
def batch_isend_irecv_both_ways(dist):
    rank, n = dist.get_rank(), dist.get_world_size()
    left, right = (rank - 1) % n, (rank + 1) % n
    from_l, from_r = torch.empty(2), torch.empty(2)
    ops = [dist.P2POp(dist.isend, _x(rank, 93, (2,)), right), dist.P2POp(dist.irecv, from_l, left),
           dist.P2POp(dist.isend, _x(rank, 94, (2,)), left), dist.P2POp(dist.irecv, from_r, right)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    return from_l, from_r


@program()
def send_parameter_data(dist):
    p = torch.nn.Parameter(torch.ones(2) * (dist.get_rank() + 1))
    if dist.get_rank() == 0:
        dist.send(p.data, 1)
        return "sent"
    buf = torch.empty(2)
    dist.recv(buf, 0)
    return buf


@program()
def recv_into_slice(dist):
    big = torch.zeros(6)
    if dist.get_rank() == 0:
        dist.send(torch.arange(3.0), 1)
    else:
        dist.recv(big[3:], 0)
    return big


@program(label=DELIBERATE, words=("NCCL", "Tensors must be contiguous"), gloo=ALONE)
def send_transposed(dist):
    m = torch.arange(6.0).reshape(2, 3)
    if dist.get_rank() == 0:
        dist.send(m.t(), 1)
        return "sent"
    buf = torch.empty(3, 2)
    dist.recv(buf, 0)
    return buf


@program(gloo=ALONE)
def send_to_self(dist):
    dist.send(torch.ones(1), dist.get_rank())
    return "sent"


def _ill_fitting_recv(sent: int, buffer: Callable) -> Callable:
    """Rank 0 sends `sent` floats; rank 1 receives into buffer() of another size or dtype."""
    def prog(dist):
        if dist.get_rank() == 0:
            dist.send(torch.ones(sent), 1)
            return "sent"
        buf = buffer()
        dist.recv(buf, 0)
        return buf
    return prog


program(gloo=ALONE, name="recv_buffer_too_small")(_ill_fitting_recv(4, lambda: torch.zeros(2)))
program(label=DELIBERATE, words=("gloo would copy the bytes and reinterpret",), gloo=ALONE,
        name="recv_into_another_dtype")(_ill_fitting_recv(4, lambda: torch.zeros(4, dtype=torch.int32)))
program(label=DELIBERATE, words=("gloo would fill the first bytes",), gloo=ALONE,
        name="recv_buffer_too_large")(_ill_fitting_recv(2, lambda: torch.zeros(4)))


@program(gloo=ALONE, note="gloo crashes (SIGSEGV): both refuse")
def send_to_rank_out_of_range(dist):
    if dist.get_rank() == 0:
        dist.send(torch.ones(1), 2)
    return "sent"


@program(gloo=ALONE, note="gloo hangs too: its send waits for the receiver")
def both_send_first(dist):
    other = 1 - dist.get_rank()
    buf = torch.empty(2)
    dist.send(torch.ones(2) * dist.get_rank(), other)
    dist.recv(buf, other)
    return buf


@program(gloo=ALONE)
def both_receive_first(dist):
    other = 1 - dist.get_rank()
    buf = torch.empty(2)
    dist.recv(buf, other)
    dist.send(torch.ones(2), other)
    return buf


@program(label=DELIBERATE, words=("returned without waiting on its isend", "Connection closed by peer"),
         gloo=ALONE, runs=3)
def isend_never_waited(dist):
    if dist.get_rank() == 0:
        dist.isend(torch.ones(3), 1)
        return "sent"
    buf = torch.empty(3)
    dist.recv(buf, 0)
    return buf


@program(label=DELIBERATE, words=("wrote into the tensor of its isend", "gloo sent the old values"), runs=3)
def write_between_isend_and_wait(dist):
    t = torch.ones(3)
    if dist.get_rank() == 0:
        w = dist.isend(t, 1)
        t.mul_(5)
        w.wait()
        return "sent"
    dist.recv(t, 0)
    return t


@program()
def write_after_isend_waited(dist):
    t = torch.ones(3)
    if dist.get_rank() == 0:
        w = dist.isend(t, 1)
        w.wait()
        t.mul_(5)
        return t
    dist.recv(t, 0)
    return t


@program()
def read_while_isend_in_flight(dist):
    t = torch.ones(3) * 2
    if dist.get_rank() == 0:
        w = dist.isend(t, 1)
        total = t.sum()
        w.wait()
        return total
    dist.recv(t, 0)
    return t


# ---- groups ---------------------------------------------------------------------------------------

@program(world=4)
def subgroup_all_reduce(dist):
    rank = dist.get_rank()
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    t = _x(rank, 100)
    dist.all_reduce(t, group=groups[rank % 2])
    return t


@program(world=4)
def group_rank_and_size(dist):
    g = dist.new_group([1, 2])
    return dist.get_rank(g), dist.get_world_size(g)


@program(world=4)
def non_group_member_sentinel(dist):
    g = dist.new_group([0, 1])
    return g == dist.GroupMember.NON_GROUP_MEMBER


@program(world=4)
def group_global_and_group_rank(dist):
    g = dist.new_group([1, 3])
    if dist.get_rank() in (1, 3):
        return dist.get_global_rank(g, 1), dist.get_group_rank(g, 3), dist.get_process_group_ranks(g)
    return None


@program(world=4)
def group_broadcast_group_src(dist):
    g = dist.new_group([2, 3])
    t = _x(dist.get_rank(), 101)
    if dist.get_rank() in (2, 3):
        dist.broadcast(t, group=g, group_src=1)
    return t


@program(world=4)
def group_send_recv_group_peer(dist):
    g = dist.new_group([1, 3])
    rank = dist.get_rank()
    if rank == 1:
        dist.send(torch.ones(2) * 7, group=g, group_dst=1)
    elif rank == 3:
        buf = torch.empty(2)
        dist.recv(buf, group=g, group_src=0)
        return buf
    return None


@program(world=3, label=DELIBERATE, words=("not a member", "skip the call"),
         note="torch skips a collective on a non-member with a warning; the simulator refuses it")
def collective_on_group_not_member(dist):
    g = dist.new_group([0, 1])
    t = torch.ones(2)
    dist.all_reduce(t, group=g)
    return t


@program(world=4)
def world_after_subgroups(dist):
    dist.new_group([0, 1])
    dist.new_group([2, 3])
    t = _x(dist.get_rank(), 102)
    dist.all_reduce(t)
    return t


@program(world=3, gloo=ALONE)
def new_group_skipped_by_one_rank(dist):
    if dist.get_rank() != 2:
        dist.new_group([0, 1])
    g = dist.new_group([0, 2])
    t = torch.ones(1)
    if dist.get_rank() in (0, 2):
        dist.all_reduce(t, group=g)
    return t


# ---- objects and barriers ------------------------------------------------------------------------

@program(world=3)
def all_gather_object_dicts(dist):
    out = [None] * 3
    dist.all_gather_object(out, {"rank": dist.get_rank(), "name": f"r{dist.get_rank()}", "t": torch.ones(2)})
    return out


@program(world=3)
def broadcast_object_list_from_1(dist):
    objs = [dist.get_rank(), "mine", [dist.get_rank()] * 2]
    dist.broadcast_object_list(objs, src=1)
    return objs


@program(world=3)
def gather_object_to_0(dist):
    out = [None] * 3 if dist.get_rank() == 0 else None
    dist.gather_object((dist.get_rank(), "x" * dist.get_rank()), out, dst=0)
    return out


@program(world=3)
def scatter_object_list_from_2(dist):
    out = [None]
    dist.scatter_object_list(out, [{"i": i} for i in range(3)] if dist.get_rank() == 2 else None, src=2)
    return out


@program(gloo=ALONE)
def all_gather_object_unpicklable(dist):
    out = [None] * 2
    dist.all_gather_object(out, lambda: 1)
    return out


@program()
def barrier_then_value(dist):
    dist.barrier()
    return dist.get_rank()


@program()
def monitored_barrier_passes(dist):
    dist.monitored_barrier()
    return "passed"


# ---- what the simulator does not offer -----------------------------------------------------------

@program(gloo=ALONE)
def unknown_attribute(dist):
    return dist.all_reduce_everything


@program(label=DELIBERATE, words=("not available on simulated ranks", "all_reduce"))
def all_reduce_coalesced_instead(dist):
    ts = [torch.ones(2) * dist.get_rank(), torch.ones(1)]
    dist.all_reduce_coalesced(ts)
    return ts


@program(gloo=ALONE)
def init_process_group_again(dist):
    dist.init_process_group("gloo")
    return "initialised"


# ---- mistakes between ranks ----------------------------------------------------------------------

@program(gloo=ALONE, note="gloo hangs to the timeout; the simulator names both calls")
def collectives_in_different_orders(dist):
    t = torch.ones(2)
    if dist.get_rank() == 0:
        dist.all_reduce(t)
        dist.broadcast(t, 0)
    else:
        dist.broadcast(t, 0)
        dist.all_reduce(t)
    return t


@program(gloo=ALONE, note="gloo aborts (SIGABRT) or returns garbage")
def shapes_differ(dist):
    t = torch.ones(2 + dist.get_rank() * 1000)
    dist.all_reduce(t)
    return t


@program(label=DELIBERATE, words=("same shape and dtype", "gloo returns garbage", "NCCL"), gloo=ALONE)
def dtypes_differ(dist):
    t = torch.ones(4) if dist.get_rank() == 0 else torch.ones(4, dtype=torch.int32)
    dist.all_reduce(t)
    return t


@program(gloo=ALONE)
def one_rank_skips_all_reduce(dist):
    t = torch.ones(2)
    if dist.get_rank() == 0:
        dist.all_reduce(t)
    return t


@program(gloo=ALONE)
def learner_raises_on_one_rank(dist):
    if dist.get_rank() == 1:
        raise ValueError("my own mistake")
    dist.barrier()
    return "passed"
