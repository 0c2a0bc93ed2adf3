"""Wrong answers to notebook 04's puzzles, each with the words its failure message must contain.

A wrong answer must fail, whatever else it gets right; tests/test_content.py runs every catalogue.
"""

import torch
import torch.nn.functional as F

import solutions.tensor_parallel as S


class _Reduce(torch.autograd.Function):
    """g done right, for the wrong answers that get something else wrong."""

    @staticmethod
    def forward(ctx, x, dist):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def column_without_f(dist, x, weight, bias):
    """No f: x.grad on each rank holds only the part flowing through its own output features."""
    return F.linear(x, weight, bias)


def column_gathers_the_output(dist, x, weight, bias):
    """Megatron's gather_output=True: a full output nobody asked for, and an all-gather."""
    local = F.linear(x, weight, bias)
    parts = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local.detach().contiguous())
    return torch.cat(parts, -1)


def row_g_without_backward(dist, x, weight, bias):
    """The all-reduce on a detached copy: right output, but no gradient reaches the weight or the input."""
    partial = F.linear(x, weight).detach().clone()
    dist.all_reduce(partial)
    return partial + bias


def row_bias_before_all_reduce(dist, x, weight, bias):
    """The all-reduce in the wrong place: after the bias, which every rank adds, so it counts N times."""
    return _Reduce.apply(F.linear(x, weight, bias), dist)


def mlp_g_reduces_in_backward(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    """g all-reducing in backward too: the gradient, already whole on every rank, is summed N times."""

    class ReduceBoth(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y):
            y = y.clone()
            dist.all_reduce(y)
            return y

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad

    hidden = F.gelu(S.column_parallel_linear(dist, x, fc1_w, fc1_b))
    return ReduceBoth.apply(F.linear(hidden, fc2_w)) + fc2_b


def mlp_g_without_backward(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    hidden = F.gelu(S.column_parallel_linear(dist, x, fc1_w, fc1_b))
    return row_g_without_backward(dist, hidden, fc2_w, fc2_b)


def attention_heads_on_the_wrong_dimension(dist, x, qkv_w, qkv_b, proj_w, proj_b, heads):
    """[s, b, w] read as [s, b, d, heads] instead of [s, b, heads, d]: each "head" mixes every head."""
    qkv = S.column_parallel_linear(dist, x, qkv_w, qkv_b)
    s, b, three_w = qkv.shape
    w, n = three_w // 3, heads // dist.get_world_size()
    d = w // n
    q, k, v = (t.reshape(s, b, d, n).permute(1, 3, 0, 2) for t in qkv.split(w, -1))
    causal = torch.full((s, s), float("-inf"), dtype=x.dtype).triu(1)
    out = (((q @ k.transpose(-2, -1)) * d ** -0.5 + causal).softmax(-1) @ v).permute(2, 0, 1, 3).reshape(s, b, w)
    return S.row_parallel_linear(dist, out, proj_w, proj_b)


def sp_all_reduce_instead(dist, x, fc1_w, fc1_b, fc2_w):
    """Right answer the old way: gather the tokens, run the plain Megatron MLP (all-reduces), keep ours."""
    world, rank = dist.get_world_size(), dist.get_rank()
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.detach().contiguous())
    parts[rank] = x
    full = torch.cat(parts)
    normed = F.layer_norm(full, full.shape[-1:])
    hidden = F.gelu(S.column_parallel_linear(dist, normed, fc1_w, fc1_b))
    out = _Reduce.apply(F.linear(hidden, fc2_w), dist)
    return x + out.chunk(world)[rank]


def loss_gathers_the_logits(dist, tokens, targets, emb_w, head_w):
    """Right loss and gradients, but every rank builds the full [s, b, V] logits."""
    world, rank, part = dist.get_world_size(), dist.get_rank(), emb_w.shape[0]
    mine = (tokens >= rank * part) & (tokens < (rank + 1) * part)
    x = _Reduce.apply(F.embedding(torch.where(mine, tokens - rank * part, 0), emb_w) * mine.unsqueeze(-1), dist)
    logits = S.column_parallel_linear(dist, x, head_w, None)

    class Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, local):
            parts = [torch.empty_like(local) for _ in range(world)]
            dist.all_gather(parts, local.contiguous())
            return torch.cat(parts, -1)

        @staticmethod
        def backward(ctx, grad):
            return grad.chunk(world, -1)[rank]

    full = Gather.apply(logits)
    return F.cross_entropy(full.flatten(0, 1), targets.flatten())


def _owned(ids, first, part):
    return (ids >= first) & (ids < first + part)


def vocab_loss_shifted_by(dist, tokens, targets, emb_w, head_w, shift, owned=_owned):
    """A deliberate copy of solutions.tensor_parallel.vocab_parallel_loss with its all-reduced max replaced by
    `shift(logits)` (and, for one wrong answer, its test of which ids a rank owns), the changes of the wrong answers
    and cheats built on it (same collectives)."""
    part, first = emb_w.shape[0], dist.get_rank() * emb_w.shape[0]

    def local(ids):
        mine = owned(ids, first, part)
        return torch.where(mine, (ids - first).clamp(0, part - 1), 0), mine

    rows, mine = local(tokens)
    x = _Reduce.apply(F.embedding(rows, emb_w) * mine.unsqueeze(-1), dist)
    logits = S.column_parallel_linear(dist, x, head_w, None)
    shifted = shift(logits)
    sum_exp = _Reduce.apply(shifted.exp().sum(-1), dist)
    rows, mine = local(targets)
    target = _Reduce.apply(shifted.gather(-1, rows.unsqueeze(-1)).squeeze(-1) * mine, dist)
    dist.all_reduce(torch.zeros_like(target))
    return (sum_exp.log() - target).mean()


def loss_without_max_all_reduce(dist, tokens, targets, emb_w, head_w):
    """Each rank subtracts its own maximum: the sum of exponentials mixes different shifts."""
    return vocab_loss_shifted_by(dist, tokens, targets, emb_w, head_w,
                                 lambda logits: logits - logits.detach().amax(-1, keepdim=True))


def vocab_loss_owning_ids_off_by_one(dist, tokens, targets, emb_w, head_w):
    """A rank owns ids first < id <= first + V/N: each shard's first id is nobody's, and its last the next rank's."""
    def shift(logits):
        top = logits.detach().amax(-1)
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        return logits - top.unsqueeze(-1)
    return vocab_loss_shifted_by(dist, tokens, targets, emb_w, head_w, shift,
                                 owned=lambda ids, first, part: (ids > first) & (ids <= first + part))


def mlp_with_hand_written_gelu(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    """The exact GeLU written out: the same numbers, but autograd keeps several 4h-wide intermediates."""
    a = S.column_parallel_linear(dist, x, fc1_w, fc1_b)
    hidden = 0.5 * a * (1 + torch.erf(a / 2 ** 0.5))
    return S.row_parallel_linear(dist, hidden, fc2_w, fc2_b)


def attention_projection_padded_to_full_width(dist, x, qkv_w, qkv_b, proj_w, proj_b, heads):
    """This rank's heads put in place in a zero [s, b, h] output and projected by proj_w zero-padded to
    [h, h]: the same numbers, but the full-width input and the padded weight are kept for backward."""
    world, rank = dist.get_world_size(), dist.get_rank()
    qkv = S.column_parallel_linear(dist, x, qkv_w, qkv_b)
    out = S.attention_core(qkv, heads // world)
    w = out.shape[-1]
    before, after = rank * w, (world - rank - 1) * w
    full = F.pad(out, (before, after))
    full_w = F.pad(proj_w, (before, after))
    return _Reduce.apply(F.linear(full, full_w), dist) + proj_b


def sp_layer_norm_after_the_gather(dist, x, fc1_w, fc1_b, fc2_w):
    """LayerNorm inside the tensor-parallel region, on the gathered sequence: the same numbers and
    collectives, but every rank keeps the full [s, b, h] input and output of the norm."""
    world = dist.get_world_size()

    class Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            out = x.new_empty((world * x.shape[0], *x.shape[1:]))
            dist.all_gather_single(out, x.contiguous())
            return out

        @staticmethod
        def backward(ctx, grad):
            out = grad.new_empty((grad.shape[0] // world, *grad.shape[1:]))
            dist.reduce_scatter_single(out, grad.contiguous())
            return out

    class Scatter(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y):
            out = y.new_empty((y.shape[0] // world, *y.shape[1:]))
            dist.reduce_scatter_single(out, y.contiguous())
            return out

        @staticmethod
        def backward(ctx, grad):
            out = grad.new_empty((world * grad.shape[0], *grad.shape[1:]))
            dist.all_gather_single(out, grad.contiguous())
            return out

    full = Gather.apply(x)
    hidden = F.gelu(F.linear(F.layer_norm(full, full.shape[-1:]), fc1_w, fc1_b))
    return x + Scatter.apply(F.linear(hidden, fc2_w))


WRONG = [
    ("column_parallel_linear", column_without_f, "backward pass should issue one all_reduce"),
    ("column_parallel_linear", column_gathers_the_output, "should have shape"),
    ("row_parallel_linear", row_g_without_backward, "no gradient: backward never reached"),
    ("row_parallel_linear", row_bias_before_all_reduce, "the result['output']"),
    ("megatron_mlp", mlp_g_reduces_in_backward, "issued 2 × all_reduce"),
    ("megatron_mlp", mlp_g_without_backward, "backward pass should issue one all_reduce"),
    ("megatron_mlp", mlp_with_hand_written_gelu, "of activations for backward"),
    ("parallel_attention", attention_heads_on_the_wrong_dimension, "the result['output']"),
    ("parallel_attention", attention_projection_padded_to_full_width, "of activations for backward"),
    ("sequence_parallel_mlp", sp_all_reduce_instead, "one all_reduce of"),
    ("sequence_parallel_mlp", sp_layer_norm_after_the_gather, "of activations for backward"),
    # At N = 2 the full logits are only twice a shard: the gather may fit in memory and fail on bytes instead.
    ("vocab_parallel_loss", loss_gathers_the_logits, ("peak memory", "sent is")),
    ("vocab_parallel_loss", loss_without_max_all_reduce, "the result['output']"),
    ("vocab_parallel_loss", vocab_loss_owning_ids_off_by_one, "the result['output']"),
]
