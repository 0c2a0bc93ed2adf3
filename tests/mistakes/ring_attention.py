"""Realistic first attempts at notebook 08's puzzles (ring attention and context parallelism), none of them in
tests/wrong. Layout (b, h, s, d) throughout, as the puzzles'."""

import math

import torch

import solutions.ring_attention as S
from tests.cheats.ring_attention import _pass_right
from tests.mistakes import Attempt

NAN_FROM_A_MASKED_ROW = ("every score is masked", "masked entirely")


# ---- merge_attention -----------------------------------------------------------------------------------------
def merge_giving_the_running_output_the_blocks_weight(out, lse, block_out, block_lse):
    """The running output's weight taken for the block's: out - sigmoid(lse - block_lse) · (out - block_out)."""
    return out - torch.sigmoid(lse - block_lse).unsqueeze(-1) * (out - block_out), torch.logaddexp(lse, block_lse)


def merge_keeping_the_larger_lse(out, lse, block_out, block_lse):
    """The union's log-sum-exp as max(lse, block_lse), "the larger one dominates": right only when it does."""
    w = torch.sigmoid(block_lse - lse).unsqueeze(-1)
    return out - w * (out - block_out), torch.maximum(lse, block_lse)


def merge_by_the_ratio_of_sums(out, lse, block_out, block_lse):
    """lse_new = lse + log1p(e^block_lse / e^lse), "log1p for accuracy", with the ratio formed from the two sums
    themselves: inf / inf is NaN at logits of 1e4."""
    new = lse + torch.log1p(torch.exp(block_lse) / torch.exp(lse))
    return out * torch.exp(lse - new).unsqueeze(-1) + block_out * torch.exp(block_lse - new).unsqueeze(-1), new


def merge_by_exponentials_of_the_sums(out, lse, block_out, block_lse):
    """The sums themselves, s = e^lse, merged as counts are (the weighted mean of the two outputs by their sums),
    their log taken at the end: e^1e4 is inf, and inf / inf leaves the weights 0 or NaN."""
    sa, sb = torch.exp(lse), torch.exp(block_lse)
    total = sa + sb
    wa, wb = torch.where(total > 0, sa / total, 0.0), torch.where(total > 0, sb / total, 0.0)
    return torch.nan_to_num(wa).unsqueeze(-1) * out + torch.nan_to_num(wb).unsqueeze(-1) * block_out, torch.log(total)


def merge_weighing_against_the_smaller(out, lse, block_out, block_lse):
    """Weights e^(lse - m) with m the smaller of the two log-sum-exps, "so that neither underflows": the ratio is right
    and the division by their sum is forgotten."""
    m = torch.minimum(lse, block_lse)
    wa, wb = torch.exp(lse - m), torch.exp(block_lse - m)
    return out * wa.unsqueeze(-1) + block_out * wb.unsqueeze(-1), torch.logaddexp(lse, block_lse)


def merge_softmax_of_the_pair_unnormalised(out, lse, block_out, block_lse):
    """The pair's weights as a stable softmax over the two log-sum-exps, its last step (the division by the sum)
    left out: w = exp(lses - lses.max(0))."""
    lses = torch.stack([lse, block_lse])                              # (2, b, h, s)
    w = torch.exp(lses - lses.max(0).values)
    return w[0].unsqueeze(-1) * out + w[1].unsqueeze(-1) * block_out, torch.logsumexp(lses, 0)


def merge_adding_the_lses(out, lse, block_out, block_lse):
    """lse + block_lse: logs add when the sums multiply, and the union's sum is a sum of the two."""
    w = torch.sigmoid(block_lse - lse).unsqueeze(-1)
    return out - w * (out - block_out), lse + block_lse


def merge_by_averaging_the_outputs(out, lse, block_out, block_lse):
    """(out + block_out) / 2: the two blocks weighted alike, whatever their keys' share of the softmax."""
    return (out + block_out) / 2, torch.logaddexp(lse, block_lse)


def merge_weights_of_shape_b_h_s(out, lse, block_out, block_lse):
    """The block's weight (b, h, s) multiplied into outputs (b, h, s, d) without .unsqueeze(-1)."""
    return out - torch.sigmoid(block_lse - lse) * (out - block_out), torch.logaddexp(lse, block_lse)


def merge_subtracting_one_global_max(out, lse, block_out, block_lse):
    """Exponentials made safe with one maximum over the whole tensor: rows far below it underflow to 0 / 0."""
    top = torch.maximum(lse.max(), block_lse.max())
    a, b = torch.exp(lse - top), torch.exp(block_lse - top)
    return (a.unsqueeze(-1) * out + b.unsqueeze(-1) * block_out) / (a + b).unsqueeze(-1), top + torch.log(a + b)


# ---- blockwise_attention -------------------------------------------------------------------------------------
def _tiles(q, k, v, block, causal=False, *, scale=None, mask_from=1, mask_every_tile=False, plain_exp=False,
           diagonal=True):
    """Blockwise attention as a learner writes it, with the knob of one mistake turned."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale(q.shape[-1])
    outs, lses = [], []
    for i in range(0, q.shape[-2], block):
        qi, o, m = q[..., i:i + block, :], None, None
        last = (i + 1 if diagonal else i) if causal else k.shape[-2]
        for j in range(0, last, block):
            s = qi @ k[..., j:j + block, :].transpose(-2, -1) * scale                  # (b, h, bq, bk)
            if causal and (j == i or mask_every_tile):
                s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(mask_from), -math.inf)
            bl = s.logsumexp(-1)
            p = torch.exp(s) / torch.exp(bl).unsqueeze(-1) if plain_exp else torch.exp(s - bl.unsqueeze(-1))
            tile = p @ v[..., j:j + block, :]                                           # (b, h, bq, d)
            o, m = (tile, bl) if o is None else S.merge_attention(o, m, tile, bl)
        outs.append(o)
        lses.append(m)
    return torch.cat(outs, -2), torch.cat(lses, -1)


def blockwise_masking_the_diagonal_too(q, k, v, block, causal=False):
    """The causal mask made with .triu(0): each query's own key masked too, and the first query sees nothing."""
    return _tiles(q, k, v, block, causal, mask_from=0)


def blockwise_without_the_scale(q, k, v, block, causal=False):
    """Scores q · kᵀ without the 1/√d."""
    return _tiles(q, k, v, block, causal, scale=lambda d: 1.0)


def blockwise_scaled_by_one_over_d(q, k, v, block, causal=False):
    """Scores scaled by 1/d, where attention divides by √d."""
    return _tiles(q, k, v, block, causal, scale=lambda d: 1 / d)


def blockwise_masking_every_tile(q, k, v, block, causal=False):
    """The triangular mask applied to every tile of a causal query block, the earlier key blocks' too."""
    return _tiles(q, k, v, block, causal, mask_every_tile=True)


def blockwise_with_softmax_by_exp(q, k, v, block, causal=False):
    """Each tile's probabilities as exp(s) / exp(lse), the textbook softmax: the exponentials overflow."""
    return _tiles(q, k, v, block, causal, plain_exp=True)


def blockwise_causal_key_blocks_below_i(q, k, v, block, causal=False):
    """Causal key blocks range(0, i, block): the diagonal tile left out, and the first query block has no key."""
    return _tiles(q, k, v, block, causal, diagonal=False)


# ---- ring_attention ------------------------------------------------------------------------------------------
class _Sent:
    def wait(self):
        return None


class _Dist:
    """The learner's dist as the reference calls it, with one thing done differently."""

    def __init__(self, real, *, blocking=False, recv_from_the_right=False):
        self.real, self.blocking, self.recv_from_the_right = real, blocking, recv_from_the_right

    def __getattr__(self, name):
        return getattr(self.real, name)

    def isend(self, tensor, dst, group=None, tag=0):
        if self.blocking:
            self.real.send(tensor, dst)
            return _Sent()
        return self.real.isend(tensor, dst, group=group, tag=tag)

    def recv(self, tensor, src=None, group=None, tag=0):
        if self.recv_from_the_right:
            src = (self.real.get_rank() + 1) % self.real.get_world_size()
        return self.real.recv(tensor, src, group=group, tag=tag)


def ring_sending_before_receiving(dist, q, k, v, block):
    """dist.send(kv, right) then dist.recv(buf, left) on every rank: each send waits for a receive nobody posts."""
    return S.ring_attention(_Dist(dist, blocking=True), q, k, v, block)


def ring_receiving_from_the_right(dist, q, k, v, block):
    """Sends to rank + 1 and receives from rank + 1 too: the block comes from the left neighbour."""
    return S.ring_attention(_Dist(dist, recv_from_the_right=True), q, k, v, block)


def _ring(dist, q, k, v, block, *, merge=True, attend_after_passing=True, send_v=True, keep_lse=True):
    """Ring attention as a learner writes it, with the knob of one mistake turned."""
    out, lse = S.blockwise_attention(q, k, v, block)
    for step in range(dist.get_world_size() - 1):
        if not attend_after_passing and step > 0:        # attends to what it holds, then passes it on
            o, m = S.blockwise_attention(q, k, v, block)
            out, lse = S.merge_attention(out, lse, o, m)
        k, v = _pass_right(dist, k), _pass_right(dist, v) if send_v else v
        if attend_after_passing:
            o, m = S.blockwise_attention(q, k, v, block)
            merged = S.merge_attention(out, lse, o, m) if merge else (o, m)
            out, lse = (merged[0], lse) if not keep_lse else merged
    return out, lse


def ring_keeping_only_the_last_block(dist, q, k, v, block):
    """Each step's block attention assigned to out, lse instead of merged into them: the last block wins."""
    return _ring(dist, q, k, v, block, merge=False)


def ring_never_attending_to_the_last_block(dist, q, k, v, block):
    """Each of the N-1 steps attends to the block it holds, then passes it on: the block received last is never
    attended to."""
    return _ring(dist, q, k, v, block, attend_after_passing=False)


def ring_output_merged_lse_dropped(dist, q, k, v, block):
    """out = merge_attention(out, lse, o, m)[0]: the merged output kept, the merged log-sum-exp dropped, so the lse
    returned is the own block's (and at N > 2 the later merges weigh by it)."""
    return _ring(dist, q, k, v, block, keep_lse=False)


def ring_passing_k_only(dist, q, k, v, block):
    """Only K travels: each rank attends to the other ranks' keys with its own values."""
    return _ring(dist, q, k, v, block, send_v=False)


# ---- ring_attention_overlap ----------------------------------------------------------------------------------
def _overlapped(dist, q, k, v, block, *, wait_at_the_end=False, compute_on="current", last_too=False,
                separate_kv=False):
    """The overlapped ring as a learner writes it, with the knob of one mistake turned."""
    rank, world = dist.get_rank(), dist.get_world_size()
    kv, pending = torch.stack([k, v]), []
    out = lse = None
    for step in range(world):
        posting = step < world - 1 or last_too
        if posting:
            nxt = torch.empty_like(kv)
            if separate_kv:                  # K then V, received in the other order
                works = [dist.isend(kv[0], (rank + 1) % world), dist.isend(kv[1], (rank + 1) % world),
                         dist.irecv(nxt[1], (rank - 1) % world), dist.irecv(nxt[0], (rank - 1) % world)]
            else:
                works = [dist.isend(kv, (rank + 1) % world), dist.irecv(nxt, (rank - 1) % world)]
            if compute_on == "next":
                for w in works:
                    w.wait()
                kv = nxt
        o, m = S.blockwise_attention(q, kv[0], kv[1], block)
        out, lse = (o, m) if out is None else S.merge_attention(out, lse, o, m)
        if posting and compute_on == "current":
            for w in ([] if wait_at_the_end else works):
                w.wait()
            pending += works if wait_at_the_end else []
            kv = nxt
    for w in pending:
        w.wait()
    return out, lse


def overlap_waiting_for_everything_at_the_end(dist, q, k, v, block):
    """kv = nxt right after posting, every work waited for after the loop: each next step attends to a buffer
    the transfer has not filled yet."""
    return _overlapped(dist, q, k, v, block, wait_at_the_end=True)


def overlap_attending_to_what_arrived(dist, q, k, v, block):
    """Waits for the transfer at the top of each step and attends to the block that arrived: its own block is
    never attended to, and nothing overlaps."""
    return _overlapped(dist, q, k, v, block, compute_on="next")


def overlap_posting_on_the_last_step_too(dist, q, k, v, block):
    """The transfer posted on every step, the last included: one block more than the N-1 the ring needs."""
    return _overlapped(dist, q, k, v, block, last_too=True)


def overlap_k_and_v_received_crosswise(dist, q, k, v, block):
    """K and V sent as two messages, received in the other order: K lands in V's buffer and V in K's."""
    return _overlapped(dist, q, k, v, block, separate_kv=True)


def overlap_computing_the_block_after_next(dist, q, k, v, block):
    """Starts with the transfer already waited for, and attends after each wait: every block but its own."""
    return _overlapped(dist, q, k, v, block, compute_on="next", last_too=True)


# ---- zigzag_attention ----------------------------------------------------------------------------------------
def _zigzag(dist, q, k, v, block, *, late=lambda r, n: 2 * n - 1 - r, skip=lambda kb, qa: kb > qa,
            causal=lambda kb, qa: kb == qa, source=lambda rank, step, n: (rank - step) % n, order=(0, 1)):
    """Zigzag ring attention as a learner writes it, with the knob of one mistake turned."""
    rank, world = dist.get_rank(), dist.get_world_size()
    c = q.shape[-2] // 2
    mine = (rank, late(rank, world))
    kv = torch.stack([k, v])
    running = [None, None]
    for step in range(world):
        if step < world - 1:
            nxt = torch.empty_like(kv)
            works = [dist.isend(kv, (rank + 1) % world), dist.irecv(nxt, (rank - 1) % world)]
        src = source(rank, step, world)
        for a, qa in enumerate(mine):
            for b, kb in enumerate((src, late(src, world))):
                if skip(kb, qa):
                    continue
                o, m = S.blockwise_attention(q[..., a * c:(a + 1) * c, :], kv[0][..., b * c:(b + 1) * c, :],
                                             kv[1][..., b * c:(b + 1) * c, :], block, causal=causal(kb, qa))
                running[a] = (o, m) if running[a] is None else S.merge_attention(*running[a], o, m)
        if step < world - 1:
            for w in works:
                w.wait()
            kv = nxt
    return tuple(torch.cat([running[i][j] for i in order], -2 + j) for j in (0, 1))


def zigzag_late_chunk_at_n_plus_r(dist, q, k, v, block):
    """Rank r's second chunk taken to be chunk N + r ("the second half, in order"), where zigzag gives it 2N-1-r."""
    return _zigzag(dist, q, k, v, block, late=lambda r, n: n + r)


def zigzag_skipping_key_chunks_not_before_the_query(dist, q, k, v, block):
    """Skips key chunk kb when kb >= qa: the chunk's own keys, its diagonal, never attended to."""
    return _zigzag(dist, q, k, v, block, skip=lambda kb, qa: kb >= qa)


def zigzag_causal_on_every_pair(dist, q, k, v, block):
    """causal=True for every pair it computes: earlier chunks' keys masked as if they were on the diagonal."""
    return _zigzag(dist, q, k, v, block, causal=lambda kb, qa: True)


def zigzag_blocks_from_the_right(dist, q, k, v, block):
    """After step t the block held taken to be rank (r + t) % N's: it came from the left, rank (r - t) % N."""
    return _zigzag(dist, q, k, v, block, source=lambda rank, step, n: (rank + step) % n)


def zigzag_returning_the_late_chunk_first(dist, q, k, v, block):
    """The two chunks' outputs concatenated late chunk first."""
    return _zigzag(dist, q, k, v, block, order=(1, 0))


def blockwise_trimmed_to_whole_blocks(q, k, v, block, causal=False):
    """The sequence trimmed to a multiple of block first, "so that the blocks divide it": the last queries and keys
    are dropped."""
    whole = q.shape[-2] // block * block
    return S.blockwise_attention(q[..., :whole, :], k[..., :whole, :], v[..., :whole, :], block, causal=causal)


# ---- ring_attention_backward ---------------------------------------------------------------------------------
def _grads(dist, q, k, v, out, lse, dout, block, *, scaled=True, delta_of="dO∘O", normaliser="lse", home="right",
           dk_transposed=True, own_block_only=False):
    """Ring attention's backward as a learner writes it, with the knob of one mistake turned."""
    rank, world = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % world, (rank - 1) % world
    scale = q.shape[-1] ** -0.5
    delta = ((dout * out) if delta_of == "dO∘O" else dout).sum(-1, keepdim=True)        # (b, h, s/N, 1)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for step in range(world):
        for j in range(0, k.shape[-2], block):
            kj, vj = k[..., j:j + block, :], v[..., j:j + block, :]
            s = q @ kj.transpose(-2, -1) * scale
            p = torch.exp(s - (lse if normaliser == "lse" else s.logsumexp(-1)).unsqueeze(-1))
            ds = p * (dout @ vj.transpose(-2, -1) - delta) * (scale if scaled else 1.0)
            dq += ds @ kj
            if own_block_only and step:
                continue
            dv[..., j:j + block, :] += p.transpose(-2, -1) @ dout
            dk[..., j:j + block, :] += (ds.transpose(-2, -1) if dk_transposed else ds) @ q
        if own_block_only and step < world - 1:              # K and V travel; dK and dV stay
            k, v = _pass_right(dist, torch.stack([k, v]))
        if home == "none" and step < world - 1:              # all four travel, and no hop after the last step
            k, v, dk, dv = _pass_right(dist, torch.stack([k, v, dk, dv]))
        if own_block_only or home == "none":
            continue
        to, frm = (right, left) if home == "right" else (left, right)
        moving = torch.stack([k, v, dk, dv]) if step < world - 1 else torch.stack([dk, dv])
        got = torch.empty_like(moving)
        work = dist.isend(moving, right if step < world - 1 else to)
        dist.recv(got, left if step < world - 1 else frm)
        work.wait()
        if step < world - 1:
            k, v, dk, dv = got
        else:
            dk, dv = got
    return dq, dk, dv


def backward_without_the_scale_in_ds(dist, q, k, v, out, lse, dout, block):
    """dS = P ∘ (dO·Vᵀ - D), the softmax's derivative without the chain rule's 1/√d from the scores."""
    return _grads(dist, q, k, v, out, lse, dout, block, scaled=False)


def backward_row_term_from_do_alone(dist, q, k, v, out, lse, dout, block):
    """D = rowsum(dO), the O of rowsum(dO ∘ O) forgotten."""
    return _grads(dist, q, k, v, out, lse, dout, block, delta_of="dO")


def backward_without_the_row_term(dist, q, k, v, out, lse, dout, block):
    """dS = P ∘ (dO·Vᵀ) · scale: D left out altogether (O zeroed makes rowsum(dO ∘ O) zero)."""
    return _grads(dist, q, k, v, torch.zeros_like(out), lse, dout, block)


def backward_normalising_each_block_alone(dist, q, k, v, out, lse, dout, block):
    """P recomputed as each key block's own softmax, exp(S - logsumexp(S)), not with the forward's lse."""
    return _grads(dist, q, k, v, out, lse, dout, block, normaliser="block")


def backward_gradients_home_leftwards(dist, q, k, v, out, lse, dout, block):
    """The last hop of dK and dV sent to the left, "back where the block came from": the ring only goes right."""
    return _grads(dist, q, k, v, out, lse, dout, block, home="left")


def backward_home_hop_forgotten(dist, q, k, v, out, lse, dout, block):
    """K, V, dK and dV travel stacked for N-1 steps, and the loop ends there: dK and dV returned where the ring left
    them, one hop short of home."""
    return _grads(dist, q, k, v, out, lse, dout, block, home="none")


def backward_gradients_of_the_own_block(dist, q, k, v, out, lse, dout, block):
    """K and V travel, and dK, dV are made only while the rank holds its own block ("the visitors' gradients belong
    to their owners"): the other ranks' queries never add their share."""
    return _grads(dist, q, k, v, out, lse, dout, block, own_block_only=True)


def backward_dk_as_ds_times_q(dist, q, k, v, out, lse, dout, block):
    """dK += dS · Q, the transpose of dS forgotten."""
    return _grads(dist, q, k, v, out, lse, dout, block, dk_transposed=False)


# ---- ulysses_attention ---------------------------------------------------------------------------------------
def _ulysses(dist, q, k, v, block, *, heads="contiguous", contiguous=True, sources_reversed=False, causal=False,
             buffer_like_the_input=False, back="inverse", attend="after"):
    """Ulysses as a learner writes it, with the knob of one mistake turned."""
    world = dist.get_world_size()
    b, h, c, d = q.shape

    def split(x):                                                   # (b, h, c, d) -> (N, b, h/N, c, d)
        if heads == "round-robin":
            x = x.reshape(b, h // world, world, c, d).transpose(1, 2)      # head j·N + i to rank i
        else:
            x = x.reshape(b, world, h // world, c, d)
        x = x.transpose(0, 1)
        return x.contiguous() if contiguous else x

    def to_heads(x):
        send = split(x)
        got = torch.empty_like(x) if buffer_like_the_input else torch.empty(send.shape, dtype=x.dtype, device=x.device)
        dist.all_to_all_single(got, send)
        got = got.flip(0) if sources_reversed else got
        return got.permute(1, 2, 0, 3, 4).reshape(b, h // world, world * c, d)

    if attend == "before":                 # the local chunk attended first, then the layout exchanged anyway
        q, k, v = (S.blockwise_attention(q, k, v, block)[0], k, v)
        return _ulysses(dist, q, k, v, block, back=back, attend="skip")
    o = to_heads(q) if attend == "skip" else \
        S.blockwise_attention(to_heads(q), to_heads(k), to_heads(v), block, causal=causal)[0]   # (b, h/N, s, d)
    if back == "same":                     # the inputs' all-to-all again, for the way back
        return to_heads(o.reshape(b, h, c, d))
    send = o.reshape(b, h // world, world, c, d).permute(2, 0, 1, 3, 4).contiguous()
    got = torch.empty_like(send)
    dist.all_to_all_single(got, send)
    if back == "flattened":
        return got.flatten(0, 2).view(b, h, c, d)
    return got.transpose(0, 1).reshape(b, h, c, d)


def ulysses_output_flattened_back(dist, q, k, v, block):
    """The way back read with .flatten(0, 2).view(b, h, c, d), "the slices were already in head order": the head
    groups stay in front of the batch."""
    return _ulysses(dist, q, k, v, block, back="flattened")


def ulysses_the_same_all_to_all_back(dist, q, k, v, block):
    """The output sent back by the inputs' all-to-all, "the same exchange undoes itself": it splits heads again,
    where the way back must split the sequence."""
    return _ulysses(dist, q, k, v, block, back="same")


def ulysses_attending_before_the_exchange(dist, q, k, v, block):
    """Each rank attends its own chunk of the sequence first, then does the all-to-alls: its queries never meet
    the other chunks' keys."""
    return _ulysses(dist, q, k, v, block, attend="before")


def ulysses_heads_dealt_round_robin(dist, q, k, v, block):
    """q, k and v laid out (b, h/N, N, c, d) before the all-to-all: rank i gets heads i, N + i, ..., where the
    way back returns contiguous groups of heads."""
    return _ulysses(dist, q, k, v, block, heads="round-robin")


def ulysses_sending_views(dist, q, k, v, block):
    """x.reshape(...).transpose(0, 1) handed to all_to_all_single as it is, a view that is not contiguous."""
    return _ulysses(dist, q, k, v, block, contiguous=False)


def ulysses_reading_the_sources_backwards(dist, q, k, v, block):
    """The received slices read last rank first ("slice i came from rank N-1-i"): the sequence put together in
    the wrong order, so each rank gets another's queries back."""
    return _ulysses(dist, q, k, v, block, sources_reversed=True)


def ulysses_with_a_decoders_mask(dist, q, k, v, block):
    """blockwise_attention(..., causal=True), as zigzag's and a decoder's attention are: this layer's is not
    masked."""
    return _ulysses(dist, q, k, v, block, causal=True)


def ulysses_receiving_into_a_tensor_like_q(dist, q, k, v, block):
    """got = torch.empty_like(q), shaped (b, h, s/N, d), for what arrives laid out (N, b, h/N, s/N, d)."""
    return _ulysses(dist, q, k, v, block, buffer_like_the_input=True)


MISTAKES = [
    Attempt("merge_attention", merge_giving_the_running_output_the_blocks_weight, ("weights swapped", "reversed")),
    Attempt("merge_attention", merge_keeping_the_larger_lse, ("log of a sum", "logaddexp")),
    Attempt("merge_attention", merge_adding_the_lses, ("log of a sum", "logaddexp")),
    Attempt("merge_attention", merge_by_the_ratio_of_sums, "exp overflowed"),
    Attempt("merge_attention", merge_by_exponentials_of_the_sums, "e^lse was formed"),
    Attempt("merge_attention", merge_weighing_against_the_smaller, ("exp overflowed", "a weight e^(the gap)")),
    Attempt("merge_attention", merge_softmax_of_the_pair_unnormalised, "do not sum to 1"),
    Attempt("merge_attention", merge_by_averaging_the_outputs, ("alike", "equal weights")),
    Attempt("merge_attention", merge_weights_of_shape_b_h_s, ("unsqueeze", "lines shapes up")),
    Attempt("merge_attention", merge_subtracting_one_global_max, ("division by zero", "0 / 0", "underflow")),
    Attempt("blockwise_attention", blockwise_trimmed_to_whole_blocks, ("never processed", "never attended key block")),
    Attempt("blockwise_attention", blockwise_masking_the_diagonal_too,
            (*NAN_FROM_A_MASKED_ROW, "hides the diagonal too")),
    Attempt("blockwise_attention", blockwise_without_the_scale, "√d"),
    Attempt("blockwise_attention", blockwise_scaled_by_one_over_d, "√d"),
    Attempt("blockwise_attention", blockwise_masking_every_tile, ("earlier key blocks", "off the diagonal")),
    Attempt("blockwise_attention", blockwise_with_softmax_by_exp, ("overflow",)),
    Attempt("blockwise_attention", blockwise_causal_key_blocks_below_i, ("the diagonal tile", "no key",
                                                                         "range(0, i) is empty at i = 0")),
    Attempt("ring_attention", ring_sending_before_receiving, ("every rank is blocked", "deadlock")),
    Attempt("ring_attention", ring_receiving_from_the_right, "who is whose neighbour"),
    Attempt("ring_attention", ring_keeping_only_the_last_block, ("last block only", "never merged")),
    Attempt("ring_attention", ring_never_attending_to_the_last_block, ("received last", "N-1 of the N blocks")),
    Attempt("ring_attention", ring_passing_k_only, ("V never travels", "its own V")),
    Attempt("ring_attention", ring_output_merged_lse_dropped, "was not kept"),
    Attempt("ring_attention_overlap", overlap_waiting_for_everything_at_the_end, ("before its wait()", "irecv")),
    Attempt("ring_attention_overlap", overlap_attending_to_what_arrived, ("own block", "never attended")),
    Attempt("ring_attention_overlap", overlap_posting_on_the_last_step_too, "N-1 = "),
    Attempt("ring_attention_overlap", overlap_k_and_v_received_crosswise, ("K and V swapped", "holds what")),
    Attempt("ring_attention_overlap", overlap_computing_the_block_after_next, "waiting on K/V transfers"),
    Attempt("zigzag_attention", zigzag_late_chunk_at_n_plus_r, ("N + r where", "the late chunk's index")),
    Attempt("zigzag_attention", zigzag_skipping_key_chunks_not_before_the_query, ("diagonal", "own keys"),
            named_yet=False),
    Attempt("zigzag_attention", zigzag_causal_on_every_pair, ("masked", "mask")),
    Attempt("zigzag_attention", zigzag_blocks_from_the_right, ("(r - t) % N", "came from")),
    Attempt("zigzag_attention", zigzag_returning_the_late_chunk_first, ("holds what", "swapped", "reversed")),
    Attempt("ring_attention_backward", backward_without_the_scale_in_ds, "√d, the attention scale"),
    Attempt("ring_attention_backward", backward_row_term_from_do_alone, ("the row term", "O left out")),
    Attempt("ring_attention_backward", backward_without_the_row_term, "the row term D left out"),
    Attempt("ring_attention_backward", backward_normalising_each_block_alone, ("forward's lse", "log-sum-exp")),
    Attempt("ring_attention_backward", backward_gradients_home_leftwards, ("holds what rank", "right neighbour",
                                                                           "sent home to the left")),
    Attempt("ring_attention_backward", backward_home_hop_forgotten, "one more hop"),
    Attempt("ring_attention_backward", backward_gradients_of_the_own_block, "from its own queries alone"),
    Attempt("ring_attention_backward", backward_dk_as_ds_times_q, ("dS·Q", "transpose of dS",
                                                                   "fits only transposed")),
    Attempt("ulysses_attention", ulysses_output_flattened_back, "the head groups in front of the batch"),
    Attempt("ulysses_attention", ulysses_the_same_all_to_all_back, ("splits heads again", "sequence split")),
    Attempt("ulysses_attention", ulysses_attending_before_the_exchange, ("other chunks' keys", "before the exchange")),
    Attempt("ulysses_attention", ulysses_reading_the_sources_backwards, ("holds what rank", "wrong rank index")),
    Attempt("ulysses_attention", ulysses_with_a_decoders_mask, ("causal mask", "masked")),
    Attempt("ulysses_attention", ulysses_receiving_into_a_tensor_like_q, ("shaped like q", "(b, h, s/N, d) buffer",
                                                                          "a buffer made with torch.empty_like(x)")),
]

# Wrong answers ulysses_attention passes on some draws, a defect of its cases rather than of these attempts: with
# h = N heads on every case, heads dealt round-robin are the contiguous split; with b = 1 on every case, the
# transposed view is contiguous. (Seed 2 draws both, 1 seed in 8 each: a case with b = 2 and h = 2N would catch
# them.) Named, where they fail, by "round-robin" and "contiguous"; kept out of MISTAKES, which must fail every seed.
PASSED_ON_SOME_DRAWS = [
    Attempt("ulysses_attention", ulysses_heads_dealt_round_robin, ("round-robin", "holds what")),
    Attempt("ulysses_attention", ulysses_sending_views, "contiguous"),
]
