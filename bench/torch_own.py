"""Notebook 10's trainer against PyTorch's own: lib.models' TinyGPT, the same initialisation, byte-level course text,
clipping and Adam, trained on one device, then on each axis of a (dp, pp, tp) mesh alone and on all three, by the
course's composed trainer (the reference pieces) and by torch's FSDP2 (`fully_shard`), DTensor tensor parallelism
(`parallelize_module`) and `torch.distributed.pipelining` (Schedule1F1B), all on gloo ranks: each loss curve against
one device's, each one's time per step, and the collectives a step of torch's issues.

    python -m bench.torch_own [--steps N] [--dp D --pp P --tp T] [--repeats K] [--out bench/results/torch-own-NAME.md]
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import platform
import re
import subprocess
import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.distributed.fsdp  # noqa: F401  (imported before forking ranks, so that no rank pays for it)
import torch.distributed.tensor.parallel  # noqa: F401
import torch.nn.functional as F
from torch import nn
from torch.distributed import pipelining

from bench.timing import Steps, Timing, one_call
from bench.trainer import reference_pieces
from lib.errors import PuzzleError
from lib.models import Block, GPTConfig, TinyGPT
from lib.real.backends import device_mesh
from lib.real.launch import launch
from puzzles import composed as C
from puzzles import trainer_check as T
from puzzles.parallel_gpt import tiny_gpt

ROOT = Path(__file__).resolve().parents[1]
NOTES = "## Notes"         # a results file's hand-written part, from this heading on: kept when it is measured again
TOLERANCE = 1e-9        # the largest difference from one device's loss a run may have, at any step (float64 both)
TIMEOUT = 600.0         # seconds for one launch, past which its ranks are stopped


@dataclass(frozen=True)
class Trained:
    """One way of training the model: its loss before each step, its time per step, or why it could not run."""

    name: str
    world: str
    losses: Optional[list[float]] = None
    runs: tuple = ()                # per launch, each rank's step times (seconds) after its first step
    error: Optional[str] = None

    @property
    def timing(self) -> Optional[Timing]:
        """The slowest rank's time per step over every launch (None when it did not run)."""
        return Timing.slowest_rank(self.runs) if self.runs else None

    def then(self, later: "Trained") -> "Trained":
        """This run's launches and a later one's of the same training, pooled (an error in either wins)."""
        if self.error or later.error:
            return self if self.error else later
        return replace(self, runs=self.runs + later.runs)

    def gap(self, reference: list[float]) -> Optional[float]:
        """The largest difference from `reference`'s loss over the steps (None when it did not run)."""
        return None if self.losses is None else max(abs(a - b) for a, b in zip(self.losses, reference))


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """TinyGPT.head_loss's loss from the logits: mean cross-entropy over every position (float64 logits as they are)."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


# ---- one device ----------------------------------------------------------------------------------------------------
class _IndexedSteps(Steps):
    """Steps that C.reference_run may also index (it reads the sequence length from the first batch)."""

    def __getitem__(self, i: int):
        return self.items[i]


def one_device(parts: C.Parts, data: list, repeats: int = 1) -> Trained:
    """The course's single-device reference run, what the composed check compares with; on one thread, as each
    launched rank runs."""
    threads, runs = torch.get_num_threads(), []
    torch.set_num_threads(1)
    try:
        for _ in range(repeats):
            steps = _IndexedSteps(data)
            losses = C.reference_run(parts, steps)[0]
            runs.append([steps.durations()[1:]])
    finally:
        torch.set_num_threads(threads)
    return Trained("one device (the composed check's reference)", "1 process", losses, tuple(runs))


# ---- the course's composed trainer, the reference pieces ---------------------------------------------------------
def _composed_rank(dist, fns: dict, shards: list, data: list, parts: C.Parts) -> dict:
    steps = Steps(data)                 # C.train runs every step in one call: its collectives mark where each ends
    out = one_call(dist, steps, lambda d: C.train_on_real_ranks(d, fns, shards, data, parts))
    return {"losses": out["losses"], "times": steps.durations()}


def composed(parts: C.Parts, data: list) -> Trained:
    """notebook 10's trainer with the answer keys' pieces, as CI's solved notebook runs it, on gloo processes."""
    pieces, seams = reference_pieces()
    return _launched("the course's composed trainer (reference pieces)",
                     _mesh_name(parts), _composed_rank, parts.world,
                     T.all_functions(pieces, seams), C.shards(parts), data, parts)


# ---- torch's own ---------------------------------------------------------------------------------------------------
def _clip(params: list[nn.Parameter], parts: C.Parts, norm: Callable[[], torch.Tensor]) -> None:
    """torch.nn.utils' clipping to parts.max_norm, given the whole model's gradient norm (computed only if it clips)."""
    if parts.clips:
        torch.nn.utils.clip_grads_with_norm_(params, parts.max_norm, norm(), foreach=False)


def _adam(params, parts: C.Parts) -> torch.optim.Optimizer:
    """torch's Adam, one tensor at a time: the course's adam_update is its single-tensor arithmetic written out."""
    return torch.optim.Adam(params, lr=parts.lr, foreach=False)


class SplitQKVBlock(Block):
    """lib.models.Block with its fused qkv as three Linears (torchtitan's wq, wk, wv) and its head count read from
    the shard it holds: ColwiseParallel cuts a Linear's output features into contiguous pieces, so a fused qkv would
    give TP rank 0 all of q and none of v."""

    def __init__(self, cfg: GPTConfig, block: Block) -> None:
        if cfg.kv_heads not in (0, cfg.heads):
            raise ValueError(f"SplitQKVBlock splits q, k and v evenly: kv_heads must be heads, got {cfg.kv_heads}")
        super().__init__(cfg)
        del self.qkv
        h, dtype = cfg.hidden, block.qkv.weight.dtype
        self.q, self.k, self.v = (nn.Linear(h, h, dtype=dtype) for _ in range(3))
        self.head_dim = h // cfg.heads
        state = block.state_dict()
        for name, w, b in zip("qkv", state.pop("qkv.weight").chunk(3), state.pop("qkv.bias").chunk(3)):
            state[f"{name}.weight"], state[f"{name}.bias"] = w, b
        self.to(dtype).load_state_dict(state)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (f(x).reshape(b, s, -1, self.head_dim).transpose(1, 2)    # (b, a/tp, s, d) each
                   for f in (self.q, self.k, self.v))
        out = self.core(q, k, v).transpose(1, 2).reshape(b, s, -1)            # (b, a/tp, s, d) -> (b, s, h/tp)
        return self.proj_drop(self.proj(out))


def block_plan() -> dict:
    """How parallelize_module splits each block: Megatron's column-then-row pairs, attention's by heads."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "proj": RowwiseParallel(),
            "fc1": ColwiseParallel(), "fc2": RowwiseParallel()}


def split_qkv(model: TinyGPT) -> TinyGPT:
    """`model` with every block a SplitQKVBlock holding the same weights."""
    model.blocks = nn.ModuleList(SplitQKVBlock(model.cfg, b) for b in model.blocks)
    return model


class Stage(nn.Module):
    """Stage `index` of `stages` of a TinyGPT: the embeddings on the first, its share of the blocks, the final
    LayerNorm and head on the last (returning the logits)."""

    def __init__(self, model: TinyGPT, index: int, stages: int) -> None:
        super().__init__()
        per = len(model.blocks) // stages
        self.first, self.last = index == 0, index == stages - 1
        self.embeddings = nn.ModuleDict({"tok": model.tok, "pos": model.pos} if self.first else {})
        self.blocks = nn.ModuleList(model.blocks[index * per:(index + 1) * per])
        if self.last:
            self.ln_f, self.head = model.ln_f, model.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.embeddings["tok"](x) + self.embeddings["pos"].weight[: x.shape[1]]   # (b, s) -> (b, s, h)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x)) if self.last else x                                    # (b, s, vocab)


def parallelize(model: TinyGPT, mesh, parts: C.Parts) -> Stage:
    """This rank's part of `model` on a (dp, pp, tp) DeviceMesh, as torchtitan composes torch's own: its pipeline
    stage, each block's layers parallelize_module'd by block_plan over "tp", then each block and the stage
    fully_shard'ed over "dp" (an axis of size 1 is left out): resharded after forward as torch does by default (every
    unit but the root), none of them under a pipeline (torchtitan's default there: else each micro-batch gathers the
    parameters again)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    stage = Stage(split_qkv(model) if parts.tp > 1 else model, mesh["pp"].get_local_rank(), parts.pp)
    if parts.tp > 1:
        for block in stage.blocks:
            parallelize_module(block, mesh["tp"], block_plan())
    if parts.dp > 1:
        reshard = None if parts.pp == 1 else False
        for block in stage.blocks:
            fully_shard(block, mesh=mesh["dp"], reshard_after_forward=reshard)
        fully_shard(stage, mesh=mesh["dp"], reshard_after_forward=reshard)
    return stage


def _torch_rank(dist, data: list, parts: C.Parts, count_step: Optional[int] = None) -> dict:
    """One rank of torch's own trainer: its DP rank's rows of each batch, through Schedule1F1B over
    parts.micro_batches micro-batches where pp > 1 (gradients divided by their number, as the losses are means);
    torch's clipping and Adam. With `count_step`, the collectives that step issues, counted by CommDebugMode."""
    # DTensor says once per rank that a norm over the 2-D (dp, tp) mesh is made whole by two all-reduces, one per
    # dimension; they are in the measured time, and the results say so. FSDP2 warns that the batch needs no grad
    # (its full backward hook) and that the root returns a view (the logits; nothing here changes them in place).
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    mesh = device_mesh(dist, (parts.dp, parts.pp, parts.tp), C.AXES)
    d = mesh["dp"].get_local_rank()
    stage = parallelize(tiny_gpt(C.config(), parts.seed), mesh, parts)
    schedule = None if parts.pp == 1 else pipelining.Schedule1F1B(
        pipelining.PipelineStage(stage, mesh["pp"].get_local_rank(), parts.pp, torch.device("cpu"),
                                 group=mesh["pp"].get_group()),
        n_microbatches=parts.micro_batches, loss_fn=cross_entropy)
    params = list(stage.parameters())
    optimizer, losses, steps, counted = _adam(params, parts), [], Steps(data), {}
    for i, (tokens, targets) in enumerate(steps):
        with _counting(counted) if i == count_step else contextlib.nullcontext():
            tokens, targets = tokens.chunk(parts.dp)[d], targets.chunk(parts.dp)[d]
            losses.append(_forward_backward(stage, schedule, tokens, targets))
            _clip(params, parts, lambda: _whole_norm(dist, mesh, [p.grad for p in params]))
            optimizer.step()
            optimizer.zero_grad()
    return {"losses": losses, "times": steps.durations(), "collectives": counted}


@contextlib.contextmanager
def _counting(into: dict):
    """CommDebugMode around the block; its count of each collective put `into` the dict, by the op's short name."""
    from torch.distributed.tensor.debug import CommDebugMode

    with CommDebugMode() as comm:
        yield
    into.update({str(op).rsplit(".", 1)[-1].strip("_"): n for op, n in comm.get_comm_counts().items()})


def _forward_backward(stage: Stage, schedule, tokens: torch.Tensor, targets: torch.Tensor) -> Optional[float]:
    """One step's forward and backward; the loss on the last stage (the mean over its micro-batches), else None."""
    if schedule is None:
        loss = cross_entropy(stage(tokens), targets)
        loss.backward()
        return loss.item()
    mine: list = []
    if stage.first:
        schedule.step(tokens)
    elif stage.last:
        schedule.step(target=targets, losses=mine)
    else:
        schedule.step()
    return float(torch.stack(mine).detach().mean()) if mine else None


def _whole_norm(dist, mesh, grads: list[torch.Tensor]) -> torch.Tensor:
    """The whole model's gradient norm from this rank's gradients: torch's total norm of the gradients on each mesh
    apart (clip_grad_norm_ refuses a mix of meshes, or of DTensors and plain tensors), each made whole over its mesh,
    then summed over the pipeline's stages by one all-reduce (as torchtitan's clip_grad_norm_ does)."""
    from torch.distributed.tensor import DTensor

    by_mesh: dict = {}
    for g in grads:
        by_mesh.setdefault(g.device_mesh if isinstance(g, DTensor) else None, []).append(g)
    norms = [torch.nn.utils.get_total_norm(kind) for kind in by_mesh.values()]
    squares = torch.stack([n.full_tensor() if isinstance(n, DTensor) else n for n in norms]).pow(2).sum()
    if mesh["pp"].size() > 1:
        dist.all_reduce(squares, group=mesh["pp"].get_group())
    return squares.sqrt()


# ---- running them --------------------------------------------------------------------------------------------------
def _launched(name: str, world: str, rank_fn: Callable, size: int, *args) -> Trained:
    """`rank_fn` on `size` gloo processes, launched once: the steps' losses (the mean over the ranks that report one)
    and each rank's step times after its first step (which pays for set-up: groups, shapes sent between stages,
    FSDP's plan)."""
    try:
        results = launch(rank_fn, size, *args, backend="gloo", timeout=TIMEOUT)
    except PuzzleError as e:
        return Trained(name, world, error=_what_raised(str(e)))
    reported = [r["losses"] for r in results if r["losses"] is not None and r["losses"][0] is not None]
    losses = [sum(step) / len(step) for step in zip(*reported)]
    return Trained(name, world, losses, ([r["times"][1:] for r in results],))


def _what_raised(message: str) -> str:
    """A failed launch's exceptions, each on its line ("IndexError: ..."), innermost last; else its first line."""
    raised = re.findall(r"^\s*(\w+(?:Error|Exception): \S.*)$", message, re.MULTILINE)
    return "; ".join(dict.fromkeys(raised)) if raised else message.strip().partition("\n")[0]


def on_mesh(base: C.Parts, dp: int, pp: int, tp: int) -> C.Parts:
    """`base`'s run on a (dp, pp, tp) mesh, with the same batch: each DP rank's rows in base's micro-batches where
    pp > 1, at once where there is no pipeline."""
    rows = base.rows // dp
    if pp == 1:
        return replace(base, dp=dp, pp=pp, tp=tp, micro_batches=1, micro_batch=rows)
    return replace(base, dp=dp, pp=pp, tp=tp, micro_batches=rows // base.micro_batch)


def meshes(base: C.Parts, *, whole: bool = True) -> list[C.Parts]:
    """Each axis of `base`'s mesh alone, then (if `whole`) all three together."""
    alone = [on_mesh(base, base.dp, 1, 1), on_mesh(base, 1, base.pp, 1), on_mesh(base, 1, 1, base.tp)]
    return alone + ([on_mesh(base, base.dp, base.pp, base.tp)] if whole else [])


def _mesh_name(parts: C.Parts) -> str:
    return f"(dp, pp, tp) = ({parts.dp}, {parts.pp}, {parts.tp}), {parts.micro_batches} micro-batch(es)"


def torch_own(parts: C.Parts, data: list) -> Trained:
    """torch's own trainer on parts' mesh."""
    used = [name for size, name in ((parts.dp, "FSDP2 fully_shard"), (parts.tp, "DTensor parallelize_module"),
                                    (parts.pp, "pipelining Schedule1F1B")) if size > 1]
    return _launched(" + ".join(used) or "torch, one rank", _mesh_name(parts), _torch_rank, parts.world,
                     data, parts)


def collectives(parts: C.Parts, data: list) -> str:
    """The collectives rank 0 of torch's own trainer issues in its second step (the first sets up), by name; a
    launch of its own, so that counting slows no timed step."""
    try:
        counted = launch(_torch_rank, parts.world, data[:2], parts, 1, backend="gloo", timeout=TIMEOUT)[0]
    except PuzzleError as e:
        return f"not counted: `{_what_raised(str(e))}`"
    return ", ".join(f"{n} {op}" for op, n in sorted(counted["collectives"].items())) or "none"


@dataclass(frozen=True)
class Pair:
    """The course's trainer and torch's own on one mesh, and the collectives a step of torch's issues."""

    parts: C.Parts
    course: Optional[Trained]
    torch: Trained
    torch_collectives: str


def compare(base: C.Parts, *, whole: bool = True, with_course: bool = True,
            repeats: int = 1) -> tuple[Trained, list[Pair]]:
    """One device, then on each of `meshes(base)` the course's trainer (if asked) and torch's own, launched in turn
    `repeats` times (so that both sides meet the same changes of load), all on one copy of the data: the course's
    text is its notebooks and docs as they are on disk, so an edit to them during a run would otherwise hand later
    runs other batches."""
    data, runs = T.data(base), {}
    sides = {"torch": torch_own, **({"course": composed} if with_course else {})}
    for _ in range(repeats):
        for parts in meshes(base, whole=whole):
            for side, train in sides.items():
                run = train(parts, data)
                runs[parts, side] = runs[parts, side].then(run) if (parts, side) in runs else run
    pairs = [Pair(parts, runs.get((parts, "course")), runs[parts, "torch"], collectives(parts, data))
             for parts in meshes(base, whole=whole)]
    return one_device(base, data, repeats), pairs


# ---- the report ----------------------------------------------------------------------------------------------------
def _cell(run: Optional[Trained], reference: list[float]) -> str:
    """A run's time per step and its largest loss difference, or why it did not run."""
    if run is None:
        return "not run | -"
    if run.error:
        return f"did not run: `{run.error}` | -"
    t, gap = run.timing, run.gap(reference)
    verdict = "" if gap <= TOLERANCE else " **over the tolerance**"
    return f"{t.median * 1e3:.1f} ({t.min * 1e3:.1f}-{t.max * 1e3:.1f}) | {gap:.1e}{verdict}"


def _ratio(pair: Pair) -> str:
    if pair.course is None or pair.course.timing is None or pair.torch.timing is None:
        return "-"
    return f"{pair.course.timing.median / pair.torch.timing.median:.2f}×"


def _commit() -> str:
    """This checkout's commit, short, with "+" if tracked files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    changed = git("status", "--porcelain", "--untracked-files=no")
    return (git("rev-parse", "--short", "HEAD") or "unknown") + ("+" if changed else "")


def report(single: Trained, pairs: list[Pair], base: C.Parts, *, seconds: float, load: tuple[float, float],
           repeats: int, commit: str) -> str:
    """The results as markdown: per mesh, each trainer's time per step and its distance from one device; then the
    losses step by step."""
    ref, cfg = single.losses, C.config()
    lines = [f"# Notebook 10's trainer against PyTorch's own, on {platform.machine()}, "
             f"{platform.node() or 'this machine'}", "",
             f"`python -m bench.torch_own --steps {base.steps} --dp {base.dp} --pp {base.pp} --tp {base.tp} "
             f"--repeats {repeats}`: torch "
             f"{torch.__version__}, gloo, float64; lib.models' TinyGPT ({cfg.layers} blocks, hidden {cfg.hidden}, "
             f"{cfg.heads} heads, {cfg.vocab} byte tokens), puzzles.parallel_gpt's initialisation, seed {base.seed}; "
             f"{base.steps} steps of {base.rows} windows of {cfg.seq} bytes of the course's own text (its notebooks' "
             f"and docs' markdown at commit {commit}: the losses move when they change); gradients "
             f"clipped to norm {base.max_norm}, Adam lr {base.lr}. A step's time is the slowest rank's in ms, median "
             f"(min-max) over steps 2-{base.steps} of {repeats} launches; a loss difference is the largest over the "
             f"steps, against one device's loss ({single.timing.median * 1e3:.1f} ms a step); a run agrees when it is "
             f"at most {TOLERANCE:g}. Measured in {seconds:.0f} s of wall time, load average {load[0]:.1f} before and "
             f"{load[1]:.1f} after on {os.cpu_count()} cores.", "",
             "| mesh | the course's trainer (reference pieces): ms / step | its loss difference | torch's own | "
             "torch's: ms / step | its loss difference | course / torch |", "|---|---|---|---|---|---|---|"]
    for pair in pairs:
        lines.append(f"| {_mesh_name(pair.parts)} | {_cell(pair.course, ref)} | {pair.torch.name} | "
                     f"{_cell(pair.torch, ref)} | {_ratio(pair)} |")
    lines += ["", "The collectives a step of torch's own issues, rank 0's, counted by CommDebugMode in a launch of "
              "their own (its second step; point-to-point sends are not among what CommDebugMode counts):", "",
              "| mesh | torch's collectives in a step |", "|---|---|"]
    lines += [f"| {_mesh_name(p.parts)} | {p.torch_collectives} |" for p in pairs]
    columns = [("one device", single)] + [(f"{side} ({p.parts.dp}, {p.parts.pp}, {p.parts.tp})", run)
                                          for p in pairs for side, run in (("course", p.course), ("torch", p.torch))
                                          if run is not None and run.losses]
    heads, runs = zip(*columns)
    lines += ["", "Loss before each step (nats per byte), to 12 decimals:", "",
              "| step | " + " | ".join(heads) + " |", "|---" * (len(runs) + 1) + "|"]
    lines += [f"| {i + 1} | " + " | ".join(f"{r.losses[i]:.12f}" for r in runs) + " |" for i in range(base.steps)]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.torch_own", description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help=f"the results file to write (its part from '{NOTES}' on is kept)")
    args = ap.parse_args()
    base = replace(C.Parts(), dp=args.dp, pp=args.pp, tp=args.tp, steps=args.steps, lr=1e-2, max_norm=1.0)
    start, load, commit = time.perf_counter(), os.getloadavg()[0], _commit()
    single, pairs = compare(base, repeats=args.repeats)
    text = report(single, pairs, base, seconds=time.perf_counter() - start, load=(load, os.getloadavg()[0]),
                  repeats=args.repeats, commit=commit)
    print(text)
    if args.out:
        out = Path(args.out)
        kept = out.read_text().partition(NOTES)[1:] if out.exists() else ()
        out.write_text(text + "\n\n" + "".join(kept) if any(kept) else text + "\n")


if __name__ == "__main__":
    main()
