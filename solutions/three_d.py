"""Notebook 06, 3D parallelism: the reference solutions.

A solved notebook pastes each function alone into its cell: they use only what the notebook's setup cell imports
(torch, F, device_mesh, tp_copy, tp_reduce, the planner's names, three of lib.analytic.formulas) and the earlier
puzzles'
functions.
"""

import torch
import torch.nn.functional as F

from lib.real.backends import device_mesh
from lib.analytic.formulas import activation_bytes_per_layer, first_stage_in_flight, model_state_bytes
from lib.planner import Plan, PlanError, estimate
from puzzles.parallel_gpt import tp_reduce


def mesh_coordinates(dist, shape):
    rank, coords = dist.get_rank(), []
    for size in reversed(shape):
        rank, c = divmod(rank, size)
        coords.append(c)
    return tuple(reversed(coords))


def process_groups(dist, dp, pp, tp):
    d, p, t = mesh_coordinates(dist, (dp, pp, tp))
    groups = {}

    def make(axis, members):
        for ranks in members:                            # every rank creates every group, in the same order
            group = dist.new_group(ranks)
            if dist.get_rank() in ranks:
                groups[axis] = group

    make("tp", [[(i * pp + j) * tp + k for k in range(tp)] for i in range(dp) for j in range(pp)])
    make("pp", [[(i * pp + j) * tp + k for j in range(pp)] for i in range(dp) for k in range(tp)])
    make("dp", [[(i * pp + j) * tp + k for i in range(dp)] for j in range(pp) for k in range(tp)])
    return groups


def tp_dp_train(dist, weights, batch, targets, dp, tp, steps, lr):
    mesh = device_mesh(dist, (dp, tp), ("dp", "tp"))
    d, t = mesh.get_local_rank("dp"), mesh.get_local_rank("tp")
    tp_group, dp_group = mesh["tp"].get_group(), mesh["dp"].get_group()
    split = {"fc1_w": 0, "fc1_b": 0, "fc2_w": 1}             # fc1 by rows, fc2 by columns, fc2_b whole
    params = {k: (v.chunk(tp, split[k])[t] if k in split else v).clone().requires_grad_() for k, v in weights.items()}
    x, y = batch.chunk(dp)[d], targets.chunk(dp)[d]
    for _ in range(steps):
        hidden = F.gelu(F.linear(x, params["fc1_w"], params["fc1_b"]))    # f would be idle: x needs no gradient
        out = tp_reduce(dist, F.linear(hidden, params["fc2_w"]), tp_group) + params["fc2_b"]
        F.mse_loss(out, y).backward()
        with torch.no_grad():
            for p in params.values():
                dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=dp_group)
                p -= lr * p.grad
                p.grad = None
    return {k: v.detach() for k, v in params.items()}


def train_3d(dist, stage, tokens, targets, dp, pp, tp, m, steps, lr):
    mesh = device_mesh(dist, (dp, pp, tp), ("dp", "pp", "tp"))
    d, p = mesh.get_local_rank("dp"), mesh.get_local_rank("pp")
    tp_group, dp_group = mesh["tp"].get_group(), mesh["dp"].get_group()
    stages = dist.get_process_group_ranks(mesh["pp"].get_group())      # this pipeline's ranks, stage by stage
    xs, ys = tokens.chunk(dp)[d].chunk(m), targets.chunk(dp)[d].chunk(m)
    first, last = p == 0, p == pp - 1

    def forward(j, stash, sends):
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

    def backward(j, stash, sends):
        x, out = stash.pop(j)
        if last:
            out.backward()
        else:
            grad = torch.empty_like(out)
            dist.recv(grad, stages[p + 1])
            out.backward(grad)
        if not first:
            sends.append(dist.isend(x.grad, stages[p - 1]))

    for _ in range(steps):
        stash, sends, warm = {}, [], pp - p - 1
        for j in range(warm):                            # 1F1B: warm-up, steady state, cool-down
            forward(j, stash, sends)
        for i in range(m - warm):
            forward(warm + i, stash, sends)
            backward(i, stash, sends)
        for j in range(m - warm, m):
            backward(j, stash, sends)
        for s in sends:
            s.wait()
        with torch.no_grad():
            for prm in stage.parameters():               # data parallel: average over the DP group only
                dist.all_reduce(prm.grad, op=dist.ReduceOp.AVG, group=dp_group)
                prm -= lr * prm.grad
                prm.grad = None
    return stage


def plan_memory(model, plan):
    blocks = model.layers // plan.pp                           # the first stage's
    params = blocks * model.layer_params + model.embedding_params
    if plan.pp == 1:                                           # one stage holds the head too
        params += model.head_params
    states = model_state_bytes(params / plan.tp, dp=plan.dp, zero_stage=plan.zero)
    if plan.zero == 3:            # two blocks' gathered 16-bit weights, one block's 16-bit gradients
        states += 3 * 2 * model.layer_params / plan.tp
    per_block = activation_bytes_per_layer(model.seq, plan.micro_batch, model.hidden, model.heads, t=plan.tp,
                                           sequence_parallel=plan.sequence_parallel, recompute=plan.recompute)
    return states + blocks * per_block * first_stage_in_flight(plan.pp, plan.micro_batches)


def choose_plan(model, cluster, global_batch):
    best, fastest = None, 0.0
    for tp in [t for t in range(1, cluster.gpus_per_node + 1) if cluster.gpus_per_node % t == 0]:
        for pp in [p for p in range(1, model.layers + 1) if model.layers % p == 0]:
            dp = cluster.gpus // (tp * pp)
            if dp == 0 or dp * tp * pp != cluster.gpus or global_batch % dp:
                continue
            for micro_batch in [b for b in range(1, global_batch // dp + 1) if global_batch // dp % b == 0]:
                for zero in (0, 1, 2, 3):
                    for recompute in ("none", "selective", "full"):
                        plan = Plan(tp=tp, pp=pp, dp=dp, global_batch=global_batch, micro_batch=micro_batch,
                                    zero=zero, recompute=recompute)
                        try:
                            e = estimate(model, cluster, plan)
                        except PlanError:                      # heads or layers do not split this way
                            continue
                        if e.fits and e.tokens_per_second > fastest:
                            best, fastest = plan, e.tokens_per_second
    return best
