"""Notebook 04, tensor and sequence parallelism: the puzzles, their inputs, references and budgets.

Every layer is checked three ways: its output and every gradient against the single-device layer
(float64, Megatron's [s, b, h] layout); the collectives it issues in forward and in backward, by kind
and size, against Megatron-LM's pattern; and the bytes each rank sends, from the ring formulas. The MLP, the
attention block and the sequence-parallel MLP are also checked for the bytes autograd saves in forward, against
Korthikanti et al.'s per-rank activation terms (lib.analytic.formulas.activation_bytes_per_layer) adapted to these
layers.
"""

from __future__ import annotations

import functools
import random
from typing import Callable, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from lib.checker.puzzle import Budget, Case, Floor, flops_budgets
from lib.real.backends import device_mesh
from lib.notebook.warm_up import import_ahead
from lib.checker.layer import LayerPuzzle, Upstream, describe_calls
from lib.checker.measure import counted_flops
from lib.sim import per_rank
from lib.sim.cost import bus_factor
from lib.units import fmt_bytes

import_ahead("explicit_gradient")          # every layer's check back-propagates an upstream gradient

NOTEBOOK = "04_tensor_parallel"
WORLDS = (2, 4)
ITEM = 8                      # float64: the comparison with the single-device layer can be strict


def _layer(name: str, make_case: Callable, arg_names: Sequence[str], **kw) -> LayerPuzzle:
    return LayerPuzzle(name, NOTEBOOK, make_case, arg_names=arg_names, world_sizes=WORLDS, rtol=1e-9, atol=1e-10,
                       **kw)


GPT3_LAYER = (2048, 1, 12288)          # s, b, h of GPT-3 175B (Brown et al. 2020, Table 2.1)


def _layer_scale(case: Case, split: str = "") -> tuple:
    """A layer's timeline at GPT-3's scale: the toy [s, b, h] float64 stands for GPT-3's in bf16, so that its
    matmuls (s·b·h² FLOPs) and its all-reduces (s·b·h bytes) take their real proportions. `split`: the dimension
    of x each rank holds 1/N of ("hidden" for row-parallel, "sequence" for sequence parallelism)."""
    from lib.viz.timeline import at_scale, scale_note

    x = case.args[0].values[0]                               # [s, b, h], or this rank's slice of it
    (s, b, h), (S, B, H) = x.shape, GPT3_LAYER
    s, h = s * (case.world_size if split == "sequence" else 1), h * (case.world_size if split == "hidden" else 1)
    elements = S * B * H / (s * b * h)
    return (at_scale(elements * 2 / x.element_size(), elements * H / h),
            f"drawn as if s·b·h = {s}·{b}·{h} in float64 were GPT-3's {S}·{B}·{H} in bf16\n{scale_note()}")


# ---- the single-device layers ---------------------------------------------------------------
def _gen(rng: random.Random) -> torch.Generator:
    return torch.Generator().manual_seed(rng.randrange(2**31))


def _rand(gen: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale


def _shape(rng: random.Random, world: int, heads_per_rank: Optional[int] = None,
           head_dim: Optional[int] = None) -> tuple[int, int, int, int]:
    """(s, b, h, a): 1 to 3 heads per rank, the sequence a multiple of the world size."""
    a = world * (heads_per_rank or rng.randint(1, 3))
    return world * rng.randint(1, 3), rng.randint(1, 2), a * (head_dim or rng.choice([2, 4])), a


def attention_core(qkv: torch.Tensor, heads: int) -> torch.Tensor:
    """Causal self-attention of [s, b, 3·w] (q, k and v side by side, `heads` heads each) to [s, b, w].

    Not lib.models.Block.attention, on purpose: Megatron's layout is sequence-first ([s, b, h]), which makes
    sequence parallelism a split of dim 0, and a rank here owns only its heads' slice of qkv, not a module."""
    return _core(qkv, heads)


def _core(qkv: torch.Tensor, heads: int, *, scale: Optional[float] = None, causal: bool = True, over: int = -1,
          per_head: bool = False) -> torch.Tensor:
    """attention_core with each of its settings open, for the diagnosis: the scores' scale (1/√d by default), the
    causal mask, the dimension the softmax normalises over (the keys, -1), and the layout of qkv (per_head: each
    head's q, k, v side by side, [s, b, heads, 3·d], Megatron-LM's fused layout)."""
    s, b, three_w = qkv.shape
    w = three_w // 3
    d = w // heads
    if per_head:
        q, k, v = (t.permute(1, 2, 0, 3) for t in qkv.reshape(s, b, heads, 3 * d).split(d, dim=-1))
    else:
        q, k, v = (t.reshape(s, b, heads, d).permute(1, 2, 0, 3) for t in qkv.split(w, dim=-1))  # (b, a, s, d) each
    scores = (q @ k.transpose(-2, -1)) * (d ** -0.5 if scale is None else scale)
    if causal:
        scores = scores + torch.full((s, s), float("-inf"), dtype=qkv.dtype, device=qkv.device).triu(1)
    return (scores.softmax(over) @ v).permute(2, 0, 1, 3).reshape(s, b, w)              # (b, a, s, d) -> (s, b, w)


def _reference(fn: Callable, upstream: torch.Tensor, **inputs: torch.Tensor) -> dict:
    """The single-device layer: output and the gradient of every floating-point input."""
    leaves = {k: v.clone().requires_grad_(v.is_floating_point()) for k, v in inputs.items()}
    out = fn(**leaves)
    out.backward(upstream)
    return {"output": out.detach(), **{k: v.grad for k, v in leaves.items() if v.requires_grad}}


def _req(*ts: torch.Tensor) -> list[torch.Tensor]:
    return [t.clone().requires_grad_(True) for t in ts]


def _ring(op: str, elements: int, world: int) -> float:
    """Bytes a rank sends in one ring collective over a buffer of `elements` float64."""
    return bus_factor(op, world) * elements * ITEM


def _bytes_budgets(pattern: dict, world: int, words: str) -> list[Budget]:
    calls = pattern["forward"] + pattern["backward"]
    total = sum(_ring(op, n, world) for op, n in calls)
    why = f"{words}: {describe_calls(calls)} per layer, ring cost 2(N-1)/N or (N-1)/N each"
    # The same amounts as floors: the pattern's collectives carry the layer's float64 activations, not a smaller
    # stand-in while the values travel some other way (a global, a class attribute: threads share them).
    hint = ("the collectives carry the activations and gradients themselves, in float64: separate processes share "
            "nothing else.")
    return [Budget("bytes_sent", total, why), Budget("bytes_received", total, why),
            *(Floor(metric, total, why, hint=hint) for metric in ("bytes_sent", "bytes_received"))]


def _label(world: int, s: int, b: int, h: int, extra: str = "") -> str:
    return f"N={world}, s={s}, b={b}, h={h}{extra}"


# ---- what a wrong layer shows -----------------------------------------------------------------------
# A layer's explain (lib.checker.puzzle.Case) replays the parallel layer on the case's inputs with one of its settings
# changed, and names the setting whose layer gives the learner's output: where f and g sit, how attention splits and
# scales its heads, which ids a vocabulary shard may use. These are the layer's own degrees of freedom, not a list of
# answers: any wrong answer that is the layer with one setting changed is named by it.
OPERATORS = {"f": "f (identity forward, all-reduce backward)", "g": "g (all-reduce forward, identity backward)",
             "": "no operator"}


def _placements(x: torch.Tensor, dy: torch.Tensor, world: int, local: Callable[[torch.Tensor, int], torch.Tensor]
                ) -> dict[tuple[str, str], list[tuple[torch.Tensor, torch.Tensor]]]:
    """{(before, after): each rank's (partial output, x.grad)} for every place of f, g or nothing before the layer's
    first matmul and after its last (`local(x, r)`: rank r's part of the layer, whose parts sum to the output)."""
    found = {}
    for before in OPERATORS:
        inputs = [(x * world if before == "g" else x).clone().requires_grad_() for _ in range(world)]
        partial = [local(inputs[r], r) for r in range(world)]
        total = sum(t.detach() for t in partial)
        for r in range(world):
            partial[r].backward(dy, retain_graph=True)
        pulled = [t.grad.clone() for t in inputs]
        for after in OPERATORS:
            scale = world if after == "f" else 1          # f's backward sums N copies of the same upstream gradient
            grads = [g * scale for g in pulled]
            grads = [sum(grads)] * world if before == "f" else grads
            outs = [total if after == "g" else partial[r].detach() for r in range(world)]
            found[before, after] = list(zip(outs, grads))
    return found


def _placement_explain(x: torch.Tensor, dy: torch.Tensor, bias: torch.Tensor, world: int, local: Callable,
                       first: str, last: str):
    """Which f and g (or none) before `first` and after `last` give the learner's output and x.grad on every rank."""

    def explain(expected: list, got: list) -> Optional[str]:
        if not all(isinstance(g, dict) and isinstance(g.get("output"), torch.Tensor)
                   and isinstance(g.get("x.grad"), torch.Tensor) for g in got):
            return None
        for (before, after), runs in _placements(x, dy, world, local).items():
            if (before, after) == ("f", "g"):
                continue
            if all(_same(g["output"], out + bias) and _same(g["x.grad"], grad) for g, (out, grad) in zip(got, runs)):
                swapped = ": f and g in each other's place" if (before, after) == ("g", "f") else ""
                return (f"Diagnosis: the output and x.grad are those of {OPERATORS[before]} before {first} and "
                        f"{OPERATORS[after]} after {last}, where Megatron's layer has f before {first} and g after "
                        f"{last}{swapped}.")
        return None
    return explain


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.detach().double().cpu(), b.double(), rtol=1e-7, atol=1e-9)


def _attention_settings(heads: int, world: int, h: int) -> list[tuple[dict, str]]:
    """(settings of _core, what they mean) for every single change of attention's settings on a rank."""
    a, w = heads // world, h // world
    d = w // a
    said_heads = [({"heads_per_rank": n},
                   f"each rank splits its {w} features into {n} heads of {w // n} where it holds {a} heads of d = {d} "
                   "(heads // N): " + ("all the heads of the model on every rank" if n == heads else
                                       f"{n} heads per rank"))
                  for n in range(1, w + 1) if w % n == 0 and n != a]
    scales = {f"1/√h, h = {h} the model's width": h ** -0.5, f"1/√(h/N) = 1/√{w}, this rank's width": w ** -0.5,
              f"1/d = 1/{d} (no square root)": 1 / d, "1 (not scaled)": 1.0, f"√d = √{d} (multiplied)": d ** 0.5}
    alike: dict[float, list[str]] = {}
    for said, v in scales.items():
        if abs(v - d ** -0.5) > 1e-12:
            alike.setdefault(round(v, 12), []).append(said)      # equal on this case (h = d², ...): said together
    said_scales = [({"scale": v}, f"the scores are scaled by {', or '.join(said)} where attention scales them by "
                                  f"1/√d, d = {d} the head's width (h / heads)") for v, said in alike.items()]
    return [*said_heads, *said_scales,
            ({"causal": False}, "no causal mask: every position attends to the future too (-inf above the diagonal, "
                                "or is_causal=True, keeps each query to the keys at or before it)"),
            ({"over": -2}, "the softmax normalises over the queries (dim -2) where each query's weights over the "
                           "keys must sum to 1 (softmax's dim -1)"),
            ({"per_head": True}, "qkv read as each head's q, k, v side by side ([s, b, heads, 3·d], Megatron-LM's "
                                 "fused layout) where this layer's qkv is all of q, then all of k, then all of v "
                                 "([s, b, 3·w])")]


def _settings_explain(x: torch.Tensor, output: Callable[..., torch.Tensor], settings: list[tuple[dict, str]],
                      what: str):
    """The setting whose layer (`output(**setting)`: rank 0's output) gives the learner's output on rank 0; a
    setting the case's shapes do not allow (a weight that multiplies only one way round) is passed over."""

    def explain(expected: list, got: list) -> Optional[str]:
        mine = got[0].get("output") if isinstance(got[0], dict) else None
        if not isinstance(mine, torch.Tensor):
            return None
        with torch.no_grad():
            for setting, meaning in settings:
                try:
                    theirs = output(**setting)
                except RuntimeError:
                    continue
                if _same(mine, theirs):
                    return f"Diagnosis: your output is {what} with one setting changed: {meaning}."
        return None
    return explain


def _weight_settings(called: str) -> list[tuple[dict, str]]:
    """A weight multiplied as stored: x @ w where nn.Linear's (out, in) weight needs x @ w.T (the same shapes only
    where this rank's shard is square, so no error told it)."""
    return [({"transposed": True}, f"x @ {called} where {called} is stored as (out_features, in_features), as "
                                   f"nn.Linear keeps it: multiply by its transpose, x @ {called}.T, or "
                                   f"F.linear(x, {called})")]


def _times(x: torch.Tensor, w: torch.Tensor, transposed: bool) -> torch.Tensor:
    return x @ w if transposed else F.linear(x, w)


def _attention_explain(x, qkv_ws, qkv_bs, proj_ws, proj_b, heads: int, world: int):
    """parallel_attention's explain: the setting of attention whose layer gives the learner's output; failing that,
    which positions are right (position 0 attends only to itself: right there and wrong after it, the weights are
    wrong and the values right)."""

    def output(heads_per_rank: int = heads // world, **setting) -> torch.Tensor:
        return sum(F.linear(_core(F.linear(x, qkv_ws[r], qkv_bs[r]), heads_per_rank, **setting), proj_ws[r])
                   for r in range(world)) + proj_b

    def positions(expected: list, got: list) -> Optional[str]:
        mine = got[0].get("output") if isinstance(got[0], dict) else None
        if not isinstance(mine, torch.Tensor) or mine.shape != x.shape or len(x) < 2:
            return None
        wrong = [i for i in range(len(x)) if not _same(mine[i], expected[0]["output"][i])]
        if wrong == list(range(1, len(x))):
            return ("Diagnosis: position 0, which attends only to itself, is right, and every later position is "
                    "wrong: the values and projections are right and the attention weights are not (the scale, the "
                    "heads a rank splits its features into, the mask, or the softmax's dim).")
        if wrong == list(range(len(x) - 1)):
            return ("Diagnosis: only the last position, which may attend to every key, is right: the earlier "
                    "positions attend to the future too (the causal mask is missing or wrong).")
        return None
    return _either(_settings_explain(x, output, _attention_settings(heads, world, x.shape[-1]), "attention's"),
                   positions)


def _mlp_explain(x, w1s, b1s, w2s, b2, world: int):
    """megatron_mlp's explain: the activation, the place of it, and the place of fc1's bias, whose MLP gives the
    learner's output."""
    def output(act: Callable = F.gelu, place: str = "between", fc1_bias: str = "in fc1") -> torch.Tensor:
        scale = {"in fc1": 1, "over N": 1 / world}.get(fc1_bias)         # None: not inside fc1
        hidden = [F.linear(x, w1s[r], None if scale is None else b1s[r] * scale) for r in range(world)]
        hidden = [act(t) for t in hidden] if place == "between" else hidden
        hidden = [t + b1s[r] for r, t in enumerate(hidden)] if fc1_bias == "after GeLU" else hidden
        out = sum(F.linear(t, w2s[r]) for r, t in enumerate(hidden))
        return act(out + b2) if place == "after" else act(out) + b2 if place == "before the bias" else out + b2
    settings = [({"act": functools.partial(F.gelu, approximate="tanh")},
                 "GeLU's tanh approximation (F.gelu(x, approximate='tanh'), GPT-2's) where this MLP uses the exact "
                 "erf form, F.gelu(x)"),
                ({"act": F.relu}, "ReLU where this MLP uses GeLU (F.gelu)"),
                ({"act": F.silu}, "SiLU where this MLP uses GeLU (F.gelu)"),
                *(({"place": place}, f"{said}, where GeLU belongs between fc1 and fc2, on each rank's 4h/N "
                                     "hidden units (fc1's output)")
                  for place, said in (("after", "GeLU applied to fc2's output (after the sum and the bias)"),
                                      ("before the bias", "GeLU applied to fc2's summed output, before its bias"),
                                      ("nowhere", "no GeLU at all"))),
                ({"fc1_bias": "after GeLU"}, "fc1's bias added after GeLU, where it belongs inside fc1, before GeLU: "
                                             "F.gelu(F.linear(x, fc1_w, fc1_b))"),
                ({"fc1_bias": "nowhere"}, "fc1's bias left out, where fc1 adds it before GeLU: "
                                          "F.gelu(F.linear(x, fc1_w, fc1_b))"),
                ({"fc1_bias": "over N"}, "fc1's bias divided by N, where each rank's fc1_b is its own slice of the "
                                         "bias, added whole: only fc2's bias meets the other ranks' partial sums")]
    return _settings_explain(x, output, settings, "the MLP's")


def _either(*explains: Callable) -> Callable:
    """One explain from several: the first that finds something."""
    def explain(expected: list, got: list) -> Optional[str]:
        return next(filter(None, (e(expected, got) for e in explains)), None)
    return explain


# ---- 1. column-parallel linear -----------------------------------------------------------------
def _column_case(rng: random.Random, world: int) -> Case:
    s, b, h, _ = _shape(rng, world)
    out_f = world * rng.randint(1, 4) * 2
    gen = _gen(rng)
    x, w, bias = _rand(gen, s, b, h), _rand(gen, out_f, h, scale=h ** -0.5), _rand(gen, out_f, scale=0.1)
    dy = _rand(gen, s, b, out_f)
    ref = _reference(lambda x, w, bias: F.linear(x, w, bias), dy, x=x, w=w, bias=bias)
    ws, bs, dys, gw, gb = (t.chunk(world, dim) for t, dim in
                           ((w, 0), (bias, 0), (dy, -1), (ref["w"], 0), (ref["bias"], 0)))
    pattern = {"forward": [], "backward": [("all_reduce", s * b * h)]}
    expected = [{"output": ref["output"].chunk(world, -1)[r], "x.grad": ref["x"], "weight.grad": gw[r],
                 "bias.grad": gb[r]} for r in range(world)]
    args = (per_rank([_req(x)[0] for _ in range(world)]), per_rank(_req(*ws)), per_rank(_req(*bs)),
            per_rank([Upstream(d, pattern) for d in dys]))
    return Case(world, args, expected, _label(world, s, b, h, f", {out_f} output features"),
                budgets=_bytes_budgets(pattern, world, "f's backward"), allowed_ops=frozenset({"all_reduce"}),
                explain=_settings_explain(x, lambda transposed=False: _times(x, ws[0], transposed) + bs[0],
                                          _weight_settings("weight"), "the column-parallel layer's"))


def _gather_full(dist, shard: torch.Tensor, dim: int) -> torch.Tensor:
    """The oracle's way back to the full weight the learner only has a shard of."""
    parts = [torch.empty_like(shard) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, shard.detach().contiguous())
    return torch.cat(parts, dim)


def _linear(dist, w: torch.Tensor, bias: Optional[torch.Tensor], w_dim: int, bias_sharded: bool):
    full_w = _gather_full(dist, w, w_dim)
    layer = torch.nn.Linear(full_w.shape[1], full_w.shape[0], bias=bias is not None, dtype=full_w.dtype,
                            device=full_w.device)
    with torch.no_grad():
        layer.weight.copy_(full_w)
        if bias is not None:
            layer.bias.copy_(_gather_full(dist, bias, 0) if bias_sharded else bias.detach())
    return layer


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def _column_oracle(dist, x, weight, bias, upstream):
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    module = torch.nn.Module()
    module.fc = _linear(dist, weight, bias, 0, True)
    parallelize_module(module, device_mesh(dist), {"fc": ColwiseParallel()})
    out = module.fc(x)
    out.backward(upstream.grad)
    return {"output": out.detach(), "x.grad": x.grad, "weight.grad": _local(module.fc.weight.grad),
            "bias.grad": _local(module.fc.bias.grad)}


column_parallel_linear = _layer(
    "column_parallel_linear", _column_case, ("x", "weight", "bias"),
    hints=["Forward needs no communication: each rank computes its slice of the output features, "
           "F.linear(x, weight, bias). The trouble is backward: x.grad on one rank only has the part that "
           "flows through this rank's output features.",
           "Megatron's f operator: identity in forward, all-reduce of the gradient in backward. Write it as a "
           "torch.autograd.Function with staticmethods forward(ctx, x) and backward(ctx, grad), and apply it "
           "to x before the matmul.",
           "class Copy(torch.autograd.Function): forward returns x.view_as(x); backward clones grad, calls "
           "dist.all_reduce on it and returns it. Define the class inside your function so it can use dist."],
    oracle=_column_oracle, oracle_name="parallelize_module with ColwiseParallel",
    real_scale=_layer_scale,
    describe="y_r = x A_rᵀ + b_r for this rank's rows of A; x.grad complete on every rank.")


# ---- 2. row-parallel linear ------------------------------------------------------------------
def _row_case(rng: random.Random, world: int) -> Case:
    s, b, h, _ = _shape(rng, world)
    in_f = world * rng.randint(1, 4) * 2
    gen = _gen(rng)
    x, w, bias = _rand(gen, s, b, in_f), _rand(gen, h, in_f, scale=in_f ** -0.5), _rand(gen, h, scale=0.1)
    dy = _rand(gen, s, b, h)
    ref = _reference(lambda x, w, bias: F.linear(x, w, bias), dy, x=x, w=w, bias=bias)
    xs, ws, gx, gw = x.chunk(world, -1), w.chunk(world, 1), ref["x"].chunk(world, -1), ref["w"].chunk(world, 1)
    pattern = {"forward": [("all_reduce", s * b * h)], "backward": []}
    expected = [{"output": ref["output"], "x.grad": gx[r], "weight.grad": gw[r], "bias.grad": ref["bias"]}
                for r in range(world)]
    args = (per_rank(_req(*xs)), per_rank(_req(*ws)), per_rank([_req(bias)[0] for _ in range(world)]),
            per_rank([Upstream(dy, pattern) for _ in range(world)]))
    return Case(world, args, expected, _label(world, s, b, h, f", {in_f} input features"),
                budgets=_bytes_budgets(pattern, world, "g's forward"), allowed_ops=frozenset({"all_reduce"}),
                explain=_settings_explain(x, lambda transposed=False: sum(
                    _times(xs[r], ws[r], transposed) for r in range(world)) + bias, _weight_settings("weight"),
                    "the row-parallel layer's"))


def _row_oracle(dist, x, weight, bias, upstream):
    from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

    module = torch.nn.Module()
    module.fc = _linear(dist, weight, bias, 1, False)
    parallelize_module(module, device_mesh(dist), {"fc": RowwiseParallel()})
    out = module.fc(x)
    out.backward(upstream.grad)
    return {"output": out.detach(), "x.grad": x.grad, "weight.grad": _local(module.fc.weight.grad),
            "bias.grad": _local(module.fc.bias.grad).clone()}


row_parallel_linear = _layer(
    "row_parallel_linear", _row_case, ("x", "weight", "bias"),
    hints=["Each rank holds a slice of the input features and the matching columns of the weight: "
           "x_r A_rᵀ is a partial sum, and the output is the sum of the partial sums over ranks. Add the bias "
           "once, after the sum.",
           "Megatron's g operator: all-reduce in forward, identity in backward (every rank already receives the "
           "whole output gradient). A torch.autograd.Function again, the mirror image of f.",
           "class Reduce(torch.autograd.Function): forward clones x, dist.all_reduce(x), returns it; backward "
           "returns grad unchanged. y = Reduce.apply(F.linear(x, weight)) + bias."],
    oracle=_row_oracle, oracle_name="parallelize_module with RowwiseParallel",
    real_scale=functools.partial(_layer_scale, split="hidden"),
    describe="y = Σ_r x_r A_rᵀ + b on every rank, one all-reduce in forward, none in backward.")


# ---- 3. the Megatron MLP ---------------------------------------------------------------------
def _mlp(x, fc1_w, fc1_b, fc2_w, fc2_b):
    return F.linear(F.gelu(F.linear(x, fc1_w, fc1_b)), fc2_w, fc2_b)


def _mlp_weights(gen: torch.Generator, h: int):
    return (_rand(gen, 4 * h, h, scale=h ** -0.5), _rand(gen, 4 * h, scale=0.1),
            _rand(gen, h, 4 * h, scale=(4 * h) ** -0.5), _rand(gen, h, scale=0.1))


def _mlp_case(rng: random.Random, world: int) -> Case:
    s, b, h, _ = _shape(rng, world)
    gen = _gen(rng)
    x, (w1, b1, w2, b2) = _rand(gen, s, b, h), _mlp_weights(gen, h)
    dy = _rand(gen, s, b, h)
    ref = _reference(_mlp, dy, x=x, fc1_w=w1, fc1_b=b1, fc2_w=w2, fc2_b=b2)
    pattern = {"forward": [("all_reduce", s * b * h)], "backward": [("all_reduce", s * b * h)]}
    # Korthikanti et al. 2022 (section 4.2.1), the MLP's part of sbh(10 + 24/t) in 16-bit: a copy of the
    # input 2sbh, the GeLU input 8sbh/t and fc2's input 8sbh/t (no dropout here); float64 is 4x wider.
    wide = x.element_size() / 2
    activations = (wide * s * b * h * (2 + 16 / world),
                   f"Korthikanti et al.'s MLP terms with t={world}: 2sbh + 8sbh/t + 8sbh/t bytes in 16-bit, "
                   f"x{wide:.0f} in {str(x.dtype).replace('torch.', '')}")
    split = {"fc1_w": 0, "fc1_b": 0, "fc2_w": 1}
    expected = [{"output": ref["output"], "x.grad": ref["x"], "fc2_b.grad": ref["fc2_b"],
                 **{f"{k}.grad": ref[k].chunk(world, d)[r] for k, d in split.items()}} for r in range(world)]
    args = (per_rank([_req(x)[0] for _ in range(world)]), per_rank(_req(*w1.chunk(world, 0))),
            per_rank(_req(*b1.chunk(world, 0))), per_rank(_req(*w2.chunk(world, 1))),
            per_rank([_req(b2)[0] for _ in range(world)]),
            per_rank([Upstream(dy, pattern, activations, ref["output"])] * world))
    w1s, b1s, w2s = w1.chunk(world, 0), b1.chunk(world, 0), w2.chunk(world, 1)

    def part(t: torch.Tensor, r: int) -> torch.Tensor:
        return F.linear(F.gelu(F.linear(t, w1s[r], b1s[r])), w2s[r])
    return Case(world, args, expected, _label(world, s, b, h),
                budgets=_bytes_budgets(pattern, world, "g's forward and f's backward"),
                allowed_ops=frozenset({"all_reduce"}),
                explain=_either(_mlp_explain(x, w1s, b1s, w2s, b2, world),
                                _placement_explain(x, dy, b2, world, part, "fc1", "fc2")))


class _MLP(torch.nn.Module):
    def __init__(self, fc1, fc2) -> None:
        super().__init__()
        self.fc1, self.fc2 = fc1, fc2

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def _mlp_oracle(dist, x, fc1_w, fc1_b, fc2_w, fc2_b, upstream):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    module = _MLP(_linear(dist, fc1_w, fc1_b, 0, True), _linear(dist, fc2_w, fc2_b, 1, False))
    parallelize_module(module, device_mesh(dist), {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    out = module(x)
    out.backward(upstream.grad)
    return {"output": out.detach(), "x.grad": x.grad,
            "fc1_w.grad": _local(module.fc1.weight.grad), "fc1_b.grad": _local(module.fc1.bias.grad),
            "fc2_w.grad": _local(module.fc2.weight.grad), "fc2_b.grad": _local(module.fc2.bias.grad).clone()}


megatron_mlp = _layer(
    "megatron_mlp", _mlp_case, ("x", "fc1_w", "fc1_b", "fc2_w", "fc2_b"),
    hints=["fc1 is column-parallel (this rank's 4h/N hidden units), GeLU acts on each unit alone, fc2 is "
           "row-parallel (the matching 4h/N inputs). No communication is needed between them.",
           "Reuse your two answers: row_parallel_linear(dist, F.gelu(column_parallel_linear(dist, x, fc1_w, "
           "fc1_b)), fc2_w, fc2_b).",
           "If the check counts two all-reduces in backward, g's backward is communicating: it must be the "
           "identity. If it counts none, f is missing its backward. The check also measures what your forward "
           "saves for backward: use F.gelu (a hand-written GeLU keeps several 4h-wide intermediates)."],
    oracle=_mlp_oracle, oracle_name="parallelize_module (fc1 ColwiseParallel, fc2 RowwiseParallel)",
    real_scale=_layer_scale,
    describe="The transformer MLP split over N ranks: one all-reduce in forward, one in backward.")


# ---- 4. attention split by heads ---------------------------------------------------------------
def _attention(x, qkv_w, qkv_b, proj_w, proj_b, heads):
    return F.linear(attention_core(F.linear(x, qkv_w, qkv_b), heads), proj_w, proj_b)


def _qkv_shards(t: torch.Tensor, world: int) -> list[torch.Tensor]:
    """Rank r's rows of a fused [q; k; v] weight (or bias): its heads of q, of k and of v."""
    q, k, v = (p.chunk(world, 0) for p in t.chunk(3, 0))
    return [torch.cat([q[r], k[r], v[r]]) for r in range(world)]


def _attention_case(rng: random.Random, world: int, heads_per_rank: Optional[int] = None) -> Case:
    s, b, h, a = _shape(rng, world, heads_per_rank)
    gen = _gen(rng)
    x, qkv_w, qkv_b = _rand(gen, s, b, h), _rand(gen, 3 * h, h, scale=h ** -0.5), _rand(gen, 3 * h, scale=0.1)
    proj_w, proj_b, dy = _rand(gen, h, h, scale=h ** -0.5), _rand(gen, h, scale=0.1), _rand(gen, s, b, h)
    ref = _reference(lambda **kw: _attention(heads=a, **kw), dy, x=x, qkv_w=qkv_w, qkv_b=qkv_b, proj_w=proj_w,
                     proj_b=proj_b)
    pattern = {"forward": [("all_reduce", s * b * h)], "backward": [("all_reduce", s * b * h)]}
    # Korthikanti et al. 2022 (section 4.2.1): attention keeps 11sbh + 5as²b bytes in 16-bit, per rank with
    # tensor parallelism 2sbh + 8sbh/t + 5as²b/t (the output dropout's mask belongs to the replicated 10sbh).
    # Here: no dropout, so no as²b/t mask and the "dropout output" that attention multiplies V by is the
    # softmax output itself (2as²b/t, once, not twice); attention_core adds nothing: the scale multiplies by
    # a number and the causal mask is added (neither is saved), and the contiguous q, k, v that its matmuls
    # keep are the paper's Q, K, V terms. float64 is 4x wider than 16-bit.
    wide, t = x.element_size() / 2, world
    activations = (wide * (s * b * h * (2 + 8 / t) + 2 * a * s * s * b / t),
                   f"Korthikanti et al.'s attention terms with t={t}, in 16-bit: the QKV input 2sbh (replicated), "
                   f"Q and K 4sbh/t, V 2sbh/t, the projection input 2sbh/t, the softmax output 2as²b/t of this "
                   f"rank's a/t heads; no dropout here, so neither the as²b/t mask nor a second 2as²b/t for the "
                   f"dropped scores; x{wide:.0f} in {str(x.dtype).replace('torch.', '')}",
                   "a rank should keep only its own heads' q, k, v, scores and output, each once, h/N wide: "
                   "use attention_core on this rank's qkv and row_parallel_linear on its [s, b, h/N] output.")
    gqw, gqb, gpw = _qkv_shards(ref["qkv_w"], world), _qkv_shards(ref["qkv_b"], world), ref["proj_w"].chunk(world, 1)
    expected = [{"output": ref["output"], "x.grad": ref["x"], "qkv_w.grad": gqw[r], "qkv_b.grad": gqb[r],
                 "proj_w.grad": gpw[r], "proj_b.grad": ref["proj_b"]} for r in range(world)]
    qkv_ws, qkv_bs, proj_ws = _qkv_shards(qkv_w, world), _qkv_shards(qkv_b, world), proj_w.chunk(world, 1)

    def part(t: torch.Tensor, r: int) -> torch.Tensor:
        return F.linear(attention_core(F.linear(t, qkv_ws[r], qkv_bs[r]), a // world), proj_ws[r])
    args = (per_rank([_req(x)[0] for _ in range(world)]), per_rank(_req(*qkv_ws)),
            per_rank(_req(*qkv_bs)), per_rank(_req(*proj_ws)),
            per_rank([_req(proj_b)[0] for _ in range(world)]), a,
            per_rank([Upstream(dy, pattern, activations, ref["output"])] * world))
    return Case(world, args, expected, _label(world, s, b, h, f", {a} heads"),
                budgets=_bytes_budgets(pattern, world, "g's forward and f's backward"),
                allowed_ops=frozenset({"all_reduce"}),
                factors={"√d, the attention scale": (h // a) ** 0.5, "a, the attention heads": a},
                explain=_either(_attention_explain(x, qkv_ws, qkv_bs, proj_ws, proj_b, a, world),
                                _placement_explain(x, dy, proj_b, world, part, "the qkv projection",
                                                   "the output projection")))


class _Attention(torch.nn.Module):
    """torchtitan's layout: separate q, k, v projections (a fused qkv cannot be split evenly by
    ColwiseParallel: rank 0 would get all of q)."""

    def __init__(self, q, k, v, proj, heads: int) -> None:
        super().__init__()
        self.q, self.k, self.v, self.proj, self.heads = q, k, v, proj, heads

    def forward(self, x):
        qkv = torch.cat([self.q(x), self.k(x), self.v(x)], dim=-1)
        return self.proj(attention_core(qkv, self.heads))


def _attention_oracle(dist, x, qkv_w, qkv_b, proj_w, proj_b, heads, upstream):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    world = dist.get_world_size()
    q, k, v = (_linear(dist, w, bias, 0, True) for w, bias in zip(qkv_w.chunk(3), qkv_b.chunk(3)))
    module = _Attention(q, k, v, _linear(dist, proj_w, proj_b, 1, False), heads // world)
    parallelize_module(module, device_mesh(dist), {"q": ColwiseParallel(), "k": ColwiseParallel(),
                                             "v": ColwiseParallel(), "proj": RowwiseParallel()})
    out = module(x)
    out.backward(upstream.grad)
    grads = [(_local(m.weight.grad), _local(m.bias.grad)) for m in (module.q, module.k, module.v)]
    return {"output": out.detach(), "x.grad": x.grad, "qkv_w.grad": torch.cat([g[0] for g in grads]),
            "qkv_b.grad": torch.cat([g[1] for g in grads]), "proj_w.grad": _local(module.proj.weight.grad),
            "proj_b.grad": _local(module.proj.bias.grad).clone()}


parallel_attention = _layer(
    "parallel_attention", _attention_case, ("x", "qkv_w", "qkv_b", "proj_w", "proj_b", "heads"),
    tools=(attention_core,),
    hints=["Heads are independent: a rank holding heads/N whole heads of q, k and v computes their attention "
           "alone. The qkv projection is column-parallel, the output projection row-parallel.",
           "qkv = column_parallel_linear(dist, x, qkv_w, qkv_b) gives [s, b, 3w] with w = h/N: this rank's q, then "
           "k, then v. attention_core(qkv, heads // N) does the rest; then row_parallel_linear with proj_w, proj_b.",
           "A head is a block of d = h/heads consecutive features: reshape [s, b, w] as [s, b, heads/N, d], "
           "never [s, b, d, heads/N]."],
    oracle=_attention_oracle, oracle_name="parallelize_module (q, k, v ColwiseParallel, proj RowwiseParallel)",
    real_scale=_layer_scale,
    variants=[{"heads_per_rank": 3}],        # neither one head per rank nor two: `heads` must be read
    describe="Causal self-attention split by heads: one all-reduce forward, one backward.")


# ---- 5. sequence parallelism ----------------------------------------------------------------------
def _sp_mlp(x, fc1_w, fc1_b, fc2_w):
    """The MLP half of a block with its residual, x + MLP(LayerNorm(x)); fc2 without bias, the norm
    without weights (their gradients would need one more all-reduce over the sequence shards)."""
    return x + _mlp(F.layer_norm(x, x.shape[-1:]), fc1_w, fc1_b, fc2_w, None)


def _sp_case(rng: random.Random, world: int, narrow: bool = False) -> Case:
    """narrow: h = 2N, where LayerNorm's share of the work is largest, so that a LayerNorm run on the whole
    sequence on every rank (replicated, not sequence-parallel) shows in the FLOPs ceiling."""
    s, b, h, _ = _shape(rng, world, *((1, 2) if narrow else ()))
    gen = _gen(rng)
    x, (w1, b1, w2, _) = _rand(gen, s, b, h), _mlp_weights(gen, h)
    dy = _rand(gen, s, b, h)
    ref, flops = counted_flops(lambda: _reference(_sp_mlp, dy, x=x, fc1_w=w1, fc1_b=b1, fc2_w=w2))
    sbh = s * b * h
    pattern = {"forward": [("all_gather", sbh), ("reduce_scatter", sbh)],
               "backward": [("all_gather", sbh), ("reduce_scatter", sbh)]}
    # Korthikanti et al. 2022 (section 4.2.2): with sequence parallelism the MLP half of the layer keeps, in
    # 16-bit, the LayerNorm input 2sbh/t, fc1's input 2sbh/t (Megatron keeps the sequence shard and all-gathers
    # it again in backward), the GeLU input 8sbh/t, fc2's input 8sbh/t and the dropout mask sbh/t: part of
    # 34sbh/t. Here fc1 keeps the gathered [s, b, h] input, so that term is 2sbh, and there is no dropout.
    wide, t = x.element_size() / 2, world
    activations = (wide * sbh * (2 / t + 2 + 8 / t + 8 / t),
                   f"Korthikanti et al.'s sequence-parallel MLP terms with t={t}, in 16-bit: the LayerNorm input "
                   f"2sbh/t (this rank's tokens; its per-token mean and 1/std fit in it), fc1's input 2sbh, the "
                   f"GeLU input 8sbh/t, fc2's input 8sbh/t; no dropout. The paper's 34sbh/t counts fc1's input as "
                   f"2sbh/t because Megatron keeps only the shard and all-gathers it again in backward; here "
                   f"fc1 keeps the gathered input, so 2sbh; x{wide:.0f} in {str(x.dtype).replace('torch.', '')}",
                   "outside the tensor-parallel region a rank keeps only its s/N tokens: LayerNorm this rank's "
                   "shard, then all-gather its output; keep one gathered [s, b, h] tensor and 1/N of the "
                   "4h-wide ones.")
    split = {"fc1_w": 0, "fc1_b": 0, "fc2_w": 1}
    expected = [{"output": ref["output"].chunk(world, 0)[r], "x.grad": ref["x"].chunk(world, 0)[r],
                 **{f"{k}.grad": ref[k].chunk(world, d)[r] for k, d in split.items()}}
                for r in range(world)]
    args = (per_rank(_req(*x.chunk(world, 0))), per_rank(_req(*w1.chunk(world, 0))),
            per_rank(_req(*b1.chunk(world, 0))), per_rank(_req(*w2.chunk(world, 1))),
            per_rank([Upstream(d, pattern, activations, o) for d, o in zip(dy.chunk(world, 0),
                                                                           ref["output"].chunk(world, 0))]))
    return Case(world, args, expected, _label(world, s, b, h, f", {s // world} tokens of the sequence per rank"),
                explain=_sp_explain(x, w1, b1, w2, world),
                budgets=_bytes_budgets(pattern, world, "the all-gather before and the reduce-scatter after the "
                                                       "tensor-parallel region, and their conjugates")
                + flops_budgets(flops / world, f"1/N of the single-device layer's forward and backward, "
                                               f"{flops:,.0f} FLOPs", over=0.05),
                allowed_ops=frozenset({"all_gather", "reduce_scatter", "all_gather_into_tensor",
                                       "reduce_scatter_tensor", "all_gather_single", "reduce_scatter_single"}))


def _sp_explain(x, w1, b1, w2, world: int):
    """sequence_parallel_mlp's explain: the residual whose block gives the learner's output (rank 0's tokens)."""
    centred = x - x.mean(-1, keepdim=True)
    norms = {"F.layer_norm": lambda: F.layer_norm(x, x.shape[-1:]),
             "unbiased": lambda: centred / x.std(-1, keepdim=True),
             "no eps": lambda: centred / x.var(-1, unbiased=False, keepdim=True).sqrt()}

    def output(residual: str = "x", norm: str = "F.layer_norm") -> torch.Tensor:
        normed = norms[norm]()
        added = {"x": x, "none": 0, "normed": normed}[residual]
        return (added + _mlp(normed, w1, b1, w2, None)).chunk(world, 0)[0]
    by_hand = ("where LayerNorm divides by the biased standard deviation (the variance over h, not h - 1) with "
               "eps = 1e-5 inside the root: use F.layer_norm(x, x.shape[-1:])")
    settings = [({"residual": "none"}, "no residual: the block returns MLP(LayerNorm(x)), where it returns x + "
                                       "MLP(LayerNorm(x)): add this rank's x after the reduce-scatter"),
                ({"residual": "normed"}, "the residual adds LayerNorm(x), the normed input, where it adds x itself, "
                                         "the block's input: x + MLP(LayerNorm(x))"),
                ({"norm": "unbiased"}, "LayerNorm written by hand with the unbiased std (torch's x.std divides by "
                                       f"h - 1) and no eps, {by_hand}"),
                ({"norm": "no eps"}, f"LayerNorm written by hand without eps, {by_hand}")]
    return _settings_explain(x, output, settings, "the block's")


class _SPMLP(torch.nn.Module):
    def __init__(self, h: int, fc1, fc2) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(h, elementwise_affine=False, dtype=torch.float64)
        self.fc1, self.fc2 = fc1, fc2

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(self.norm(x))))


def _sp_oracle(dist, x, fc1_w, fc1_b, fc2_w, upstream):
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, SequenceParallel,
                                                   parallelize_module)

    module = _SPMLP(x.shape[-1], _linear(dist, fc1_w, fc1_b, 0, True), _linear(dist, fc2_w, None, 1, False))
    parallelize_module(module, device_mesh(dist), {
        "norm": SequenceParallel(sequence_dim=0),
        "fc1": ColwiseParallel(input_layouts=Shard(0)),
        "fc2": RowwiseParallel(output_layouts=Shard(0))})
    out = x + module(x)
    out.backward(upstream.grad)
    return {"output": out.detach(), "x.grad": x.grad,
            "fc1_w.grad": _local(module.fc1.weight.grad), "fc1_b.grad": _local(module.fc1.bias.grad),
            "fc2_w.grad": _local(module.fc2.weight.grad)}


sequence_parallel_mlp = _layer(
    "sequence_parallel_mlp", _sp_case, ("x", "fc1_w", "fc1_b", "fc2_w"),
    hints=["Outside the tensor-parallel region (LayerNorm, the residual, dropout) every token is independent: "
           "each rank works on its s/N tokens. Inside it (fc1, GeLU, fc2) each rank needs all s tokens.",
           "Two new operators, conjugate like f and g: all-gather along the sequence in forward and "
           "reduce-scatter in backward; reduce-scatter in forward and all-gather in backward. They replace "
           "f and g: reduce-scatter + all-gather cost exactly one all-reduce.",
           "In [s, b, h] the sequence is dim 0, so dist.all_gather_single(out, x) with out of shape [s, b, h] "
           "and dist.reduce_scatter_single(out, y) with out of shape [s/N, b, h] work on contiguous memory "
           "(before torch 2.13: all_gather_into_tensor, reduce_scatter_tensor). "
           "Add the residual x after the reduce-scatter."],
    oracle=_sp_oracle, oracle_name="parallelize_module (SequenceParallel norm, ColwiseParallel, RowwiseParallel)",
    real_scale=functools.partial(_layer_scale, split="sequence"), variants=[{}, {"narrow": True}],
    describe="x + MLP(LayerNorm(x)) on this rank's tokens: all-gather before fc1, reduce-scatter after fc2.")


# ---- 6. vocabulary-parallel embedding and cross-entropy --------------------------------------------
def _vocab_loss(emb_w, head_w, tokens, targets):
    logits = F.linear(F.embedding(tokens, emb_w), head_w)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def _with_shard_edges(ids: torch.Tensor, vocab: int, world: int, gen: torch.Generator) -> torch.Tensor:
    """`ids` with every vocabulary shard's first and last id put in random places: an ownership test off by one at
    a shard's edge then always shows (s·b >= 2N, so they all fit)."""
    part = vocab // world
    edges = torch.tensor([i for r in range(world) for i in (r * part, (r + 1) * part - 1)])
    flat = ids.flatten().clone()
    flat[torch.randperm(flat.numel(), generator=gen)[:len(edges)]] = edges
    return flat.view_as(ids)


def _vocab_case(rng: random.Random, world: int, logit_scale: Optional[float] = None) -> Case:
    """Logits of about ±logit_scale (random when not given): at 1e4, exp overflows without the max subtracted."""
    s, b, h = world * rng.randint(2, 3), rng.randint(1, 2), rng.choice([4, 8])
    vocab = world * 32 * rng.randint(2, 3)              # logits dominate memory, as in a real LM head
    gen = _gen(rng)
    tokens = _with_shard_edges(torch.randint(vocab, (s, b), generator=gen), vocab, world, gen)
    targets = _with_shard_edges(torch.randint(vocab, (s, b), generator=gen), vocab, world, gen)
    scale = logit_scale or 10 ** rng.uniform(0, 4)
    emb_w, head_w = _rand(gen, vocab, h), _rand(gen, vocab, h, scale=scale * h ** -0.5)
    ref = _reference(lambda emb_w, head_w: _vocab_loss(emb_w, head_w, tokens, targets), torch.tensor(1.0,
                     dtype=torch.float64), emb_w=emb_w, head_w=head_w)
    ge, gh = ref["emb_w"].chunk(world, 0), ref["head_w"].chunk(world, 0)
    expected = [{"output": ref["output"], "emb_w.grad": ge[r], "head_w.grad": gh[r]} for r in range(world)]
    one = torch.tensor(1.0, dtype=torch.float64)
    args = (tokens, targets, per_rank(_req(*emb_w.chunk(world, 0))), per_rank(_req(*head_w.chunk(world, 0))),
            Upstream(one))
    sb, sbh, part = s * b, s * b * h, vocab // world
    # Megatron-LM: all-reduce the embedding (sbh) and three scalars per token (max, sum of exponentials,
    # target logit) in forward; all-reduce the gradient of the head's input (sbh) in backward.
    sent = _ring("all_reduce", sbh, world) * 2 + 3 * _ring("all_reduce", sb, world)
    why_bytes = ("one all-reduce of s·b·h for the embedding and one for the head input's gradient, three of s·b "
                 "for the softmax statistics")
    # Memory: the inputs and weight shards with their gradients, a few [s, b, h] activations, and at most
    # LOGIT_COPIES [s, b, V/N] tensors alive at once (logits, exponentials, their gradient...).
    held = 2 * sb * 8 + 4 * part * h * ITEM + 6 * sbh * ITEM + 16 * sb * ITEM
    memory = held + LOGIT_COPIES * sb * part * ITEM
    why_mem = (f"{LOGIT_COPIES} tensors of this rank's logits shard s·b·V/N = {fmt_bytes(sb * part * ITEM)} "
               f"alive at once, plus inputs, weight shards, their gradients and s·b·h activations "
               f"({fmt_bytes(held)}); the full logits are {fmt_bytes(sb * vocab * ITEM)}")
    return Case(world, args, expected, _label(world, s, b, h, f", vocabulary {vocab}, logits of about ±{scale:.3g}"),
                factors={"s·b, the tokens": sb},
                explain=_vocab_explain(tokens, targets, emb_w.chunk(world, 0), head_w.chunk(world, 0)),
                # The floor first: below it, bytes went by some other way than dist, whatever the memory says. Then
                # memory: it is the point of this puzzle (a gather also sends too much).
                budgets=[_vocab_floor(tokens, h, sb), Budget("peak_memory", memory, why_mem,
                                hint="never build [s, b, V]: reduce the max, the sum of exponentials and the "
                                     "target's logit across ranks instead, each [s, b]."),
                         Budget("bytes_sent", sent, why_bytes), Budget("bytes_received", sent, why_bytes)])


# Where an id a rank does not own lands in its shard, if it is not masked: the ways of shifting it by the shard's
# first id.
LANDINGS = {"its local row 0, where torch.where(mine, ids - first, 0) sends them": lambda ids, first, part: torch.where(
                (ids >= first) & (ids < first + part), ids - first, 0),
            "the shard's first or last row, where (ids - first).clamp(0, V/N - 1) sends them":
                lambda ids, first, part: (ids - first).clamp(0, part - 1),
            "local row id mod V/N, where ids % (V/N) sends them": lambda ids, first, part: ids % part}


def _vocab_loss_parallel(tokens, targets, emb_ws, head_ws, *, embedding_masked: bool = True,
                         target_masked: bool = True, land: Callable = LANDINGS[next(iter(LANDINGS))],
                         shifted: Union[bool, str] = True) -> torch.Tensor:
    """The vocabulary-parallel loss computed rank by rank, with the ownership test of the embedding's lookup or of
    the target's logit left out if asked (each rank then uses the row an id it does not own lands on). Unmasked, the
    target's logit keeps N - 1 times the maximum subtracted (`shifted`), where the mask would cancel it."""
    part = len(emb_ws[0])
    firsts = [r * part for r in range(len(emb_ws))]

    def own(ids, first):
        return ((ids >= first) & (ids < first + part)).unsqueeze(-1)

    x = sum(F.embedding(land(tokens, f, part), e) * (own(tokens, f) if embedding_masked else 1)
            for f, e in zip(firsts, emb_ws))
    logits = [F.linear(x, w) for w in head_ws]
    if shifted == "local":      # each rank's own maximum, never all-reduced: the shards' exponentials disagree
        logits = [z - z.amax(-1, keepdim=True) for z in logits]
    elif shifted:       # as the hints lay it out: the maximum over the whole vocabulary subtracted on every rank
        top = torch.cat(logits, -1).amax(-1, keepdim=True)
        logits = [z - top for z in logits]
    target = sum(z.gather(-1, land(targets, f, part).unsqueeze(-1)) * (own(targets, f) if target_masked else 1)
                 for f, z in zip(firsts, logits))
    return (torch.cat(logits, -1).logsumexp(-1) - target.squeeze(-1)).mean()


def _vocab_explain(tokens, targets, emb_ws, head_ws):
    """vocab_parallel_loss's explain: the use of the ownership test (the embedding's lookup, the target's logit) whose
    absence gives the learner's loss, and where the unowned ids landed."""
    settings = [({"embedding_masked": False, "land": land},
                 f"every rank adds an embedding row for ids it does not own (they land on {where}) into the sum over "
                 "the ranks: only the rank that owns an id may contribute its row; the others add zeros")
                for where, land in LANDINGS.items()]
    settings += [({"target_masked": False, "land": land, "shifted": shifted},
                  f"every rank adds its logit at the target's row even for targets it does not own (they land on "
                  f"{where}): only the owner's logit may enter the target's sum; the others add 0")
                 for where, land in LANDINGS.items() for shifted in (True, False)]
    settings += [({"shifted": "local"}, "each rank subtracts its own shard's maximum, so the shards' exponentials "
                                        "are scaled by different factors before they are summed: all-reduce the "
                                        "maximum (ReduceOp.MAX) first, and subtract that one on every rank")]

    def explain(expected: list, got: list) -> Optional[str]:
        mine = got[0].get("output") if isinstance(got[0], dict) else None
        if not isinstance(mine, torch.Tensor) or mine.numel() != 1:
            return None
        with torch.no_grad():
            for setting, meaning in settings:
                if _same(mine.reshape(()), _vocab_loss_parallel(tokens, targets, emb_ws, head_ws, **setting)):
                    return f"Diagnosis: your loss is the vocabulary-parallel loss with one setting changed: {meaning}."
        if _same(mine.reshape(()), expected[0]["output"].reshape(())) and all(
                isinstance(g, dict) and _same(g.get("emb_w.grad"), own)
                for g, own in zip(got, _embedding_grads_through_own_head(tokens, targets, emb_ws, head_ws))):
            return ("Diagnosis: the loss is right, and each rank's emb_w.grad holds only the gradient that flows back "
                    "through its own head shard's logits: the embedding's output reaches every rank's head, so its "
                    "gradient is the sum over the ranks. Put f (identity forward, all-reduce backward) between the "
                    "embedding and the head.")
        return None
    return explain


def _embedding_grads_through_own_head(tokens, targets, emb_ws, head_ws) -> list[torch.Tensor]:
    """Each rank's embedding gradient when the head input's gradient is not summed over the ranks (no f between the
    embedding and the head): rank r's rows get only what its own logits send back."""
    part, land = len(emb_ws[0]), LANDINGS[next(iter(LANDINGS))]
    with torch.enable_grad():
        embs = [e.detach().clone().requires_grad_() for e in emb_ws]
        rows = [F.embedding(land(tokens, r * part, part), e)
                * ((tokens >= r * part) & (tokens < (r + 1) * part)).unsqueeze(-1) for r, e in enumerate(embs)]
        x = sum(t.detach() for t in rows).requires_grad_()
        logits = [F.linear(x, w.detach()) for w in head_ws]
        flat = torch.cat(logits, -1)
        loss = F.cross_entropy(flat.flatten(0, 1), targets.flatten())
        pulled = torch.autograd.grad(loss, logits)
        return [torch.autograd.grad(rows[r], embs[r], pulled[r] @ head_ws[r].detach())[0] for r in range(len(embs))]


def _vocab_floor(tokens: torch.Tensor, h: int, sb: int) -> Budget:
    """What any algorithm sends at least, per rank (the reference sends about twice as much: its all-reduces move
    2(N-1)/N of their buffers). Each distinct id among the tokens has one owner: in forward the owner sends its row
    out (no one else has it), in backward every other rank sends out its share of the row's gradient (only its
    head shard gives it), so each id costs every rank h numbers one way or the other. The loss needs, per token, a
    log-sum-exp over the whole vocabulary: every rank sends out its part of it, one number per token at least (a
    max and a sum of exponentials, all-reduced, are two; a ring merging (max, sum) pairs is one). The target logits
    need only their sum over tokens, one number."""
    distinct = int(tokens.unique().numel())
    return Floor("bytes_sent", (distinct * h + sb) * ITEM,
                 f"the least any algorithm sends: h = {h} numbers for each of the {distinct} distinct token ids "
                 f"(its row forward from its owner, or its gradient's share back to it) and one per token for "
                 f"the softmax's normaliser, s·b = {sb}",
                 hint="the embedding rows, the softmax statistics and the head input's gradient travel between "
                      "ranks by dist: separate processes share nothing else.")


LOGIT_COPIES = 4


class _VocabModel(torch.nn.Module):
    def __init__(self, emb, head) -> None:
        super().__init__()
        self.tok, self.head = emb, head

    def forward(self, tokens):
        return self.head(self.tok(tokens))


def _vocab_oracle(dist, tokens, targets, emb_w, head_w, upstream):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel, loss_parallel,
                                                   parallelize_module)

    full_emb, full_head = _gather_full(dist, emb_w, 0), _gather_full(dist, head_w, 0)
    emb = torch.nn.Embedding(*full_emb.shape, dtype=full_emb.dtype, device=full_emb.device)
    head = torch.nn.Linear(full_head.shape[1], full_head.shape[0], bias=False, dtype=full_head.dtype,
                           device=full_head.device)
    with torch.no_grad():
        emb.weight.copy_(full_emb)
        head.weight.copy_(full_head)
    model = _VocabModel(emb, head)
    parallelize_module(model, device_mesh(dist), {"tok": RowwiseParallel(input_layouts=Replicate()),
                                             "head": ColwiseParallel(output_layouts=Shard(-1),
                                                                     use_local_output=False)})
    logits = model(tokens)
    with loss_parallel():
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
    rank, world = dist.get_rank(), dist.get_world_size()
    # The embedding's weight gradient may come back in another placement than its weight: take our rows.
    emb_grad = model.tok.weight.grad.full_tensor().chunk(world, 0)[rank]
    return {"output": _local(loss).detach().reshape(()), "emb_w.grad": emb_grad,
            "head_w.grad": _local(model.head.weight.grad)}


vocab_parallel_loss = _layer(
    "vocab_parallel_loss", _vocab_case, ("tokens", "targets", "emb_w", "head_w"),
    hints=["Rank r holds vocabulary rows [r·V/N, (r+1)·V/N) of both the embedding and the head. Embedding: look "
           "up the tokens this rank owns, zeros for the others, and sum over ranks (g). Head: column-parallel "
           "(f), giving this rank's slice of the logits.",
           "Cross-entropy = log Σ_v exp(z_v) − z_target. Subtract the row maximum (all-reduce with "
           "dist.ReduceOp.MAX, no gradient needed), then all-reduce Σ exp over this rank's slice, and the target's "
           "logit (only the owning rank contributes, the others add 0). Both all-reduces need g's backward.",
           "loss = (sumexp.log() - target_logit).mean() with sumexp and target_logit each Reduce.apply(...) of "
           "an [s, b] tensor: every rank holds the same loss, and backward gives each rank the gradient of "
           "its own logits slice, softmax − one-hot, without ever building [s, b, V]."],
    oracle=_vocab_oracle, oracle_name="parallelize_module with loss_parallel()", variants=[{"logit_scale": 1e4}],
    describe="Mean cross-entropy of a vocabulary-parallel embedding and head, never gathering the logits.")


PUZZLES = [column_parallel_linear, row_parallel_linear, megatron_mlp, parallel_attention, sequence_parallel_mlp,
           vocab_parallel_loss]
