"""Which Adam a training run took: the learner's parameters against Adam written with one of its settings changed.

Adam's mistakes (a bias correction left out or counted from 0, ε inside the root, gradients never zeroed, its state
or one of its moments made anew each step, a step count that never advances or advances per tensor) each leave a run
that a replay with that one change reproduces exactly. The run's own evidence
decides between them, where a factor at the first step cannot (no correction of v and a correction counted from 0
both make step 1's update 1/√(1 - β₂) times Adam's). The factors are said from the case's own β₁ and β₂.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

BETAS, EPS = (0.9, 0.999), 1e-8        # torch.optim.Adam's defaults, which the statement asks to match


@dataclass(frozen=True)
class Variant:
    """Adam with one setting changed, and the mistake it is in a learner's words."""

    said: str
    correct_m: int = 0          # the step count m's bias correction uses is t + correct_m (None: no correction)
    correct_v: Optional[int] = 0
    m_corrected: bool = True
    eps_inside: bool = False
    eps_before: bool = False    # ε added to √v before v's correction: the step size lr·√(1 - β₂ᵗ)/(1 - β₁ᵗ) on √v + ε
    v_power: int = 1            # v's correction taken to this power (2: 1 - β₂ᵗ where its square root belongs)
    zero_grads: bool = True
    fresh_state: bool = False
    fresh_m: bool = False       # m alone made anew each step (v carried), or v alone (fresh_v)
    fresh_v: bool = False
    momentum: bool = True       # False: the gradient g where m̂ belongs in the update
    root: bool = True           # False: v̂ where √v̂ belongs in the update
    step_count: str = "step"    # the t of the corrections: the step's number; "first": 1 at every step; "per_tensor":
                                # advanced once per parameter tensor (t += 1 inside the loop over parameters)
    betas: tuple = BETAS


def variants(b1: float = BETAS[0], b2: float = BETAS[1]) -> list[Variant]:
    """The one-setting mistakes, with their factors at step 1 from β₁ and β₂."""
    both = (1 - b1) / math.sqrt(1 - b2)
    v_only = 1 / math.sqrt(1 - b2)
    return [
        Variant(f"m and v used without their bias corrections (m̂ = m / (1 - β₁ᵗ), v̂ = v / (1 - β₂ᵗ)): at step 1 "
                f"every update is (1 - β₁)/√(1 - β₂) = {1 - b1:g}/√{1 - b2:g} = {both:.4g}× Adam's, and the "
                "difference fades as t grows", correct_v=None, m_corrected=False),
        Variant(f"v used without its bias correction (v̂ = v / (1 - β₂ᵗ)): at step 1 every update is "
                f"1/√(1 - β₂) = {v_only:.4g}× Adam's", correct_v=None),
        Variant("m used without its bias correction (m̂ = m / (1 - β₁ᵗ)): at step 1 every update is "
                f"1 - β₁ = {1 - b1:g}× Adam's", m_corrected=False),
        Variant(f"v's bias correction counted from step 0 (1 - β₂ᵗ⁻¹, none at the first step): at step 1 every "
                f"update is 1/√(1 - β₂) = {v_only:.4g}× Adam's; count t from 1 for both corrections", correct_v=-1),
        Variant("m's bias correction counted from step 0 (1 - β₁ᵗ⁻¹, none at the first step); count t from 1 for "
                "both corrections", correct_m=-1),
        Variant("ε inside the square root: √(v̂ + ε) where Adam divides by √v̂ + ε (the updates differ where v̂ is "
                "small)", eps_inside=True),
        Variant("the gradients never zeroed between steps: backward adds into .grad, so each step's gradient is the "
                "sum of every step's so far; zero them after each update (p.grad = None, or model.zero_grad())",
                zero_grads=False),
        Variant("m and v made anew at every step: Adam's state must carry from one step to the next (create it once, "
                "before the loop)", fresh_state=True),
        Variant("v made anew at every step while m carries: both moving averages are Adam's state and carry from "
                "one step to the next (create v once, before the loop, as m is)", fresh_v=True),
        Variant("m made anew at every step while v carries: both moving averages are Adam's state and carry from "
                "one step to the next (create m once, before the loop, as v is)", fresh_m=True),
        Variant("the step count t never advanced: the bias corrections use t = 1 at every step, where step t "
                "divides by 1 - β₁ᵗ and 1 - β₂ᵗ (t = 1, 2, 3, ...: count the steps)", step_count="first"),
        Variant("the step count t advanced once per parameter tensor (t += 1 inside the loop over the parameters), "
                "so each tensor's bias corrections use a t of its own: t counts optimizer steps, once per step for "
                "every parameter", step_count="per_tensor"),
        Variant("β₁ and β₂ swapped (m's average takes β₂, v's β₁)", betas=(b2, b1)),
        Variant("the gradient g where m̂ belongs in the update: step 1 is Adam's (m̂ = g there), and from step 2 on "
                "the update has no momentum; the numerator is m̂ = m / (1 - β₁ᵗ)", momentum=False),
        Variant("v̂ where √v̂ belongs: the update divides by the second moment itself, not by its square root "
                "(m̂ / (v̂.sqrt() + ε))", root=False),
        Variant("the step size lr·√(1 - β₂ᵗ)/(1 - β₁ᵗ) on m / (√v + ε): ε is then added before v's bias correction, "
                "an ε of ε·√(1 - β₂ᵗ) in torch.optim.Adam's terms, which adds it after, √v̂ + ε (the updates differ "
                "where v is small); divide by (v.sqrt() / √(1 - β₂ᵗ)) + ε", eps_before=True),
        Variant(f"v's bias correction without its square root, lr·(1 - β₂ᵗ)/(1 - β₁ᵗ) where lr·√(1 - β₂ᵗ)/(1 - β₁ᵗ) "
                f"belongs: at step 1 every update is √(1 - β₂) = {math.sqrt(1 - b2):.4g}× Adam's", eps_before=True,
                v_power=2),
    ]


def adam_run(model: torch.nn.Module, batches: Sequence, lr: float, loss: Callable, how: Variant = Variant("Adam")
             ) -> dict[str, torch.Tensor]:
    """The parameters after Adam with `how`'s settings, on a copy of `model`; `loss(model, batch)` is the step's
    loss."""
    model = copy.deepcopy(model)
    params = list(model.parameters())
    b1, b2 = how.betas
    m = v = None
    for step, batch in enumerate(batches, start=1):
        if how.zero_grads or step == 1:
            for p in params:
                p.grad = None
        if m is None or how.fresh_state or how.fresh_m:
            m = [torch.zeros_like(p) for p in params]
        if v is None or how.fresh_state or how.fresh_v:
            v = [torch.zeros_like(p) for p in params]
        loss(model, batch).backward()
        with torch.no_grad():
            for i, (p, m_i, v_i) in enumerate(zip(params, m, v)):
                t = {"step": step, "first": 1, "per_tensor": (step - 1) * len(params) + i + 1}[how.step_count]
                m_i.mul_(b1).add_(p.grad, alpha=1 - b1)
                v_i.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                m_hat = m_i / (1 - b1 ** (t + how.correct_m)) if how.m_corrected and t + how.correct_m else m_i
                tv = None if how.correct_v is None else t + how.correct_v
                v_hat = v_i / (1 - b2 ** tv) ** how.v_power if tv else v_i
                denom = ((v_hat + EPS).sqrt() if how.eps_inside else
                         (v_i.sqrt() + EPS) / (1 - b2 ** tv) ** (how.v_power / 2) if how.eps_before and tv else
                         (v_hat.sqrt() if how.root else v_hat) + EPS)
                p.sub_(lr * (m_hat if how.momentum else p.grad) / denom)
    return {name: p.detach() for name, p in model.named_parameters()}


def named_tensors(result) -> Optional[dict[str, torch.Tensor]]:
    """A result's parameters by name: a module's, or a dict's tensors; None for anything else."""
    if isinstance(result, torch.nn.Module):
        return {name: p.detach() for name, p in result.named_parameters()}
    if isinstance(result, dict) and all(isinstance(t, torch.Tensor) for t in result.values()):
        return dict(result)
    return None


def _same(a: dict, b: dict, rtol: float, atol: float) -> bool:
    return a.keys() == b.keys() and all(a[k].shape == b[k].shape and
                                        torch.allclose(a[k].double(), b[k].double(), rtol=rtol, atol=atol)
                                        for k in a)


def which(model: torch.nn.Module, batches: Sequence, lr: float, loss: Callable, expected, got,
          rtol: float = 1e-6, atol: float = 1e-9) -> Optional[str]:
    """The mistake whose Adam gives the learner's parameters, in words; None when none does (or when Adam written
    here does not give the reference's, so that no variant of it may be trusted)."""
    mine, want = named_tensors(got), named_tensors(expected)
    if mine is None or want is None or not _same(adam_run(model, batches, lr, loss), want, rtol, atol):
        return None
    for how in variants():
        if _same(adam_run(model, batches, lr, loss, how), mine, rtol, atol):
            return f"your parameters are exactly what Adam gives with {how.said}."
    return None
