"""ZeRO-Offload's rule, shared by notebook 01's offloaded Adam and notebook 03's ZeRO-Offload: the optimizer's step
runs where its state lives, so the host computes at least HOST_STEP of Adam's FLOPs. State kept in host memory but
carried to the device for each update (and back) meets the device's memory budget while the device computes the
step and the link carries the state both ways: only this floor tells it apart."""

from __future__ import annotations

from lib.checker.puzzle import Budget, Floor

HOST_STEP = 0.5       # of Adam's FLOPs on what the host holds: the floor on what the host computes


def host_step_floor(adam_flops: float, what: str, hint: str) -> Budget:
    """The host's FLOPs floor for `adam_flops` of Adam steps on `what` ("2 Adam steps on the 1,234 parameters")."""
    return Floor("host_flops", HOST_STEP * adam_flops,
                 f"{HOST_STEP:.0%} of {what}, {adam_flops:,.0f} FLOPs: the step runs where the state lives", hint=hint)
