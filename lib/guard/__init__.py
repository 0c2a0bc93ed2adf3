"""What keeps a ✓ honest inside the notebook: entered at one seam, `around_run`, the context the runtime opens around
a run; nothing of it is installed before the first run. See docs/TRUST.md for what it promises and what it does not."""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def around_run(runtime) -> Iterator[None]:
    """The guard in place while `runtime` runs its ranks: Python's audit hook added (once per process, at the first
    run: Python cannot remove one) and every patch of lib.guard.boundary in place; each patch put back on exit, unless
    a rank's thread that could not be stopped still runs the rank's code (its guards stay on until it ends)."""
    from lib.guard import audit, boundary         # the wing loads with the first run, not with the simulator

    audit.install()
    with boundary.guarding() as guard:
        try:
            yield
        finally:
            guard.left_running.extend(state.thread for state in runtime.ranks
                                      if state.thread is not None and state.thread.is_alive())
