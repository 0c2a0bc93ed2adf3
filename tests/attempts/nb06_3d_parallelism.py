"""Notebook 06 (3D parallelism): first attempts, written from the notebook alone.

The 2-D and 3-D training attempts share one learner's implementation (``_tp_dp`` and ``_train_3d``), each
attempt switching on the one thing that learner got wrong.
"""
import torch
import torch.nn.functional as F

from lib import sim
from lib.real.backends import device_mesh
from lib.analytic.formulas import activation_bytes_per_layer, first_stage_in_flight, model_state_breakdown, model_state_bytes
from lib.planner import PUBLISHED_RUNS, Cluster, H100_80GB, Plan, PlanError, best_plan, estimate
from lib.units import fmt_bytes, fmt_time
from puzzles import three_d as P
from puzzles.parallel_gpt import tp_copy, tp_reduce

AXES = ("dp", "pp", "tp")


# ---------------------------------------------------------------- puzzle 1: mesh_coordinates

def mesh_coordinates_innermost_first(dist, shape):
    r, coords = dist.get_rank(), []
    for size in reversed(shape):
        coords.append(r % size)
        r //= size
    return tuple(coords)                      # forgot to reverse


def mesh_coordinates_column_major(dist, shape):
    r, coords = dist.get_rank(), []
    for size in shape:                        # peeled from the outermost
        coords.append(r % size)
        r //= size
    return tuple(coords)


def mesh_coordinates_list(dist, shape):
    r, coords = dist.get_rank(), []
    for size in reversed(shape):
        coords.insert(0, r % size)
        r //= size
    return coords                             # a list, not a tuple


def mesh_coordinates_no_modulo(dist, shape):
    r = dist.get_rank()
    coords = []
    for i in range(len(shape)):
        stride = 1
        for size in shape[i + 1:]:
            stride *= size
        coords.append(r // stride)            # forgot % shape[i]
    return tuple(coords)


def mesh_coordinates_unravel(dist, shape):
    return tuple(torch.unravel_index(torch.tensor(dist.get_rank()), tuple(shape)))   # tensors, not ints


def mesh_coordinates_strides(dist, shape):
    # correct: divide by the strides from the outermost, keep the remainder
    r = dist.get_rank()
    stride = dist.get_world_size()
    coords = []
    for size in shape:
        stride //= size
        coords.append(r // stride)
        r %= stride
    return tuple(coords)


# ---------------------------------------------------------------- puzzle 2: process_groups

def _rank_of(d, p, t, dp, pp, tp):
    return (d * pp + p) * tp + t


def process_groups_only_mine(dist, dp, pp, tp):
    r = dist.get_rank()
    t, p, d = r % tp, (r // tp) % pp, r // (tp * pp)
    return {
        "tp": dist.new_group([_rank_of(d, p, i, dp, pp, tp) for i in range(tp)]),
        "pp": dist.new_group([_rank_of(d, i, t, dp, pp, tp) for i in range(pp)]),
        "dp": dist.new_group([_rank_of(i, p, t, dp, pp, tp) for i in range(dp)]),
    }


def process_groups_dp_innermost(dist, dp, pp, tp):
    # numbered the ranks with dp innermost: rank = (t * pp + p) * dp + d
    r = dist.get_rank()
    d, p, t = r % dp, (r // dp) % pp, r // (dp * pp)
    mine = {}
    for a in range(pp):
        for b in range(dp):
            g = dist.new_group([(i * pp + a) * dp + b for i in range(tp)])
            if (a, b) == (p, d):
                mine["tp"] = g
    for a in range(tp):
        for b in range(dp):
            g = dist.new_group([(a * pp + i) * dp + b for i in range(pp)])
            if (a, b) == (t, d):
                mine["pp"] = g
    for a in range(tp):
        for b in range(pp):
            g = dist.new_group([(a * pp + b) * dp + i for i in range(dp)])
            if (a, b) == (t, p):
                mine["dp"] = g
    return mine


def process_groups_rotated_order(dist, dp, pp, tp):
    # every group made, but starting from my own TP group (so the order differs between ranks)
    r = dist.get_rank()
    t, p, d = r % tp, (r // tp) % pp, r // (tp * pp)
    mine = {}
    tp_groups = [[_rank_of(a, b, i, dp, pp, tp) for i in range(tp)] for a in range(dp) for b in range(pp)]
    start = d * pp + p
    for k in range(len(tp_groups)):
        ranks = tp_groups[(start + k) % len(tp_groups)]
        g = dist.new_group(ranks)
        if r in ranks:
            mine["tp"] = g
    for a in range(dp):
        for c in range(tp):
            ranks = [_rank_of(a, i, c, dp, pp, tp) for i in range(pp)]
            g = dist.new_group(ranks)
            if r in ranks:
                mine["pp"] = g
    for b in range(pp):
        for c in range(tp):
            ranks = [_rank_of(i, b, c, dp, pp, tp) for i in range(dp)]
            g = dist.new_group(ranks)
            if r in ranks:
                mine["dp"] = g
    return mine


def process_groups_pp_stride(dist, dp, pp, tp):
    r = dist.get_rank()
    world = dp * pp * tp
    mine = {}
    for start in range(0, world, tp):
        ranks = list(range(start, start + tp))
        g = dist.new_group(ranks)
        if r in ranks:
            mine["tp"] = g
    for a in range(dp):
        for c in range(pp):                   # pp groups: stride pp instead of tp
            ranks = [a * pp * tp + c + i * pp for i in range(pp)]
            g = dist.new_group(ranks)
            if r in ranks:
                mine["pp"] = g
    for c in range(pp * tp):
        ranks = list(range(c, world, pp * tp))
        g = dist.new_group(ranks)
        if r in ranks:
            mine["dp"] = g
    return mine


def process_groups_returns_ranks(dist, dp, pp, tp):
    r = dist.get_rank()
    mine = {}
    for name, groups in (
            ("tp", [[_rank_of(a, b, i, dp, pp, tp) for i in range(tp)] for a in range(dp) for b in range(pp)]),
            ("pp", [[_rank_of(a, i, c, dp, pp, tp) for i in range(pp)] for a in range(dp) for c in range(tp)]),
            ("dp", [[_rank_of(i, b, c, dp, pp, tp) for i in range(dp)] for b in range(pp) for c in range(tp)])):
        for ranks in groups:
            dist.new_group(ranks)
            if r in ranks:
                mine[name] = ranks            # returned the rank lists
    return mine


def process_groups_mesh(dist, dp, pp, tp):
    mesh = device_mesh(dist, (dp, pp, tp), AXES)
    return {axis: mesh[axis].get_group() for axis in AXES}


def process_groups_itertools(dist, dp, pp, tp):
    # correct: a rank table as nested lists, each axis's groups made in one fixed order
    r = dist.get_rank()
    table = [[[(d * pp + p) * tp + t for t in range(tp)] for p in range(pp)] for d in range(dp)]
    mine = {}
    for d in range(dp):
        for p in range(pp):
            ranks = table[d][p]
            g = dist.new_group(ranks)
            if r in ranks:
                mine["tp"] = g
    for d in range(dp):
        for t in range(tp):
            ranks = [table[d][p][t] for p in range(pp)]
            g = dist.new_group(ranks)
            if r in ranks:
                mine["pp"] = g
    for p in range(pp):
        for t in range(tp):
            ranks = [table[d][p][t] for d in range(dp)]
            g = dist.new_group(ranks)
            if r in ranks:
                mine["dp"] = g
    return mine


# ---------------------------------------------------------------- puzzle 3: tp_dp_train

def _tp_dp(dist, weights, batch, targets, dp, tp, steps, lr, *, dp_group_all=False, divide=True, swap=False,
           bias_inside=False, reduce_over_tp=False, fc2_rows=False):
    mesh = device_mesh(dist, (dp, tp), ("dp", "tp"))
    if swap:
        r = dist.get_rank()
        d, t = r % dp, r // dp
    else:
        d, t = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
    tp_group, dp_group = mesh["tp"].get_group(), mesh["dp"].get_group()
    shard = {
        "fc1_w": weights["fc1_w"].chunk(tp, 0)[t].clone().requires_grad_(),
        "fc1_b": weights["fc1_b"].chunk(tp, 0)[t].clone().requires_grad_(),
        "fc2_w": weights["fc2_w"].chunk(tp, 0 if fc2_rows else 1)[t].clone().requires_grad_(),
        "fc2_b": weights["fc2_b"].clone().requires_grad_(),
    }
    x, y = batch.chunk(dp)[d], targets.chunk(dp)[d]
    for _ in range(steps):
        h = F.gelu(F.linear(tp_copy(dist, x, tp_group), shard["fc1_w"], shard["fc1_b"]))
        if bias_inside:
            out = tp_reduce(dist, F.linear(h, shard["fc2_w"], shard["fc2_b"]), tp_group)
        else:
            out = tp_reduce(dist, F.linear(h, shard["fc2_w"]), tp_group) + shard["fc2_b"]
        F.mse_loss(out, y).backward()
        with torch.no_grad():
            names = list(shard)
            flat = torch.cat([shard[k].grad.reshape(-1) for k in names])
            if dp_group_all:
                dist.all_reduce(flat)
                flat /= dist.get_world_size() if divide else 1
            else:
                dist.all_reduce(flat, group=tp_group if reduce_over_tp else dp_group)
                if divide:
                    flat /= dp
            offset = 0
            for k in names:
                p = shard[k]
                p -= lr * flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
                p.grad = None
    return {k: v.detach() for k, v in shard.items()}


def tp_dp_train_world_average(dist, weights, batch, targets, dp, tp, steps, lr):
    return _tp_dp(dist, weights, batch, targets, dp, tp, steps, lr, dp_group_all=True)


def tp_dp_train_no_divide(dist, weights, batch, targets, dp, tp, steps, lr):
    return _tp_dp(dist, weights, batch, targets, dp, tp, steps, lr, divide=False)


def tp_dp_train_swapped_coords(dist, weights, batch, targets, dp, tp, steps, lr):
    return _tp_dp(dist, weights, batch, targets, dp, tp, steps, lr, swap=True)


def tp_dp_train_bias_inside(dist, weights, batch, targets, dp, tp, steps, lr):
    return _tp_dp(dist, weights, batch, targets, dp, tp, steps, lr, bias_inside=True)


def tp_dp_train_reduce_over_tp(dist, weights, batch, targets, dp, tp, steps, lr):
    return _tp_dp(dist, weights, batch, targets, dp, tp, steps, lr, reduce_over_tp=True)


def tp_dp_train_fc2_rows(dist, weights, batch, targets, dp, tp, steps, lr):
    return _tp_dp(dist, weights, batch, targets, dp, tp, steps, lr, fc2_rows=True)


def tp_dp_train_flat(dist, weights, batch, targets, dp, tp, steps, lr):
    # correct: the gradients averaged over "dp" in one flat all-reduce per step
    return _tp_dp(dist, weights, batch, targets, dp, tp, steps, lr)


# ---------------------------------------------------------------- puzzle 4: train_3d

def _train_3d(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr, *, dp_world=False, divide_dp=True,
              divide_m=True, blocking=False, global_neighbours=False, gpipe=False, whole_batch=False):
    mesh = device_mesh(dist, (dp, pp, tp), AXES)
    d, s = mesh.get_local_rank("dp"), mesh.get_local_rank("pp")
    tp_group, dp_group = mesh["tp"].get_group(), mesh["dp"].get_group()
    pp_ranks = dist.get_process_group_ranks(mesh["pp"].get_group())
    r = dist.get_rank()
    prev_rank = (r - 1 if global_neighbours else pp_ranks[s - 1]) if s > 0 else None
    next_rank = (r + 1 if global_neighbours else pp_ranks[s + 1]) if s < pp - 1 else None
    toks = tokens if whole_batch else tokens.chunk(dp)[d]
    tgts = targets if whole_batch else targets.chunk(dp)[d]
    mb_t, mb_y = toks.chunk(m), tgts.chunk(m)
    works = []

    def send(t, dst):
        if blocking:
            dist.send(t, dst)
        else:
            while works:
                works.pop().wait()
            works.append(dist.isend(t, dst))

    for _ in range(steps):
        stash = {}

        def fwd(j):
            if s == 0:
                x = mb_t[j]
            else:
                b, n = mb_t[j].shape
                x = torch.empty(b, n, stage.hidden, dtype=torch.float64)
                dist.recv(x, prev_rank)
                x.requires_grad_()
            out = stage(dist, tp_group, x)
            if s == pp - 1:
                loss = stage.loss(out, mb_y[j])
                out = loss / m if divide_m else loss
            else:
                send(out.detach(), next_rank)
            stash[j] = (x, out)

        def bwd(j):
            x, out = stash.pop(j)
            if s == pp - 1:
                out.backward()
            else:
                g = torch.empty_like(out)
                dist.recv(g, next_rank)
                out.backward(g)
            if s > 0:
                send(x.grad, prev_rank)

        if gpipe:
            for j in range(m):
                fwd(j)
            for j in range(m):
                bwd(j)
        else:
            warm = min(pp - s - 1, m)
            for j in range(warm):
                fwd(j)
            for i in range(m - warm):
                fwd(warm + i)
                bwd(i)
            for i in range(m - warm, m):
                bwd(i)
        while works:
            works.pop().wait()
        with torch.no_grad():
            params = [p for p in stage.parameters() if p.grad is not None]
            flat = torch.cat([p.grad.reshape(-1) for p in params])
            if dp_world:
                dist.all_reduce(flat)
            else:
                dist.all_reduce(flat, group=dp_group)
            if divide_dp:
                flat /= dp
            offset = 0
            for p in params:
                p -= lr * flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
                p.grad = None
    return stage


def train_3d_world_all_reduce(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    return _train_3d(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr, dp_world=True)


def train_3d_no_dp_divide(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    return _train_3d(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr, divide_dp=False)


def train_3d_no_m_divide(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    return _train_3d(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr, divide_m=False)


def train_3d_blocking(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    return _train_3d(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr, blocking=True)


def train_3d_global_neighbours(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    return _train_3d(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr, global_neighbours=True)


def train_3d_gpipe(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    return _train_3d(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr, gpipe=True)


def train_3d_whole_batch(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    return _train_3d(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr, whole_batch=True)


# ---------------------------------------------------------------- puzzle 5: plan_memory

def _plan_memory(model, plan, *, embedding=True, head="pp1", in_flight="min", zero3_buffers=True,
                 tp_all=True, t_in_acts=True, blocks="stage"):
    n_blocks = model.layers // plan.pp if blocks == "stage" else model.layers
    block_params = n_blocks * model.layer_params
    other = (model.embedding_params if embedding else 0)
    if head == "always" or (head == "pp1" and plan.pp == 1):
        other += model.head_params
    params = (block_params + other) / plan.tp if tp_all else block_params / plan.tp + other
    states = model_state_bytes(params, dp=plan.dp, zero_stage=plan.zero)
    if plan.zero == 3 and zero3_buffers:
        states += 2 * 2 * model.layer_params / plan.tp + 2 * model.layer_params / plan.tp
    kw = dict(sequence_parallel=plan.sequence_parallel, recompute=plan.recompute)
    if t_in_acts:
        kw["t"] = plan.tp
    per_block = activation_bytes_per_layer(model.seq, plan.micro_batch, model.hidden, model.heads, **kw)
    if in_flight == "min":
        flight = first_stage_in_flight(plan.pp, plan.micro_batches)
    elif in_flight == "p":
        flight = plan.pp
    else:
        flight = plan.micro_batches
    return states + n_blocks * per_block * flight


def plan_memory_no_embedding(model, plan):
    return _plan_memory(model, plan, embedding=False)


def plan_memory_head_always(model, plan):
    return _plan_memory(model, plan, head="always")


def plan_memory_in_flight_p(model, plan):
    return _plan_memory(model, plan, in_flight="p")


def plan_memory_in_flight_m(model, plan):
    return _plan_memory(model, plan, in_flight="m")


def plan_memory_no_zero3_buffers(model, plan):
    return _plan_memory(model, plan, zero3_buffers=False)


def plan_memory_tp_blocks_only(model, plan):
    return _plan_memory(model, plan, tp_all=False)


def plan_memory_acts_without_tp(model, plan):
    return _plan_memory(model, plan, t_in_acts=False)


def plan_memory_all_layers(model, plan):
    return _plan_memory(model, plan, blocks="all")


def plan_memory_breakdown(model, plan):
    # correct: the states written out per ZeRO stage by hand instead of model_state_bytes
    blocks = model.layers // plan.pp
    params = blocks * model.layer_params + model.embedding_params + (model.head_params if plan.pp == 1 else 0)
    psi = params / plan.tp
    n = plan.dp
    if plan.zero == 0:
        states = 16 * psi
    elif plan.zero == 1:
        states = 4 * psi + 12 * psi / n
    elif plan.zero == 2:
        states = 2 * psi + 14 * psi / n
    else:
        states = 16 * psi / n + 6 * model.layer_params / plan.tp
    acts = activation_bytes_per_layer(model.seq, plan.micro_batch, model.hidden, model.heads, t=plan.tp,
                                      sequence_parallel=plan.sequence_parallel, recompute=plan.recompute)
    return states + blocks * acts * min(plan.pp, plan.micro_batches)


# ---------------------------------------------------------------- puzzle 6: choose_plan

def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _choose(model, cluster, global_batch, *, key="tokens_per_second", need_fit=True, tp_space="node",
            micro=None, zeros=(0, 1, 2, 3), return_estimate=False, catch=True):
    best, best_e = None, None
    tps = _divisors(cluster.gpus_per_node if tp_space == "node" else cluster.gpus)
    for tp in tps:
        for pp in _divisors(model.layers):
            if cluster.gpus % (tp * pp):
                continue
            dp = cluster.gpus // (tp * pp)
            if global_batch % dp:
                continue
            for zero in zeros:
                for mb in (micro or _divisors(global_batch // dp)):
                    for recompute in ("none", "selective", "full"):
                        plan = Plan(tp=tp, pp=pp, dp=dp, global_batch=global_batch, zero=zero, micro_batch=mb,
                                    recompute=recompute)
                        if catch:
                            try:
                                e = estimate(model, cluster, plan)
                            except PlanError:
                                continue
                        else:
                            e = estimate(model, cluster, plan)
                        if need_fit and not e.fits:
                            continue
                        if best_e is None or getattr(e, key) > getattr(best_e, key):
                            best, best_e = plan, e
    return best_e if return_estimate else best


def choose_plan_by_mfu(model, cluster, global_batch):
    return _choose(model, cluster, global_batch, key="mfu")


def choose_plan_by_hfu(model, cluster, global_batch):
    return _choose(model, cluster, global_batch, key="hfu")


def choose_plan_ignores_fit(model, cluster, global_batch):
    return _choose(model, cluster, global_batch, need_fit=False)


def choose_plan_tp_across_nodes(model, cluster, global_batch):
    return _choose(model, cluster, global_batch, tp_space="cluster")


def choose_plan_micro_batch_one(model, cluster, global_batch):
    return _choose(model, cluster, global_batch, micro=[1])


def choose_plan_no_zero(model, cluster, global_batch):
    return _choose(model, cluster, global_batch, zeros=(0,))


def choose_plan_returns_estimate(model, cluster, global_batch):
    return _choose(model, cluster, global_batch, return_estimate=True)


def choose_plan_no_try(model, cluster, global_batch):
    return _choose(model, cluster, global_batch, catch=False)


def choose_plan_sorted(model, cluster, global_batch):
    # correct: collect every fitting (throughput, plan) and take the max
    candidates = []
    for tp in [t for t in range(1, cluster.gpus_per_node + 1) if cluster.gpus_per_node % t == 0]:
        for pp in [p for p in range(1, model.layers + 1) if model.layers % p == 0]:
            if cluster.gpus % (tp * pp):
                continue
            dp = cluster.gpus // (tp * pp)
            if dp == 0 or global_batch % dp:
                continue
            per_replica = global_batch // dp
            for mb in [b for b in range(1, per_replica + 1) if per_replica % b == 0]:
                for zero in range(4):
                    for recompute in ("none", "selective", "full"):
                        plan = Plan(tp=tp, pp=pp, dp=dp, global_batch=global_batch, zero=zero, micro_batch=mb,
                                    recompute=recompute)
                        try:
                            e = estimate(model, cluster, plan)
                        except PlanError:
                            continue
                        if e.fits:
                            candidates.append((e.tokens_per_second, len(candidates), plan))
    return max(candidates)[2] if candidates else None


ATTEMPTS = [
    ("mesh_coordinates", mesh_coordinates_innermost_first, "peeled from the innermost but forgot to reverse: innermost first"),
    ("mesh_coordinates", mesh_coordinates_column_major, "peeled sizes from the outermost dimension (column-major)"),
    ("mesh_coordinates", mesh_coordinates_list, "returned a list instead of a tuple"),
    ("mesh_coordinates", mesh_coordinates_no_modulo, "rank // stride without % size: inner coordinates too large"),
    ("mesh_coordinates", mesh_coordinates_unravel, "torch.unravel_index: a tuple of tensors, not ints"),
    ("mesh_coordinates", mesh_coordinates_strides, "correct: strides from the outermost with the remainder carried down"),
    ("process_groups", process_groups_only_mine, "each rank creates only the three groups it belongs to"),
    ("process_groups", process_groups_dp_innermost, "numbered the mesh with dp innermost instead of tp"),
    ("process_groups", process_groups_rotated_order, "made every TP group but starting from my own, so the order differs by rank"),
    ("process_groups", process_groups_pp_stride, "PP groups with stride pp instead of tp"),
    ("process_groups", process_groups_returns_ranks, "returned the rank lists instead of the group objects"),
    ("process_groups", process_groups_mesh, "used the notebook's device_mesh instead of building the groups with new_group"),
    ("process_groups", process_groups_itertools, "correct: a nested rank table, each axis's groups in one fixed order"),
    ("tp_dp_train", tp_dp_train_world_average, "averaged the gradients over the whole world, not the dp group"),
    ("tp_dp_train", tp_dp_train_no_divide, "summed over dp, forgot to divide by dp"),
    ("tp_dp_train", tp_dp_train_swapped_coords, "took d = rank % dp, t = rank // dp (coordinate order swapped)"),
    ("tp_dp_train", tp_dp_train_bias_inside, "fc2's bias inside tp_reduce (added tp times)"),
    ("tp_dp_train", tp_dp_train_reduce_over_tp, "all-reduced the gradients over the tp group instead of dp"),
    ("tp_dp_train", tp_dp_train_fc2_rows, "chunked fc2_w along dim 0 like fc1"),
    ("tp_dp_train", tp_dp_train_flat, "correct: one flat all-reduce of all gradients over dp per step"),
    ("train_3d", train_3d_world_all_reduce, "all-reduced the gradients over the world instead of the dp group"),
    ("train_3d", train_3d_no_dp_divide, "forgot to divide the DP sum by dp"),
    ("train_3d", train_3d_no_m_divide, "forgot to divide the micro-batch loss by m"),
    ("train_3d", train_3d_blocking, "blocking sends in 1F1B's steady state (deadlock)"),
    ("train_3d", train_3d_global_neighbours, "sent to rank +/- 1 instead of the next rank of my pp group"),
    ("train_3d", train_3d_gpipe, "GPipe order (all forwards, then backwards): m micro-batches in flight"),
    ("train_3d", train_3d_whole_batch, "cut the whole batch into micro-batches, not this replica's rows"),
    ("plan_memory", plan_memory_no_embedding, "forgot the embedding on the first stage"),
    ("plan_memory", plan_memory_head_always, "counted the head on the first stage even with pp > 1"),
    ("plan_memory", plan_memory_in_flight_p, "p micro-batches in flight, not min(p, m)"),
    ("plan_memory", plan_memory_in_flight_m, "m micro-batches in flight (GPipe's count)"),
    ("plan_memory", plan_memory_no_zero3_buffers, "left out ZeRO-3's gathered weights and gradient buffers"),
    ("plan_memory", plan_memory_tp_blocks_only, "divided only the blocks by tp, not the embedding"),
    ("plan_memory", plan_memory_acts_without_tp, "activations without t=plan.tp"),
    ("plan_memory", plan_memory_all_layers, "counted every layer of the model, not layers // pp"),
    ("plan_memory", plan_memory_breakdown, "correct: ZeRO's per-stage bytes written out by hand"),
    ("choose_plan", choose_plan_by_mfu, "picked the highest MFU instead of tokens per second"),
    ("choose_plan", choose_plan_by_hfu, "picked the highest HFU"),
    ("choose_plan", choose_plan_ignores_fit, "forgot to keep only plans that fit (e.fits)"),
    ("choose_plan", choose_plan_tp_across_nodes, "tp over divisors of the whole cluster, not of a node"),
    ("choose_plan", choose_plan_micro_batch_one, "only tried micro_batch = 1"),
    ("choose_plan", choose_plan_no_zero, "only tried zero = 0"),
    ("choose_plan", choose_plan_returns_estimate, "returned the estimate instead of its plan"),
    ("choose_plan", choose_plan_no_try, "did not catch PlanError"),
    ("choose_plan", choose_plan_sorted, "correct: collects every fitting plan and takes the max throughput"),
]
