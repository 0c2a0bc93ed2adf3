"""Notebook 07, mixture of experts and expert parallelism: the puzzles, their inputs, references and budgets.

Layout everywhere: tokens are rows, (T, d); router logits (T, E); expert e maps a row v to v @ W_e, with
W (E, d, d) and rank r holding experts r·E/N ... (r+1)·E/N - 1. float64, so that every comparison is strict.
Expected results come from per-token reference loops; budgets from the tokens the reference routing keeps.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import random
from fractions import Fraction
from typing import Callable, Optional

import torch

from lib.checker.puzzle import Budget, Case, Contract, Floor, Puzzle
from lib.checker.contract import sends_less_than
from lib.device import device
from lib.diagnose import Mistake
from lib.diagnose.leaves import listing
from lib.errors import PuzzleError
from lib.notebook.warm_up import import_ahead
from lib.sim import per_rank
from lib.checker.terms import Formula, Num, Q, ceil, formula, matches, minimum, term
from lib.units import fmt_bytes
from puzzles.replicas import drifted

import_ahead("explicit_gradient")          # moe_layer_backward's reference back-propagates dy

NOTEBOOK = "07_moe"
ITEM = 8                                   # float64
A2A = frozenset({"all_to_all"})
FACTORS = (0.5, 0.75, 1.0, 1.25, 2.0)      # capacity factors a case draws: below and above 1
LARGE = 1000.0                             # logits of this scale overflow exp() in any precision
# The course's own MoE arithmetic would answer the capacity for the learner.
OFF_LIMITS = {"lib.analytic.moe": "lib.analytic.moe"}
OFF_LIMITS_ADVICE = "compute the capacity and the routing yourself: lib.analytic.moe is what the figures use"


def _gen(rng: random.Random) -> torch.Generator:
    return torch.Generator().manual_seed(rng.randrange(2**31))


def _on_device(*tensors):
    return tuple(t.clone().to(device()) for t in tensors)


# ---- references ------------------------------------------------------------------------------------------
def route_reference(logits: torch.Tensor, k: int, capacity_factor: float, pooled_by: int = 0,
                    keep_last: bool = False, token_major: bool = False):
    """The single-device reference, one claim at a time: (tokens (E, C) int64, -1 in empty slots; weights (E, C),
    the router's probability of each kept (token, expert), 0 in empty slots). Slots are claimed by every token's
    first choice in token order, then every token's second choice, and so on (GShard's priority).

    The known mistakes, for the diagnosis: pooled_by=n shares capacity between each n neighbouring experts (a
    rank's); keep_last walks the tokens from the last; token_major gives token 0 both choices before token 1."""
    t_count, experts = logits.shape
    probs = torch.softmax(logits, dim=-1)                                          # (T, E)
    choices = logits.topk(k, dim=-1).indices                       # (T, k), best first (probabilities may tie at 0)
    cap = math.ceil(k * t_count * capacity_factor / experts)
    width = cap * max(pooled_by, 1)
    tokens = torch.full((experts, width), -1, dtype=torch.long, device=logits.device)
    weights = torch.zeros(experts, width, dtype=logits.dtype, device=logits.device)
    fill, kept = [0] * experts, set()
    order = [(j, t) for t in range(t_count) for j in range(k)] if token_major else \
        [(j, t) for j in range(k) for t in range(t_count)]
    for j, t in (order[::-1] if keep_last else order):          # which claims fit
        e = int(choices[t, j])
        pool = range(e - e % pooled_by, e - e % pooled_by + pooled_by) if pooled_by else [e]
        if sum(fill[p] for p in pool) < cap * len(pool):
            fill[e] += 1
            kept.add((j, t))
    fill = [0] * experts
    for j, t in order:                                          # their slots, in priority order
        if (j, t) in kept:
            e = int(choices[t, j])
            tokens[e, fill[e]], weights[e, fill[e]] = t, probs[t, e]
            fill[e] += 1
    return tokens, weights


def combine_reference(x: torch.Tensor, tokens: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor):
    """y[t] = Σ over the slots holding t of weight · x[t] @ W_e, token by token."""
    y = torch.zeros_like(x)
    for e in range(tokens.shape[0]):
        for slot in range(tokens.shape[1]):
            t = int(tokens[e, slot])
            if t >= 0:
                y[t] = y[t] + weights[e, slot] * (x[t] @ experts[e])
    return y


def moe_reference(x: torch.Tensor, router: torch.Tensor, experts: torch.Tensor, k: int, capacity_factor: float,
                  unweighted: bool = False, **mistake) -> torch.Tensor:
    """The MoE layer on one device: y[t] = Σ over t's kept experts e of p[t, e] · x[t] @ W_e (with unweighted, a
    known mistake: 1 instead of p[t, e])."""
    tokens, weights = route_reference(x @ router, k, capacity_factor, **mistake)
    return combine_reference(x, tokens, (tokens >= 0).to(x.dtype) if unweighted else weights, experts)


# ---- 1. the top-k router with capacity ---------------------------------------------------------------------
def _logits(rng: random.Random, t_count: int, experts: int, skew: float) -> torch.Tensor:
    gen = _gen(rng)
    bias = torch.randn(experts, generator=gen, dtype=torch.float64) * skew        # a router that prefers some
    return torch.randn(t_count, experts, generator=gen, dtype=torch.float64) + bias


def _tokens_for(rng: random.Random, experts: int, k: int, factor: float, fractional: bool) -> int:
    """T between 3E and 6E; with `fractional`, one where k·T·factor/E has a fractional part below one half, so that
    a capacity taken with int() or round() instead of ceil() is one slot short."""
    if not fractional:
        return experts * rng.randint(3, 6)
    fits = [t for t in range(3 * experts, 6 * experts + 1)
            if 0 < Fraction(k * t, experts) * Fraction(factor) % 1 < Fraction(1, 2)]
    return rng.choice(fits)


def _route_case(rng: random.Random, _world: int, k: Optional[int] = None, factor: Optional[float] = None,
                fractional: bool = False) -> Case:
    k = rng.choice([1, 2]) if k is None else k
    experts = rng.randint(5 if k == 2 else 3, 8)          # with few experts, the priority order rarely shows
    factor = rng.choice(FACTORS) if factor is None else factor
    t_count = _tokens_for(rng, experts, k, factor, fractional)
    logits = _logits(rng, t_count, experts, rng.choice([0.0, 1.0, 2.0]))
    tokens, weights = route_reference(logits, k, factor)
    dropped = t_count * k - int((tokens >= 0).sum())
    return Case(1, (*_on_device(logits), k, factor), [_on_device(tokens, weights)],
                f"T={t_count} tokens, E={experts} experts, k={k}, capacity factor {factor:g} "
                f"({tokens.shape[1]} slot{'s' * (tokens.shape[1] > 1)} per expert, {dropped} of {t_count * k} choices "
                f"dropped)", explain=functools.partial(_routing_explained, logits, k, factor))


def _routing_explained(logits: torch.Tensor, k: int, factor: float, expected: list, got: list) -> Optional[str]:
    """What the learner's routing shows against the case's logits: a capacity from another formula, empty slots
    marked otherwise than -1, every expert's tokens shifted by a slot, second choices in slots first choices hold,
    kept slots weighted by something else than each token's softmax over the experts."""
    (tokens, weights), answer = expected[0], got[0]
    width = _capacity_width(logits, k, factor, tokens.shape[1], answer)
    if width:
        return f"Diagnosis: {width}"
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2 and all(
            isinstance(a, torch.Tensor) and a.shape == tokens.shape for a in answer)):
        return None
    mine, mine_w = (a.detach().cpu() for a in answer)
    tokens, weights, logits = tokens.cpu(), weights.cpu(), logits.cpu()
    said = [f for f in (_empty_slots(tokens, mine), _shifted(tokens, mine), _priority(logits, k, tokens, mine),
                        _weighted_by(logits, k, tokens, mine, mine_w)) if f]
    return f"Diagnosis: {' '.join(said)}" if said else None


def _capacity_width(logits: torch.Tensor, k: int, factor: float, cap: int, answer) -> Optional[str]:
    """Tensors of C' slots per expert where C = ceil(k·T·factor / E) belong, named by the change to that formula that
    gives C' (lib.checker.terms: k left out, floor for ceil, ...)."""
    if not (isinstance(answer, (tuple, list)) and answer and isinstance(answer[0], torch.Tensor)
            and answer[0].dim() == 2 and answer[0].shape[0] == logits.shape[1] and answer[0].shape[1] != cap):
        return None
    t_count, experts = logits.shape
    mine = answer[0].shape[1]
    found = matches(formula(ceil(Q("k", k, "the experts each token chooses") * Q("T", t_count, "the tokens")
                                 * Num(factor) / Q("E", experts, "the experts")),
                            "slots"), mine)
    found.sort(key=lambda said: "round" not in said)    # the rounding before a quantity that fits by coincidence
    if sum("round" in said for said in found) > 1:       # floor and round agree where the fraction is below a half
        found = ["the fraction rounded away where a capacity rounds up (int(), floor() and round() all give it "
                 "here: C is a ceil)"]
    what = f"Your tensors have {mine} slots per expert where the capacity is C = ceil(k·T·factor / E) = " \
           f"ceil({k}·{t_count}·{factor:g} / {experts}) = {cap}"
    return f"{what}: {mine} is what it gives with {found[0]}." if found else f"{what}."


def _empty_slots(tokens: torch.Tensor, mine: torch.Tensor) -> Optional[str]:
    empty = tokens < 0
    if not bool(empty.any()) or bool((mine[empty] == tokens[empty]).all()) or not bool((mine[~empty] == tokens[~empty])
                                                                                       .all()):
        return None
    held = sorted(set(mine[empty].tolist()))
    why = f"token {held[0]} is a real token, so" if held[0] >= 0 else "-1 is what marks one:"
    return (f"The empty slots hold {listing([str(v) for v in held])} where -1 belongs, and the kept ones are right: "
            f"{why} an empty slot must read -1 (torch.full((E, C), -1)).")


def _shifted(tokens: torch.Tensor, mine: torch.Tensor) -> Optional[str]:
    """Every expert's tokens one slot later (or earlier) than the reference puts them."""
    for step, later in ((1, True), (1, False)):
        a, b = (mine[:, step:], tokens[:, :-step]) if later else (mine[:, :-step], tokens[:, step:])
        kept = b >= 0
        if bool(kept.any()) and bool((a[kept] == b[kept]).all()) and not bool((mine == tokens).all()):
            if later:
                return ("Every expert's tokens sit one slot later than they should (slot s holds what slot s-1 "
                        "should: slot indices off by one, counted from 1, so each expert keeps C-1 tokens): a claim's "
                        "slot is the number of earlier claims on its expert, the cumulative sum minus one.")
            return ("Every expert's tokens sit one slot earlier than they should (slot indices off by one, counted "
                    "from -1): a claim's slot is the number of earlier claims on its expert.")
    return None


def _priority(logits: torch.Tensor, k: int, tokens: torch.Tensor, mine: torch.Tensor) -> Optional[str]:
    """Second choices in slots the reference gives first choices; said as a restart when each expert's slots hold its
    second-choice claims from slot 0 over its first-choice ones."""
    if k < 2:
        return None
    choices = logits.topk(k, dim=-1).indices                                   # (T, k)
    rank_of = {(int(t), int(e)): j for t in range(choices.shape[0]) for j, e in enumerate(choices[t].tolist())}
    taken = [(e, s, int(mine[e, s]), int(tokens[e, s])) for e in range(tokens.shape[0]) for s in range(tokens.shape[1])
             if mine[e, s] >= 0 and tokens[e, s] >= 0 and rank_of.get((int(mine[e, s]), e), 0) > 0
             and rank_of.get((int(tokens[e, s]), e)) == 0]
    if not taken:
        return None
    e, s, t, want = taken[0]
    text = (f"Second choices hold slots that first choices should (expert {e}'s slot {s}: token {t}, its second "
            f"choice, where token {want}'s first choice belongs): every first choice outranks every second choice.")
    cap = tokens.shape[1]
    restart = True
    for e in range(tokens.shape[0]):
        firsts, seconds = ([t for t in range(choices.shape[0]) if int(choices[t, j]) == e] for j in (0, 1))
        slots = [seconds[i] if i < len(seconds) else firsts[i] if i < len(firsts) else -1 for i in range(cap)]
        restart &= slots == mine[e].tolist()
    if restart:
        text += (" Here each expert's second choices restart at slot 0 and overwrite its first choices: count the "
                 "claims of all k choices together, first choices first, so that second choices take the slots after "
                 "them.")
    return text


def _weighted_by(logits: torch.Tensor, k: int, tokens: torch.Tensor, mine: torch.Tensor,
                 mine_w: torch.Tensor) -> Optional[str]:
    """What the kept slots' weights are, where the tokens are right and the weights not: which normalisation."""
    kept = (tokens >= 0) & (mine == tokens)
    if not bool(kept.any()):
        return None
    e_idx, s_idx = kept.nonzero(as_tuple=True)
    t_idx = tokens[e_idx, s_idx]
    have = mine_w[e_idx, s_idx].to(torch.float64)
    top = logits.topk(k, dim=-1)
    chosen = torch.zeros_like(logits).scatter(-1, top.indices, torch.softmax(top.values, -1))
    candidates = {
        "": torch.softmax(logits, dim=-1),
        "each expert's probabilities normalised over the tokens (softmax over dim=0), where each token's are "
        "normalised over the experts (dim=-1)": torch.softmax(logits, dim=0),
        "the router's raw logits where their probabilities belong (the weights taken before the softmax)": logits,
        "each token's probabilities renormalised over its k chosen experts, where the statement keeps the softmax "
        "over all E": chosen}
    for said, values in candidates.items():
        if torch.allclose(have, values[t_idx, e_idx].to(torch.float64), rtol=1e-9, atol=1e-12):
            return f"The kept slots' weights are {said}." if said else None
    return None


def _route_mistake(message: str, **mistake) -> Mistake:
    return Mistake(lambda logits, k, factor: route_reference(logits, k, factor, **mistake), message)


ROUTE_MISTAKES = [
    _route_mistake("keeping the last tokens gives: capacity drops the tokens that come last in the batch (Switch "
                   "and GShard keep tokens by position), not the first.", keep_last=True),
    _route_mistake("giving each token all its k choices before the next token gives: every first choice outranks "
                   "every second choice (GShard's priority), so first choices are placed for all tokens first.",
                   token_major=True),
]

top_k_route = Puzzle(
    "top_k_route", NOTEBOOK, _route_case, world_sizes=(1, 1, 1, 1), takes_dist=False,
    variants=[{"k": 1, "factor": 0.5, "fractional": True}, {"k": 2, "factor": 0.75, "fractional": True},
              {"k": 1, "factor": 2.0}, {"k": 2, "factor": 1.25}],
    rtol=1e-12, atol=1e-15, mistakes=ROUTE_MISTAKES, off_limits=OFF_LIMITS, off_limits_advice=OFF_LIMITS_ADVICE,
    hints=["probs = torch.softmax(logits, -1); choices = logits.topk(k, -1).indices, best first. Then hand out "
           "slots: first choices of tokens 0, 1, ..., T-1, then second choices in the same order.",
           "A slot's index is how many earlier claims went to the same expert: flatten the one-hot choices in "
           "priority order, (k, T, E) -> (k·T, E), and take a cumulative sum down the rows minus one.",
           "Keep a claim when its slot index < C = ceil(k·T·capacity_factor / E); scatter the token ids and their "
           "probabilities into (E, C) tensors filled with -1 and 0: tokens[e, slot] = t."],
    describe="Top-k routing with a capacity: per expert, the tokens it computes in order and their weights.")


# ---- 2. the load-balancing loss and the router z-loss ------------------------------------------------------
def losses_reference(logits: torch.Tensor, k: int, alpha: float, beta: float):
    """(balance, z) by their papers' definitions: α·E·Σ_i f_i·P_i (Switch; f_i the share of the T·k choices
    that go to expert i, P_i its mean probability) and β·mean_t(logsumexp_e logits[t])² (ST-MoE)."""
    t_count, experts = logits.shape
    probs = torch.softmax(logits, dim=-1)
    counts = [0] * experts
    for row in logits.topk(k, dim=-1).indices.tolist():
        for e in row:
            counts[e] += 1
    f = torch.tensor(counts, dtype=logits.dtype, device=logits.device) / (t_count * k)
    balance = alpha * experts * (f * probs.mean(0)).sum()
    z = beta * (torch.logsumexp(logits, dim=-1) ** 2).mean()
    return balance, z


def _grad_of(value: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
    """d value / d leaf, zeros when value does not depend on it (a detached answer)."""
    if not isinstance(value, torch.Tensor) or not value.requires_grad:
        return torch.zeros_like(leaf)
    grad, = torch.autograd.grad(value, leaf, retain_graph=True, allow_unused=True)
    return torch.zeros_like(leaf) if grad is None else grad


def _losses_harness(answer, _dist, logits, k, alpha, beta):
    """The answer's (balance, z) and their gradients with respect to the logits."""
    logits = logits.detach().requires_grad_()
    balance, z = answer(logits, k, alpha, beta)
    return balance.detach(), z.detach(), _grad_of(balance, logits), _grad_of(z, logits)


def _losses_case(rng: random.Random, _world: int, scale: Optional[float] = None, k: Optional[int] = None) -> Case:
    experts, k = rng.randint(3, 8), k or rng.choice([1, 2])
    t_count = rng.randint(5, 40)
    scale = rng.choice([1.0, 3.0]) if scale is None else scale
    logits = _logits(rng, t_count, experts, rng.choice([0.0, 1.5])) * scale
    alpha, beta = rng.choice([1e-2, 0.1]), rng.choice([1e-3, 1e-2])
    leaf = logits.clone().requires_grad_()
    balance, z = losses_reference(leaf, k, alpha, beta)
    grads = (torch.autograd.grad(v, leaf, retain_graph=True)[0] for v in (balance, z))
    expected = (balance.detach(), z.detach(), *grads)
    return Case(1, (*_on_device(logits), k, alpha, beta), [_on_device(*expected)],
                f"T={t_count}, E={experts}, k={k}, α={alpha:g}, β={beta:g}, logits of scale {scale:g}",
                factors={"E, the number of experts": experts, "k, the experts each token chooses": k,
                         "T, the tokens": t_count},
                explain=functools.partial(_losses_explained, logits, k, alpha, beta))


def _losses_explained(logits: torch.Tensor, k: int, alpha: float, beta: float, expected: list,
                      got: list) -> Optional[str]:
    return _f_explained(logits, k, alpha, expected, got) or _z_explained(logits, beta, expected, got)


def _f_readings(logits: torch.Tensor, k: int) -> dict[str, torch.Tensor]:
    """Other things a learner may take for f_i, the share of the T·k top-k choices that pick expert i, each with
    what it is."""
    t_count, experts = logits.shape
    firsts = torch.bincount(logits.argmax(-1), minlength=experts).to(logits.dtype) / t_count
    return {"the mean probabilities P_i themselves (f = P): f_i counts the top-k choices that pick expert i, a "
            "count with no gradient, where P_i averages the softmax": torch.softmax(logits, -1).mean(0),
            f"the share of the first choices only: each token makes k = {k} choices, and f_i counts every one of "
            "the T·k that picks expert i (bincount of all of topk(k).indices)": firsts}


def _f_explained(logits: torch.Tensor, k: int, alpha: float, expected: list, got: list) -> Optional[str]:
    """The balance loss as α·E·Σ f'·P for another reading f' of f (_f_readings), where the learner's value is
    one of them."""
    answer = got[0]
    if not (isinstance(answer, (tuple, list)) and len(answer) == 4 and isinstance(answer[0], torch.Tensor)
            and answer[0].numel() == 1):
        return None
    logits = logits.cpu()
    balance, mean_p = float(answer[0]), torch.softmax(logits, -1).mean(0)
    right = float(expected[0][0])
    for said, f in _f_readings(logits, k).items():
        value = alpha * logits.shape[1] * float((f * mean_p).sum())
        if not math.isclose(value, right, rel_tol=1e-9) and math.isclose(balance, value, rel_tol=1e-9, abs_tol=1e-15):
            return f"Diagnosis: your balance loss takes for f {said}."
    return None


# Each way to read "β · mean over the tokens of logsumexp(logits)²": the log-sum-exp's dimension, then the order of
# the square and the mean. The first is ST-MoE's.
Z_READINGS = {(-1, "mean of the squares"): lambda lse: (lse ** 2).mean(),
              (-1, "square of the mean"): lambda lse: lse.mean() ** 2,
              (0, "mean of the squares"): lambda lse: (lse ** 2).mean(),
              (0, "square of the mean"): lambda lse: lse.mean() ** 2}


def _z_explained(logits: torch.Tensor, beta: float, expected: list, got: list) -> Optional[str]:
    """Which reading of the z-loss the learner's value is: each token's log-sum-exp over the experts (dim=-1) or each
    expert's over the tokens (dim=0); the mean of the squares or the square of the mean."""
    answer = got[0]
    if not (isinstance(answer, (tuple, list)) and len(answer) == 4 and isinstance(answer[1], torch.Tensor)
            and answer[1].numel() == 1):
        return None
    z = float(answer[1])
    for (dim, order), reading in Z_READINGS.items():
        value = beta * float(reading(torch.logsumexp(logits.cpu(), dim=dim)))
        if math.isclose(z, value, rel_tol=1e-9, abs_tol=1e-12):
            if (dim, order) == (-1, "mean of the squares"):
                return None
            said = ([f"the {order}, where ST-MoE's z-loss is the mean of the squares (each token's log-sum-exp "
                     "squared, then the mean over the tokens)"] if order != "mean of the squares" else []) + \
                   (["each expert's log-sum-exp over the tokens (dim=0), where each token's is over the experts "
                     "(dim=-1)"] if dim == 0 else [])
            return f"Diagnosis: your z-loss is {'; and '.join(said)}."
    return None


router_losses = Puzzle(
    "router_losses", NOTEBOOK, _losses_case, world_sizes=(1, 1, 1, 1), takes_dist=False,
    variants=[{"scale": 1.0, "k": 2}, {"scale": LARGE}], harness=_losses_harness, rtol=1e-9, atol=1e-12,
    off_limits=OFF_LIMITS, off_limits_advice=OFF_LIMITS_ADVICE,
    hints=["f_i counts, P_i averages: f = (how many of the T·k top-k choices picked expert i) / (T·k), "
           "P = softmax(logits).mean(0). balance = α · E · (f · P).sum(); z = β · (torch.logsumexp(logits, -1) "
           "** 2).mean(): each token's log-sum-exp squared, then the mean over the tokens.",
           "Only P carries a gradient: f comes from a top-k, a count. Build f with torch.bincount (or a one-hot "
           "sum) of the top-k indices; never from detached probabilities.",
           f"Logits near ±{LARGE:g} overflow exp(): torch.logsumexp and torch.softmax subtract the maximum first, "
           "log(exp(x).sum()) does not."],
    outputs={"[0]": "the balance loss", "[1]": "the z-loss", "[2]": "the balance loss's gradient",
             "[3]": "the z-loss's gradient"},
    describe="The Switch load-balancing loss and the router z-loss, with their gradients.")


# ---- 3. dispatch and combine across expert-parallel ranks --------------------------------------------------
@dataclasses.dataclass
class Layer:
    """One MoE layer's inputs on every rank, and the reference's routing on each (for the budgets)."""

    xs: list            # each rank's tokens (T, d)
    router: torch.Tensor        # (d, E), on every rank
    experts: torch.Tensor       # (E, d, d), all of them: rank r holds rows r·E/N ...
    k: int
    factor: float
    label: str

    def shard(self, n: int) -> list:
        return [c.clone().to(device()) for c in self.experts.chunk(n)]

    def args(self, n: int) -> tuple:
        """moe_layer's arguments on `n` ranks: each rank's tokens, the router, its experts, k and factor."""
        return (per_rank([x.to(device()) for x in self.xs]), self.router.to(device()), per_rank(self.shard(n)),
                self.k, self.factor)

    def routed_rows(self, n: int) -> tuple[list[int], list[int]]:
        """Per rank: the kept (token, expert) pairs whose expert lives on another rank (sent), and those other
        ranks send to its experts (received)."""
        per = self.experts.shape[0] // n
        sent, received = [0] * n, [0] * n
        for r, x in enumerate(self.xs):
            tokens, _ = route_reference(x @ self.router, self.k, self.factor)
            for e in range(tokens.shape[0]):
                if e // per != r:
                    kept = int((tokens[e] >= 0).sum())
                    sent[r] += kept
                    received[e // per] += kept
        return sent, received


def outweighing_hidden(n: int, per_rank: int, cap: int, trips: int) -> int:
    """The smallest hidden size d at which one expert's weights (d·d numbers) outweigh every row a rank can send in
    `trips` all-to-alls of rows of d (2: there and back; 4 with backward). Each all-to-all sends at most (N-1)·(E/N)·C
    rows: going out, at most C of the rank's rows to each expert on the other N-1 ranks (its capacity); coming back,
    the results of at most C rows from each other rank for each of its own E/N experts. An expert sent anywhere then
    costs more than all the tokens' traffic, so no padding can make it fit."""
    return trips * (n - 1) * per_rank * cap + 1


def _layer(rng: random.Random, n: int, gate: str = "learned", experts_kind: str = "random",
           factor: Optional[float] = None, per_rank_experts: Optional[int] = None, k: Optional[int] = None,
           trips: int = 0) -> Layer:
    """k=2 asks for a learned gate over at least 3 experts (a token's two experts add up: the case an answer written
    for k=1 gets wrong). With `trips` (the all-to-alls of rows the puzzle makes, there and back), d is large
    enough that an expert outweighs them all (outweighing_hidden): an answer that moves experts instead of tokens
    cannot fit in the tokens' bytes, however it pads."""
    e_count = n * (per_rank_experts or rng.choice([1, 2] if n > 2 else [1, 2, 3]))
    if k == 2 and e_count < 3:
        e_count = 2 * n
    k = k or (1 if gate != "learned" else rng.choice([1, 2]) if e_count > 2 else 1)
    factor = {"round_robin": 2.0, "shifted": 2.0, "lopsided": 1.0}.get(gate) or factor or rng.choice(FACTORS)
    d = max(e_count, rng.randint(3, 6))
    t_count = e_count * rng.randint(2, 4)
    if trips:
        d = max(d, outweighing_hidden(n, e_count // n, math.ceil(k * t_count * factor / e_count), trips))
    gen = _gen(rng)
    if gate != "learned":             # token t's logits: 8 at its chosen expert, noise elsewhere
        router = torch.zeros(d, e_count, dtype=torch.float64)
        router[:e_count] = torch.eye(e_count, dtype=torch.float64)
        xs, per, t = [], e_count // n, torch.arange(t_count)
        for r in range(n):
            x = 0.1 * torch.randn(t_count, d, generator=gen, dtype=torch.float64)
            if gate == "round_robin":     # expert (t + r) mod E
                chosen = (t + r) % e_count
            elif gate == "shifted":       # even tokens to the next rank's experts, odd ones anywhere: uneven both ways
                anywhere = torch.randint(e_count, (t_count,), generator=gen)
                chosen = torch.where(t % 2 == 0, (r + 1) % n * per + t // 2 % per, anywhere)
            else:                         # lopsided: 3 tokens in 4 to even experts, which overflow; odd ones have room
                chosen = 2 * (t // 4 % (e_count // 2)) + (t % 4 == 3).long()
            x[t, chosen] += 8.0
            xs.append(x)
    else:
        router = torch.randn(d, e_count, generator=gen, dtype=torch.float64)
        xs = [torch.randn(t_count, d, generator=gen, dtype=torch.float64) for _ in range(n)]
    eye = torch.eye(d, dtype=torch.float64)
    if experts_kind == "identity":
        experts = eye.repeat(e_count, 1, 1)
        what = "identity experts"
    elif experts_kind == "scaled":
        experts = torch.stack([(e // (e_count // n) + 1) * eye for e in range(e_count)])
        what = "experts on rank r multiply by r+1"
    else:
        experts = torch.randn(e_count, d, d, generator=gen, dtype=torch.float64) / math.sqrt(d)
        what = "random experts"
    gate_words = {"round_robin": f"round-robin gate (token t of rank r to expert (t+r) mod E), factor {factor:g}",
                  "shifted": f"half of rank r's tokens to rank r+1's experts, capacity factor {factor:g}",
                  "lopsided": f"3 tokens in 4 to even experts, capacity factor {factor:g}"}.get(
        gate, f"k={k}, capacity factor {factor:g}")
    return Layer(xs, router, experts, k, factor,
                 f"N={n}, E={e_count} experts ({e_count // n} per rank), T={t_count} tokens per rank, d={d}, "
                 f"{gate_words}, {what}")


def _bytes_budgets(layer: Layer, n: int, trips: int, counts: bool, what: str) -> list[Budget]:
    """Exactly the routed rows, `trips` times (there and back; twice more for backward), as a ceiling (padding
    and rows sent whole cost more) with room for one all-to-all of E int64 counts, and as a floor."""
    sent, received = layer.routed_rows(n)
    row = layer.xs[0].shape[1] * ITEM
    e_count = layer.experts.shape[0]
    count_bytes = e_count * 8 * (n - 1) / n if counts else 0
    rows = [s + r for s, r in zip(sent, received)]
    why = (f"each kept (token, expert) pair whose expert is on another rank, {fmt_bytes(row)} a row, there and "
           f"back" + (", forward and backward" if trips == 4 else ""))
    hint = ("send each rank only the rows routed to its experts (uneven splits), never padded capacity buffers; "
            "a row whose expert is local stays put.")
    return [Budget("bytes_sent", [trips // 2 * row * r + count_bytes for r in rows],
                   why + (f" + the counts, at most E = {e_count} int64 per rank" if counts else ""), hint=hint),
            Floor("bytes_sent", [trips // 2 * row * r for r in rows], why,
                  hint=f"the {what} reach their experts through dist.all_to_all_single only.")]


def _tokens_not_experts(layer: Layer, n: int, trips: int) -> Contract:
    """The tokens travel, never the experts: d is outweighing_hidden's, so one expert's weights weigh more than all
    the rows a rank can send, and a rank that sends that much moved experts (or far more rows than routing asks)."""
    d, per = layer.router.shape[0], layer.experts.shape[0] // n
    cap = math.ceil(layer.k * layer.xs[0].shape[0] * layer.factor / layer.experts.shape[0])
    most = trips * (n - 1) * per * cap
    return sends_less_than(
        d * d * ITEM, f"one expert's weights, d×d = {d}×{d} float64",
        f"tokens go to their experts, the experts stay home. Here d = {d} is chosen so that one expert outweighs "
        f"all the rows a rank can need to send ({trips} all-to-alls of at most (N-1)·(E/N)·C = {most // trips} rows "
        f"of {d} numbers): sending that much means it moved the experts' weights instead of the tokens (or sent "
        "rows to ranks whose experts do not compute them)",
        hint="route each token to the rank that owns its expert, compute there, send the result back: a row of d "
             "numbers per (token, expert), never an expert's d×d weights.")


def _padded_buffers(layer: Layer, n: int, trips: int) -> Contract:
    """What a rank over its bytes budget sent, where it is every other rank's experts' full C slots, empty ones
    included (the counts on top, or not): capacity buffers sent padded, named by their size, where the routed rows
    weigh less."""
    e_count = layer.experts.shape[0]
    per, row = e_count // n, layer.xs[0].shape[1] * ITEM
    cap = math.ceil(layer.k * layer.xs[0].shape[0] * layer.factor / e_count)
    slots = (n - 1) * per * cap                     # one way: every other rank's experts, C slots each
    padded, counts = trips * slots * row, e_count * 8
    sent, received = layer.routed_rows(n)

    def broken(result) -> Optional[str]:
        for s in result.stats:
            routed = sent[s.rank] + received[s.rank]
            if trips // 2 * routed * row < padded <= s.bytes_sent <= padded + counts:
                ways = "there and back, forward and backward" if trips == 4 else "there and back"
                return (f"rank {s.rank} sent {fmt_bytes(s.bytes_sent)}: exactly every other rank's experts' full "
                        f"C = {cap} slots, empty ones included ((N-1)·(E/N)·C = {slots} rows of {fmt_bytes(row)}, "
                        f"{ways}{' + the counts' if s.bytes_sent > padded else ''}), where the kept rows it sends "
                        f"and sends back are {routed}")
        return None
    return Contract("an empty slot carries no token: send the kept (token, expert) rows alone, never a capacity "
                    "buffer's padding", broken,
                    hint="send only the kept rows, sorted by expert, with uneven input_split_sizes (the per-expert "
                         "counts you exchanged first), never the (E, C) capacity buffers.")


def _moe_case(rng: random.Random, n: int, gate: str = "learned", experts_kind: str = "random",
              factor: Optional[float] = None, per_rank_experts: Optional[int] = None,
              k: Optional[int] = None, grouped: bool = False) -> Case:
    if grouped:
        return _grouped_case(rng, n)
    layer = _layer(rng, n, gate, experts_kind, factor, per_rank_experts, k, trips=2)
    expected = [moe_reference(x, layer.router, layer.experts, layer.k, layer.factor) for x in layer.xs]
    return Case(n, layer.args(n),
                [e.to(device()) for e in expected], layer.label,
                budgets=_bytes_budgets(layer, n, 2, True, "tokens"), allowed_ops=A2A,
                contracts=[_tokens_not_experts(layer, n, 2), _padded_buffers(layer, n, 2)],
                explain=functools.partial(_routed_explained, layer))


@dataclasses.dataclass
class Grouped:
    """The world cut into EP groups of consecutive ranks, each its own MoE layer (its router, its experts): an answer
    must route within the group it is given (dist.get_world_size(group), group= on every collective), as moe_train's
    EP groups need; one that takes the world for its group sends rows to another group's ranks."""

    layers: list[Layer]
    groups: list[list[int]]

    @classmethod
    def draw(cls, rng: random.Random, n: int, trips: int, size: int = 2) -> "Grouped":
        """The first group's layer has k = 2 with random experts: the one such layer of the check (the identity
        experts' k = 2 case cannot tell a token's two weights apart where both choices are kept)."""
        return cls([_layer(rng, size, trips=trips, k=2 if g == 0 else None) for g in range(n // size)],
                   [list(range(first, first + size)) for first in range(0, n, size)])

    def of(self, rank: int) -> tuple[Layer, int]:
        """The rank's layer and its place in its group."""
        size = len(self.groups[0])
        return self.layers[rank // size], rank % size

    def args(self) -> tuple:
        """Per rank: its tokens, its layer's router, its experts, k and factor."""
        n = sum(len(g) for g in self.groups)
        mine = [self.of(r) for r in range(n)]
        return (per_rank([layer.xs[i].to(device()) for layer, i in mine]),
                per_rank([layer.router.to(device()) for layer, _ in mine]),
                per_rank([layer.shard(len(self.groups[0]))[i] for layer, i in mine]),
                per_rank([layer.k for layer, _ in mine]), per_rank([layer.factor for layer, _ in mine]))

    def budgets(self, trips: int, what: str) -> list[Budget]:
        each = [_bytes_budgets(layer, len(self.groups[0]), trips, True, what) for layer in self.layers]
        return [dataclasses.replace(b, limit=[x for group in each for x in group[i].limit])
                for i, b in enumerate(each[0])]

    def label(self) -> str:
        size = len(self.groups[0])
        return (f"N={size * len(self.groups)} in EP groups {listing([str(g) for g in self.groups])}, each its own "
                f"layer: " + "; ".join(layer.label.replace(f"N={size}, ", "") for layer in self.layers))


def _grouped_case(rng: random.Random, n: int) -> Case:
    grouped = Grouped.draw(rng, n, trips=2)
    expected = [moe_reference(layer.xs[i], layer.router, layer.experts, layer.k, layer.factor)
                for layer, i in map(grouped.of, range(n))]
    return Case(n, (*grouped.args(), grouped.groups), [e.to(device()) for e in expected], grouped.label(),
                budgets=grouped.budgets(2, "tokens"), allowed_ops=A2A,
                explain=functools.partial(_grouped_explained, grouped, _routed_explained),
                explain_error=functools.partial(_grouped_error, grouped.groups))


def _own_group(_dist, groups: list):
    """Every rank creates every group, in order; the rank's own."""
    made = [_dist.new_group(g) for g in groups]
    return next(group for group, members in zip(made, groups) if _dist.get_rank() in members)


def _in_groups(groups: list) -> str:
    return (f"here ranks {listing([str(g) for g in groups])} are each an EP group of {len(groups[0])} in a world of "
            f"{sum(len(g) for g in groups)}, and group= is the rank's own")


GROUP_ADVICE = ("Your function is right on the check's other cases, where the group is the whole world, so it takes "
                "the world for its group: the EP ranks are the group's, n = dist.get_world_size(group), and every "
                "collective needs group=group (its ranks' positions in the group are what the splits index).")


def _layer_harness(answer, _dist, x, router, experts, k, factor, groups=None):
    """The answer's output; with `groups`, every rank creates every EP group and passes the answer its own."""
    if groups is None:
        return answer(_dist, x, router, experts, k, factor)
    return answer(_dist, x, router, experts, k, factor, group=_own_group(_dist, groups))


def _close(want, have) -> bool:
    """A rank's result (a tensor, or a tuple of them) equal to the reference's within the puzzles' tolerances."""
    if isinstance(want, (tuple, list)):
        return isinstance(have, (tuple, list)) and len(have) == len(want) and all(map(_close, want, have))
    return isinstance(have, torch.Tensor) and have.shape == want.shape and torch.allclose(
        have.detach().cpu().double(), want.cpu().double(), rtol=1e-10, atol=1e-12)


def _grouped_explained(grouped: Grouped, per_layer, expected: list, got: list) -> Optional[str]:
    """The group not honoured where the first group's ranks (whose places in it are their ranks in the world) are
    right and a later group's wrong; otherwise a layer's own mistake, read by `per_layer` on its group's ranks."""
    groups = grouped.groups
    right = [_close(expected[r], got[r]) for r in range(len(expected))]
    if all(right[r] for r in groups[0]):
        return (f"Diagnosis: ranks {groups[0]}, whose places in their group are their ranks in the world, are right; "
                "the other groups' are wrong, on the one case whose group is not the whole world: "
                f"{_in_groups(groups)}. {GROUP_ADVICE}")
    for layer, members in zip(grouped.layers, groups):
        found = per_layer(layer, [expected[r] for r in members], [got[r] for r in members])
        if found:
            return found.replace("Diagnosis: ", f"Diagnosis: in EP group {members}, ", 1)
    return None


def _grouped_error(groups: list, error: BaseException) -> str:
    """Any error on the grouped case (the check's last: the others passed) is the group not honoured."""
    return f"What it means: this is the one case whose group is not the whole world: {_in_groups(groups)}. " \
           f"{GROUP_ADVICE}"


def _kept(layer: Layer, rank: int) -> list[list[tuple[int, float]]]:
    """Per token of `rank`, its kept (expert, weight) claims under the reference's routing."""
    tokens, weights = route_reference(layer.xs[rank] @ layer.router, layer.k, layer.factor)
    out: list[list[tuple[int, float]]] = [[] for _ in range(layer.xs[rank].shape[0])]
    for e, slot in (tokens >= 0).nonzero().tolist():
        out[int(tokens[e, slot])].append((e, float(weights[e, slot])))
    return out


def _routed_away(layer: Layer, rank: int, wrong: torch.Tensor) -> bool:
    """Whether the wrong rows of `rank` are exactly the tokens routed to another rank's experts."""
    per = layer.experts.shape[0] // len(layer.xs)
    away = torch.tensor([any(e // per != rank for e, _ in claims) for claims in _kept(layer, rank)])
    return bool(wrong.any()) and bool((away == wrong).all())


def _which_expert(layer: Layer, rank: int, y: torch.Tensor, wrong: torch.Tensor) -> dict[int, int]:
    """For the wrong rows of tokens with one kept expert: {the expert routed to: the expert whose output came back}."""
    x, seen, kept = layer.xs[rank].cpu().double(), {}, _kept(layer, rank)
    for t in wrong.nonzero().flatten().tolist():
        claims = kept[t]
        if len(claims) != 1:
            continue
        e, w = claims[0]
        ran = next((f for f in range(layer.experts.shape[0]) if f != e and torch.allclose(
            y[t].cpu().double(), w * x[t] @ layer.experts[f].cpu().double(), rtol=1e-9, atol=1e-12)), None)
        if ran is None:
            return {}
        seen.setdefault(e, ran)
    return seen


def _weighted_otherwise(layer: Layer, rank: int, y: torch.Tensor, wrong: torch.Tensor) -> Optional[str]:
    """Wrong rows that are exactly their token's kept experts' outputs weighted otherwise than by the token's softmax
    (one weight a kept expert; one for their sum where the experts' outputs coincide, as identity experts' do): said
    with the weights found, and named where each is the probability of another of the token's k choices."""
    x = layer.xs[rank].cpu().double()
    probs = torch.softmax(x @ layer.router.cpu().double(), -1)
    choices = (x @ layer.router.cpu().double()).topk(layer.k, -1).indices
    kept, found, others = _kept(layer, rank), [], True
    near = functools.partial(math.isclose, rel_tol=1e-7, abs_tol=1e-9)     # above the fit's round-off
    for t in wrong.nonzero().flatten().tolist():
        if not kept[t] or not bool(torch.isfinite(y[t]).all()):
            return None
        outs = torch.stack([x[t] @ layer.experts[e].cpu().double() for e, _ in kept[t]])       # (kept, d)
        alike = all(torch.allclose(o, outs[0], rtol=1e-12, atol=1e-15) for o in outs)
        cols = outs[:1] if alike else outs
        fit = torch.linalg.lstsq(cols.T, y[t].cpu().double().unsqueeze(-1)).solution.flatten()
        if not torch.allclose(cols.T @ fit, y[t].cpu().double(), rtol=1e-9, atol=1e-12):
            return None
        right = [sum(w for _, w in kept[t])] if alike else [w for _, w in kept[t]]
        if all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) for a, b in zip(fit.tolist(), right)):
            return None
        cand = {int(f): float(probs[t, f]) for f in choices[t]}
        mine = {e for e, _ in kept[t]}
        if alike:
            sums = [sum(cand[f] for f in c) for c in itertools.combinations(cand, len(mine)) if set(c) != mine]
            others &= any(near(float(fit[0]), v) for v in sums)
        else:
            others &= all(any(near(w, cand[f]) for f in cand) for w in fit.tolist()) and any(
                not near(w, cand[e]) for w, (e, _) in zip(fit.tolist(), kept[t]))
        found.append((t, fit.tolist(), right, "their sum" if len(mine) > 1 and alike else "its kept expert"
                      + "s" * (len(mine) > 1)))
    if not found or all(near(w, 1.0) for _, fit, _, _ in found for w in fit):
        return None                 # every weight 1: no weights at all, which MOE_MISTAKES' unweighted reading says
    t, fit, right, what = found[0]
    are = "s are" if len(fit) > 1 else " is"
    said = (f"on rank {rank}, the wrong rows are exactly their tokens' kept experts' outputs, weighted otherwise: "
            f"token {t}'s weight{are} {', '.join(f'{w:.4g}' for w in fit)} ({what}) where its softmax probabilities "
            f"give {', '.join(f'{w:.4g}' for w in right)}. Routing and the experts are right; the weights are not.")
    if others:
        said += (" Each weight is the probability of another of the token's k choices: the weights were paired with "
                 "the wrong experts (topk's values and indices go together; weight expert e by probs[t, e]).")
    return f"Diagnosis: {said}"


def _routed_explained(layer: Layer, expected: list, got: list, output: int = -1) -> Optional[str]:
    """Wrong rows read against the case's routing: exactly the tokens whose experts live on other ranks (they never
    came back, or came back wrong), or tokens whose output is another expert's. `output`: which of a tuple result
    holds the rows (-1: the result itself)."""
    per = layer.experts.shape[0] // len(layer.xs)
    for rank, (e, g) in enumerate(zip(expected, got)):
        want, have = (e, g) if output < 0 else (e[output], g[output] if isinstance(g, (tuple, list)) else None)
        if not isinstance(have, torch.Tensor) or have.shape != want.shape:
            return None
        wrong = ~torch.isclose(have.detach().cpu().double(), want.cpu().double(), rtol=1e-9, atol=1e-12).all(-1)
        if not bool(wrong.any()):
            continue
        moved = _which_expert(layer, rank, have.detach(), wrong) if output < 0 else {}
        if moved:
            pairs = [f"expert {e}'s tokens came back with expert {f}'s output" for e, f in sorted(moved.items())]
            n = len(layer.xs)
            # Blocks arrive source-major, block i = source·(E/N) + local expert; read expert-major, block i runs
            # through local expert i // N.
            transposed = all(f == e // per * per + (rank * per + e % per) // n for e, f in moved.items())
            round_robin = all(f == e % n * per + e // n for e, f in moved.items())
            how = (" Here the arriving blocks were read expert-major, [local expert][source rank], where they arrive "
                   "source-major, [source rank][local expert]: block i is source i // (E/N)'s rows for local expert "
                   "i % (E/N)." if transposed else
                   " Here each expert e went to rank e % N as its local expert e // N (round-robin), where rank r "
                   "holds the contiguous experts r·E/N ... (r+1)·E/N - 1: expert e's owner is e // (E/N)."
                   if round_robin else " Rows arrive as [source rank][its local expert].")
            return (f"Diagnosis: on rank {rank}, {listing(pairs, 3)}: each block of rows that arrives must run "
                    f"through the expert it was sent to. Rank r holds experts r·E/N to (r+1)·E/N - 1 (E/N = {per}), "
                    f"as its experts[0 ...].{how}")
        never = output < 0 and bool((have.detach()[wrong] == 0).all())
        home = bool((~wrong).any())         # a token whose experts are all here, right: what tells the exchange
        if _routed_away(layer, rank, wrong) and (home or never):
            what = "outputs" if output < 0 else "gradients"
            zero = " (0 there: never received)" if never else ""
            right = "; those whose experts are here are right" if home else ""
            return (f"Diagnosis: on rank {rank}, exactly the rows of tokens routed to other ranks' experts are "
                    f"wrong{zero}{right}. Their {what} must come back the way the "
                    "rows went: " + ("sent to the experts' owners, computed there, and sent back (the all-to-all "
                                     "with the splits swapped)." if output < 0 else
                                     "the exchange's backward is the reverse all-to-all, which sends each row's "
                                     "gradient back to the rank it came from (never sent back, it stays where "
                                     "it was computed)."))
        return _weighted_otherwise(layer, rank, have.detach(), wrong) if output < 0 else None
    return None


RANK = -1          # pooled_by=RANK: a rank's experts share their capacity


def _moe_mistake(message: str, **mistake) -> Mistake:
    """Each rank computing the reference with `mistake`, all experts at hand (the values such an answer gives)."""
    transposed = mistake.pop("transposed", False)

    def mistaken(dist, x, router, experts, k, factor, *_):
        pooled = {"pooled_by": experts.shape[0]} if mistake.get("pooled_by") == RANK else {}
        every = _all_experts_of(dist, experts)
        return moe_reference(x, router, every.transpose(-1, -2) if transposed else every, k, factor,
                             **{**mistake, **pooled})
    return Mistake(mistaken, message)


def _all_experts_of(dist, experts):
    everyone = [torch.empty_like(experts) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, experts)
    return torch.cat(everyone)


MOE_MISTAKES = [
    _moe_mistake("forgetting the combine weights gives: each expert's output must be scaled by the router's "
                 "probability p[t, e] before a token's experts' outputs are added.", unweighted=True),
    _moe_mistake("sharing capacity between a rank's experts gives: capacity is per expert, ceil(k·T·factor / E) "
                 "slots each, even when a sibling expert on the same rank has room.", pooled_by=RANK),
    _moe_mistake("applying each expert transposed gives: expert e maps a row v to v @ W_e, with W_e = experts[e] "
                 "as given, (d_in, d_out); v @ W_e.T (or W_e @ v) uses it the other way round.", transposed=True),
]


def padded_dispatch(dist, x, router, experts, k, factor):
    """GShard's dispatch, the oracle of the real cells: every expert's whole capacity buffer, padding included, in
    one even all-to-all there and one back, through torch's differentiable all_to_all_single_autograd."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    n, local = dist.get_world_size(), experts.shape[0]
    tokens, weights = route_reference(x @ router, k, factor)                       # (E, C) each
    e_count, cap = tokens.shape
    kept = tokens >= 0
    rows = x[tokens.clamp(min=0)] * kept.unsqueeze(-1)                             # (E, C, d), zeros in padding
    even = [local * cap] * n
    arrived = all_to_all_single_autograd(rows.reshape(e_count * cap, -1), even, even, dist.group.WORLD)
    arrived = arrived.reshape(n, local, cap, -1).transpose(0, 1)                   # (E/N, N, C, d)
    done = torch.einsum("lncd,lde->lnce", arrived, experts).transpose(0, 1)        # (N, E/N, C, d)
    back = all_to_all_single_autograd(done.reshape(e_count * cap, -1), even, even, dist.group.WORLD)
    back = back.reshape(e_count, cap, -1) * weights.unsqueeze(-1)                  # (E, C, d)
    return torch.zeros_like(x).index_add(0, tokens.clamp(min=0).flatten(), (back * kept.unsqueeze(-1)).flatten(0, 1))


# One MoE layer of DeepSeek-V3's size (DeepSeek-AI, 2024): hidden 7168 in bf16, experts of three 7168 × 2048
# matrices, here with 4096 tokens per rank.
REAL_TOKENS, REAL_HIDDEN, REAL_EXPERT_FLOPS = 4096, 7168, 2 * 3 * 7168 * 2048


def _layer_scale(case: Case):
    """An expert-parallel layer's timeline at DeepSeek-V3's scale: the toy rows' bytes stand for 4096 tokens of
    hidden 7168 in bf16, a toy expert's matmul for a real expert's three."""
    from lib.viz.timeline import at_scale, scale_note

    first = case.args[0].values[0]
    x = first[0][0] if isinstance(first, list) else first          # moe_train's args start with its batches
    t_count, d = x.shape
    bytes_factor = REAL_TOKENS * REAL_HIDDEN * 2 / (t_count * d * x.element_size())
    flops_factor = REAL_TOKENS * REAL_EXPERT_FLOPS / (t_count * 2 * d * d)
    return at_scale(bytes_factor, flops_factor), (f"drawn as if each rank routed {REAL_TOKENS} tokens of hidden "
                                                  f"{REAL_HIDDEN} in bf16 to DeepSeek-V3-sized experts\n{scale_note()}")


MOE_HINTS = [
    "Route your tokens with your top_k_route(x @ router, k, capacity_factor). Then send each kept (token, expert) "
    "row to the rank that owns the expert, e // (E/N), sorted by expert; tell the others first how many rows of "
    "each of their experts you send: an all_to_all_single of E counts.",
    "counts (E,) int64 -> all_to_all_single(got, counts): got (N·E/N,) holds, per source rank, its rows for each of "
    "your experts. Input splits: counts.view(N, -1).sum(1); output splits: got.view(N, -1).sum(1). Split sizes "
    "are Python ints (.tolist()).",
    "Rows arrive as [source][local expert]: run each block through its expert, send the results back with the "
    "splits swapped, then y.index_add_(0, token ids, weight · result) adds each token's experts together.",
]


moe_layer = Puzzle(
    "moe_layer", NOTEBOOK, _moe_case, world_sizes=(2, 4, 2, 4, 4),
    # The shifted gate's splits differ each way (rank r sends its even tokens to rank r+1): the way back cannot
    # reuse the way there's splits. A check whose every case routed alike both ways passed that answer (1 seed).
    # Random experts first: a wrong placement of experts shows in the values before the identity experts' bytes.
    variants=[{"gate": "lopsided", "per_rank_experts": 2}, {"gate": "round_robin", "experts_kind": "scaled"},
              {"experts_kind": "identity", "k": 2}, {"gate": "shifted"}, {"grouped": True}],
    harness=_layer_harness, oracle=padded_dispatch,
    oracle_name="GShard's padded dispatch through all_to_all_single_autograd",
    rtol=1e-10, atol=1e-12, mistakes=MOE_MISTAKES, hints=MOE_HINTS, min_world_size=2, real_scale=_layer_scale,
    min_world_size_reason="its experts live on different ranks",
    describe="An MoE layer whose experts live on different ranks: tokens go to their experts and back by "
             "all-to-all with uneven splits.")


# ---- 4. backward through the all-to-all --------------------------------------------------------------------
def _backward_harness(answer, _dist, x, router, experts, k, factor, dy, groups=None):
    """The answer's output, and the gradients of <y, dy> for the tokens, the router and the rank's experts; with
    `groups`, in the rank's own EP group."""
    leaves = [t.detach().requires_grad_() for t in (x, router, experts)]
    if groups is None:
        y = answer(_dist, *leaves, k, factor)
    else:
        y = answer(_dist, *leaves, k, factor, group=_own_group(_dist, groups))
    grads = torch.autograd.grad(y, leaves, dy, allow_unused=True) if y.requires_grad else [None] * 3
    return Gradients((y.detach(), *(torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads))),
                     [what for what, g in zip(("the tokens", "the router", "your experts"), grads) if g is None])


class Gradients(tuple):
    """(y, dx, drouter, dexperts) as compared, a gradient backward never produced counted as zeros (a rank whose
    experts no token reaches has none to give), and the names of those that never arrived beside them."""

    def __new__(cls, values: tuple, never_arrived: list[str]):
        made = super().__new__(cls, values)
        made.never_arrived = never_arrived
        return made


def _backward_explained(layer: Layer, expected: list, got: list) -> Optional[str]:
    return _never_arrived(expected, got) or _routed_explained(layer, expected, got, output=1)


def _never_arrived(expected: list, got: list) -> Optional[str]:
    """Gradients that were None, where the comparison found a difference: backward never reached those inputs."""
    for rank, g in enumerate(got):
        missing = getattr(g, "never_arrived", [])
        if missing:
            return (f"Diagnosis: on rank {rank}, backward never reached {listing(missing)}: the gradient is None (the "
                    "check counted it as zeros). Something between them and y is cut off from the loss: a .detach() "
                    "or torch.no_grad() on the way, or an exchange autograd cannot see through (dist's all-to-all "
                    "carries values, not gradients: an autograd.Function whose backward is the reverse all-to-all "
                    "carries them).")
    return None


def _layer_gradients(layer: Layer, dys: list) -> list[list]:
    """Per rank of the layer: [y, dx, drouter, its experts' gradient], every rank's tokens collected."""
    expected, dw = [], torch.zeros_like(layer.experts)
    for x, dy in zip(layer.xs, dys):
        leaves = [x.clone().requires_grad_(), layer.router.clone().requires_grad_(),
                  layer.experts.clone().requires_grad_()]
        y = moe_reference(*leaves, layer.k, layer.factor)
        dx, drouter, dexperts = torch.autograd.grad(y, leaves, dy)
        expected.append([y.detach(), dx, drouter])
        dw += dexperts                                          # a rank's experts collect every rank's tokens
    for r, mine in enumerate(dw.chunk(len(layer.xs))):
        expected[r].append(mine)
    return expected


def _grouped_backward_case(rng: random.Random, n: int) -> Case:
    grouped = Grouped.draw(rng, n, trips=4)
    gen = _gen(rng)
    dys = [[torch.randn(x.shape, generator=gen, dtype=torch.float64) for x in layer.xs] for layer in grouped.layers]
    expected = [e for layer, d in zip(grouped.layers, dys) for e in _layer_gradients(layer, d)]
    return Case(n, (*grouped.args(), per_rank([dy.to(device()) for d in dys for dy in d]), grouped.groups),
                [tuple(t.to(device()) for t in e) for e in expected], grouped.label() + "; (y, dx, drouter, dexperts)",
                budgets=grouped.budgets(4, "tokens and their gradients"), allowed_ops=A2A,
                explain=functools.partial(_grouped_explained, grouped, _backward_explained),
                explain_error=functools.partial(_grouped_error, grouped.groups))


def _backward_case(rng: random.Random, n: int, gate: str = "learned", experts_kind: str = "random",
                   factor: Optional[float] = None, per_rank_experts: Optional[int] = None,
                   k: Optional[int] = None, grouped: bool = False) -> Case:
    if grouped:
        return _grouped_backward_case(rng, n)
    layer = _layer(rng, n, gate, experts_kind, factor, per_rank_experts, k, trips=4)
    gen = _gen(rng)
    dys = [torch.randn(x.shape, generator=gen, dtype=torch.float64) for x in layer.xs]
    expected = _layer_gradients(layer, dys)
    return Case(n, (*layer.args(n), per_rank([dy.to(device()) for dy in dys])),
                [tuple(t.to(device()) for t in e) for e in expected], layer.label + "; (y, dx, drouter, dexperts)",
                budgets=_bytes_budgets(layer, n, 4, True, "tokens and their gradients"), allowed_ops=A2A,
                contracts=[_tokens_not_experts(layer, n, 4), _padded_buffers(layer, n, 4)],
                explain=functools.partial(_backward_explained, layer))


moe_layer_backward = Puzzle(
    "moe_layer_backward", NOTEBOOK, _backward_case, world_sizes=(2, 4, 4, 4), real_scale=_layer_scale,
    variants=[{"gate": "round_robin", "experts_kind": "scaled"}, {"gate": "shifted"},
              {"factor": 0.5, "per_rank_experts": 2, "k": 2}, {"grouped": True}],
    harness=_backward_harness, oracle=lambda dist, *args: _backward_harness(padded_dispatch, dist, *args),
    oracle_name="GShard's padded dispatch through all_to_all_single_autograd", rtol=1e-10, atol=1e-12,
    min_world_size=2, min_world_size_reason="its experts live on different ranks",
    hints=["dist.all_to_all_single is invisible to autograd: wrap it in a torch.autograd.Function whose backward "
           "is the same all-to-all with the split sizes swapped (gradients go back where the rows came from).",
           "Define the Function inside your answer (it needs dist): forward(ctx, rows, out_splits, in_splits) "
           "keeps the splits on ctx; backward returns (the reverse all-to-all of grad, None, None).",
           "Pass your Function's apply as moe_layer's exchange: the router's weights must stay attached to the "
           "graph (no .detach(), no torch.no_grad()), so that the router learns from the combine."],
    outputs={"[0]": "the output y", "[1]": "the tokens' gradient dx", "[2]": "the router's gradient",
             "[3]": "your experts' gradient"},
    describe="The MoE layer's gradients: the all-to-alls carry them back to the tokens' and the experts' ranks.")


# ---- 5. expert parallel × data parallel ---------------------------------------------------------------------
STEPS = 2


def train_reference(batches: list, router: torch.Tensor, experts: torch.Tensor, k: int, factor: float, lr: float,
                    steps: int):
    """Single-device SGD on the mean over ranks of each rank's mean squared error (each rank routes its own
    tokens): (router, all experts) after `steps` steps."""
    for step in range(steps):
        router, experts = router.detach().requires_grad_(), experts.detach().requires_grad_()
        losses = [((moe_reference(x, router, experts, k, factor) - target) ** 2).mean()
                  for x, target in (rank[step] for rank in batches)]
        d_router, d_experts = torch.autograd.grad(torch.stack(losses).mean(), [router, experts])
        router, experts = router - lr * d_router, experts - lr * d_experts
    return router.detach(), experts.detach()


def _train_traffic(batches: list, router, experts, k: int, factor: float, lr: float, ep: int) -> list[Budget]:
    """Each rank's bytes over the run, per step under the router of that step: its routed rows within its EP group
    (dispatched, combined back, the combine's gradient to the experts: the batches need no gradient, so the
    dispatch's way back is free; the ceiling allows it, and the counts), the router's gradient all-reduced over all
    ranks, its experts' over their DP group. A floor too: no batch and no expert travels instead of the tokens."""
    n, steps = len(batches), len(batches[0])
    dp, (d, e_count) = n // ep, router.shape
    least, most = [0.0] * n, [0.0] * n
    for step in range(steps):
        now, _ = train_reference(batches, router, experts, k, factor, lr, step)       # the router of this step
        for first in range(0, n, ep):
            group = Layer([batches[r][step][0] for r in range(first, first + ep)], now, experts, k, factor, "")
            out, back = group.routed_rows(ep)
            for i, (o, b) in enumerate(zip(out, back)):
                least[first + i] += (2 * o + b) * d * ITEM
                most[first + i] += 2 * (o + b) * d * ITEM
    grads = steps * (2 * (n - 1) / n * d * e_count + 2 * (dp - 1) / dp * (e_count // ep) * d * d) * ITEM
    counts = steps * e_count * 8 * (ep - 1) / ep
    why = (f"{steps} steps × (the rank's routed rows, there, back and the combine's gradient, + the router's gradient "
           f"all-reduced over all {n} ranks + its experts' over their {dp} DP replicas)")
    return [Budget("bytes_sent", [b + grads + counts for b in most], why + " + the counts and the dispatch's gradient",
                   hint="tokens travel to their experts inside the EP group; gradients are all-reduced, nothing "
                        "else: never the batches or the experts themselves."),
            Floor("bytes_sent", [b + grads for b in least], why,
                  hint="each rank routes its own tokens to the experts of its EP group by all_to_all_single.")]


def _train_case(rng: random.Random, n: int, ep: int = 2, k: Optional[int] = None,
                steps: Optional[int] = None) -> Case:
    layer = _layer(rng, n if ep == n else ep, per_rank_experts=rng.choice([1, 2]), k=k)
    e_count, d = layer.experts.shape[0], layer.router.shape[0]
    t_count = layer.xs[0].shape[0]
    gen = _gen(rng)
    batches = [[(torch.randn(t_count, d, generator=gen, dtype=torch.float64),
                 torch.randn(t_count, d, generator=gen, dtype=torch.float64)) for _ in range(STEPS)]
               for _ in range(n)]
    steps = STEPS if steps is None else steps     # the same draws, fewer steps: where a wrong run first leaves
    batches = [rank[:steps] for rank in batches]
    lr = 0.5
    router, experts = train_reference(batches, layer.router, layer.experts, layer.k, layer.factor, lr, steps)
    shards = experts.chunk(ep)
    expected = [(router.to(device()), shards[r % ep].clone().to(device())) for r in range(n)]
    args = (per_rank([[tuple(t.to(device()) for t in b) for b in rank] for rank in batches]),
            layer.router.to(device()), per_rank([c.clone().to(device()) for c in
                                                 (layer.experts.chunk(ep)[r % ep] for r in range(n))]),
            layer.k, layer.factor, lr, ep)
    return Case(n, args, expected,
                f"N={n}: {ep} EP × {n // ep} DP, E={e_count}, T={t_count} per rank, d={d}, k={layer.k}, "
                f"factor {layer.factor:g}, {steps} SGD steps",
                budgets=_train_traffic(batches, layer.router, layer.experts, layer.k, layer.factor, lr, ep),
                allowed_ops=frozenset({"all_to_all", "all_reduce"}), steps=steps,
                factors={"ep, the expert-parallel group size": ep, "dp, the data-parallel replicas": n // ep},
                explain=functools.partial(_train_explained, batches, layer, lr, ep))


def train_experts_summed_over(batches: list, layer: Layer, lr: float, ep: int, summed_with) -> list[tuple]:
    """Each rank's (router, experts) after SGD where rank r's experts' gradient, once its EP group's all-to-all has
    brought it home, is summed over the ranks summed_with(r) (its DP group in the reference) and divided by N: what
    an all-reduce of the experts' gradient over another group gives. Ranks' experts may drift apart; each EP group
    computes with its own members' shards."""
    n, steps = len(batches), len(batches[0])
    router, mine = layer.router, [layer.experts.chunk(ep)[r % ep] for r in range(n)]
    for step in range(steps):
        d_router, d_mine = torch.zeros_like(router), [None] * n
        for first in range(0, n, ep):
            members = range(first, first + ep)
            at = router.detach().requires_grad_()
            every = torch.cat([mine[r] for r in members]).detach().requires_grad_()
            loss = sum(((moe_reference(batches[r][step][0], at, every, layer.k, layer.factor) - batches[r][step][1])
                        ** 2).mean() for r in members)
            d_at, d_every = torch.autograd.grad(loss, [at, every])
            d_router += d_at
            for i, r in enumerate(members):
                d_mine[r] = d_every.chunk(ep)[i]
        mine = [mine[r] - lr * sum(d_mine[q] for q in summed_with(r)) / n for r in range(n)]
        router = router - lr * d_router / n
    return [(router.detach(), m.detach()) for m in mine]


def _train_explained(batches: list, layer: Layer, lr: float, ep: int, expected: list, got: list) -> Optional[str]:
    """The learner's experts replayed against an all-reduce of their gradient over the wrong ranks (every rank, or
    runs of consecutive ranks: ranks that hold different experts), else which replicas drifted apart."""
    n = len(batches)
    wrong_groups = {
        "every rank": lambda r: range(n),
        "consecutive ranks": lambda r: range(r // (n // ep) * (n // ep), (r // (n // ep) + 1) * (n // ep))}
    for said, summed_with in wrong_groups.items():
        members = sorted({tuple(summed_with(r)) for r in range(n)})
        if all(sorted(summed_with(r)) == list(range(r % ep, n, ep)) for r in range(n)):
            continue                                     # the DP groups themselves on this case
        theirs = train_experts_summed_over(batches, layer, lr, ep, summed_with)
        if all(isinstance(g, (tuple, list)) and len(g) == 2 and isinstance(g[1], torch.Tensor)
               and g[1].shape == t[1].shape and torch.allclose(g[1].detach().cpu().double(), t[1].double(),
                                                               rtol=1e-9, atol=1e-12) for g, t in zip(got, theirs)):
            return (f"Diagnosis: your experts are exactly what all-reducing their gradients over {said} gives "
                    f"({listing([str(list(m)) for m in members])}): those ranks hold different experts (rank r holds "
                    f"shard r % ep_size = r % {ep}), so the sum mixes one expert's gradient into another's. An "
                    f"expert's gradient is all-reduced over its DP group, the ranks with the same rank % ep_size "
                    f"({listing([str(list(range(j, n, ep))) for j in range(ep)])}); the EP group's all-to-all has "
                    "already summed its own ranks' share.")
    return drifted(expected, got, groups={"EP group": [range(s, s + ep) for s in range(0, n, ep)],
                                          "DP group": [range(j, n, ep) for j in range(ep)]},
                   why=TRAIN_DRIFT, rtol=1e-9, atol=1e-12, outputs=TRAIN_OUTPUTS)


TRAIN_OUTPUTS = {"[0]": "the router", "[1]": "your experts"}
TRAIN_DRIFT = {
    "EP group": "What made them equal ran within the EP group only: the router is trained by every rank's tokens, so "
                "its gradient is all-reduced over all N ranks, the DP replicas too; an expert's over its DP group "
                "(the ranks holding the same experts).",
    "DP group": "What made them equal ran within the DP group only: the router's gradient is all-reduced over all N "
                "ranks, the EP group's too.",
    "": "Nothing made them equal: all-reduce the router's gradient over every rank and each expert's over its DP "
        "group, once per step."}


moe_train = Puzzle(
    "moe_train", NOTEBOOK, _train_case, world_sizes=(4, 4, 2, 4), variants=[{"k": 2}, {}, {}, {"ep": 4}],
    outputs=TRAIN_OUTPUTS,
    real_scale=_layer_scale,
    rtol=1e-9, atol=1e-12, min_world_size=2, min_world_size_reason="its experts live on different ranks",
    hints=["Two kinds of groups: EP groups of ep_size consecutive ranks (they share experts' work through the "
           "all-to-all) and DP groups of the ranks with the same rank % ep_size (they hold the same experts). "
           "Every rank creates every group, in the same order.",
           "Each step: y = moe_layer_backward(..., group=your EP group); loss = ((y - target) ** 2).mean(); "
           "torch.autograd.grad(loss, [router, experts]).",
           "The objective is the mean of the N ranks' losses. The router's gradient: all-reduce over all ranks. "
           "The experts' gradient already sums the losses of your EP group's tokens: all-reduce it over your DP "
           "group only. Divide both by N, then step."],
    describe="SGD on an MoE layer over a mesh of expert-parallel × data-parallel ranks, equal to one device.")


# ---- 6. the capacity a drop budget needs --------------------------------------------------------------------
def capacity_reference(logits: torch.Tensor, k: int, max_dropped: float) -> tuple[int, int]:
    """(the smallest capacity, in slots per expert, that drops at most max_dropped of the T·k choices, the padded
    slots it leaves), trying every capacity from 1 up, one at a time."""
    t_count, experts = logits.shape
    load = [0] * experts
    for row in logits.topk(k, dim=-1).indices.tolist():
        for e in row:
            load[e] += 1
    cap = 1
    while sum(max(0, n - cap) for n in load) > allowed_drops(max_dropped, t_count * k):
        cap += 1
    kept = sum(min(n, cap) for n in load)
    return cap, cap * experts - kept


def allowed_drops(max_dropped: float, choices: int) -> int:
    """The whole choices a budget of max_dropped of `choices` allows: its product's floor, within round-off (0.29 of
    100 choices is 28.999999999999996 in floating point, and 29 choices)."""
    return math.floor(max_dropped * choices + ROUND_OFF)


ROUND_OFF = 1e-9        # far above a product's round-off at these counts, far below a whole choice


FACTOR_STEP = Fraction(1, 20)         # the finest step of a search over capacity factors the cases outwit
FACTOR_STEPS = (Fraction(1, 4), Fraction(1, 10), FACTOR_STEP)


def _on_factor_grid(cap: int, t_count: int, experts: int, k: int, step: Fraction = FACTOR_STEP,
                    round_off: bool = True) -> Optional[Fraction]:
    """The capacity factor, a multiple of `step`, whose capacity ceil(k·T·factor / E) is `cap`, or (with round_off)
    one more where k·T·factor / E is whole (factors summed step by step in floating point land a hair above it);
    None if none."""
    j = 1
    while math.ceil(k * t_count * step * j / experts) <= cap:
        slots = k * t_count * step * j / experts
        if cap in (math.ceil(slots), slots + 1 if round_off else None):
            return step * j
        j += 1
    return None


def _factor_searched(mine: int, cap: int, t_count: int, experts: int, k: int) -> Optional[str]:
    """`mine` as the first capacity a search over capacity factors in steps of 0.25, 0.1 or 0.05 reaches, where the
    right one lies between two of its capacities."""
    for step in FACTOR_STEPS:
        slots = k * t_count * step / experts
        found = _on_factor_grid(mine, t_count, experts, k, step) if mine > cap and slots > 1 else None
        if found is not None and _on_factor_grid(cap, t_count, experts, k, step, round_off=False) is None:
            return (f"It is the capacity of the factor {float(found):g}, ceil(k·T·factor / E): a search over capacity "
                    f"factors in steps of {float(step):g} moves C by k·T·{float(step):g}/E = {float(slots):.3g} "
                    f"slots a step here and skips {cap}. Search the capacity C itself, one slot at a time (or "
                    "bisect it).")
    return None


def _off_the_grid(rng: random.Random, experts: int, k: int) -> tuple[torch.Tensor, float]:
    """Logits with k·T/E of at least 60 (a step of 0.05 in the capacity factor moves C by 3 slots or more) and a
    budget whose smallest capacity no such factor gives: a search over factors skips it. The budget is halfway
    between two whole choices, so no comparison hinges on round-off, and one choice above what that capacity drops:
    the case where a strict < for "at most" gives the right capacity too (the others meet their budgets exactly),
    which tells it from a capacity one slot too large."""
    while True:
        t_count = experts * rng.randint(60, 80) // k
        logits = _logits(rng, t_count, experts, rng.choice([1.0, 2.0]))
        load = _loads(logits, k)
        caps = [c for c in range(2, max(load)) if _drops(load, c) + 1 < _drops(load, c - 1)
                and _on_factor_grid(c, t_count, experts, k) is None]
        if caps:
            cap = rng.choice(caps)
            return logits, (_drops(load, cap) + 1.5) / (t_count * k)


def _exactly_met(rng: random.Random, logits: torch.Tensor, k: int) -> float:
    """A drop budget that some capacity meets exactly (drops = max_dropped·T·k, "at most" includes it): T·k is a
    power of two here, so max_dropped·T·k is exact in floating point, computed in any order."""
    t_count = logits.shape[0]
    load = torch.tensor(_loads(logits, k))
    drops = [int((load - c).clamp(min=0).sum()) for c in range(1, int(load.max()))]
    return rng.choice([d for d in drops if d > 0]) / (t_count * k)


def _capacity_case(rng: random.Random, _world: int, k: Optional[int] = None,
                   max_dropped: Optional[float] = None, exact: bool = False, coarse: bool = False) -> Case:
    """exact: a budget some capacity meets exactly; coarse: one whose capacity no factor k·T·(0.05 j)/E gives."""
    k = k or rng.choice([1, 2])
    experts = rng.randint(4, 16)
    if coarse:
        logits, max_dropped = _off_the_grid(rng, experts, k)
        t_count = logits.shape[0]
    else:
        t_count = rng.choice([64, 128]) if exact else experts * rng.randint(4, 16)
        logits = _logits(rng, t_count, experts, rng.choice([1.0, 2.0]))
    if exact:
        max_dropped = _exactly_met(rng, logits, k)
    elif max_dropped is None:
        max_dropped = rng.choice([0.0, 0.01, 0.05, 0.1, 0.25])
    cap, padded = capacity_reference(logits, k, max_dropped)
    share = f"{max_dropped:.4g} ({allowed_drops(max_dropped, t_count * k)} choices)" if exact or coarse else \
        f"{max_dropped:.0%}"
    return Case(1, (*_on_device(logits), k, max_dropped), [(cap, padded)],
                f"T={t_count}, E={experts}, k={k}, at most {share} of the choices dropped",
                formulas={"[1]": _padding_formula(logits, k, cap, padded)},
                explain=functools.partial(_capacity_explained, logits, k, max_dropped), reads_others=True)


def _loads(logits: torch.Tensor, k: int) -> list[int]:
    """How many of the T·k top-k choices pick each expert."""
    return torch.bincount(logits.topk(k, dim=-1).indices.flatten().cpu(), minlength=logits.shape[1]).tolist()


def _drops(load: list[int], cap: int) -> int:
    return sum(max(0, n - cap) for n in load)


def _capacity_explained(logits: torch.Tensor, k: int, max_dropped: float, expected: list,
                        got: list, others: Callable = lambda wanted=None: iter(())) -> Optional[str]:
    """The learner's capacity against the case's loads: what it drops against the budget, a smaller one that meets
    it, the budget it is the smallest capacity for (max_dropped × which count of the case, or max_dropped itself as a
    count), a budget met exactly and refused (< for "at most", told from one slot too many by the answer's other
    cases), or drops counted without clamping; and what the second number is, where the capacity is right."""
    (cap, padded), answer = expected[0], got[0]
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2 and all(isinstance(a, int) for a in answer)):
        return None
    mine, second = answer
    load, (t_count, experts) = _loads(logits, k), logits.shape
    allowed = allowed_drops(max_dropped, t_count * k)
    said = []
    if mine != cap and mine >= 1:
        drops = _drops(load, mine)
        said.append(f"capacity {mine} drops {drops} of the {t_count * k} choices, "
                    + (f"over the budget of {allowed:g} (max_dropped × T·k)." if drops > allowed else
                       f"within the budget of {allowed:g}, and a smaller capacity meets it too: {mine - 1} drops "
                       f"{_drops(load, mine - 1)}, and the smallest that does is {cap}."))
        # Counts of the case a budget may have been taken of, besides T·k: (the count, what taking it means)
        counts = {"T, the tokens": (t_count, "k left out"),
                  "T·E, every logit": (t_count * experts, "E where k belongs"),
                  "T·k/E, an expert's even share": (t_count * k / experts, "a share of one expert, not of all"),
                  "E, the experts": (experts, "the experts, not the choices")}
        fits = [c for c, (n, _) in counts.items()
                if _drops(load, mine) <= max_dropped * n < (_drops(load, mine - 1) if mine > 1 else math.inf)]
        product = max_dropped * t_count * k
        firsts = _loads(logits, 1)
        firsts_fit = k > 1 and any(_drops(firsts, mine) <= budget < (_drops(firsts, mine - 1) if mine > 1 else math.inf)
                                   for budget in (allowed, allowed_drops(max_dropped, t_count)))
        searched = _factor_searched(mine, cap, t_count, experts, k)
        past = _one_past(cap, allowed, _drops(load, cap) == allowed, others) if mine == cap + 1 else None
        if int(product) < allowed and _drops(load, mine) <= int(product) < _drops(load, mine - 1):
            said.append(f"It is the smallest capacity for {int(product)} choices, max_dropped × T·k truncated: the "
                        f"product is {product!r} in floating point, round-off short of {allowed} whole choices.")
        elif past and past[0]:
            said.append(past[1])
        elif drops == 0 and mine == max(load) and allowed > 0:
            counted = (f" (read as a number of choices, {max_dropped:g} allows none)" if max_dropped < 1 else "")
            said.append(f"It is the busiest expert's load, the smallest capacity that drops nothing, as if no drop "
                        f"were allowed: max_dropped = {max_dropped:g} is a share of the T·k = {t_count * k} choices, "
                        f"not a number of them{counted}: {max_dropped:g} × {t_count * k} = {allowed:g} may drop.")
        elif max_dropped > 0 and len(fits) == 1 and not (firsts_fit and fits[0] != "T, the tokens"
                                                         and _right_where_k_is_1(others)):
            n, meaning = counts[fits[0]]
            said.append(f"It is the smallest capacity for a budget of max_dropped × {fits[0]} = "
                        f"{max_dropped * n:g} choices ({meaning}): the choices that claim slots number T·k.")
        elif firsts_fit:
            said.append(f"It is the smallest capacity for the loads of the first choices alone: each token makes "
                        f"k = {k} choices and every one claims a slot, so an expert's load L_e counts all the T·k "
                        "choices that pick it (bincount of all of topk(k).indices).")
        elif searched:
            said.append(searched)
        elif past:
            said.append(past[1])
        signed = next((c for c in range(1, max(load) + 2) if sum(n - c for n in load) <= allowed), None)
        if signed == mine:
            said.append("It is the smallest capacity whose Σ(load - C) meets the budget: experts below capacity "
                        "count negative and cancel the others' overflow; a drop is max(0, load - C).")
    elif mine == cap and second != padded:
        kept = sum(min(n, cap) for n in load)
        meaning = {cap * experts - t_count * k: "the C × E slots less all T·k choices, the dropped ones too: a "
                                                "dropped choice fills no slot, so only the kept ones are subtracted",
                   cap * experts - sum(min(n, cap) for n in _loads(logits, 1)): "the C × E slots less the "
                   "choices kept of the first choices alone: every one of a token's k choices claims a slot, so "
                   "the loads count all T·k",
                   _drops(load, cap): "the choices it drops, not the padding",
                   kept: "the choices it keeps, not the padding",
                   cap * experts: "all the C × E slots, not the padding"}.get(second)
        if meaning:
            said.append(f"your second number, {second}, is {meaning} (the C × E = {cap * experts} slots less the "
                        f"{kept} kept choices: {padded}).")
    return f"Diagnosis: {' '.join(said)}" if said else None


def _one_past(cap: int, allowed: int, exactly: bool, others: Callable) -> Optional[tuple[bool, str]]:
    """A capacity one above the smallest: one slot too many everywhere, or, where the smallest drops `exactly` the
    budget, a strict < for "at most". The answer's other cases tell: where the smallest capacity drops less than the
    budget, < and <= agree, and one slot too many is still wrong; one slot too many is one above on every case (a
    search over capacity factors is one above on some by chance, and right where its grid has the capacity).
    (Whether they told, the words), or None."""
    strict = f"{cap} drops exactly the budget of {allowed}, and \"at most\" allows it: dropped <= budget, not <."
    above = []              # per other case answered: (its label, its smallest capacity drops less, answer - capacity)
    for other, results in others(lambda case: case.reads_others):
        answer = results[0] if results else None
        if isinstance(answer, (tuple, list)) and answer and isinstance(answer[0], int):
            above.append((other.label, _met_below(other), answer[0] - other.expected[0][0]))
    right = [label for label, below, off in above if below and off == 0]
    if exactly and right:
        return True, (f"Your capacity is right where the smallest capacity drops less than the budget ({right[0]}), "
                      f"and one too many here, where {strict}")
    if above and all(off == 1 for _, _, off in above):
        return True, "Your capacity is one slot too many on the check's other cases too: stop at the first C that fits."
    if not exactly:
        return None
    return False, (f"Either {strict[0].lower()}{strict[1:-1]}; or the search returns one slot past the first C that "
                   "fits.")


def _right_where_k_is_1(others: Callable) -> bool:
    """Whether the answer's capacity was right on another case of the check with k = 1, where a budget taken of
    another count than T·k (or T, the same there) would be wrong too, and the first choices are all the choices."""
    for other, results in others(lambda case: case.reads_others and case.args[1] == 1):
        answer = results[0] if results else None
        return isinstance(answer, (tuple, list)) and bool(answer) and answer[0] == other.expected[0][0]
    return False


def _met_below(case) -> bool:
    """Whether `case` is smallest_capacity's and its smallest capacity drops fewer choices than its budget allows."""
    if not case.reads_others:
        return False
    logits, k, max_dropped = case.args[:3]
    return _drops(_loads(logits, k), case.expected[0][0]) < allowed_drops(max_dropped, logits.shape[0] * k)


class SearchFoundNothing(PuzzleError):
    """smallest_capacity's search ran out without a capacity."""


def _capacity_harness(answer, _dist, logits, k, max_dropped):
    """The answer's (capacity, padding); a search that runs out (next() over an empty generator) said in the case's
    terms: the capacity it should have reached."""
    try:
        return answer(logits, k, max_dropped)
    except StopIteration:
        cap, _ = capacity_reference(logits, k, max_dropped)
        largest = max(_loads(logits, k))
        raise SearchFoundNothing(
            "your search for a capacity ran out without one (StopIteration: a next() over candidates that all "
            f"failed). The smallest capacity that meets this budget is {cap}"
            + (_strictly_under(answer, logits, k, max_dropped, cap) or
               (f", the busiest expert's load: a range(1, {largest}) stops before it (a range's end is excluded)"
                if cap == largest else "")) + ".") from None


def _strictly_under(answer, logits: torch.Tensor, k: int, max_dropped: float, cap: int) -> Optional[str]:
    """Words for a search that found nothing because it asks for fewer drops than the budget (dropped < budget):
    the answer, given half a choice more of budget (so that < lets through what <= lets through here), returns the
    capacity that drops exactly this budget."""
    choices = logits.shape[0] * k
    allowed = allowed_drops(max_dropped, choices)
    try:
        found = answer(logits, k, (allowed + 0.5) / choices)
    except Exception:
        return None
    if not (isinstance(found, (tuple, list)) and found and found[0] == cap):
        return None
    return (f", which drops {_drops(_loads(logits, k), cap)}, exactly the budget of {allowed}; given half a choice "
            f"more of budget your search returns {cap}: it asks for fewer drops than the budget, where \"at most\" "
            "allows the budget itself: dropped <= budget, not <")


def _padding_formula(logits: torch.Tensor, k: int, cap: int, padded: int) -> Formula:
    """The padded slots as named terms (lib.checker.terms): C·E slots less the kept choices, Σ_e min(L_e, C)."""
    experts, load = logits.shape[1], _loads(logits, k)
    c = Q("C", cap, "the capacity")
    kept = sum((minimum(n, c) for n in load), Num(0))
    found = formula(term("the C × E slots", c * Q("E", experts, "the experts"))
                    - term("the kept choices, Σ_e min(L_e, C)", kept), "slots")
    assert found.value == padded, (found.value, padded)
    return found


smallest_capacity = Puzzle(
    "smallest_capacity", NOTEBOOK, _capacity_case, world_sizes=(1, 1, 1, 1, 1), takes_dist=False, rtol=1e-12,
    harness=_capacity_harness,
    variants=[{"k": 2, "max_dropped": 0.1}, {"k": 1, "max_dropped": 0.05}, {"max_dropped": 0.0}, {"exact": True},
              {"coarse": True}],
    atol=0, off_limits=OFF_LIMITS, off_limits_advice=OFF_LIMITS_ADVICE,
    hints=["Count each expert's load L_e (how many top-k choices pick it). A capacity C drops Σ_e max(0, L_e - C) "
           "choices; find the smallest C that drops at most max_dropped · T · k, trying C itself (1, 2, 3, ... or "
           "by bisection), not capacity factors.",
           "Padded slots: the C · E slots minus the kept choices, Σ_e min(L_e, C).",
           "Return two Python ints: (C, C * E - kept). No capacity is smaller than 1; torch.bincount counts "
           "the loads, (load - C).clamp(min=0).sum() the drops."],
    describe="The smallest capacity a drop budget allows, and the padding it costs.")


def capacity_costs(fn, tokens: int = 4096, experts: int = 64, k: int = 2, skew: float = 0.2, ranks: int = 8,
                   budgets=(0.0, 0.01, 0.05, 0.1)) -> Optional[list[tuple]]:
    """Your smallest_capacity on one skewed router (DeepSeek-V3's hidden 7168 in bf16 per row), for several drop
    budgets: the capacity and its factor, the padded share of the experts' compute, and the bytes a rank's
    dispatch and combine send over `ranks` EP ranks, by uneven splits (the kept rows) and padded (every slot).
    None (and why, printed) while fn does not run."""
    from lib.analytic.moe import routing, skewed_logits

    logits = skewed_logits(tokens, experts, skew)
    print(f"{tokens} tokens per rank, E={experts}, k={k}, router skew {skew:g}, rows of {REAL_HIDDEN} bf16 values, "
          f"{ranks} EP ranks:")
    rows = []
    for budget in budgets:
        try:
            cap, padded = fn(logits, k, budget)
        except NotImplementedError:
            print("○ solve smallest_capacity first to see this.")
            return None
        factor = cap * experts / (k * tokens)
        r = routing(logits, k, factor, ranks=ranks, row_bytes=REAL_HIDDEN * 2)
        slots = 2 * cap * experts * (ranks - 1) / ranks * REAL_HIDDEN * 2
        rows.append((budget, cap, factor, padded / (cap * experts), r.all_to_all_bytes, slots))
        print(f"drops ≤ {budget:>4.0%}: C = {cap:>4} (factor {factor:.2f}), {padded / (cap * experts):.0%} of the "
              f"experts' slots padding; sent per rank and layer: {fmt_bytes(r.all_to_all_bytes)} by uneven "
              f"splits, {fmt_bytes(slots)} padded")
    return rows


PUZZLES = [top_k_route, router_losses, moe_layer, moe_layer_backward, moe_train, smallest_capacity]
