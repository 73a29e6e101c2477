"""A per-problem time budget with a shared buffer (the AIMO-2 Kaggle setup).

Each problem is granted its own time plus whatever the buffer holds; what it leaves unused goes
back into the buffer for the problems after it. With several problems in flight the first to
start takes the buffer, so a quick problem's savings reach a hard one instead of being lost.
"""

from __future__ import annotations


class TimeBank:
    """Grants per-problem wall time; unused time flows to later problems."""

    def __init__(self, per_problem_s: float) -> None:
        self.per_problem_s = per_problem_s
        self.buffer_s = 0.0

    def grant(self) -> float:
        """The next problem's budget: its own time plus the whole buffer."""
        granted, self.buffer_s = self.per_problem_s + self.buffer_s, 0.0
        return granted

    def settle(self, granted_s: float, used_s: float) -> None:
        """Return what a problem did not use of its grant."""
        self.buffer_s += max(granted_s - used_s, 0.0)
