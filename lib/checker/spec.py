"""The error a puzzle's spec raises when it is written wrong (budgets, cases, the Puzzle itself)."""


class SpecError(ValueError):
    """A puzzle's spec is wrong (a misspelt metric, a variant no world size runs): raised when it is written, at
    import, with the offending values, never in the middle of a learner's check."""
