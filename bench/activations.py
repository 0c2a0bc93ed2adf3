"""Notebook 01's activation memory, measured: the bytes a transformer block's forward keeps for backward, against
Korthikanti et al.'s formula (2022, Table 2) and its modern cases, on the CPU or on a GPU.

    python -m bench.activations                    # on the GPU when there is one, else the CPU (small shapes)
    python -m bench.activations --device cuda --out bench/results/activations-h200.md

Each row builds `lib.models.Block` in bf16 with and without dropout, with and without flash attention
(F.scaled_dot_product_attention), runs a forward and counts what autograd saved (`lib.checker.measure.forward_memory`);
on a GPU it also reads the caching allocator (memory_allocated), which rounds each block up.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Iterable, NamedTuple

import torch

from lib.analytic.formulas import activation_bytes_per_layer
from lib.checker.measure import forward_memory
from lib.models import Block, GPTConfig

# (s, b, h, a): the shapes issue 19 measured on an H100, and one where a·s/h is large (attention dominates)
GPU_SHAPES = [(512, 4, 1024, 16), (1024, 2, 2048, 16), (2048, 1, 1024, 8), (1024, 4, 1024, 16)]
CPU_SHAPES = [(64, 2, 64, 4), (128, 1, 64, 8)]
VARIANTS = [(0.1, False), (0.0, False), (0.1, True), (0.0, True)]          # (dropout, flash)


class Measured(NamedTuple):
    shape: tuple[int, int, int, int]
    dropout: float
    flash: bool
    saved: int          # bytes autograd saved
    live: int           # bytes still allocated after the forward (the allocator's view on a GPU)
    formula: float      # lib.analytic.formulas.activation_bytes_per_layer


def measure(shape: tuple[int, int, int, int], dropout: float, flash: bool, where: str) -> Measured:
    s, b, h, a = shape
    torch.manual_seed(0)
    block = Block(GPTConfig(seq=s, hidden=h, heads=a, dropout=dropout, flash=flash)).to(where, torch.bfloat16)
    x = torch.randn(b, s, h, dtype=torch.bfloat16, device=where, requires_grad=True)
    saved, live = forward_memory(lambda: block(x), exclude=list(block.parameters()), where=where)
    formula = activation_bytes_per_layer(s, b, h, a, dropout=dropout > 0, flash=flash)
    return Measured(shape, dropout, flash, saved, live, formula)


def table(rows: Iterable[Measured], where: str, on_cpu: bool) -> str:
    lines = [f"Activation memory of one `lib.models.Block` forward (bf16) on {where}, against "
             "`lib.analytic.formulas.activation_bytes_per_layer`.", "",
             "| s | b | h | a | dropout | flash | saved (autograd) | formula | saved / formula | "
             "allocated after | allocated / formula |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in rows:
        s, b, h, a = m.shape
        lines.append(f"| {s} | {b} | {h} | {a} | {m.dropout:g} | {'yes' if m.flash else 'no'} | {m.saved:,} | "
                     f"{m.formula:,.0f} | {m.saved / m.formula:.4f} | {m.live:,} | {m.live / m.formula:.3f} |")
    if on_cpu:
        lines += ["", "On the CPU, attention by F.scaled_dot_product_attention with dropout falls back to the s×s math "
                      "kernel, whose saved scores and mask the flash rows with dropout carry; a GPU's FlashAttention "
                      "keeps only a random seed."]
    return "\n".join(lines)


def describe(where: str) -> str:
    if where.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(where))
        return f"{name}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    return f"the CPU, torch {torch.__version__}"


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(prog="python -m bench.activations", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, help="also write the table here (Markdown)")
    args = ap.parse_args(argv)
    shapes = GPU_SHAPES if args.device.startswith("cuda") else CPU_SHAPES
    rows = (measure(shape, d, f, args.device) for shape in shapes for d, f in VARIANTS)
    text = table(rows, describe(args.device), on_cpu=not args.device.startswith("cuda"))
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return text


if __name__ == "__main__":
    main()
