"""Wrong answers to notebook 06's puzzles, each with the words its failure message must contain.

A wrong answer must fail, whatever else it gets right; tests/test_content.py runs every catalogue.
"""

import itertools

import torch
import torch.nn.functional as F

import solutions.three_d as S
from lib.real.backends import device_mesh
from lib.analytic.formulas import activation_bytes_per_layer, model_state_bytes
from lib.planner import Plan, PlanError, best_plan, estimate
from puzzles.parallel_gpt import tp_reduce


def coordinates_tp_outermost(dist, shape):
    """The first dimension innermost: consecutive ranks share a DP coordinate instead of a TP one."""
    rank, coords = dist.get_rank(), []
    for size in shape:
        rank, c = divmod(rank, size)
        coords.append(c)
    return tuple(coords)


def coordinates_from_a_mesh(dist, shape):
    """Asking a DeviceMesh: this puzzle is the arithmetic a mesh does, so dist offers nothing but rank and size."""
    mesh = device_mesh(dist, shape)
    return tuple(mesh.get_coordinate())


def groups_dp_over_the_wrong_axis(dist, dp, pp, tp):
    """The DP and PP groups swapped: DP built along the pipeline's axis."""
    groups = S.process_groups(dist, dp, pp, tp)
    groups["dp"], groups["pp"] = groups["pp"], groups["dp"]
    return groups


def groups_only_my_own(dist, dp, pp, tp):
    """Each rank creates only the groups it belongs to: torch requires every rank to create every group."""
    d, p, t = S.mesh_coordinates(dist, (dp, pp, tp))
    at = lambda i, j, k: (i * pp + j) * tp + k     # noqa: E731
    return {"tp": dist.new_group([at(d, p, k) for k in range(tp)]),
            "pp": dist.new_group([at(d, j, t) for j in range(pp)]),
            "dp": dist.new_group([at(i, p, t) for i in range(dp)])}


def groups_in_another_order(dist, dp, pp, tp):
    """Odd ranks build the DP groups first: the groups' numbers differ between ranks."""
    if dist.get_rank() % 2 == 0:
        return S.process_groups(dist, dp, pp, tp)
    d, p, t = S.mesh_coordinates(dist, (dp, pp, tp))
    at = lambda i, j, k: (i * pp + j) * tp + k     # noqa: E731
    groups = {}
    for axis, members in (("dp", [[at(i, j, k) for i in range(dp)] for j in range(pp) for k in range(tp)]),
                          ("pp", [[at(i, j, k) for j in range(pp)] for i in range(dp) for k in range(tp)]),
                          ("tp", [[at(i, j, k) for k in range(tp)] for i in range(dp) for j in range(pp)])):
        for ranks in members:
            group = dist.new_group(ranks)
            if dist.get_rank() in ranks:
                groups[axis] = group
    return groups


def tp_dp_averages_over_the_world(dist, weights, batch, targets, dp, tp, steps, lr):
    """Gradients averaged over every rank: TP ranks hold different shards, so their gradients get mixed."""
    mesh = device_mesh(dist, (dp, tp), ("dp", "tp"))
    d, t = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
    tp_group = mesh["tp"].get_group()
    split = {"fc1_w": 0, "fc1_b": 0, "fc2_w": 1}
    params = {k: (v.chunk(tp, split[k])[t] if k in split else v).clone().requires_grad_() for k, v in weights.items()}
    x, y = batch.chunk(dp)[d], targets.chunk(dp)[d]
    for _ in range(steps):
        hidden = F.gelu(F.linear(x, params["fc1_w"], params["fc1_b"]))
        out = tp_reduce(dist, F.linear(hidden, params["fc2_w"]), tp_group) + params["fc2_b"]
        F.mse_loss(out, y).backward()
        with torch.no_grad():
            for p in params.values():
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
                p -= lr * p.grad
                p.grad = None
    return {k: v.detach() for k, v in params.items()}


def tp_dp_sums_instead_of_averaging(dist, weights, batch, targets, dp, tp, steps, lr):
    """Gradients summed over DP: each step dp times too long."""
    return S.tp_dp_train(dist, weights, batch, targets, dp, tp, steps, lr * dp)


def tp_dp_all_reduces_the_input(dist, weights, batch, targets, dp, tp, steps, lr):
    """Gathers the whole batch over DP and trains on it everywhere: right weights, DP traffic of the batch."""
    mesh = device_mesh(dist, (dp, tp), ("dp", "tp"))
    d = mesh.get_local_rank("dp")
    mine = torch.zeros_like(batch)
    rows = batch.chunk(dp)[d].shape[0]
    mine[d * rows:(d + 1) * rows] = batch.chunk(dp)[d]
    dist.all_reduce(mine, group=mesh["dp"].get_group())
    return S.tp_dp_train(dist, weights, batch, targets, dp, tp, steps, lr)


class DPAverageReplaced:
    """The learner's dist, with the DP gradient average (the step's only AVG all-reduce) done by
    `average(dist, tensor, group)` instead."""

    def __init__(self, real, average):
        self.real, self.average = real, average

    def __getattr__(self, name):
        return getattr(self.real, name)

    def all_reduce(self, tensor, op=None, group=None, async_op=False):
        op = self.real.ReduceOp.SUM if op is None else op
        if op == self.real.ReduceOp.AVG:
            return self.average(self.real, tensor, group)
        return self.real.all_reduce(tensor, op=op, group=group, async_op=async_op)


def train_3d_averages_over_the_world(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    """Gradients of different stages and shards averaged together: the DP all-reduce over every rank."""
    over_the_world = lambda d, tensor, group: d.all_reduce(tensor, op=d.ReduceOp.AVG)     # noqa: E731
    return S.train_3d(DPAverageReplaced(dist, over_the_world), stage, tokens, targets, dp, pp, tp, m, steps, lr)


def train_3d_without_data_parallel(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    """No DP all-reduce: each replica trains on its own rows only."""
    return S.train_3d(DPAverageReplaced(dist, lambda d, tensor, group: None), stage, tokens, targets, dp, pp, tp, m,
                      steps, lr)


def _search(model, cluster, global_batch, score, fits, skip_unsplittable=True):
    """The reference search with another score or another test of fitting (or PlanError not caught)."""
    best, top = None, -1.0
    for tp in (1, 2, 4, 8):
        for pp in [p for p in range(1, model.layers + 1) if model.layers % p == 0]:
            dp = cluster.gpus // (tp * pp)
            if dp == 0 or dp * tp * pp != cluster.gpus or global_batch % dp:
                continue
            for b in [b for b in range(1, global_batch // dp + 1) if global_batch // dp % b == 0]:
                for zero, recompute in itertools.product(range(4), ("none", "selective", "full")):
                    plan = Plan(tp=tp, pp=pp, dp=dp, global_batch=global_batch, micro_batch=b, zero=zero,
                                recompute=recompute)
                    try:
                        e = estimate(model, cluster, plan)
                    except PlanError:
                        if skip_unsplittable:
                            continue
                        raise
                    if fits(e, cluster) and score(e) > top:
                        best, top = plan, score(e)
    return best


def plan_ignoring_activation_memory(model, cluster, global_batch):
    """Fits judged on model states alone: the fastest plans keep every activation and run out of memory."""
    states = lambda e, c: sum(v for k, v in e.breakdown.memory.items() if k != "activations") <= c.gpu.memory  # noqa: E731
    return _search(model, cluster, global_batch, lambda e: e.tokens_per_second, states)


def plan_by_mfu_counting_recomputation(model, cluster, global_batch):
    """MFU with recomputation's FLOPs counted, which is HFU: full recomputation wins where its FLOPs hide the
    data-parallel traffic, though it trains fewer tokens per second."""
    return _search(model, cluster, global_batch, lambda e: e.hardware_flops / e.step_time, lambda e, c: e.fits)


def plan_without_skipping_what_does_not_split(model, cluster, global_batch):
    """estimate() called on every plan with no try: a model whose heads tp does not divide raises PlanError."""
    return _search(model, cluster, global_batch, lambda e: e.tokens_per_second, lambda e, c: e.fits,
                   skip_unsplittable=False)


def plan_from_best_plan(model, cluster, global_batch):
    """The library's search: the answer key, refused inside a check."""
    return best_plan(model, cluster, global_batch, virtual_stages=[1]).plan


def _memory(model, plan, mistake=""):
    """plan_memory as a learner writes it, with one of the classic mistakes named by `mistake`."""
    blocks = model.layers if mistake == "all layers" else model.layers // plan.pp
    ends = model.embedding_params + (model.head_params if plan.pp == 1 else 0)
    params = (blocks * model.layer_params + ends) / plan.tp
    if mistake == "states over tp·dp":
        states = 16 * params / plan.dp
    else:
        states = model_state_bytes(params, plan.dp, 0 if mistake == "no zero" else plan.zero)
    if plan.zero == 3 and mistake != "no gathered blocks":
        states += 6 * model.layer_params / plan.tp
    recompute = "none" if mistake == "no recomputation" else plan.recompute
    sp = {"no sequence parallelism": False, "every activation over tp": True}.get(mistake, plan.sequence_parallel)
    layer = activation_bytes_per_layer(model.seq, plan.micro_batch, model.hidden, model.heads, plan.tp, sp,
                                       recompute)
    in_flight = {"one micro-batch": 1, "every micro-batch": plan.micro_batches,
                 "pp micro-batches": plan.pp}.get(mistake, min(plan.pp, plan.micro_batches))
    return states + blocks * layer * in_flight


def memory_without_zero3_gathered_blocks(model, plan):
    return _memory(model, plan, "no gathered blocks")


def memory_of_all_layers(model, plan):
    return _memory(model, plan, "all layers")


def memory_of_one_micro_batch(model, plan):
    return _memory(model, plan, "one micro-batch")


def memory_of_every_micro_batch(model, plan):
    """GPipe's count: all m micro-batches in flight, where 1F1B holds min(pp, m)."""
    return _memory(model, plan, "every micro-batch")


def memory_states_over_tp_dp_without_zero(model, plan):
    return _memory(model, plan, "states over tp·dp")


def memory_ignoring_zero(model, plan):
    """16 bytes a parameter on every GPU, as if every plan ran ZeRO-0."""
    return _memory(model, plan, "no zero")


def memory_ignoring_recomputation(model, plan):
    return _memory(model, plan, "no recomputation")


def memory_ignoring_sequence_parallelism(model, plan):
    """Korthikanti's TP term sbh(10 + 24/t + 5as/(ht)) whether or not the plan shards the norms along the sequence."""
    return _memory(model, plan, "no sequence parallelism")


def memory_dividing_every_activation_by_tp(model, plan):
    """sbh(34 + 5as/h)/t under TP alone: the norms' and dropouts' 10sbh are replicated, not split, without SP."""
    return _memory(model, plan, "every activation over tp")


WRONG = [
    ("mesh_coordinates", coordinates_tp_outermost, "expected"),
    ("mesh_coordinates", coordinates_from_a_mesh, "device_mesh (torch's DeviceMesh) does this puzzle's work"),
    ("process_groups", groups_dp_over_the_wrong_axis, "dp ranks"),
    ("process_groups", groups_only_my_own, "new_group"),
    ("process_groups", groups_in_another_order, ("new_group", "waits", "mismatch")),
    ("tp_dp_train", tp_dp_averages_over_the_world, ("expected", "none of its mesh groups")),
    ("tp_dp_train", tp_dp_sums_instead_of_averaging, "expected"),
    ("tp_dp_train", tp_dp_all_reduces_the_input, "DP axis"),
    ("train_3d", train_3d_averages_over_the_world, ("CollectiveMismatch", "none of its mesh groups")),
    ("train_3d", train_3d_without_data_parallel, "expected"),
    ("plan_memory", memory_without_zero3_gathered_blocks, "expected", "ZeRO-3's extras"),
    ("plan_memory", memory_of_all_layers, "expected", "counting all the model's layers"),
    ("plan_memory", memory_of_one_micro_batch, "expected", "one micro-batch's activations"),
    ("plan_memory", memory_of_every_micro_batch, "expected", "all m micro-batches' activations"),
    ("plan_memory", memory_states_over_tp_dp_without_zero, "expected", "whatever the ZeRO stage"),
    ("plan_memory", memory_ignoring_zero, "expected", "ignoring ZeRO"),
    ("plan_memory", memory_ignoring_recomputation, "expected", "ignoring recomputation"),
    ("plan_memory", memory_ignoring_sequence_parallelism, "expected", "ignoring sequence parallelism"),
    ("plan_memory", memory_dividing_every_activation_by_tp, "expected", "dividing every activation by tp"),
    ("choose_plan", plan_ignoring_activation_memory, "result['fits']: expected True"),
    ("choose_plan", plan_by_mfu_counting_recomputation, "result['tokens per second']", "ranking the plans by HFU"),
    ("choose_plan", plan_from_best_plan, "write that search"),
    ("choose_plan", plan_without_skipping_what_does_not_split, "try/except PlanError, skip that plan"),
]
