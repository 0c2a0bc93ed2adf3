"""Notebook 10's runs of the learner's trainer: a longer run on simulated ranks, the same on real processes with a
loss plot that grows live, what the trained model writes, and the entry point torchrun calls."""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional

from lib.notebook.pieces import Pieces, learner_pieces
from lib.sim import per_rank, run
from puzzles import composed as C
from puzzles.course_text import as_text, byte_tokens
from puzzles.trainer import PIECES, SEAMS, seam_number
from puzzles.trainer_check import all_functions, data, not_ready, numbers, one_device


def simulated_training(pieces: Pieces, seams: dict[str, Callable], parts: C.Parts) -> Optional[dict]:
    """A longer run of the learner's trainer on simulated ranks, with one device's losses beside it."""
    if not_ready(pieces, seams, parts, strict=False):
        return None
    steps = data(parts)
    losses = one_device(parts)[0]
    result = run(C.train, parts.world, all_functions(pieces, seams), per_rank(C.shards(parts)), steps, parts)
    last = next(r for r in result.results if r["losses"] is not None)
    return {"yours": last["losses"], "one_device": losses, "params": [r["params"] for r in result.results]}


def real_training(pieces: Pieces, seams: dict[str, Callable], parts: C.Parts, *, every: int = 5,
                  timeout: float = 300, show: bool = True) -> Optional[dict]:
    """The same trainer on parts.world real processes (gloo on this machine), launched `every` steps at a time
    (each launch resumes the last) so that the loss plot grows live over one device's curve."""
    from lib.real.launch import launch

    if not_ready(pieces, seams, parts, strict=False):
        return None
    steps, fns = data(parts), all_functions(pieces, seams)
    run_ = {"yours": [], "one_device": one_device(parts)[0], "params": None}
    shards, resumes, live = C.shards(parts), None, None
    every = every if parts.zero == 0 else parts.steps        # zero1_train keeps Adam's state to itself: one launch
    for start in range(0, parts.steps, every):
        chunk = steps[start:start + every]
        results = launch(C.train_on_real_ranks, parts.world, fns, shards, chunk, parts, resumes, timeout=timeout)
        run_["yours"] += next(r for r in results if r["losses"] is not None)["losses"]
        run_["params"] = [r["params"] for r in results]
        shards = [C.with_parameters(s, r["params"]) for s, r in zip(shards, results)]
        resumes = [{"step": start + len(chunk), "moments": r["moments"]} for r in results]
        if show:
            live = _show_live(live, run_, f"{parts.world} gloo processes")
    return run_


def _show_live(handle, run_: dict, label: str):
    """The loss plot so far, drawn where the last one was (a display handle: None the first time)."""
    from IPython.display import display

    figure = loss_figure({label: run_}, f"the same trainer on real processes: step {len(run_['yours'])}")
    if handle is None:
        return display(figure, display_id=True)
    handle.update(figure)
    return handle


def loss_figure(runs: dict, title: str = ""):
    """Each run's loss per step, your trainer's as points over one device's line."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2), layout="constrained")
    for label, run_ in runs.items():
        if run_ is None:
            continue
        ax.plot(range(1, len(run_["one_device"]) + 1), run_["one_device"], color="0.6", lw=3, label="one device")
        ax.plot(range(1, len(run_["yours"]) + 1), run_["yours"], ".", ms=5, label=f"your trainer, {label}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per byte)")
    ax.set_title(title, fontsize="medium")
    ax.legend(fontsize="small")
    plt.close(fig)
    return fig


def read_sample(run_: Optional[dict], parts: C.Parts, prompt: str, length: int = 120) -> str:
    """What the model your trainer trained writes after `prompt` (its shards joined back into one model)."""
    if run_ is None:
        return "(nothing to read yet: the run above waits for your pieces)"
    model = C.assemble(run_["params"], parts)
    return prompt + as_text(C.sample(model, byte_tokens(prompt), length, seed=parts.seed))


def train_from_workspace(dist, folder: str = ".", steps: int = 30) -> Optional[list]:
    """For torchrun: the learner's pieces from their saved notebooks in `folder` (notebook 10's seams included),
    trained on a (2, 2, 2) mesh for `steps` steps; the last stage returns its losses."""
    pieces = learner_pieces({**PIECES, **{name: "10_your_trainer" for name in SEAMS}}, folder=Path(folder),
                            numbers={**numbers(), **{name: seam_number(name) for name in SEAMS}})
    parts = C.Parts(steps=steps, lr=1e-2, max_norm=1.0)
    if pieces.gaps:
        raise SystemExit("\n".join(str(g) for g in pieces.gaps))
    out = C.train(dist, pieces.functions, C.shards(parts)[dist.get_rank()], data(parts), parts)
    return None if out["losses"] is None else [round(x, 4) for x in out["losses"]]
