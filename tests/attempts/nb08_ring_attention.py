"""Notebook 08 (ring attention and context parallelism): first attempts, written from the notebook alone.

Later puzzles reuse the learner's own merge and blockwise attention (``_merge``, ``_blockwise``), as the
notebook asks.
"""
import math

import torch
import torch.nn.functional as F

import lib
from lib import sim
from puzzles import ring_attention as P


# ---------------------------------------------------------------- puzzle 1: merge_attention

def merge_attention_naive(out, lse, block_out, block_lse):
    new = torch.log(torch.exp(lse) + torch.exp(block_lse))
    return (torch.exp(lse - new).unsqueeze(-1) * out + torch.exp(block_lse - new).unsqueeze(-1) * block_out), new


def merge_attention_no_unsqueeze(out, lse, block_out, block_lse):
    new = torch.logaddexp(lse, block_lse)
    return torch.exp(lse - new) * out + torch.exp(block_lse - new) * block_out, new   # weights not unsqueezed


def merge_attention_swapped(out, lse, block_out, block_lse):
    new = torch.logaddexp(lse, block_lse)
    return (torch.exp(block_lse - new)[..., None] * out + torch.exp(lse - new)[..., None] * block_out), new


def merge_attention_average(out, lse, block_out, block_lse):
    return (out + block_out) / 2, torch.logaddexp(lse, block_lse)


def merge_attention_max_lse(out, lse, block_out, block_lse):
    m = torch.maximum(lse, block_lse)
    o = torch.exp(lse - m)[..., None] * out + torch.exp(block_lse - m)[..., None] * block_out
    return o, m                               # returned the max as the new log-sum-exp


def merge_attention_unnormalised(out, lse, block_out, block_lse):
    m = torch.maximum(lse, block_lse)
    a, b = torch.exp(lse - m), torch.exp(block_lse - m)
    new = m + torch.log(a + b)
    return a[..., None] * out + b[..., None] * block_out, new   # forgot to divide by a + b


def merge_attention_sigmoid(out, lse, block_out, block_lse):
    # correct: the notebook's sigmoid form
    w = torch.sigmoid(block_lse - lse).unsqueeze(-1)
    return out + w * (block_out - out), lse - F.logsigmoid(lse - block_lse)


def _merge(out, lse, block_out, block_lse):
    if out is None:
        return block_out, block_lse
    new = torch.logaddexp(lse, block_lse)
    return (torch.exp(lse - new)[..., None] * out + torch.exp(block_lse - new)[..., None] * block_out), new


# ---------------------------------------------------------------- puzzle 2: blockwise_attention

def _blockwise(q, k, v, block, causal=False, *, scale=True, mask_diag=False, skip_above=True, full=False,
               drop_tail=False, local_mask=False, q_offset=0, k_offset=0):
    b, h, s, d = q.shape
    sk = k.shape[2]
    c = 1 / math.sqrt(d) if scale else 1.0
    if full:
        scores = q @ k.transpose(-1, -2) * c
        if causal:
            scores = scores.masked_fill(torch.ones(s, sk, dtype=torch.bool).triu(1), float("-inf"))
        lse = torch.logsumexp(scores, -1)
        return torch.exp(scores - lse[..., None]) @ v, lse
    outs, lses = [], []
    q_stop = (s // block) * block if drop_tail else s
    k_stop = (sk // block) * block if drop_tail else sk
    for i in range(0, q_stop, block):
        qi = q[:, :, i:i + block]
        o = l = None
        for j in range(0, k_stop, block):
            kj, vj = k[:, :, j:j + block], v[:, :, j:j + block]
            if causal and skip_above and j + k_offset > i + q_offset + qi.shape[2] - 1:
                break
            scores = qi @ kj.transpose(-1, -2) * c
            if causal:
                qi_idx = torch.arange(qi.shape[2]) + (0 if local_mask else i + q_offset)
                kj_idx = torch.arange(kj.shape[2]) + (0 if local_mask else j + k_offset)
                bad = kj_idx[None, :] >= qi_idx[:, None] if mask_diag else kj_idx[None, :] > qi_idx[:, None]
                scores = scores.masked_fill(bad, float("-inf"))
            tl = torch.logsumexp(scores, -1)
            to = torch.exp(scores - tl[..., None]) @ vj
            o, l = _merge(o, l, to, tl)
        outs.append(o)
        lses.append(l)
    return torch.cat(outs, 2), torch.cat(lses, 2)


def blockwise_attention_no_scale(q, k, v, block, causal=False):
    return _blockwise(q, k, v, block, causal, scale=False)


def blockwise_attention_masks_diagonal(q, k, v, block, causal=False):
    return _blockwise(q, k, v, block, causal, mask_diag=True)


def blockwise_attention_whole_scores(q, k, v, block, causal=False):
    return _blockwise(q, k, v, block, causal, full=True)


def blockwise_attention_no_skip(q, k, v, block, causal=False):
    return _blockwise(q, k, v, block, causal, skip_above=False)


def blockwise_attention_drops_tail(q, k, v, block, causal=False):
    return _blockwise(q, k, v, block, causal, drop_tail=True)


def blockwise_attention_local_mask(q, k, v, block, causal=False):
    return _blockwise(q, k, v, block, causal, local_mask=True)


def blockwise_attention_keys_outer(q, k, v, block, causal=False):
    # correct: key blocks in the outer loop, a running (out, lse) kept for every query block
    b, h, s, d = q.shape
    starts = list(range(0, s, block))
    state = [(None, None)] * len(starts)
    for j in range(0, k.shape[2], block):
        kj, vj = k[:, :, j:j + block], v[:, :, j:j + block]
        for n, i in enumerate(starts):
            qi = q[:, :, i:i + block]
            if causal and j > i + qi.shape[2] - 1:
                continue
            scores = qi @ kj.transpose(-1, -2) / math.sqrt(d)
            if causal and j + kj.shape[2] - 1 > i:
                qpos = torch.arange(i, i + qi.shape[2])
                kpos = torch.arange(j, j + kj.shape[2])
                scores = scores.masked_fill(kpos[None, :] > qpos[:, None], float("-inf"))
            tl = torch.logsumexp(scores, -1)
            state[n] = _merge(*state[n], torch.exp(scores - tl[..., None]) @ vj, tl)
    return torch.cat([o for o, _ in state], 2), torch.cat([l for _, l in state], 2)


# ---------------------------------------------------------------- puzzle 3: ring_attention

def _ring(dist, q, k, v, block, *, blocking=False, steps=None, recv_from_right=False, overwrite=False,
          overlap=False, wait_at_once=False, no_wait=False, same_buffer=False, separate=False):
    r, N = dist.get_rank(), dist.get_world_size()
    right, left = (r + 1) % N, (r - 1) % N
    src_for_recv = right if recv_from_right else left
    kv = torch.stack([k, v])
    n_steps = N - 1 if steps is None else steps(N)
    if overlap:
        cur, out, lse = kv, None, None
        for step in range(n_steps + 1):
            works = []
            if step < n_steps:
                nxt = cur if same_buffer else torch.empty_like(cur)
                works = [dist.isend(cur, right), dist.irecv(nxt, src_for_recv)]
                if wait_at_once:
                    for w in works:
                        w.wait()
                    works = []
            o, l = _blockwise(q, cur[0], cur[1], block)
            out, lse = _merge(out, lse, o, l)
            if not no_wait:
                for w in works:
                    w.wait()
            if step < n_steps:
                cur = nxt
        return out, lse
    out, lse = _blockwise(q, k, v, block)
    for step in range(n_steps):
        if separate:
            nk, nv = torch.empty_like(k), torch.empty_like(v)
            w1 = dist.isend(kv[0].contiguous(), right)
            w2 = dist.isend(kv[1].contiguous(), right)
            dist.recv(nk, left)
            dist.recv(nv, left)
            w1.wait()
            w2.wait()
            new = torch.stack([nk, nv])
            del nk, nv
        else:
            new = torch.empty_like(kv)
            if blocking:
                dist.send(kv, right)
                dist.recv(new, src_for_recv)
            else:
                w = dist.isend(kv, right)
                dist.recv(new, src_for_recv)
                w.wait()
        kv = new
        o, l = _blockwise(q, kv[0], kv[1], block)
        if overwrite:
            out, lse = o, l
        else:
            out, lse = _merge(out, lse, o, l)
    return out, lse


def ring_attention_blocking(dist, q, k, v, block):
    return _ring(dist, q, k, v, block, blocking=True)


def ring_attention_n_steps(dist, q, k, v, block):
    return _ring(dist, q, k, v, block, steps=lambda N: N)


def ring_attention_recv_from_right(dist, q, k, v, block):
    return _ring(dist, q, k, v, block, recv_from_right=True)


def ring_attention_overwrite(dist, q, k, v, block):
    return _ring(dist, q, k, v, block, overwrite=True)


def ring_attention_all_gather(dist, q, k, v, block):
    N = dist.get_world_size()
    kv = torch.stack([k, v]).contiguous()
    every = torch.empty((N,) + tuple(kv.shape), dtype=kv.dtype)
    dist.all_gather_single(every, kv.unsqueeze(0))      # simpler: gather all K and V
    ks = torch.cat([every[i, 0] for i in range(N)], 2)
    vs = torch.cat([every[i, 1] for i in range(N)], 2)
    return _blockwise(q, ks, vs, block)


def ring_attention_separate_messages(dist, q, k, v, block):
    # correct: K and V sent as two messages per step instead of one stacked tensor
    return _ring(dist, q, k, v, block, separate=True)


# ---------------------------------------------------------------- puzzle 4: ring_attention_overlap

def ring_attention_overlap_wait_at_once(dist, q, k, v, block):
    return _ring(dist, q, k, v, block, overlap=True, wait_at_once=True)


def ring_attention_overlap_unchanged(dist, q, k, v, block):
    return _ring(dist, q, k, v, block)


def ring_attention_overlap_no_wait(dist, q, k, v, block):
    return _ring(dist, q, k, v, block, overlap=True, no_wait=True)


def ring_attention_overlap_same_buffer(dist, q, k, v, block):
    return _ring(dist, q, k, v, block, overlap=True, same_buffer=True)


def ring_attention_overlap_extra_step(dist, q, k, v, block):
    return _ring(dist, q, k, v, block, overlap=True, steps=lambda N: N)


def ring_attention_overlap_double_buffer(dist, q, k, v, block):
    # correct: two buffers; post the transfer of the block I hold, attend to it, then wait
    r, N = dist.get_rank(), dist.get_world_size()
    cur = torch.stack([k, v])
    out = lse = None
    for step in range(N):
        works = []
        if step < N - 1:
            nxt = torch.empty_like(cur)
            works = [dist.isend(cur, (r + 1) % N), dist.irecv(nxt, (r - 1) % N)]
        o, l = _blockwise(q, cur[0], cur[1], block)
        out, lse = _merge(out, lse, o, l)
        for w in works:
            w.wait()
        if step < N - 1:
            cur = nxt
    return out, lse


# ---------------------------------------------------------------- puzzle 5: zigzag_attention

def _zigzag(dist, q, k, v, block, *, chunk_ids="zigzag", all_causal=False, compute_skipped=False,
            src_sign=-1, concat_keys=False):
    r, N = dist.get_rank(), dist.get_world_size()
    c = q.shape[2] // 2

    def ids(rank):
        return (rank, 2 * N - 1 - rank) if chunk_ids == "zigzag" else (rank, N + rank)

    mine = ids(r)
    qs = [q[:, :, :c], q[:, :, c:]]
    state = [(None, None), (None, None)]
    cur = torch.stack([k, v])
    for step in range(N):
        src = (r + src_sign * step) % N
        theirs = ids(src)
        ks, vs = [cur[0][:, :, :c], cur[0][:, :, c:]], [cur[1][:, :, :c], cur[1][:, :, c:]]
        if step < N - 1:
            nxt = torch.empty_like(cur)
            works = [dist.isend(cur, (r + 1) % N), dist.irecv(nxt, (r - 1) % N)]
        for a in range(2):
            if concat_keys:
                if theirs[0] > mine[a]:
                    continue
                o, l = _blockwise(qs[a], cur[0], cur[1], block, causal=theirs[0] == mine[a])
                state[a] = _merge(*state[a], o, l)
                continue
            for bk in range(2):
                if all_causal:
                    o, l = _blockwise(qs[a], ks[bk], vs[bk], block, causal=True)
                    state[a] = _merge(*state[a], o, l)
                    continue
                if theirs[bk] > mine[a]:
                    if compute_skipped:
                        _blockwise(qs[a], ks[bk], vs[bk], block)
                    continue
                o, l = _blockwise(qs[a], ks[bk], vs[bk], block, causal=theirs[bk] == mine[a])
                state[a] = _merge(*state[a], o, l)
        if step < N - 1:
            for w in works:
                w.wait()
            cur = nxt
    return torch.cat([state[0][0], state[1][0]], 2), torch.cat([state[0][1], state[1][1]], 2)


def zigzag_attention_second_chunk_n_plus_r(dist, q, k, v, block):
    return _zigzag(dist, q, k, v, block, chunk_ids="contiguous")


def zigzag_attention_all_causal(dist, q, k, v, block):
    return _zigzag(dist, q, k, v, block, all_causal=True)


def zigzag_attention_computes_skipped(dist, q, k, v, block):
    return _zigzag(dist, q, k, v, block, compute_skipped=True)


def zigzag_attention_wrong_source(dist, q, k, v, block):
    return _zigzag(dist, q, k, v, block, src_sign=+1)


def zigzag_attention_concat_keys(dist, q, k, v, block):
    return _zigzag(dist, q, k, v, block, concat_keys=True)


def zigzag_attention_correct(dist, q, k, v, block):
    # correct: four (query chunk, key chunk) pairs per step, skipped when the key chunk comes later
    return _zigzag(dist, q, k, v, block)


# ---------------------------------------------------------------- puzzle 6: ring_attention_backward

def _ring_bwd(dist, q, k, v, out, lse, dout, block, *, home=True, use_D=True, scale_grads=True,
              dv_no_t=False, travel=True, local_softmax=False):
    r, N = dist.get_rank(), dist.get_world_size()
    d = q.shape[-1]
    c = 1 / math.sqrt(d)
    D = (dout * out).sum(-1, keepdim=True) if use_D else 0
    dq = torch.zeros_like(q)
    cur = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)])
    own_dk, own_dv = torch.zeros_like(k), torch.zeros_like(v)
    for step in range(N):
        kb, vb, dkb, dvb = cur[0], cur[1], cur[2], cur[3]
        for j in range(0, kb.shape[2], block):
            kj, vj = kb[:, :, j:j + block], vb[:, :, j:j + block]
            S = q @ kj.transpose(-1, -2) * c
            Pm = torch.softmax(S, -1) if local_softmax else torch.exp(S - lse[..., None])
            dv_part = Pm @ dout if dv_no_t else Pm.transpose(-1, -2) @ dout
            dP = dout @ vj.transpose(-1, -2)
            dS = Pm * (dP - D)
            dq += dS @ kj * (c if scale_grads else 1)
            dk_part = dS.transpose(-1, -2) @ q * (c if scale_grads else 1)
            if travel:
                dkb[:, :, j:j + block] += dk_part
                dvb[:, :, j:j + block] += dv_part
            elif step == 0:
                own_dk[:, :, j:j + block] += dk_part
                own_dv[:, :, j:j + block] += dv_part
        if step < N - 1:
            nxt = torch.empty_like(cur)
            w = dist.isend(cur, (r + 1) % N)
            dist.recv(nxt, (r - 1) % N)
            w.wait()
            cur = nxt
    if not travel:
        return dq, own_dk, own_dv
    if not home:
        return dq, cur[2].clone(), cur[3].clone()
    grads = cur[2:].contiguous()
    back = torch.empty_like(grads)
    w = dist.isend(grads, (r + 1) % N)
    dist.recv(back, (r - 1) % N)
    w.wait()
    return dq, back[0], back[1]


def ring_attention_backward_no_home_step(dist, q, k, v, out, lse, dout, block):
    return _ring_bwd(dist, q, k, v, out, lse, dout, block, home=False)


def ring_attention_backward_no_D(dist, q, k, v, out, lse, dout, block):
    return _ring_bwd(dist, q, k, v, out, lse, dout, block, use_D=False)


def ring_attention_backward_no_scale(dist, q, k, v, out, lse, dout, block):
    return _ring_bwd(dist, q, k, v, out, lse, dout, block, scale_grads=False)


def ring_attention_backward_dv_no_transpose(dist, q, k, v, out, lse, dout, block):
    return _ring_bwd(dist, q, k, v, out, lse, dout, block, dv_no_t=True)


def ring_attention_backward_grads_stay(dist, q, k, v, out, lse, dout, block):
    return _ring_bwd(dist, q, k, v, out, lse, dout, block, travel=False)


def ring_attention_backward_tile_softmax(dist, q, k, v, out, lse, dout, block):
    return _ring_bwd(dist, q, k, v, out, lse, dout, block, local_softmax=True)


def ring_attention_backward_stacked(dist, q, k, v, out, lse, dout, block):
    # correct: K, V, dK, dV travel stacked; the home step sends dK and dV only
    return _ring_bwd(dist, q, k, v, out, lse, dout, block)


# ---------------------------------------------------------------- puzzle 7: ulysses_attention

def _ulysses(dist, q, k, v, block, *, permute_in=True, permute_out=True, send_back=True, interleave=False,
             contiguous=True):
    N = dist.get_world_size()
    b, h, sl, d = q.shape
    hl = h // N

    def to_heads(t):
        if not permute_in:
            x = t
        elif interleave:
            x = t.view(b, hl, N, sl, d).permute(2, 0, 1, 3, 4)
        else:
            x = t.view(b, N, hl, sl, d).permute(1, 0, 2, 3, 4)
        x = x.contiguous() if contiguous else x
        got = torch.empty_like(x)
        dist.all_to_all_single(got, x)
        if not permute_in:
            return got.reshape(b, hl, N * sl, d)
        return got.permute(1, 2, 0, 3, 4).reshape(b, hl, N * sl, d)

    qh, kh, vh = to_heads(q), to_heads(k), to_heads(v)
    o, _ = _blockwise(qh, kh, vh, block)
    del qh, kh, vh
    if not send_back:
        return o
    x = o.view(b, hl, N, sl, d).permute(2, 0, 1, 3, 4).contiguous()
    got = torch.empty_like(x)
    dist.all_to_all_single(got, x)
    if not permute_out:
        return got.reshape(b, h, sl, d)
    if interleave:
        return got.permute(1, 2, 0, 3, 4).reshape(b, h, sl, d)
    return got.permute(1, 0, 2, 3, 4).reshape(b, h, sl, d)


def ulysses_attention_no_permute(dist, q, k, v, block):
    return _ulysses(dist, q, k, v, block, permute_in=False)


def ulysses_attention_output_no_permute(dist, q, k, v, block):
    return _ulysses(dist, q, k, v, block, permute_out=False)


def ulysses_attention_no_return_trip(dist, q, k, v, block):
    return _ulysses(dist, q, k, v, block, send_back=False)


def ulysses_attention_not_contiguous(dist, q, k, v, block):
    return _ulysses(dist, q, k, v, block, contiguous=False)


def ulysses_attention_all_gather(dist, q, k, v, block):
    N, r = dist.get_world_size(), dist.get_rank()
    kv = torch.stack([k, v]).contiguous()
    every = torch.empty((N,) + tuple(kv.shape), dtype=kv.dtype)
    dist.all_gather_single(every, kv.unsqueeze(0))      # gathered K and V, kept every head
    ks = torch.cat([every[i, 0] for i in range(N)], 2)
    vs = torch.cat([every[i, 1] for i in range(N)], 2)
    o, _ = _blockwise(q, ks, vs, block)
    return o


def ulysses_attention_interleaved_heads(dist, q, k, v, block):
    # correct: rank r takes heads r, r+N, r+2N... and gives them back the same way
    return _ulysses(dist, q, k, v, block, interleave=True)


def ulysses_attention_correct(dist, q, k, v, block):
    # correct: contiguous head split, permuted views around both all-to-alls
    return _ulysses(dist, q, k, v, block)


ATTEMPTS = [
    ("merge_attention", merge_attention_naive, "log(exp(a) + exp(b)) directly: overflows at 1e4"),
    ("merge_attention", merge_attention_no_unsqueeze, "multiplied the (b, h, s) weights into (b, h, s, d) outputs without unsqueeze(-1)"),
    ("merge_attention", merge_attention_swapped, "weighted out by block B's share and block_out by A's"),
    ("merge_attention", merge_attention_average, "averaged the two outputs"),
    ("merge_attention", merge_attention_max_lse, "returned max(lse_A, lse_B) as the new log-sum-exp"),
    ("merge_attention", merge_attention_unnormalised, "stable exponentials but forgot to divide by their sum"),
    ("merge_attention", merge_attention_sigmoid, "correct: sigmoid and logsigmoid of the lse difference"),
    ("blockwise_attention", blockwise_attention_no_scale, "forgot the 1/sqrt(d) scale"),
    ("blockwise_attention", blockwise_attention_masks_diagonal, "masked the diagonal too (key >= query): first query sees nothing"),
    ("blockwise_attention", blockwise_attention_whole_scores, "computed the whole s x s scores at once"),
    ("blockwise_attention", blockwise_attention_no_skip, "masked tiles above the diagonal instead of skipping them (all -inf)"),
    ("blockwise_attention", blockwise_attention_drops_tail, "looped to s // block * block: the shorter last block is lost"),
    ("blockwise_attention", blockwise_attention_local_mask, "causal mask built from tile-local indices, without the tiles' offsets"),
    ("blockwise_attention", blockwise_attention_keys_outer, "correct: key blocks outer, a running (out, lse) per query block"),
    ("ring_attention", ring_attention_blocking, "blocking send before recv on every rank (deadlock)"),
    ("ring_attention", ring_attention_n_steps, "N transfers instead of N-1: my own block comes back and is counted twice"),
    ("ring_attention", ring_attention_recv_from_right, "received from (r + 1) % N while sending there too"),
    ("ring_attention", ring_attention_overwrite, "replaced out, lse with each block's result instead of merging"),
    ("ring_attention", ring_attention_all_gather, "all-gathered K and V instead of passing them round"),
    ("ring_attention", ring_attention_separate_messages, "correct: K and V as two messages per step"),
    ("ring_attention_overlap", ring_attention_overlap_wait_at_once, "waited on the transfer right after posting it (no overlap)"),
    ("ring_attention_overlap", ring_attention_overlap_unchanged, "submitted puzzle 3's ring unchanged"),
    ("ring_attention_overlap", ring_attention_overlap_no_wait, "never waited on the isend/irecv"),
    ("ring_attention_overlap", ring_attention_overlap_same_buffer, "received into the very buffer being sent and computed on"),
    ("ring_attention_overlap", ring_attention_overlap_extra_step, "one transfer too many (N instead of N-1)"),
    ("ring_attention_overlap", ring_attention_overlap_double_buffer, "correct: double buffer, post transfer, compute, wait"),
    ("zigzag_attention", zigzag_attention_second_chunk_n_plus_r, "thought the second chunk was N + r, not 2N - 1 - r"),
    ("zigzag_attention", zigzag_attention_all_causal, "causal=True on every pair instead of comparing chunk positions"),
    ("zigzag_attention", zigzag_attention_computes_skipped, "computed the later key chunks too and threw the result away"),
    ("zigzag_attention", zigzag_attention_wrong_source, "block's source as (r + step) % N: the ring goes the other way"),
    ("zigzag_attention", zigzag_attention_concat_keys, "attended both key chunks of a block at once, judged by the first chunk"),
    ("zigzag_attention", zigzag_attention_correct, "correct: four chunk pairs per step, skip when the key chunk comes later"),
    ("ring_attention_backward", ring_attention_backward_no_home_step, "forgot the last step that brings dK, dV home"),
    ("ring_attention_backward", ring_attention_backward_no_D, "left out D = rowsum(dO * O) in dS"),
    ("ring_attention_backward", ring_attention_backward_no_scale, "forgot 1/sqrt(d) in dQ and dK"),
    ("ring_attention_backward", ring_attention_backward_dv_no_transpose, "dV = P dO instead of P^T dO (equal sizes: no error)"),
    ("ring_attention_backward", ring_attention_backward_grads_stay, "kept dK, dV of my own block only, did not let them travel"),
    ("ring_attention_backward", ring_attention_backward_tile_softmax, "recomputed P with the tile's own softmax, not exp(S - lse)"),
    ("ring_attention_backward", ring_attention_backward_stacked, "correct: K, V, dK, dV travel stacked in one message; the home step sends dK, dV only"),
    ("ulysses_attention", ulysses_attention_no_permute, "all-to-all straight on (b, h, s/N, d): splits the batch, not the heads"),
    ("ulysses_attention", ulysses_attention_output_no_permute, "reshaped the returned output without permuting back"),
    ("ulysses_attention", ulysses_attention_no_return_trip, "forgot the all-to-all back to a sequence split"),
    ("ulysses_attention", ulysses_attention_not_contiguous, "passed a permuted, non-contiguous view to all_to_all_single"),
    ("ulysses_attention", ulysses_attention_all_gather, "all-gathered K and V and kept every head"),
    ("ulysses_attention", ulysses_attention_interleaved_heads, "correct: heads dealt round-robin (r, r+N, ...) and returned the same way"),
    ("ulysses_attention", ulysses_attention_correct, "correct: contiguous head split with permuted views"),
]
