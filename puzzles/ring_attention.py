"""Notebook 08, ring attention and context parallelism: the puzzles, their inputs, references and budgets.

Layout everywhere (b, h, s, d): batch, heads, sequence, head size, as F.scaled_dot_product_attention; float64,
so that every comparison is strict. Expected results come from PyTorch's attention on the whole sequence (the
log-sum-exp from its CPU flash kernel); budgets from the algorithm's formulas for the case at hand: chunks of
(s/N)·d, tiles of block², the bytes of K and V, the cost model's block times (lib.analytic.context_parallel).
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from typing import Optional

import torch
import torch.nn.functional as F

from lib.checker.puzzle import Budget, Case, Contract, Floor, Puzzle
from lib.analytic.context_parallel import LINKS, Shard, block_times, min_tokens_to_overlap, stand_in
from lib.checker.contract import communication_hidden, flops_at_most, flops_balanced, right, sends_to
from lib.device import device
from lib.diagnose import Mistake
from lib.notebook.warm_up import import_ahead
from lib.checker.measure import counted_flops, counted_time
from lib.sim import CostModel, per_rank
from lib.units import fmt_bytes, fmt_time
from puzzles.attended import CAUSAL, FULL, MASKED, NONE, OWN_V, RING, STRICT, Queries, Unit, explain_attention

import_ahead("explicit_gradient")          # the backward puzzle's reference back-propagates dout

NOTEBOOK = "08_ring_attention"
P2P = frozenset({"send", "recv"})
ITEM = 8                       # float64
LARGE = 1e4                    # logits of this scale overflow exp() in any precision
# Logits near LARGE whose blocks differ by a few dozen: there every term of a merge shows. Each query scales its
# logits by its own factor in NEAR_SPREAD (log-sum-exps from 5e3 to 2e4) and a key's rise along the sequence, so
# that two key blocks' log-sum-exps differ by about NEAR_GAP × that factor for some query of every case: an
# approximate merge (the smaller block's term dropped when it is e^-12 of the larger) is then off by more than the
# comparison allows, which a relative tolerance at 1e4 would not see.
NEAR = "near"
NEAR_SPREAD = (0.5, 2.0)
NEAR_GAP = 16.0
FAR_PAIR = (13.0, 19.0)     # a pair of blocks' log-sum-exps this far apart: e^-19 = 5.6e-9 still above 1e-9
# torch's fused attention kernels, on the CPU and on GPUs: each would do the lesson's work for the answer.
KERNELS = ("scaled_dot_product", "_scaled_dot_product", "_flash_attention", "_efficient_attention",
           "_cudnn_attention")
REFUSED = (KERNELS, "here the attention is yours to compute (matmuls, exp, logsumexp); PyTorch's is the reference")
# A puzzle that computes attention: those kernels refused, its float64 results compared within 1e-9.
# Compared within 1e-9 absolutely (rtol 0): a log-sum-exp near 1e4 must be as exact as any other number, since the
# weights e^lse it stands for are wrong by the same factor; within a relative 1e-9 it could be off by 1e-5 there.
_attention_puzzle = functools.partial(Puzzle, refuse=REFUSED, rtol=0.0, atol=1e-9)
GATHERED = "PyTorch's attention on the gathered K and V"
OUT_AND_LSE = {"[0]": "the output", "[1]": "the log-sum-exp"}       # what an attention puzzle's two results are


def _scale_factor(d: int) -> dict[str, float]:
    """The case's quantity a wrong factor of attention may equal: √d, the scores' scale."""
    return {"√d, the attention scale": math.sqrt(d)}
# What blockwise attention keeps besides its inputs and output, per (batch, head): a few block × block tiles
# (scores, their exponentials, a mask) and a few block × d rows (a tile's output, the merge's temporaries).
TILES, ROWS = 4, 8
# A ring rank's chunks of (s/N)·d per (batch, head): q, k, v and the output (4); the K/V block in use and the one
# arriving (4); a block's output and the merge's temporaries (2).
RING_CHUNKS = 10
# Of blockwise attention's rows of block × d, a ring rank needs a tile's output and its merge's (4): the merge over
# s/N rows is in RING_CHUNKS. (With 8, a rank keeping every K/V block passed at N = 6 once s/N grew to 3d or more.)
RING_BLOCK_ROWS = 4
BALANCE = 0.10                 # zigzag: the busiest rank may compute 10% more than the least busy
# zigzag: FLOPs over the 2N+1 tiles a rank must compute (chunk x chunk each), and MERGE_WORK elementwise FLOPs per
# element of (out, lse) for each key block merged into a running output. The merges are priced on their own: with
# chunks of 3 tokens and blocks of 2 they cost half as much as the tiles (a slack of 0.5 on the tiles alone refused a
# right answer 1.9% over), while with chunks of 49 they cost 1%; a rank that computes the tiles it should skip
# computes 1.5 to 2.6 times the tiles and merges.
CAUSAL_SLACK = 0.2
MERGE_WORK = 6
# Over the largest tensor a ring rank needs (K and V stacked, or a tile of its queries × block keys). The ring's
# chunks hold at least 3d tokens (s/N ≥ 3d), so that a whole s/N × s/N tile is 1.2 times this budget or more.
TILE_SLACK = 0.25
OVERLAP = 0.5                  # the share of the (N-1) transfers that must be hidden behind compute
# blockwise_attention: FLOPs over the tiles it must compute (block × block each, counted as a rank counts them), for
# the merges and the output's writes. Causal attention skips the key blocks after each query block: masking them
# instead computes 1.5 to 1.8 times those tiles (4 to 7 query blocks).
BLOCKWISE_SLACK = 0.25


# ---- inputs and references ------------------------------------------------------------------------------
def _qkv(rng: random.Random, b: int, h: int, sq: int, sk: int, d: int, scale: float | str = 1.0,
         blocks: float = 2.0):
    """q, k, v of standard normal values, q times `scale`; with scale=NEAR, logits near LARGE (above) for keys that
    form about `blocks` blocks."""
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    q = torch.randn(b, h, sq, d, generator=gen, dtype=torch.float64) * (1.0 if scale == NEAR else scale)
    k, v = (torch.randn(b, h, sk, d, generator=gen, dtype=torch.float64) for _ in range(2))
    if scale == NEAR:                  # the last feature: logit(i, j) = a_i · (LARGE + rise · j / sk) + O(1)
        q[..., -1] = LARGE * d**0.5 * torch.linspace(*NEAR_SPREAD, sq, dtype=torch.float64)
        k[..., -1] = 1 + NEAR_GAP * blocks / LARGE * torch.linspace(0, 1, sk, dtype=torch.float64)
    return q, k, v


def _scale(rng: random.Random, scale: Optional[float | str]) -> float | str:
    if scale is not None:
        return scale
    return rng.choice([LARGE, NEAR, 1.0])


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False):
    """The single-device reference, on the CPU: (F.scaled_dot_product_attention's output, the log-sum-exp of
    every query's scores from torch's CPU flash kernel), both (b, h, sq, ...)."""
    q, k, v = (t.cpu() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=causal)[1]   # (b, h, sq)
    return out, lse


def _on_device(*tensors):
    """Each tensor on lib.device(), in a storage of its own (a view would carry its whole base to a rank)."""
    return tuple(t.clone().to(device()) for t in tensors)


def _math_attention(q, k, v, mask=None):
    """Attention with PyTorch's operators on any device: (output, log-sum-exp); mask True where a key is seen."""
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5                 # (b, h, sq, sk)
    if mask is not None:
        s = s.masked_fill(~mask, -math.inf)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), s.logsumexp(-1)


def _tile(q, k, v, causal: bool = False):
    """Attention of q against one block of keys with its scores in full: the work one ring step must do."""
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5                 # (b, h, sq, sk)
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), -math.inf)
    lse = s.logsumexp(-1)                                             # (b, h, sq)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


def _shape(rng: random.Random, heads=(1, 2, 3), dims=(4, 8)) -> tuple[int, int, int]:
    return rng.randint(1, 2), rng.choice(heads), rng.choice(dims)


def _describe(b, h, d, scale) -> str:
    logits = (f", logits near {LARGE:g}, a few dozen apart" if scale == NEAR else
              f", logits near ±{LARGE:g}" if scale != 1.0 else "")
    return f"b={b}, {h} head{'s' * (h > 1)} of d={d}, float64{logits}"


def _working_set(b: int, h: int, block: int, d: int, block_rows: int = ROWS) -> float:
    return b * h * ITEM * (TILES * block * block + block_rows * block * d)


def _memory_budget(b, h, d, block, chunks: float, rows: int, what: str, block_rows: int = ROWS) -> Budget:
    """Peak memory: `chunks` tensors of rows × d and a log-sum-exp per row, plus blockwise attention's tiles."""
    fixed = b * h * ITEM * rows * (chunks * d + 2)
    unit = fmt_bytes(b * h * ITEM * rows * d)
    return Budget("peak_memory", fixed + _working_set(b, h, block, d, block_rows),
                  f"{what}: {chunks:g} tensors of {rows} rows × d ({unit} each) and blockwise attention's "
                  f"{TILES} tiles of block² and {block_rows} rows of block × d",
                  hint="never hold a score matrix longer than block × block: loop over key blocks and merge.")


# ---- 1. merging two partial attentions ------------------------------------------------------------------
def _merge_case(rng: random.Random, _world: int, scale: Optional[float | str] = None) -> Case:
    b, h, d = _shape(rng)
    scale = _scale(rng, scale)
    while True:
        sq, s1, s2 = rng.randint(4 if scale == NEAR else 1, 9), rng.randint(1, 9), rng.randint(1, 9)
        q, k, v = _qkv(rng, b, h, sq, s1 + s2, d, scale)
        (o1, l1), (o2, l2) = attention(q, k[..., :s1, :], v[..., :s1, :]), attention(q, k[..., s1:, :], v[..., s1:, :])
        gaps = (l1 - l2).abs()
        # Near logits, some query's two blocks far apart and the smaller still counting (e^-gap above the 1e-9
        # tolerance): a merge that drops the far block, or takes the larger log-sum-exp for a far pair, fails here.
        if scale != NEAR or bool(((gaps > FAR_PAIR[0]) & (gaps < FAR_PAIR[1])).any()):
            break
    return Case(1, _on_device(o1, l1, o2, l2), [_on_device(*attention(q, k, v))],
                f"{sq} queries, blocks of {s1} and {s2} keys, {_describe(b, h, d, scale)}",
                explain=functools.partial(_merge_explained, o1, l1, o2, l2))


def _merge_explained(o1, l1, o2, l2, expected: list, got: list) -> Optional[str]:
    """A merge read against its two inputs: which log-sum-exp of the union the learner's is (the larger one, the sum
    of the two), and which mixture of the two outputs theirs is (the weights swapped, equal)."""
    answer = got[0]
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2 and all(isinstance(a, torch.Tensor) for a in answer)
            and answer[0].shape == o1.shape and answer[1].shape == l1.shape):
        return None
    out, lse = (a.detach().cpu().double() for a in answer)
    overflowed = _merge_overflowed(l1, l2, out, lse)
    if overflowed:
        return overflowed
    said = []
    readings = {"the larger of the two (max)": torch.maximum(l1, l2), "the sum of the two": l1 + l2,
                "their mean": (l1 + l2) / 2, "the first block's alone": l1, "the second block's alone": l2}
    right = torch.logaddexp(l1, l2)
    if not torch.allclose(lse, right, rtol=1e-9, atol=1e-9):
        found = next((said for said, value in readings.items() if torch.allclose(lse, value, rtol=1e-9, atol=1e-9)),
                     None)
        if found:
            said.append(f"your log-sum-exp is {found}, where the union's is the log of a sum of exponentials, "
                        "log(e^lse + e^block_lse) = torch.logaddexp(lse, block_lse)")
    unaligned = _weights_unaligned(o1, l1, o2, l2, out)
    if unaligned:
        said.append(unaligned)
    apart = o1 - o2
    spread = (apart ** 2).sum(-1)
    rows = spread > 1e-12
    w = ((out - o2) * apart).sum(-1) / spread.clamp_min(1e-300)                # out = w·o1 + (1-w)·o2, per row
    on_the_line = torch.allclose(out[rows], (w.unsqueeze(-1) * o1 + (1 - w.unsqueeze(-1)) * o2)[rows], rtol=1e-7,
                                 atol=1e-9)
    if bool(rows.any()) and on_the_line:
        weight = torch.sigmoid(l1 - l2)                                          # e^lse / e^lse_new
        mixtures = {"the two blocks' weights swapped: out gets block_out's weight, e^block_lse / e^lse_new, and "
                    "block_out gets out's": 1 - weight,
                    "the two outputs weighted alike, equal weights of one half, where each weighs its block's share "
                    "of the softmax, e^lse / e^lse_new": torch.full_like(weight, 0.5)}
        if not torch.allclose(w[rows], weight[rows], rtol=1e-7, atol=1e-9):
            found = next((said for said, value in mixtures.items()
                          if torch.allclose(w[rows], value[rows], rtol=1e-7, atol=1e-9)), None)
            if found:
                said.append(f"your output is {found}")
    return f"Diagnosis: {'; '.join(said)}." if said else _merge_unnormalised(o1, l1, o2, l2, out)


def _weights_unaligned(o1, l1, o2, l2, out) -> Optional[str]:
    """The weights, (b, h, s), multiplied into the outputs, (b, h, s, d), without a last dimension: torch lines shapes
    up from the right, so where s = d (or s = 1) row i's weight scales feature i of every row."""
    try:
        made = o1 - torch.sigmoid(l2 - l1) * (o1 - o2)
    except RuntimeError:
        return None
    right = o1 - torch.sigmoid(l2 - l1).unsqueeze(-1) * (o1 - o2)
    if made.shape != out.shape or torch.allclose(made, right) or not torch.allclose(out, made, rtol=1e-7, atol=1e-9):
        return None
    return (f"your weights, of shape {tuple(l1.shape)}, met the outputs, {tuple(o1.shape)}, without a last "
            "dimension: torch lines shapes up from the last dimension, so the weight of row i scaled feature i of "
            "every row. Give each weight its row: weight.unsqueeze(-1)")


# exp() of a number above this is inf in float64, and of one below -EXP_RANGE is 0 (so is its log's -inf)
EXP_RANGE = 709.78


def _merge_overflowed(l1, l2, out, lse) -> Optional[str]:
    """A merge that formed e^lse: the union's log-sum-exp is inf or -inf, with no NaN to trace (the engine's origin of
    a NaN says the rest), exactly where the two inputs' log-sum-exps are beyond exp's range, though the right one is
    finite: the output's weights e^(lse - inf) are then 0, which reads as memory never written."""
    lost = ~torch.isfinite(lse)
    if not bool(lost.any()):
        return _weight_overflowed(l1, l2, out, lse)
    if bool(torch.isnan(lse).any() or torch.isnan(out).any()):
        return None
    top = torch.maximum(l1.abs(), l2.abs())
    if not bool((top[lost] > EXP_RANGE).all()):
        return None
    return (f"Diagnosis: your log-sum-exp is inf or -inf on {int(lost.sum())} of {lost.numel()} rows, every one where "
            f"the blocks' log-sum-exps reach ±{float(top[lost].max()):.4g}: e^lse was formed, and exp() overflows to "
            f"inf above {EXP_RANGE} (and underflows to 0 below -{EXP_RANGE}, whose log is -inf); the output's weights "
            "e^(lse - inf) are then 0. Never exponentiate a log-sum-exp itself: torch.logaddexp(lse, block_lse), or "
            "the larger one plus log1p(exp(-gap)); then weigh by exp(lse - lse_new), which is at most 1.")


def _weight_overflowed(l1, l2, out, lse) -> Optional[str]:
    """A right log-sum-exp and an output of inf, no NaN, exactly on rows whose two log-sum-exps are more than exp's
    range apart: a weight e^(gap), against the smaller of the two, overflowed."""
    lost = torch.isinf(out).any(-1)
    if not bool(lost.any()) or bool(torch.isnan(out).any()) or not torch.allclose(lse, torch.logaddexp(l1, l2)):
        return None
    gap = (l1 - l2).abs()
    if not bool((gap[lost] > EXP_RANGE).all()):
        return None
    return (f"Diagnosis: your log-sum-exp is right, and your output is inf on {int(lost.sum())} of {lost.numel()} "
            f"rows, every one where the two log-sum-exps are more than {EXP_RANGE} apart (up to "
            f"{float(gap[lost].max()):.4g}): a weight e^(the gap), as exp(lse - the smaller) makes, overflowed. "
            "Weigh each output against the union, exp(lse - lse_new) and exp(block_lse - lse_new), each at most 1.")


def _merge_unnormalised(o1, l1, o2, l2, out) -> Optional[str]:
    """Each row of the output the right one times a factor of its own: the two weights in the right ratio,
    e^lse : e^block_lse, not divided by their sum."""
    if not bool(torch.isfinite(out).all()):
        return None
    right = o1 * torch.sigmoid(l1 - l2).unsqueeze(-1) + o2 * torch.sigmoid(l2 - l1).unsqueeze(-1)
    norm = (right ** 2).sum(-1)
    rows = norm > 1e-12
    factor = (out * right).sum(-1) / norm.clamp_min(1e-300)
    if not bool(rows.any()) or not torch.allclose(out[rows], (factor.unsqueeze(-1) * right)[rows], rtol=1e-7,
                                                   atol=1e-9):
        return None
    apart = (factor[rows] - 1).abs() > 1e-6
    if not bool(apart.any()):
        return None
    low, high = float(factor[rows].min()), float(factor[rows].max())
    return (f"Diagnosis: each row of your output is the right one times a factor of its own (from {low:.4g} to "
            f"{high:.4g}): the two outputs are weighed in the right ratio, e^lse : e^block_lse, but the weights do "
            "not sum to 1. Divide them by their sum, e^lse_new: the weights are exp(lse - lse_new) and "
            "exp(block_lse - lse_new).")


merge_attention = _attention_puzzle(
    "merge_attention", NOTEBOOK, _merge_case, world_sizes=(1, 1, 1, 1), takes_dist=False, outputs=OUT_AND_LSE,
    variants=[{"scale": LARGE}, {"scale": 1.0}, {"scale": NEAR}],
    refuse=(KERNELS, "the merge is yours to write (exp or sigmoid, log); an attention kernel run on the two "
                     "log-sum-exps does it for you"),
    hints=["Write the union's log-sum-exp first: lse_new = log(e^lse + e^block_lse), computed without ever "
           "forming e^lse (it overflows for large logits): torch.logaddexp, or the larger one plus log1p(exp(-gap)). "
           "The output is the average of the two outputs weighted by e^lse / e^lse_new and e^block_lse / e^lse_new.",
           "exp(10000) is inf in any precision. Subtract the larger of the two before exponentiating, or use the "
           "log-sigmoid form: lse_new = lse - F.logsigmoid(lse - block_lse).",
           "The weight of block_out is sigmoid(block_lse - lse): out_new = out - torch.sigmoid(block_lse - lse)"
           ".unsqueeze(-1) * (out - block_out)."],
    describe="Merge the attention of the same queries over two blocks of keys into their attention over both.")


# ---- 2. blockwise attention -----------------------------------------------------------------------------
def _blockwise_case(rng: random.Random, _world: int, causal: Optional[bool] = None,
                    scale: Optional[float] = None, remainder: bool = False, long: bool = False) -> Case:
    """`remainder`: s is never a multiple of block (elsewhere it is, two times in three), so that every check has a
    shorter last block: a loop over whole blocks only passed every case of 1 seed in 5.
    `long`: s/block of 16 to 18 at d = 2, block = 8, where a block of queries against every key at once (block × s
    scores, no key tiles) is over the budget by half again; at s/block of 4 to 6 it fit in the tiles' room."""
    b, h, d = _shape(rng, dims=(2,) if long else (4, 8))
    causal = rng.random() < 0.5 if causal is None else causal
    scale = _scale(rng, scale)
    block = 8 if long else rng.choice([6, 8])
    whole, extra = rng.randint(16, 18) if long else rng.randint(4, 6), rng.randint(1, block - 1)
    s = block * whole + (extra if remainder else rng.choice([0, 0, extra]))     # a remainder, sometimes or always
    sk = s if causal else rng.choice([s, s + rng.randint(1, 2 * block)])
    q, k, v = _qkv(rng, b, h, s, sk, d, scale, blocks=sk / block)
    expected = _on_device(*attention(q, k, v, causal))
    # q, k, v, the output, and a second copy of it: a running result per query block joined at the end (key blocks
    # in the outer loop) holds both as it joins them
    budget = _memory_budget(b, h, d, block, 5, max(s, sk), "q, k, v, the output and a running copy of it")
    return Case(1, _on_device(q, k, v) + (block, causal), [expected],
                f"{s} queries, {sk} keys, block {block}, {'causal' if causal else 'no mask'}, "
                f"{_describe(b, h, d, scale)}", budgets=[budget], factors=_scale_factor(d),
                explain=functools.partial(_blockwise_explained, q, k, v, block, causal),
                contracts=[_blockwise_flops(q, k, v, block, causal)])


def _blockwise_setup(q, k, v, block: int, causal: bool, _rank: int):
    """attended.explain_attention's view of blockwise attention: blocks of queries against blocks of keys."""
    units = [Unit(f"key block {j // block} (keys {j} to {min(j + block, k.shape[-2]) - 1})", j,
                  min(j + block, k.shape[-2])) for j in range(0, k.shape[-2], block)]
    blocks = [Queries(f"query block {i // block}", i, min(i + block, q.shape[-2]),
                      tuple(_zigzag_rule(i // block, j) if causal else FULL for j in range(len(units))))
              for i in range(0, q.shape[-2], block)]
    return q.cpu(), k.cpu(), v.cpu(), units, blocks, MASKED, None


def _blockwise_meaning(_rank: int, blocks: list, units: list) -> Optional[str]:
    """A causal mask on the tiles before the diagonal, said as the rule it breaks."""
    for queries, found in blocks:
        if found != queries.expected and FULL in queries.expected and all(
                o == CAUSAL for o, want in zip(found, queries.expected) if want == FULL):
            return ("the triangular mask applied to earlier key blocks, off the diagonal, whose keys all come "
                    "before the block's queries: only the tile on the diagonal is masked")
    return None


def _blockwise_explained(q, k, v, block: int, causal: bool, expected: list, got: list) -> Optional[str]:
    short = _tail_dropped(q.shape[-2], block, got[0])
    if short:
        return short
    return explain_attention(functools.partial(_blockwise_setup, q, k, v, block, causal), 1, got,
                             _blockwise_meaning)


def _tail_dropped(s: int, block: int, answer) -> Optional[str]:
    """An output whose rows stop at the last whole block: the shorter last block (s % block rows) never processed."""
    if not (isinstance(answer, (tuple, list)) and answer and isinstance(answer[0], torch.Tensor)):
        return None
    rows = answer[0].shape[-2] if answer[0].dim() >= 2 else None
    if s % block == 0 or rows != s // block * block:
        return None
    return (f"Diagnosis: your output has {rows} rows of the {s} queries: {s // block} whole blocks of {block}, the "
            f"last, shorter block of {s % block} rows (s is not a multiple of block) never processed. Loop "
            "range(0, s, block) and slice to the end, q[..., i:i + block, :] (a slice past the end stops there).")


def _blockwise_flops(q, k, v, block: int, causal: bool) -> Contract:
    """At most the tiles blockwise attention must compute, + BLOCKWISE_SLACK: every (query block, key block) tile, or
    with causal=True those with the key block at or before the query block (the diagonal one masked)."""
    rows = [min(block, q.shape[-2] - i) for i in range(0, q.shape[-2], block)]
    cols = [min(block, k.shape[-2] - j) for j in range(0, k.shape[-2], block)]
    area = sum(r * c for i, r in enumerate(rows) for j, c in enumerate(cols) if not causal or j <= i)
    tile = counted_flops(lambda: _tile(*(t[..., :block, :] for t in (q, k, v))))[1]
    work = tile * area / block**2
    needed = (f"the {sum(1 for i in range(len(rows)) for j in range(len(cols)) if not causal or j <= i)} tiles of "
              f"block × block scores {'at or before the diagonal ' if causal else ''}({work:,.0f} FLOPs), "
              f"+ {BLOCKWISE_SLACK:.0%} for the merges")
    return flops_at_most((1 + BLOCKWISE_SLACK) * work, needed,
                         hint="with causal=True, skip every key block after the query block: compute it under a "
                              "mask and it costs as much as a tile the queries see.")


def _blockwise_oracle(q, k, v, block, causal):
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril() if causal else None
    return _math_attention(q, k, v, mask)


blockwise_attention = _attention_puzzle(
    "blockwise_attention", NOTEBOOK, _blockwise_case, world_sizes=(1, 1, 1, 1), takes_dist=False, outputs=OUT_AND_LSE,
    variants=[{"causal": False, "scale": LARGE}, {"causal": True, "scale": LARGE},
              {"causal": True, "scale": 1.0, "remainder": True, "long": True}, {"causal": True, "scale": NEAR}],
    oracle=lambda _dist, *args: _blockwise_oracle(*args), oracle_name="PyTorch's attention",
    hints=["Loop over blocks of `block` queries; for each, loop over blocks of `block` keys: scores of the tile, "
           "its log-sum-exp, its output exp(scores - lse) @ v, merged into the running (out, lse) with "
           "merge_attention.",
           "With causal=True, query i sees keys 0..i: key blocks after the query block are skipped, and the tile "
           "on the diagonal masks scores above its diagonal with -inf (torch.ones(...).triu(1)).",
           "Fill out = torch.empty_like(q) and lse = q.new_empty(q.shape[:-1]) one query block at a time; the last "
           "block may be shorter (slicing past the end is fine)."],
    describe="Attention of q over k and v computed tile by tile, with its log-sum-exp, never holding s × s scores.")


# ---- 3-5. the ring --------------------------------------------------------------------------------------
def _ring_rules(n: int) -> list[Contract]:
    return [sends_to(right, "a ring passes K and V to its right neighbour only, rank (r + 1) % N",
                          hint="send to (rank + 1) % N and receive from (rank - 1) % N, every step.")]


def _exactly(ceiling: Budget, hint: str) -> list[Budget]:
    """`ceiling` and the same bytes as a floor: what the algorithm moves must go through dist, not around it (a
    module-level dict, Python numbers taken out of tensors), which no ceiling alone can see."""
    return [ceiling, Floor(ceiling.metric, ceiling.limit, ceiling.why, hint=hint)]


def _kv_budget(b, h, rows, d, n) -> list[Budget]:
    block = 2 * b * h * rows * d * ITEM
    return _exactly(Budget("bytes_sent", (n - 1) * block,
                           f"N-1 = {n - 1} steps × K and V of one rank ({fmt_bytes(block)}): (N-1)/N of the whole K "
                           f"and V",
                           hint="pass the K/V block you just used, once per step; never the queries or the output."),
                    hint="K and V reach the other ranks through dist only: send your block to the right, N-1 times.")


def _ring_inputs(rng, n: int, b, h, d, scale, causal=False, pairs=(3, 8), blocks_per_rank: float = 2.0):
    """Each rank's q, k, v (contiguous chunks, or chunks r and 2N-1-r with causal) and the expected results; a chunk
    holds a number of token pairs drawn from `pairs` (tokens, with causal); a rank's keys form about
    `blocks_per_rank` blocks (scale=NEAR)."""
    chunk = rng.randint(*pairs) * (1 if causal else 2)
    s = n * chunk * (2 if causal else 1)
    q, k, v = _qkv(rng, b, h, s, s, d, scale, blocks=n * blocks_per_rank)
    out, lse = attention(q, k, v, causal)
    if causal:
        def split(t):
            parts = t.split(chunk, 2)                                  # 2N chunks along the sequence
            return [torch.cat([parts[r], parts[2 * n - 1 - r]], 2).to(device()) for r in range(n)]
    else:
        def split(t):
            return [c.clone().to(device()) for c in t.split(chunk, 2)]   # N chunks, each its own storage
    return (split(q), split(k), split(v)), list(zip(split(out), split(lse))), chunk


def _largest_tensor_budget(b, h, rows, d, block, stacked: str, chunks: int, hint: str) -> Budget:
    """The largest single tensor a rank needs, per (batch, head): `chunks` tensors of rows × d in one (`stacked`,
    e.g. K and V stacked for one message), or a tile of rows × block scores (its queries against a block of keys)."""
    return Budget("largest_tensor", b * h * ITEM * max(chunks * rows * d, rows * block) * (1 + TILE_SLACK),
                  f"the larger of {stacked} stacked ({chunks} × {rows} rows × d) and a tile of your {rows} queries × "
                  f"block = {block} keys, per head, + {TILE_SLACK:.0%}", hint=hint)


RING_TILES = ("attend to each K/V block tile by tile, `block` keys at a time (your blockwise_attention): a block "
              "attended as one s/N × s/N tile of scores ignores `block`.")


def _ring_memory(b, h, chunk, d, block) -> list[Budget]:
    """A ring rank's largest tensor and peak memory: O(s/N · d) and block-sized tiles, never the s/N × s scores of
    every step kept for one softmax at the end."""
    return [_largest_tensor_budget(b, h, chunk, d, block, "K and V", 2, RING_TILES),
            _memory_budget(b, h, d, block, RING_CHUNKS, chunk, "O(s/N · d)", RING_BLOCK_ROWS)]


def _ring_case(rng: random.Random, n: int, scale: Optional[float] = None) -> Case:
    b, h, d = _shape(rng, dims=(4, 8))
    scale = _scale(rng, scale)
    (qs, ks, vs), expected, chunk = _ring_inputs(rng, n, b, h, d, scale, pairs=(3 * d // 2, 3 * d // 2 + 4))
    block = rng.choice([chunk // 2, chunk // 2 + 1])                  # two key blocks per chunk, one short at times
    return Case(n, (per_rank(qs), per_rank(ks), per_rank(vs), block), expected,
                f"N={n}, {chunk} tokens per rank, block {block}, {_describe(b, h, d, scale)}",
                explain=functools.partial(_ring_explained, qs, ks, vs),
                budgets=[*_kv_budget(b, h, chunk, d, n), *_ring_memory(b, h, chunk, d, block)],
                allowed_ops=P2P, contracts=_ring_rules(n))


def _ring_setup(qs: list, ks: list, vs: list, rank: int, causal: bool = False):
    """attended.explain_attention's view of a ring rank: its queries, every rank's keys gathered, and the units
    they come in. Without a mask, a unit is the block the rank holds after step t (rank (r - t) % N's)."""
    n = len(qs)
    c = ks[0].shape[-2]
    k, v = (torch.cat([t.cpu() for t in ts], -2) for ts in (ks, vs))
    units = [Unit(_held(rank, t, n), (rank - t) % n * c, (rank - t) % n * c + c) for t in range(n)]
    order = sorted(range(n), key=lambda t: units[t].start)
    units = [units[t] for t in order]
    return (qs[rank].cpu(), k, v, units, [Queries("its queries", 0, qs[rank].shape[-2], (FULL,) * n)], RING,
            vs[rank].cpu())


def _held(rank: int, step: int, n: int) -> str:
    if step == 0:
        return f"its own block (rank {rank}'s, held at step 0)"
    last = " (received last)" if step == n - 1 else ""
    return f"the block it holds after step {step}{last}, rank {(rank - step) % n}'s"


def _ring_meaning(rank: int, blocks: list, units: list) -> Optional[str]:
    """What a ring's attended blocks say of its loop: the last block only (replaced, never merged), all but the last
    (attended before it arrived), V left behind."""
    (_, found), = blocks
    seen = [u.name for u, o in zip(units, found) if o != NONE]
    if len(seen) == 1 and "received last" in seen[0] and FULL in found:
        return ("the last block only: each step's attention replaced the running (out, lse) instead of being merged "
                "into it (merge_attention), so the earlier blocks never count")
    if all("received last" not in name for name in seen) and found.count(FULL) == len(units) - 1:
        return "N-1 of the N blocks: the loop passes each block on, and the one received last is never attended"
    if any(o == OWN_V for o in found):
        return "V never travels with K: pass both, stacked in one message (torch.stack([k, v]))"
    return None


def _ring_explained(qs: list, ks: list, vs: list, expected: list, got: list) -> Optional[str]:
    return (explain_attention(functools.partial(_ring_setup, qs, ks, vs), len(qs), got, _ring_meaning)
            or _lse_of_some_blocks(qs, ks, expected, got))


def _lse_of_some_blocks(qs: list, ks: list, expected: list, got: list) -> Optional[str]:
    """A right output beside a log-sum-exp that is that of some ranks' K/V blocks alone (each block's read from the
    case's q and k, every subset tried): the lse a merge returned was dropped after those blocks."""
    n = len(qs)
    for rank, (want, answer) in enumerate(zip(expected, got)):
        if not (isinstance(answer, (tuple, list)) and len(answer) == 2
                and all(isinstance(t, torch.Tensor) for t in answer)):
            return None
        out, lse = (t.detach().cpu().double() for t in answer)
        if out.shape != want[0].shape or lse.shape != want[1].shape or not torch.allclose(
                out, want[0].cpu().double(), rtol=1e-5, atol=1e-6):
            return None
        if torch.allclose(lse, want[1].cpu().double(), rtol=1e-5, atol=1e-6):
            continue
        q = qs[rank].cpu().double()
        blocks = torch.stack([torch.logsumexp(q @ k.cpu().double().transpose(-2, -1) * q.shape[-1] ** -0.5, -1)
                              for k in ks])                                                # (N, b, h, s/N)
        for size in range(1, n):
            for held in itertools.combinations(range(n), size):
                if torch.allclose(lse, blocks[list(held)].logsumexp(0), rtol=1e-5, atol=1e-6):
                    which = ", ".join(map(str, held))
                    return (f"Diagnosis: on rank {rank}, the output is right and the log-sum-exp is that of rank"
                            f"{'s' if size > 1 else ''} {which}'s K/V block{'s' if size > 1 else ''} alone, of the "
                            f"N = {n}: the log-sum-exp merge_attention returned was not kept (out, lse = "
                            "merge_attention(out, lse, block_out, block_lse) keeps both), though the output was.")
        return None
    return None


def _gathered(dist, t):
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return parts


def _ring_oracle(dist, q, k, v, _block):
    return _math_attention(q, torch.cat(_gathered(dist, k), 2), torch.cat(_gathered(dist, v), 2))


RING_HINTS = [
    "Step 0: attend your queries to your own k and v with blockwise_attention. Then, N-1 times: send the K/V block "
    "you hold to rank (r+1) % N, receive the next one from rank (r-1) % N, attend to it, merge with merge_attention.",
    "A blocking send on every rank at once waits forever: post w = dist.isend(kv, right), then dist.recv(buf, left), "
    "then w.wait(). torch.stack([k, v]) makes one message of both.",
    "After step t, rank r holds the keys of rank (r - t) % N. With no mask, the order of the blocks does not matter: "
    "the merge is associative and commutative."]


ring_attention = _attention_puzzle(
    "ring_attention", NOTEBOOK, _ring_case, world_sizes=(2, 3, 4, 6), variants=[{"scale": LARGE}, {"scale": NEAR}],
    outputs=OUT_AND_LSE,
    oracle=_ring_oracle, oracle_name=GATHERED, hints=RING_HINTS,
    describe="Each rank's queries attend to every rank's keys, passing K and V around the ring.")


def _overlap_case(rng: random.Random, n: int, scale: Optional[float | str] = None) -> Case:
    b, h, d = 1, 2, 8
    (qs, ks, vs), expected, chunk = _ring_inputs(rng, n, b, h, d, _scale(rng, scale), blocks_per_rank=1)
    link = rng.choice(sorted(LINKS))
    base = CostModel()
    at_least = min_tokens_to_overlap(base.flops_per_s, LINKS[link])
    tokens = 1024 * math.ceil(at_least * rng.uniform(1.3, 1.8) / 1024)
    real = Shard(tokens=tokens, heads=32, head_dim=128)
    small = Shard(tokens=chunk, heads=h, head_dim=d, batch=b, item=ITEM)
    _, flops = counted_flops(lambda: _tile(qs[0], ks[0], vs[0]))
    cost = stand_in(flops, small.block_bytes, real, base, LINKS[link])
    transfer = block_times(small, cost)[1]                          # K and V of one rank, latency included
    limit = (1 - OVERLAP) * (n - 1) * transfer
    why = (f"a block computes in {fmt_time(cost.compute_time(flops))} and travels in {fmt_time(transfer)}, so "
           f"overlap can hide all N-1 = {n - 1} transfers; the budget is {1 - OVERLAP:g} of them")
    return Case(n, (per_rank(qs), per_rank(ks), per_rank(vs), chunk), expected,
                f"N={n}, timed as {fmt_tokens(tokens)} tokens per rank, 32 heads of 128, bf16, on H100s "
                f"over {link}", budgets=[*_kv_budget(b, h, chunk, d, n), *_ring_memory(b, h, chunk, d, chunk),
                                         _overlap_time(qs[0], ks[0], vs[0], n, cost, limit)],
                cost=cost, allowed_ops=P2P, explain=functools.partial(_ring_explained, qs, ks, vs),
                contracts=_ring_rules(n) + [communication_hidden(
                    limit, "K/V transfers", why, hint="post the next block's isend/irecv before computing on "
                                                      "the current block, and wait for them only after.")])


MERGE_PASSES = (4, 6)          # a merge's elementwise passes: over a (b, h, s/N, d) output, over its (b, h, s/N) lse


def _overlap_time(q, k, v, n: int, cost: CostModel, exposed: float) -> Budget:
    """The run's time: N blocks computed one after another, N-1 merges, and no more waiting than the overlap
    contract allows. Waiting hidden behind work that is not the next block (the block computed twice, busy work
    while the transfer runs) lowers the exposed time without shortening the run: this is where it shows."""
    tile = counted_time(lambda: _tile(q, k, v), cost)[1]
    out, lse = q.clone(), q[..., 0].clone()
    merge = sum(counted_time(lambda t=t: t + t, cost)[1] * passes for t, passes in zip((out, lse), MERGE_PASSES))
    limit = n * tile + (n - 1) * merge + exposed
    return Budget("time", limit,
                  f"N = {n} blocks of {fmt_time(tile)} one after another, N-1 merges of {fmt_time(merge)} and the "
                  f"{fmt_time(exposed)} of waiting the overlap allows",
                  hint="the next block's transfer must run under the current block's own compute: post "
                       "isend/irecv, attend to the block you hold, then wait. Work added only to cover the wire "
                       "makes the run longer, not shorter.")


def fmt_tokens(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else f"{n:,}"


ring_attention_overlap = _attention_puzzle(
    "ring_attention_overlap", NOTEBOOK, _overlap_case, world_sizes=(2, 4, 8), oracle=_ring_oracle, outputs=OUT_AND_LSE,
    variants=[{"scale": NEAR}],
    oracle_name=GATHERED,
    hints=["At the start of each step (but the last), post the transfer of the block you hold with dist.isend and "
           "dist.irecv, then compute on it while it travels; wait for both before the next step.",
           "The block you send is the one you compute on: sending only reads it, so both can happen at once. "
           "Receive into a fresh buffer, not into the block in use.",
           "kv = torch.stack([k, v]); each step: nxt = torch.empty_like(kv); works = [dist.isend(kv, right), "
           "dist.irecv(nxt, left)]; attend to kv; for w in works: w.wait(); kv = nxt."],
    describe="Ring attention whose next K/V transfer runs while the current block computes.")


def _zigzag_case(rng: random.Random, n: int, scale: Optional[float] = None) -> Case:
    b, h, d = _shape(rng)
    scale = _scale(rng, scale)
    # N = 2, the cheapest ring, has chunks of more than 5d tokens and blocks of half a chunk: a whole chunk × chunk
    # tile of scores breaks the largest-tensor budget there. The others keep short chunks and blocks of about a
    # chunk, whose tiles cost a check little.
    long = n == 2
    (qs, ks, vs), expected, chunk = _ring_inputs(rng, n, b, h, d, scale, causal=True,
                                                 pairs=(5 * d + 6, 5 * d + 10) if long else (3, 8))
    block = rng.choice([chunk // 2, chunk // 2 + 1] if long else [chunk, chunk - 1, (chunk + 1) // 2])
    q, k, v = (t[..., :chunk, :] for t in (qs[0], ks[0], vs[0]))
    tile = counted_flops(lambda: _tile(q, k, v))[1]
    diagonal = counted_flops(lambda: _tile(q, k, v, causal=True))[1]
    work = (2 * n - 1) * tile + 2 * diagonal
    merged = (2 * n + 1) * -(-chunk // block)                 # key blocks merged: 2N+1 pairs of ceil(c/block) each
    merging = MERGE_WORK * merged * b * h * chunk * (d + 1)
    return Case(n, (per_rank(qs), per_rank(ks), per_rank(vs), block), expected,
                f"N={n}, causal, chunks of {chunk} tokens, block {block}, {_describe(b, h, d, scale)}",
                budgets=[*_kv_budget(b, h, 2 * chunk, d, n),
                         _largest_tensor_budget(b, h, chunk, d, block, "K and V of your two chunks", 4, ZIGZAG_TILES),
                         _memory_budget(b, h, d, block, RING_CHUNKS, 2 * chunk, "O(s/N · d)")],
                allowed_ops=P2P,
                contracts=_ring_rules(n) + [
                    flops_balanced(BALANCE, "zigzag gives every rank 2N+1 of the causal tiles",
                                   hint="skip the tiles entirely in the future of your queries; compute "
                                        "the others, masking only the two on the diagonal."),
                    flops_at_most((1 + CAUSAL_SLACK) * work + merging,
                                  f"the 2N-1 = {2 * n - 1} tiles of chunk × chunk keys and 2 diagonal tiles "
                                  f"a rank must compute, + {CAUSAL_SLACK:.0%}, and {MERGE_WORK} passes over its "
                                  f"(out, lse) for each of the {merged} key blocks it merges ((2N+1) pairs × "
                                  "ceil(chunk / block))",
                                  hint="a key chunk after a query chunk is entirely masked: skip it instead "
                                       "of computing it under a mask.")],
                parts={"zigzag chunk": (2, 2)},
                explain=functools.partial(_zigzag_explained, qs, ks, vs))


def _zigzag_rule(a: int, j: int) -> str:
    """What query chunk a sees of key chunk j under the causal mask: all of it, its diagonal, nothing."""
    return FULL if j < a else CAUSAL if j == a else NONE


def _zigzag_chunks(rank: int, n: int) -> tuple[int, int]:
    return rank, 2 * n - 1 - rank


def _zigzag_setup(qs: list, ks: list, vs: list, rank: int):
    """attended.explain_attention's view of a zigzag rank: its two query chunks, and the 2N key chunks, gathered
    in the ranks' order (rank a holds chunks a and 2N-1-a)."""
    n, c = len(qs), qs[0].shape[-2] // 2
    k, v = (torch.cat([t.cpu() for t in ts], -2) for ts in (ks, vs))
    where = {j: i * c for i, j in enumerate(j for a in range(n) for j in _zigzag_chunks(a, n))}
    units = [Unit(f"key chunk {j}", where[j], where[j] + c) for j in range(2 * n)]
    blocks = [Queries(f"query chunk {a} (its {half} chunk)", i * c, i * c + c,
                      tuple(_zigzag_rule(a, j) for j in range(2 * n)))
              for i, (a, half) in enumerate(zip(_zigzag_chunks(rank, n), ("early", "late")))]
    return qs[rank].cpu(), k, v, units, blocks, MASKED, None


def _zigzag_meaning(n: int, rank: int, blocks: list, units: list) -> Optional[str]:
    """What a zigzag rank's wrong masks say, read over both its query chunks: chunks taken for others, queries and
    keys alike (the late chunk's index, blocks taken for those of the ranks on the other side), a query chunk masked
    as another, or a causal mask on every pair."""
    def diagonal(queries: Queries) -> int:
        return next(i for i, o in enumerate(queries.expected) if o == CAUSAL)

    def owner(j: int) -> int:
        return j if j < n else 2 * n - 1 - j

    def mirrored(j: int) -> int:                # the chunk in the same half of rank 2r - owner (mod N)
        other = (2 * rank - owner(j)) % n
        return other if j < n else 2 * n - 1 - other
    # Chunks taken for others, queries and keys alike: (how each chunk was numbered, what that means)
    numbered = [(lambda j: j if j < n else n + owner(j),
                 "each rank's late chunk numbered N + r, where zigzag gives rank r chunks r and 2N-1-r: the late "
                 "chunk's index is 2N-1-r"),
                (mirrored, "each block was taken for rank (r + t) % N's: after step t the block held came from the "
                           "left, rank (r - t) % N, since each rank sends to its right")]
    for label, meaning in numbered:
        if all(f == tuple(_zigzag_rule(label(diagonal(q)), label(j)) for j in range(2 * n)) for q, f in blocks):
            return meaning
    for queries, found in blocks:
        a = diagonal(queries)
        taken = next((b for b in range(2 * n) if b != a and found == tuple(_zigzag_rule(b, j)
                                                                           for j in range(2 * n))), None)
        if taken is not None:
            return f"query chunk {a} was masked as chunk {taken} would be"
    if any(f != q.expected and all(o == CAUSAL for o, want in zip(f, q.expected) if want == FULL) for q, f in blocks):
        return "a causal mask on pairs of chunks off the diagonal, whose keys all come before the queries"
    # Where logits far apart let a few keys outweigh the rest, a chunk attended or not reads as the lesson's: a
    # numbering that accounts for every difference that does show is said, as the exact match above would be.
    for label, meaning in numbered:
        if all(all(o == want for o, want, was in zip(f, (_zigzag_rule(label(diagonal(q)), label(j))
                                                         for j in range(2 * n)), q.expected) if o != was)
               for q, f in blocks):
            return meaning
    return None


def _zigzag_explained(qs: list, ks: list, vs: list, expected: list, got: list) -> Optional[str]:
    return explain_attention(functools.partial(_zigzag_setup, qs, ks, vs), len(qs), got,
                             functools.partial(_zigzag_meaning, len(qs)))


ZIGZAG_TILES = ("attend each (query chunk, key chunk) pair with your blockwise_attention, `block` keys at a time: a "
                "pair attended as one chunk × chunk tile of scores ignores `block`.")


def _zigzag_oracle(dist, q, k, v, _block):
    n, rank = dist.get_world_size(), dist.get_rank()
    chunk = q.shape[2] // 2

    def positions(r):                                                  # global positions of rank r's 2 chunks
        return torch.cat([torch.arange(c * chunk, (c + 1) * chunk, device=q.device) for c in (r, 2 * n - 1 - r)])
    keys = torch.cat([positions(r) for r in range(n)])
    mask = keys.unsqueeze(0) <= positions(rank).unsqueeze(1)             # (2c, s): key position <= query position
    return _math_attention(q, torch.cat(_gathered(dist, k), 2), torch.cat(_gathered(dist, v), 2), mask)


zigzag_attention = _attention_puzzle(
    "zigzag_attention", NOTEBOOK, _zigzag_case, world_sizes=(2, 3, 4), variants=[{"scale": LARGE}, {"scale": NEAR}],
    outputs=OUT_AND_LSE,
    oracle=_zigzag_oracle, oracle_name="PyTorch's causal attention on the gathered K and V",
    hints=["Your q, k and v hold two chunks of c tokens: chunk r (rows :c) and chunk 2N-1-r (rows c:). The K/V "
           "block from rank src holds chunks src and 2N-1-src. Handle the four (query chunk, key chunk) pairs.",
           "Query chunk a sees key chunk j entirely when j < a, on the diagonal (causal=True) when j == a, and not "
           "at all when j > a: skip those, that is where the balance comes from.",
           "Keep a running (out, lse) per query chunk, merge each pair's blockwise_attention into it, and return "
           "torch.cat of the two along the sequence (dim 2)."],
    describe="Causal ring attention on the zigzag split, every rank doing the same work.")


# ---- 6. Ulysses: all-to-all context parallelism --------------------------------------------------------
A2A = frozenset({"all_to_all"})
# A Ulysses rank's tensors of h/N heads × s rows (as many bytes as h heads × s/N rows), as one all-to-all for q, k
# and v together needs them when it keeps its buffers until it returns: q, k and v (3), their stack (3), the
# all-to-all's buffers, sent and received (6), the head split's copy (3), the output (1), its buffers (2) and the
# result (1); and one more, for a copy a reshape of a permuted tensor makes. (12, the tensors of one all-to-all per
# input, rejected that right answer on 26 seeds in 30.)
ULYSSES_CHUNKS = 20
# Sequences long against the head size (s = N·c up to 96 tokens, d of 4 or 8), so that the budgets tell blockwise
# attention from a whole s × s score matrix per head (which passed 3 seeds in 10 with d up to 16 and c up to 16):
# with N >= 3, s / block >= 1.5 and s >= 36 > 3.75 d, so one head group's s × s scores break the largest-tensor
# budget.
ULYSSES_PAIRS = (6, 12)
ULYSSES_TILES = ("attend with your blockwise_attention, `block` keys at a time: the whole s × s score matrix of your "
                 "heads ignores `block`.")


def _ulysses_case(rng: random.Random, n: int, scale: Optional[float] = None) -> Case:
    _, _, d = _shape(rng, dims=(4, 8))
    b = 2                              # with a batch of 1, a layout that leaves the batch behind the heads is right
    h = n * rng.randint(2, 3)          # two heads per rank or more: heads dealt round-robin then differ from blocks
    scale = _scale(rng, scale)
    (qs, ks, vs), expected, chunk = _ring_inputs(rng, n, b, h, d, scale, pairs=ULYSSES_PAIRS, blocks_per_rank=1)
    block = rng.choice([chunk, chunk + 1, 2 * chunk - 1])
    size = b * h * chunk * d * ITEM
    traffic = _exactly(Budget("bytes_sent", 4 * (n - 1) / n * size,
                              f"4 all-to-alls (q, k, v there, the output back) × (N-1)/N × {fmt_bytes(size)}",
                              hint="one all-to-all per tensor: q, k and v to a head split, the output back to a "
                                   "sequence split."),
                       hint="q, k and v reach their heads' owners through the all-to-all only, and the output "
                            "comes back the same way.")
    return Case(n, (per_rank(qs), per_rank(ks), per_rank(vs), block), [o for o, _ in expected],
                f"N={n}, {chunk} tokens per rank, block {block}, {_describe(b, h, d, scale)}",
                budgets=[*traffic, _memory_budget(b, h // n, d, block, ULYSSES_CHUNKS, n * chunk, "O(s·h/N · d)"),
                         _largest_tensor_budget(b, h // n, n * chunk, d, block, "q, k and v", 3, ULYSSES_TILES)],
                allowed_ops=A2A, parts={"head": (1, h)}, explain=functools.partial(_ulysses_explained, qs, ks, vs))


def _ulysses_setup(qs: list, ks: list, vs: list, rank: int):
    """attended.explain_attention's view of a Ulysses rank: its chunk of queries, every head, against the whole
    sequence's keys, in the ranks' chunks."""
    n, c = len(qs), qs[0].shape[-2]
    k, v = (torch.cat([t.cpu() for t in ts], -2) for ts in (ks, vs))
    units = [Unit("its own chunk's keys" if a == rank else f"rank {a}'s chunk's keys", a * c, a * c + c)
             for a in range(n)]
    return qs[rank].cpu(), k, v, units, [Queries("its queries", 0, c, (FULL,) * n)], MASKED, None


def _ulysses_meaning(rank: int, blocks: list, units: list) -> Optional[str]:
    (_, found), = blocks
    if [o for i, o in enumerate(found) if i != rank] == [NONE] * (len(found) - 1) and found[rank] == FULL:
        return ("it attended only its own chunk, never the other chunks' keys: attention ran before the exchange "
                "that gives each rank the whole sequence of its heads")
    if CAUSAL in found or STRICT in found:
        return "a causal mask this attention does not have: every query sees every key here"
    return None


def _ulysses_explained(qs: list, ks: list, vs: list, expected: list, got: list) -> Optional[str]:
    """A result still in the attention's layout, or queries that attended other keys than the whole sequence's."""
    n, (b, h, c, d) = len(qs), qs[0].shape
    for rank, g in enumerate(got):
        if isinstance(g, torch.Tensor) and tuple(g.shape) == (b, h // n, n * c, d) != (b, h, c, d):
            return (f"Diagnosis: rank {rank}'s result is laid out (b, h/N, s, d) = {tuple(g.shape)}: its h/N heads "
                    f"over the whole sequence, the layout attention ran in. The way back is the opposite exchange: it "
                    f"gathers the heads and splits the sequence, (b, h, s/N, d) = {(b, h, c, d)}; the inputs' "
                    "all-to-all splits heads again.")
    return explain_attention(functools.partial(_ulysses_setup, qs, ks, vs), len(qs), got, _ulysses_meaning,
                             lse_at=None)


def _ulysses_oracle(dist, q, k, v, block):
    return _ring_oracle(dist, q, k, v, block)[0]


def _ulysses_variant(dist, q, k, v, _block, *, heads_in: bool = True, heads_out: bool = True):
    """Ulysses with one layout step left out: heads_in=False sends (b, h, s/N, d) as it is (its dim 0, the batch, is
    what all_to_all_single splits); heads_out=False reshapes the returned (N, b, h/N, s/N, d) straight to
    (b, h, s/N, d), the head groups left in front of the batch."""
    n = dist.get_world_size()
    b, h, c, d = q.shape

    def exchange(x):
        x = x.contiguous()
        got = torch.empty_like(x)
        dist.all_to_all_single(got, x)
        return got

    def to_heads(t):                                                    # (b, h, s/N, d) -> (b, h/N, s, d)
        if not heads_in:
            return exchange(t).reshape(b, h // n, n * c, d)
        return exchange(t.reshape(b, n, h // n, c, d).transpose(0, 1)).permute(1, 2, 0, 3, 4).reshape(
            b, h // n, n * c, d)
    qh, kh, vh = to_heads(q), to_heads(k), to_heads(v)
    o = torch.softmax(qh @ kh.transpose(-2, -1) * d ** -0.5, -1) @ vh                  # (b, h/N, s, d)
    got = exchange(o.reshape(b, h // n, n, c, d).permute(2, 0, 1, 3, 4))              # (N, b, h/N, s/N, d)
    return got.transpose(0, 1).reshape(b, h, c, d) if heads_out else got.reshape(b, h, c, d)


ULYSSES_MISTAKES = [
    Mistake(functools.partial(_ulysses_variant, heads_in=False),
            "an all-to-all of q, k and v laid out (b, h, s/N, d) as they come gives: all_to_all_single splits dim 0, "
            "here the batch, so each rank received other ranks' samples, not its h/N heads of every sequence chunk. "
            "Lay each out as (N, b, h/N, s/N, d) first: x.reshape(b, N, h // N, c, d).transpose(0, 1)."),
    Mistake(functools.partial(_ulysses_variant, heads_out=False),
            "the way back reshaped straight to (b, h, s/N, d) gives: what the all-to-all returns is laid out "
            "(N, b, h/N, s/N, d), the head groups in front of the batch, so the heads landed in other samples' "
            "places. Move the head groups behind the batch first: got.transpose(0, 1).reshape(b, h, c, d)."),
]


ulysses_attention = _attention_puzzle(
    "ulysses_attention", NOTEBOOK, _ulysses_case, world_sizes=(2, 3, 4), variants=[{"scale": LARGE}],
    oracle=_ulysses_oracle, oracle_name=GATHERED, mistakes=ULYSSES_MISTAKES,
    hints=["dist.all_to_all_single(out, inp) sends the i-th slice of inp along dim 0 to rank i and puts what rank i "
           "sent in the i-th slice of out. Lay q out as (N, b, h/N, s/N, d): slice i holds the heads rank i will own.",
           "x.reshape(b, N, h // N, c, d).transpose(0, 1).contiguous() makes that layout; after the all-to-all, slice "
           "j holds sequence chunk j of your heads: .permute(1, 2, 0, 3, 4).reshape(b, h // N, N * c, d).",
           "Attend with blockwise_attention on the full sequence of your h/N heads, then undo the layout for the "
           "output: (b, h/N, N, c, d) -> (N, b, h/N, c, d), all-to-all, and back to (b, h, c, d)."],
    describe="Attention with the sequence split turned into a head split and back by two all-to-alls.")


def race_ring_and_ulysses(ring_fn, ulysses_fn, n: int = 4, tokens: int = 16384, link: str = "NVLink",
                          seed: int = 0) -> Optional[dict[str, float]]:
    """Your overlapped ring (puzzle 4) and your Ulysses (puzzle 7) on the same simulated ranks, timed as one layer
    of `tokens` tokens per rank, 32 heads of 128 in bf16 on H100s over `link`: the simulator's answer to "which is
    faster", printed next to lib.analytic.context_parallel's formulas. None (and why, printed) when one does not run."""
    from lib.analytic.context_parallel import ring_or_ulysses, with_links
    from lib.errors import PuzzleError, raised_the_stub
    from lib.sim import run

    if link not in LINKS:
        raise ValueError(f"link must be one of {', '.join(sorted(LINKS))}, got {link!r}")
    (qs, ks, vs), _, chunk = _ring_inputs(random.Random(f"race:{seed}"), n, 1, n, 8, 1.0)
    _, flops = counted_flops(lambda: _tile(qs[0], ks[0], vs[0]))
    real = Shard(tokens=tokens, heads=32, head_dim=128)
    small = Shard(tokens=chunk, heads=n, head_dim=8, item=ITEM)
    cost = stand_in(flops, small.block_bytes, real, CostModel(), LINKS[link])
    times = {}
    for name, puzzle, fn in (("ring", ring_attention_overlap, ring_fn), ("Ulysses", ulysses_attention, ulysses_fn)):
        try:
            result = run(puzzle.wrap(fn), n, per_rank(qs), per_rank(ks), per_rank(vs), chunk, cost=cost)
        except PuzzleError as e:
            stub = raised_the_stub(e)
            print(f"○ solve {puzzle.name} first, then race." if stub
                  else f"✗ {puzzle.name} failed here: {str(e).splitlines()[0]}")
            return None
        times[name] = result.time
    faster = min(times, key=times.get)
    print(f"simulated, N = {n}, {fmt_tokens(tokens)} tokens per rank over {link}: ring {fmt_time(times['ring'])}, "
          f"Ulysses {fmt_time(times['Ulysses'])}: {faster} is faster")
    print(f"formulas:  {ring_or_ulysses(real, n, with_links(CostModel(), LINKS[link]))}")
    return times


# ---- 7. the backward pass -------------------------------------------------------------------------------
# A backward rank's chunks of (s/N)·d per (batch, head): q, k, v, out, dout and dq (6); the K/V block in use and the
# one arriving, the dK/dV travelling with it and the one arriving (8); the tiles' temporaries as rows × block.
BACKWARD_CHUNKS = 16
BACKWARD_TILES = 6
# Chunks of 6d to 8d tokens (d of 4 or 8), more than 5d: then one s/N × s/N tile of scores is over the largest-tensor
# budget (K, V, dK and dV stacked, 4 × s/N rows × d, + 25%), which a backward that ignores `block` needs. (With d of
# 8 or 16 and 6 to 16 tokens per rank, that backward passed every seed.)
BACKWARD_HINT = ("work on `block` keys of the K/V block at a time (the hint's P, dS per block): scores of your s/N "
                 "queries against the whole block ignore `block`.")


def _backward_case(rng: random.Random, n: int, scale: Optional[float] = None) -> Case:
    b, h, d = _shape(rng, dims=(4, 8))
    scale = _scale(rng, scale)
    chunk = 2 * rng.randint(3 * d, 4 * d)
    s = n * chunk
    q, k, v = _qkv(rng, b, h, s, s, d, scale, blocks=2 * n)
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    dout = torch.randn(b, h, s, d, generator=gen, dtype=torch.float64)
    out, lse = attention(q, k, v)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*leaves).backward(dout)
    grads = [t.grad for t in leaves]

    def split(t):
        return [c.clone().to(device()) for c in t.split(chunk, 2)]
    args = tuple(per_rank(split(t)) for t in (q, k, v, out, lse, dout))     # lse (b, h, s) splits along dim 2 too
    block = rng.choice([chunk // 2, chunk // 2 + 1])
    expected = [tuple(g) for g in zip(*(split(g) for g in grads))]
    size = b * h * chunk * d * ITEM
    traffic = _exactly(Budget("bytes_sent", (2 * n - 1) * 2 * size,
                              f"N-1 = {n - 1} K/V blocks forward and N = {n} dK/dV blocks, each 2 × "
                              f"{fmt_bytes(size)}",
                              hint="dK and dV of a block travel with it; one more step brings them home."),
                       hint="the ring moves exactly this: each step a K/V block with its dK/dV to the right "
                            "neighbour, and one more step brings dK/dV home. Fewer bytes is another schedule than "
                            "the ring's (dK/dV sent home apart from their block), or data that went around dist.")
    fixed = b * h * ITEM * chunk * (BACKWARD_CHUNKS * d + 2)
    tiles = b * h * ITEM * BACKWARD_TILES * chunk * block
    memory = Budget("peak_memory", fixed + tiles,
                    f"O(s/N · d): {BACKWARD_CHUNKS} tensors of {chunk} rows × d and {BACKWARD_TILES} tiles of "
                    f"{chunk} queries × block keys",
                    hint="work on one key block at a time; keep no score matrix longer than s/N × block.")
    return Case(n, (*args, block), expected,
                f"N={n}, {chunk} tokens per rank, block {block}, {_describe(b, h, d, scale)}",
                budgets=[*traffic, _largest_tensor_budget(b, h, chunk, d, block, "K, V, dK and dV", 4, BACKWARD_HINT),
                         memory], allowed_ops=P2P, contracts=_ring_rules(n), factors=_scale_factor(d))


def backward_by_terms(q, k, v, out, lse, dout, key_blocks, *, row_term: str = "dO∘O", normaliser: str = "lse"):
    """dQ, dK, dV of attention written by the terms of FlashAttention's backward (FlashAttention-2, Dao 2023,
    Algorithm 2): P = exp(S - lse), D = rowsum(dO ∘ O), dV = Pᵀ·dO, dS = P ∘ (dO·Vᵀ - D)/√d, dQ = dS·K,
    dK = dSᵀ·Q, on the whole sequence. A known mistake turns one term: D from dO alone (row_term="dO") or left out
    (row_term="none"), or P normalised within each of `key_blocks` (slices of the keys) by its own log-sum-exp
    (normaliser="block")."""
    scale = q.shape[-1] ** -0.5
    scores = q @ k.transpose(-2, -1) * scale                              # (b, h, s, s)
    if normaliser == "lse":
        p = torch.exp(scores - lse.unsqueeze(-1))
    else:
        p = torch.cat([torch.exp(scores[..., b] - scores[..., b].logsumexp(-1, keepdim=True)) for b in key_blocks], -1)
    row = {"dO∘O": dout * out, "dO": dout, "none": torch.zeros_like(dout)}[row_term].sum(-1, keepdim=True)
    ds = p * (dout @ v.transpose(-2, -1) - row) * scale
    return ds @ k, ds.transpose(-2, -1) @ q, p.transpose(-2, -1) @ dout


def _backward_mistake(message: str, tiles: str = "", **turned) -> Mistake:
    """The backward with one term turned, on the gathered sequence; `tiles`: the key blocks a per-block softmax
    normalises over ("block": the block-sized tiles of each rank's chunk, "chunk": each rank's whole chunk)."""
    def mistaken(dist, q, k, v, out, lse, dout, block):
        n, rank, chunk = dist.get_world_size(), dist.get_rank(), q.shape[-2]
        whole = [torch.cat(_gathered(dist, t.contiguous()), -2 if t.dim() == 4 else -1)
                 for t in (q, k, v, out, lse, dout)]
        size = block if tiles == "block" else chunk
        key_blocks = [slice(c * chunk + j, c * chunk + min(j + size, chunk)) for c in range(n)
                      for j in range(0, chunk, size)]
        grads = backward_by_terms(*whole, key_blocks, **turned)
        return tuple(g.chunk(n, -2)[rank] for g in grads)
    return Mistake(mistaken, message)


def _backward_misplaced(where: str, message: str) -> Mistake:
    """The right dQ, and dK, dV put in the wrong place: `where` "next" returns rank r + 1's (the block a rank holds
    after N-1 steps, the hop home left out), "left home" rank r + 2's (that block's last hop sent to the left, to
    rank r - 1), "own queries" only what rank r's own queries give its own block."""
    def mistaken(dist, q, k, v, out, lse, dout, block):
        n, rank = dist.get_world_size(), dist.get_rank()
        whole = [torch.cat(_gathered(dist, t.contiguous()), -2 if t.dim() == 4 else -1)
                 for t in (q, k, v, out, lse, dout)]
        dq, dk, dv = (g.chunk(n, -2) for g in backward_by_terms(*whole, None))
        ahead = {"next": 1, "left home": 2}.get(where)
        if ahead and ahead % n == 0:         # the owner's own place: the reference itself, no mistake to match
            raise ValueError(f"{where} is home at N = {n}")
        if ahead:
            return dq[rank], dk[(rank + ahead) % n], dv[(rank + ahead) % n]
        return (dq[rank], *backward_by_terms(q, k, v, out, lse, dout, None)[1:])
    return Mistake(mistaken, message)


PER_BLOCK_SOFTMAX = ("P recomputed as each key block's own softmax, exp(S - the block's log-sum-exp), gives: P is "
                     "exp(S - lse) with the forward's lse, the log-sum-exp over every key of the row, so that a "
                     "block's probabilities are its share of the whole row (FlashAttention-2, Dao 2023, Algorithm 2).")
BACKWARD_MISTAKES = (
    _backward_mistake("D, the row term of dS = P ∘ (dO·Vᵀ - D), taken as rowsum(dO) gives: D is rowsum(dO ∘ O), "
                      "the O left out. It equals Σⱼ Pᵢⱼ (dO·Vᵀ)ᵢⱼ, what the softmax's Jacobian subtracts from each "
                      "row (FlashAttention-2, Dao 2023, Algorithm 2).", row_term="dO"),
    _backward_mistake("dS = P ∘ (dO·Vᵀ) · scale, the row term D left out, gives: dS = P ∘ (dO·Vᵀ - D) · scale with "
                      "D = rowsum(dO ∘ O): the softmax's Jacobian subtracts from each row of dO·Vᵀ its mean under P "
                      "(FlashAttention-2, Dao 2023, Algorithm 2).", row_term="none"),
    _backward_mistake(PER_BLOCK_SOFTMAX, tiles="block", normaliser="block"),
    _backward_mistake(PER_BLOCK_SOFTMAX, tiles="chunk", normaliser="block"),
    _backward_misplaced("next", "dK and dV returned where the ring left them after its N-1 steps gives: each rank "
                        "then holds the block of rank r + 1 (with its gradients), not its own. dK and dV need one "
                        "more hop round the ring, to the right, to come home to the rank that owns the block."),
    _backward_misplaced("left home", "dK and dV sent home to the left gives: after N-1 steps rank r holds rank "
                        "r + 1's block, and a last hop to the left (to rank r - 1) lands it two ranks from its owner "
                        "(at N = 2 the two directions agree). The ring runs to the right: send the last hop to rank "
                        "r + 1 too."),
    _backward_misplaced("own queries", "dK and dV of each rank's own block from its own queries alone give: every "
                        "rank's queries attend every block, and each adds its share to dK, dV where the block is "
                        "when it visits. Let dK and dV travel with their K/V block round the ring (accumulating "
                        "each rank's share) and bring them home with one last hop."))


def _backward_oracle(dist, q, k, v, out, lse, dout, block):
    rank = dist.get_rank()
    leaves = [torch.cat(_gathered(dist, t), 2).requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*leaves).backward(torch.cat(_gathered(dist, dout), 2))
    return tuple(t.grad.chunk(dist.get_world_size(), 2)[rank] for t in leaves)


ring_attention_backward = _attention_puzzle(
    "ring_attention_backward", NOTEBOOK, _backward_case, world_sizes=(2, 3, 4), variants=[{"scale": LARGE}],
    oracle=_backward_oracle, oracle_name="autograd through PyTorch's attention on the gathered sequence",
    outputs={"[0]": "dQ", "[1]": "dK", "[2]": "dV"}, mistakes=BACKWARD_MISTAKES,
    rtol=1e-8,
    hints=["With P = exp(scores - lse) for a key block (recomputed, not stored), the block's gradients are "
           "dV += Pᵀ·dO, dS = P ∘ (dO·Vᵀ - D) · scale with D = rowsum(dO ∘ O), dQ += dS·K, dK += dSᵀ·Q.",
           "Each step: compute the block's contributions to dQ (yours) and to its dK, dV (its owner's). Send the "
           "block's dK, dV on to the right with it; the K/V block goes N-1 times, its gradients N times, home.",
           "kv = torch.stack([k, v]), dkv = torch.zeros_like(kv). Every step: add into dkv, then send dkv right "
           "and receive the next into a fresh buffer; post the K/V transfer before computing to overlap it."],
    describe="The gradients of ring attention, dK and dV travelling back to their owners around the ring.")


PUZZLES = [merge_attention, blockwise_attention, ring_attention, ring_attention_overlap, zigzag_attention,
           ring_attention_backward, ulysses_attention]
