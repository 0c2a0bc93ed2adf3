"""Wrong answers to notebook 01's puzzles, each with the words its failure message must contain.

A wrong answer must fail, whatever else it gets right; tests/test_content.py runs every catalogue.
"""

import pickle

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


def _step_hiding_activations(model, tokens, targets, pack, unpack):
    """No recomputation at all: autograd keeps every activation, packed where the tracker cannot see it."""
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        loss = model.loss(tokens, targets)
    loss.backward()
    return model


def checkpoint_in_numpy(model, tokens, targets):
    """The issue's example: activations stored as numpy copies."""
    return _step_hiding_activations(
        model, tokens, targets,
        lambda t: ("np", t.detach().numpy().copy()) if t.dtype in (torch.float64, torch.float32) else t,
        lambda p: torch.from_numpy(p[1]) if isinstance(p, tuple) else p)


def checkpoint_in_pickled_bytes(model, tokens, targets):
    return _step_hiding_activations(model, tokens, targets, lambda t: pickle.dumps(t.detach()), pickle.loads)


def checkpoint_in_storage_copies(model, tokens, targets):
    """Each activation's bytes copied into a raw storage of its own."""
    def pack(t):
        copy = torch.UntypedStorage(t.untyped_storage().nbytes())
        copy.copy_(t.untyped_storage())
        return copy, t.dtype, t.size(), t.stride(), t.storage_offset()

    def unpack(packed):
        storage, dtype, size, stride, offset = packed
        return torch.empty(0, dtype=dtype).set_(storage, offset, size, stride)
    return _step_hiding_activations(model, tokens, targets, pack, unpack)


def checkpoint_in_python_floats(model, tokens, targets):
    """Each large activation kept as a Python list of floats."""
    def pack(t):
        if t.numel() < 64 or not t.is_floating_point():
            return t
        return t.dtype, t.shape, t.detach().flatten().tolist()

    def unpack(packed):
        if isinstance(packed, torch.Tensor):
            return packed
        dtype, shape, values = packed
        return torch.tensor(values, dtype=dtype).reshape(shape)
    return _step_hiding_activations(model, tokens, targets, pack, unpack)


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
    ("checkpointed_step", checkpoint_in_numpy, "Tensor.numpy()"),
    ("checkpointed_step", checkpoint_in_pickled_bytes, "pickle"),
    ("checkpointed_step", checkpoint_in_storage_copies, "peak memory"),
    ("checkpointed_step", checkpoint_in_python_floats, "peak memory"),
    ("accumulated_step", accumulation_without_dividing, "the result", "= k, the number of micro-batches"),
    ("accumulated_step", accumulation_of_the_whole_batch, "peak memory"),
    ("offloaded_adam_train", offload_that_keeps_adam_on_the_device, "peak memory"),
    ("offloaded_adam_train", offload_that_moves_the_model, "one in device memory"),
    ("offloaded_adam_train", offload_that_trains_on_the_host, "FLOPs computed in host memory"),
]
