"""Notebook 08, ring attention and context parallelism: the reference solutions.

Layout everywhere: (b, h, s, d), batch, heads, sequence, head size, as F.scaled_dot_product_attention.
"""

import math

import torch
import torch.nn.functional as F


def merge_attention(out, lse, block_out, block_lse):
    # Weights of the two parts in the union: e^lse / (e^lse + e^block_lse) = sigmoid(lse - block_lse).
    new_out = out - torch.sigmoid(block_lse - lse).unsqueeze(-1) * (out - block_out)   # (b, h, s, d)
    new_lse = lse - F.logsigmoid(lse - block_lse)                                       # (b, h, s)
    return new_out, new_lse


def blockwise_attention(q, k, v, block, causal=False):
    scale = q.shape[-1] ** -0.5
    out = torch.empty_like(q)                                   # (b, h, sq, d)
    lse = q.new_empty(q.shape[:-1])                             # (b, h, sq)
    for i in range(0, q.shape[-2], block):
        qi = q[..., i:i + block, :]                             # (b, h, bq, d)
        o = m = None                                             # this query block's running (out, lse)
        for j in range(0, i + 1 if causal else k.shape[-2], block):
            s = qi @ k[..., j:j + block, :].transpose(-2, -1) * scale      # (b, h, bq, bk)
            if causal and j == i:                               # the diagonal tile: key j sees query i >= j
                s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), -math.inf)
            bl = s.logsumexp(-1)                                # (b, h, bq)
            bo = torch.exp(s - bl.unsqueeze(-1)) @ v[..., j:j + block, :]   # (b, h, bq, d)
            o, m = (bo, bl) if o is None else merge_attention(o, m, bo, bl)
        out[..., i:i + block, :] = o
        lse[..., i:i + block] = m
    return out, lse


def ring_attention(dist, q, k, v, block):
    rank, world = dist.get_rank(), dist.get_world_size()
    out = lse = None
    for step in range(world):
        bo, bl = blockwise_attention(q, k, v, block)
        out, lse = (bo, bl) if out is None else merge_attention(out, lse, bo, bl)
        if step < world - 1:                                    # pass K and V on to the right
            kv = torch.stack([k, v])                            # (2, b, h, s/N, d)
            incoming = torch.empty_like(kv)
            sent = dist.isend(kv, (rank + 1) % world)
            dist.recv(incoming, (rank - 1) % world)
            sent.wait()
            k, v = incoming
    return out, lse


def ring_attention_overlap(dist, q, k, v, block):
    rank, world = dist.get_rank(), dist.get_world_size()
    kv = torch.stack([k, v])                                    # (2, b, h, s/N, d)
    out = lse = None
    for step in range(world):
        if step < world - 1:                                    # the next block travels while this one computes
            incoming = torch.empty_like(kv)
            works = [dist.isend(kv, (rank + 1) % world), dist.irecv(incoming, (rank - 1) % world)]
        bo, bl = blockwise_attention(q, kv[0], kv[1], block)
        out, lse = (bo, bl) if out is None else merge_attention(out, lse, bo, bl)
        if step < world - 1:
            for w in works:
                w.wait()
            kv = incoming
    return out, lse


def zigzag_attention(dist, q, k, v, block):
    rank, world = dist.get_rank(), dist.get_world_size()
    c = q.shape[-2] // 2                                        # rank r holds chunks r and 2N-1-r, c rows each
    mine = (rank, 2 * world - 1 - rank)
    kv = torch.stack([k, v])                                    # (2, b, h, 2c, d)
    outs, lses = [None, None], [None, None]
    for step in range(world):
        if step < world - 1:
            incoming = torch.empty_like(kv)
            works = [dist.isend(kv, (rank + 1) % world), dist.irecv(incoming, (rank - 1) % world)]
        src = (rank - step) % world
        for a, qa in enumerate(mine):                           # query chunk qa against key chunk kb
            for b, kb in enumerate((src, 2 * world - 1 - src)):
                if kb > qa:
                    continue                                    # entirely in the future of these queries
                rows, cols = slice(a * c, (a + 1) * c), slice(b * c, (b + 1) * c)
                bo, bl = blockwise_attention(q[..., rows, :], kv[0][..., cols, :], kv[1][..., cols, :], block,
                                             causal=kb == qa)
                outs[a], lses[a] = (bo, bl) if outs[a] is None else merge_attention(outs[a], lses[a], bo, bl)
        if step < world - 1:
            for w in works:
                w.wait()
            kv = incoming
    return torch.cat(outs, -2), torch.cat(lses, -1)


def ring_attention_backward(dist, q, k, v, out, lse, dout, block):
    rank, world = dist.get_rank(), dist.get_world_size()
    scale = q.shape[-1] ** -0.5
    delta = (dout * out).sum(-1, keepdim=True)                  # (b, h, s/N, 1): D = rowsum(dO ∘ O)
    dq = torch.zeros_like(q)
    kv = torch.stack([k, v])                                    # (2, b, h, s/N, d), travels N-1 times
    dkv = torch.zeros_like(kv)                                  # its gradient, travels N times back home
    for step in range(world):
        if step < world - 1:
            incoming = torch.empty_like(kv)
            works = [dist.isend(kv, (rank + 1) % world), dist.irecv(incoming, (rank - 1) % world)]
        for j in range(0, kv.shape[-2], block):
            kj, vj = kv[0][..., j:j + block, :], kv[1][..., j:j + block, :]     # (b, h, bk, d)
            p = torch.exp(q @ kj.transpose(-2, -1) * scale - lse.unsqueeze(-1))   # (b, h, s/N, bk)
            dkv[1][..., j:j + block, :] += p.transpose(-2, -1) @ dout
            ds = p * (dout @ vj.transpose(-2, -1) - delta) * scale                 # (b, h, s/N, bk)
            dq += ds @ kj
            dkv[0][..., j:j + block, :] += ds.transpose(-2, -1) @ q
        # dK and dV of this block go on with it; after N sends they are back with their owner (at N = 1 they are
        # home already: a rank sending to itself, NCCL refuses an isend with no irecv posted before it).
        if world > 1:
            grads = torch.empty_like(dkv)
            sent = dist.isend(dkv, (rank + 1) % world)
            dist.recv(grads, (rank - 1) % world)
            sent.wait()
            dkv = grads
        if step < world - 1:
            for w in works:
                w.wait()
            kv = incoming
    return dq, dkv[0], dkv[1]


def ulysses_attention(dist, q, k, v, block):
    world = dist.get_world_size()
    b, h, c, d = q.shape

    def to_heads(x):                                            # (b, h, s/N, d) -> (b, h/N, s, d)
        send = x.reshape(b, world, h // world, c, d).transpose(0, 1).contiguous()   # (N, b, h/N, s/N, d)
        got = torch.empty_like(send)                           # (N, b, h/N, s/N, d), the N sequence chunks
        dist.all_to_all_single(got, send)
        return got.permute(1, 2, 0, 3, 4).reshape(b, h // world, world * c, d)          # (b, h/N, s, d)

    o, _ = blockwise_attention(to_heads(q), to_heads(k), to_heads(v), block)   # (b, h/N, s, d)
    send = o.reshape(b, h // world, world, c, d).permute(2, 0, 1, 3, 4).contiguous()  # (N, b, h/N, s/N, d)
    got = torch.empty_like(send)                                # (N, b, h/N, s/N, d), the N head groups
    dist.all_to_all_single(got, send)
    return got.transpose(0, 1).reshape(b, h, c, d)                                      # (b, h, s/N, d)
