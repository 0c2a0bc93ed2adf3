"""Cheats on notebook 08's puzzles, each with the words its rejection must contain."""

import torch

import puzzles.ring_attention as P
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


CHEATS = [(name, fn, REBUILT if reason == ANSWER_KEY else reason) for name, fn, reason in everywhere(P)] + [
    ("ring_attention", ring_through_a_module_dict, "SharedMemory"),
    ("ring_attention", ring_through_python_numbers, "under the floor"),
    ("ring_attention", ring_sending_to_every_rank, "a ring passes K and V to its right neighbour only"),
    ("ring_attention", ring_gathering_then_attending, "peak memory"),
    ("zigzag_attention", zigzag_gathering_then_attending, "peak memory"),
    ("ring_attention_overlap", overlap_posting_and_waiting_at_once, "waiting on K/V transfers"),
]
