"""lib.checker.measure.once_per_shape: a measure of shapes alone, run once per shape and remembered by case builders."""

import torch

from lib.checker.measure import counted_time, once_per_shape
from lib.models import mlp
from lib.sim import CostModel


def test_a_measure_runs_once_per_shape_of_its_arguments():
    calls = []

    @once_per_shape
    def measure(module, x, scale):
        calls.append(1)
        return module(x).numel() * scale

    a, b = mlp([4, 8, 2], seed=0), mlp([4, 8, 2], seed=1)
    x = torch.ones(3, 4, dtype=torch.float64)
    assert measure(a, x, 2) == measure(b, torch.zeros_like(x), 2) == 12
    assert len(calls) == 1                                  # other weights and values, same shapes: remembered
    assert measure(a, torch.ones(5, 4, dtype=torch.float64), 2) == 20          # another batch
    assert measure(mlp([4, 6, 2], seed=0), x, 2) == 12                         # another layer width
    assert measure(mlp([4, 8, 2], dtype=torch.float32), x.float(), 2) == 12    # another dtype
    assert measure(a, x, 3) == 18                                              # another setting
    assert measure(a, x.clone().requires_grad_(), 2) == 12                     # an input that needs a gradient
    assert len(calls) == 6


def test_what_the_tracker_counts_of_a_layer_depends_on_its_shapes_not_its_values():
    """Why remembering by shape is sound: the simulated clock of two models of one shape, on two batches of one
    shape, is the same."""
    cost = CostModel()
    times = [counted_time(lambda m=m, x=x: m(x).sum().backward(), cost)[1]
             for m, x in ((mlp([8, 16, 4], seed=0), torch.randn(5, 8, dtype=torch.float64)),
                           (mlp([8, 16, 4], seed=7), torch.ones(5, 8, dtype=torch.float64)))]
    assert times[0] == times[1] > 0
