"""Cheats on notebook 01's training puzzles, each with the words its rejection must contain. (Its prediction
puzzles have their own guards, with their own messages.)"""

import inspect

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import lib
import lib.analytic.formulas
import puzzles.memory as P
from puzzles.zero import adam_update
import solutions.memory as S
from tests.cheats.common import everywhere, under_identity_hooks

TRAINING = ("checkpointed_step", "accumulated_step", "offloaded_adam_train")


def plain_step(model, tokens, targets):
    """No recomputation at all: every block's activations kept until backward."""
    model.loss(tokens, targets).backward()
    return model


def plain_accumulation(model, tokens, targets, k):
    """The whole batch at once, k ignored."""
    return plain_step(model, tokens, targets)


def checkpoint_every_other_block(model, tokens, targets):
    """Recomputes pairs of blocks: half the layer inputs kept, two blocks' activations at a time."""
    x = model.embed(tokens)
    blocks = list(model.blocks)
    for i in range(0, len(blocks), 2):
        pair = blocks[i:i + 2]
        x = checkpoint(lambda t, pair=pair: pair[-1](pair[0](t)) if len(pair) == 2 else pair[0](t), x,
                       use_reentrant=False)
    model.head_loss(x, targets).backward()
    return model


def _on_the_host(solution):
    """The reference solution with the model and its inputs moved to host memory, out of the device's budget."""
    def cheat(model, tokens, targets, *rest):
        model.to(lib.host())
        return solution(model, tokens.to(lib.host()), targets.to(lib.host()), *rest)
    cheat.__name__ = f"{solution.__name__}_on_the_host"
    return cheat


def adam_with_the_model_on_the_host(model, batches, lr):
    """torch.optim.Adam with the model, its inputs and so forward and backward moved to host memory."""
    model.to(lib.host())
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for tokens, targets in batches:
        opt.zero_grad()
        model.loss(tokens.to(lib.host()), targets.to(lib.host())).backward()
        opt.step()
    return model


_FORMULAS = dict(vars(lib.analytic.formulas))
_STATE_BYTES_SOURCE = inspect.getsource(lib.analytic.formulas.model_state_bytes).replace("def model_state_bytes(",
                                                                              "def state_bytes(")


def training_state_by_a_copy_of_the_formula(config):
    """lib.analytic.formulas.model_state_bytes, exec'd from its source under another name inside the check."""
    namespace = dict(_FORMULAS)
    exec(_STATE_BYTES_SOURCE, namespace)
    return _pieces(namespace["state_bytes"](S.count_parameters(config)))


def _pieces(total):
    """The formula's 16 B a parameter cut into the statement's pieces, 2 + 2 + 4 + 4 + 4."""
    return {"weights": total // 8, "gradients": total // 8, "master": total // 4, "m": total // 4, "v": total // 4}


_COPIED = dict(_FORMULAS)
exec(_STATE_BYTES_SOURCE, _COPIED)        # as a notebook cell would, before the check


def training_state_by_a_copy_made_before(config):
    """The same copy, made before the check (in a notebook cell) and only called inside it."""
    return _pieces(_COPIED["state_bytes"](S.count_parameters(config)))


CHEATS = [c for c in everywhere(P) if c[0] in TRAINING] + [
    ("checkpointed_step", under_identity_hooks(plain_step), "peak memory"),
    ("checkpointed_step", checkpoint_every_other_block, "peak memory"),
    ("checkpointed_step", _on_the_host(S.checkpointed_step), "peak host memory"),
    ("accumulated_step", _on_the_host(S.accumulated_step), "peak host memory"),
    ("accumulated_step", under_identity_hooks(plain_accumulation), "whole batch of"),
    ("offloaded_adam_train", adam_with_the_model_on_the_host, "FLOPs computed in host memory"),
    ("training_state_bytes", training_state_by_a_copy_of_the_formula,
     "this puzzle puts lib.analytic.formulas (state_bytes)"),
    ("training_state_bytes", training_state_by_a_copy_made_before,
     "this puzzle puts lib.analytic.formulas (state_bytes)"),
]


# ---- gradient accumulation met by another technique ------------------------------------------------------------
def accumulation_by_checkpointing(model, tokens, targets, k):
    """The whole batch at once, each block checkpointed: one big batch's gradients under the accumulation budget,
    with no micro-batch at all (and a forward computed twice)."""
    return S.checkpointed_step(model, tokens, targets)


def accumulation_sample_by_sample(model, tokens, targets, k):
    """One sample per micro-batch, whatever k asks: the same gradients with smaller pieces, under any budget the
    asked-for micro-batches meet."""
    return S.accumulated_step(model, tokens, targets, len(tokens))


def checkpointing_by_accumulation(model, tokens, targets):
    """No recomputation: the batch one sequence at a time, each loss over the batch's size, gradients accumulated.
    Found by a red team that read only the notebook (2026-12-08): it met the checkpointing budget on the seeds whose
    case drew a batch large against the layers (1 and 2 of 0-11)."""
    for i in range(len(tokens)):
        (model.loss(tokens[i:i + 1], targets[i:i + 1]) / len(tokens)).backward()
    return model


CHEATS += [("checkpointed_step", checkpointing_by_accumulation, "gradient accumulation")]


CHEATS += [("accumulated_step", accumulation_by_checkpointing, "that is no gradient accumulation"),
           ("accumulated_step", accumulation_sample_by_sample, "largest tensor")]


# ---- the offloaded optimizer's step taken on the device ----------------------------------------------------------
def offload_state_stepped_on_the_device(model, batches, lr, betas=(0.9, 0.999), eps=1e-8):
    """m and v stored in host memory, each brought to the device for its parameter's update (notebook 03's
    adam_update) and sent back: the device's peak meets the budget one parameter at a time, while the device computes
    Adam's step."""
    host, device = lib.host(), lib.device()
    params = list(model.parameters())
    m = [torch.zeros_like(p, device=host) for p in params]
    v = [torch.zeros_like(p, device=host) for p in params]
    for t, (tokens, targets) in enumerate(batches, start=1):
        model.zero_grad()
        model.loss(tokens, targets).backward()
        with torch.no_grad():
            for i, p in enumerate(params):
                m_i, v_i = m[i].to(device), v[i].to(device)
                adam_update(p, p.grad, m_i, v_i, t, lr, betas, eps)
                m[i], v[i] = m_i.to(host), v_i.to(host)
    return model


CHEATS += [("offloaded_adam_train", offload_state_stepped_on_the_device, "the step runs where the state lives")]


# ---- a prediction measured rather than derived ---------------------------------------------------------------
def activations_measured_by_a_hook(s, b, h, a):
    """One block written in torch ops with random bf16 weights (no module built), the tensors autograd saves added
    up by a saved-tensors hook: the number measured, not derived from the block's code. (This one counts 5-7% over
    the check's measurement, outside its 2%; the measuring, not its care, is what the puzzle refuses.)"""
    def weight(rows, cols):
        return torch.randn(rows, cols, dtype=torch.bfloat16, requires_grad=True)
    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    kept = []

    def pack(t):
        base = t if t._base is None else t._base
        if not (base.requires_grad and base.is_leaf and base is not x) and not any(base is k for k in kept):
            kept.append(base)
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        q, k, v = (F.layer_norm(x, (h,)) @ weight(h, 3 * h)).split(h, -1)
        q, k, v = (t.view(b, s, a, h // a).transpose(1, 2) for t in (q, k, v))
        scores = F.dropout(torch.softmax(q @ k.transpose(-1, -2) / (h // a) ** 0.5, -1), 0.1)
        y = x + F.dropout((scores @ v).transpose(1, 2).reshape(b, s, h) @ weight(h, h), 0.1)
        F.dropout(F.gelu(F.layer_norm(y, (h,)) @ weight(h, 4 * h)) @ weight(4 * h, h), 0.1)
    return sum(t.untyped_storage().nbytes() for t in kept)


def activations_measured_by_the_profiler(s, b, h, a):
    """The block in torch ops (random bf16 weights, no module built) under torch.profiler with profile_memory=True:
    what its forward allocates and keeps, less the output, plus the input LayerNorm saves (allocated before). Found
    by a red team that read only the notebook (2026-12-08): right to the byte, it passed every seed."""
    from torch.profiler import ProfilerActivity, profile

    def w(*shape):
        return torch.randn(*shape, dtype=torch.bfloat16, requires_grad=True)

    def drop(t, p):
        return t.masked_fill(torch.rand(t.shape) < p, 0) / (1 - p)
    W = dict(ln1=w(h), ln1b=w(h), qkv=w(3 * h, h), qkvb=w(3 * h), pr=w(h, h), prb=w(h),
             ln2=w(h), ln2b=w(h), f1=w(4 * h, h), f1b=w(4 * h), f2=w(h, 4 * h), f2b=w(h))
    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    mask = torch.ones(s, s, dtype=torch.bool).triu(1)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        y = F.layer_norm(x, (h,), W["ln1"], W["ln1b"])
        q, k, v = F.linear(y, W["qkv"], W["qkvb"]).split(h, -1)
        q, k, v = (t.view(b, s, a, h // a).transpose(1, 2) for t in (q, k, v))
        sc = ((q @ k.transpose(-1, -2)) / (h // a) ** 0.5).masked_fill(mask, float("-inf"))
        p = drop(sc.softmax(-1), 0.1)
        o = (p @ v).transpose(1, 2).reshape(b, s, h)
        x2 = x + drop(F.linear(o, W["pr"], W["prb"]), 0.1)
        y2 = F.layer_norm(x2, (h,), W["ln2"], W["ln2b"])
        out = x2 + drop(F.linear(F.gelu(F.linear(y2, W["f1"], W["f1b"])), W["f2"], W["f2b"]), 0.1)
        del y, q, k, v, sc, p, o, x2, y2
    return sum(e.self_cpu_memory_usage for e in prof.events()) - out.numel() * out.element_size() + x.nbytes


CHEATS += [("layer_activation_bytes", activations_measured_by_a_hook, "saved-tensor hooks"),
           ("layer_activation_bytes", activations_measured_by_the_profiler, "torch's profiler")]
