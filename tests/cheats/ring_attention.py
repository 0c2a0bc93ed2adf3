"""Cheats on notebook 08's puzzles, each with the words its rejection must contain."""

import math

import torch

import puzzles.ring_attention as P
import solutions.ring_attention as S
from solutions.ring_attention import blockwise_attention, merge_attention
from tests.cheats.common import ANSWER_KEY, everywhere

_board: dict = {}
# Rebuilding the case runs its reference, PyTorch's attention, inside the answer: the refused kernel stops it
# before the case itself can say it was being built.
REBUILT = (ANSWER_KEY, "the answer called torch's _scaled_dot_product_flash_attention_for_cpu")


def _pass_right(dist, t):
    """One ring step: `t` to the right neighbour, the left one's in return."""
    rank, world = dist.get_rank(), dist.get_world_size()
    got = torch.empty_like(t)
    sent = dist.isend(t, (rank + 1) % world)
    dist.recv(got, (rank - 1) % world)
    sent.wait()
    return got


def _attending_to_the_board(dist, q, k, v, block, fetch):
    """Attention over the rank's own K/V and every other rank's, `fetch(r)` taken from the board, while a ring of
    one-number tokens stands in for the traffic."""
    rank, world = dist.get_rank(), dist.get_world_size()
    token = torch.zeros(1, dtype=q.dtype, device=q.device)
    for _ in range(world - 1):
        token = _pass_right(dist, token)
    out, lse = blockwise_attention(q, k, v, block)
    for r in range(world):
        if r != rank:
            out, lse = merge_attention(out, lse, *blockwise_attention(q, *fetch(r), block))
    return out, lse


def ring_through_a_module_dict(dist, q, k, v, block):
    """Every rank leaves its K and V on a module-level dict; a ring of one-number messages waits for the others."""
    _board[dist.get_rank()] = (k, v)
    return _attending_to_the_board(dist, q, k, v, block, lambda r: _board[r])


def ring_through_python_numbers(dist, q, k, v, block):
    """K and V left on a module-level dict as Python complex numbers (two floats each, half the count of
    .tolist()'s memory): no tensor shared, nothing sent but a one-number token."""
    _board[dist.get_rank()] = torch.view_as_complex(torch.stack([k, v]).reshape(-1, 2)).tolist()

    def fetch(r):
        kv = torch.tensor(_board[r], dtype=torch.complex128, device=q.device)
        return torch.view_as_real(kv).reshape(2, *k.shape)                 # (2, b, h, s/N, d)
    return _attending_to_the_board(dist, q, k, v, block, fetch)


def ring_sending_to_every_rank(dist, q, k, v, block):
    """The same bytes as the ring, each rank's K and V sent straight to every other rank: no ring at all."""
    rank, world = dist.get_rank(), dist.get_world_size()
    kv = torch.stack([k, v])                                            # (2, b, h, s/N, d)
    sent = [dist.isend(kv, dst) for dst in range(world) if dst != rank]
    out, lse = blockwise_attention(q, k, v, block)
    for src in range(world):
        if src != rank:
            got = torch.empty_like(kv)
            dist.recv(got, src)
            out, lse = merge_attention(out, lse, *blockwise_attention(q, got[0], got[1], block))
    for w in sent:
        w.wait()
    return out, lse


def ring_gathering_then_attending(dist, q, k, v, block):
    """K and V go round the ring to the right, but every block is kept and attention runs once on the gathered
    sequence: the bytes of a ring, the memory of an all-gather."""
    kv, kept = torch.stack([k, v]), []
    for _ in range(dist.get_world_size() - 1):
        kv = _pass_right(dist, kv)
        kept.append(kv)
    kv = torch.cat([torch.stack([k, v])] + kept, -2)                    # (2, b, h, s, d), out of order
    return blockwise_attention(q, kv[0], kv[1], block)


def zigzag_gathering_then_attending(dist, q, k, v, block):
    """Zigzag's ring, every block kept, then each query chunk attends once to the key chunks before it and
    causally to its own: right tiles and balance, all of K and V held at once."""
    rank, world = dist.get_rank(), dist.get_world_size()
    c = q.shape[-2] // 2
    kv, blocks = torch.stack([k, v]), {}
    for step in range(world):
        src = (rank - step) % world
        for half, chunk in enumerate((src, 2 * world - 1 - src)):
            blocks[chunk] = kv[..., half * c:(half + 1) * c, :]
        if step < world - 1:
            kv = _pass_right(dist, kv)
    outs = []
    for half, chunk in enumerate((rank, 2 * world - 1 - rank)):
        qa = q[..., half * c:(half + 1) * c, :]
        out, lse = blockwise_attention(qa, blocks[chunk][0], blocks[chunk][1], block, causal=True)
        if chunk:
            before = torch.cat([blocks[j] for j in range(chunk)], -2)   # (2, b, h, chunk·c, d)
            out, lse = merge_attention(out, lse, *blockwise_attention(qa, before[0], before[1], block))
        outs.append((out, lse))
    return torch.cat([o for o, _ in outs], -2), torch.cat([m for _, m in outs], -1)


def overlap_posting_and_waiting_at_once(dist, q, k, v, block):
    """isend and irecv, but waited for before the compute: non-blocking calls, and no overlap."""
    rank, world = dist.get_rank(), dist.get_world_size()
    kv = torch.stack([k, v])
    out, lse = blockwise_attention(q, k, v, block)
    for _ in range(world - 1):
        incoming = torch.empty_like(kv)
        for w in [dist.isend(kv, (rank + 1) % world), dist.irecv(incoming, (rank - 1) % world)]:
            w.wait()
        kv = incoming
        out, lse = merge_attention(out, lse, *blockwise_attention(q, kv[0], kv[1], block))
    return out, lse


def _attention_in_one_tile(q, k, v):
    """Attention with every score at once: (output, log-sum-exp)."""
    s = q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
    lse = s.logsumexp(-1)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


def _overlapped_with_busy_work(dist, q, k, v, block, busy):
    """Each step posts the transfer, runs `busy(kv)` while it travels, waits for it, and only then attends to the
    block it holds: compute covers the wire, and nothing of the next block's work runs under it."""
    rank, world = dist.get_rank(), dist.get_world_size()
    kv, out, lse = torch.stack([k, v]), None, None
    for step in range(world):
        if step < world - 1:
            incoming = torch.empty_like(kv)
            works = [dist.isend(kv, (rank + 1) % world), dist.irecv(incoming, (rank - 1) % world)]
            busy(kv)
            for w in works:
                w.wait()
        bo, bl = blockwise_attention(q, kv[0], kv[1], block)
        out, lse = (bo, bl) if out is None else merge_attention(out, lse, bo, bl)
        if step < world - 1:
            kv = incoming
    return out, lse


def overlap_computing_each_block_twice(dist, q, k, v, block):
    """The block computed while its transfer runs and thrown away, then computed again after the wait: the run
    takes longer than without overlap. Passed every seed when only the exposed time was checked."""
    return _overlapped_with_busy_work(dist, q, k, v, block, lambda kv: blockwise_attention(q, kv[0], kv[1], block))


def overlap_busy_while_waiting(dist, q, k, v, block):
    """Useless matmuls while the transfer runs: the wire is covered by work that is not the next block's. Passed
    every seed when only the exposed time was checked."""
    def busy(_kv):
        junk = q @ q.transpose(-2, -1)
        for _ in range(3):
            junk = junk @ junk * 1e-3
    return _overlapped_with_busy_work(dist, q, k, v, block, busy)


def ring_softmax_over_every_score_kept(dist, q, k, v, block):
    """K and V go round the ring, but no online softmax: every step's scores and V block are kept, and one softmax
    runs over the s/N × s scores at the end."""
    world, scores, values = dist.get_world_size(), [], []
    for step in range(world):
        scores.append(q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5)
        values.append(v)
        if step < world - 1:
            k, v = _pass_right(dist, torch.stack([k, v]))
    s = torch.cat(scores, -1)
    lse = s.logsumexp(-1)
    return torch.exp(s - lse.unsqueeze(-1)) @ torch.cat(values, -2), lse


def ring_ignoring_block(dist, q, k, v, block):
    """The ring and the merge, each K/V block attended as one (s/N)² tile, `block` ignored. Passed every seed while
    only peak memory was measured (the 10 chunks of s/N × d the budget allows hid the tile), until the simulator
    measured a rank's largest tensor."""
    out = lse = None
    for step in range(dist.get_world_size()):
        bo, bl = _attention_in_one_tile(q, k, v)
        out, lse = (bo, bl) if out is None else merge_attention(out, lse, bo, bl)
        if step < dist.get_world_size() - 1:
            k, v = _pass_right(dist, torch.stack([k, v]))
    return out, lse


def blockwise_over_query_blocks_only(q, k, v, block, causal=False):
    """Blocks of queries, each against every key at once: block × s scores, never block × block tiles."""
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:-1])
    for i in range(0, q.shape[-2], block):
        s = q[..., i:i + block, :] @ k.transpose(-2, -1) * q.shape[-1] ** -0.5
        if causal:
            rows = torch.arange(i, i + s.shape[-2], device=q.device).unsqueeze(1)
            s = s.masked_fill(torch.arange(k.shape[-2], device=q.device) > rows, -math.inf)
        lse[..., i:i + block] = s.logsumexp(-1)
        out[..., i:i + block, :] = torch.exp(s - lse[..., i:i + block].unsqueeze(-1)) @ v
    return out, lse


def zigzag_ignoring_block(dist, q, k, v, block):
    """The reference zigzag with each (query chunk, key chunk) pair attended as one chunk × chunk tile, `block`
    ignored. Passed every seed while every case had short chunks and blocks of about a chunk."""
    return S.zigzag_attention(dist, q, k, v, q.shape[-2])


def backward_ignoring_block(dist, q, k, v, out, lse, dout, block):
    """The reference backward with each K/V block taken whole: an s/N × s/N tile of scores per step, never `block`
    keys at a time. Passed every seed while the chunks were short against d and no largest-tensor budget stood."""
    return S.ring_attention_backward(dist, q, k, v, out, lse, dout, k.shape[-2])


def backward_by_autograd_on_the_gathered_sequence(dist, q, k, v, out, lse, dout, block):
    """K and V gathered around the ring (its bytes), autograd through the rank's queries' whole attention, the
    dK/dV partials summed around the ring (a ring reduce-scatter), and one padding message to meet the byte floor."""
    rank, world = dist.get_rank(), dist.get_world_size()
    kv, blocks = torch.stack([k, v]), {}
    blocks[rank] = kv
    for step in range(1, world):
        kv = _pass_right(dist, kv)
        blocks[(rank - step) % world] = kv
    whole = torch.cat([blocks[r] for r in range(world)], -2).requires_grad_()      # (2, b, h, s, d)
    mine = q.clone().requires_grad_()
    scores = mine @ whole[0].transpose(-2, -1) * q.shape[-1] ** -0.5
    (torch.softmax(scores, -1) @ whole[1]).backward(dout)
    partial = whole.grad.chunk(world, -2)                                         # dK/dV by owner
    owner = (rank - 1) % world
    total = partial[owner]
    for _ in range(world - 1):
        owner = (owner - 1) % world
        total = _pass_right(dist, total.contiguous()) + partial[owner]
    _pass_right(dist, torch.zeros_like(total))
    return mine.grad, total[0], total[1]


def ulysses_gathering_kv_with_all_to_all(dist, q, k, v, block):
    """No head split: the queries stay, K and V gathered whole by all-to-alls that send every rank the same."""
    world = dist.get_world_size()

    def gathered(t):
        send = t.unsqueeze(0).expand(world, *t.shape).contiguous()
        got = torch.empty_like(send)
        dist.all_to_all_single(got, send)
        return torch.cat(list(got), -2)
    return blockwise_attention(q, gathered(k), gathered(v), block)[0]


def ulysses_with_whole_score_matrices(dist, q, k, v, block):
    """Ulysses' all-to-alls, then attention on the rank's heads with the whole s × s score matrix, not blockwise.
    Passed 3 seeds in 10 when the cases' heads were up to 16 wide and their sequences up to 64 tokens."""
    world = dist.get_world_size()
    b, h, c, d = q.shape

    def to_heads(x):
        send = x.reshape(b, world, h // world, c, d).transpose(0, 1).contiguous()
        got = torch.empty_like(send)
        dist.all_to_all_single(got, send)
        return got.permute(1, 2, 0, 3, 4).reshape(b, h // world, world * c, d)
    o, _ = _attention_in_one_tile(to_heads(q), to_heads(k), to_heads(v))
    send = o.reshape(b, h // world, world, c, d).permute(2, 0, 1, 3, 4).contiguous()
    got = torch.empty_like(send)
    dist.all_to_all_single(got, send)
    return got.transpose(0, 1).reshape(b, h, c, d)


CHEATS = [(name, fn, REBUILT if reason == ANSWER_KEY else reason) for name, fn, reason in everywhere(P)] + [
    ("ring_attention", ring_through_a_module_dict, "SharedMemory"),
    ("ring_attention", ring_through_python_numbers, "under the floor"),
    ("ring_attention", ring_sending_to_every_rank, "a ring passes K and V to its right neighbour only"),
    ("ring_attention", ring_gathering_then_attending, ("peak memory", "largest tensor")),
    ("ring_attention", ring_ignoring_block, ("largest tensor", "attend to each K/V block tile by tile")),
    ("zigzag_attention", zigzag_gathering_then_attending, "largest tensor"),
    ("zigzag_attention", zigzag_ignoring_block, ("largest tensor", "`block` keys at a time")),
    ("ring_attention_overlap", overlap_posting_and_waiting_at_once, "waiting on K/V transfers"),
    ("ring_attention_overlap", overlap_computing_each_block_twice, "simulated time"),
    ("ring_attention_overlap", overlap_busy_while_waiting, "simulated time"),
    ("ring_attention", ring_softmax_over_every_score_kept, ("peak memory", "largest tensor")),
    ("blockwise_attention", blockwise_over_query_blocks_only, "peak memory"),
    ("ring_attention_backward", backward_by_autograd_on_the_gathered_sequence, "largest tensor"),
    ("ring_attention_backward", backward_ignoring_block, ("largest tensor", "`block` keys of the K/V block")),
    ("ulysses_attention", ulysses_gathering_kv_with_all_to_all, "sent"),
    ("ulysses_attention", ulysses_with_whole_score_matrices, ("peak memory", "largest tensor")),
]
