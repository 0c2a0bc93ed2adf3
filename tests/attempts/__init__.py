"""A third catalogue of realistic first attempts at the course's puzzles.

Written on 2026-12-07 by a helper who read only the notebooks (notebooks/*.ipynb: their markdown, the
puzzle stubs, the check cells and any outputs), never lib/, puzzles/, solutions/, tools/, bench/, docs/ or
the other tests. Each module nbNN_*.py defines attempt functions with the puzzle stubs' exact signatures and
ends with ``ATTEMPTS = [(puzzle_name, attempt_fn, note), ...]``, where ``note`` is the mistake in the
learner's own words, or ``"correct: ..."`` for a right answer written an unusual way.

How to use them: run each attempt through its puzzle's check and judge the diagnosis by *reading* the
message the learner would see (does it name the real mistake, the rank, the value, the fix?), not by
matching keywords against the notes. These attempts were written without seeing the checks' messages and
are not a catalogue the diagnosis was tuned on: keep them out of any tuning loop, or they stop measuring.
"""
