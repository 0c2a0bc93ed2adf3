"""Cheats on notebook 06's puzzles, each with the words its rejection must contain."""

import types

import torch
import torch.nn.functional as F

import lib
import puzzles.three_d as P
import solutions.three_d as S
from lib.real.backends import device_mesh
from lib.planner import H100_80GB, Cluster, PlanError, estimate, memory_breakdown
from lib.sim.mesh import answer_key_refused, coordinates, mesh_groups
from lib.viz.planner import plan_figure
from tests.cheats.common import everywhere, under_identity_hooks
from tests.wrong.three_d import DPAverageReplaced, _memory

_board: dict = {}
WORK_DONE_FOR_IT = "does this puzzle's work for you"


def coordinates_from_the_checks_own_arithmetic(dist, shape):
    """The function the check computes the expected coordinates with."""
    return coordinates(dist.get_rank(), shape)


def coordinates_by_unravel_index(dist, shape):
    """torch's unravel_index does the puzzle's arithmetic: the lesson is which axis varies fastest."""
    return tuple(int(c) for c in torch.unravel_index(torch.tensor(dist.get_rank()), tuple(shape)))


def coordinates_by_numpys_unravel_index(dist, shape):
    """numpy's, a C function behind a Python dispatcher."""
    import numpy
    return tuple(int(c) for c in numpy.unravel_index(dist.get_rank(), tuple(shape)))


def coordinates_by_numpys_c_function(dist, shape):
    """numpy's C function itself, its dispatcher skipped."""
    from numpy._core import _multiarray_umath
    return tuple(int(c) for c in _multiarray_umath.unravel_index(dist.get_rank(), tuple(shape)))


def coordinates_by_searching_ravel_multi_index(dist, shape):
    """numpy's ravel_multi_index, the other way round, searched for the rank."""
    import itertools

    import numpy
    return next(c for c in itertools.product(*(range(s) for s in shape))
                if numpy.ravel_multi_index(c, tuple(shape)) == dist.get_rank())


def groups_from_device_mesh(dist, dp, pp, tp):
    """The course's DeviceMesh builds every group: the oracle, not the lesson."""
    mesh = device_mesh(dist, (dp, pp, tp), ("dp", "pp", "tp"))
    return {axis: mesh.get_group(axis) for axis in ("dp", "pp", "tp")}


def groups_from_the_meshs_own_lists(dist, dp, pp, tp):
    """Every group made with dist.new_group, in torch's order, its ranks listed by lib.sim.mesh."""
    groups = {}
    for dim, axis in ((2, "tp"), (1, "pp"), (0, "dp")):
        for ranks in mesh_groups((dp, pp, tp), dim):
            group = dist.new_group(ranks)
            if dist.get_rank() in ranks:
                groups[axis] = group
    return groups


def groups_from_rank_0(dist, dp, pp, tp):
    """Rank 0 creates every group and leaves them on a module dict; the others take theirs from it."""
    rank = dist.get_rank()
    if rank == 0:
        at = lambda i, j, k: (i * pp + j) * tp + k     # noqa: E731
        _board["groups"] = [(axis, ranks, dist.new_group(ranks)) for axis, members in (
            ("tp", [[at(i, j, k) for k in range(tp)] for i in range(dp) for j in range(pp)]),
            ("pp", [[at(i, j, k) for j in range(pp)] for i in range(dp) for k in range(tp)]),
            ("dp", [[at(i, j, k) for i in range(dp)] for j in range(pp) for k in range(tp)])) for ranks in members]
    dist.barrier()
    return {axis: group for axis, ranks, group in _board["groups"] if rank in ranks}


def tp_dp_on_the_gathered_batch(dist, weights, batch, targets, dp, tp, steps, lr):
    """Gathers the batch over DP (a few KiB), then trains the whole MLP on it on every rank: no TP traffic at all,
    less DP traffic than the gradients', and the shard it returns is right."""
    mesh = device_mesh(dist, (dp, tp), ("dp", "tp"))
    d, t = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
    whole = []
    for data in (batch, targets):
        mine = torch.zeros_like(data)
        mine.chunk(dp)[d].copy_(data.chunk(dp)[d])
        dist.all_reduce(mine, group=mesh["dp"].get_group())
        whole.append(mine)
    params = {k: v.clone().requires_grad_() for k, v in weights.items()}
    for _ in range(steps):
        _sgd_step(params, *whole, lr)
    return _shard(params, tp, t)


def _mlp(params: dict, x):
    """The learner's own MLP: fc2(gelu(fc1(x))) (the puzzle's is an answer key, out of reach)."""
    return F.linear(F.gelu(F.linear(x, params["fc1_w"], params["fc1_b"])), params["fc2_w"], params["fc2_b"])


def _sgd_step(params: dict, x, y, lr, average=lambda grad: None):
    F.mse_loss(_mlp(params, x), y).backward()
    with torch.no_grad():
        for p in params.values():
            average(p.grad)
            p -= lr * p.grad
            p.grad = None


def _shard(params: dict, tp: int, t: int) -> dict:
    return {k: (v.detach().chunk(tp, P.MLP_SPLIT[k])[t] if k in P.MLP_SPLIT else v.detach()).clone()
            for k, v in params.items()}


def tp_dp_without_tensor_parallelism(dist, weights, batch, targets, dp, tp, steps, lr):
    """The whole MLP on every TP rank (the weights arrive whole), its gradients averaged over DP: no TP traffic."""
    mesh = device_mesh(dist, (dp, tp), ("dp", "tp"))
    d, t = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
    params = {k: v.clone().requires_grad_() for k, v in weights.items()}
    for _ in range(steps):
        _sgd_step(params, batch.chunk(dp)[d], targets.chunk(dp)[d], lr,
                  lambda grad: dist.all_reduce(grad, op=dist.ReduceOp.AVG, group=mesh["dp"].get_group()))
    return _shard(params, tp, t)


def tp_dp_partial_sums_through_a_module_dict(dist, weights, batch, targets, dp, tp, steps, lr):
    """g's all-reduce replaced by a module dict: each TP rank leaves its partial output there and sums the others'."""
    mesh = device_mesh(dist, (dp, tp), ("dp", "tp"))
    d, t = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
    tp_ranks = dist.get_process_group_ranks(mesh["tp"].get_group())
    dp_group = mesh["dp"].get_group()
    params = {k: (v.chunk(tp, P.MLP_SPLIT[k])[t] if k in P.MLP_SPLIT else v).clone().requires_grad_()
              for k, v in weights.items()}
    x, y = batch.chunk(dp)[d], targets.chunk(dp)[d]

    class Board(torch.autograd.Function):
        @staticmethod
        def forward(ctx, part):
            _board[dist.get_rank()] = part.clone()
            dist.barrier()
            out = sum(_board[r] for r in tp_ranks)
            dist.barrier()
            return out

        @staticmethod
        def backward(ctx, grad):
            return grad

    for _ in range(steps):
        hidden = F.gelu(F.linear(x, params["fc1_w"], params["fc1_b"]))
        F.mse_loss(Board.apply(F.linear(hidden, params["fc2_w"])) + params["fc2_b"], y).backward()
        with torch.no_grad():
            for p in params.values():
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=dp_group)
                p -= lr * p.grad
                p.grad = None
    return {k: v.detach() for k, v in params.items()}


def _train_3d_in_order(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr, order, receive_ahead=False):
    """solutions.three_d.train_3d copied on purpose, its 1F1B loops replaced by another order of forwards and
    backwards per stage: order(p, pp, m) -> [("F"|"B", j), ...]. receive_ahead: every gradient's irecv posted at
    the start of the step, each waited for at its backward."""
    mesh = device_mesh(dist, (dp, pp, tp), ("dp", "pp", "tp"))
    d, p = mesh.get_local_rank("dp"), mesh.get_local_rank("pp")
    tp_group, dp_group = mesh["tp"].get_group(), mesh["dp"].get_group()
    stages = dist.get_process_group_ranks(mesh["pp"].get_group())
    xs, ys = tokens.chunk(dp)[d].chunk(m), targets.chunk(dp)[d].chunk(m)
    first, last = p == 0, p == pp - 1
    for _ in range(steps):
        stash, sends, ahead = {}, [], {}
        if receive_ahead and not last:
            for j in range(m):
                grad = torch.empty(*xs[j].shape, stage.hidden, dtype=torch.float64, device=tokens.device)
                ahead[j] = grad, dist.irecv(grad, stages[p + 1])
        for kind, j in order(p, pp, m):
            if kind == "F":
                if first:
                    x = xs[j]
                else:
                    x = torch.empty(*xs[j].shape, stage.hidden, dtype=torch.float64, device=tokens.device)
                    dist.recv(x, stages[p - 1])
                    x.requires_grad_()
                out = stage(dist, tp_group, x)
                if last:
                    out = stage.loss(out, ys[j]) / m
                else:
                    sends.append(dist.isend(out.detach(), stages[p + 1]))
                stash[j] = (x, out)
            else:
                x, out = stash.pop(j)
                if last:
                    out.backward()
                elif receive_ahead:
                    grad, received = ahead.pop(j)
                    received.wait()
                    out.backward(grad)
                else:
                    grad = torch.empty_like(out)
                    dist.recv(grad, stages[p + 1])
                    out.backward(grad)
                if not first:
                    sends.append(dist.isend(x.grad, stages[p - 1]))
        for s in sends:
            s.wait()
        with torch.no_grad():
            for prm in stage.parameters():
                dist.all_reduce(prm.grad, op=dist.ReduceOp.AVG, group=dp_group)
                prm -= lr * prm.grad
                prm.grad = None
    return stage


def train_3d_gpipe(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    """GPipe instead of 1F1B: every forward, then every backward; m micro-batches in flight on every stage."""
    return _train_3d_in_order(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr,
                              lambda p, pp, m: [("F", j) for j in range(m)] + [("B", j) for j in range(m)])


def train_3d_extra_warm_up_receiving_ahead(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    """1F1B with p - r warm-up forwards (one more micro-batch in flight on every stage), every gradient's irecv posted
    at the start of the step: counted when the receives were posted, nothing looked in flight (passed every seed)."""
    def order(p, pp, m):
        warm = min(pp - p, m)
        return ([("F", j) for j in range(warm)] + [k for j in range(warm, m) for k in (("F", j), ("B", j - warm))]
                + [("B", j) for j in range(m - warm, m)])
    return _train_3d_in_order(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr, order, receive_ahead=True)


def train_3d_one_micro_batch_at_a_time(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    """No pipelining: each micro-batch's forward and backward through every stage before the next one starts."""
    return _train_3d_in_order(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr,
                              lambda p, pp, m: [(k, j) for j in range(m) for k in ("F", "B")])


def train_3d_whole_batch(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    """One micro-batch of the replica's whole rows: the same gradients (a mean of equal means), no 1F1B at all."""
    return S.train_3d(dist, stage, tokens, targets, dp, pp, tp, 1, steps, lr)


def train_3d_dp_average_per_micro_batch(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    """The DP average done as m all-reduces of a 1/m share, as if once per micro-batch: m × DP's traffic."""
    def in_m_shares(real, tensor, group):
        total, world = torch.zeros_like(tensor), len(real.get_process_group_ranks(group))
        for _ in range(m):
            part = tensor / (m * world)
            real.all_reduce(part, group=group)
            total += part
        tensor.copy_(total)
    return S.train_3d(DPAverageReplaced(dist, in_m_shares), stage, tokens, targets, dp, pp, tp, m, steps, lr)


def train_3d_pp_through_a_module_dict(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    """Activations and their gradients left on a module dict; one byte-sized send tells the neighbour when."""
    return S.train_3d(_Board(dist), stage, tokens, targets, dp, pp, tp, m, steps, lr)


class _Board:
    """The learner's dist with each isend's tensor left on a module dict and a 1-element message sent instead."""

    def __init__(self, real):
        self.real, self.sent, self.got = real, {}, {}

    def __getattr__(self, name):
        return getattr(self.real, name)

    def isend(self, tensor, dst):
        me = self.real.get_rank()
        k = self.sent[dst] = self.sent.get(dst, 0) + 1
        _board[(me, dst, k)] = tensor.detach().clone()
        return self.real.isend(torch.zeros(1, dtype=torch.float64, device=tensor.device), dst)

    def recv(self, tensor, src):
        me = self.real.get_rank()
        self.real.recv(torch.zeros(1, dtype=torch.float64, device=tensor.device), src)
        k = self.got[src] = self.got.get(src, 0) + 1
        tensor.copy_(_board.pop((src, me, k)))


def train_3d_gpipe_parking_activations_on_the_host(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    """GPipe, its saved activations moved to host memory by saved-tensor hooks and back for backward: the device
    never holds m micro-batches' stash. Passed every seed before train_3d kept the host empty."""
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t.to(lib.host()), lambda t: t.to(lib.device())):
        return train_3d_gpipe(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr)


class _Recomputed(torch.nn.Module):
    """A stage whose forward runs under activation checkpointing: it keeps its input only and runs again in
    backward (its TP all-reduces too)."""

    def __init__(self, stage):
        super().__init__()
        self.stage = stage

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.stage, name)

    def forward(self, dist, group, x):
        import torch.utils.checkpoint as checkpoint
        return checkpoint.checkpoint(self.stage, dist, group, x, use_reentrant=False)


def train_3d_gpipe_recomputing(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    """GPipe under activation checkpointing: m micro-batches in flight, each keeping only its input."""
    train_3d_gpipe(dist, _Recomputed(stage), tokens, targets, dp, pp, tp, m, steps, lr)
    return stage


def train_3d_every_replica_on_the_whole_batch(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    """tokens arrive whole on every rank: each DP replica trains on all of them (micro-batches dp times larger),
    leaving nothing to average over DP."""
    whole = torch.cat([tokens] * dp), torch.cat([targets] * dp)          # chunk(dp)[d] is then the whole batch
    return S.train_3d(DPAverageReplaced(dist, lambda d, tensor, group: None), stage, *whole, dp, pp, tp, m, steps, lr)


def tp_dp_every_tp_group_on_the_whole_batch(dist, weights, batch, targets, dp, tp, steps, lr):
    """The batch arrives whole: each TP group trains on every row, with no DP all-reduce at all."""
    whole = torch.cat([batch] * dp), torch.cat([targets] * dp)            # chunk(dp)[d] is then the whole batch
    return S.tp_dp_train(DPAverageReplaced(dist, lambda d, tensor, group: None), weights, *whole, dp, tp, steps, lr)


def groups_in_an_order_of_their_own(dist, dp, pp, tp):
    """Every group created by every rank, but odd ranks create the axes in the reverse order: torch needs one order
    on every rank."""
    at = lambda i, j, k: (i * pp + j) * tp + k     # noqa: E731
    lists = {"tp": [[at(i, j, k) for k in range(tp)] for i in range(dp) for j in range(pp)],
             "pp": [[at(i, j, k) for j in range(pp)] for i in range(dp) for k in range(tp)],
             "dp": [[at(i, j, k) for i in range(dp)] for j in range(pp) for k in range(tp)]}
    rank, groups = dist.get_rank(), {}
    for axis in ("tp", "pp", "dp")[::-1 if rank % 2 else 1]:
        for ranks in lists[axis]:
            group = dist.new_group(ranks)
            if rank in ranks:
                groups[axis] = group
    return groups


def memory_from_memory_breakdown(model, plan):
    """lib.planner's memory model: the answer key."""
    return sum(memory_breakdown(model, plan).values())


def memory_from_estimate(model, plan):
    """The estimate of the plan on a cluster it fills: its memory is the answer."""
    return estimate(model, Cluster(gpu=H100_80GB, gpus=plan.gpus), plan).memory


def memory_from_the_measurement(model, plan):
    """lib.planner.measured builds the first stage and measures it: on the tiny cases, the answer."""
    from lib.planner.measured import measured_first_stage
    return sum(measured_first_stage(model, plan).memory.values())


def memory_from_the_explorer(model, plan):
    """lib.viz.planner, which draws estimates: the answer one call away."""
    return plan_figure(None, None)


ESTIMATOR_OUT_OF_REACH = "lib.planner's estimator"


def train_3d_gpipe_rewriting_its_peak(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    """GPipe, then the rank's own memory tracker, found on torch's dispatch-mode stack, told that its peak is its
    current bytes (the dispatch-mode stack, the frames below the function and the objects behind dist are refused
    to a rank's code: tests/test_share_nothing.py)."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    out = train_3d_gpipe(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr)
    for mode in _get_current_dispatch_mode_stack():
        if hasattr(mode, "peak"):
            mode.peak = mode.current
    return out


def coordinates_by_unravel_indexs_helper(dist, shape):
    """torch.unravel_index's own helper, beside the refused function."""
    return tuple(int(c) for c in torch.functional._unravel_index(torch.tensor(dist.get_rank()), tuple(shape)))


def coordinates_with_the_refusal_lifted(dist, shape):
    """The check's refusal of lib.sim.mesh's arithmetic lifted from inside (answer_key_refused(None))."""
    with answer_key_refused(None):
        return coordinates(dist.get_rank(), shape)


def memory_from_the_statements_own_sum(model, plan):
    """The helper the case builder checks lib.planner against: notebook 06's statement of the bytes, summed."""
    return P._first_stage_bytes(model, plan)


CHEATS = everywhere(P) + [
    ("mesh_coordinates", coordinates_from_the_checks_own_arithmetic, WORK_DONE_FOR_IT),
    ("mesh_coordinates", coordinates_by_unravel_index, "torch.unravel_index (unravel_index) out of reach: derive it"),
    ("mesh_coordinates", coordinates_by_numpys_unravel_index, "numpy.unravel_index (unravel_index) out of reach"),
    ("mesh_coordinates", coordinates_by_numpys_c_function, "numpy.unravel_index (unravel_index) out of reach"),
    ("mesh_coordinates", coordinates_by_searching_ravel_multi_index,
     "numpy.ravel_multi_index (ravel_multi_index) out of reach"),
    ("process_groups", groups_from_device_mesh, WORK_DONE_FOR_IT),
    ("process_groups", groups_from_the_meshs_own_lists, WORK_DONE_FOR_IT),
    ("process_groups", groups_from_rank_0, "fewer new_group calls"),
    ("tp_dp_train", tp_dp_on_the_gathered_batch, "FLOPs counted"),
    ("tp_dp_train", tp_dp_without_tensor_parallelism, "DP axis"),
    ("tp_dp_train", tp_dp_partial_sums_through_a_module_dict, "SharedMemory"),
    ("plan_memory", memory_from_memory_breakdown, ESTIMATOR_OUT_OF_REACH + " (memory_breakdown)"),
    ("plan_memory", memory_from_estimate, ESTIMATOR_OUT_OF_REACH + " (estimate)"),
    ("plan_memory", memory_from_the_explorer, "lib.viz.planner (plan_figure) out of reach"),
    ("plan_memory", memory_from_the_measurement, "lib.planner's measurement (measured_first_stage) out of reach"),
    ("train_3d", train_3d_gpipe, ("micro-batches in flight", "peak memory")),
    ("train_3d", train_3d_extra_warm_up_receiving_ahead, "micro-batches in flight"),
    ("train_3d", train_3d_gpipe_rewriting_its_peak, "dispatch-mode stack"),
    ("train_3d", under_identity_hooks(train_3d_gpipe), ("micro-batches in flight", "peak memory")),
    ("train_3d", train_3d_one_micro_batch_at_a_time, "simulated time"),
    ("train_3d", train_3d_whole_batch, "simulated time"),
    ("train_3d", train_3d_dp_average_per_micro_batch, "DP axis"),
    ("train_3d", train_3d_pp_through_a_module_dict, "SharedMemory"),
    ("train_3d", train_3d_gpipe_parking_activations_on_the_host, ("micro-batches in flight", "peak host memory")),
    ("train_3d", train_3d_gpipe_recomputing, ("micro-batches in flight", "TP axis")),   # or: recomputing all-reduces
    ("train_3d", train_3d_every_replica_on_the_whole_batch, "TP axis"),   # micro-batches dp times larger
    ("tp_dp_train", tp_dp_every_tp_group_on_the_whole_batch, "TP axis"),
    ("process_groups", groups_in_an_order_of_their_own, "new_group call"),
    ("mesh_coordinates", coordinates_by_unravel_indexs_helper, "torch.unravel_index (_unravel_index) out of reach"),
    ("mesh_coordinates", coordinates_with_the_refusal_lifted, "called lib.sim.mesh.answer_key_refused"),
    ("plan_memory", memory_from_the_statements_own_sum, "called puzzles.three_d._first_stage_bytes"),
]


def _searching_only(**fixed):
    """solutions.three_d.choose_plan over part of the space: its estimator refuses every plan whose fields differ from
    `fixed`, so the search never sees them."""
    def partial_estimate(model, cluster, plan):
        if any(getattr(plan, name) != value for name, value in fixed.items()):
            raise PlanError("outside the part of the space searched")
        return estimate(model, cluster, plan)
    search = types.FunctionType(S.choose_plan.__code__, dict(S.__dict__, estimate=partial_estimate),
                                "choose_plan_" + "_".join(f"{k}_{v}" for k, v in fixed.items()))
    search.__doc__ = f"choose_plan searching only plans with {fixed}."
    return search


# A search over part of the space: the micro-batch fixed at 1 passed every seed but those whose cases made a larger
# one faster (issue 32); pipelines left out passed every seed.
CHEATS += [("choose_plan", _searching_only(micro_batch=1), "fixing the micro-batch at 1"),
           ("choose_plan", _searching_only(pp=1), "leaving pipeline parallelism out")]


def memory_counting_pp_micro_batches_in_flight(model, plan):
    """plan_memory with pp micro-batches in flight on the first stage, where 1F1B holds min(pp, m): passed every seed
    whose cases drew m >= pp (issue 32)."""
    return _memory(model, plan, "pp micro-batches")


CHEATS += [("plan_memory", memory_counting_pp_micro_batches_in_flight, "keeping pp micro-batches' activations")]
