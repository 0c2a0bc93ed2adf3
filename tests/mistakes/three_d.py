"""Realistic first attempts at notebook 06's puzzles (3D parallelism), none of them in tests/wrong.

Where an attempt is the reference with one thing changed, it runs the reference through a stand-in (a `dist`, a stage
or a model that does the one thing differently), so the mistake is the only difference.
"""

import itertools
import math

import torch
import torch.nn.functional as F

import solutions.three_d as S
from lib.real.backends import device_mesh
from lib.analytic.formulas import activation_bytes_per_layer, first_stage_in_flight, model_state_bytes
from lib.planner import Plan, PlanError, estimate
from puzzles.parallel_gpt import tp_reduce
from tests.cheats.three_d import _train_3d_in_order
from tests.mistakes import Attempt

LAYOUT = ("holds what", "innermost-first", "reversed", "in the wrong places")


# ---- mesh_coordinates ----------------------------------------------------------------------------------------
def coordinates_innermost_first(dist, shape):
    """Peels the axes off from the last with divmod, as the hint says, and returns them in the order peeled."""
    rank, coords = dist.get_rank(), []
    for size in reversed(shape):
        rank, c = divmod(rank, size)
        coords.append(c)
    return tuple(coords)


def _strided(rank, shape, stride_of, modulo=True):
    """Each coordinate as rank // stride % size, with the learner's stride."""
    return tuple(rank // stride_of(i) % size if modulo else rank // stride_of(i) for i, size in enumerate(shape))


def coordinates_without_the_remainder(dist, shape):
    """c_i = rank // (product of the later sizes): right for the outermost axis, past the end of the others."""
    return _strided(dist.get_rank(), shape, lambda i: math.prod(shape[i + 1:]), modulo=False)


def coordinates_dividing_by_the_sizes_from_its_own_axis_on(dist, shape):
    """c_i = rank // prod(shape[i:]) % shape[i]: the stride of an axis taken with the axis's own size in it."""
    return _strided(dist.get_rank(), shape, lambda i: math.prod(shape[i:]))


def coordinates_dividing_by_world_over_size(dist, shape):
    """The stride of axis i taken as world // shape[i] ("how many ranks share a coordinate"): right for the
    outermost axis only."""
    world = dist.get_world_size()
    return _strided(dist.get_rank(), shape, lambda i: world // shape[i])


def coordinates_by_true_division(dist, shape):
    """rank / stride % size: Python 3's / makes floats (1.5), where // keeps whole coordinates."""
    rank = dist.get_rank()
    return tuple(rank / math.prod(shape[i + 1:]) % size for i, size in enumerate(shape))


# ---- process_groups -----------------------------------------------------------------------------------------
def _at(dp, pp, tp):
    return lambda d, p, t: (d * pp + p) * tp + t


def _groups(dist, members: dict, keep=lambda rank, ranks: rank in ranks):
    """Every rank creates every group of every axis in the same order, keeping those `keep` picks."""
    rank, out = dist.get_rank(), {}
    for axis, lists in members.items():
        for ranks in lists:
            group = dist.new_group(ranks)
            if keep(rank, ranks):
                out[axis] = group
    return out


def _members(dp, pp, tp, at):
    """The ranks of every TP, PP and DP group, with `at` mapping (d, p, t) to a rank."""
    return {"tp": [[at(d, p, t) for t in range(tp)] for d in range(dp) for p in range(pp)],
            "pp": [[at(d, p, t) for p in range(pp)] for d in range(dp) for t in range(tp)],
            "dp": [[at(d, p, t) for d in range(dp)] for p in range(pp) for t in range(tp)]}


def groups_without_the_membership_test(dist, dp, pp, tp):
    """groups[axis] = dist.new_group(ranks) for every group in turn, no `if rank in ranks`: each rank keeps the
    last group made along each axis, its own or not."""
    return _groups(dist, _members(dp, pp, tp, _at(dp, pp, tp)), keep=lambda rank, ranks: True)


def groups_with_dp_stride_tp(dist, dp, pp, tp):
    """DP groups as ranks tp apart ("the same t on every replica"), forgetting that a replica spans pp·tp ranks."""
    members = _members(dp, pp, tp, _at(dp, pp, tp))
    members["dp"] = [[p * tp + t + d * tp for d in range(dp)] for p in range(pp) for t in range(tp)]
    return _groups(dist, members)


def groups_with_pipeline_neighbours_adjacent(dist, dp, pp, tp):
    """PP groups of consecutive ranks ("the next stage is rank + 1"): with TP innermost, rank + 1 is a TP peer."""
    members = _members(dp, pp, tp, _at(dp, pp, tp))
    members["pp"] = [[(d * tp + t) * pp + p for p in range(pp)] for d in range(dp) for t in range(tp)]
    return _groups(dist, members)


def groups_with_tp_varying_slowest(dist, dp, pp, tp):
    """Ranks laid out as rank = (t·pp + p)·dp + d, TP outermost: TP groups span nodes, DP groups are neighbours."""
    return _groups(dist, _members(dp, pp, tp, lambda d, p, t: (t * pp + p) * dp + d))


def groups_as_rank_lists(dist, dp, pp, tp):
    """Returns each axis's list of ranks, mistaking it for the group: collectives take the handle new_group
    returns."""
    rank = dist.get_rank()
    return {axis: next(r for r in lists if rank in r) for axis, lists in _members(dp, pp, tp, _at(dp, pp, tp)).items()}


# ---- tp_dp_train ----------------------------------------------------------------------------------------------
def _tp_dp(dist, weights, batch, targets, dp, tp, steps, lr, *, bias_before_g=False, g=True, clear=True,
           average_over="dp", fc1_dim=0, rows_of="d", fc2_dim=1):
    """tp_dp_train as a learner writes it, with the knob of one mistake turned."""
    mesh = device_mesh(dist, (dp, tp), ("dp", "tp"))
    d, t = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
    groups = {"tp": mesh["tp"].get_group(), "dp": mesh["dp"].get_group(), "world": None}
    dims = {"fc1_w": fc1_dim, "fc1_b": 0, "fc2_w": fc2_dim}
    w = {name: (value.chunk(tp, dims[name])[t] if name in dims else value).clone().requires_grad_()
         for name, value in weights.items()}
    mine = {"d": d, "t": t}[rows_of]
    x, y = batch.chunk(dp)[mine], targets.chunk(dp)[mine]
    for _ in range(steps):
        partial = F.linear(F.gelu(F.linear(x, w["fc1_w"], w["fc1_b"])), w["fc2_w"])
        if bias_before_g:
            partial = partial + w["fc2_b"]
        out = tp_reduce(dist, partial, groups["tp"]) if g else partial
        if not bias_before_g:
            out = out + w["fc2_b"]
        F.mse_loss(out, y).backward()
        with torch.no_grad():
            for p in w.values():
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=groups[average_over])
                p.sub_(lr * p.grad)
                if clear:
                    p.grad = None
    return {name: p.detach() for name, p in w.items()}


def tp_dp_bias_on_every_tp_rank(dist, weights, batch, targets, dp, tp, steps, lr):
    """fc2's bias added to each TP rank's partial output before g's all-reduce: the sum counts it tp times
    (Megatron's RowParallelLinear adds it after the reduce)."""
    return _tp_dp(dist, weights, batch, targets, dp, tp, steps, lr, bias_before_g=True)


def tp_dp_without_g(dist, weights, batch, targets, dp, tp, steps, lr):
    """fc2 by columns, and no all-reduce after it: each TP rank trains on its partial sum as if it were the output."""
    return _tp_dp(dist, weights, batch, targets, dp, tp, steps, lr, g=False)


def tp_dp_gradients_never_cleared(dist, weights, batch, targets, dp, tp, steps, lr):
    """The update without p.grad = None afterwards: each step's gradient adds to the last one's."""
    return _tp_dp(dist, weights, batch, targets, dp, tp, steps, lr, clear=False)


def tp_dp_averaging_over_tp(dist, weights, batch, targets, dp, tp, steps, lr):
    """The gradient average over the TP group, taken for "the group I am in": TP ranks hold different shards."""
    return _tp_dp(dist, weights, batch, targets, dp, tp, steps, lr, average_over="tp")


def tp_dp_fc1_split_by_columns(dist, weights, batch, targets, dp, tp, steps, lr):
    """fc1's weight chunked along dim 1 ("column-parallel"), forgetting that F.linear's weight is (out, in)."""
    return _tp_dp(dist, weights, batch, targets, dp, tp, steps, lr, fc1_dim=1)


def tp_dp_average_over_everyone(dist, weights, batch, targets, dp, tp, steps, lr):
    """Each gradient averaged over every rank, 'all the replicas', where TP peers hold different shards."""
    return _tp_dp(dist, weights, batch, targets, dp, tp, steps, lr, average_over="world")


def tp_dp_fc2_chunked_like_fc1(dist, weights, batch, targets, dp, tp, steps, lr):
    """Every weight chunked along dim 0 ('the output features'), fc2 too, where fc2 is cut by its input features."""
    return _tp_dp(dist, weights, batch, targets, dp, tp, steps, lr, fc2_dim=0)


def tp_dp_rows_by_the_tp_coordinate(dist, weights, batch, targets, dp, tp, steps, lr):
    """The batch's rows chosen by the TP coordinate: TP peers train on different rows, replicas on the same."""
    return _tp_dp(dist, weights, batch, targets, dp, tp, steps, lr, rows_of="t")


# ---- train_3d -------------------------------------------------------------------------------------------------
class _Stage:
    """The learner's stage as the reference calls it, with one thing done differently; the real stage is returned."""

    def __init__(self, stage, loss_times=1.0, detach_input=False):
        self.stage, self.loss_times, self.detach_input = stage, loss_times, detach_input

    def __getattr__(self, name):
        return getattr(self.stage, name)

    def __call__(self, dist, group, x):
        return self.stage(dist, group, x.detach() if self.detach_input and x.is_floating_point() else x)

    def loss(self, out, targets):
        return self.stage.loss(out, targets) * self.loss_times


class _Dist:
    """The learner's dist as the reference calls it, with one thing done differently. keep_grads=P: the P gradients
    averaged each step are never cleared, so each step's gradient adds to the last one's before it is averaged."""

    def __init__(self, real, *, avg_as_sum=False, keep_grads=0, pp_peers_adjacent=False, avg_on_world=False):
        self.real, self.avg_as_sum, self.adjacent = real, avg_as_sum, pp_peers_adjacent
        self.avg_on_world = avg_on_world
        self.params, self.kept, self.calls = keep_grads, {}, 0

    def __getattr__(self, name):
        return getattr(self.real, name)

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        op = self.real.ReduceOp.SUM if op is None else op
        if op != self.real.ReduceOp.AVG:
            return self.real.all_reduce(tensor, op=op, group=group, async_op=async_op)
        i = self.calls % max(self.params, 1)
        self.calls += 1
        if i in self.kept:
            tensor += self.kept[i]
        self.real.all_reduce(tensor, op=self.real.ReduceOp.SUM if self.avg_as_sum else op,
                             group=None if self.avg_on_world else group)
        if self.params:
            self.kept[i] = tensor.clone()

    def isend(self, tensor, dst, group=None, tag=0):
        return self.real.isend(tensor, self._step(1) if self.adjacent else dst, group=group, tag=tag)

    def recv(self, tensor, src=None, group=None, tag=0):
        return self.real.recv(tensor, self._step(-1) if self.adjacent else src, group=group, tag=tag)

    def _step(self, by):
        return (self.real.get_rank() + by) % self.real.get_world_size()


def _warm_up_of_p_minus_r(p, pp, m):
    warm = min(pp - p, m)
    return ([("F", j) for j in range(warm)] + [kind for j in range(warm, m) for kind in (("F", j), ("B", j - warm))]
            + [("B", j) for j in range(m - warm, m)])


def train_3d_warm_up_of_p_minus_r(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    """1F1B written from a list of (F or B, micro-batch), its warm-up counted as p - r forwards (the steady state's
    first forward counted in it too): one micro-batch more in flight on every stage. Right numbers; the memory budget,
    set by the update's peak, cannot see it."""
    return _train_3d_in_order(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr, _warm_up_of_p_minus_r)


def train_3d_loss_not_over_m(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    """Each micro-batch's mean loss back-propagated as it is, not divided by m: the gradient is the sum of the m
    micro-batches' means."""
    S.train_3d(dist, _Stage(stage, loss_times=m), tokens, targets, dp, pp, tp, m, steps, lr)
    return stage


def train_3d_summing_over_dp(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    """ReduceOp.SUM over the DP group (gloo has no AVG), and the division by dp forgotten."""
    return S.train_3d(_Dist(dist, avg_as_sum=True), stage, tokens, targets, dp, pp, tp, m, steps, lr)


def train_3d_gradient_average_without_its_group(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    """dist.all_reduce(p.grad, op=ReduceOp.AVG) with the group= left out, as in plain data parallelism: on a mesh that
    is every rank, every stage and shard."""
    S.train_3d(_Dist(dist, avg_on_world=True), stage, tokens, targets, dp, pp, tp, m, steps, lr)
    return stage


def train_3d_every_replica_on_the_whole_batch(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    """The micro-batches cut from the tokens as given, tokens.chunk(m), 'the batch is already this rank's': every
    DP replica trains on every row (run here as the reference on dp copies of the batch, of which it takes one)."""
    S.train_3d(dist, stage, torch.cat([tokens] * dp), torch.cat([targets] * dp), dp, pp, tp, m, steps, lr)
    return stage


def train_3d_gradients_never_cleared(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    """The update without prm.grad = None: the next step's backward adds to the last step's averaged gradient."""
    params = len(list(stage.parameters()))
    return S.train_3d(_Dist(dist, keep_grads=params), stage, tokens, targets, dp, pp, tp, m, steps, lr)


def train_3d_next_stage_is_rank_plus_one(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    """Activations sent to rank + 1 and received from rank - 1, as in notebook 05's pipeline of one axis: on the
    mesh, rank + 1 is a TP peer."""
    return S.train_3d(_Dist(dist, pp_peers_adjacent=True), stage, tokens, targets, dp, pp, tp, m, steps, lr)


def train_3d_received_activations_without_grad(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    """The received activations used as they arrive, without x.requires_grad_(): backward never reaches them, and
    there is no x.grad to send back."""
    S.train_3d(dist, _Stage(stage, detach_input=True), tokens, targets, dp, pp, tp, m, steps, lr)
    return stage


# ---- plan_memory ----------------------------------------------------------------------------------------------
def _plan_bytes(model, plan, *, embedding=True, states_over_tp=True, gathered=3, gradient_bytes=2, master=True,
                full_keeps_nothing=False, head_always=False, embedding_over_tp=True):
    """plan_memory as a learner writes it from the hints, with the knob of one mistake turned."""
    blocks = model.layers // plan.pp
    ends = (model.embedding_params if embedding else 0) + (model.head_params if plan.pp == 1 or head_always else 0)
    first = blocks * model.layer_params + ends
    shard = first / plan.tp if states_over_tp else first
    if not embedding_over_tp:
        shard += ends - ends / plan.tp
    # 16 bytes a parameter, less what the learner forgot, the ZeRO sharding as the hint's model_state_bytes does
    states = model_state_bytes(shard, dp=plan.dp, zero_stage=plan.zero)
    shards = {"gradients": plan.dp if plan.zero >= 2 else 1, "optimizer": plan.dp if plan.zero >= 1 else 1}
    states += (gradient_bytes - 2) * shard / shards["gradients"] - (0 if master else 4 * shard / shards["optimizer"])
    if plan.zero == 3:
        states += gathered * 2 * model.layer_params / plan.tp
    if full_keeps_nothing and plan.recompute == "full":
        return states
    layer = activation_bytes_per_layer(model.seq, plan.micro_batch, model.hidden, model.heads, t=plan.tp,
                                       sequence_parallel=plan.sequence_parallel, recompute=plan.recompute)
    return states + blocks * layer * first_stage_in_flight(plan.pp, plan.micro_batches)


def memory_without_the_embedding(model, plan):
    """The first stage's blocks (and the head when pp = 1), the token and position embeddings forgotten."""
    return _plan_bytes(model, plan, embedding=False)


def memory_both_ends_on_the_first_stage(model, plan):
    """The embedding and the output head both counted, 'the model's two ends sit outside the blocks', whatever pp."""
    return _plan_bytes(model, plan, head_always=True)


def memory_vocabulary_replicated(model, plan):
    """The embedding (and head) kept whole on every TP rank, 'TP splits the blocks' matmuls': only blocks over tp."""
    return _plan_bytes(model, plan, embedding_over_tp=False)


def memory_states_not_over_tp(model, plan):
    """Model states of the whole stage on every GPU: the parameters never divided by tp."""
    return _plan_bytes(model, plan, states_over_tp=False)


def memory_zero3_two_gathered_blocks(model, plan):
    """ZeRO-3's extras as two blocks of 16-bit weights (computing, prefetched), their gradients forgotten."""
    return _plan_bytes(model, plan, gathered=2)


def memory_fp32_gradients(model, plan):
    """4 bytes a gradient ("gradients are fp32 for the optimizer"): 18 bytes a parameter before ZeRO, not 16."""
    return _plan_bytes(model, plan, gradient_bytes=4)


def memory_adam_without_a_master_copy(model, plan):
    """Adam's momentum and variance in fp32, 8 bytes, the fp32 master weights forgotten: 12 bytes a parameter."""
    return _plan_bytes(model, plan, master=False)


def memory_full_recomputation_keeps_nothing(model, plan):
    """recompute='full' taken to keep no activations at all, where each block's input stays (2sbh)."""
    return _plan_bytes(model, plan, full_keeps_nothing=True)


# ---- choose_plan ----------------------------------------------------------------------------------------------
def _plans(model, cluster, global_batch, *, whole_batch=False, zeros=(0, 1, 2, 3),
           recomputes=("none", "selective", "full")):
    """Every plan of the space a learner searches (with the knob of one mistake narrowing it), and its estimate."""
    tps = [t for t in range(1, cluster.gpus_per_node + 1) if cluster.gpus_per_node % t == 0]
    pps = [p for p in range(1, model.layers + 1) if model.layers % p == 0]
    for tp, pp in itertools.product(tps, pps):
        dp, rest = divmod(cluster.gpus, tp * pp)
        if rest or dp == 0 or global_batch % dp:
            continue
        local = global_batch // dp
        sizes = [local] if whole_batch else [b for b in range(1, local + 1) if local % b == 0]
        for b, zero, recompute in itertools.product(sizes, zeros, recomputes):
            plan = Plan(tp=tp, pp=pp, dp=dp, global_batch=global_batch, micro_batch=b, zero=zero, recompute=recompute)
            try:
                yield plan, estimate(model, cluster, plan)
            except PlanError:
                continue


def _fastest(plans):
    return max(((p, e) for p, e in plans if e.fits), key=lambda pe: pe[1].tokens_per_second)[0]


def plan_never_splitting_the_replica_batch(model, cluster, global_batch):
    """micro_batch = global_batch // dp, never searched: one micro-batch a step, so a pipeline has no micro-batches
    to overlap and its bubble is (pp-1)/1."""
    return _fastest(_plans(model, cluster, global_batch, whole_batch=True))


def plan_first_that_fits(model, cluster, global_batch):
    """Returns from inside the loops at the first plan that fits."""
    return next(p for p, e in _plans(model, cluster, global_batch) if e.fits)


def plan_fastest_fitting_or_not(model, cluster, global_batch):
    """The fastest plan, e.fits never looked at."""
    return max(_plans(model, cluster, global_batch), key=lambda pe: pe[1].tokens_per_second)[0]


def plan_least_memory(model, cluster, global_batch):
    """The plan that leaves the most memory free ("the safest"), not the fastest."""
    return min(_plans(model, cluster, global_batch), key=lambda pe: pe[1].memory)[0]


def plan_recomputing_all_or_nothing(model, cluster, global_batch):
    """recompute in ('none', 'full'), recomputation taken as on or off: selective recomputation (the attention
    scores only, Korthikanti et al. 2022) is never tried."""
    return _fastest(_plans(model, cluster, global_batch, recomputes=("none", "full")))


def plan_never_recomputing_everything(model, cluster, global_batch):
    """recompute in ('none', 'selective'): full recomputation, the slowest, taken as never worth it. Where only full
    recomputation fits (8K tokens on A100s), the search keeps nothing (found by a red team, 2026-12-08: it passed 2
    seeds of 3)."""
    return _fastest(_plans(model, cluster, global_batch, recomputes=("none", "selective")))


def plan_never_recomputing_everything_or_none(model, cluster, global_batch):
    """The same search, returning None where nothing it looked at fits, instead of max() of nothing."""
    fits = [(p, e) for p, e in _plans(model, cluster, global_batch, recomputes=("none", "selective")) if e.fits]
    return max(fits, key=lambda pe: pe[1].tokens_per_second)[0] if fits else None


# The words of each message that would name the mistake; named_yet=False where today's message does not (the
# report of issue 31 lists what each needs).
MISTAKES = [
    Attempt("mesh_coordinates", coordinates_innermost_first, ("innermost-first", "reversed")),
    Attempt("mesh_coordinates", coordinates_without_the_remainder, ("out of range", "modulo", "larger than")),
    Attempt("mesh_coordinates", coordinates_dividing_by_the_sizes_from_its_own_axis_on, ("stride",)),
    Attempt("mesh_coordinates", coordinates_dividing_by_world_over_size, ("stride",)),
    Attempt("mesh_coordinates", coordinates_by_true_division, "got float"),
    Attempt("process_groups", groups_without_the_membership_test, "group holds ranks"),
    Attempt("process_groups", groups_with_dp_stride_tp, ("pp·tp apart", "in none of")),
    Attempt("process_groups", groups_with_pipeline_neighbours_adjacent, "holds what the result['tp ranks']"),
    Attempt("process_groups", groups_with_tp_varying_slowest, ("outermost", "order of the axes")),
    Attempt("process_groups", groups_as_rank_lists, "pass a group made by dist.new_group"),
    Attempt("tp_dp_train", tp_dp_bias_on_every_tp_rank, ("counts it tp times", "bias added on every TP rank")),
    Attempt("tp_dp_train", tp_dp_without_g, ("never all-reduced", "partial sum")),
    Attempt("tp_dp_train", tp_dp_gradients_never_cleared, "at step 2"),
    Attempt("tp_dp_train", tp_dp_averaging_over_tp, ("TP group", "TP axis")),
    Attempt("tp_dp_train", tp_dp_fc1_split_by_columns, ("of fc1_w's", "input features of weights['fc1_w']")),
    Attempt("tp_dp_train", tp_dp_average_over_everyone, "reduced together, over the whole world"),
    Attempt("tp_dp_train", tp_dp_fc2_chunked_like_fc1, "cut along dim 0 (its rows)"),
    Attempt("tp_dp_train", tp_dp_rows_by_the_tp_coordinate, ("rows of", "TP coordinate")),
    Attempt("train_3d", train_3d_loss_not_over_m, "m, the number of micro-batches"),
    Attempt("train_3d", train_3d_warm_up_of_p_minus_r, "micro-batches in flight"),
    Attempt("train_3d", train_3d_summing_over_dp, "dp, the data-parallel degree"),
    Attempt("train_3d", train_3d_gradient_average_without_its_group, "ran on WORLD"),
    Attempt("train_3d", train_3d_every_replica_on_the_whole_batch, "cut from the whole batch"),
    Attempt("train_3d", train_3d_gradients_never_cleared, "at step 2"),
    Attempt("train_3d", train_3d_next_stage_is_rank_plus_one, ("wrong peer", "not in its PP group")),
    Attempt("train_3d", train_3d_received_activations_without_grad, "requires_grad"),
    Attempt("plan_memory", memory_without_the_embedding, "the embedding's parameters left out"),
    Attempt("plan_memory", memory_both_ends_on_the_first_stage, "counting the output head on the first stage"),
    Attempt("plan_memory", memory_vocabulary_replicated, "dividing only the blocks by tp"),
    Attempt("plan_memory", memory_states_not_over_tp, ("tp (the tensor-parallel degree) left out",
                                                       "tp left out of the model states")),
    Attempt("plan_memory", memory_zero3_two_gathered_blocks, "one block of 16-bit gradients (until reduce-scattered) "
                                                             "left out"),
    Attempt("plan_memory", memory_fp32_gradients, "16-bit gradients (2 B a parameter) counted twice"),
    Attempt("plan_memory", memory_adam_without_a_master_copy, "fp32 master weights (4 B a parameter) left out"),
    Attempt("plan_memory", memory_full_recomputation_keeps_nothing, "the activations (blocks × a block's"),
    Attempt("choose_plan", plan_never_splitting_the_replica_batch,
            ("the whole replica batch", "never splitting the replica batch")),
    Attempt("choose_plan", plan_first_that_fits, "a faster plan"),
    Attempt("choose_plan", plan_fastest_fitting_or_not, "Keep only the plans whose estimate fits"),
    Attempt("choose_plan", plan_least_memory, "a faster plan"),
    Attempt("choose_plan", plan_recomputing_all_or_nothing, "recompute='selective'"),
    Attempt("choose_plan", plan_never_recomputing_everything, "leaving full recomputation out"),
    Attempt("choose_plan", plan_never_recomputing_everything_or_none, "leaving full recomputation out"),
]
