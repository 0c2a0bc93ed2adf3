"""Run a course function under torchrun, on a multi-GPU box or across nodes.

One node, one rank per GPU (`--standalone` picks the rendezvous; `--master-port=0` hangs):

    torchrun --standalone --nproc-per-node 8 -m lib.real.torchrun MODULE:FUNCTION [ARG ...]

Several nodes (run the same command on each; HOST:PORT is reachable from all of them):

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-id myrun --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m lib.real.torchrun MODULE:FUNCTION [ARG ...]

To run a puzzle's real check on a function (the same comparison as the notebook's real cell,
against the single-device reference and PyTorch's own implementation), name the puzzle first:

    torchrun --standalone --nproc-per-node 4 -m lib.real.torchrun --check puzzles.data_parallel:ring_all_reduce \
        solutions.data_parallel:ring_all_reduce

Each rank prints `[rank r] ✓ ...` or what differs, and exits non-zero on a difference.

`MODULE:FUNCTION` names a function `fn(dist, *args)`, e.g. a module of `solutions/` and one of its functions;
the words after it are its arguments, each read as JSON when it parses (`4`, `[1, 2]`, `true`) and as a
plain string otherwise; with none, it is called as `fn(dist)`. Every rank prints
`[rank r] <result>`. NCCL and the GPU numbered LOCAL_RANK when CUDA is available, gloo otherwise.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from lib.real.backends import nccl_shortfall, visible_gpus
from lib.real.compat import supply_newer_names


def load(target: str) -> Callable[..., Any]:
    """The function named by "package.module:function"."""
    module_name, _, name = target.partition(":")
    if not module_name or not name:
        raise SystemExit(f"expected MODULE:FUNCTION (a module path, a colon, a function name), got {target!r}")
    return getattr(importlib.import_module(module_name), name)


def parse_arg(text: str) -> Any:
    """A JSON literal as its Python value; anything else stays a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def summary(value: Any, limit: int = 300) -> str:
    """A one-line description of a rank's result, short enough to read eight of them."""
    if isinstance(value, torch.Tensor) and value.numel() > 8:
        return f"tensor of shape {list(value.shape)}, dtype {value.dtype}, sum {value.double().sum().item():.6g}"
    text = " ".join(repr(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@record  # torchrun's summary then shows the failing rank's traceback
def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    puzzle = None
    if argv[0] == "--check":
        if len(argv) < 3:
            raise SystemExit("usage: -m lib.real.torchrun --check PUZZLE_MODULE:PUZZLE FUNCTION_MODULE:FUNCTION")
        puzzle, argv = load(argv[1]), argv[2:]
    fn, args = load(argv[0]), [parse_arg(a) for a in argv[1:]]
    supply_newer_names()  # torch.distributed names an older torch lacks, from their older equivalents
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    gpus = visible_gpus()
    if gpus:
        ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        shortfall = nccl_shortfall(ranks, gpus)
        if shortfall:
            raise SystemExit(f"torchrun started {ranks} ranks on this node, but {shortfall}: give torchrun "
                             f"--nproc-per-node {gpus} or less, or hide the GPUs (CUDA_VISIBLE_DEVICES= torchrun ...) "
                             "to run every rank on gloo.")
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group("gloo")
    try:
        if puzzle is not None:
            problem = puzzle.check_in_group(fn, dist)
            print(f"[rank {dist.get_rank()}] " + (f"✗ {problem}" if problem else
                  f"✓ {puzzle.name} matches the reference on {dist.get_world_size()} ranks ({dist.get_backend()})"),
                  flush=True)
            if problem:
                raise SystemExit(1)
        else:
            result = fn(dist, *args)
            print(f"[rank {dist.get_rank()}] {summary(result)}", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
