"""Notebook 10's training text: the course's own prose (its notebooks' markdown and its docs), read as bytes, so
that a learner trains on real text with nothing downloaded and nothing shipped that the course did not write."""

from __future__ import annotations

import json
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def course_text(root: Path = ROOT) -> str:
    """Every markdown cell of the course's notebooks (their hosting badges aside), then its docs' markdown files, in
    name order."""
    parts = []
    for path in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        parts += ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"
                  and "hosted" not in c["metadata"].get("course", {})]          # not the Colab and Binder badges
    parts += [p.read_text(encoding="utf-8") for p in sorted((root / "docs").glob("*.md"))]
    return "\n\n".join(parts)


def byte_tokens(text: str) -> torch.Tensor:
    """The text's UTF-8 bytes as token ids 0..255: a byte-level tokenizer, vocabulary 256."""
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def as_text(tokens: torch.Tensor) -> str:
    """Token ids back to text (a byte sequence cut mid-character shows as �)."""
    return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


def batches(tokens: torch.Tensor, steps: int, rows: int, seq: int, seed: int) -> list[tuple]:
    """`steps` batches of `rows` windows of `seq` tokens at random offsets, each with its next-token targets."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        start = torch.randint(0, len(tokens) - seq - 1, (rows,), generator=gen)
        window = torch.stack([tokens[s:s + seq + 1] for s in start.tolist()])
        out.append((window[:, :-1].clone(), window[:, 1:].clone()))
    return out
