"""Notebook 01 (where the memory goes): first attempts, written from the notebook alone."""
import torch
from torch.utils.checkpoint import checkpoint

import lib
from lib.models import Block, GPTConfig, TinyGPT
from lib.units import fmt_bytes
from puzzles import memory as P


# ---------------------------------------------------------------- puzzle 1: count_parameters

def _kv_width(config):
    head = config.hidden // config.heads
    return (config.kv_heads or config.heads) * head


def count_parameters_no_positions(config):
    h, b = config.hidden, 1 if config.bias else 0
    kv = _kv_width(config)
    per = 2 * (h + b * h)                       # two LayerNorms
    per += h * (h + 2 * kv) + b * (h + 2 * kv)  # qkv
    per += h * h + b * h                        # proj
    per += 4 * h * h + b * 4 * h + 4 * h * h + b * h
    total = config.vocab * h + config.layers * per + (h + b * h)
    if not config.tied:
        total += config.vocab * h
    return total


def count_parameters_head_always(config):
    h, b = config.hidden, 1 if config.bias else 0
    kv = _kv_width(config)
    per = 2 * (h + b * h) + h * (h + 2 * kv) + b * (h + 2 * kv) + h * h + b * h
    per += 4 * h * h + b * 4 * h + 4 * h * h + b * h
    return (config.vocab * h + config.seq * h + config.layers * per + (h + b * h)
            + config.vocab * h)                 # the output head


def count_parameters_ignores_gqa(config):
    h, b = config.hidden, 1 if config.bias else 0
    per = 2 * (h + b * h) + 3 * h * h + b * 3 * h + h * h + b * h
    per += 4 * h * h + b * 4 * h + 4 * h * h + b * h
    total = config.vocab * h + config.seq * h + config.layers * per + (h + b * h)
    if not config.tied:
        total += config.vocab * h
    return total


def count_parameters_no_layernorm_weight(config):
    # bias=False: I thought LayerNorm then has no parameters at all
    h, b = config.hidden, 1 if config.bias else 0
    kv = _kv_width(config)
    ln = 2 * h * b
    per = 2 * ln + h * (h + 2 * kv) + b * (h + 2 * kv) + h * h + b * h
    per += 4 * h * h + b * 4 * h + 4 * h * h + b * h
    total = config.vocab * h + config.seq * h + config.layers * per + ln
    if not config.tied:
        total += config.vocab * h
    return total


def count_parameters_no_final_norm(config):
    h, b = config.hidden, 1 if config.bias else 0
    kv = _kv_width(config)
    per = 2 * (h + b * h) + h * (h + 2 * kv) + b * (h + 2 * kv) + h * h + b * h
    per += 4 * h * h + b * 4 * h + 4 * h * h + b * h
    total = config.vocab * h + config.seq * h + config.layers * per
    if not config.tied:
        total += config.vocab * h
    return total


def count_parameters_gqa_counts_heads(config):
    # kv_heads: I used kv_heads * hidden for K and V (forgot each head is hidden/heads wide)
    h, b = config.hidden, 1 if config.bias else 0
    kv = config.kv_heads * h if config.kv_heads else h
    per = 2 * (h + b * h) + h * (h + 2 * kv) + b * (h + 2 * kv) + h * h + b * h
    per += 4 * h * h + b * 4 * h + 4 * h * h + b * h
    total = config.vocab * h + config.seq * h + config.layers * per + (h + b * h)
    if not config.tied:
        total += config.vocab * h
    return total


def count_parameters_by_module(config):
    h, bias = config.hidden, config.bias
    d = h // config.heads
    kv = (config.kv_heads if config.kv_heads else config.heads) * d

    def linear(i, o):
        return i * o + (o if bias else 0)

    def norm():
        return h * (2 if bias else 1)

    block = norm() + linear(h, h + 2 * kv) + linear(h, h) + norm() + linear(h, 4 * h) + linear(4 * h, h)
    head = 0 if config.tied else config.vocab * h
    return config.vocab * h + config.seq * h + config.layers * block + norm() + head


# ---------------------------------------------------------------- puzzle 2: training_state_bytes

def _count(config):
    return count_parameters_by_module(config)


def training_state_bytes_optimizer_only(config):
    n = _count(config)
    return {"master": 4 * n, "m": 4 * n, "v": 4 * n}


def training_state_bytes_fp32_grads(config):
    # gradients are accumulated in fp32, I thought
    n = _count(config)
    return {"weights": 2 * n, "gradients": 4 * n, "master": 4 * n, "m": 4 * n, "v": 4 * n}


def training_state_bytes_no_master(config):
    # bf16 weights and grads, Adam m and v in fp32: I forgot the fp32 master copy
    n = _count(config)
    return {"weights": 2 * n, "gradients": 2 * n, "m": 4 * n, "v": 4 * n}


def training_state_bytes_all_fp32(config):
    n = _count(config)
    return {"weights": 4 * n, "gradients": 4 * n, "master": 4 * n, "m": 4 * n, "v": 4 * n}


def training_state_bytes_ignores_tied(config):
    # counted the head as a separate matrix even when tied
    n = _count(config) + (config.vocab * config.hidden if config.tied else 0)
    return {"weights": 2 * n, "gradients": 2 * n, "master": 4 * n, "m": 4 * n, "v": 4 * n}


def training_state_bytes_spelled_out(config):
    n = _count(config)
    weights, grads, master, m, v = 2 * n, 2 * n, 4 * n, 4 * n, 4 * n
    return {"weights": weights, "gradients": grads, "master": master, "m": m, "v": v}


# ---------------------------------------------------------------- puzzle 3: layer_activation_bytes

def layer_activation_bytes_no_dropout(s, b, h, a):
    return s * b * h * (32 + 2 * a * s / h)


def layer_activation_bytes_missing_s(s, b, h, a):
    return s * b * h * (34 + 5 * a / h)


def layer_activation_bytes_doubled(s, b, h, a):
    # bf16 is 2 bytes per element, so times 2
    return 2 * s * b * h * (34 + 5 * a * s / h)


def layer_activation_bytes_flash(s, b, h, a):
    return 34 * s * b * h + 4 * a * s * b


def layer_activation_bytes_parts(s, b, h, a):
    attention = 11 * s * b * h + 5 * a * s * s * b
    mlp = 19 * s * b * h
    norms = 4 * s * b * h
    return attention + mlp + norms


def layer_activation_bytes_scores_per_head_dim(s, b, h, a):
    # the scores are s x s per head, head size h/a... I wrote it per feature
    return 34 * s * b * h + 5 * h * s * s * b


# ---------------------------------------------------------------- puzzle 4: checkpointed_step

def checkpointed_step_whole_loop(model, tokens, targets):
    def all_blocks(x):
        for block in model.blocks:
            x = block(x)
        return x

    x = model.embed(tokens)
    x = checkpoint(all_blocks, x, use_reentrant=False)
    model.head_loss(x, targets).backward()
    return model


def checkpointed_step_detached(model, tokens, targets):
    x = model.embed(tokens)
    for block in model.blocks:
        x = checkpoint(block, x.detach().requires_grad_(), use_reentrant=False)
    model.head_loss(x, targets).backward()
    return model


def checkpointed_step_no_backward(model, tokens, targets):
    x = model.embed(tokens)
    for block in model.blocks:
        x = checkpoint(block, x, use_reentrant=False)
    loss = model.head_loss(x, targets)
    return model


def checkpointed_step_plain_loss(model, tokens, targets):
    # checkpoint the model's loss itself
    loss = checkpoint(model.loss, tokens, targets, use_reentrant=False)
    loss.backward()
    return model


def checkpointed_step_checkpoint_then_plain(model, tokens, targets):
    # called checkpoint but then used the plain block's output anyway
    x = model.embed(tokens)
    for block in model.blocks:
        checkpoint(block, x, use_reentrant=False)
        x = block(x)
    model.head_loss(x, targets).backward()
    return model


def checkpointed_step_lambda(model, tokens, targets):
    x = model.embed(tokens)
    for i in range(len(model.blocks)):
        x = checkpoint(lambda y, i=i: model.blocks[i](y), x, use_reentrant=False)
    loss = model.head_loss(x, targets)
    loss.backward()
    return model


# ---------------------------------------------------------------- puzzle 5: accumulated_step

def accumulated_step_no_divide(model, tokens, targets, k):
    for t, y in zip(tokens.chunk(k), targets.chunk(k)):
        model.loss(t, y).backward()
    return model


def accumulated_step_zero_between(model, tokens, targets, k):
    for t, y in zip(tokens.chunk(k), targets.chunk(k)):
        model.zero_grad()
        (model.loss(t, y) / k).backward()
    return model


def accumulated_step_sum_then_backward(model, tokens, targets, k):
    total = 0
    for t, y in zip(tokens.chunk(k), targets.chunk(k)):
        total = total + model.loss(t, y) / k
    total.backward()
    return model


def accumulated_step_split_k(model, tokens, targets, k):
    # split(k) -> pieces of k rows each
    for t, y in zip(tokens.split(k), targets.split(k)):
        (model.loss(t, y) / k).backward()
    return model


def accumulated_step_wrong_dim(model, tokens, targets, k):
    for t, y in zip(tokens.chunk(k, dim=1), targets.chunk(k, dim=1)):
        (model.loss(t, y) / k).backward()
    return model


def accumulated_step_scale_by_rows(model, tokens, targets, k):
    n = tokens.shape[0] // k
    for i in range(k):
        t, y = tokens[i * n:(i + 1) * n], targets[i * n:(i + 1) * n]
        (model.loss(t, y) * n / tokens.shape[0]).backward()
    return model


# ---------------------------------------------------------------- puzzle 6: offloaded_adam_train

def offloaded_adam_train_no_bias_correction(model, batches, lr):
    b1, b2, eps = 0.9, 0.999, 1e-8
    params = list(model.parameters())
    m = [torch.zeros(p.shape, dtype=p.dtype, device=lib.host()) for p in params]
    v = [torch.zeros(p.shape, dtype=p.dtype, device=lib.host()) for p in params]
    for tokens, targets in batches:
        model.loss(tokens, targets).backward()
        with torch.no_grad():
            for p, mi, vi in zip(params, m, v):
                g = p.grad.to(lib.host())
                mi.mul_(b1).add_(g, alpha=1 - b1)
                vi.mul_(b2).addcmul_(g, g, value=1 - b2)
                p -= (lr * mi / (vi.sqrt() + eps)).to(lib.device())
                p.grad = None
    return model


def offloaded_adam_train_keeps_grads(model, batches, lr):
    b1, b2, eps = 0.9, 0.999, 1e-8
    params = list(model.parameters())
    m = [torch.zeros(p.shape, dtype=p.dtype, device=lib.host()) for p in params]
    v = [torch.zeros(p.shape, dtype=p.dtype, device=lib.host()) for p in params]
    for step, (tokens, targets) in enumerate(batches, 1):
        model.loss(tokens, targets).backward()
        with torch.no_grad():
            for p, mi, vi in zip(params, m, v):
                g = p.grad.to(lib.host())
                mi.mul_(b1).add_(g, alpha=1 - b1)
                vi.mul_(b2).addcmul_(g, g, value=1 - b2)
                mhat = mi / (1 - b1 ** step)
                vhat = vi / (1 - b2 ** step)
                p -= (lr * mhat / (vhat.sqrt() + eps)).to(lib.device())
    return model


def offloaded_adam_train_mixed_devices(model, batches, lr):
    b1, b2, eps = 0.9, 0.999, 1e-8
    params = list(model.parameters())
    m = [torch.zeros(p.shape, dtype=p.dtype, device=lib.host()) for p in params]
    v = [torch.zeros(p.shape, dtype=p.dtype, device=lib.host()) for p in params]
    for step, (tokens, targets) in enumerate(batches, 1):
        model.loss(tokens, targets).backward()
        with torch.no_grad():
            for p, mi, vi in zip(params, m, v):
                g = p.grad              # forgot to bring it to the host
                mi.mul_(b1).add_(g, alpha=1 - b1)
                vi.mul_(b2).addcmul_(g, g, value=1 - b2)
                mhat = mi / (1 - b1 ** step)
                vhat = vi / (1 - b2 ** step)
                p -= (lr * mhat / (vhat.sqrt() + eps)).to(lib.device())
                p.grad = None
    return model


def offloaded_adam_train_state_on_device(model, batches, lr):
    b1, b2, eps = 0.9, 0.999, 1e-8
    params = list(model.parameters())
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for step, (tokens, targets) in enumerate(batches, 1):
        model.loss(tokens, targets).backward()
        with torch.no_grad():
            for p, mi, vi in zip(params, m, v):
                g = p.grad
                mi.mul_(b1).add_(g, alpha=1 - b1)
                vi.mul_(b2).addcmul_(g, g, value=1 - b2)
                p -= lr * (mi / (1 - b1 ** step)) / ((vi / (1 - b2 ** step)).sqrt() + eps)
                p.grad = None
    return model


def offloaded_adam_train_eps_inside_sqrt(model, batches, lr):
    b1, b2, eps = 0.9, 0.999, 1e-8
    params = list(model.parameters())
    m = [torch.zeros(p.shape, dtype=p.dtype, device=lib.host()) for p in params]
    v = [torch.zeros(p.shape, dtype=p.dtype, device=lib.host()) for p in params]
    for step, (tokens, targets) in enumerate(batches, 1):
        model.loss(tokens, targets).backward()
        with torch.no_grad():
            for p, mi, vi in zip(params, m, v):
                g = p.grad.to(lib.host())
                mi.mul_(b1).add_(g, alpha=1 - b1)
                vi.mul_(b2).addcmul_(g, g, value=1 - b2)
                mhat = mi / (1 - b1 ** step)
                vhat = vi / (1 - b2 ** step)
                p -= (lr * mhat / (vhat + eps).sqrt()).to(lib.device())
                p.grad = None
    return model


def offloaded_adam_train_bias_correction_swapped(model, batches, lr):
    b1, b2, eps = 0.9, 0.999, 1e-8
    params = list(model.parameters())
    m = [torch.zeros(p.shape, dtype=p.dtype, device=lib.host()) for p in params]
    v = [torch.zeros(p.shape, dtype=p.dtype, device=lib.host()) for p in params]
    for step, (tokens, targets) in enumerate(batches):   # step starts at 0
        model.loss(tokens, targets).backward()
        with torch.no_grad():
            for p, mi, vi in zip(params, m, v):
                g = p.grad.to(lib.host())
                mi.mul_(b1).add_(g, alpha=1 - b1)
                vi.mul_(b2).addcmul_(g, g, value=1 - b2)
                mhat = mi / (1 - b1 ** (step + 1))
                vhat = vi / (1 - b2 ** step) if step else vi
                p -= (lr * mhat / (vhat.sqrt() + eps)).to(lib.device())
                p.grad = None
    return model


def offloaded_adam_train_torch_adam_on_host(model, batches, lr):
    params = list(model.parameters())
    host = [p.detach().to(lib.host()).requires_grad_() for p in params]
    opt = torch.optim.Adam(host, lr=lr, betas=(0.9, 0.999), eps=1e-8)
    for tokens, targets in batches:
        model.loss(tokens, targets).backward()
        for p, hp in zip(params, host):
            hp.grad = p.grad.to(lib.host())
            p.grad = None
        opt.step()
        with torch.no_grad():
            for p, hp in zip(params, host):
                p.copy_(hp.to(lib.device()))
    return model


ATTEMPTS = [
    ("count_parameters", count_parameters_no_positions, "forgot the position embedding (seq x hidden)"),
    ("count_parameters", count_parameters_head_always, "added the output head even when it is tied to the embedding"),
    ("count_parameters", count_parameters_ignores_gqa, "used 3h for qkv always, ignoring kv_heads"),
    ("count_parameters", count_parameters_no_layernorm_weight, "thought bias=False also removes LayerNorm's weight"),
    ("count_parameters", count_parameters_no_final_norm, "forgot the final LayerNorm"),
    ("count_parameters", count_parameters_gqa_counts_heads, "K and V as kv_heads * hidden wide, not kv_heads * hidden/heads"),
    ("count_parameters", count_parameters_by_module, "correct: counted module by module with small linear()/norm() helpers"),
    ("training_state_bytes", training_state_bytes_optimizer_only, "counted only Adam's 12 bytes per parameter"),
    ("training_state_bytes", training_state_bytes_fp32_grads, "assumed the gradients are kept in fp32 (4 bytes)"),
    ("training_state_bytes", training_state_bytes_no_master, "forgot the fp32 master copy of the weights"),
    ("training_state_bytes", training_state_bytes_all_fp32, "everything fp32, plus an extra fp32 master"),
    ("training_state_bytes", training_state_bytes_ignores_tied, "counted the tied head twice"),
    ("training_state_bytes", training_state_bytes_spelled_out, "correct: spelled out 2+2+4+4+4 per parameter"),
    ("layer_activation_bytes", layer_activation_bytes_no_dropout, "used the no-dropout formula 32 + 2as/h"),
    ("layer_activation_bytes", layer_activation_bytes_missing_s, "dropped the s in 5as/h"),
    ("layer_activation_bytes", layer_activation_bytes_doubled, "multiplied by 2 for bf16 though the formula is already in bytes"),
    ("layer_activation_bytes", layer_activation_bytes_flash, "counted flash attention's lse instead of the s x s scores"),
    ("layer_activation_bytes", layer_activation_bytes_scores_per_head_dim, "scores term with h instead of a heads"),
    ("layer_activation_bytes", layer_activation_bytes_parts, "correct: summed attention, MLP and LayerNorm parts separately"),
    ("checkpointed_step", checkpointed_step_whole_loop, "checkpointed all blocks as one function, so recompute holds them all"),
    ("checkpointed_step", checkpointed_step_detached, "detached each block's input, so no gradient reaches earlier blocks and the embedding"),
    ("checkpointed_step", checkpointed_step_no_backward, "forgot to call backward()"),
    ("checkpointed_step", checkpointed_step_plain_loss, "checkpointed model.loss as a whole: one big recompute"),
    ("checkpointed_step", checkpointed_step_checkpoint_then_plain, "called checkpoint but then ran the block normally too"),
    ("checkpointed_step", checkpointed_step_lambda, "correct: indexes the blocks through a lambda with a default argument"),
    ("accumulated_step", accumulated_step_no_divide, "forgot to divide each micro-batch loss by k"),
    ("accumulated_step", accumulated_step_zero_between, "zeroed the gradients before each micro-batch"),
    ("accumulated_step", accumulated_step_sum_then_backward, "summed the k losses and called backward once (all activations alive)"),
    ("accumulated_step", accumulated_step_split_k, "used split(k): pieces of k rows instead of k pieces"),
    ("accumulated_step", accumulated_step_wrong_dim, "chunked along the sequence (dim 1) instead of the batch"),
    ("accumulated_step", accumulated_step_scale_by_rows, "correct: slices by hand and scales by rows / total rows"),
    ("offloaded_adam_train", offloaded_adam_train_no_bias_correction, "no bias correction of m and v"),
    ("offloaded_adam_train", offloaded_adam_train_keeps_grads, "never reset the gradients between steps"),
    ("offloaded_adam_train", offloaded_adam_train_mixed_devices, "forgot to copy the gradient to the host before the update"),
    ("offloaded_adam_train", offloaded_adam_train_state_on_device, "kept m and v on the device (no offload)"),
    ("offloaded_adam_train", offloaded_adam_train_eps_inside_sqrt, "put eps inside the square root"),
    ("offloaded_adam_train", offloaded_adam_train_bias_correction_swapped, "off-by-one step count in v's bias correction"),
    ("offloaded_adam_train", offloaded_adam_train_torch_adam_on_host, "correct: host copies of the weights stepped by torch.optim.Adam, copied back"),
]
