"""The planner's one exception, and the check every whole-number setting goes through."""

from __future__ import annotations

from lib.errors import PuzzleError


class PlanError(PuzzleError, ValueError):
    """A model, cluster or plan the planner cannot use; the message says what is wrong and how to fix it."""


def positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"{name} must be a whole number of at least 1, got {value!r}")


def divisors(n: int, at_most: int) -> list[int]:
    """The divisors of n up to `at_most`, smallest first."""
    return [d for d in range(1, min(n, at_most) + 1) if n % d == 0]
