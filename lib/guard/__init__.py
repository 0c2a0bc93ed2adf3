"""What keeps a ✓ honest inside the notebook: entered at one seam, a context the runtime opens around a run.
See docs/TRUST.md for what it promises and what it does not."""
