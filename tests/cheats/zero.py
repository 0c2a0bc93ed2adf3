"""Cheats on notebook 03's puzzles, each with the words its rejection must contain."""

import torch

import lib
import puzzles.zero as P
import solutions.zero as S
from tests.cheats.common import everywhere


def zero3_keeping_full_parameters(dist, model, batches, lr):
    """ZeRO-2 handed in as ZeRO-3: gradients and optimizer state sharded, the full parameters kept on the
    device for the whole run."""
    return S.zero2_train(dist, model, batches, lr)


def _on_the_host(solution):
    """The reference solution with the model moved to host memory, where the device's budget does not look."""
    def cheat(dist, model, batches, lr):
        model.to(lib.host())
        moved = [[(x.to(lib.host()), y.to(lib.host())) for x, y in batches]]
        return solution(dist, model, moved[0], lr)
    cheat.__name__ = f"{solution.__name__}_on_the_host"
    return cheat


def ddp_adam_on_the_host(dist, model, batches, lr):
    """Nothing sharded: data parallelism with Adam, with everything in host memory."""
    model.to(lib.host())
    return P.ddp_adam_train(dist, model, [(x.to(lib.host()), y.to(lib.host())) for x, y in batches], lr)


def zero3_with_matmuls_dodged(dist, model, batches, lr):
    """ZeRO-3 without prefetch handed in as FSDP with prefetch, each linear layer computed as a broadcast multiply
    and sum: were only matmuls costed, its compute would be free and no gather would need hiding."""
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            layer.forward = lambda h, layer=layer: (h[:, :, None] * layer.weight.T[None]).sum(1) + layer.bias
    return S.zero3_train(dist, model, batches, lr)


HOST = "peak host memory"
CHEATS = everywhere(P) + [
    ("zero3_train", zero3_keeping_full_parameters, "peak memory"),
    ("fsdp_prefetch_train", zero3_with_matmuls_dodged, "simulated time"),
    *[(name, ddp_adam_on_the_host, HOST) for name in ("zero1_train", "zero2_train", "zero3_train",
                                                       "fsdp_prefetch_train")],
    *[(name, _on_the_host(getattr(S, name)), HOST) for name in ("zero1_train", "zero2_train", "zero3_train",
                                                                 "fsdp_prefetch_train")],
]
