"""Continuous batching over KV-cache slots.

Requests wait until a slot frees up, are prefilled in chunks, then decode together: every
decode step takes all running sequences, so a request joins or leaves between steps without
stalling the others. Prefill and decode steps alternate while both have work, which bounds how
long a long prompt can hold up the running sequences.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Literal

from mathagent.serving.engine.sequence import Sequence, Status


@dataclass
class ScheduledBatch:
    """What the next step runs."""

    kind: Literal["prefill", "decode"]
    seqs: list[Sequence]


class Scheduler:
    """Owns the waiting queue, the running set and the free slots."""

    def __init__(self, num_slots: int) -> None:
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.free_slots = list(
            range(num_slots)
        )  # a min-heap: low slots first keeps rows contiguous
        self._last_kind: str | None = None

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence."""
        self.waiting.append(seq)

    def has_work(self) -> bool:
        """True while any sequence waits or runs."""
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch | None:
        """Pick the next step: a prefill chunk of one sequence, or a decode of all ready ones."""
        ready = sorted((s for s in self.running if s.prefill_done), key=lambda s: s.slot or 0)
        prefilling = next((s for s in self.running if not s.prefill_done), None)
        if prefilling is None and self.waiting and self.free_slots:
            prefilling = self._admit()
        if prefilling is not None and not (ready and self._last_kind == "prefill"):
            self._last_kind = "prefill"
            return ScheduledBatch("prefill", [prefilling])
        if ready:
            self._last_kind = "decode"
            return ScheduledBatch("decode", ready)
        return None

    def _admit(self) -> Sequence:
        seq = self.waiting.popleft()
        seq.slot = heapq.heappop(self.free_slots)
        seq.status = Status.RUNNING
        seq.num_cached = 0
        self.running.append(seq)
        return seq

    def finish(self, seq: Sequence) -> None:
        """Release a finished or aborted sequence's slot."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if seq.slot is not None:
            heapq.heappush(self.free_slots, seq.slot)
            seq.slot = None
        seq.status = Status.FINISHED
