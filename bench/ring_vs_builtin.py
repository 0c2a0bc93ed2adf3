"""The reference ring all-reduce against dist.all_reduce on real gloo ranks, 1 KB to 16 MB.

    python -m bench.ring_vs_builtin [world_size]
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from lib import launch
from solutions.data_parallel import ring_all_reduce

SIZES = [2**k for k in range(10, 25, 2)]          # 1 KiB .. 16 MiB


def _time(dist, fn, nbytes: int, repeat: int) -> float:
    x = torch.ones(nbytes // 4)
    fn(dist, x.clone())                           # warm-up: connections, buffers
    times = []
    for _ in range(repeat):
        y = x.clone()
        dist.barrier()
        start = time.perf_counter()
        fn(dist, y)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _builtin(dist, x):
    dist.all_reduce(x)
    return x


def measure(dist):
    return {n: (_time(dist, ring_all_reduce, n, 5), _time(dist, _builtin, n, 5)) for n in SIZES}


def main() -> None:
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    per_rank = launch(measure, world, timeout=600)
    factor = 2 * (world - 1) / world
    print(f"gloo, {world} ranks on this machine; time = slowest rank's median of 5; busbw = size / time × 2(N-1)/N")
    print("| size | ring (ours) | busbw | dist.all_reduce | busbw | ours / builtin |\n|---|---|---|---|---|---|")
    for n in SIZES:
        ours = max(r[n][0] for r in per_rank)
        theirs = max(r[n][1] for r in per_rank)
        print(f"| {n / 1024:.0f} KiB | {ours * 1e3:.2f} ms | {n / ours * factor / 1e6:.0f} MB/s "
              f"| {theirs * 1e3:.2f} ms | {n / theirs * factor / 1e6:.0f} MB/s | {ours / theirs:.2f}× |")


if __name__ == "__main__":
    main()
