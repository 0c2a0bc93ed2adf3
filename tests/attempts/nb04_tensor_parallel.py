"""Notebook 04 (tensor parallelism): first attempts, written from the notebook alone."""
import torch
import torch.nn.functional as F

import lib
from lib import sim
from puzzles import tensor_parallel as P
from puzzles.tensor_parallel import attention_core


def _fg(dist, group=None):
    """The learner's f and g from puzzles 1 and 2, reused later as the notebook suggests."""
    class Copy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad

    class Reduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x = x.clone()
            dist.all_reduce(x)
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad

    return Copy.apply, Reduce.apply


# ---------------------------------------------------------------- puzzle 1: column_parallel_linear

def column_parallel_linear_no_f(dist, x, weight, bias):
    return F.linear(x, weight, bias)


def column_parallel_linear_mean(dist, x, weight, bias):
    n = dist.get_world_size()

    class Copy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad / n                   # average, like data parallel

    return F.linear(Copy.apply(x), weight, bias)


def column_parallel_linear_reduce_forward(dist, x, weight, bias):
    class Copy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x = x.clone()
            dist.all_reduce(x)                # all-reduce both ways
            return x

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad

    return F.linear(Copy.apply(x), weight, bias)


def column_parallel_linear_gather_output(dist, x, weight, bias):
    n = dist.get_world_size()

    class Copy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad

    y = F.linear(Copy.apply(x), weight, bias)
    out = torch.empty((n * y.shape[-1],) + tuple(y.shape[:-1]), dtype=y.dtype)
    dist.all_gather_single(out, y.detach().movedim(-1, 0).contiguous())
    return out.movedim(0, -1)                 # the whole output, like F.linear would give


def column_parallel_linear_swapped(dist, x, weight, bias):
    # wrote g instead of f: all-reduce forward, identity backward
    class Op(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x = x.clone()
            dist.all_reduce(x)
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad

    return F.linear(Op.apply(x), weight, bias)


def column_parallel_linear_hook(dist, x, weight, bias):
    # correct: a gradient hook on an identity view of x instead of an autograd Function
    x_in = x.view_as(x)

    def reduce(grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad

    x_in.register_hook(reduce)
    return F.linear(x_in, weight, bias)


# ---------------------------------------------------------------- puzzle 2: row_parallel_linear

def row_parallel_linear_bias_every_rank(dist, x, weight, bias):
    _, g = _fg(dist)
    return g(F.linear(x, weight, bias))


def row_parallel_linear_reduce_backward_too(dist, x, weight, bias):
    class Reduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y):
            y = y.clone()
            dist.all_reduce(y)
            return y

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad)             # conjugate... so both?
            return grad

    return Reduce.apply(F.linear(x, weight)) + bias


def row_parallel_linear_mean(dist, x, weight, bias):
    n = dist.get_world_size()

    class Reduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y):
            y = y.clone()
            dist.all_reduce(y)
            return y / n

        @staticmethod
        def backward(ctx, grad):
            return grad

    return Reduce.apply(F.linear(x, weight)) + bias


def row_parallel_linear_bias_split(dist, x, weight, bias):
    # add bias / N on every rank before the all-reduce, so the sum has it once
    n = dist.get_world_size()
    _, g = _fg(dist)
    return g(F.linear(x, weight) + bias / n)


def row_parallel_linear_f_instead(dist, x, weight, bias):
    # used f (identity forward, all-reduce backward): mixed up which is which
    f, _ = _fg(dist)
    return f(F.linear(x, weight)) + bias


def row_parallel_linear_matmul(dist, x, weight, bias):
    # correct: matmul with the transpose instead of F.linear, g as a Function
    class Sum(torch.autograd.Function):
        @staticmethod
        def forward(ctx, partial):
            total = partial.clone()
            dist.all_reduce(total)
            return total

        @staticmethod
        def backward(ctx, grad_total):
            return grad_total

    return Sum.apply(x @ weight.t()) + bias


# ---------------------------------------------------------------- puzzle 3: megatron_mlp

def megatron_mlp_reduce_twice(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    f, g = _fg(dist)
    h = g(F.linear(f(x), fc1_w, fc1_b))       # all-reduce after fc1 as well
    return g(F.linear(F.gelu(h), fc2_w)) + fc2_b


def megatron_mlp_no_f(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    _, g = _fg(dist)
    h = F.gelu(F.linear(x, fc1_w, fc1_b))
    return g(F.linear(h, fc2_w)) + fc2_b


def megatron_mlp_bias_inside(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    f, g = _fg(dist)
    h = F.gelu(F.linear(f(x), fc1_w, fc1_b))
    return g(F.linear(h, fc2_w, fc2_b))


def megatron_mlp_tanh_gelu(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    f, g = _fg(dist)
    h = F.gelu(F.linear(f(x), fc1_w, fc1_b), approximate="tanh")   # GPT-2's gelu
    return g(F.linear(h, fc2_w)) + fc2_b


def megatron_mlp_gelu_after(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    f, g = _fg(dist)
    h = F.linear(f(x), fc1_w, fc1_b)
    return F.gelu(g(F.linear(h, fc2_w)) + fc2_b)   # gelu in the wrong place


def megatron_mlp_kept_gelu_twice(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    f, g = _fg(dist)
    pre = F.linear(f(x), fc1_w, fc1_b)
    act = F.gelu(pre)
    keep = pre.clone()                        # kept a copy of the pre-activation "for debugging"
    out = g(F.linear(act * torch.ones_like(keep), fc2_w)) + fc2_b
    return out


def megatron_mlp_addmm(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    # correct: written with @ and .t()
    f, g = _fg(dist)
    h = F.gelu(f(x) @ fc1_w.t() + fc1_b)
    return g(h @ fc2_w.t()) + fc2_b


# ---------------------------------------------------------------- puzzle 4: parallel_attention

def parallel_attention_all_heads(dist, x, qkv_w, qkv_b, proj_w, proj_b, heads):
    f, g = _fg(dist)
    qkv = F.linear(f(x), qkv_w, qkv_b)
    out = attention_core(qkv, heads)          # passed the total number of heads
    return g(F.linear(out, proj_w)) + proj_b


def parallel_attention_bias_inside(dist, x, qkv_w, qkv_b, proj_w, proj_b, heads):
    n = dist.get_world_size()
    f, g = _fg(dist)
    qkv = F.linear(f(x), qkv_w, qkv_b)
    out = attention_core(qkv, heads // n)
    return g(F.linear(out, proj_w, proj_b))


def parallel_attention_no_f(dist, x, qkv_w, qkv_b, proj_w, proj_b, heads):
    n = dist.get_world_size()
    _, g = _fg(dist)
    qkv = F.linear(x, qkv_w, qkv_b)
    out = attention_core(qkv, heads // n)
    return g(F.linear(out, proj_w)) + proj_b


def parallel_attention_interleaved(dist, x, qkv_w, qkv_b, proj_w, proj_b, heads):
    # I thought the rows were per head: [q_h, k_h, v_h] for each head, so I regrouped them to q|k|v
    n = dist.get_world_size()
    f, g = _fg(dist)
    qkv = F.linear(f(x), qkv_w, qkv_b)
    s, b, w3 = qkv.shape
    local = heads // n
    qkv = qkv.view(s, b, local, 3, w3 // (3 * local)).transpose(2, 3).reshape(s, b, w3)
    out = attention_core(qkv, local)
    return g(F.linear(out, proj_w)) + proj_b


def parallel_attention_no_mask(dist, x, qkv_w, qkv_b, proj_w, proj_b, heads):
    n = dist.get_world_size()
    f, g = _fg(dist)
    qkv = F.linear(f(x), qkv_w, qkv_b)
    s, b, w3 = qkv.shape
    local, w = heads // n, w3 // 3
    d = w // local
    q, k, v = qkv.split(w, dim=-1)
    q = q.reshape(s, b, local, d).permute(1, 2, 0, 3)
    k = k.reshape(s, b, local, d).permute(1, 2, 0, 3)
    v = v.reshape(s, b, local, d).permute(1, 2, 0, 3)
    att = torch.softmax(q @ k.transpose(-1, -2) / d ** 0.5, dim=-1)   # forgot the causal mask
    out = (att @ v).permute(2, 0, 1, 3).reshape(s, b, w)
    return g(F.linear(out, proj_w)) + proj_b


def parallel_attention_scale_by_h(dist, x, qkv_w, qkv_b, proj_w, proj_b, heads):
    n = dist.get_world_size()
    f, g = _fg(dist)
    qkv = F.linear(f(x), qkv_w, qkv_b)
    s, b, w3 = qkv.shape
    local, w = heads // n, w3 // 3
    d = w // local
    q, k, v = qkv.split(w, dim=-1)
    q = q.reshape(s, b, local, d).permute(1, 2, 0, 3)
    k = k.reshape(s, b, local, d).permute(1, 2, 0, 3)
    v = v.reshape(s, b, local, d).permute(1, 2, 0, 3)
    scores = q @ k.transpose(-1, -2) / w ** 0.5            # scaled by this rank's width, not the head size
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    out = (torch.softmax(scores, dim=-1) @ v).permute(2, 0, 1, 3).reshape(s, b, w)
    return g(F.linear(out, proj_w)) + proj_b


def parallel_attention_reference(dist, x, qkv_w, qkv_b, proj_w, proj_b, heads):
    # correct: f and g written inline as one Function class with a flag
    n = dist.get_world_size()

    class Comm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t, reduce_forward):
            ctx.reduce_forward = reduce_forward
            if reduce_forward:
                t = t.clone()
                dist.all_reduce(t)
                return t
            return t.view_as(t)

        @staticmethod
        def backward(ctx, grad):
            if ctx.reduce_forward:
                return grad, None
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad, None

    qkv = F.linear(Comm.apply(x, False), qkv_w, qkv_b)
    out = attention_core(qkv, heads // n)
    return Comm.apply(F.linear(out, proj_w), True) + proj_b


# ---------------------------------------------------------------- puzzle 5: sequence_parallel_mlp

def _sp_ops(dist, gather_backward="reduce_scatter", rs_forward="reduce_scatter", layout_bug=False):
    n = dist.get_world_size()
    rank = dist.get_rank()

    class Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x = x.contiguous()
            ctx.shape = x.shape
            out = torch.empty((n * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype)
            dist.all_gather_single(out, x)
            if layout_bug:
                out = out.reshape(x.shape[0], n * x.shape[1], *x.shape[2:])
            return out

        @staticmethod
        def backward(ctx, grad):
            if layout_bug:
                grad = grad.reshape(n * ctx.shape[0], *ctx.shape[1:])
            grad = grad.contiguous()
            if gather_backward == "slice":
                return grad.chunk(n)[rank].clone()
            out = torch.empty(ctx.shape, dtype=grad.dtype)
            dist.reduce_scatter_single(out, grad)
            return out

    class Scatter(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y):
            y = y.contiguous()
            if layout_bug:
                y = y.reshape(n * y.shape[0], y.shape[1] // n, *y.shape[2:])
            ctx.layout = y.shape
            if rs_forward == "all_reduce":
                total = y.clone()
                dist.all_reduce(total)
                return total.chunk(n)[rank].clone()
            out = torch.empty((y.shape[0] // n,) + tuple(y.shape[1:]), dtype=y.dtype)
            dist.reduce_scatter_single(out, y)
            return out

        @staticmethod
        def backward(ctx, grad):
            grad = grad.contiguous()
            out = torch.empty((n * grad.shape[0],) + tuple(grad.shape[1:]), dtype=grad.dtype)
            dist.all_gather_single(out, grad)
            if layout_bug:
                out = out.reshape(grad.shape[0], n * grad.shape[1], *grad.shape[2:])
            return out

    return Gather.apply, Scatter.apply


def sequence_parallel_mlp_slice_backward(dist, x, fc1_w, fc1_b, fc2_w):
    gather, scatter = _sp_ops(dist, gather_backward="slice")
    h = F.layer_norm(x, x.shape[-1:])
    y = scatter(F.linear(F.gelu(F.linear(gather(h), fc1_w, fc1_b)), fc2_w))
    return x + y


def sequence_parallel_mlp_norm_after_gather(dist, x, fc1_w, fc1_b, fc2_w):
    gather, scatter = _sp_ops(dist)
    full = gather(x)
    h = F.layer_norm(full, full.shape[-1:])   # LayerNorm on the whole sequence
    y = scatter(F.linear(F.gelu(F.linear(h, fc1_w, fc1_b)), fc2_w))
    return x + y


def sequence_parallel_mlp_no_residual(dist, x, fc1_w, fc1_b, fc2_w):
    gather, scatter = _sp_ops(dist)
    h = F.layer_norm(x, x.shape[-1:])
    return scatter(F.linear(F.gelu(F.linear(gather(h), fc1_w, fc1_b)), fc2_w))


def sequence_parallel_mlp_all_reduce(dist, x, fc1_w, fc1_b, fc2_w):
    gather, scatter = _sp_ops(dist, rs_forward="all_reduce")
    h = F.layer_norm(x, x.shape[-1:])
    y = scatter(F.linear(F.gelu(F.linear(gather(h), fc1_w, fc1_b)), fc2_w))
    return x + y


def sequence_parallel_mlp_wrong_reshape(dist, x, fc1_w, fc1_b, fc2_w):
    gather, scatter = _sp_ops(dist, layout_bug=True)
    h = F.layer_norm(x, x.shape[-1:])
    y = scatter(F.linear(F.gelu(F.linear(gather(h), fc1_w, fc1_b)), fc2_w))
    return x + y


def sequence_parallel_mlp_residual_on_norm(dist, x, fc1_w, fc1_b, fc2_w):
    gather, scatter = _sp_ops(dist)
    h = F.layer_norm(x, x.shape[-1:])
    y = scatter(F.linear(F.gelu(F.linear(gather(h), fc1_w, fc1_b)), fc2_w))
    return h + y


def sequence_parallel_mlp_correct(dist, x, fc1_w, fc1_b, fc2_w):
    # correct: the two Functions written as a pair; LayerNorm without weights as the notebook says
    gather, scatter = _sp_ops(dist)
    h = F.layer_norm(x, (x.shape[-1],))
    return x + scatter(F.linear(F.gelu(F.linear(gather(h), fc1_w, fc1_b)), fc2_w))


# ---------------------------------------------------------------- puzzle 6: vocab_parallel_loss

def _embed(dist, tokens, emb_w, mask_out=True):
    _, g = _fg(dist)
    vp, lo = emb_w.shape[0], dist.get_rank() * emb_w.shape[0]
    mine = (tokens >= lo) & (tokens < lo + vp)
    e = F.embedding((tokens - lo).clamp(0, vp - 1), emb_w)
    if mask_out:
        e = e * mine.unsqueeze(-1)
    return g(e)


def _vocab_loss(dist, tokens, targets, emb_w, head_w, *, shift="global", mask_embedding=True,
                mask_target=True, use_f=True):
    f, g = _fg(dist)
    vp, lo = head_w.shape[0], dist.get_rank() * head_w.shape[0]
    e = _embed(dist, tokens, emb_w, mask_out=mask_embedding)
    logits = F.linear(f(e) if use_f else e, head_w)            # [s, b, V/N]
    if shift == "global":
        m = logits.detach().max(dim=-1).values
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
    elif shift == "local":
        m = logits.detach().max(dim=-1).values
    else:
        m = torch.zeros(logits.shape[:-1], dtype=logits.dtype)
    z = logits - m.unsqueeze(-1)
    sumexp = g(z.exp().sum(dim=-1))
    mine = (targets >= lo) & (targets < lo + vp)
    picked = z.gather(-1, (targets - lo).clamp(0, vp - 1).unsqueeze(-1)).squeeze(-1)
    if mask_target:
        picked = picked * mine
    target_logit = g(picked)
    return (sumexp.log() - target_logit).mean()


def vocab_parallel_loss_no_shift(dist, tokens, targets, emb_w, head_w):
    return _vocab_loss(dist, tokens, targets, emb_w, head_w, shift="none")


def vocab_parallel_loss_local_max(dist, tokens, targets, emb_w, head_w):
    return _vocab_loss(dist, tokens, targets, emb_w, head_w, shift="local")


def vocab_parallel_loss_unmasked_embedding(dist, tokens, targets, emb_w, head_w):
    return _vocab_loss(dist, tokens, targets, emb_w, head_w, mask_embedding=False)


def vocab_parallel_loss_unmasked_target(dist, tokens, targets, emb_w, head_w):
    return _vocab_loss(dist, tokens, targets, emb_w, head_w, mask_target=False)


def vocab_parallel_loss_no_f(dist, tokens, targets, emb_w, head_w):
    return _vocab_loss(dist, tokens, targets, emb_w, head_w, use_f=False)


def vocab_parallel_loss_gather_logits(dist, tokens, targets, emb_w, head_w):
    n = dist.get_world_size()
    f, _ = _fg(dist)
    e = _embed(dist, tokens, emb_w)
    logits = F.linear(f(e), head_w)

    class GatherVocab(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            parts = torch.empty((n,) + tuple(t.shape), dtype=t.dtype)
            dist.all_gather_single(parts, t.contiguous().unsqueeze(0))
            return torch.cat(list(parts), dim=-1)

        @staticmethod
        def backward(ctx, grad):
            return grad.chunk(n, dim=-1)[dist.get_rank()].contiguous()

    full = GatherVocab.apply(logits)          # simplest: gather the logits, then F.cross_entropy
    return F.cross_entropy(full.reshape(-1, full.shape[-1]), targets.reshape(-1))


def vocab_parallel_loss_lse_merge(dist, tokens, targets, emb_w, head_w):
    # correct: each rank's logsumexp, merged with one MAX and one SUM all-reduce
    f, g = _fg(dist)
    vp, lo = head_w.shape[0], dist.get_rank() * head_w.shape[0]
    e = _embed(dist, tokens, emb_w)
    logits = F.linear(f(e), head_w)
    local = torch.logsumexp(logits, dim=-1)
    top = local.detach().clone()
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    lse = top + g((local - top).exp()).log()
    mine = (targets >= lo) & (targets < lo + vp)
    picked = logits.gather(-1, (targets - lo).clamp(0, vp - 1).unsqueeze(-1)).squeeze(-1)
    return (lse - g(picked * mine)).mean()


ATTEMPTS = [
    ("column_parallel_linear", column_parallel_linear_no_f, "no f at all: x.grad is only my slice's contribution"),
    ("column_parallel_linear", column_parallel_linear_mean, "f's backward averages (divides by N) instead of summing"),
    ("column_parallel_linear", column_parallel_linear_reduce_forward, "f all-reduces in forward too"),
    ("column_parallel_linear", column_parallel_linear_gather_output, "all-gathered the output to return the whole [s, b, out]"),
    ("column_parallel_linear", column_parallel_linear_swapped, "wrote g (all-reduce forward, identity backward) instead of f"),
    ("column_parallel_linear", column_parallel_linear_hook, "correct: register_hook on a view of x instead of an autograd Function"),
    ("row_parallel_linear", row_parallel_linear_bias_every_rank, "added the bias on every rank before the all-reduce (N times)"),
    ("row_parallel_linear", row_parallel_linear_reduce_backward_too, "g all-reduces in backward as well"),
    ("row_parallel_linear", row_parallel_linear_mean, "divided the all-reduced output by N"),
    ("row_parallel_linear", row_parallel_linear_bias_split, "added bias/N on every rank before the sum: output right, bias gradient divided by N"),
    ("row_parallel_linear", row_parallel_linear_f_instead, "used f (identity forward) where g belongs"),
    ("row_parallel_linear", row_parallel_linear_matmul, "correct: x @ weight.t() with g as a Function, bias after"),
    ("megatron_mlp", megatron_mlp_reduce_twice, "all-reduced after fc1 too"),
    ("megatron_mlp", megatron_mlp_no_f, "forgot f on x: x.grad incomplete"),
    ("megatron_mlp", megatron_mlp_bias_inside, "fc2's bias added inside g, so N times"),
    ("megatron_mlp", megatron_mlp_tanh_gelu, "tanh-approximate GeLU instead of the exact one"),
    ("megatron_mlp", megatron_mlp_gelu_after, "applied GeLU after fc2 instead of between fc1 and fc2"),
    ("megatron_mlp", megatron_mlp_kept_gelu_twice, "kept an extra copy of the 4h activation and multiplied by ones (saves too much)"),
    ("megatron_mlp", megatron_mlp_addmm, "correct: @ and .t() instead of F.linear"),
    ("parallel_attention", parallel_attention_all_heads, "passed the total number of heads to attention_core, not heads/N"),
    ("parallel_attention", parallel_attention_bias_inside, "proj's bias added before the all-reduce (N times)"),
    ("parallel_attention", parallel_attention_no_f, "forgot f on x"),
    ("parallel_attention", parallel_attention_interleaved, "thought qkv was interleaved per head and regrouped it"),
    ("parallel_attention", parallel_attention_no_mask, "wrote attention by hand and forgot the causal mask"),
    ("parallel_attention", parallel_attention_scale_by_h, "hand-written attention scaled by sqrt of this rank's width, not of the head size"),
    ("parallel_attention", parallel_attention_reference, "correct: f and g as one Function with a flag"),
    ("sequence_parallel_mlp", sequence_parallel_mlp_slice_backward, "all-gather's backward just takes my slice instead of reduce-scattering"),
    ("sequence_parallel_mlp", sequence_parallel_mlp_norm_after_gather, "LayerNorm after the all-gather, on the whole sequence"),
    ("sequence_parallel_mlp", sequence_parallel_mlp_no_residual, "forgot the residual x +"),
    ("sequence_parallel_mlp", sequence_parallel_mlp_all_reduce, "all-reduce then slice instead of reduce-scatter"),
    ("sequence_parallel_mlp", sequence_parallel_mlp_wrong_reshape, "reshaped the gathered tensor to [s/N, N*b, h]: ranks along the batch"),
    ("sequence_parallel_mlp", sequence_parallel_mlp_residual_on_norm, "residual added to the LayerNorm output instead of x"),
    ("sequence_parallel_mlp", sequence_parallel_mlp_correct, "correct: the pair of Functions, layer_norm with a tuple shape"),
    ("vocab_parallel_loss", vocab_parallel_loss_no_shift, "no max subtraction: exp overflows at logits of 1e4"),
    ("vocab_parallel_loss", vocab_parallel_loss_local_max, "subtracted my own max, not the all-reduced global max"),
    ("vocab_parallel_loss", vocab_parallel_loss_unmasked_embedding, "forgot to zero the embedding rows of tokens other ranks own"),
    ("vocab_parallel_loss", vocab_parallel_loss_unmasked_target, "every rank adds its clamped target logit (no mask)"),
    ("vocab_parallel_loss", vocab_parallel_loss_no_f, "no f between the embedding and the head: embedding gradient incomplete"),
    ("vocab_parallel_loss", vocab_parallel_loss_gather_logits, "gathered the whole [s, b, V] logits and called F.cross_entropy"),
    ("vocab_parallel_loss", vocab_parallel_loss_lse_merge, "correct: local logsumexp per rank merged with a MAX and a SUM all-reduce"),
]
