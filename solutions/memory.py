"""Notebook 01, where the memory goes: the reference solutions."""

import torch
from torch.utils.checkpoint import checkpoint

import lib


def count_parameters(config):
    h, layers, bias = config.hidden, config.layers, config.bias
    kv = (config.kv_heads or config.heads) * (h // config.heads)      # the width of K, and of V
    embeddings = config.vocab * h + config.seq * h
    weights = h * (h + 2 * kv) + h * h + 4 * h * h + 4 * h * h        # qkv, proj, fc1, fc2
    biases = (h + 2 * kv) + h + 4 * h + h if bias else 0
    norms = (2 if bias else 1) * h                                    # a LayerNorm: a weight (and a bias) of h
    head = 0 if config.tied else config.vocab * h
    return embeddings + layers * (weights + biases + 2 * norms) + norms + head


def training_state_bytes(config):
    # bf16 weights (2) + bf16 gradients (2) + fp32 master weights, Adam momentum and variance (4 + 4 + 4)
    n = count_parameters(config)
    return {"weights": 2 * n, "gradients": 2 * n, "master": 4 * n, "m": 4 * n, "v": 4 * n}


def layer_activation_bytes(s, b, h, a):
    # Korthikanti et al. 2022: 11sbh + 5as²b in attention, 19sbh in the MLP, 4sbh in the LayerNorms
    return 34 * s * b * h + 5 * a * s * s * b


def checkpointed_step(model, tokens, targets):
    x = model.embed(tokens)
    for block in model.blocks:
        x = checkpoint(block, x, use_reentrant=False)
    model.head_loss(x, targets).backward()
    return model


def accumulated_step(model, tokens, targets, k):
    for micro_tokens, micro_targets in zip(tokens.chunk(k), targets.chunk(k)):
        (model.loss(micro_tokens, micro_targets) / k).backward()
    return model


def offloaded_adam_train(model, batches, lr, betas=(0.9, 0.999), eps=1e-8):
    host = lib.host()
    params = list(model.parameters())
    m = [torch.zeros_like(p, device=host) for p in params]
    v = [torch.zeros_like(p, device=host) for p in params]
    for step, (tokens, targets) in enumerate(batches, start=1):
        model.zero_grad()
        model.loss(tokens, targets).backward()
        for p, m_i, v_i in zip(params, m, v):
            g = p.grad.to(host)
            m_i.mul_(betas[0]).add_(g, alpha=1 - betas[0])
            v_i.mul_(betas[1]).addcmul_(g, g, value=1 - betas[1])
            denom = (v_i / (1 - betas[1] ** step)).sqrt_().add_(eps)
            update = (m_i / (1 - betas[0] ** step)).div_(denom).mul_(lr)
            with torch.no_grad():
                p.sub_(update.to(lib.device()))
    return model
