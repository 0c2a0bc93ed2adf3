"""Cheats on notebook 08's puzzles, each with the words its rejection must contain."""

import math
import types

import torch
import torch.nn.functional as F

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


def blockwise_queries_against_earlier_keys_in_place(q, k, v, block, causal=False):
    """Blocks of queries against every key (causal: every earlier key) at once, the block × s scores updated in
    place: no key tiles, no merges, no masked keys computed. Found by a red team that read only the notebook
    (2026-12-08): it passed every seed while s/block was 4 to 6, where block × s fit in the tiles' room."""
    scale = q.shape[-1] ** -0.5
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:-1])
    for i in range(0, q.shape[-2], block):
        n = min(block, q.shape[-2] - i)
        keys, values = (k[..., :i + n, :], v[..., :i + n, :]) if causal else (k, v)
        scores = q[..., i:i + n, :] @ keys.transpose(-1, -2)
        scores.mul_(scale)
        if causal:
            scores.masked_fill_(torch.arange(keys.shape[-2]) > torch.arange(i, i + n).unsqueeze(-1), -math.inf)
        lse[..., i:i + n] = scores.logsumexp(-1)
        out[..., i:i + n, :] = scores.sub_(lse[..., i:i + n].unsqueeze(-1)).exp_() @ values
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


def _ulysses_around(dist, q, k, v, attend):
    """Ulysses' two all-to-alls (sequence-split to head-split, and back) around `attend(q, k, v) -> out` on the
    rank's heads, whole sequence: what the cheats below change is the attention alone."""
    world = dist.get_world_size()
    b, h, c, d = q.shape

    def to_heads(x):
        send = x.reshape(b, world, h // world, c, d).transpose(0, 1).contiguous()
        got = torch.empty_like(send)
        dist.all_to_all_single(got, send)
        return got.permute(1, 2, 0, 3, 4).reshape(b, h // world, world * c, d)
    o = attend(to_heads(q), to_heads(k), to_heads(v))
    send = o.reshape(b, h // world, world, c, d).permute(2, 0, 1, 3, 4).contiguous()
    got = torch.empty_like(send)
    dist.all_to_all_single(got, send)
    return got.transpose(0, 1).reshape(b, h, c, d)


def ulysses_with_whole_score_matrices(dist, q, k, v, block):
    """Ulysses' all-to-alls, then attention on the rank's heads with the whole s × s score matrix, not blockwise.
    Passed 3 seeds in 10 when the cases' heads were up to 16 wide and their sequences up to 64 tokens."""
    return _ulysses_around(dist, q, k, v, lambda q, k, v: _attention_in_one_tile(q, k, v)[0])


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
    ("blockwise_attention", blockwise_queries_against_earlier_keys_in_place, "peak memory"),
    ("blockwise_attention", blockwise_over_query_blocks_only, ("peak memory", "FLOPs")),  # a causal case: every key
    ("ring_attention_backward", backward_by_autograd_on_the_gathered_sequence, "largest tensor"),
    ("ring_attention_backward", backward_ignoring_block, ("largest tensor", "`block` keys of the K/V block")),
    ("ulysses_attention", ulysses_gathering_kv_with_all_to_all, "sent"),
    ("ulysses_attention", ulysses_with_whole_score_matrices, ("peak memory", "largest tensor")),
]


# ---- every tile computed, the future masked (issue 32) -----------------------------------------------------------
MASKED = -1e30                 # a score no key can win against: exp(MASKED - lse) is 0, and no row turns NaN


def _product_by_addbmm(a, b):
    """a @ b per (batch, head), (b, h, m, k) by (b, h, k, n), as a sum of k outer products through torch.addbmm.
    addbmm cost one FLOP per output element before every op that does matrix work was priced from its shapes."""
    rows = [torch.addbmm(a.new_zeros(a.shape[-2], b.shape[-1]), a[i, j].T.unsqueeze(-1), b[i, j].unsqueeze(-2))
            for i in range(a.shape[0]) for j in range(a.shape[1])]
    return torch.stack(rows).reshape(*a.shape[:2], a.shape[-2], b.shape[-1])


def _product_by_embedding_bag(a, b):
    """a @ b per (batch, head) through F.embedding_bag: output row r sums the k rows of b weighted by a's row r
    (per_sample_weights). An embedding bag cost one FLOP per element of its largest tensor, 1/128 of mm's at 64³,
    before the FLOP registry priced it by its multiply-adds."""
    rows = torch.arange(a.shape[-1], device=a.device).repeat(a.shape[-2], 1)
    tiles = [F.embedding_bag(rows, b[i, j], mode="sum", per_sample_weights=a[i, j])
             for i in range(a.shape[0]) for j in range(a.shape[1])]
    return torch.stack(tiles).reshape(*a.shape[:2], a.shape[-2], b.shape[-1])


def _tile_masked(q, k, v, future: torch.Tensor, product=_product_by_addbmm):
    """One tile's (output, lse) with the scores where `future` is True masked, computed whatever the mask."""
    s = (product(q, k.transpose(-2, -1)) * q.shape[-1] ** -0.5).masked_fill(future, MASKED)
    lse = s.logsumexp(-1)                                                      # (b, h, sq)
    return product(torch.exp(s - lse.unsqueeze(-1)), v), lse


def _blockwise_masking(q, k, v, block, first_query: int, first_key: int, causal: bool, product=_product_by_addbmm):
    """Blockwise attention over every (query block, key block) tile, each masked where a key comes after a query
    (positions counted from first_query, first_key), none skipped; every product by `product`."""
    out, lse = torch.empty_like(q), q.new_empty(q.shape[:-1])
    for i in range(0, q.shape[-2], block):
        qi, o, m = q[..., i:i + block, :], None, None
        rows = first_query + i + torch.arange(qi.shape[-2], device=q.device).unsqueeze(1)
        for j in range(0, k.shape[-2], block):
            cols = first_key + j + torch.arange(min(block, k.shape[-2] - j), device=q.device)
            future = (cols > rows) if causal else torch.zeros(len(rows), len(cols), dtype=torch.bool)
            bo, bl = _tile_masked(qi, k[..., j:j + block, :], v[..., j:j + block, :], future, product)
            o, m = (bo, bl) if o is None else merge_attention(o, m, bo, bl)
        out[..., i:i + block, :], lse[..., i:i + block] = o, m
    return out, lse


def blockwise_masking_instead_of_skipping(q, k, v, block, causal=False):
    """Causal blockwise attention that computes the key blocks after each query block and masks them, instead of
    skipping them: twice the work of the causal tiles. Passed every seed while blockwise_attention had no FLOPs
    budget."""
    return _blockwise_masking(q, k, v, block, 0, 0, causal)


def blockwise_masking_by_embedding_bags(q, k, v, block, causal=False):
    """blockwise_masking_instead_of_skipping with every product an embedding bag weighted by the other operand."""
    return _blockwise_masking(q, k, v, block, 0, 0, causal, product=_product_by_embedding_bag)


def zigzag_masking_the_future_by_addbmm(dist, q, k, v, block):
    """Zigzag's ring, every (query chunk, key chunk) pair computed, the pairs in the future masked rather than
    skipped, every product through torch.addbmm: balanced, and 4N tiles where 2N+1 are needed. While addbmm cost one
    FLOP per output element (a d-th of its work), it passed the balance contract and the FLOPs ceiling at N = 2 (its
    elementwise passes over the tiles broke the ceiling at N = 3); priced from its shapes, it is over at every N."""
    rank, world = dist.get_rank(), dist.get_world_size()
    c = q.shape[-2] // 2
    mine = (rank, 2 * world - 1 - rank)
    kv, outs, lses = torch.stack([k, v]), [None, None], [None, None]
    for step in range(world):
        src = (rank - step) % world
        for a, qa in enumerate(mine):
            for b, kb in enumerate((src, 2 * world - 1 - src)):
                cols = slice(b * c, (b + 1) * c)
                bo, bl = _blockwise_masking(q[..., a * c:(a + 1) * c, :], kv[0][..., cols, :], kv[1][..., cols, :],
                                            block, qa * c, kb * c, causal=True)
                outs[a], lses[a] = (bo, bl) if outs[a] is None else merge_attention(outs[a], lses[a], bo, bl)
        if step < world - 1:
            kv = _pass_right(dist, kv)
    return torch.cat(outs, -2), torch.cat(lses, -1)


CHEATS += [
    ("zigzag_attention", zigzag_masking_the_future_by_addbmm, "FLOPs"),
    ("blockwise_attention", blockwise_masking_instead_of_skipping, "FLOPs"),
    ("blockwise_attention", blockwise_masking_by_embedding_bags, "FLOPs"),
]


# ---- merges the checks used to accept (issue 32) -----------------------------------------------------------------
def merge_by_a_flash_kernel(out, lse, block_out, block_lse):
    """The merge done by torch's attention kernel: one query whose scores against two keys are the two log-sum-exps,
    the two outputs its values; the kernel's own log-sum-exp is the merged one."""
    q = torch.ones(*lse.shape, 1, 1, dtype=lse.dtype, device=lse.device)               # (b, h, s, 1, 1)
    k = torch.stack([lse, block_lse], -1).unsqueeze(-1)                                   # (b, h, s, 2, 1)
    v = torch.stack([out, block_out], -2)                                                 # (b, h, s, 2, d)
    flat = [t.flatten(0, 1) for t in (q, k, v)]
    o, m = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(*flat, scale=1.0)[:2]
    return o.reshape(out.shape), m.reshape(lse.shape)


def merge_dropping_a_far_block(out, lse, block_out, block_lse):
    """The exact merge of the outputs, but the log-sum-exp of two blocks more than 12 apart taken as the larger one:
    off by up to e^-12 ≈ 6e-6, which a relative tolerance of 1e-9 allowed at log-sum-exps near 1e4."""
    new_out = out - torch.sigmoid(block_lse - lse).unsqueeze(-1) * (out - block_out)
    exact = lse - F.logsigmoid(lse - block_lse)
    return new_out, torch.where((lse - block_lse).abs() > 12, torch.maximum(lse, block_lse), exact)


def _with_merge(fn, merge):
    """The reference `fn` of notebook 08 with `merge` in place of merge_attention, in every function it calls."""
    scope = dict(S.__dict__, merge_attention=merge)
    for name in ("blockwise_attention", "ring_attention", "ring_attention_overlap", "zigzag_attention"):
        scope[name] = types.FunctionType(getattr(S, name).__code__, scope, name, getattr(S, name).__defaults__)
    rebound = scope[fn.__name__]
    rebound.__name__ = f"{fn.__name__}_dropping_a_far_block"
    return rebound


def overlap_softmax_over_every_score_kept(dist, q, k, v, block):
    """The overlapped ring (each transfer under the current block's compute), but no online softmax: every step's
    s/N × s/N scores are kept and one softmax runs over all of them at the end. Passed every seed while the overlap
    puzzle budgeted only bytes and time."""
    rank, world = dist.get_rank(), dist.get_world_size()
    kv, scores, values = torch.stack([k, v]), [], []
    for step in range(world):
        if step < world - 1:
            incoming = torch.empty_like(kv)
            works = [dist.isend(kv, (rank + 1) % world), dist.irecv(incoming, (rank - 1) % world)]
        scores.append(q @ kv[0].transpose(-2, -1) * q.shape[-1] ** -0.5)           # (b, h, s/N, s/N)
        values.append(kv[1])
        if step < world - 1:
            for w in works:
                w.wait()
            kv = incoming
    s = torch.cat(scores, -1)                                                       # (b, h, s/N, s)
    lse = s.logsumexp(-1)
    return torch.exp(s - lse.unsqueeze(-1)) @ torch.cat(values, -2), lse


APPROXIMATE = "values differ"
CHEATS += [
    ("merge_attention", merge_by_a_flash_kernel, "the answer called torch's _scaled_dot_product_flash_attention"),
    ("merge_attention", merge_dropping_a_far_block, APPROXIMATE),
    ("ring_attention_overlap", overlap_softmax_over_every_score_kept, ("largest tensor", "peak memory")),
] + [(fn.__name__, _with_merge(fn, merge_dropping_a_far_block), APPROXIMATE)
     for fn in (S.blockwise_attention, S.ring_attention, S.ring_attention_overlap, S.zigzag_attention)]


def ulysses_dealing_heads_round_robin(dist, q, k, v, block):
    """Heads dealt round-robin on the way in (rank i gets heads i, i + N, ...), the output sent back as if each rank
    held a block of consecutive heads: right only where every rank holds one head. Passed 2 seeds in 8 while a case
    could draw h = N."""
    world = dist.get_world_size()
    b, h, c, d = q.shape

    def to_heads(x):                                            # (b, h, s/N, d) -> (b, h/N, s, d), heads r, r + N..
        send = x.reshape(b, h // world, world, c, d).permute(2, 0, 1, 3, 4).contiguous()   # (N, b, h/N, s/N, d)
        got = torch.empty_like(send)
        dist.all_to_all_single(got, send)
        return got.permute(1, 2, 0, 3, 4).reshape(b, h // world, world * c, d)
    o, _ = blockwise_attention(to_heads(q), to_heads(k), to_heads(v), block)
    send = o.reshape(b, h // world, world, c, d).permute(2, 0, 1, 3, 4).contiguous()
    got = torch.empty_like(send)
    dist.all_to_all_single(got, send)
    return got.transpose(0, 1).reshape(b, h, c, d)


CHEATS += [("ulysses_attention", ulysses_dealing_heads_round_robin, "values differ")]


def ulysses_by_sdpa_on_its_math_backend(dist, q, k, v, block):
    """Ulysses whose attention is torch's sdpa forced onto its math backend, where it decomposes into matmuls and a
    softmax before dispatch (and torch's default for float64 on a GPU): no dispatched op is named like a kernel, so
    the ban by op name alone let it pass every seed."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def attend(q, k, v):
        with sdpa_kernel(SDPBackend.MATH):
            return F.scaled_dot_product_attention(q, k, v)
    return _ulysses_around(dist, q, k, v, attend)


CHEATS += [("ulysses_attention", ulysses_by_sdpa_on_its_math_backend, "called torch's scaled_dot_product_attention")]
