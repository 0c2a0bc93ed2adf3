"""The GPUs the planner knows and the clusters built from them: peak FLOP/s, memory, and the links between GPUs."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property
from typing import Iterable

from lib.planner.errors import positive
from lib.sim.cost import CostModel, bus_factor, latency_steps


@dataclass(frozen=True)
class GPU:
    """One accelerator. Link bandwidths are per GPU and per direction, as NCCL's bus bandwidth counts them."""

    name: str
    peak_flops: float        # FLOP/s of dense 16-bit tensor-core math
    memory: float            # bytes a training step may use
    hbm: float               # bytes/s between HBM and the chip
    nvlink: float            # bytes/s to a GPU of the same node
    network: float           # bytes/s to a GPU of another node, through this GPU's own NIC
    efficiency: float        # the fraction of peak_flops that training's matrix multiplications sustain


# A100 SXM 80GB: 312 TFLOP/s dense bf16 and 2,039 GB/s HBM2e (NVIDIA A100 datasheet); NVLink 3, 600 GB/s both
# ways; one 200 Gb/s HDR InfiniBand NIC per GPU, as in the DGX A100 nodes of Selene (Narayanan et al. 2021, section 5).
# H100 SXM 80GB: 989 TFLOP/s dense bf16 and 3.35 TB/s HBM3 (NVIDIA H100 datasheet); NVLink 4, 900 GB/s both ways;
# one 400 Gb/s NIC per GPU, as in Llama 3's clusters (Dubey et al. 2024, section 3.3.1).
# memory: the nominal 80 GB (the card has 80 GiB, 85.9e9 bytes; the margin stands for the CUDA context, NCCL's
# buffers and fragmentation).
# efficiency, the one fitted constant per GPU type: isolated large matmuls reach more (an 8192³ bf16 matmul ran
# near 800 TFLOP/s, 0.8 of peak, on the course's H100, NOTES.md), but inside a training step kernels are smaller,
# attention and communication kernels interfere and clocks drop under the power limit. Each value is the geometric
# mean, to two decimals, of the efficiency that the fitted rows of lib.planner.runs imply; the other rows of the
# same tables are held out of the fit:
#   A100: Narayanan et al. 2021, Table 1, rows 3.6B, 7.5B, 39.1B, 76.1B, 310.1B and 529.6B (0.58 to 0.65): 0.61.
#     The held-out rows imply 0.58 (1.7B) to 0.69 (1008B): the efficiency grows with model size, which one
#     constant cannot follow, so the largest run is the worst estimated (lib.planner.runs.comparison shows each).
#   H100: Dubey et al. 2024, Table 4, the 8,192-GPU row and the 131,072-token row (0.55 and 0.56): 0.56.
# tests/test_planner.py refits both: a change to the estimator that moves them fails until they are updated.
A100_80GB = GPU("A100 80GB", peak_flops=312e12, memory=80e9, hbm=2.039e12, nvlink=300e9, network=25e9,
                efficiency=0.61)
H100_80GB = GPU("H100 80GB", peak_flops=989e12, memory=80e9, hbm=3.35e12, nvlink=450e9, network=50e9,
                efficiency=0.56)


@dataclass(frozen=True)
class Cluster:
    """`gpus` GPUs of one kind in nodes of `gpus_per_node`: NVLink inside a node, the network between nodes."""

    gpu: GPU
    gpus: int
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        positive("gpus", self.gpus)
        positive("gpus_per_node", self.gpus_per_node)

    @cached_property
    def cost(self) -> CostModel:
        """The cluster as `lib.sim.cost` sees it: compute at the sustained rate, NVLink inside a node."""
        return CostModel(flops_per_s=self.gpu.peak_flops * self.gpu.efficiency, intra_node_bandwidth=self.gpu.nvlink,
                         inter_node_bandwidth=self.gpu.network, ranks_per_node=self.gpus_per_node)

    def ranks_per_node(self, ranks: Iterable[int]) -> int:
        """How many of a group's ranks, given in increasing order, share the first rank's node."""
        it = iter(ranks)
        first = next(it) // self.gpus_per_node
        return 1 + sum(1 for _ in itertools.takewhile(lambda r: r // self.gpus_per_node == first, it))

    def collective_time(self, op: str, nbytes: float, size: int, per_node: int) -> float:
        """Seconds of a ring collective over a group of `size` ranks, `per_node` of them in each node: the alpha-beta
        model of lib.sim.cost. Across nodes NCCL runs a ring per NIC, so the group gets `per_node` NICs' bandwidth."""
        bandwidth = self.gpu.nvlink if per_node >= size else min(self.gpu.nvlink, self.gpu.network * per_node)
        return latency_steps(op, size) * self.cost.latency + bus_factor(op, size) * nbytes / bandwidth
