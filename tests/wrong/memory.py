"""Wrong answers to notebook 01's puzzles, each with the words its failure message must contain.

A wrong answer must fail, whatever else it gets right; tests/test_content.py runs every catalogue.
"""

import torch
from torch.utils.checkpoint import checkpoint

import lib
import solutions.memory as S


def params_counting_tied_twice(config):
    return S.count_parameters(config) + (config.vocab * config.hidden if config.tied else 0)


def state_bytes_without_master_copy(config):
    return (2 + 2 + 4 + 4) * S.count_parameters(config)


def activation_bytes_without_attention_scores(s, b, h, a):
    return 34 * s * b * h


def checkpoint_that_keeps_everything(model, tokens, targets):
    """Recomputes, but also keeps each block's output attached to the graph: nothing is saved."""
    x = model.embed(tokens)
    kept = []
    for block in model.blocks:
        kept.append(block(x))
        x = checkpoint(block, x, use_reentrant=False)
    (model.head_loss(x, targets) + 0 * sum(k.sum() for k in kept)).backward()
    return model


def accumulation_without_dividing(model, tokens, targets, k):
    for micro_tokens, micro_targets in zip(tokens.chunk(k), targets.chunk(k)):
        model.loss(micro_tokens, micro_targets).backward()
    return model


def accumulation_of_the_whole_batch(model, tokens, targets, k):
    model.loss(tokens, targets).backward()
    return model


def offload_that_keeps_adam_on_the_device(model, batches, lr):
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for tokens, targets in batches:
        opt.zero_grad()
        model.loss(tokens, targets).backward()
        opt.step()
    return model


def offload_that_moves_the_model(model, batches, lr):
    """Moves the model but not the data: a device mismatch, on a GPU as in the simulator."""
    return offload_that_keeps_adam_on_the_device(model.to(lib.host()), batches, lr)


def offload_that_trains_on_the_host(model, batches, lr):
    host = lib.host()
    return offload_that_keeps_adam_on_the_device(model.to(host), [(t.to(host), y.to(host)) for t, y in batches], lr)


WRONG = [
    ("count_parameters", params_counting_tied_twice, "expected"),
    ("training_state_bytes", state_bytes_without_master_copy, "expected"),
    ("layer_activation_bytes", activation_bytes_without_attention_scores, "expected"),
    ("checkpointed_step", checkpoint_that_keeps_everything, "peak memory"),
    ("accumulated_step", accumulation_without_dividing, "the result"),
    ("accumulated_step", accumulation_of_the_whole_batch, "peak memory"),
    ("offloaded_adam_train", offload_that_keeps_adam_on_the_device, "peak memory"),
    ("offloaded_adam_train", offload_that_moves_the_model, "one in device memory"),
    ("offloaded_adam_train", offload_that_trains_on_the_host, "FLOPs computed in host memory"),
]
