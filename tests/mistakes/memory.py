"""Realistic first attempts at notebook 01's puzzles (where the memory goes), none of them in tests/wrong."""

import math
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import lib
from tests.mistakes import Attempt, NO_GRADIENT


# ---- count_parameters ---------------------------------------------------------------------------------------
def _count(config, *, position=True, final_norm=True, kv_heads=None, kv_width=None, head=None, norm_bias=None):
    """A learner's count, piece by piece as the hints list them, with the knob of one mistake turned."""
    h, L, bias = config.hidden, config.layers, config.bias
    kv = kv_width if kv_width is not None else (kv_heads or config.kv_heads or config.heads) * (h // config.heads)
    norm = 2 * h if (bias if norm_bias is None else norm_bias) else h
    block = h * (h + 2 * kv) + h * h + 8 * h * h + 2 * norm + ((h + 2 * kv) + 6 * h if bias else 0)
    untied = not config.tied if head is None else head
    return (config.vocab * h + (config.seq * h if position else 0) + L * block + (norm if final_norm else 0)
            + (config.vocab * h if untied else 0))


def params_without_the_position_embedding(config):
    """Token embedding, blocks, final norm and head, but no position table (LLaMA's RoPE has none; TinyGPT does)."""
    return _count(config, position=False)


def params_without_the_final_norm(config):
    """Two LayerNorms per block, and the final ln_f before the head forgotten."""
    return _count(config, final_norm=False)


def params_ignoring_grouped_query(config):
    """qkv counted as h → 3h whatever kv_heads says: K and V as wide as Q."""
    return _count(config, kv_heads=config.heads)


def params_kv_width_without_the_head_size(config):
    """K's width taken as kv_heads × h, not kv_heads × h/heads: the head size forgotten."""
    return _count(config, kv_width=(config.kv_heads or config.heads) * config.hidden)


def params_head_always_tied(config):
    """The output head never counted, as in GPT-2, where it is the token embedding; here it may be untied."""
    return _count(config, head=False)


def params_norms_always_with_bias(config):
    """Every LayerNorm counted with a weight and a bias, also where bias=False drops LayerNorm's bias."""
    return _count(config, norm_bias=True)


# ---- training_state_bytes -----------------------------------------------------------------------------------
def _params(config):
    """The learner's own, right count_parameters (its solution from puzzle 1)."""
    return _count(config)


def _state(n, **sizes):
    """The five pieces at mixed precision's bytes a parameter, with the sizes given changed (None: left out)."""
    pieces = {"weights": 2, "gradients": 2, "master": 4, "m": 4, "v": 4, **sizes}
    return {key: size * n for key, size in pieces.items() if size is not None}


def state_bytes_with_fp32_gradients(config):
    """bf16 weights, fp32 gradients, fp32 master weights, m and v: 2 + 4 + 12 bytes a parameter."""
    return _state(_params(config), gradients=4)


def state_bytes_master_copy_is_the_weights(config):
    """The fp32 master copy taken to be the weights themselves: weights at 4 B, no master piece."""
    return _state(_params(config), weights=4, master=None)


def state_bytes_from_a_count_without_the_final_norm(config):
    """16 bytes a parameter, times a count that forgot the final LayerNorm."""
    return _state(params_without_the_final_norm(config))


def state_bytes_from_a_count_without_positions(config):
    """16 bytes a parameter, times a count that left out the position embedding."""
    return _state(params_without_the_position_embedding(config))


def state_bytes_from_a_count_without_the_head(config):
    """16 bytes a parameter, times a count that never counts the output head (untied or not)."""
    return _state(params_head_always_tied(config))


def state_bytes_with_bf16_moments(config):
    """Adam's m and v kept in bf16 to save memory (as 8-bit optimizers do): 2 + 2 + 4 + 2 + 2 bytes a parameter."""
    return _state(_params(config), m=2, v=2)


def state_bytes_per_parameter(config):
    """Each piece's bytes for one parameter, 2, 2, 4, 4, 4, never multiplied by the count."""
    return _state(1)


def state_bytes_from_a_count_with_the_head_bias(config):
    """16 bytes a parameter, times a count that gives the output head a bias of V (the model's head has none)."""
    return _state(_params(config) + config.vocab)


def state_bytes_as_one_number(config):
    """The total, 16 B a parameter, where the statement asks for the pieces."""
    return 16 * _params(config)


# ---- layer_activation_bytes ---------------------------------------------------------------------------------
def activations_without_dropout_masks(s, b, h, a):
    """Korthikanti's terms without the three dropout masks (1 byte per element: as²b + sbh + sbh)."""
    return 32 * s * b * h + 4 * a * s * s * b


def activations_without_layernorm_inputs(s, b, h, a):
    """Attention and MLP counted, the two LayerNorms' inputs (2sbh each) forgotten."""
    return 30 * s * b * h + 5 * a * s * s * b


def activations_scores_without_heads(s, b, h, a):
    """The s×s scores counted once per sequence, not once per head: 5s²b."""
    return 34 * s * b * h + 5 * s * s * b


def activations_without_the_gelu_input(s, b, h, a):
    """fc1's output is GeLU's input, and GeLU saves it: the 8sbh forgotten."""
    return 26 * s * b * h + 5 * a * s * s * b


def activations_softmax_kept_once(s, b, h, a):
    """The softmax output counted, but not the dropped-out scores that multiply V (another 2as²b)."""
    return 34 * s * b * h + 3 * a * s * s * b


def activations_times_fp32_bytes(s, b, h, a):
    """Korthikanti's 34sbh + 5as²b taken for a count of values, times 4 bytes 'to be safe' (fp32)."""
    return 4 * (34 * s * b * h + 5 * a * s * s * b)


def activations_scores_per_row(s, b, h, a):
    """The softmax kept as one value per row of each head (2asb), as if its scores were a vector, not s × s."""
    return 34 * s * b * h + 2 * a * s * b


# ---- checkpointed_step --------------------------------------------------------------------------------------
def checkpoint_detaching_each_input(model, tokens, targets):
    """Each block checkpointed on x.detach(), 'so that the graph does not keep it': nothing flows back past a block."""
    x = model.embed(tokens)
    for block in model.blocks:
        x = checkpoint(block, x.detach(), use_reentrant=False)
    model.head_loss(x, targets).backward()
    return model


def checkpoint_reentrant_on_a_detached_embedding(model, tokens, targets):
    """The embedding's output detached, then reentrant checkpoints: 'None of the inputs have requires_grad=True.
    Gradients will be None' (pytorch/pytorch#7617)."""
    x = model.embed(tokens).detach()
    for block in model.blocks:
        x = checkpoint(block, x, use_reentrant=True)
    model.head_loss(x, targets).backward()
    return model


def checkpoint_around_all_blocks(model, tokens, targets):
    """One checkpoint around the whole stack of blocks: backward recomputes every block's activations at once."""
    def blocks(x):
        for block in model.blocks:
            x = block(x)
        return x
    model.head_loss(checkpoint(blocks, model.embed(tokens), use_reentrant=False), targets).backward()
    return model


def checkpoint_head_without_the_final_norm(model, tokens, targets):
    """The loss written out as cross_entropy(model.head(x)): the final LayerNorm before the head skipped."""
    x = model.embed(tokens)
    for block in model.blocks:
        x = checkpoint(block, x, use_reentrant=False)
    F.cross_entropy(model.head(x).flatten(0, 1), targets.flatten()).backward()
    return model


def checkpoint_then_the_plain_loss(model, tokens, targets):
    """Blocks checkpointed, but the loss taken from model.loss(tokens, targets), which runs them all again, saved."""
    x = model.embed(tokens)
    for block in model.blocks:
        x = checkpoint(block, x, use_reentrant=False)
    model.loss(tokens, targets).backward()
    return model


# ---- accumulated_step ---------------------------------------------------------------------------------------
def accumulation_zeroing_each_micro_batch(model, tokens, targets, k):
    """model.zero_grad() at the top of the micro-batch loop, as in a training loop: only the last one is left."""
    for micro_tokens, micro_targets in zip(tokens.chunk(k), targets.chunk(k)):
        model.zero_grad()
        (model.loss(micro_tokens, micro_targets) / k).backward()
    return model


def accumulation_dividing_twice(model, tokens, targets, k):
    """Each loss divided by k, and the accumulated gradients divided by k again 'to average them'."""
    for micro_tokens, micro_targets in zip(tokens.chunk(k), targets.chunk(k)):
        (model.loss(micro_tokens, micro_targets) / k).backward()
    for p in model.parameters():
        p.grad /= k
    return model


def accumulation_of_the_losses(model, tokens, targets, k):
    """The k losses added up and one backward at the end: the same gradients, every micro-batch's graph alive."""
    total = sum(model.loss(t, y) for t, y in zip(tokens.chunk(k), targets.chunk(k))) / k
    total.backward()
    return model


def accumulation_over_the_sequence(model, tokens, targets, k):
    """Micro-batches cut along the sequence (chunk(k, dim=1)): each piece attends only to its own tokens."""
    for micro_tokens, micro_targets in zip(tokens.chunk(k, dim=1), targets.chunk(k, dim=1)):
        (model.loss(micro_tokens, micro_targets) / k).backward()
    return model


def accumulation_loss_over_the_batch(model, tokens, targets, k):
    """Micro-batches by chunk(k), each loss divided by the batch's size, len(tokens), "to average over the batch"."""
    for micro_tokens, micro_targets in zip(tokens.chunk(k), targets.chunk(k)):
        (model.loss(micro_tokens, micro_targets) / len(tokens)).backward()
    return model


def accumulation_over_split_pieces(model, tokens, targets, k):
    """Pieces of tokens.split(k), each loss backward as it is, the accumulated gradients divided by k at the end."""
    for micro_tokens, micro_targets in zip(tokens.split(k), targets.split(k)):
        model.loss(micro_tokens, micro_targets).backward()
    for p in model.parameters():
        p.grad /= k
    return model


def accumulation_cleaning_up(model, tokens, targets, k):
    """Right accumulation, then model.zero_grad() at the end, where a training loop puts it after the step."""
    for micro_tokens, micro_targets in zip(tokens.chunk(k), targets.chunk(k)):
        (model.loss(micro_tokens, micro_targets) / k).backward()
    model.zero_grad()
    return model


# ---- offloaded_adam_train -----------------------------------------------------------------------------------
def _offloaded_adam(model, batches, lr, *, correct=True, zero=True, first=1, fresh_state=False, eps_inside=False,
                    write_back=True, betas=(0.9, 0.999), eps=1e-8, m_corrected=True, step_size=None, fresh=(),
                    count="step", rule=None):
    """Adam with m and v on the host, written as a learner would, with the knob of one mistake turned. `fresh`: the
    moments made anew inside the step loop; `count`: how t goes ("step": the step's number; "never": t = 1 set once;
    "per_tensor": t += 1 in the loop over the parameters); `rule(lr, g, m_hat, v_hat, eps)`: the update written
    otherwise."""
    host = lib.host()
    params = list(model.parameters())
    m = [torch.zeros_like(p, device=host) for p in params]
    v = [torch.zeros_like(p, device=host) for p in params]
    t = first - 1 if count == "per_tensor" else first
    for step, (tokens, targets) in enumerate(batches, start=first):
        if zero:
            model.zero_grad()
        if fresh_state or "m" in fresh:
            m = [torch.zeros_like(p, device=host) for p in params]
        if fresh_state or "v" in fresh:
            v = [torch.zeros_like(p, device=host) for p in params]
        model.loss(tokens, targets).backward()
        for p, m_i, v_i in zip(params, m, v):
            if count == "per_tensor":
                t += 1
            step = step if count == "step" else t
            g = p.grad.to(host)
            m_i.mul_(betas[0]).add_(g, alpha=1 - betas[0])
            v_i.mul_(betas[1]).addcmul_(g, g, value=1 - betas[1])
            m_hat = m_i / (1 - betas[0] ** step) if correct and m_corrected else m_i
            v_hat = v_i / (1 - betas[1] ** step) if correct else v_i
            denom = (v_hat + eps).sqrt() if eps_inside else v_hat.sqrt() + eps
            update = lr * m_hat / denom
            if step_size:                 # both corrections folded into the step size, on m / (√v + ε)
                update = step_size(lr, step) * m_i / (v_i.sqrt() + eps)
            if rule:
                update = rule(lr, g, m_hat, v_hat, eps)
            with torch.no_grad():
                if write_back:
                    p.sub_(update.to(lib.device()))
                else:
                    p.detach().to(host).sub_(update)
    return model


def offload_variance_made_each_step(model, batches, lr):
    """v = torch.zeros_like(...) at the top of the step loop (m made once, before it): v restarts every step."""
    return _offloaded_adam(model, batches, lr, fresh=("v",))


def offload_step_count_never_advanced(model, batches, lr):
    """t = 1 set before the loop and never incremented: every step corrected as the first."""
    return _offloaded_adam(model, batches, lr, count="never")


def offload_step_count_per_tensor(model, batches, lr):
    """t += 1 inside the loop over the parameters: t counts tensors, not steps."""
    return _offloaded_adam(model, batches, lr, count="per_tensor")


def offload_momentum_uncorrected(model, batches, lr):
    """v̂ = v / (1 - β₂ᵗ) written, m̂ forgotten: the update divides m itself by √v̂ + ε."""
    return _offloaded_adam(model, batches, lr, m_corrected=False)


def offload_without_bias_correction(model, batches, lr):
    """m / √v straight from the moving averages: Adam's bias corrections 1 - β^t left out."""
    return _offloaded_adam(model, batches, lr, correct=False)


def offload_without_zero_grad(model, batches, lr):
    """No model.zero_grad() between steps: each step's gradient adds to the last one's."""
    return _offloaded_adam(model, batches, lr, zero=False)


def offload_counting_steps_from_zero(model, batches, lr):
    """for step, batch in enumerate(batches): t = 0 at the first step, so 1 - β^t = 0."""
    return _offloaded_adam(model, batches, lr, first=0)


def offload_fresh_state_each_step(model, batches, lr):
    """m and v created inside the step loop: Adam's state starts from zero at every step."""
    return _offloaded_adam(model, batches, lr, fresh_state=True)


def offload_eps_inside_the_root(model, batches, lr):
    """√(v̂ + ε) instead of torch.optim.Adam's √v̂ + ε."""
    return _offloaded_adam(model, batches, lr, eps_inside=True)


def offload_corrections_in_the_step_size(model, batches, lr):
    """lr·√(1 - β₂ᵗ)/(1 - β₁ᵗ) times m / (√v + ε), the corrections folded into one scalar: ε lands before v's
    correction, where torch.optim.Adam adds it to √v̂."""
    return _offloaded_adam(model, batches, lr,
                           step_size=lambda lr, t: lr * math.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t))


def offload_step_size_without_the_root(model, batches, lr):
    """The same with the square root forgotten: lr·(1 - β₂ᵗ)/(1 - β₁ᵗ)."""
    return _offloaded_adam(model, batches, lr, step_size=lambda lr, t: lr * (1 - 0.999 ** t) / (1 - 0.9 ** t))


def offload_gradient_in_the_numerator(model, batches, lr):
    """lr · g / (√v̂ + ε): the gradient where m̂ belongs (step 1 is Adam's, where m̂ = g)."""
    return _offloaded_adam(model, batches, lr, rule=lambda lr, g, m_hat, v_hat, eps: lr * g / (v_hat.sqrt() + eps))


def offload_without_the_root(model, batches, lr):
    """lr · m̂ / (v̂ + ε): the square root of v̂ forgotten."""
    return _offloaded_adam(model, batches, lr, rule=lambda lr, g, m_hat, v_hat, eps: lr * m_hat / (v_hat + eps))


def offload_updating_a_host_copy(model, batches, lr):
    """The update subtracted from p.to(lib.host()), a copy in host memory: the model itself never changes."""
    return _offloaded_adam(model, batches, lr, write_back=False)


# The words of a diagnosis (not of the puzzle's hints, which name every piece): a formula's term left out
# (lib.checker.terms), a gradient that is None.
POSITIONS_LEFT_OUT = "the position embedding (s × h) left out"
# The token embedding and an untied head are both V × h: a diagnosis by the amount cannot tell which is missing.
V_BY_H_LEFT_OUT = "(V × h) left out"

MISTAKES = [
    Attempt("count_parameters", params_without_the_position_embedding, named=POSITIONS_LEFT_OUT),
    Attempt("count_parameters", params_without_the_final_norm, named="the final LayerNorm left out"),
    Attempt("count_parameters", params_ignoring_grouped_query, named="a (the attention heads) where kv_heads belongs"),
    Attempt("count_parameters", params_kv_width_without_the_head_size, named="a (the attention heads) left out"),
    Attempt("count_parameters", params_head_always_tied, named=V_BY_H_LEFT_OUT),
    Attempt("count_parameters", params_norms_always_with_bias,
            named=("LayerNorms counted twice", "no bias in this model) counted twice")),
    Attempt("training_state_bytes", state_bytes_with_fp32_gradients,
            named="the gradients counted at fp32's 4 B a parameter where mixed precision keeps them in bf16"),
    Attempt("training_state_bytes", state_bytes_master_copy_is_the_weights,
            named=("the master copy of the weights (fp32, 4 B a parameter) left out", "the weights counted at fp32's")),
    Attempt("training_state_bytes", state_bytes_with_bf16_moments,
            named=("Adam's momentum m counted at bf16's 2 B", "Adam's variance v counted at bf16's 2 B")),
    Attempt("training_state_bytes", state_bytes_as_one_number, named="the statement asks for the bytes of each piece"),
    Attempt("training_state_bytes", state_bytes_per_parameter, named="given as their bytes for one parameter"),
    Attempt("training_state_bytes", state_bytes_from_a_count_with_the_head_bias, named="the count is off"),
    Attempt("training_state_bytes", state_bytes_from_a_count_without_the_final_norm,
            named="the final LayerNorm left out"),
    Attempt("training_state_bytes", state_bytes_from_a_count_without_positions, named=POSITIONS_LEFT_OUT),
    Attempt("training_state_bytes", state_bytes_from_a_count_without_the_head, named=V_BY_H_LEFT_OUT),
    Attempt("layer_activation_bytes", activations_without_dropout_masks,
            named="the dropout masks (as²b + sbh + sbh, 1 B each) left out"),
    Attempt("layer_activation_bytes", activations_times_fp32_bytes, named="is already in bytes"),
    Attempt("layer_activation_bytes", activations_scores_per_row, named="where the scores are s × s per head"),
    Attempt("layer_activation_bytes", activations_without_layernorm_inputs, named="(4sbh) left out"),
    Attempt("layer_activation_bytes", activations_scores_without_heads, named="a (the attention heads) left out"),
    Attempt("layer_activation_bytes", activations_without_the_gelu_input, named="(8sbh) left out"),
    Attempt("layer_activation_bytes", activations_softmax_kept_once, named="(2as²b) left out"),
    Attempt("checkpointed_step", checkpoint_detaching_each_input, named=NO_GRADIENT),
    Attempt("checkpointed_step", checkpoint_reentrant_on_a_detached_embedding, named=NO_GRADIENT),
    Attempt("checkpointed_step", checkpoint_around_all_blocks, named="peak memory"),
    Attempt("checkpointed_step", checkpoint_head_without_the_final_norm, named="ln_f.weight.grad"),
    Attempt("checkpointed_step", checkpoint_then_the_plain_loss, named="a checkpoint whose output is not used"),
    Attempt("accumulated_step", accumulation_zeroing_each_micro_batch, named="the last micro-batch"),
    Attempt("accumulated_step", accumulation_dividing_twice, named="k, the number of micro-batches"),
    Attempt("accumulated_step", accumulation_of_the_losses, named="peak memory"),
    Attempt("accumulated_step", accumulation_over_the_sequence, named="along the sequence"),
    Attempt("accumulated_step", accumulation_over_split_pieces, named="tensor.split(k) cuts pieces of k"),
    Attempt("accumulated_step", accumulation_loss_over_the_batch, named=("divided by the batch's",
                                                                        "k, the number of micro-batches")),
    Attempt("accumulated_step", accumulation_cleaning_up, named=NO_GRADIENT),
    Attempt("offloaded_adam_train", offload_without_bias_correction, named="without their bias corrections"),
    Attempt("offloaded_adam_train", offload_momentum_uncorrected, named="m used without its bias correction"),
    Attempt("offloaded_adam_train", offload_without_zero_grad, named="gradients never zeroed between steps"),
    Attempt("offloaded_adam_train", offload_counting_steps_from_zero, named="division by zero"),
    Attempt("offloaded_adam_train", offload_fresh_state_each_step, named="m and v made anew at every step"),
    Attempt("offloaded_adam_train", offload_variance_made_each_step, named="v made anew at every step while m carries"),
    Attempt("offloaded_adam_train", offload_step_count_never_advanced, named="the step count t never advanced"),
    Attempt("offloaded_adam_train", offload_step_count_per_tensor, named="advanced once per parameter tensor"),
    Attempt("offloaded_adam_train", offload_eps_inside_the_root, named="ε inside the square root"),
    Attempt("offloaded_adam_train", offload_corrections_in_the_step_size, "ε is then added before v's bias"),
    Attempt("offloaded_adam_train", offload_step_size_without_the_root, "without its square root"),
    Attempt("offloaded_adam_train", offload_gradient_in_the_numerator, named="the gradient g where m̂ belongs"),
    Attempt("offloaded_adam_train", offload_without_the_root, named="v̂ where √v̂ belongs"),
    Attempt("offloaded_adam_train", offload_updating_a_host_copy, named="unchanged"),
]
