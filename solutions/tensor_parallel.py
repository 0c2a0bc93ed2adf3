"""Notebook 04, tensor and sequence parallelism: the reference solutions.

Each function is a layer's forward pass on one rank; autograd gives its backward. The operators that
communicate are torch.autograd.Functions defined inside the function, so that they can use `dist`.
"""

import torch
import torch.nn.functional as F

from puzzles.tensor_parallel import attention_core


def column_parallel_linear(dist, x, weight, bias):
    class Copy(torch.autograd.Function):
        """Megatron's f: identity forward, all-reduce of the gradient backward."""

        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad

    return F.linear(Copy.apply(x), weight, bias)


def row_parallel_linear(dist, x, weight, bias):
    class Reduce(torch.autograd.Function):
        """Megatron's g: all-reduce forward, identity backward."""

        @staticmethod
        def forward(ctx, x):
            x = x.clone()
            dist.all_reduce(x)
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad

    return Reduce.apply(F.linear(x, weight)) + bias


def megatron_mlp(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    hidden = F.gelu(column_parallel_linear(dist, x, fc1_w, fc1_b))
    return row_parallel_linear(dist, hidden, fc2_w, fc2_b)


def parallel_attention(dist, x, qkv_w, qkv_b, proj_w, proj_b, heads):
    qkv = column_parallel_linear(dist, x, qkv_w, qkv_b)
    out = attention_core(qkv, heads // dist.get_world_size())
    return row_parallel_linear(dist, out, proj_w, proj_b)


def sequence_parallel_mlp(dist, x, fc1_w, fc1_b, fc2_w):
    world = dist.get_world_size()

    class Gather(torch.autograd.Function):
        """All-gather the sequence forward, reduce-scatter the gradient backward."""

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
        """Reduce-scatter the sequence forward, all-gather the gradient backward."""

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

    normed = F.layer_norm(x, x.shape[-1:])                    # on this rank's tokens only
    hidden = F.gelu(F.linear(Gather.apply(normed), fc1_w, fc1_b))
    return x + Scatter.apply(F.linear(hidden, fc2_w))


def vocab_parallel_loss(dist, tokens, targets, emb_w, head_w):
    part = emb_w.shape[0]
    first = dist.get_rank() * part

    class Reduce(torch.autograd.Function):
        """g: sum over ranks forward, identity backward."""

        @staticmethod
        def forward(ctx, x):
            x = x.clone()
            dist.all_reduce(x)
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad

    def local(ids):
        """This rank's row of each id, and whether it owns it."""
        mine = (ids >= first) & (ids < first + part)
        return torch.where(mine, ids - first, 0), mine

    rows, mine = local(tokens)
    x = Reduce.apply(F.embedding(rows, emb_w) * mine.unsqueeze(-1))
    logits = column_parallel_linear(dist, x, head_w, None)        # [s, b, V/N]: this rank's slice
    top = logits.detach().amax(-1)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    shifted = logits - top.unsqueeze(-1)
    sum_exp = Reduce.apply(shifted.exp().sum(-1))
    rows, mine = local(targets)
    target = Reduce.apply(shifted.gather(-1, rows.unsqueeze(-1)).squeeze(-1) * mine)
    return (sum_exp.log() - target).mean()
