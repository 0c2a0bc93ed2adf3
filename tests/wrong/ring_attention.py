"""Wrong answers to notebook 08's puzzles, each with the words its failure message must contain.

A wrong answer must fail, whatever else it gets right; tests/test_content.py runs every catalogue.
"""

import math

import torch
import torch.nn.functional as F

from solutions.ring_attention import blockwise_attention, merge_attention, ring_attention


def merge_with_plain_exponentials(out, lse, block_out, block_lse):
    """The textbook formula: right for small logits, inf and nan once they reach the hundreds."""
    total = torch.exp(lse) + torch.exp(block_lse)                       # (b, h, s)
    weighted = torch.exp(lse).unsqueeze(-1) * out + torch.exp(block_lse).unsqueeze(-1) * block_out
    return weighted / total.unsqueeze(-1), torch.log(total)


def merge_without_rescaling_the_running_output(out, lse, block_out, block_lse):
    """Adds the new block's share but leaves the old output at its old weight."""
    new_lse = lse - F.logsigmoid(lse - block_lse)
    return out + torch.exp(block_lse - new_lse).unsqueeze(-1) * block_out, new_lse


def blockwise_with_all_scores(q, k, v, block, causal=False):
    """Right numbers, the s × s score matrix in memory: what blockwise attention exists to avoid."""
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5                  # (b, h, sq, sk)
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    lse = s.logsumexp(-1)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


def blockwise_softmax_over_each_block_alone(q, k, v, block, causal=False):
    """Normalises each key block on its own and adds the outputs: the blocks' weights never meet."""
    out, lse = torch.zeros_like(q), torch.zeros(q.shape[:-1], dtype=q.dtype)
    for j in range(0, k.shape[-2], block):
        o, m = blockwise_attention(q, k[..., j:j + block, :], v[..., j:j + block, :], block)
        out, lse = out + o, torch.maximum(lse, m)
    return out, lse


def blockwise_with_torch_kernel(q, k, v, block, causal=False):
    """PyTorch's CPU flash kernel does it all, the log-sum-exp included."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, is_causal=causal)[:2]
    return out, lse


def _ring(dist, q, k, v, block, to_right=True, keep_all=False):
    rank, world = dist.get_rank(), dist.get_world_size()
    dst, src = ((rank + 1) % world, (rank - 1) % world) if to_right else ((rank - 1) % world, (rank + 1) % world)
    out, lse = blockwise_attention(q, k, v, block)
    kv, kept = torch.stack([k, v]), []
    for _ in range(world - 1):
        incoming = torch.empty_like(kv)
        sent = dist.isend(kv, dst)
        dist.recv(incoming, src)
        sent.wait()
        kv = incoming
        if keep_all:
            kept.append(kv)
        else:
            out, lse = merge_attention(out, lse, *blockwise_attention(q, kv[0], kv[1], block))
    for kv in kept:
        out, lse = merge_attention(out, lse, *blockwise_attention(q, kv[0], kv[1], block))
    return out, lse


def ring_passing_to_the_left(dist, q, k, v, block):
    """Right numbers, but K and V go to rank r-1: not the ring the statement and the hardware's links set up."""
    return _ring(dist, q, k, v, block, to_right=False)


def ring_keeping_every_block(dist, q, k, v, block):
    """Collects all of K and V before attending: memory grows with N, the thing ring attention removes."""
    return _ring(dist, q, k, v, block, keep_all=True)


def ring_with_local_keys_only(dist, q, k, v, block):
    """Softmax over the rank's own keys only: no communication, wrong attention."""
    return blockwise_attention(q, k, v, block)


def ring_by_all_gather(dist, q, k, v, block):
    """Gathers K and V with a collective: the same bytes, but all of K and V on every rank."""
    n = dist.get_world_size()
    ks, vs = [torch.empty_like(k) for _ in range(n)], [torch.empty_like(v) for _ in range(n)]
    dist.all_gather(ks, k)
    dist.all_gather(vs, v)
    return blockwise_attention(q, torch.cat(ks, 2), torch.cat(vs, 2), block)


def ring_attention_overlap_blocking(dist, q, k, v, block):
    """Puzzle 3's ring: each transfer waits for the compute before it, and the compute for the transfer."""
    return ring_attention(dist, q, k, v, block)


def _zigzag(dist, q, k, v, block, positions_as_contiguous=False, future_computed=()):
    """Zigzag's ring with knobs for its classic mistakes: the positions of a contiguous split, and the future of
    the query chunks in `future_computed` (0 early, 1 late) computed and then masked instead of skipped."""
    rank, world = dist.get_rank(), dist.get_world_size()
    c = q.shape[-2] // 2
    mine = (2 * rank, 2 * rank + 1) if positions_as_contiguous else (rank, 2 * world - 1 - rank)
    kv = torch.stack([k, v])                                            # (2, b, h, 2c, d)
    outs, lses = [None, None], [None, None]
    for step in range(world):
        src = (rank - step) % world
        theirs = (2 * src, 2 * src + 1) if positions_as_contiguous else (src, 2 * world - 1 - src)
        for a, qa in enumerate(mine):
            for b, kb in enumerate(theirs):
                rows, cols = slice(a * c, (a + 1) * c), slice(b * c, (b + 1) * c)
                qs, ks, vs = q[..., rows, :], kv[0][..., cols, :], kv[1][..., cols, :]
                if kb > qa and a in future_computed:                   # computed, then masked to nothing
                    bo, bl = blockwise_attention(qs, ks, vs, block)
                    bl = bl - 1e30
                elif kb > qa:
                    continue
                else:
                    bo, bl = blockwise_attention(qs, ks, vs, block, causal=kb == qa)
                outs[a], lses[a] = (bo, bl) if outs[a] is None else merge_attention(outs[a], lses[a], bo, bl)
        if step < world - 1:
            incoming = torch.empty_like(kv)
            sent = dist.isend(kv, (rank + 1) % world)
            dist.recv(incoming, (rank - 1) % world)
            sent.wait()
            kv = incoming
    return torch.cat(outs, -2), torch.cat(lses, -1)


def zigzag_with_contiguous_positions(dist, q, k, v, block):
    """Masks as if rank r held chunks 2r and 2r+1: the global positions after the zigzag split are lost."""
    return _zigzag(dist, q, k, v, block, positions_as_contiguous=True)


def zigzag_computing_the_future_of_the_late_chunk(dist, q, k, v, block):
    """Right numbers, but the late chunk attends to every key block and masks the future away afterwards:
    rank 0's late chunk (the last of the sequence) has nothing to skip, rank N-1's has most: unbalanced."""
    return _zigzag(dist, q, k, v, block, future_computed=(1,))


def zigzag_masking_instead_of_skipping(dist, q, k, v, block):
    """Every tile computed, the future masked afterwards: balanced, and twice the work causal attention needs."""
    return _zigzag(dist, q, k, v, block, future_computed=(0, 1))


def ulysses_without_the_way_back(dist, q, k, v, block):
    """Attends on the head split and returns it: the output is left split by heads, not by sequence."""
    world = dist.get_world_size()
    b, h, c, d = q.shape

    def to_heads(x):
        send = x.reshape(b, world, h // world, c, d).transpose(0, 1).contiguous()   # (N, b, h/N, c, d)
        got = torch.empty_like(send)
        dist.all_to_all_single(got, send)
        return got.permute(1, 2, 0, 3, 4).reshape(b, h // world, world * c, d)
    return blockwise_attention(to_heads(q), to_heads(k), to_heads(v), block)[0]


def ulysses_by_all_gather(dist, q, k, v, block):
    """Gathers K and V by collective and keeps every head: right numbers, not the head split."""
    return ring_by_all_gather(dist, q, k, v, block)[0]


def _backward(dist, q, k, v, out, lse, dout, block, sends_home=True, with_delta=True):
    """Ring attention's backward with knobs for two classic mistakes (the block's loop kept whole, no overlap)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    scale = q.shape[-1] ** -0.5
    delta = (dout * out).sum(-1, keepdim=True) if with_delta else 0.0  # (b, h, s/N, 1)
    dq, kv = torch.zeros_like(q), torch.stack([k, v])                  # kv: (2, b, h, s/N, d)
    dkv = torch.zeros_like(kv)
    for step in range(world):
        p = torch.exp(q @ kv[0].transpose(-2, -1) * scale - lse.unsqueeze(-1))      # (b, h, s/N, s/N)
        dkv[1] += p.transpose(-2, -1) @ dout
        ds = p * (dout @ kv[1].transpose(-2, -1) - delta) * scale
        dq += ds @ kv[0]
        dkv[0] += ds.transpose(-2, -1) @ q
        if step == world - 1 and not sends_home:
            break
        for t in ([kv, dkv] if step < world - 1 else [dkv]):
            got = torch.empty_like(t)
            sent = dist.isend(t, (rank + 1) % world)
            dist.recv(got, (rank - 1) % world)
            sent.wait()
            t.copy_(got)
    return dq, dkv[0], dkv[1]


def backward_leaving_gradients_one_rank_short(dist, q, k, v, out, lse, dout, block):
    """dK and dV go round with their block N-1 times only: each rank returns its left neighbour's gradients."""
    return _backward(dist, q, k, v, out, lse, dout, block, sends_home=False)


def backward_without_the_row_term(dist, q, k, v, out, lse, dout, block):
    """dS = P ∘ (dO·Vᵀ) forgets D = rowsum(dO ∘ O), the softmax's own derivative."""
    return _backward(dist, q, k, v, out, lse, dout, block, with_delta=False)


def blockwise_tiled_over_queries_only(q, k, v, block, causal=False):
    """Query blocks of `block` rows against every key at once, one softmax per row: tiles of block × s, never the
    key blocks and merges the puzzle asks for, so the scores grow with the sequence (issue 45: attention tiled over
    queries only)."""
    scale = q.shape[-1] ** -0.5
    s = k.shape[-2]
    outs, lses = [], []
    for i in range(0, q.shape[-2], block):
        scores = q[..., i:i + block, :] @ k.transpose(-2, -1) * scale                 # (b, h, block, s)
        if causal:
            rows = torch.arange(i, i + scores.shape[-2]).unsqueeze(1)
            scores = scores.masked_fill(torch.arange(s).unsqueeze(0) > rows, -math.inf)
        lse = scores.logsumexp(-1)
        outs.append(torch.exp(scores - lse.unsqueeze(-1)) @ v)
        lses.append(lse)
    return torch.cat(outs, -2), torch.cat(lses, -1)


WRONG = [
    ("merge_attention", merge_with_plain_exponentials, "rank 0"),
    ("merge_attention", merge_without_rescaling_the_running_output, "rank 0"),
    ("blockwise_attention", blockwise_with_all_scores, "peak memory"),
    ("blockwise_attention", blockwise_tiled_over_queries_only, ("peak memory", "FLOPs")),   # causal: masked keys too
    ("blockwise_attention", blockwise_softmax_over_each_block_alone, "rank 0"),
    ("blockwise_attention", blockwise_with_torch_kernel, "_scaled_dot_product_flash_attention_for_cpu"),
    ("ring_attention", ring_passing_to_the_left, "to rank"),
    ("ring_attention", ring_keeping_every_block, "peak memory"),
    ("ring_attention", ring_with_local_keys_only, "rank 0"),
    ("ring_attention", ring_by_all_gather, "used all_gather"),
    ("ring_attention_overlap", ring_attention_overlap_blocking, "waiting on K/V transfers"),
    # On rank 0 or 1, by the case; rarely (seed 1667246467) logits near ±1e4 make both masks pick the same keys,
    # and then the work it does in the wrong tiles is what gives it away.
    ("zigzag_attention", zigzag_with_contiguous_positions, ("values differ", "unbalanced")),
    ("zigzag_attention", zigzag_computing_the_future_of_the_late_chunk, "unbalanced"),
    ("zigzag_attention", zigzag_masking_instead_of_skipping, "FLOPs, over the budget"),
    ("ulysses_attention", ulysses_without_the_way_back, "rank 0"),
    ("ulysses_attention", ulysses_by_all_gather, "used all_gather"),
    ("ring_attention_backward", backward_leaving_gradients_one_rank_short, "rank 0"),
    ("ring_attention_backward", backward_without_the_row_term, "rank 0"),
]
