"""How long simulated work takes, and how many bytes each rank moves.

Every op costs the roofline: max(FLOPs / peak, bytes it touches / memory bandwidth), so nothing a rank
computes is free (an op without a FLOP formula counts one FLOP per element). The host computes and reads
memory more slowly than the device, by the ratios below. Communication follows the alpha-beta model of the
ring algorithms NCCL uses: each of the algorithm's steps pays a latency, and each rank
moves a known fraction of the data over the slowest link the group spans. The fractions
are the nccl-tests "bus bandwidth" factors: 2(N-1)/N for all-reduce, (N-1)/N for
all-gather, reduce-scatter and all-to-all, 1 for broadcast and reduce.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional, Sequence

# The collectives whose traffic the model knows, with the fraction of the data S each rank
# sends (and receives) in the algorithm NCCL runs for them, and their number of latency steps.
# How much slower the host is than the device. Compute: a two-socket server reaches a few TFLOP/s in fp32
# (AVX-512), an H100 989 TFLOP/s in bf16: about two orders of magnitude. Memory: 8-channel DDR5 gives about
# 300 GB/s per socket against the H100's 3.35 TB/s of HBM3: about one order.
HOST_COMPUTE_SLOWDOWN = 100.0
HOST_MEMORY_SLOWDOWN = 10.0

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
               "gather", "scatter", "barrier")


def bus_factor(op: str, n: int) -> float:
    """Fraction of the message each rank sends in `op` over `n` ranks (nccl-tests' busbw factor)."""
    if n <= 1 or op == "barrier":
        return 0.0
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op in ("broadcast", "reduce"):
        return 1.0
    if op in ("gather", "scatter"):
        return (n - 1) / n
    raise ValueError(f"unknown collective {op!r}; known: {', '.join(COLLECTIVES)}")


def latency_steps(op: str, n: int) -> int:
    """How many sequential messages the algorithm needs (each pays the link latency once)."""
    if n <= 1:
        return 0
    if op == "all_reduce":
        return 2 * (n - 1)
    if op == "barrier":
        return 2 * math.ceil(math.log2(n))
    return n - 1


@dataclass(frozen=True)
class CostModel:
    """Device speed and links of the simulated cluster. Defaults follow an H100 SXM node.

    flops_per_s: dense bf16 tensor-core peak of an H100 SXM (989 TFLOP/s).
    intra_node_bandwidth: NVLink 4 per GPU and direction (450 GB/s).
    inter_node_bandwidth: one 400 Gb/s InfiniBand NIC per GPU (50 GB/s).
    latency: per message; a few microseconds for NCCL on NVLink.
    ranks_per_node: GPUs per node (8).
    memory_bandwidth: HBM3 of an H100 SXM (3.35 TB/s).
    host_flops_per_s: the host CPU for offloaded work; by default the device's / HOST_COMPUTE_SLOWDOWN.
    host_memory_bandwidth: the host's DRAM; by default the device's / HOST_MEMORY_SLOWDOWN.
    pcie_bandwidth: copies between host and device memory (PCIe 5 x16, about 50 GB/s in practice).
    ranks_per_site: GPUs per datacenter; 0 (the default) puts every rank in one datacenter.
    inter_site_bandwidth, inter_site_latency: the wide-area link between datacenters, per GPU (a group that
    spans two sites runs at this bandwidth and pays this latency per message); 100 Gb/s and 10 ms by default.
    """

    flops_per_s: float = 989e12
    intra_node_bandwidth: float = 450e9
    inter_node_bandwidth: float = 50e9
    latency: float = 5e-6
    ranks_per_node: int = 8
    memory_bandwidth: float = 3.35e12
    host_flops_per_s: Optional[float] = None
    host_memory_bandwidth: Optional[float] = None
    pcie_bandwidth: float = 50e9
    ranks_per_site: int = 0
    inter_site_bandwidth: float = 12.5e9
    inter_site_latency: float = 10e-3

    def with_(self, **changes) -> "CostModel":
        """A copy with some fields changed, e.g. `CostModel().with_(ranks_per_node=4)`."""
        return replace(self, **changes)

    @property
    def host_flops(self) -> float:
        return self.host_flops_per_s or self.flops_per_s / HOST_COMPUTE_SLOWDOWN

    @property
    def host_bandwidth(self) -> float:
        return self.host_memory_bandwidth or self.memory_bandwidth / HOST_MEMORY_SLOWDOWN

    def compute_time(self, flops: float, on_host: bool = False, nbytes: float = 0.0) -> float:
        """One op's time on the roofline: its FLOPs at peak, or the bytes it touches at memory bandwidth."""
        if on_host:
            return max(flops / self.host_flops, nbytes / self.host_bandwidth)
        return max(flops / self.flops_per_s, nbytes / self.memory_bandwidth)

    def transfer_time(self, nbytes: int) -> float:
        """A copy between host and device memory."""
        return nbytes / self.pcie_bandwidth

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def spans_sites(self, ranks: Sequence[int]) -> bool:
        """Whether a group's ranks sit in more than one datacenter (so it crosses the wide-area link)."""
        return self.ranks_per_site > 0 and len({r // self.ranks_per_site for r in ranks}) > 1

    def bandwidth(self, ranks: Sequence[int]) -> float:
        """The slowest link a group uses: NVLink inside one node, the network once it spans nodes, the wide-area
        link once it spans datacenters."""
        if self.spans_sites(ranks):
            return self.inter_site_bandwidth
        nodes = {self.node_of(r) for r in ranks}
        return self.intra_node_bandwidth if len(nodes) <= 1 else self.inter_node_bandwidth

    def latency_of(self, ranks: Sequence[int]) -> float:
        """The latency each message of a group pays: the wide-area link's once the group spans datacenters."""
        return self.inter_site_latency if self.spans_sites(ranks) else self.latency

    def p2p_time(self, nbytes: int, src: int, dst: int) -> float:
        return self.latency_of((src, dst)) + nbytes / self.bandwidth((src, dst))

    def collective_time(self, op: str, nbytes: int, ranks: Sequence[int]) -> float:
        """Time of one collective over `ranks` moving a message of `nbytes`.

        nbytes is the size of the whole buffer the collective works on: the tensor for
        all_reduce/broadcast/reduce, the gathered output for all_gather, the input for
        reduce_scatter, the per-rank input for all_to_all and gather/scatter's big buffer.
        """
        n = len(ranks)
        if n <= 1:
            return 0.0
        return (latency_steps(op, n) * self.latency_of(ranks)
                + bus_factor(op, n) * nbytes / self.bandwidth(ranks))

    def all_reduce_time(self, algorithm: str, nbytes: int, ranks: Sequence[int]) -> float:
        """All-reduce by another algorithm than the ring, for comparing them.

        parameter_server: everyone sends to one rank, which sends the sum back; its link
        carries 2(N-1) messages. tree: recursive halving and doubling, 2 log2 N steps.
        """
        n = len(ranks)
        if n <= 1:
            return 0.0
        bw = self.bandwidth(ranks)
        if algorithm == "ring":
            return self.collective_time("all_reduce", nbytes, ranks)
        if algorithm == "parameter_server":
            return 2 * (n - 1) * (self.latency + nbytes / bw)
        if algorithm == "tree":
            return 2 * math.ceil(math.log2(n)) * self.latency + 2 * (n - 1) / n * nbytes / bw
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}: ring, tree or parameter_server")


def ring_traffic(op: str, nbytes: int, n: int, position: int, root_position: int = 0) -> tuple[float, float]:
    """(bytes sent, bytes received) by the rank at `position` in a group of `n` for one collective.

    Broadcast and reduce are pipelined along the ring starting (ending) at the root; the
    gather/scatter root receives (sends) every other rank's share.
    """
    if n <= 1 or op == "barrier":
        return 0.0, 0.0
    if op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        share = bus_factor(op, n) * nbytes
        return share, share
    last = (root_position - 1) % n           # the ring's end, one step before the root
    if op == "broadcast":
        return (0.0 if position == last else float(nbytes)), (0.0 if position == root_position else float(nbytes))
    if op == "reduce":
        first = (root_position + 1) % n       # reduce runs the ring backwards into the root
        return (0.0 if position == root_position else float(nbytes)), (0.0 if position == first else float(nbytes))
    share = nbytes / n
    if op == "gather":
        return (0.0, (n - 1) * share) if position == root_position else (share, 0.0)
    if op == "scatter":
        return ((n - 1) * share, 0.0) if position == root_position else (0.0, share)
    raise ValueError(f"unknown collective {op!r}")
