"""Notebook 01, where the memory goes: the puzzles, their inputs, references and budgets.

Predictions are checked against measurements of the real thing (the module's parameters,
the bytes a training step keeps, the tensors autograd saves). Memory budgets are built from
measured pieces of the algorithm (one layer's activations, a layer boundary, the states),
never from a run of the answer.
"""

from __future__ import annotations

import copy
import functools
import math
import numbers
import random
from typing import Callable, Optional

import torch

from lib.checker.puzzle import Budget, Case, Floor, Puzzle, nothing_on_the_host
from lib.errors import PuzzleError
from lib.notebook.warm_up import import_ahead
from lib.analytic.formulas import model_state_bytes
from lib.checker.measure import allocated, counted_flops, saved_activation_bytes
from lib.models import Block, GPTConfig, TinyGPT
from lib.guard.offlimits import MODULE_INIT
from lib.checker import terms
from lib.checker.terms import Expr, Q, amount, formula, term
from lib.units import fmt_bytes
from puzzles import _adam_variants
from puzzles._offload import host_step_floor
from puzzles._sample_weights import fit, module_grads, said, vjp

import_ahead("optimizer")          # offloaded_adam_train's reference builds torch.optim.Adam

NOTEBOOK = "01_memory"
ONE_DEVICE = (1, 1, 1)          # three random cases, each on one device


def _config(rng: random.Random, tied: Optional[bool] = None, bias: Optional[bool] = None,
            gqa: Optional[bool] = None, least_kv: int = 1) -> GPTConfig:
    """A random GPT shape; tied embeddings, biases and grouped-query attention pinned where given, with at least
    `least_kv` key/value heads where it is grouped."""
    gqa = rng.random() < 0.5 if gqa is None else gqa
    heads = rng.choice([a for a in (2, 4, 8) if a > least_kv] if gqa else [1, 2, 4])
    kv_heads = rng.choice([k for k in (1, 2, 4) if least_kv <= k < heads and heads % k == 0]) if gqa else 0
    # K's width with the head size h/a forgotten (kv_heads·h) equals the sequence put for kv_heads (s·h/a) where
    # s = kv_heads·a: a grouped case avoids that coincidence, so that the count tells the two apart.
    seq = rng.choice([s for s in (8, 16, 32) if s != kv_heads * heads])
    return GPTConfig(vocab=rng.randint(16, 100), seq=seq, hidden=heads * rng.choice([4, 8, 16]),
                     heads=heads, layers=rng.randint(1, 4), kv_heads=kv_heads,
                     tied=rng.random() < 0.5 if tied is None else tied,
                     bias=rng.random() < 0.5 if bias is None else bias)


def _describe(cfg: GPTConfig) -> str:
    kv = f" ({cfg.kv_heads} key/value heads)" if cfg.kv_heads else ""
    return (f"vocab {cfg.vocab}, seq {cfg.seq}, hidden {cfg.hidden}, {cfg.heads} heads{kv}, {cfg.layers} layers, "
            f"{'tied' if cfg.tied else 'untied'} embeddings, {'with' if cfg.bias else 'no'} biases")


# A prediction comes from the configuration: the library that builds, measures or models the model is off limits
# while the learner's function runs (lib.guard.offlimits).
DERIVE = {"building a module": MODULE_INIT, "lib.analytic.formulas": "lib.analytic.formulas",
          "lib.checker.measure": "lib.checker.measure", "lib.planner": "lib.planner",
          "lib.viz.memory": "lib.viz.memory",
          # a prediction measured on a block written in torch ops: autograd's saved tensors counted by a hook
          "saved-tensor hooks (measuring what autograd keeps)": "torch.autograd.graph",
          # a prediction measured as the memory a run of the block allocates: the profilers' profile classes, not
          # their modules, which also hold record_function (torch.optim's step enters it on every call, and in torch
          # 2.13 it calls into torch.profiler)
          "torch's profiler (measuring what a run allocates)": torch.profiler.profile.__init__,
          "torch's autograd profiler (measuring what a run allocates)": torch.autograd.profiler.profile.__init__}
DERIVE_ADVICE = "derive it from the configuration (and from lib/models.py, read, not run)"
PREDICTION = dict(world_sizes=ONE_DEVICE, takes_dist=False, off_limits=DERIVE, off_limits_advice=DERIVE_ADVICE,
                  real_cell=False)

# Each seed asks the three kinds of model of the statement: GPT-2's (tied, biases), LLaMA's (untied, no biases),
# and grouped-query attention, which lib.analytic.formulas does not model. The grouped kind has several key/value heads
# (one is multi-query attention, which LLaMA's kind may draw): with one, the heads a and the key/value heads g
# give a count that forgets a or puts it where g belongs the same number, and no case would tell them apart.
MODEL_KINDS = [{"tied": True, "bias": True, "gqa": False}, {"tied": False, "bias": False},
               {"gqa": True, "least_kv": 2}]


# ---- 1. counting parameters --------------------------------------------------------------
def parameter_count(cfg: GPTConfig) -> Expr:
    """TinyGPT's parameter count as named terms (lib.checker.terms), so that a count missing a piece is told which."""
    h, V, S = Q("h", cfg.hidden, "the hidden size"), Q("V", cfg.vocab, "the vocabulary"), Q("s", cfg.seq,
                                                                                              "the sequence")
    L, a = Q("L", cfg.layers, "the layers"), Q("a", cfg.heads, "the attention heads")
    g = Q("kv_heads", cfg.kv_heads or cfg.heads, "the key/value heads")            # named as the notebook names it
    kv = g * (h // a)                                            # the width of K, and of V
    norm = 2 * h if cfg.bias else h                              # a LayerNorm: a weight (and a bias) of h
    block = (term("qkv's weight (h × (h + 2·kv))", h * (h + 2 * kv)) + term("the attention projection (h × h)", h * h)
             + term("fc1 (h × 4h)", h * 4 * h) + term("fc2 (4h × h)", 4 * h * h))
    if cfg.bias:
        block = block + term("a block's Linear biases (h + 2·kv + h + 4h + h)", h + 2 * kv + h + 4 * h + h)
    # The LayerNorms as one term too: every one of them counted with a bias it does not have is that term twice.
    norms = term("the LayerNorms ((2L + 1) × 2h: a weight and a bias each)" if cfg.bias else
                 "the LayerNorms ((2L + 1) × h: a weight each, no bias in this model)",
                 L * term("a block's two LayerNorms", 2 * norm) + term("the final LayerNorm", norm))
    total = (term("the token embedding (V × h)", V * h) + term("the position embedding (s × h)", S * h)
             + L * term("a block", block) + norms)
    return total if cfg.tied else total + term("the untied output head (V × h)", V * h)


def _count_case(rng: random.Random, _world: int, **kind) -> Case:
    cfg = _config(rng, **kind)
    count = sum(p.numel() for p in TinyGPT(cfg).parameters())
    expr = parameter_count(cfg)
    assert expr.value == count, "the named terms should add up to the module's parameters"
    return Case(1, (cfg,), [count], _describe(cfg), formulas={"": formula(expr, "parameters")})


count_parameters = Puzzle(
    "count_parameters", NOTEBOOK, _count_case, rtol=0, atol=0, variants=MODEL_KINDS, **PREDICTION,
    hints=["Count each piece: the token embedding (vocab × hidden), the position embedding (seq × hidden), "
           "`layers` blocks, the final LayerNorm, and the output head.",
           "A block with biases: qkv Linear h→3h and proj h→h, fc1 h→4h and fc2 4h→h, two LayerNorms "
           "(a weight and a bias of h each): 12h² + 13h. Without biases only the weights remain.",
           "Grouped-query attention: K and V have kv_heads heads of h/heads each, "
           "so qkv maps h → h + 2·kv_heads·h/heads "
           "(kv_heads = 0 means one per query head). A tied head *is* the token embedding: count it once."],
    describe="The number of parameters of TinyGPT(config), from the config alone.")


# ---- 2. the bytes of mixed-precision Adam ----------------------------------------------------
def mixed_precision_adam_step(cfg: GPTConfig, tokens: torch.Tensor, targets: torch.Tensor):
    """One step as in Micikevicius et al. 2018 with Adam: bf16 weights and gradients, fp32 master
    weights, momentum and variance, on the tokens' device. Returns everything that must live on to the next step."""
    torch.manual_seed(0)
    model = TinyGPT(cfg).to(tokens.device, torch.bfloat16)
    master = [p.detach().float() for p in model.parameters()]
    momentum = [torch.zeros_like(w) for w in master]
    variance = [torch.zeros_like(w) for w in master]
    model.loss(tokens, targets).backward()
    with torch.no_grad():
        for p, w, m, v in zip(model.parameters(), master, momentum, variance):
            g = p.grad.float()
            m.mul_(0.9).add_(g, alpha=0.1)
            v.mul_(0.999).addcmul_(g, g, value=0.001)
            w.addcdiv_(m, v.sqrt().add_(1e-8), value=-1e-3)
            p.copy_(w)
    return model, master, momentum, variance


# The pieces of puzzle 2's answer, by the key the statement asks for: (bytes a parameter, dtype, what it is).
STATE_PIECES = {"weights": (2, "bf16", "the weights"), "gradients": (2, "bf16", "the gradients"),
                "master": (4, "fp32", "the master copy of the weights"), "m": (4, "fp32", "Adam's momentum m"),
                "v": (4, "fp32", "Adam's variance v")}
PLURAL = {"weights", "gradients"}


def _adam_case(rng: random.Random, _world: int, **kind) -> Case:
    cfg = _config(rng, **kind)
    tokens = torch.randint(0, cfg.vocab, (2, cfg.seq))
    (model, master, momentum, variance), _, kept = allocated(lambda: mixed_precision_adam_step(cfg, tokens, tokens))
    measured = {"weights": sum(p.nbytes for p in model.parameters()),
                "gradients": sum(p.grad.nbytes for p in model.parameters()),
                "master": sum(t.nbytes for t in master), "m": sum(t.nbytes for t in momentum),
                "v": sum(t.nbytes for t in variance)}
    n = sum(p.numel() for p in TinyGPT(cfg).parameters())
    assert kept == sum(measured.values()) == model_state_bytes(n), \
        "the reference step should keep exactly the ZeRO paper's (2+2+12)Ψ, piece by piece"
    count = term("Ψ, the parameter count", parameter_count(cfg))
    formulas = {}
    for key, (size, dtype, what) in STATE_PIECES.items():
        formulas[f"[{key!r}]"] = formula(count * term(f"{dtype}'s {size} B", size), "B")
        assert formulas[f"[{key!r}]"].value == measured[key], f"{what}: {size} B a parameter"
    # The label names the configuration only: a replayed seed must not print the answer.
    return Case(1, (cfg,), [measured], _describe(cfg), formulas=formulas,
                explain=_bytes_per_parameter(n, formulas))


def _piece(key: str) -> str:
    size, dtype, what = STATE_PIECES[key]
    return f"{what} ({dtype}, {size} B a parameter)"


def _bytes_per_parameter(count: int, formulas: dict) -> Callable:
    """training_state_bytes's explain: each piece of the answer said per parameter against its dtype's bytes (a piece
    left out, one at another dtype's size); where every piece has its right bytes a parameter of one count that is
    not Ψ, None if the formula's terms name the difference (the engine says it), else the count said as off."""

    def number(value) -> Optional[float]:
        """A plain or numpy number as a float (the comparison takes both); None for anything else."""
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
        return float(value) if ok else None

    def count_off(answer: dict) -> Optional[str]:
        """Every piece its bytes a parameter times one count, Ψ' ≠ Ψ, that no term of the formula explains."""
        if any(number(answer[key]) is None for key in STATE_PIECES):
            return None
        counts = {number(answer[key]) / size for key, (size, _, _) in STATE_PIECES.items()}
        if len(counts) != 1 or counts == {count} or terms.explain(formulas["['weights']"], 2 * min(counts)):
            return None
        other = min(counts)
        return (f"Diagnosis: every piece has its right bytes a parameter, for {other:,g} parameters where "
                f"TinyGPT(config) has Ψ = {count:,} ({abs(other - count):,g} {'more' if other > count else 'fewer'}): "
                "the count is off; your count_parameters(config) is what each piece multiplies.")

    def explain(expected: list, got: list) -> Optional[str]:
        answer = got[0]
        if number(answer) is not None:
            return (f"Diagnosis: your answer is one number ({number(answer) / count:g} B a parameter, Ψ = {count:,}) "
                    f"where the statement asks for the bytes of each piece: a dict with the keys "
                    f"{', '.join(STATE_PIECES)} (the five kinds of tensor the step keeps).")
        if not isinstance(answer, dict):
            return None
        said = [f"{_piece(key)} left out" for key in STATE_PIECES if key not in answer]
        one = []                                           # the pieces given per parameter, never times Ψ
        for key, value in answer.items():
            if key not in STATE_PIECES or number(value) is None:
                continue
            size, dtype, what = STATE_PIECES[key]
            per = number(value) / count
            if per == 0:
                said.append(f"{_piece(key)} left out (0 B)")
            elif number(value) == size:
                one.append(key)
            elif per != size and per.is_integer():
                kind = {2: "bf16's ", 4: "fp32's ", 8: "float64's "}.get(int(per), "")
                said.append(f"{what} counted at {kind}{per:g} B a parameter where mixed precision keeps "
                            f"{'them' if key in PLURAL else 'it'} in {dtype}, {size} B")
        if one:
            said.append(f"{', '.join(one)} given as {'its' if len(one) == 1 else 'their'} bytes for one parameter "
                        f"({', '.join(str(STATE_PIECES[key][0]) for key in one)}), where the statement asks for the "
                        f"whole model's: times Ψ")
        strays = [key for key in answer if key not in STATE_PIECES]
        if strays:
            said.append(f"{', '.join(map(repr, strays))} {'is' if len(strays) == 1 else 'are'} no piece the "
                        f"statement names (its keys: {', '.join(STATE_PIECES)})")
        if not said:
            return count_off(answer)
        return (f"Diagnosis: per parameter (Ψ = {count:,}), mixed-precision Adam keeps 2 + 2 + 4 + 4 + 4 = 16 B: "
                f"{'; '.join(said)}.")
    return explain


training_state_bytes = Puzzle(
    "training_state_bytes", NOTEBOOK, _adam_case, rtol=0, atol=0, variants=MODEL_KINDS, **PREDICTION,
    hints=["Between two steps, mixed-precision Adam keeps: the bf16 weights, their bf16 gradients, and in fp32 "
           "a master copy of the weights plus Adam's two moving averages.",
           "Bytes per parameter: 2 + 2 + (4 + 4 + 4). Multiply each by the parameter count (your count_parameters): "
           "{'weights': 2 * n, 'gradients': 2 * n, 'master': ..., 'm': ..., 'v': ...}.",
           "The fp32 master copy exists because bf16 cannot hold small updates: w + lr·u rounds back to w."],
    describe="Bytes that mixed-precision Adam keeps alive between steps, for TinyGPT(config), piece by piece.")


# ---- 3. activations of one layer -------------------------------------------------------------
ACTIVATION_RTOL = 0.02     # the formula leaves out LayerNorm's mean and 1/std (8bs bytes): under 2% from h = 16 on


def _activation_case(rng: random.Random, _world: int) -> Case:
    heads = rng.choice([1, 2, 4, 8])
    # h >= 16: the formula leaves out LayerNorm's mean and 1/std, 8bs bytes, under 2% of the block from h = 16 on
    s, b, h = rng.choice([8, 16, 32, 64]), rng.randint(1, 4), heads * rng.choice([16, 32])
    block = Block(GPTConfig(seq=s, hidden=h, heads=heads, dropout=0.1)).to(torch.bfloat16)
    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    saved = saved_activation_bytes(lambda: block(x), exclude=list(block.parameters()))
    expr = activation_terms(s, b, h, heads)
    assert abs(expr.value - saved) <= ACTIVATION_RTOL * saved, "Korthikanti's terms should match"
    return Case(1, (s, b, h, heads), [saved], f"s={s}, b={b}, h={h}, a={heads}, one bf16 block with dropout",
                formulas={"": formula(expr, "B")}, explain=_activation_reading(s, b, h, heads))


BF16 = 2             # bytes of a bf16 activation: already inside Korthikanti's 34 and 5


def _activation_reading(s: int, b: int, h: int, heads: int) -> Callable:
    """layer_activation_bytes's explain: an answer off by bf16's 2 bytes as a whole (34sbh + 5as²b is already in
    bytes), or whose attention part keeps s values per head and sample where the s × s scores belong."""
    formula_ = 34 * s * b * h + 5 * heads * s * s * b

    def explain(expected: list, got: list) -> Optional[str]:
        answer = got[0]
        if isinstance(answer, bool) or not isinstance(answer, (int, float)) or not math.isfinite(answer):
            return None
        for size, kind in ((BF16, "bf16"), (4, "fp32")):
            if math.isclose(answer, size * formula_, rel_tol=1e-9):
                return (f"Diagnosis: your answer is {size}× the bytes, multiplied by {kind}'s {size} B a value: "
                        "34sbh + 5as²b is already in bytes, bf16's 2 B inside the 34 and the 5 (and the dropout "
                        "masks' 1 B): do not multiply it by bytes again.")
        if math.isclose(answer, formula_ / BF16, rel_tol=1e-9):
            return ("Diagnosis: your answer is half the bytes: values counted where bytes belong (bf16 keeps 2 B a "
                    "value, a dropout mask 1 B).")
        rows = (answer - 34 * s * b * h) / (heads * s * b)
        if s > 1 and float(rows).is_integer() and 0 < rows <= 5:
            return (f"Diagnosis: the attention part of your answer is {rows:g}·asb bytes, s values per head and "
                    "sample, where the scores are s × s per head: the softmax output (2as²b), its dropout mask "
                    "(as²b) and the dropped-out scores (2as²b), 5as²b. Flash attention keeps one statistic per row "
                    "and recomputes the scores; this block's plain attention keeps them all.")
        return None
    return explain


def activation_terms(s: int, b: int, h: int, heads: int) -> Expr:
    """Korthikanti et al. 2022 (section 4.1), 34sbh + 5as²b bytes, as the named terms a learner adds up."""
    S, B, H, a = Q("s", s, "the sequence"), Q("b", b, "the micro-batch"), Q("h", h, "the hidden size"), \
        Q("a", heads, "the attention heads")
    sbh, as2b = S * B * H, a * S * S * B
    masks = term("the dropout masks (as²b + sbh + sbh, 1 B each)",
                 term("attention's dropout mask (as²b)", as2b) + term("the projection's dropout mask (sbh)", sbh)
                 + term("the MLP's dropout mask (sbh)", sbh))
    return (term("the qkv input (2sbh)", 2 * sbh) + term("Q and K (4sbh)", 4 * sbh)
            + term("the softmax output (2as²b)", 2 * as2b) + term("the dropped-out scores (2as²b)", 2 * as2b)
            + term("V (2sbh)", 2 * sbh) + term("the projection's input (2sbh)", 2 * sbh)
            + term("the MLP's input (2sbh)", 2 * sbh) + term("the GeLU input (8sbh)", 8 * sbh)
            + term("fc2's input (8sbh)", 8 * sbh) + term("the LayerNorm inputs (4sbh)", 4 * sbh) + masks)


layer_activation_bytes = Puzzle(
    "layer_activation_bytes", NOTEBOOK, _activation_case, rtol=ACTIVATION_RTOL, atol=0, **PREDICTION,
    hints=["List what backward needs from one block: the input of every matmul, the softmax output, the GeLU "
           "input, each dropout mask (1 byte per element), each LayerNorm input. Activations are bf16 (2 bytes).",
           "Attention: qkv input 2sbh, Q and K 4sbh, softmax output 2as²b, its dropout mask as²b, the dropped "
           "scores and V 2as²b + 2sbh, proj input 2sbh, dropout mask sbh: 11sbh + 5as²b.",
           "MLP: 2sbh + 8sbh (GeLU input, 4h wide) + 8sbh (fc2 input) + sbh (mask) = 19sbh; LayerNorms 4sbh. "
           "Total 34sbh + 5as²b (Korthikanti et al. 2022)."],
    describe="Bytes of the activations autograd saves in one transformer block (bf16, with dropout).")


# ---- 4-5. training within a memory budget ---------------------------------------------------------
def _training_inputs(rng: random.Random, layers: int, batch: int):
    cfg = GPTConfig(vocab=32, seq=32, hidden=32, heads=4, layers=layers)
    torch.manual_seed(rng.randrange(2**31))
    model = TinyGPT(cfg).double()
    tokens = torch.randint(0, cfg.vocab, (batch, cfg.seq))
    targets = torch.randint(0, cfg.vocab, (batch, cfg.seq))
    return cfg, model, tokens, targets


def _reference_grads(model, tokens, targets):
    model = copy.deepcopy(model)
    model.loss(tokens, targets).backward()
    return model


def _pieces(model, tokens, targets) -> dict[str, int]:
    """Measured parts of a training step's memory: states, one layer's activations, the head's, a boundary."""
    x = model.embed(tokens).detach().requires_grad_()
    params = list(model.parameters())
    states = 2 * sum(p.nbytes for p in params)           # weights and their gradients
    return {"states": states,
            "layer": saved_activation_bytes(lambda: model.blocks[0](x), exclude=params),
            "head": saved_activation_bytes(lambda: model.head_loss(x, targets), exclude=params),
            "boundary": x.nbytes,
            "inputs": 2 * tokens.nbytes}


RECOMPUTED = 1.25   # one block's activations alive again in backward (the solution peaks at 0.75-0.85 of one more)
ON_DEVICE = nothing_on_the_host("this lesson trades memory on one device")


def _checkpoint_case(rng: random.Random, _world: int) -> Case:
    layers = rng.randint(4, 6)
    cfg, model, tokens, targets = _training_inputs(rng, layers, batch=rng.randint(2, 4))
    p = _pieces(model, tokens, targets)
    budget = p["states"] + p["inputs"] + layers * p["boundary"] + p["head"] + RECOMPUTED * p["layer"]
    why = (f"weights and gradients {fmt_bytes(p['states'])} + {layers} layer inputs of {fmt_bytes(p['boundary'])} "
           f"+ the head's activations + {RECOMPUTED} layer's worth ({fmt_bytes(p['layer'])} each: one block "
           f"recomputed at a time, and backward's temporaries); without recomputation the {layers} layers alone "
           f"keep {fmt_bytes(layers * p['layer'])}")
    return Case(1, (model, tokens, targets), [_reference_grads(model, tokens, targets)],
                f"{layers} layers, batch {tokens.shape[0]}",
                budgets=[ON_DEVICE, Budget("peak_memory", budget, why,
                                hint="keep only each block's input; recompute one block's activations at a time "
                                     "during backward (torch.utils.checkpoint.checkpoint(block, x, "
                                     "use_reentrant=False) around every block).")])


class CheckpointUnused(PuzzleError):
    """checkpointed_step's blocks each ran twice before the head and never after it: the checkpoints' outputs unused."""


class BatchSplit(PuzzleError):
    """The blocks ran on another part of the batch than the puzzle's technique asks: pieces of it where
    checkpointing runs the whole batch, the whole of it where accumulation runs micro-batches."""


class _BlockRuns:
    """What the model's blocks did while the answer ran: each block's runs before the head (model.ln_f) first ran and
    after it, and the (sequences, tokens) of the inputs the blocks ran on."""

    def __init__(self, model) -> None:
        self.runs = [[0, 0] for _ in model.blocks]          # [before the head first ran, after] per block
        self.shapes: set[tuple[int, ...]] = set()
        head = []

        def counting(i: int):
            def hook(module, args):
                self.runs[i][bool(head) or torch._C._current_graph_task_id() != -1] += 1
                if args and isinstance(args[0], torch.Tensor) and args[0].dim():
                    self.shapes.add(tuple(args[0].shape[:2]))
            return hook
        self._handles = [block.register_forward_pre_hook(counting(i)) for i, block in enumerate(model.blocks)]
        self._handles.append(model.ln_f.register_forward_pre_hook(lambda module, args: head.append(True)))

    @property
    def rows(self) -> set[int]:
        """The batch sizes (sequences) the blocks ran on."""
        return {shape[0] for shape in self.shapes}

    def __enter__(self) -> "_BlockRuns":
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()


def _checkpoint_harness(answer, _dist, model, tokens, targets):
    """The answer, each block's runs counted before the head (model.ln_f) first ran and after: a block run twice
    before it and never after was checkpointed and run plainly too, the plain output carried on (a checkpoint
    recomputes only where its output reaches the loss, so after the head). Recomputation by hand (autograd.grad or
    backward(grad) block by block) also runs after the head. Said as that, where the peak alone would say only how
    much is kept; and blocks run on pieces of the batch, said as the accumulation they are."""
    with _BlockRuns(model) as blocks:
        result = answer(model, tokens, targets)
    if blocks.rows and max(blocks.rows) < len(tokens):
        raise BatchSplit(
            f"your blocks ran on pieces of the batch, at most {amount(max(blocks.rows), 'sequences')} of its "
            f"{len(tokens)} at a time: that is gradient accumulation (the next puzzle), which meets this budget only "
            "where the batch is large against the layers. This puzzle asks for checkpointing: run the whole batch, "
            "keep only each block's input, and recompute one block's activations at a time in backward.")
    runs = blocks.runs
    if runs and all(before >= 2 and after == 0 for before, after in runs):
        raise CheckpointUnused(
            f"each of the {len(runs)} blocks ran {'twice' if runs[0][0] == 2 else f'{runs[0][0]} times'} before "
            "the head and never after it (in backward): the checkpoints ran, but what reached the loss came from "
            "plain calls of the blocks, which keep their activations until backward (all of them alive at once, as "
            "without checkpointing); a checkpoint whose output is not used is never recomputed. Carry the "
            "checkpoint's output on, x = checkpoint(block, x, use_reentrant=False), and let nothing else run the "
            "blocks.")
    return result


def _accumulation_harness(answer, _dist, model, tokens, targets, k):
    """The answer, the inputs its blocks ran on read: the whole batch (every sequence, every token) in a block is no
    accumulation, whatever else (checkpointing, offloading) kept its memory down; said as that, where the budgets
    would say only how much."""
    with _BlockRuns(model) as blocks:
        result = answer(model, tokens, targets, k)
    if tuple(tokens.shape[:2]) in blocks.shapes:
        raise BatchSplit(
            f"your blocks ran on the whole batch of {len(tokens)} sequences at once: that is no gradient "
            f"accumulation, whatever else kept the memory down (checkpointing the whole batch computes its forward "
            f"twice). Run forward and backward on k = {k} micro-batches of {len(tokens) // k} sequences, one after "
            "the other, the gradients adding up in p.grad.")
    return result


checkpointed_step = Puzzle(
    "checkpointed_step", NOTEBOOK, _checkpoint_case, world_sizes=ONE_DEVICE, takes_dist=False,
    harness=_checkpoint_harness,
    rtol=1e-10, atol=1e-12,
    hints=["Run model.embed(tokens), then the blocks one by one, then model.head_loss(x, targets).backward(). "
           "The plain version keeps every block's activations until backward reaches it.",
           "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False) runs the block without saving its "
           "activations, keeps only x, and runs the block again inside backward.",
           "Wrap every block, not the whole model: recomputation then needs one block's activations at a time."],
    describe="One forward and backward of the model whose peak memory holds one block's activations at a time.")


def _accumulation_explain(model, tokens: torch.Tensor, targets: torch.Tensor, k: int):
    """accumulated_step's explain (lib.checker.puzzle.Case): which samples the gradients hold
    (puzzles._sample_weights), or,
    when they are no weighted sum of the samples' gradients, whether they are k micro-batches cut along another
    dimension of the tokens than the batch's."""

    def explain(expected: list, got: list) -> Optional[str]:
        mine, want = module_grads(got[0]), module_grads(expected[0])
        if mine is None or want is None or mine.shape != want.shape:
            return None
        ref = copy.deepcopy(model)
        params = list(ref.parameters())
        batch = len(tokens)
        basis = torch.stack([vjp(lambda i=i: ref.loss(tokens[i:i + 1], targets[i:i + 1]) / batch, params)
                             for i in range(batch)])
        weights = fit(basis, mine)
        if weights is not None:
            found = said(weights, k, unit="sample") or _pieces_counted(weights, batch, k)
            return f"Diagnosis: {found}" if found else None
        cut = sum(vjp(lambda t=t, y=y: ref.loss(t, y) / k, params)
                  for t, y in zip(tokens.chunk(k, 1), targets.chunk(k, 1)))
        scale = float((cut * mine).sum() / (cut * cut).sum().clamp_min(1e-300))
        if torch.allclose(scale * cut, mine, rtol=1e-6, atol=1e-12):
            scaled = "" if math.isclose(scale, 1, rel_tol=1e-6) else \
                f", times k = {k} (each piece's loss not divided by k)" if math.isclose(scale, k, rel_tol=1e-6) else \
                f", times {scale:.4g}"
            return (f"Diagnosis: the gradients are those of k = {k} micro-batches cut along the sequence (dim 1 of "
                    f"the tokens){scaled}, not along the batch (dim 0): each piece is then a shorter sequence, whose "
                    "tokens see none of the earlier pieces' and start again at position 0. Cut the samples apart: "
                    "tokens.chunk(k), dim 0.")
        return None
    return explain


def _pieces_counted(weights: torch.Tensor, batch: int, k: int) -> Optional[str]:
    """Every sample at one weight w other than 1, where w·k is the number of pieces tensor.split(k) makes (batch/k
    pieces of k rows): the gradients of those pieces, each loss divided by k."""
    w = float(weights.mean())
    pieces = w * k
    if math.isclose(w, 1, rel_tol=1e-6) or not math.isclose(pieces, round(pieces), rel_tol=1e-6) or round(pieces) < 1:
        return None
    pieces = round(pieces)
    if pieces != batch // k or pieces == k:
        return None                   # a factor of its own (a loss divided twice): lib.diagnose names it
    text = (f"every sample counts {w:.4g}× where it should count once: the gradients of {pieces} micro-batch"
            f"{'es' if pieces > 1 else ''}, each loss divided by k = {k}, where k micro-batches belong")
    said = (f"{text}: tensor.split(k) cuts pieces of k = {k} rows ({pieces} of them from a batch of {batch}); "
            "tensor.chunk(k) cuts k pieces.")
    if math.isclose(w, k / batch, rel_tol=1e-6):      # batch = k²/pieces: the gradients alone cannot tell them apart
        said += (f" The same weights come of k = {k} micro-batches whose losses were divided by the batch's {batch} "
                 f"samples where k belongs (a micro-batch's loss is already a mean over its {batch // k}): on this "
                 "case the gradients cannot tell the two apart.")
    return said


def _accumulation_case(rng: random.Random, _world: int) -> Case:
    k = rng.choice([2, 4])
    cfg, model, tokens, targets = _training_inputs(rng, layers=3, batch=2 * k)
    micro = _pieces(model, tokens[: len(tokens) // k], targets[: len(targets) // k])
    full_inputs = 2 * tokens.nbytes
    budget = micro["states"] + full_inputs + (cfg.layers + 1) * micro["layer"] + micro["head"]
    why = (f"weights and gradients {fmt_bytes(micro['states'])} + one micro-batch's activations "
           f"({cfg.layers} layers and the head) + one more layer's worth for backward's temporaries")
    return Case(1, (model, tokens, targets, k), [_reference_grads(model, tokens, targets)],
                f"batch {len(tokens)} in k={k} micro-batches",
                budgets=[ON_DEVICE, Budget("peak_memory", budget, why,
                                hint="run forward and backward on one micro-batch at a time; "
                                     "gradients add up in p.grad."),
                         *_accumulation_work(cfg, model, tokens, targets, k)],
                factors={"k, the number of micro-batches": k}, explain=_accumulation_explain(model, tokens, targets, k))


ACCUMULATION_OVER = 0.1     # of the whole batch's FLOPs: a forward recomputed (checkpointing) costs about a third


def _accumulation_work(cfg: GPTConfig, model, tokens, targets, k: int) -> list[Budget]:
    """Accumulation's own cost, not only its memory: the FLOPs of one big batch (checkpointing the whole batch meets
    the memory budget by computing the forward twice), and micro-batches of b/k samples (one sample at a time meets
    it with more, smaller pieces than asked): the floor is one micro-batch's attention scores, (b/k)·a·s² values."""
    micro_tokens, micro_targets = tokens.chunk(k)[0], targets.chunk(k)[0]
    probe = copy.deepcopy(model)
    _, flops = counted_flops(lambda: (probe.loss(micro_tokens, micro_targets) / k).backward())
    scores = len(micro_tokens) * cfg.heads * cfg.seq ** 2 * torch.finfo(torch.float64).bits // 8
    return [Budget("flops", k * flops * (1 + ACCUMULATION_OVER),
                   f"k = {k} micro-batches' forward and backward, {k * flops:,.0f} FLOPs (one big batch's), "
                   f"+ {ACCUMULATION_OVER:.0%}",
                   hint="accumulate: forward and backward each micro-batch once; checkpointing the whole batch "
                        "computes its forward twice."),
            Floor("largest_tensor", scores,
                  f"one micro-batch's attention scores, (b/k)·a·s² = {len(micro_tokens)}·{cfg.heads}·{cfg.seq}² "
                  "float64s: micro-batches of b/k samples, as k asks",
                  hint="cut the batch into the k micro-batches asked (tokens.chunk(k)), not into smaller ones.")]


accumulated_step = Puzzle(
    "accumulated_step", NOTEBOOK, _accumulation_case, world_sizes=ONE_DEVICE, takes_dist=False,
    harness=_accumulation_harness, rtol=1e-10, atol=1e-12,
    hints=["Split tokens and targets into k micro-batches (tensor.chunk(k)); forward and backward each in turn. "
           "backward() adds into p.grad, so the gradients accumulate by themselves.",
           "The loss is a mean over the batch: the mean over the whole batch is the average of the k micro-batch "
           "means. Divide each micro-batch's loss by k before backward.",
           "Only one micro-batch's activations exist at a time: the peak falls by about k."],
    describe="Gradients of the whole batch, computed k micro-batches at a time.")


# ---- 6. optimizer state in host memory -------------------------------------------------------------
ADAM_PASSES = 16    # an Adam update reads and writes each parameter about a dozen times; a little room on top


def _adam_reference(model, batches, lr: float):
    """The trained model, its gradients let go: only the parameters are compared, so every loop order real training
    code uses (zero_grad before backward, or after step, or set_to_none=False) is right."""
    model = copy.deepcopy(model)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for tokens, targets in batches:
        opt.zero_grad()
        model.loss(tokens, targets).backward()
        opt.step()
    opt.zero_grad(set_to_none=True)
    return model


OFFLOAD_STEPS = 3


def _offload_case(rng: random.Random, _world: int, steps: Optional[int] = None) -> Case:
    """`steps`: fewer of the same batches (every draw made first), to find the step a wrong run goes astray."""
    cfg, model, tokens, targets = _training_inputs(rng, layers=2, batch=2)
    batches = [(tokens, targets)] + [(torch.randint(0, cfg.vocab, tokens.shape),
                                      torch.randint(0, cfg.vocab, tokens.shape))
                                     for _ in range(OFFLOAD_STEPS - 1)]
    batches = batches[:steps or OFFLOAD_STEPS]
    lr = 1e-2
    params = list(model.parameters())
    param_bytes = sum(p.nbytes for p in params)
    param_count = sum(p.numel() for p in params)
    _, step_peak, _ = allocated(lambda: _reference_grads(model, tokens, targets))
    largest = max(p.nbytes for p in params)
    return Case(1, (model, batches, lr), [_adam_reference(model, batches, lr)],
                f"{len(batches)} Adam steps, {fmt_bytes(param_bytes)} of parameters",
                budgets=[Budget("peak_memory", step_peak + 2 * largest,
                                f"a plain forward and backward ({fmt_bytes(step_peak)}, weights and gradients "
                                f"included) + two of the largest parameter in flight; Adam's m and v would add "
                                f"{fmt_bytes(2 * param_bytes)}",
                                hint="make m and v with device=lib.host(), bring each gradient over with "
                                     "p.grad.to(lib.host()), and send only the update back to the device."),
                         Budget("host_flops", ADAM_PASSES * param_count * len(batches),
                                f"{ADAM_PASSES} elementwise passes over the {param_count:,} parameters per Adam step; "
                                f"forward and backward belong on the device (on the host they would cost about "
                                f"6 · parameters · tokens = {6 * param_count * tokens.numel() * len(batches):,})",
                                hint="keep the model where it is; move gradients to the host, not the model."),
                         _host_step(param_count, len(batches))],
                steps=len(batches), explain=_adam_reading(model, batches, lr))


@functools.lru_cache(maxsize=16)
def _adam_step_flops(elements: int) -> float:
    """One Adam update of `elements` float64 parameters as the hints write it, counted as a rank counts it."""
    p, g, m, v = (torch.ones(elements, dtype=torch.float64) for _ in range(4))

    def step():
        m.mul_(0.9).add_(g, alpha=0.1)
        v.mul_(0.999).addcmul_(g, g, value=0.001)
        p.addcdiv_(m / (1 - 0.9), (v / (1 - 0.999)).sqrt().add_(1e-8), value=-1e-3)
    return counted_flops(step)[1]


def _host_step(param_count: int, steps: int) -> Budget:
    """The step on the host (puzzles/_offload.py): elementwise, its count depends on the sizes alone."""
    return host_step_floor(steps * _adam_step_flops(param_count),
                           f"{steps} Adam steps on the {param_count:,} parameters",
                           hint="update m and v and compute the step on the host tensors themselves; bring only the "
                                "update back to the device (m and v carried to the device for the update leave its "
                                "compute and the link doing the host's work).")


def _adam_reading(model, batches, lr: float) -> Callable:
    """offloaded_adam_train's explain: the one setting of Adam whose run gives the learner's parameters."""
    def explain(expected: list, got: list) -> Optional[str]:
        found = _adam_variants.which(model, batches, lr, lambda m, batch: m.loss(*batch), expected[0], got[0])
        return f"Diagnosis: {found}" if found else None
    return explain


offloaded_adam_train = Puzzle(
    "offloaded_adam_train", NOTEBOOK, _offload_case, world_sizes=ONE_DEVICE, takes_dist=False,
    rtol=1e-6, atol=1e-9,
    hints=["Forward and backward stay on the device. Adam's two moving averages m and v live in host memory: "
           "create them with device=lib.host().",
           "Each step: p.grad.to(lib.host()); update m and v there; compute the step "
           "lr · m̂ / (√v̂ + eps) with the bias corrections 1 - β^t; bring it back with .to(lib.device()) and subtract.",
           "Match torch.optim.Adam exactly: m̂ = m / (1 - β1^t), v̂ = v / (1 - β2^t), p -= lr · m̂ / (√v̂ + eps)."],
    describe="Adam training whose optimizer state lives in host memory (ZeRO-Offload's idea, on one device).")


PUZZLES = [count_parameters, training_state_bytes, layer_activation_bytes, checkpointed_step, accumulated_step,
           offloaded_adam_train]
