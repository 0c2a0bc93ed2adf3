"""Realistic first attempts at notebook 04's puzzles (tensor and sequence parallelism), none of them in tests/wrong."""

import torch
import torch.nn.functional as F

from puzzles.tensor_parallel import attention_core
from tests.mistakes import Attempt, NO_GRADIENT

# Each rank's values add up, over the ranks, to what every rank should hold: a sum that was never made.
NEVER_SUMMED = ("add up to", "summed over the ranks", "sum over ranks")
# Ids (or rows) of the vocabulary that another rank owns, used by this one.
NOT_ITS_OWN = ("does not own", "another rank's rows", "owned by another rank")


def _f(dist, *, scale=1.0, keep_own=False):
    """Megatron's f (identity forward, all-reduce backward), with the knob of one mistake: the reduced gradient
    scaled, or reduced into a copy and the rank's own gradient returned."""
    class Copy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            reduced = grad.clone()
            dist.all_reduce(reduced)
            return grad if keep_own else reduced * scale
    return Copy.apply


def _g(dist, *, scale=1.0, backward_reduces=False):
    """Megatron's g (all-reduce forward, identity backward), with the knob of one mistake."""
    class Reduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            x = x.clone()
            dist.all_reduce(x)
            return x * scale

        @staticmethod
        def backward(ctx, grad):
            if backward_reduces:
                grad = grad.clone()
                dist.all_reduce(grad)
            return grad
    return Reduce.apply


# ---- column_parallel_linear ---------------------------------------------------------------------------------
def column_f_averages(dist, x, weight, bias):
    """f's backward all-reduces, then divides by the world size 'to average the ranks' gradients'."""
    return F.linear(_f(dist, scale=1 / dist.get_world_size())(x), weight, bias)


def column_f_returns_its_own_gradient(dist, x, weight, bias):
    """f's backward all-reduces a clone of the gradient and returns the original: the collective runs, its result
    is dropped."""
    return F.linear(_f(dist, keep_own=True)(x), weight, bias)


def column_slices_the_shard_again(dist, x, weight, bias):
    """weight.chunk(N)[rank], as in the single-device sketch: but the weight handed in is already this rank's rows."""
    rank, world = dist.get_rank(), dist.get_world_size()
    return F.linear(_f(dist)(x), weight.chunk(world)[rank], bias.chunk(world)[rank])


def column_reduces_both_ways(dist, x, weight, bias):
    """'Tensor parallelism all-reduces': f's all-reduce in backward, and the output all-reduced in forward too."""
    return _g(dist)(F.linear(_f(dist)(x), weight, bias))


def column_weight_as_stored(dist, x, weight, bias):
    """x @ weight + bias, as a NumPy sketch writes a layer: nn.Linear's weight is (out, in), so it is x @ weight.T."""
    return _f(dist)(x) @ weight + bias


def column_without_bias(dist, x, weight, bias):
    """F.linear(x, weight): the bias shard forgotten, as Megatron's skip_bias_add leaves it for a later fusion."""
    return F.linear(_f(dist)(x), weight)


# ---- row_parallel_linear ------------------------------------------------------------------------------------
def row_bias_on_rank_zero(dist, x, weight, bias):
    """The bias added before the all-reduce on rank 0 only, so that the sum holds it once: the other ranks' bias
    never reaches the output."""
    partial = F.linear(x, weight, bias if dist.get_rank() == 0 else None)
    return _g(dist)(partial)


def row_bias_divided_by_n(dist, x, weight, bias):
    """Each rank adds bias / N before the all-reduce, so that the N copies sum to one bias."""
    return _g(dist)(F.linear(x, weight) + bias / dist.get_world_size())


def row_g_reduces_backward_too(dist, x, weight, bias):
    """g with an all-reduce in backward as well, 'by symmetry with f'."""
    return _g(dist, backward_reduces=True)(F.linear(x, weight)) + bias


def row_g_averages(dist, x, weight, bias):
    """The partial sums averaged (all-reduce, then / N) instead of summed."""
    return _g(dist, scale=1 / dist.get_world_size())(F.linear(x, weight)) + bias


def row_weight_transposed(dist, x, weight, bias):
    """x @ weight, as in a NumPy sketch: nn.Linear keeps its weight as (out, in), so it is x @ weight.T."""
    return _g(dist)(x @ weight) + bias


# ---- megatron_mlp -------------------------------------------------------------------------------------------
def mlp_reduces_the_hidden_layer(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    """fc1's output all-reduced before GeLU, 'to combine the ranks', then fc2 row-parallel as well."""
    hidden = F.gelu(_g(dist)(F.linear(_f(dist)(x), fc1_w, fc1_b)))
    return _g(dist)(F.linear(hidden, fc2_w)) + fc2_b


def mlp_tanh_gelu(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    """GPT-2's GeLU, F.gelu(approximate='tanh'), where the layer uses the exact one."""
    hidden = F.gelu(F.linear(_f(dist)(x), fc1_w, fc1_b), approximate="tanh")
    return _g(dist)(F.linear(hidden, fc2_w)) + fc2_b


def mlp_gelu_on_the_sum(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    """GeLU moved after g 'so that it sees the whole hidden layer at once': it then acts on fc2's summed output."""
    hidden = F.linear(_f(dist)(x), fc1_w, fc1_b)
    return F.gelu(_g(dist)(F.linear(hidden, fc2_w))) + fc2_b


def mlp_f_and_g_swapped(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    """g before fc1 and f after fc2: one all-reduce each way as the statement says, in the wrong places."""
    hidden = F.gelu(F.linear(_g(dist)(x), fc1_w, fc1_b))
    return _f(dist)(F.linear(hidden, fc2_w)) + fc2_b


def mlp_g_averages(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    """fc2's partial sums averaged over the ranks instead of summed."""
    hidden = F.gelu(F.linear(_f(dist)(x), fc1_w, fc1_b))
    return _g(dist, scale=1 / dist.get_world_size())(F.linear(hidden, fc2_w)) + fc2_b


def mlp_fc2_bias_divided_by_n(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    """fc2's bias / N added on every rank before the all-reduce: the right output, a gradient N times too small."""
    hidden = F.gelu(F.linear(_f(dist)(x), fc1_w, fc1_b))
    return _g(dist)(F.linear(hidden, fc2_w) + fc2_b / dist.get_world_size())


def mlp_fc1_bias_after_gelu(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    """fc1's bias added to the hidden units after GeLU ('the bias goes with the layer's output')."""
    hidden = F.gelu(F.linear(_f(dist)(x), fc1_w)) + fc1_b
    return _g(dist)(F.linear(hidden, fc2_w)) + fc2_b


def mlp_fc1_bias_left_out(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    """fc1 without its bias, fc2's kept: 'only the row-parallel layer's bias needs care'."""
    hidden = F.gelu(F.linear(_f(dist)(x), fc1_w))
    return _g(dist)(F.linear(hidden, fc2_w)) + fc2_b


def mlp_fc1_bias_divided_by_n(dist, x, fc1_w, fc1_b, fc2_w, fc2_b):
    """fc1's bias divided by N, as if the column-parallel layer's bias too were summed over the ranks."""
    hidden = F.gelu(F.linear(_f(dist)(x), fc1_w, fc1_b / dist.get_world_size()))
    return _g(dist)(F.linear(hidden, fc2_w)) + fc2_b


# ---- parallel_attention -------------------------------------------------------------------------------------
def _attention(dist, x, qkv_w, qkv_b, proj_w, proj_b, core):
    qkv = F.linear(_f(dist)(x), qkv_w, qkv_b)
    return _g(dist)(F.linear(core(qkv), proj_w)) + proj_b


def attention_every_head_on_every_rank(dist, x, qkv_w, qkv_b, proj_w, proj_b, heads):
    """attention_core(qkv, heads): all the model's heads, where this rank holds heads / N of them."""
    return _attention(dist, x, qkv_w, qkv_b, proj_w, proj_b, lambda qkv: attention_core(qkv, heads))


def _core(qkv, heads, *, causal=True, scale=None, interleaved=False):
    """Attention written out from q, k, v of [s, b, 3w], with the knob of one mistake."""
    s, b, three_w = qkv.shape
    w = three_w // 3
    d = w // heads
    if interleaved:           # Megatron-LM's fused layout: [s, b, heads, 3·d], each head's q, k, v side by side
        q, k, v = qkv.reshape(s, b, heads, 3 * d).split(d, dim=-1)
    else:
        q, k, v = (t.reshape(s, b, heads, d) for t in qkv.split(w, dim=-1))
    q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))                                 # (b, a, s, d)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    return out.permute(2, 0, 1, 3).reshape(s, b, w)


def attention_without_the_causal_mask(dist, x, qkv_w, qkv_b, proj_w, proj_b, heads):
    """F.scaled_dot_product_attention(q, k, v) without is_causal=True: every token sees the future."""
    h = heads // dist.get_world_size()
    return _attention(dist, x, qkv_w, qkv_b, proj_w, proj_b, lambda qkv: _core(qkv, h, causal=False))


def attention_scaled_by_the_hidden_size(dist, x, qkv_w, qkv_b, proj_w, proj_b, heads):
    """Scores divided by √h, the model's width, instead of √d, the head's."""
    h = heads // dist.get_world_size()
    width = x.shape[-1]
    return _attention(dist, x, qkv_w, qkv_b, proj_w, proj_b, lambda qkv: _core(qkv, h, scale=width ** -0.5))


def attention_with_megatrons_interleaved_qkv(dist, x, qkv_w, qkv_b, proj_w, proj_b, heads):
    """qkv read as [s, b, heads, 3·d] (Megatron-LM's fused layout: each head's q, k, v together), where this
    layer's qkv is [s, b, 3·w] (all of q, then all of k, then all of v); the two layouts mixed up, as in
    tenstorrent/tt-metal#6243."""
    h = heads // dist.get_world_size()
    return _attention(dist, x, qkv_w, qkv_b, proj_w, proj_b, lambda qkv: _core(qkv, h, interleaved=True))


def attention_softmax_over_the_queries(dist, x, qkv_w, qkv_b, proj_w, proj_b, heads):
    """softmax(dim=-2) on the (queries × keys) scores: each key's weights sum to 1 instead of each query's."""
    def core(qkv):
        s, b, three_w = qkv.shape
        w = three_w // 3
        a = heads // dist.get_world_size()
        d = w // a
        q, k, v = (t.reshape(s, b, a, d).permute(1, 2, 0, 3) for t in qkv.split(w, dim=-1))
        causal = torch.full((s, s), float("-inf"), dtype=qkv.dtype).triu(1)
        weights = ((q @ k.transpose(-2, -1)) * d ** -0.5 + causal).softmax(-2)
        return (weights @ v).permute(2, 0, 1, 3).reshape(s, b, w)
    return _attention(dist, x, qkv_w, qkv_b, proj_w, proj_b, core)


# ---- sequence_parallel_mlp ----------------------------------------------------------------------------------
def _sp(dist, x, fc1_w, fc1_b, fc2_w, *, residual_after=True, gather_backward="reduce_scatter", norm=None,
        scatter="reduce_scatter"):
    """Sequence-parallel MLP as the hints lay it out, with the knob of one mistake turned."""
    world, rank = dist.get_world_size(), dist.get_rank()

    class Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            out = t.new_empty((world * t.shape[0], *t.shape[1:]))
            dist.all_gather_single(out, t.contiguous())
            return out

        @staticmethod
        def backward(ctx, grad):
            if gather_backward == "slice":
                return grad.chunk(world)[rank].contiguous()
            out = grad.new_empty((grad.shape[0] // world, *grad.shape[1:]))
            dist.reduce_scatter_single(out, grad.contiguous())
            return out

    class Scatter(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y):
            if scatter == "all_reduce":
                y = y.clone()
                dist.all_reduce(y)
                return y.chunk(world)[rank].contiguous()
            out = y.new_empty((y.shape[0] // world, *y.shape[1:]))
            dist.reduce_scatter_single(out, y.contiguous())
            return out

        @staticmethod
        def backward(ctx, grad):
            out = grad.new_empty((world * grad.shape[0], *grad.shape[1:]))
            dist.all_gather_single(out, grad.contiguous())
            return out

    normed = (norm or (lambda t: F.layer_norm(t, t.shape[-1:])))(x)
    if residual_after:
        return x + Scatter.apply(F.linear(F.gelu(F.linear(Gather.apply(normed), fc1_w, fc1_b)), fc2_w))
    gathered_x = Gather.apply(x)
    hidden = F.gelu(F.linear(Gather.apply(normed), fc1_w, fc1_b))
    return Scatter.apply(gathered_x + F.linear(hidden, fc2_w))


def sp_residual_before_the_scatter(dist, x, fc1_w, fc1_b, fc2_w):
    """The residual added to the full sequence before the reduce-scatter: every rank's copy of x enters the sum."""
    return _sp(dist, x, fc1_w, fc1_b, fc2_w, residual_after=False)


def sp_gather_backward_slices(dist, x, fc1_w, fc1_b, fc2_w):
    """The all-gather's backward takes this rank's slice of the gradient, 'the inverse of concatenating': but every
    rank's output depends on this rank's tokens, so their gradients must be summed (a reduce-scatter)."""
    return _sp(dist, x, fc1_w, fc1_b, fc2_w, gather_backward="slice")


def sp_layer_norm_by_hand(dist, x, fc1_w, fc1_b, fc2_w):
    """LayerNorm written as (x - mean) / std: torch.std is the unbiased estimate, and no eps."""
    return _sp(dist, x, fc1_w, fc1_b, fc2_w,
               norm=lambda t: (t - t.mean(-1, keepdim=True)) / t.std(-1, keepdim=True))


def sp_layer_norm_without_eps(dist, x, fc1_w, fc1_b, fc2_w):
    """LayerNorm by hand as the formula reads, biased variance and all, but the eps forgotten."""
    def norm(t):
        mu = t.mean(dim=-1, keepdim=True)
        return (t - mu) * ((t - mu) ** 2).mean(dim=-1, keepdim=True).rsqrt()
    return _sp(dist, x, fc1_w, fc1_b, fc2_w, norm=norm)


def sp_norm_reassigns_x(dist, x, fc1_w, fc1_b, fc2_w):
    """x = F.layer_norm(x, ...) at the top, as a pre-norm block is often sketched: the residual then adds the normed
    x, not the block's input."""
    x = F.layer_norm(x, x.shape[-1:])
    return _sp(dist, x, fc1_w, fc1_b, fc2_w, norm=lambda t: t)


def sp_all_reduce_and_slice(dist, x, fc1_w, fc1_b, fc2_w):
    """After fc2, the sum taken by all-reduce and this rank's tokens sliced out, instead of a reduce-scatter."""
    return _sp(dist, x, fc1_w, fc1_b, fc2_w, scatter="all_reduce")


def sp_gathers_the_hidden_dimension(dist, x, fc1_w, fc1_b, fc2_w):
    """dist.all_gather into a list, then torch.cat(parts, dim=-1): the ranks' tokens side by side as features."""
    world = dist.get_world_size()
    normed = F.layer_norm(x, x.shape[-1:])
    parts = [torch.empty_like(normed) for _ in range(world)]
    dist.all_gather(parts, normed.contiguous())
    hidden = F.gelu(F.linear(torch.cat(parts, dim=-1), fc1_w, fc1_b))
    out = torch.empty_like(x)
    dist.reduce_scatter_single(out, F.linear(hidden, fc2_w).contiguous())
    return x + out


# ---- vocab_parallel_loss ------------------------------------------------------------------------------------
def _vocab(dist, tokens, targets, emb_w, head_w, *, shift=True, mask_embedding=True, mask_target=True,
           reduce="mean", f_keeps_own=False):
    """The vocabulary-parallel loss as the hints lay it out, with the knob of one mistake turned."""
    part = emb_w.shape[0]
    first = dist.get_rank() * part

    def local(ids):
        mine = (ids >= first) & (ids < first + part)
        return torch.where(mine, ids - first, 0), mine

    rows, mine = local(tokens)
    looked_up = F.embedding(rows, emb_w)
    x = _g(dist)(looked_up * mine.unsqueeze(-1) if mask_embedding else looked_up)
    logits = F.linear(_f(dist, keep_own=f_keeps_own)(x), head_w)
    if shift:
        top = logits.detach().amax(-1)
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        logits = logits - top.unsqueeze(-1)
    sum_exp = _g(dist)(logits.exp().sum(-1))
    rows, mine = local(targets)
    picked = logits.gather(-1, rows.unsqueeze(-1)).squeeze(-1)
    target = _g(dist)(picked * mine if mask_target else picked)
    losses = sum_exp.log() - target
    return losses.sum() if reduce == "sum" else losses.mean()


def vocab_loss_without_the_max(dist, tokens, targets, emb_w, head_w):
    """log Σ exp(z) straight from the logits, no maximum subtracted 'since the ranks would need another
    all-reduce': exp overflows at logits of a few hundred."""
    return _vocab(dist, tokens, targets, emb_w, head_w, shift=False)


def vocab_loss_embedding_unmasked(dist, tokens, targets, emb_w, head_w):
    """Ids a rank does not own clamped to row 0 and looked up anyway, not zeroed before the all-reduce."""
    return _vocab(dist, tokens, targets, emb_w, head_w, mask_embedding=False)


def vocab_loss_target_unmasked(dist, tokens, targets, emb_w, head_w):
    """Every rank adds the logit at its local row of the target, owned or not, into the target's sum."""
    return _vocab(dist, tokens, targets, emb_w, head_w, mask_target=False)


def vocab_loss_summed(dist, tokens, targets, emb_w, head_w):
    """The per-token losses summed, as F.cross_entropy(reduction='sum'): the statement asks for their mean."""
    return _vocab(dist, tokens, targets, emb_w, head_w, reduce="sum")


def vocab_loss_f_keeps_its_own_gradient(dist, tokens, targets, emb_w, head_w):
    """f before the head all-reduces a clone of the head input's gradient and returns the rank's own: the embedding
    gets only what this rank's logits send back."""
    return _vocab(dist, tokens, targets, emb_w, head_w, f_keeps_own=True)


def vocab_loss_cross_entropy_per_rank(dist, tokens, targets, emb_w, head_w):
    """F.cross_entropy on this rank's logits slice with targets shifted into it: ids owned by other ranks fall
    outside its V/N classes."""
    part = emb_w.shape[0]
    first = dist.get_rank() * part
    mine = (tokens >= first) & (tokens < first + part)
    x = _g(dist)(F.embedding(torch.where(mine, tokens - first, 0), emb_w) * mine.unsqueeze(-1))
    logits = F.linear(_f(dist)(x), head_w)
    return F.cross_entropy(logits.flatten(0, 1), (targets - first).flatten())


MISTAKES = [
    Attempt("column_parallel_linear", column_f_averages, named="N, the world size"),
    Attempt("column_parallel_linear", column_f_returns_its_own_gradient, named=NEVER_SUMMED),
    Attempt("column_parallel_linear", column_slices_the_shard_again, named=("already this rank's", "1/N of")),
    Attempt("column_parallel_linear", column_reduces_both_ways, named="forward pass should issue"),
    Attempt("column_parallel_linear", column_without_bias, named=("lacks bias", *NO_GRADIENT)),
    Attempt("row_parallel_linear", row_bias_on_rank_zero, named=NO_GRADIENT),
    Attempt("row_parallel_linear", row_bias_divided_by_n, named="N, the world size"),
    Attempt("row_parallel_linear", row_g_reduces_backward_too, named="backward pass should issue"),
    Attempt("row_parallel_linear", row_g_averages, named="N, the world size"),
    Attempt("column_parallel_linear", column_weight_as_stored, named=("(out, in)", "weight.T", "fits only transposed")),
    Attempt("row_parallel_linear", row_weight_transposed, named=("(out, in)", "weight.T", "fits only transposed")),
    Attempt("megatron_mlp", mlp_reduces_the_hidden_layer, named="forward pass should issue"),
    Attempt("megatron_mlp", mlp_tanh_gelu, named=("approximate='tanh'", "tanh approximation")),
    Attempt("megatron_mlp", mlp_gelu_on_the_sum, named="GeLU applied to fc2's summed output"),
    Attempt("megatron_mlp", mlp_f_and_g_swapped, named=("g before fc1", "f and g in each other's place")),
    Attempt("megatron_mlp", mlp_g_averages, named="N, the world size"),
    Attempt("megatron_mlp", mlp_fc2_bias_divided_by_n, named="N, the world size"),
    Attempt("megatron_mlp", mlp_fc1_bias_after_gelu, named="fc1's bias added after GeLU"),
    Attempt("megatron_mlp", mlp_fc1_bias_left_out, named=("fc1's bias left out", "lacks fc1_b")),
    Attempt("megatron_mlp", mlp_fc1_bias_divided_by_n, named="fc1's bias divided by N"),
    Attempt("parallel_attention", attention_every_head_on_every_rank, named=("all the heads", "heads per rank")),
    Attempt("parallel_attention", attention_without_the_causal_mask, named=("the future", "above the diagonal")),
    Attempt("parallel_attention", attention_scaled_by_the_hidden_size, named="√d"),
    Attempt("parallel_attention", attention_with_megatrons_interleaved_qkv,
            named=("q, k and v side by side", "each head's q, k, v")),
    Attempt("parallel_attention", attention_softmax_over_the_queries, named=("over the queries", "softmax's dim")),
    Attempt("sequence_parallel_mlp", sp_residual_before_the_scatter, named="2 × all_gather"),
    Attempt("sequence_parallel_mlp", sp_gather_backward_slices, named="one reduce_scatter"),
    Attempt("sequence_parallel_mlp", sp_layer_norm_by_hand, named=("of activations for backward", "unbiased std")),
    Attempt("sequence_parallel_mlp", sp_layer_norm_without_eps, named=("without eps", "of activations for backward")),
    Attempt("sequence_parallel_mlp", sp_norm_reassigns_x, named="the residual adds LayerNorm(x)"),
    Attempt("sequence_parallel_mlp", sp_all_reduce_and_slice, named="one all_reduce of"),
    Attempt("sequence_parallel_mlp", sp_gathers_the_hidden_dimension, named=("hidden dimension", "along dim -1")),
    Attempt("vocab_parallel_loss", vocab_loss_without_the_max, named="overflow"),
    Attempt("vocab_parallel_loss", vocab_loss_embedding_unmasked, named=NOT_ITS_OWN),
    Attempt("vocab_parallel_loss", vocab_loss_target_unmasked, named=NOT_ITS_OWN),
    Attempt("vocab_parallel_loss", vocab_loss_summed, named="s·b, the tokens"),
    Attempt("vocab_parallel_loss", vocab_loss_f_keeps_its_own_gradient, named="through its own head shard"),
    Attempt("vocab_parallel_loss", vocab_loss_cross_entropy_per_rank, named=NOT_ITS_OWN),
]
