"""Wrong answers to notebook 01's puzzles, each with the words its failure message must contain.

A wrong answer must fail, whatever else it gets right; tests/test_content.py runs every catalogue.
"""

import ctypes
import pickle

import torch
from torch.utils.checkpoint import checkpoint

import lib
import solutions.memory as S


def params_counting_tied_twice(config):
    return S.count_parameters(config) + (config.vocab * config.hidden if config.tied else 0)


def params_of_gpt2_only(config):
    """12h² + 13h per block: right for GPT-2's blocks, wrong without biases or with grouped-query attention."""
    h = config.hidden
    return config.vocab * h + config.seq * h + config.layers * (12 * h * h + 13 * h) + 2 * h + (
        0 if config.tied else config.vocab * h)


def params_by_building_the_model(config):
    from lib.models import TinyGPT
    return sum(p.numel() for p in TinyGPT(config).parameters())


def params_by_building_it_on_the_meta_device(config):
    with torch.device("meta"):
        return sum(p.numel() for p in __import__("lib.models").models.TinyGPT(config).parameters())


def params_from_the_planner(config):
    from lib.planner.model import Model
    return Model(layers=config.layers, hidden=config.hidden, heads=config.heads, seq=config.seq,
                 vocab=config.vocab, tied=config.tied).params


def params_after_switching_the_watch_off(config):
    import sys
    sys.setprofile(None)
    return params_by_building_the_model(config)


def state_bytes_from_the_formula(config):
    from lib.analytic.formulas import model_state_bytes
    return model_state_bytes(S.count_parameters(config))


def activation_bytes_from_the_formula(s, b, h, a):
    from lib.analytic.formulas import activation_bytes_per_layer
    return activation_bytes_per_layer(s, b, h, a)


def activation_bytes_measured_on_a_fresh_block(s, b, h, a):
    from lib.checker.measure import saved_activation_bytes
    from lib.models import Block, GPTConfig
    block = Block(GPTConfig(seq=s, hidden=h, heads=a, dropout=0.1)).to(torch.bfloat16)
    x = torch.randn(b, s, h, dtype=torch.bfloat16, requires_grad=True)
    return saved_activation_bytes(lambda: block(x), exclude=list(block.parameters()))


def state_bytes_without_master_copy(config):
    n = S.count_parameters(config)
    return {"weights": 2 * n, "gradients": 2 * n, "m": 4 * n, "v": 4 * n}


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


def checkpoint_through_raw_addresses(model, tokens, targets):
    """Each activation's bytes read through its data_ptr() into a numpy copy (ctypes, no Tensor.numpy())."""
    def pack(t):
        if not t.is_floating_point():
            return t
        t = t.detach().contiguous()
        raw = (ctypes.c_char * (t.nbytes)).from_address(t.data_ptr())
        return t.dtype, t.shape, bytearray(raw)
    return _step_hiding_activations(model, tokens, targets, pack, _unpacking(torch.frombuffer))


def checkpoint_in_python_floats(model, tokens, targets):
    """Each large activation kept as a Python list of floats."""
    def pack(t):
        if t.numel() < 64 or not t.is_floating_point():
            return t
        return t.dtype, t.shape, t.detach().flatten().tolist()
    return _step_hiding_activations(model, tokens, targets, pack, _unpacking(torch.tensor))


def _unpacking(rebuild):
    """The unpack hook for packs of (dtype, shape, payload) kept outside torch; a tensor left packed passes."""
    def unpack(packed):
        if isinstance(packed, torch.Tensor):
            return packed
        dtype, shape, payload = packed
        return rebuild(payload, dtype=dtype).reshape(shape)
    return unpack


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
    ("count_parameters", params_of_gpt2_only, "expected"),
    ("count_parameters", params_by_building_the_model, "building a module (TinyGPT(...))"),
    ("count_parameters", params_by_building_it_on_the_meta_device, "building a module (TinyGPT(...))"),
    ("count_parameters", params_from_the_planner, "lib.planner"),
    ("count_parameters", params_after_switching_the_watch_off, "sys.setprofile"),
    ("training_state_bytes", state_bytes_from_the_formula, "lib.analytic.formulas (model_state_bytes)"),
    ("layer_activation_bytes", activation_bytes_from_the_formula, "lib.analytic.formulas (activation_bytes_per_layer)"),
    ("layer_activation_bytes", activation_bytes_measured_on_a_fresh_block, "derive it from the configuration"),
    ("training_state_bytes", state_bytes_without_master_copy, "the master copy of the weights (fp32, 4 B"),
    ("layer_activation_bytes", activation_bytes_without_attention_scores, "expected"),
    ("checkpointed_step", checkpoint_that_keeps_everything, "peak memory"),
    ("checkpointed_step", checkpoint_in_numpy, "Tensor.numpy()"),
    ("checkpointed_step", checkpoint_in_pickled_bytes, "pickle"),
    ("checkpointed_step", checkpoint_in_storage_copies, "peak memory"),
    ("checkpointed_step", checkpoint_in_python_floats, "peak memory"),
    ("checkpointed_step", checkpoint_through_raw_addresses, "Tensor.data_ptr()"),
    ("accumulated_step", accumulation_without_dividing, "the result", "= k, the number of micro-batches"),
    ("accumulated_step", accumulation_of_the_whole_batch, "whole batch of"),
    ("offloaded_adam_train", offload_that_keeps_adam_on_the_device, "peak memory"),
    ("offloaded_adam_train", offload_that_moves_the_model, "one in device memory"),
    ("offloaded_adam_train", offload_that_trains_on_the_host, "FLOPs computed in host memory"),
]
