"""What context parallelism costs: the Ring Attention paper's overlap condition, ring and Ulysses step times
and memory per rank, all priced by lib.sim's CostModel, and the stand-in cost model that times a small
simulated attention as the real one it stands for.

Attention here is the forward of one layer, bidirectional (no causal mask), layout (b, h, s, d).
"""

from __future__ import annotations

from dataclasses import dataclass

from lib.analytic.formulas import activation_bytes_per_layer
from lib.sim.cost import CostModel
from lib.units import fmt_time

LINKS = {"NVLink": CostModel().intra_node_bandwidth, "InfiniBand": CostModel().inter_node_bandwidth}


@dataclass(frozen=True)
class Shard:
    """One rank's share of an attention layer split over a context-parallel group: its s/N tokens of q, k, v."""

    tokens: int           # s/N
    heads: int
    head_dim: int
    batch: int = 1
    item: int = 2         # bytes per element: 2 for bf16 on a GPU, 8 for the float64 the puzzles simulate

    @property
    def chunk_bytes(self) -> float:
        """One of q, k, v or the output on one rank: b·h·(s/N)·d elements."""
        return self.batch * self.heads * self.tokens * self.head_dim * self.item

    @property
    def block_bytes(self) -> float:
        """What one ring step moves: a rank's K and V."""
        return 2 * self.chunk_bytes

    @property
    def block_flops(self) -> float:
        """This rank's queries against one K/V block, forward: QKᵀ and PV, 2·(s/N)²·d FLOPs each per head."""
        return 4 * self.batch * self.heads * self.tokens ** 2 * self.head_dim


def min_tokens_to_overlap(flops_per_s: float, bandwidth: float, item: int = 2) -> float:
    """The fewest tokens per rank c at which a block's compute hides its transfer: 4dc²/F ≥ 2dc·item/B, so
    c ≥ F·item/(2B), F/B in bf16 (Liu et al. 2023, Ring Attention with Blockwise Transformers, section 3)."""
    return flops_per_s * item / (2 * bandwidth)


def with_links(cost: CostModel, bandwidth: float) -> CostModel:
    """`cost` with every link, inside a node and between nodes, at `bandwidth` bytes/s."""
    return cost.with_(intra_node_bandwidth=bandwidth, inter_node_bandwidth=bandwidth)


def stand_in(small_flops: float, small_bytes: float, real: Shard, cost: CostModel, bandwidth: float) -> CostModel:
    """A cost model under which a small block of `small_flops` (as the simulator counts them) and its message of
    `small_bytes` take the times `real`'s block takes on `cost`'s devices over links of `bandwidth`: the FLOP rate
    and the links scaled by the ratios of the work; latency kept as it is."""
    return with_links(cost, bandwidth * small_bytes / real.block_bytes).with_(
        flops_per_s=cost.flops_per_s * small_flops / real.block_flops)


def block_times(shard: Shard, cost: CostModel) -> tuple[float, float]:
    """(compute, transfer) of one ring step: this rank's queries against one K/V block, and sending that block
    to the next rank (its latency included)."""
    return cost.compute_time(shard.block_flops), cost.p2p_time(shard.block_bytes, 0, 1)


def ring_time(shard: Shard, n: int, cost: CostModel, overlap: bool = True) -> float:
    """N blocks of compute; N-1 transfers, each hidden behind the block computed meanwhile (overlap) or not."""
    compute, transfer = block_times(shard, cost)
    step = max(compute, transfer) if overlap else compute + transfer
    return compute + (n - 1) * step


def ulysses_fits(shard: Shard, n: int) -> bool:
    """Ulysses gives each rank whole heads: N ≤ h, and N divides h."""
    return shard.heads % n == 0


def ulysses_time(shard: Shard, n: int, cost: CostModel) -> float:
    """Four all-to-alls of one rank's chunk (q, k and v to a head split, the output back), none hidden, and the
    same attention FLOPs as the ring's: h/N heads over the whole sequence is N blocks' worth."""
    if not ulysses_fits(shard, n):
        raise ValueError(f"Ulysses cannot split {shard.heads} heads over {n} ranks: N must divide the heads")
    return 4 * cost.collective_time("all_to_all", shard.chunk_bytes, range(n)) + n * block_times(shard, cost)[0]


def ring_or_ulysses(shard: Shard, n: int, cost: CostModel) -> str:
    """Which of ring and Ulysses runs one layer's attention forward faster on N ranks, with both times; or why
    only the ring can run (a rank needs whole heads)."""
    ring = ring_time(shard, n, cost)
    if not ulysses_fits(shard, n):
        return (f"ring {fmt_time(ring)}; Ulysses cannot run: {shard.heads} heads do not split over {n} ranks "
                f"(a rank needs whole heads)")
    ulysses = ulysses_time(shard, n, cost)
    faster, ratio = ("ring", ulysses / ring) if ring <= ulysses else ("Ulysses", ring / ulysses)
    return f"ring {fmt_time(ring)}, Ulysses {fmt_time(ulysses)}: {faster} is faster, {ratio:.2f}×"


def ring_memory(shard: Shard) -> float:
    """Bytes of attention a ring rank holds: its q, k, v and output, the K/V block being used and the one
    arriving (blockwise attention keeps no (s/N)² scores), and a float32 log-sum-exp per query and head."""
    return 4 * shard.chunk_bytes + 2 * shard.block_bytes + 4 * shard.batch * shard.heads * shard.tokens


def scores_bytes(seq: int, heads: int, hidden: int, batch: int = 1) -> float:
    """Korthikanti et al. 2022's attention term 5as²b: the bytes of s×s scores, softmax and dropout a layer keeps
    without flash attention (the full activations minus those kept with selective recomputation)."""
    return (activation_bytes_per_layer(seq, batch, hidden, heads)
            - activation_bytes_per_layer(seq, batch, hidden, heads, recompute="selective"))
