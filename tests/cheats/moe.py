"""Cheats on notebook 07's puzzles, each with the words its rejection must contain."""

import puzzles.moe as P
from solutions.moe import top_k_route
from tests.cheats.common import everywhere


def route_by_the_course_arithmetic(logits, k, capacity_factor):
    """The capacity looked up in lib.moe, which the figures use, instead of derived."""
    from lib.moe import capacity

    tokens, weights = top_k_route(logits, k, capacity_factor)
    capacity(logits.shape[0], logits.shape[1], k, capacity_factor)
    return tokens, weights


CHEATS = everywhere(P) + [
    ("top_k_route", route_by_the_course_arithmetic, "lib.moe"),
]
