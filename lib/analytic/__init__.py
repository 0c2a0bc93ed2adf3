"""Costs worked out on paper: the papers' formulas, pipeline schedules as a model, MoE capacity, wide-area
steps and context parallelism's step times."""
