"""Notebook 02, data parallel and collectives: the puzzles, their inputs, references and budgets.

Every budget is computed from the algorithm's own cost formula for the case at hand,
never copied from a run.
"""

from __future__ import annotations

import copy
import functools
import random
import re
from typing import Optional

import torch
import torch.nn.functional as F

from lib.checker.puzzle import Budget, Case, Contract, Floor, Puzzle, flops_budgets
from lib.checker.contract import neighbours, sends_to
from lib.diagnose import Mistake
from lib.checker.measure import counted_flops
from lib.models import mlp, param_bytes, sharded_batches
from lib.sim import CostModel, SimResult, per_rank
from lib.sim.cost import bus_factor
from lib.units import fmt_bytes, fmt_time
from lib.viz.timeline import training_scale

NOTEBOOK = "02_data_parallel"
P2P = frozenset({"send", "recv"})


def _vectors(rng: random.Random, world: int, length: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    return [torch.randn(length, generator=gen) for _ in range(world)]


def _total(xs: list[torch.Tensor]) -> torch.Tensor:
    """The single-device reference of a sum: in float64, then back to the inputs' dtype."""
    return torch.stack([x.double() for x in xs]).sum(0).to(xs[0].dtype)


def _nbytes(t: torch.Tensor) -> int:
    return t.nbytes


# ---- 1. all-reduce through a parameter server -------------------------------------------
def _param_server_case(rng: random.Random, world: int) -> Case:
    xs = _vectors(rng, world, rng.randint(3, 40))
    size = _nbytes(xs[0])
    star = [(world - 1) * size] + [size] * (world - 1)    # the server talks to everyone, the others once
    why = "the server sends the sum to N-1 workers; a worker sends its tensor once"
    sent = Budget("bytes_sent", star, why)
    received = Budget("bytes_received", star, "the server receives N-1 tensors; a worker receives the sum")
    return Case(world, (per_rank(xs),), [_total(xs)] * world, f"N={world}, x of {xs[0].numel()} float32 per rank",
                budgets=[sent, received, *_travels(sent, received)],
                allowed_ops=P2P)


def _travels(*ceilings: Budget) -> list[Budget]:
    """The same amounts as floors: the data must go through dist, where the check counts it (not through a file,
    an environment variable or any other channel the ranks share in one process and not on separate machines)."""
    return [Floor(b.metric, b.limit, b.why,
                  hint="every tensor goes from rank to rank through dist.send / dist.recv: the check counts the "
                       "bytes, and separate processes share nothing else.") for b in ceilings]


def _all_reduce_oracle(dist, x):
    dist.all_reduce(x)
    return x


DISPLAY_BYTES = 100 * 2**20      # an all-reduce's timeline is drawn as if each rank's tensor were a 100 MiB bucket


def _bucket_scale(case: Case) -> tuple[CostModel, str]:
    """An all-reduce's timeline at a gradient bucket's scale: the toy tensor's bytes stand for 100 MiB."""
    from lib.viz.timeline import at_scale, scale_note

    x = case.args[0].values[0]
    toy = x.nbytes
    factor = DISPLAY_BYTES / toy
    return at_scale(factor, factor), (f"drawn as if each rank's input of {fmt_bytes(toy)} were "
                                      f"{fmt_bytes(DISPLAY_BYTES)}\n{scale_note()}")


param_server_all_reduce = Puzzle(
    "param_server_all_reduce", NOTEBOOK, _param_server_case,
    hints=["Rank 0 is the server: it receives every other rank's x, adds them to its own, then sends the sum back.",
           "Workers call dist.send(x, 0) then dist.recv(x, 0). The server loops over the workers twice: "
           "once receiving into a scratch buffer (x += buf), once sending x.",
           "A blocking recv on the server pairs with each worker's send in turn, so no deadlock is possible."],
    oracle=_all_reduce_oracle, oracle_name="dist.all_reduce", real_scale=_bucket_scale,
    atol=1e-5, describe="Sum x over all ranks through rank 0; every rank returns the sum.")


# ---- 2-4. the ring --------------------------------------------------------------------
def _ring_input(rng: random.Random, world: int) -> list[torch.Tensor]:
    return _vectors(rng, world, world * rng.randint(1, 9))


def _ring_budget(factor: float, formula: str, size: int, what: str) -> Budget:
    return Budget("bytes_sent", factor * size, f"{formula} × {fmt_bytes(size)}, what {what} sends per rank",
                  hint="each step sends one chunk (1/N of the tensor) to the right neighbour; never the whole tensor.")


RING = sends_to(neighbours, "in a ring every rank sends only to its neighbour, at each step all the same way round",
               hint="send to (rank + 1) % N and receive from (rank - 1) % N at every step.", one_way=True)


RING_SLACK = 1.5     # room for the copies and bookkeeping around the messages; a serialised ring takes N times longer


def _ring_steps(op: str, world: int) -> tuple[int, str]:
    """A ring's step count and its formula: N-1 steps of one chunk each, 2(N-1) for an all-reduce."""
    return (2 * (world - 1), "2(N-1)") if op == "all_reduce" else (world - 1, "N-1")


def _ring_time(cost: CostModel, op: str, size: int, world: int) -> Budget:
    """What a ring takes: N-1 (or 2(N-1)) steps, each one chunk's message between neighbours and its sum."""
    steps, _ = _ring_steps(op, world)
    per_step = cost.p2p_time(size // world, 0, 1) + cost.compute_time(size // world // 4, nbytes=3 * size // world)
    return Budget("time", RING_SLACK * steps * per_step,
                  f"{RING_SLACK} × {steps} steps × {fmt_time(per_step)}: a chunk to the neighbour, all ranks at once",
                  hint="every rank sends and receives at each step (isend, then recv, then wait): the N-1 steps run "
                       "on all the links at the same time, not one rank after another.")



def _ring_step_count(op: str, world: int, size: int) -> Contract:
    """A ring's step count: N-1 steps of one chunk each (2(N-1) for an all-reduce). A rank that sent more chunks, one
    a step, went round the ring again: after N-1 steps every chunk already holds every rank's part."""
    steps, said = _ring_steps(op, world)
    chunk = size / world

    def broken(result: SimResult) -> Optional[str]:
        for rank in range(world):
            sent = [e.bytes for e in result.trace if e.rank == rank and e.op == "send"]
            if len(sent) > steps and all(abs(b - chunk) < 0.5 for b in sent):
                extra = len(sent) - steps
                more = "one step too many" if extra == 1 else f"{extra} steps too many"
                return (f"rank {rank} sent {len(sent)} chunks, one a step: {len(sent)} steps where {said} = {steps} "
                        f"do ({more})")
        return None
    return Contract(f"a ring {op.replace('_', '-')} takes {said} steps; after them every chunk has been once round "
                    "the ring", broken, hint="each phase of a ring loops for step in range(N - 1).")


def _ring_padding(world: int, numel: int, word: int) -> list[Contract]:
    """An all-reduce's chunk: x padded to the next multiple of N, ceil(n/N) elements a message. Where N divides n, a
    rank whose messages all hold n/N + 1 elements padded x by N zeros (N - n % N, where (-n) % N is 0), and sends
    them round the ring twice. (Other sizes are another mistake, or chunks of unequal lengths, which are right.)"""
    chunk = numel // world

    def broken(result: SimResult) -> Optional[str]:
        for rank in range(world):
            if {e.bytes / word for e in result.trace if e.rank == rank and e.op == "send"} == {chunk + 1}:
                return (f"rank {rank} sent chunks of {chunk + 1} elements: x of {numel} padded to "
                        f"{(chunk + 1) * world}, {world} zeros, where N = {world} already divides it into chunks of "
                        f"{chunk} (N - n % N is N when N divides n; (-n) % N is 0 then)")
        return None
    if numel % world or chunk + 1 >= numel:     # no such padding, or one that looks like x itself (N = n = 2)
        return []
    return [Contract("x is padded only up to the next multiple of N, by (-n) % N zeros", broken,
                     hint="pad by (-len(x)) % N: none when N already divides x's length.")]


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _shares(xs: list[torch.Tensor], op: str):
    """A ring case's explain (lib.checker.puzzle.Case): each wrong chunk read as the ranks' parts of one chunk index of
    x, each taken 0, 1 or 2 times (3^N candidates per index, told apart even by a chunk of one value), and the
    pattern named from the evidence: one neighbour's part alone (a step copied where it adds), the rank's own part
    alone (nothing received was ever added into the chunk it returns), some parts but not all (fewer additions than
    N-1), a part twice (a phase that adds where it copies, or a step too many), another index's chunk (the schedule
    completes a chunk other than the one returned), every chunk its owner's part alone (an all-gather of chunks the
    reduce-scatter had not summed)."""
    world = len(xs)
    parts = [torch.stack([x.double().chunk(world)[c] for x in xs]) for c in range(world)]     # chunk c: (N, ...)
    weights = torch.cartesian_prod(*[torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64)] * world).reshape(-1, world)

    def counts(c: int, wrong: torch.Tensor) -> Optional[list[int]]:
        if parts[c].shape[1:] != wrong.shape:
            return None
        sums = torch.einsum("kn,n...->k...", weights, parts[c]).reshape(len(weights), -1)
        close = ((sums - wrong.reshape(1, -1)).abs() <= 1e-4 + 1e-4 * wrong.abs().reshape(1, -1)).all(1)
        found = [weights[k] for k in close.nonzero().reshape(-1).tolist()]
        return [int(w) for w in found[0].tolist()] if len(found) == 1 else None

    def reading(c: int, wrong: torch.Tensor) -> Optional[tuple[int, list[int]]]:
        """(the chunk index whose parts the wrong chunk sums, how many times each rank's part), own index first."""
        for index in [c] + [i for i in range(world) if i != c]:
            times = counts(index, wrong)
            if times is not None and any(times):
                return index, times
        return None

    def said(where: str, owner: int, c: int, index: int, times: list[int], doubled: str, sent: Optional[int]) -> str:
        held = [r for r, t in enumerate(times) if t]
        missing, twice = [r for r, t in enumerate(times) if t == 0], [r for r, t in enumerate(times) if t == 2]
        whose = f"{_ranks(held)}'s part{'s' if len(held) > 1 else ''} of the sum"
        if index != c and times == [1] * world:
            return (f"Diagnosis: {where} holds what rank {index} should return, the whole sum of chunk {index} of x: "
                    f"the schedule completes chunk {index} on this rank, and it returned that one. With sends of "
                    "chunk (r - s - 1) % N and receives into chunk (r - s - 2) % N at step s, rank r's last step "
                    "completes chunk r (sends of r - s complete chunk r + 1).")
        if index != c:
            return (f"Diagnosis: {where} holds {whose} of chunk {index} of x, where it should hold chunk {c}'s: the "
                    "chunk indices of the schedule do not match the neighbours it sends to and receives from.")
        if twice:
            text = f"Diagnosis: {where} holds {whose}, {_ranks(twice)}'s counted twice: {doubled}"
            return text + (f"; {_ranks(missing)}'s left out of the sum." if missing else ".")
        if held == [owner] and sent == 0:
            return (f"Diagnosis: {where} holds only {_ranks(held)}'s own part, every other rank's left out of the "
                    f"sum, and rank {owner} sent nothing: no step of the ring ran (range(N - 1) runs N-1 = "
                    f"{world - 1} here).")
        if held == [owner] and sent:
            # The returned chunk and the trace's sizes are all the run shows: they cannot tell the adds that went
            # elsewhere from the adds that never landed, so both are said.
            return (f"Diagnosis: {where} holds only {_ranks(held)}'s own part, every other rank's left out of the "
                    f"sum, though the steps ran (rank {owner} sent {sent} chunk{'s' if sent > 1 else ''}): nothing "
                    "received reached chunk r. Either the adds went into other chunks: if the chunk indices are one "
                    "ahead (sending (r - s) % N, the rank's own chunk first, and adding into (r - s - 1) % N), the "
                    "N-1 steps stop one short of r and complete chunk (r + 1) % N instead; send (r - s - 1) % N and "
                    "add into (r - s - 2) % N. Or the adds never landed in the chunk returned: chunk.add(buf) "
                    "returns a new tensor (chunk += buf, or add_, changes it), or the result was read from x where "
                    "the adds went into a copy.")
        if held == [owner]:
            return (f"Diagnosis: {where} holds only {_ranks(held)}'s own part, every other rank's left out of the "
                    "sum: nothing received was ever added into this chunk. Either the steps added what arrived into "
                    "other chunks, so the schedule completes another one on this rank (at step s rank r sends chunk "
                    "(r - s - 1) % N and adds what it receives into chunk (r - s - 2) % N, so its last step "
                    f"completes chunk r), or no step ran at all (range(N - 1) runs N-1 = {world - 1} here).")
        if len(held) == 1:
            return (f"Diagnosis: {where} holds only {_ranks(held)}'s part, the rest left out of the sum (the owner's "
                    "own part too): a step replaced the chunk with what it received instead of adding into it. Each "
                    "step adds (chunk += received); only the all-gather copies.")
        return (f"Diagnosis: {where} holds {whose}, {_ranks(missing)}'s left out of the sum: {len(held)} of the N = "
                f"{world} parts, where each of the N-1 steps adds one more: this chunk went only part of the way "
                "round the ring (too few steps, or a chunk its schedule completes later returned early).")

    def explain(expected: list, got: list, run: Optional[SimResult] = None) -> Optional[str]:
        found = []
        for rank, (e, g) in enumerate(zip(expected, got)):
            if not isinstance(g, torch.Tensor) or g.shape != e.shape or not g.is_floating_point():
                return None
            pairs = [(rank, e.double(), g.double())] if op == "reduce_scatter" else [
                (c, a, b) for c, (a, b) in enumerate(zip(e.double().chunk(world), g.double().chunk(world)))]
            for c, a, b in pairs:
                if torch.allclose(a, b, atol=1e-5):
                    continue
                read = reading(c, b)
                if read is None or (op == "all_reduce" and read[0] != c):     # another chunk's: said by its layout
                    return None
                found.append((rank, c, *read))
        if not found:
            return None
        if op == "all_reduce" and all(index == c and times == [int(r == c) for r in range(world)]
                                      for _, c, index, times in found):
            rank, c = found[0][:2]
            return (f"Diagnosis: chunk {c} of rank {rank}'s result holds only rank {c}'s own part of it, every other "
                    "rank's left out of the sum, and so does every wrong chunk: the all-gather passed on each rank's "
                    "chunk of x as it was before the reduce-scatter summed it. Gather the reduce-scatter's result.")
        # A part counted twice: the all-gather never touches a rank's own chunk r, so where every chunk r is right the
        # all-gather added what it should copy; where one is wrong the reduce-scatter went a step too far.
        steps = "the ring went one step too many (for step in range(N - 1) makes the N-1 steps)"
        doubled = (steps if op == "reduce_scatter" or any(r == c for r, c, *_ in found) else
                   "the all-gather adds what it receives where it should copy it (each rank's own chunk r, which the "
                   "all-gather leaves alone, is right; only the chunks it received are wrong)")
        rank, c, index, times = found[0]
        where = f"rank {rank}'s chunk" if op == "reduce_scatter" else f"chunk {c} of rank {rank}'s result"
        sent = None if run is None or op != "reduce_scatter" else sum(
            1 for e in run.trace if e.rank == rank and e.op == "send")
        return said(where, rank if op == "reduce_scatter" else c, c, index, times, doubled, sent)
    return explain


def _ring_case(world: int, args: tuple, expected: list, label: str, size: int, op: str, factor: float,
               formula: str, explain=None) -> Case:
    cost = CostModel()
    sent = _ring_budget(factor, formula, size, f"a ring {op.replace('_', '-')}")
    x = args[0].values[0]
    padding = _ring_padding(world, x.numel(), x.element_size()) if op == "all_reduce" else []
    return Case(world, args, expected, label, cost=cost, allowed_ops=P2P,
                contracts=[RING, _ring_step_count(op, world, size), *padding], explain=explain,
                explain_reads_run=True,
                budgets=[sent, *_travels(sent), _ring_time(cost, op, size, world)])


def _reduce_scatter_case(rng: random.Random, world: int) -> Case:
    xs = _ring_input(rng, world)
    return _ring_case(world, (per_rank(xs),), list(_total(xs).chunk(world)),
                      f"N={world}, x of {xs[0].numel()} float32 per rank", _nbytes(xs[0]), "reduce_scatter",
                      bus_factor("reduce_scatter", world), "(N-1)/N", _shares(xs, "reduce_scatter"))


def _reduce_scatter_oracle(dist, x):
    out = torch.empty_like(x.chunk(dist.get_world_size())[0])
    dist.reduce_scatter_single(out, x)       # reduce_scatter_tensor before torch 2.13 (lib supplies the new name)
    return out


def _reduce_scatter_left(dist, x):
    """The ring run to the left (send to rank - 1, receive from rank + 1) with the chunk indices of a ring that runs
    to the right: each rank adds what arrives into a chunk of another index than the one sent to it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 2:                            # left and right are one neighbour: the reference itself
        raise ValueError("at N = 2 a ring to the left is the ring to the right")
    chunks = [c.clone() for c in x.chunk(world)]
    for step in range(world - 1):
        got = torch.empty_like(chunks[(rank - step - 2) % world])
        work = dist.isend(chunks[(rank - step - 1) % world], (rank - 1) % world)
        dist.recv(got, (rank + 1) % world)
        work.wait()
        chunks[(rank - step - 2) % world] += got
    return chunks[rank]


RING_MISTAKES = [Mistake(_reduce_scatter_left, "a ring run to the left (isend to rank - 1, recv from rank + 1) with "
                         "the chunk indices of a ring run to the right gives: what arrives is added into a chunk of "
                         "another index than the one the neighbour sent. Send to rank + 1 and receive from rank - 1, "
                         "as the indices (r - s - 1) % N and (r - s - 2) % N assume, or mirror the indices too.")]


ring_reduce_scatter = Puzzle(
    "ring_reduce_scatter", NOTEBOOK, _reduce_scatter_case,
    hints=["Cut x into N chunks (x.chunk(N)). In N-1 steps, every rank sends one chunk to its right "
           "neighbour and adds the chunk coming from its left neighbour into its own copy of that chunk.",
           "At step s, rank r sends chunk (r - s - 1) % N and receives into chunk (r - s - 2) % N. "
           "After N-1 steps chunk r holds the full sum on rank r.",
           "Send without blocking (req = dist.isend(...)), then dist.recv(buf, left), then req.wait(): "
           "if every rank does a blocking send first, nobody is receiving."],
    oracle=_reduce_scatter_oracle, oracle_name="dist.reduce_scatter_single", atol=1e-5, real_scale=_bucket_scale,
    mistakes=RING_MISTAKES,
    describe="Rank r returns chunk r of the sum over ranks of x, built from send/recv in a ring (x may serve as "
             "scratch space).")


def _all_gather_case(rng: random.Random, world: int) -> Case:
    chunks = _vectors(rng, world, rng.randint(1, 9))
    out = torch.cat(chunks)
    case = _ring_case(world, (per_rank(chunks),), [out] * world, f"N={world}, chunk of {chunks[0].numel()} float32 "
                      "per rank", _nbytes(out), "all_gather", bus_factor("all_gather", world), "(N-1)/N",
                      _gathered_slots(chunks))
    case.explain_error = _unfilled_slot
    return case


def _unfilled_slot(error: BaseException) -> Optional[str]:
    """An all-gather's explain_error: a send of None, an entry of the rank's list of N slots that no step filled. The
    slots a ring all-gather fills are the rank's own and the ones it stores what arrives into; the one it sends on at
    step s + 1 is the one it stored into at step s, so a None sent means the two indices do not meet."""
    text = str(error)
    found = re.match(r"rank (\d+) called i?send with tensor=None", text)
    joined = re.match(r"rank (\d+) raised TypeError: expected Tensor as element (\d+) in argument 0, but got NoneType",
                      text)
    if joined:
        return (f"What it means: slot {joined.group(2)} of rank {joined.group(1)}'s list of N chunks still held None "
                "when the list was joined: no step stored what it received there, so the slots it stored received "
                "chunks into are not the ones the chunks belong in. What arrives from the left at step s started on "
                "rank r - s - 1, s + 1 hops back: it is chunk (r - s - 1) % N, so store it at slot (r - s - 1) % N, "
                "and at step s + 1 send that same slot, (r - (s + 1)) % N.")
    if not found:
        return None
    return (f"What it means: rank {found.group(1)} sent on a slot no step had filled, so the slot it stored a received "
            "chunk into is not the one it sends on one step later. What arrives from the left at step s started on "
            "rank r - s - 1, s + 1 hops back: it is chunk (r - s - 1) % N, so store it at slot (r - s - 1) % N, "
            "and at step s + 1 send that same slot, (r - (s + 1)) % N.")


def _gathered_slots(chunks: list[torch.Tensor]):
    """An all-gather case's explain: each slot of each rank's result read as the rank whose chunk it holds, and the
    pattern named: every rank's chunks in arrival order (slot i holds chunk (r + i) % N: rank 0 right, the others
    rotated by their rank), or every wrong slot the left neighbour's chunk (each rank sent its own chunk at every
    step instead of forwarding what it received)."""
    world = len(chunks)

    def whose(slot: torch.Tensor) -> Optional[int]:
        found = [c for c, chunk in enumerate(chunks) if torch.equal(slot, chunk)]
        return found[0] if len(found) == 1 else None

    def explain(expected: list, got: list, run: Optional[SimResult] = None) -> Optional[str]:
        held = []
        for g in got:
            if not isinstance(g, torch.Tensor) or g.shape != expected[0].shape:
                return None
            held.append([whose(slot) for slot in g.chunk(world)])
        if held == [list(range(world))] * world:
            return None
        for sign in (1, -1):
            if all(h == [(r + sign * i) % world for i in range(world)] for r, h in enumerate(held)):
                order = "r + i" if sign == 1 else "r - i"
                return (f"Diagnosis: each rank's result holds the chunks in the order they arrived, its own first "
                        f"(rank order rotated by its rank): rank r's slot i holds chunk ({order}) % N, where slot i "
                        "is rank i's. Put the chunk that "
                        "came from rank i at slot i (out.chunk(N)[i]), whatever step it arrived at.")
        left = [(r, i) for r, h in enumerate(held) for i, c in enumerate(h) if c != i]
        if left and all(held[r][i] == (r - 1) % world for r, i in left):
            return ("Diagnosis: every wrong slot holds what rank r - 1 holds, the left neighbour's own chunk: each "
                    "step received it again, because each rank sent its own chunk at every step. A ring all-gather "
                    "forwards at step s the chunk it received at step s - 1 (chunk (r - s) % N).")
        wrong = [r for r, h in enumerate(held) if h != list(range(world))]
        twice = [[c for c in set(held[r]) if c is not None and held[r].count(c) > 1] for r in wrong]
        if world > 2 and all(twice):
            r, c = wrong[0], twice[0][0]
            slots = [i for i, h in enumerate(held[r]) if h == c]
            return (f"Diagnosis: slots {', '.join(map(str, slots))} of rank {r}'s result hold the same "
                    f"chunk, rank {c}'s (every wrong rank's result holds a chunk twice): the slots share one tensor, a "
                    "receive buffer made once before the loop and stored at every step, so each receive overwrites "
                    "what the earlier steps stored there and what was sent on from it. Make a new buffer each step "
                    "(torch.empty_like inside the loop), or receive straight into the output's chunk "
                    "(out.chunk(N)[i]).")
        return None
    return explain


def _all_gather_oracle(dist, chunk):
    out = torch.empty(dist.get_world_size() * chunk.numel(), dtype=chunk.dtype, device=chunk.device)
    dist.all_gather_single(out, chunk)
    return out


ring_all_gather = Puzzle(
    "ring_all_gather", NOTEBOOK, _all_gather_case,
    hints=["Make the output (N chunks), put your own chunk in place r, then pass chunks around the ring for N-1 steps.",
           "At step s, rank r sends chunk (r - s) % N to the right and receives chunk (r - s - 1) % N from the left, "
           "straight into its place in the output.",
           "dist.recv writes into the tensor you give it, and a chunk of out (out.chunk(N)[i]) is a view: "
           "receiving into it fills the output."],
    oracle=_all_gather_oracle, oracle_name="dist.all_gather_single", real_scale=_bucket_scale,
    describe="Every rank returns the concatenation of all ranks' chunks, in rank order, built from send/recv.")


def _all_reduce_case(rng: random.Random, world: int, uneven: bool = False) -> Case:
    """uneven: x's length is not a multiple of N (an all-reduce takes any tensor): the ring pads it to one, and sends
    2(N-1)/N of the padded length; chunks of unequal lengths (tensor_split) send a little less, the floor's share."""
    if not uneven:
        xs = _ring_input(rng, world)
        return _ring_case(world, (per_rank(xs),), [_total(xs)] * world, f"N={world}, x of {xs[0].numel()} float32 "
                          "per rank", _nbytes(xs[0]), "all_reduce", bus_factor("all_reduce", world), "2(N-1)/N",
                          _shares(xs, "all_reduce"))
    # n % N = N - 1: there a padding of n % N zeros (where (-n) % N belongs) makes chunks longer than ⌈n/N⌉; at
    # N = 3 with n % N = 1 it makes the chunks x.tensor_split(N) does, right by its bytes on that n alone.
    xs = _vectors(rng, world, world * rng.randint(1, 9) + world - 1)
    n = xs[0].numel()
    chunk = -(-n // world)
    case = _ring_case(world, (per_rank(xs),), [_total(xs)] * world,
                      f"N={world}, x of {n} float32 per rank, not a multiple of N", 4 * world * chunk, "all_reduce",
                      bus_factor("all_reduce", world), "2(N-1)/N, x padded to N chunks of " + str(chunk) + ",",
                      _padding_misplaced(_total(xs), world))
    case.explain_error = functools.partial(_unequal_chunks, n, world)
    least = 2 * 4 * (n - chunk)
    case.budgets = [b if not b.least else Floor("bytes_sent", least, f"2 × (N-1) chunks of x's {n} elements, the "
                                                f"largest ({chunk}) left out: {fmt_bytes(least)}", hint=b.hint)
                    for b in case.budgets]
    return case


def _padding_misplaced(total: torch.Tensor, world: int):
    """An uneven all-reduce's explain: the result the right sum moved k places along x, zeros where nothing of the
    sum lands, as a padding put at one end of x and cut off at the other makes (k read from the result); or the
    padded sum, its padding never cut off."""
    n, right = total.numel(), total.double()

    def reads(answer, k: int) -> bool:
        if not isinstance(answer, torch.Tensor) or not answer.is_floating_point() or answer.dim() != 1:
            return False
        if k == 0:                                       # the padding kept: the sum, then zeros
            want = torch.cat([right, right.new_zeros(-n % world)])
        else:
            want = torch.zeros_like(right)
            want[max(k, 0):n + min(k, 0)] = right[max(-k, 0):n - max(k, 0)]
        return answer.shape == want.shape and torch.allclose(answer.detach().cpu().double(), want, rtol=1e-4,
                                                             atol=1e-5)

    def explain(expected: list, got: list, run: Optional[SimResult] = None) -> Optional[str]:
        for k in range(-world + 1, world):
            if not all(reads(g, k) for g in got):
                continue
            if k == 0:
                return (f"Diagnosis: every rank's result is the padded sum, {n} + {-n % world} entries: the padding "
                        "was never cut off. Return the result's first len(x) entries, result[:len(x)].")
            places, zeros = (("1 place", "entry"), (f"{abs(k)} places", f"{abs(k)} entries"))[abs(k) > 1]
            if k > 0:
                return (f"Diagnosis: every rank's result is the right sum moved {places} toward the end, its first "
                        f"{zeros} 0: the padding went in front of x and was cut off its end. Pad at the end, "
                        "F.pad(x, (0, (-len(x)) % N)), and keep the result's first len(x) entries.")
            return (f"Diagnosis: every rank's result is the right sum moved {places} toward the start, its last "
                    f"{zeros} 0: the padding added at the end of x was cut off its front. Keep the result's first "
                    "len(x) entries, result[:len(x)].")
        return None
    return explain


def _unequal_chunks(n: int, world: int, error: BaseException) -> Optional[str]:
    """An uneven all-reduce's explain_error: a message of one chunk's length met by a buffer of another's, both lengths
    of x.chunk(N)'s pieces of x (n not a multiple of N): x cut unpadded into chunks of unequal lengths, and a buffer
    sized like one chunk (the rank's own) receiving another."""
    found = re.match(r"rank (\d+) sent \((\d+),\) \S+ to rank (\d+), but rank \d+ receives into \((\d+),\)",
                     str(error))
    lengths = [len(c) for c in torch.empty(n).chunk(world)]
    size = -(-n // world)
    pad = (f"Pad x to a multiple of N first, F.pad(x, (0, (-len(x)) % N)), {world * size} elements here, so that "
           f"every chunk has ⌈n/N⌉ = {size}, and cut the padding off the result, result[:len(x)].")
    if found is None and len(lengths) < world and "list index out of range" in str(error):
        return (f"What it means: x's {n} elements are not a multiple of N = {world}, and x.chunk(N) cut it into "
                f"only {len(lengths)} chunks ({', '.join(map(str, lengths))}), fewer than N: chunk {len(lengths)} "
                f"and after do not exist. {pad}")
    if found is None:
        return None
    src, sent, dst, room = map(int, found.groups())
    if sent == room or {sent, room} - set(lengths):
        return None
    return (f"What it means: x's {n} elements are not a multiple of N = {world}, so x.chunk(N) cut it into chunks of "
            f"unequal lengths ({', '.join(map(str, lengths))}), and rank {dst}'s buffer of {room} (the length of a "
            f"chunk of its own) met rank {src}'s chunk of {sent}. {pad}")


ring_all_reduce = Puzzle(
    "ring_all_reduce", NOTEBOOK, _all_reduce_case, variants=[{}, {"uneven": True}],
    hints=["All-reduce = reduce-scatter, then all-gather of the reduced chunks.",
           "Call your ring_reduce_scatter, then your ring_all_gather on its result. x's length need not be a "
           "multiple of N: pad it to one first (F.pad(x, (0, -len(x) % N))) and cut the padding off the result.",
           "Each phase sends (N-1)/N of the data per rank, 2(N-1)/N in all: independent of N for large N."],
    oracle=_all_reduce_oracle, oracle_name="dist.all_reduce", atol=1e-5, real_scale=_bucket_scale,
    describe="Every rank returns the sum over ranks of x, using 2(N-1)/N of the data per rank.")


# ---- 5-6. data-parallel training ----------------------------------------------------------
STEPS = 3


def _model_sizes(rng: random.Random) -> tuple[int, ...]:
    """An MLP's widths drawn for the case (inputs, 4-6 hidden layers of one width, outputs): an answer may not
    assume the model's shapes."""
    width = rng.randrange(24, 41, 4)
    return (rng.randint(4, 12), *[width] * rng.randint(4, 6), rng.randint(2, 6))


def train_single(model, batches, lr: float, before_update=None, zero: bool = True):
    """The single-device reference: plain SGD on the whole batch, mean squared error. (A known mistake passes
    `before_update`, what it does to each parameter between backward and the update, or zero=False: gradients
    never zeroed, so each step's backward adds to the last one's.)"""
    model = copy.deepcopy(model)
    for x, y in batches:
        if zero:
            model.zero_grad()
        F.mse_loss(model(x), y).backward()
        for p in model.parameters() if before_update else ():
            before_update(p)
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    return model


def _trained(model, batches, lr: float):
    """The expected model: single-device training, its gradients let go. The statement compares the parameters, so
    every loop order real training code uses (zero_grad before backward, or after the update, .grad = None) is right."""
    model = train_single(model, batches, lr)
    model.zero_grad(set_to_none=True)
    return model


def _scale_grad(p: torch.Tensor, c: float) -> None:
    p.grad.mul_(c)


def _alone_explain(model, shards: list, full: list, lr: float, bucket_size: Optional[int] = None):
    """A data-parallel case's explain (lib.checker.puzzle.Case): every rank's parameters are those of training alone
    on its own shard, with its gradient as backward made it or scaled by N either way (a loss divided by N instead of
    an all-reduce): whatever the scale, no gradient travelled. Or those of whole-batch training whose gradients are
    never zeroed: each step's gradient carried into the next. Or some parameters never all-reduced (with bucket_size,
    a bucketed case: the step's last bucket never launched)."""
    world = len(shards)
    scales = {1.0: "", 1 / world: f", each gradient divided by N = {world}",
              float(world): f", each gradient × N = {world}"}

    def params(module) -> Optional[list[torch.Tensor]]:
        return [p.detach() for p in module.parameters()] if isinstance(module, torch.nn.Module) else None

    def explain(expected: list, got: list) -> Optional[str]:
        mine = [params(g) for g in got]
        if any(p is None for p in mine):
            return None
        for c, scaled in scales.items():
            alone = [params(train_single(model, shards[r], lr, functools.partial(_scale_grad, c=c)))
                     for r in range(world)]
            if all(_equal(a, b) for a, b in zip(alone, mine)):
                return (f"Diagnosis: each rank's parameters are those of training alone on its own shard{scaled}: the "
                        "gradients were never all-reduced, so no rank's update saw the other ranks' samples. "
                        "All-reduce each p.grad and divide it by N before the update.")
        carried = params(train_single(model, full, lr, zero=False))
        if len(shards[0]) > 1 and all(_equal(carried, m) for m in mine):
            return ("Diagnosis: your parameters are those of single-device training whose gradients are never zeroed: "
                    "step 1 is right, and at step 2 and after, backward added each step's gradient to the last "
                    "step's still in p.grad (backward accumulates), so every update used the sum of all steps so "
                    "far. Zero the gradients each step (model.zero_grad(), or p.grad = None after the update).")
        return _some_never_averaged(model, shards, lr, mine, bucket_size)
    return explain


def _some_never_averaged(model, shards: list, lr: float, mine: list, bucket_size: Optional[int]) -> Optional[str]:
    """The parameters the ranks hold differently, replayed as data-parallel training in which those alone were never
    all-reduced (each rank's own gradient) and every other gradient averaged: where that is the run, name them, and
    where they are the step's last bucket under DDP's rule (the first layers, which backward finishes last), say so."""
    names = [n for n, _ in model.named_parameters()]
    apart = {n for i, n in enumerate(names) if not all(_equal([m[i]], [mine[0][i]]) for m in mine[1:])}
    if not apart or len(apart) == len(names):
        return None
    if not all(_equal(a, b) for a, b in zip(_ranks_training(model, shards, lr, apart), mine)):
        return None
    listed = [n for n in names if n in apart]
    said = listed[0] if len(listed) == 1 else f"{', '.join(listed[:-1])} and {listed[-1]}"
    were, them, are = ("was", "it", "is") if len(listed) == 1 else ("were", "them", "are")
    last = _last_bucket(model, bucket_size) if bucket_size else set()
    opening = (f"Diagnosis: your ranks' parameters are those of data-parallel training in which {said} {were} never "
               f"all-reduced, each rank updating {them} from its own gradient, and every other gradient averaged: ")
    if apart == last:
        return (f"{opening}{said} {are} each step's last bucket, fewer than bucket_size = {bucket_size} elements "
                "(backward reaches the first layer last), which the hook never launches because it never fills. After "
                "backward, all-reduce the bucket still open before waiting on the others.")
    return f"{opening}all-reduce every parameter's gradient (and divide by N) before the update."


def _last_bucket(model, bucket_size: int) -> set[str]:
    """The names of the parameters in a step's last bucket under DDP's rule (_buckets), if it is not full."""
    named = list(reversed(list(model.named_parameters())))
    last = _buckets([p.numel() for _, p in named], bucket_size)[-1]
    return {named[i][0] for i in last} if sum(named[i][1].numel() for i in last) < bucket_size else set()


def _ranks_training(model, shards: list, lr: float, alone: set[str]) -> list[list[torch.Tensor]]:
    """Data-parallel SGD replayed on every rank's copy in lockstep: each gradient all-reduced (summed in rank order)
    and divided by N, but those of the parameters named in `alone`, which each rank keeps as its own."""
    world = len(shards)
    copies = [copy.deepcopy(model) for _ in range(world)]
    for step in range(len(shards[0])):
        for m, shard in zip(copies, shards):
            m.zero_grad()
            F.mse_loss(m(shard[step][0]), shard[step][1]).backward()
        with torch.no_grad():
            held = [dict(m.named_parameters()) for m in copies]
            for name in held[0]:
                if name in alone:
                    continue
                grads = [h[name].grad for h in held]
                total = grads[0].clone()
                for g in grads[1:]:
                    total += g
                for g in grads:
                    g.copy_(total / world)
            for m in copies:
                for p in m.parameters():
                    p -= lr * p.grad
    return [[p.detach() for p in m.parameters()] for m in copies]


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and torch.allclose(x.double(), y.double(), rtol=1e-7, atol=1e-9)
                                    for x, y in zip(a, b))


def _all_reduce_grads_budgets(model, world: int, steps: int) -> list[Budget]:
    """Exactly the gradients' all-reduce, no more (a ceiling) and no less (a floor: every rank trains on its
    own shard, so the gradients must travel; gathering the data instead is another algorithm)."""
    size = param_bytes(model)
    total = steps * bus_factor("all_reduce", world) * size
    why = f"{steps} steps × 2(N-1)/N × {fmt_bytes(size)} of gradients (one ring all-reduce of them per step)"
    # The gradients flattened into one buffer and padded to N equal chunks (a reduce-scatter and an all-gather, as
    # ZeRO does) send up to N-1 zeros more: the ceiling allows that padding, the floor does not ask for it.
    word = next(model.parameters()).element_size()
    padded = steps * bus_factor("all_reduce", world) * word * world * -(-size // word // world)
    return [Budget("bytes_sent", padded, why + (", padded to N chunks" if padded > total else ""),
                   hint="all-reduce each gradient once per step: nothing else needs to travel."),
            Floor("bytes_sent", total, why,
                  hint="each rank trains on its own shard of the batch and the gradients travel, not the data.")]


GRADIENT_PASSES = 4           # elementwise passes over the gradients a step may add: flatten, average, copy back, spare
OWN_SLACK = 0.1               # on top of a rank's own training: bookkeeping a different but honest loop may add


def _own_work_budget(model, shard, lr: float, steps: int) -> Budget:
    """A FLOPs ceiling: one rank's own training on its shard (counted on the reference), plus a few elementwise
    passes over the gradients per step. Training on the whole batch, gathered through any channel, costs N times
    the forward and backward."""
    numel = sum(p.numel() for p in model.parameters())
    _, own = counted_flops(lambda: train_single(model, shard, lr))
    limit = own * (1 + OWN_SLACK) + GRADIENT_PASSES * steps * numel
    return Budget("flops", limit, f"single-device training on this rank's shard ({own:,.0f} FLOPs) + "
                                  f"{OWN_SLACK:.0%}, + {GRADIENT_PASSES} passes over the {numel:,} gradient elements "
                                  f"per step",
                  hint="each rank runs forward and backward on its own shard only; the whole batch's gradient is "
                       "the average of the ranks' gradients, which the all-reduce makes.")


def _ddp_case(rng: random.Random, world: int, steps: Optional[int] = None) -> Case:
    """`steps`: fewer steps of the same batches (every draw is the same), to find the step a wrong run goes astray."""
    sizes = _model_sizes(rng)
    model = mlp(sizes, seed=rng.randrange(2**31))
    local = rng.randint(2, 5)
    steps = steps or STEPS
    shards, full = sharded_batches(rng.randrange(2**31), sizes, world, local, steps)
    lr = 0.1
    expected, flops = counted_flops(lambda: _trained(model, full, lr))
    floor = flops_budgets(flops / world, f"1/N of single-device training's {flops:,.0f} FLOPs")[1]
    return Case(world, (model, per_rank(shards), lr), [expected] * world,
                f"N={world}, {steps} steps of {len(shards[0][0][0])} samples per rank",
                budgets=_all_reduce_grads_budgets(model, world, steps) + [_own_work_budget(model, shards[0], lr, steps),
                                                                         floor], steps=steps,
                explain=_alone_explain(model, shards, full, lr))


def _ddp_mistake(what: str, message: str) -> Mistake:
    """Data-parallel SGD that does `what` to each parameter between backward and the update."""
    def mistaken(dist, model, batches, lr, *_):
        steps = {"sum": lambda p: dist.all_reduce(p.grad),
                 "average the parameters": lambda p: (dist.all_reduce(p.data), p.data.div_(dist.get_world_size()))}
        return train_single(model, batches, lr, steps[what])
    return Mistake(mistaken, message)


DDP_MISTAKES = [           # each rank training alone, at any scale, is the cases' explain (_alone_explain)
    _ddp_mistake("sum", "summing the gradients without dividing by N gives: the sum of N shard gradients is N × the "
                        "whole batch's gradient (off by a factor of N = world size). Average them."),
    _ddp_mistake("average the parameters", "all-reducing the parameters instead of their gradients gives: p.data "
                 "was averaged where p.grad was meant, and each rank updated with its own gradient."),
]


def _ddp_oracle(dist, model, batches, lr, *_, bucket_cap_mb: float = 25.0):
    """PyTorch's DistributedDataParallel, SGD over `batches` (bench/rows.py sets its own bucket size); its gradients
    let go at the end, as the reference's are (_trained): the statement compares the parameters."""
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    for x, y in batches:
        opt.zero_grad()
        F.mse_loss(ddp(x), y).backward()
        opt.step()
    opt.zero_grad(set_to_none=True)
    return model


data_parallel_train = Puzzle(
    "data_parallel_train", NOTEBOOK, _ddp_case, world_sizes=(2, 3, 4),
    hints=["Each rank computes the loss on its own shard and calls backward. Before the update, every rank "
           "needs the gradient of the loss on the whole batch.",
           "The whole-batch loss is the mean of the shard losses (shards are equal), so its gradient is the "
           "average of the ranks' gradients: all-reduce each p.grad, then divide by the world size.",
           "Loop: model.zero_grad(); F.mse_loss(model(x), y).backward(); for p: dist.all_reduce(p.grad); "
           "p.grad /= world; then under torch.no_grad(): p -= lr * p.grad."],
    oracle=_ddp_oracle, oracle_name="DistributedDataParallel", rtol=1e-7, atol=1e-9, mistakes=DDP_MISTAKES,
    real_scale=training_scale,
    describe="Train a copy of the model on each rank's shard for several SGD steps; end equal to "
             "single-device training on the whole batch.")


OVERLAP = 0.5                 # the share of what overlap can save (serial step - overlapped step) that must be saved
STEP_PASSES = 6               # elementwise passes over the gradients a step makes besides forward and backward: the
                              # SGD update (2), a bucket's flatten, average and copy back (3), one spare


def _bucket_size(rng: random.Random, model, layers: tuple[float, float]) -> int:
    """bucket_size drawn for the case, between layers[0] and layers[1] times the largest layer's gradients (weight
    and bias): an answer that ignores the argument meets a case where its buckets break DDP's rule."""
    largest = max(sum(p.numel() for p in layer.parameters()) for layer in model if isinstance(layer, torch.nn.Linear))
    low, high = int(layers[0] * largest), int(layers[1] * largest)
    # Where the range allows, a size whose buckets differ from those a round size a learner might fix (ROUND_BUCKET)
    # makes: else an answer ignoring bucket_size makes this case's very buckets, and passes.
    sizes = [p.numel() for p in reversed(list(model.parameters()))]
    round_buckets = _bucket_elements(sizes, ROUND_BUCKET)
    apart = [n for n in range(low, high + 1) if _bucket_elements(sizes, n) != round_buckets]
    return rng.choice(apart) if apart else rng.randint(low, high)


ROUND_BUCKET = 1000            # the round bucket size an answer ignoring bucket_size tends to fix


BUCKET_LAYERS = {"one": (0.5, 1.0), "several": (2.1, 3.0)}     # a bucket per layer; three layers per bucket


def _phase_flops(model, x, y) -> tuple[float, float]:
    """FLOPs of the forward and of the backward pass on one shard, counted on the reference model."""
    model = copy.deepcopy(model)
    loss, forward = counted_flops(lambda: F.mse_loss(model(x), y))
    _, backward = counted_flops(loss.backward)
    return forward, backward


def _buckets(sizes: list[int], bucket_size: int) -> list[list[int]]:
    """Which gradients (indices into `sizes`, in the order backward finishes them: reverse parameter order) each
    bucket holds under DDP's rule: a bucket closed once it holds bucket_size elements."""
    buckets, current, held = [], [], 0
    for i, n in enumerate(sizes):
        current.append(i)
        held += n
        if held >= bucket_size:
            buckets.append(current)
            current, held = [], 0
    return buckets + [current] if current else buckets


def _bucket_elements(sizes: list[int], bucket_size: int) -> list[int]:
    """The elements of each bucket under DDP's rule (_buckets)."""
    return [sum(sizes[i] for i in bucket) for bucket in _buckets(sizes, bucket_size)]


def _overlapped_backward(model, cost: CostModel, world: int, t_bwd: float, bucket_size: int) -> float:
    """Backward with each bucket all-reduced on the link as soon as backward has filled it (gradients appear at
    a pace proportional to their size): when the last all-reduce ends."""
    buckets = _bucket_elements([p.numel() for p in reversed(list(model.parameters()))], bucket_size)
    total, filled, link_free = sum(buckets), 0, 0.0
    word = next(model.parameters()).element_size()
    for elements in buckets:
        filled += elements
        ready = t_bwd * filled / total
        link_free = max(ready, link_free) + cost.collective_time("all_reduce", elements * word, range(world))
    return max(t_bwd, link_free)


def _bucketed_case(rng: random.Random, world: int, bucket: str = "several", steps: Optional[int] = None) -> Case:
    """`steps`: fewer steps than drawn, of the same batches (every draw is the same)."""
    sizes = _model_sizes(rng)
    model = mlp(sizes, seed=rng.randrange(2**31))
    bucket_size = _bucket_size(rng, model, BUCKET_LAYERS[bucket])
    local, drawn, lr = rng.randint(8, 24), rng.randint(2, 3), 0.1
    steps = steps or drawn
    shards, full = sharded_batches(rng.randrange(2**31), sizes, world, local=local, steps=steps)
    f_flops, b_flops = _phase_flops(model, *shards[0][0])
    # A link chosen so that all-reducing the gradients takes as long as the backward pass:
    # the regime where overlapping the two pays off most.
    cost = CostModel(flops_per_s=1e9, latency=1e-6)
    t_fwd, t_bwd = cost.compute_time(f_flops), cost.compute_time(b_flops)
    comm_bytes = bus_factor("all_reduce", world) * param_bytes(model)
    cost = cost.with_(intra_node_bandwidth=comm_bytes / t_bwd)
    t_comm = cost.collective_time("all_reduce", param_bytes(model), range(world))
    serial = t_fwd + t_bwd + t_comm
    overlapped = t_fwd + _overlapped_backward(model, cost, world, t_bwd, bucket_size)
    word = next(model.parameters()).element_size()
    numel = sum(p.numel() for p in model.parameters())
    passes = STEP_PASSES * cost.compute_time(numel, nbytes=2 * numel * word)
    budget = steps * (overlapped + (1 - OVERLAP) * (serial - overlapped) + passes)
    why = (f"{steps} steps × (forward + backward + all-reduce, {serial * 1e3:.3f} ms one after the other, "
           f"{overlapped * 1e3:.3f} ms with every bucket's all-reduce started as it fills: "
           f"at least {OVERLAP:.0%} of the difference saved; + {STEP_PASSES} passes over the gradients, "
           f"{passes * 1e6:.1f} µs)")
    budgets = [*_all_reduce_grads_budgets(model, world, steps), _own_work_budget(model, shards[0], lr, steps)]
    if bucket == "one":          # overlap is judged where it pays: buckets of several layers are too few to hide much
        budgets.insert(0, Budget("time", budget, why,
                                 hint="launch each bucket's all_reduce with async_op=True from a gradient hook as "
                                      "soon as its last gradient is ready, and wait only after backward."))
    largest = max(p.numel() for p in model.parameters())
    return Case(world, (model, per_rank(shards), lr, bucket_size), [_trained(model, full, lr)] * world,
                f"N={world}, {steps} steps, bucket_size={bucket_size}, all-reduce of the gradients as long as the "
                "backward pass", budgets=budgets, cost=cost,
                contracts=[_bucket_contract(bucket_size, largest, steps, world, word)], steps=steps,
                explain=_alone_explain(model, shards, full, lr, bucket_size))


GRADIENT_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")     # the ways a bucket of gradients travels


def _bucket_contract(bucket_size: int, largest: int, steps: int, world: int, word: int) -> Contract:
    """DDP's rule: a bucket is all-reduced once it holds bucket_size elements, so it holds fewer than bucket_size
    plus its last gradient (the largest parameter, at most; a few elements more for padding to N); only a step's
    last bucket may hold fewer than bucket_size. Every collective counts, however the bucket travels."""
    most = bucket_size + largest + world

    def broken(result: SimResult) -> Optional[str]:
        for rank in range(world):
            for op in GRADIENT_COLLECTIVES:
                sizes = [e.bytes / bus_factor(op, world) / word for e in result.trace if e.rank == rank and e.op == op]
                small = [round(n) for n in sizes if n < bucket_size - 0.5]
                if len(small) > steps:
                    return (f"rank {rank} sent {len(small)} buffers of fewer than bucket_size = {bucket_size} "
                            f"elements by {op} in {steps} steps "
                            f"({', '.join(map(str, small[:6]))}{'...' if len(small) > 6 else ''})")
                large = [round(n) for n in sizes if n > most - 0.5]
                if large:
                    return (f"rank {rank} sent a bucket of {large[0]} elements by {op}, more than bucket_size = "
                            f"{bucket_size} plus the largest gradient ({largest}): that bucket was full before its "
                            "last gradients were added")
        return None
    return Contract("a bucket is all-reduced once it holds at least bucket_size elements (DDP's rule), and no later; "
                    "only each step's last bucket may be smaller", broken,
                    hint="add gradients to the current bucket until it holds bucket_size elements, then all-reduce "
                         "it as one flat tensor at once; many small all-reduces each pay the link's latency, and a "
                         "bucket kept open longer starts its all-reduce late.")


bucketed_data_parallel_train = Puzzle(
    "bucketed_data_parallel_train", NOTEBOOK, _bucketed_case, world_sizes=(2, 4),
    hints=["Gradients become ready layer by layer, from the last layer back. Start all-reducing a group of "
           "them (a bucket) as soon as all its gradients exist, while backward goes on.",
           "p.register_post_accumulate_grad_hook(hook) calls hook(p) once p.grad is final (note: it receives the "
           "parameter, not the gradient). Build buckets of about bucket_size elements in reverse parameter order.",
           "In the hook, when a bucket is complete: flat = torch.cat of its grads; work = dist.all_reduce(flat, "
           "async_op=True). After backward: work.wait(), divide by the world size, copy back into each p.grad."],
    oracle=_ddp_oracle, oracle_name="DistributedDataParallel", rtol=1e-7, atol=1e-9, mistakes=DDP_MISTAKES,
    real_scale=training_scale, variants=[{"bucket": "several"}, {"bucket": "one"}],
    describe="Data-parallel training whose gradient all-reduce overlaps the backward pass.")


PUZZLES = [param_server_all_reduce, ring_reduce_scatter, ring_all_gather, ring_all_reduce,
           data_parallel_train, bucketed_data_parallel_train]
