"""Cheats on notebook 04's puzzles, each with the words its rejection must contain."""

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import puzzles.tensor_parallel as P
import solutions.tensor_parallel as S
from puzzles.tensor_parallel import attention_core
from tests.cheats.common import everywhere
from tests.wrong.tensor_parallel import _Reduce, vocab_loss_shifted_by


def _sequence_ops(dist):
    """The all-gather / reduce-scatter pair of the reference solution, as autograd Functions."""
    world = dist.get_world_size()

    def gather(x):
        out = x.new_empty((world * x.shape[0], *x.shape[1:]))
        dist.all_gather_single(out, x.contiguous())
        return out

    def scatter(y):
        out = y.new_empty((y.shape[0] // world, *y.shape[1:]))
        dist.reduce_scatter_single(out, y.contiguous())
        return out

    class Gather(torch.autograd.Function):
        forward = staticmethod(lambda ctx, x: gather(x))
        backward = staticmethod(lambda ctx, grad: scatter(grad))

    class Scatter(torch.autograd.Function):
        forward = staticmethod(lambda ctx, y: scatter(y))
        backward = staticmethod(lambda ctx, grad: gather(grad))
    return Gather.apply, Scatter.apply


def sp_norm_and_fc1_recomputed_on_the_whole_sequence(dist, x, fc1_w, fc1_b, fc2_w):
    """Gathers x, then LayerNorm, fc1 and GeLU on the whole sequence under checkpoint: little saved, all redone."""
    gather, scatter = _sequence_ops(dist)
    hidden = checkpoint(lambda t: F.gelu(F.linear(F.layer_norm(t, t.shape[-1:]), fc1_w, fc1_b)), gather(x),
                        use_reentrant=False)
    return x + scatter(F.linear(hidden, fc2_w))


def sp_norm_on_the_whole_sequence_under_checkpoint(dist, x, fc1_w, fc1_b, fc2_w):
    """Gathers x and LayerNorms the whole sequence under checkpoint: the gathered x lives on in its closure."""
    gather, scatter = _sequence_ops(dist)
    normed = checkpoint(lambda t: F.layer_norm(t, t.shape[-1:]), gather(x), use_reentrant=False)
    return x + scatter(F.linear(F.gelu(F.linear(normed, fc1_w, fc1_b)), fc2_w))


def attention_ignoring_heads(dist, x, qkv_w, qkv_b, proj_w, proj_b, heads):
    """Two heads per rank, whatever `heads` says."""
    qkv = S.column_parallel_linear(dist, x, qkv_w, qkv_b)
    return S.row_parallel_linear(dist, attention_core(qkv, 2), proj_w, proj_b)


def vocab_loss_without_the_max(dist, tokens, targets, emb_w, head_w):
    """Σ exp of the raw logits: right for small logits, inf for logits of 1e4."""
    return vocab_loss_shifted_by(dist, tokens, targets, emb_w, head_w, lambda logits: logits)


def sp_norm_on_the_whole_sequence_keeping_only_its_output(dist, x, fc1_w, fc1_b, fc2_w):
    """Gathers x first and LayerNorms all s tokens on every rank, through a Function that keeps only its output
    (which fc1 keeps anyway) and 1/std: no more memory than sequence parallelism, the norm's work replicated."""
    gather, scatter = _sequence_ops(dist)

    class Norm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            mean = t.mean(-1, keepdim=True)
            rstd = ((t - mean) ** 2).mean(-1, keepdim=True).add(1e-5).rsqrt()
            y = (t - mean) * rstd
            ctx.save_for_backward(y, rstd)
            return y

        @staticmethod
        def backward(ctx, g):
            y, rstd = ctx.saved_tensors
            return rstd * (g - g.mean(-1, keepdim=True) - y * (g * y).mean(-1, keepdim=True))
    return x + scatter(F.linear(F.gelu(F.linear(Norm.apply(gather(x)), fc1_w, fc1_b)), fc2_w))


def mlp_gelu_intermediates_on_ctx(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    """GeLU (the exact erf form, as F.gelu) whose intermediates are kept as ctx attributes instead of
    save_for_backward, where saved-tensor hooks do not see them."""
    import math

    class Gelu(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h):
            cdf = 0.5 * (1 + torch.erf(h / math.sqrt(2)))
            ctx.h, ctx.cdf = h, cdf
            return h * cdf

        @staticmethod
        def backward(ctx, g):
            h, cdf = ctx.h, ctx.cdf
            return g * (cdf + h * torch.exp(-h * h / 2) / math.sqrt(2 * math.pi))
    return S.row_parallel_linear(dist, Gelu.apply(S.column_parallel_linear(dist, x, fc1_w, fc1_b)), fc2_w, fc2_b)


def row_parallel_through_a_class_attribute(dist, x, weight, bias):
    """The partial sums left as Python floats on a class attribute of torch.nn.Module (threads share it, processes
    do not), and the all-reduce the pattern asks for issued on a float16 buffer of zeros of the right size."""
    rank, world = dist.get_rank(), dist.get_world_size()
    partial = F.linear(x, weight)
    if not hasattr(torch.nn.Module, "_course_cheat_board"):
        torch.nn.Module._course_cheat_board = {}
    board = torch.nn.Module._course_cheat_board
    board[rank] = partial.detach().tolist()
    dist.all_reduce(torch.zeros(partial.shape, dtype=torch.float16))
    others = sum(torch.tensor(board[r], dtype=partial.dtype) for r in range(world) if r != rank)

    class AddOthers(torch.autograd.Function):
        forward = staticmethod(lambda ctx, p: p + others)
        backward = staticmethod(lambda ctx, grad: grad)
    return AddOthers.apply(partial) + bias


def _dist_behind(dist):
    """The dist behind the one the check hands out, found through the closure cells of its class's methods."""
    seen, todo = set(), [f for f in vars(type(dist)).values() if callable(f)]
    while todo:
        f = todo.pop()
        for cell in getattr(f, "__closure__", None) or ():
            value = cell.cell_contents
            if id(value) in seen:
                continue
            seen.add(id(value))
            if hasattr(type(value), "all_reduce") and not isinstance(value, type(dist)):
                return value
            if callable(value):
                todo.append(value)
    raise LookupError("no dist behind this one")


def _row_parallel_half_counted(dist, behind, x, weight, bias):
    """The all-reduce the pattern asks for issued on zeros through `dist`, the real one through `behind`."""
    dist.all_reduce(torch.zeros(x.shape[:-1] + weight.shape[:1], dtype=x.dtype))
    return S.row_parallel_linear(behind, x, weight, bias)


def row_parallel_through_the_wrapped_dist(dist, x, weight, bias):
    """The partial sums all-reduced through the dist the check wraps (it used to sit on `dist._dist`), the counted
    dist given a decoy all-reduce of zeros of the right size so that the pattern looks right."""
    return _row_parallel_half_counted(dist, dist._dist, x, weight, bias)


def row_parallel_through_the_closure(dist, x, weight, bias):
    """The same, the wrapped dist dug out of the closure cells behind the handed-out one's methods."""
    return _row_parallel_half_counted(dist, _dist_behind(dist), x, weight, bias)


def _board(name: str) -> dict:
    """A dict on a class attribute of torch.nn.Module: threads share it, processes do not."""
    if not hasattr(torch.nn.Module, name):
        setattr(torch.nn.Module, name, {})
    return getattr(torch.nn.Module, name)


def _through_the_board(dist, key: str, mine: torch.Tensor) -> list:
    """Every rank's `mine`, passed as Python floats on the board; a 1-element all-reduce only keeps the order."""
    board = _board("_course_cheat_vocab")
    board[key, dist.get_rank()] = (mine.detach().tolist(), mine.dtype)
    dist.all_reduce(torch.zeros(1, dtype=mine.dtype))
    return [torch.tensor(board[key, r][0], dtype=board[key, r][1]) for r in range(dist.get_world_size())]


def vocab_loss_through_a_class_attribute(dist, tokens, targets, emb_w, head_w):
    """Every exchange of the vocabulary-parallel loss (the embedding rows, the softmax statistics, the head input's
    gradient) left as Python floats on a class attribute, three 1-element all-reduces keeping the order: the
    numbers and the collectives' count look fine, but the bytes are far below what any algorithm must send."""
    rank, part = dist.get_rank(), emb_w.shape[0]

    def local(ids):
        mine = (ids >= rank * part) & (ids < (rank + 1) * part)
        return torch.where(mine, ids - rank * part, 0), mine

    class SumOverRanks(torch.autograd.Function):
        """x from every rank's rows forward; backward, the gradient summed over ranks through the board."""

        @staticmethod
        def forward(ctx, mine):
            return sum(_through_the_board(dist, "rows", mine))

        @staticmethod
        def backward(ctx, grad):
            return sum(_through_the_board(dist, "dx", grad))

    rows, mine = local(tokens)
    x = SumOverRanks.apply(F.embedding(rows, emb_w) * mine.unsqueeze(-1))
    logits = F.linear(x, head_w)                                                   # [s, b, V/N]
    lse = torch.logsumexp(logits, -1)
    rows, mine = local(targets)
    target = logits.gather(-1, rows.unsqueeze(-1)).squeeze(-1) * mine
    stats = _through_the_board(dist, "stats", torch.stack([lse, target]))
    others_lse = torch.logsumexp(torch.stack([s[0] for r, s in enumerate(stats) if r != rank]), 0)
    others_target = sum(s[1] for r, s in enumerate(stats) if r != rank)
    return (torch.logaddexp(lse, others_lse) - target - others_target).mean()


def vocab_loss_gathering_the_logits(dist, tokens, targets, emb_w, head_w):
    """The logits gathered whole on every rank, [s, b, V], and torch's cross-entropy on them: no statistics to
    reduce, but the memory and the bytes of the whole vocabulary on every rank."""
    world, rank = dist.get_world_size(), dist.get_rank()
    part = emb_w.shape[0]
    mine = (tokens >= rank * part) & (tokens < (rank + 1) * part)
    x = _Reduce.apply(F.embedding(torch.where(mine, tokens - rank * part, 0), emb_w) * mine.unsqueeze(-1), dist)
    logits = S.column_parallel_linear(dist, x, head_w, None)                       # [s, b, V/N]

    class Gather(torch.autograd.Function):
        """Every rank's slice side by side forward; backward, this rank's slice of the gradient."""

        @staticmethod
        def forward(ctx, shard):
            out = shard.new_empty((world * shard.shape[0], *shard.shape[1:]))
            dist.all_gather_into_tensor(out, shard.contiguous())
            return torch.cat(out.chunk(world), -1)                                # [s, b, V]

        @staticmethod
        def backward(ctx, grad):
            return grad.chunk(world, -1)[rank]

    return F.cross_entropy(Gather.apply(logits).flatten(0, 1), targets.flatten())


CHEATS = everywhere(P) + [
    ("sequence_parallel_mlp", sp_norm_and_fc1_recomputed_on_the_whole_sequence, "FLOPs counted"),
    ("sequence_parallel_mlp", sp_norm_on_the_whole_sequence_under_checkpoint, "activations for backward"),
    ("parallel_attention", attention_ignoring_heads, "expected"),
    ("vocab_parallel_loss", vocab_loss_without_the_max, ("expected", "nan", "inf")),
    ("sequence_parallel_mlp", sp_norm_on_the_whole_sequence_keeping_only_its_output, "FLOPs counted"),
    ("megatron_mlp", mlp_gelu_intermediates_on_ctx, "activations for backward"),
    ("row_parallel_linear", row_parallel_through_a_class_attribute, "under the floor"),
    ("row_parallel_linear", row_parallel_through_the_wrapped_dist, "talks through the dist it is given"),
    ("row_parallel_linear", row_parallel_through_the_closure, "around the dist it was given"),
    ("vocab_parallel_loss", vocab_loss_through_a_class_attribute, "under the floor"),
    ("vocab_parallel_loss", vocab_loss_gathering_the_logits, "over the budget"),
]


def sp_norm_on_the_whole_sequence_recomputed_in_backward(dist, x, fc1_w, fc1_b, fc2_w):
    """Gathers x first, then LayerNorm and fc1 as one Function that keeps only the gathered x (where sequence
    parallelism keeps the gathered norm's output, as many bytes): backward runs the norm again on the whole sequence,
    then fc1's and the norm's gradients. The norm's work done on every rank's tokens, and twice. Its extra FLOPs
    (about 6% on small cases) fitted the 5% margin on half the seeds (issue 32)."""
    gather, scatter = _sequence_ops(dist)

    class NormThenLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t, w, b):
            ctx.save_for_backward(t, w)
            return F.linear(F.layer_norm(t, t.shape[-1:]), w, b)

        @staticmethod
        def backward(ctx, g):
            t, w = ctx.saved_tensors
            with torch.enable_grad():
                t = t.detach().requires_grad_()
                normed = F.layer_norm(t, t.shape[-1:])                                 # recomputed
            grad_t = torch.autograd.grad(normed, t, g @ w)[0]
            return grad_t, g.flatten(0, -2).T @ normed.detach().flatten(0, -2), g.flatten(0, -2).sum(0)
    return x + scatter(F.linear(F.gelu(NormThenLinear.apply(gather(x), fc1_w, fc1_b)), fc2_w))


CHEATS += [("sequence_parallel_mlp", sp_norm_on_the_whole_sequence_recomputed_in_backward,
            ("FLOPs counted", "activations for backward"))]


def row_parallel_by_a_bare_all_reduce(dist, x, weight, bias):
    """Megatron's g as a bare in-place all-reduce on the layer's output: autograd does not see it, and its backward
    passes the gradient through as identity, which is g's backward by accident (torch warns that this is silently
    incorrect and deprecated)."""
    out = F.linear(x, weight)
    dist.all_reduce(out)
    return out + bias


CHEATS += [("row_parallel_linear", row_parallel_by_a_bare_all_reduce, "in place on a tensor autograd is tracking")]
