"""Continuous batching over KV-cache slots, with prefix reuse across slots.

Requests wait until a slot frees up, are prefilled in chunks, then decode together: every
decode step takes all running sequences, so a request joins or leaves between steps without
stalling the others. Prefill and decode steps alternate while both have work, which bounds how
long a long prompt can hold up the running sequences.

The scheduler is the sole owner of the KV cache's slots: only the sequences it runs write them
(drafter training runs on a cache of its own), so a freed slot keeps valid keys and values until
it is needed again. A new prompt that starts like a running sequence or a freed slot's tokens
(the same system prompt, or an agent's next turn, which resends the whole conversation) reuses
that prefix: it takes the freed slot itself, or has the prefix copied from the running one, and
only the rest of the prompt is prefilled. A sequence missing only its last prompt token joins
the decode batch at once, so requests that share a prompt start decoding together (a drafter
with no hidden state for it yet drafts from the next step on).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass
from typing import Literal

from mathagent.serving.engine.sequence import Sequence, Status


@dataclass
class ScheduledBatch:
    """What the next step runs."""

    kind: Literal["prefill", "decode"]
    seqs: list[Sequence]


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix (list slices compare in C, so bisect on them)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class Scheduler:
    """Owns the waiting queue, the running set, the free slots and what each freed slot holds."""

    def __init__(self, num_slots: int, prefix_caching: bool = True) -> None:
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.prefix_caching = prefix_caching
        # free slot -> the tokens whose K/V it still holds (empty: nothing worth keeping)
        self.free: dict[int, list[int]] = {slot: [] for slot in range(num_slots)}
        self._freed_at: dict[int, int] = {}  # free slot -> when it was freed (LRU eviction)
        self._clock = itertools.count()
        self._last_kind: str | None = None

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence."""
        self.waiting.append(seq)

    def has_work(self) -> bool:
        """True while any sequence waits or runs."""
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch | None:
        """Pick the next step: a prefill chunk of one sequence, or a decode of all ready ones."""
        if self.waiting and self.free and self._prefilling() is None:
            self._admit_ready()
        prefilling = self._prefilling()
        ready = sorted((s for s in self.running if self._decodes(s)), key=lambda s: s.slot or 0)
        if prefilling is not None and not (ready and self._last_kind == "prefill"):
            self._last_kind = "prefill"
            return ScheduledBatch("prefill", [prefilling])
        if ready:
            self._last_kind = "decode"
            return ScheduledBatch("decode", ready)
        return None

    @staticmethod
    def _decodes(seq: Sequence) -> bool:
        """Whether ``seq`` runs in decode steps: its prompt is cached, or only the last prompt
        token is missing (a decode step feeds exactly that token)."""
        missing = len(seq.prompt_ids) - seq.num_cached
        return missing <= 1

    def _prefilling(self) -> Sequence | None:
        return next((s for s in self.running if not self._decodes(s)), None)

    def _admit_ready(self) -> None:
        """Admit waiting sequences while slots are free: every one whose prompt is cached but
        its last token joins the next decode step; the first that needs a prefill ends it."""
        while self.waiting and self.free:
            if not self._decodes(self._admit()):
                return

    def _admit(self) -> Sequence:
        seq = self.waiting.popleft()
        seq.status = Status.RUNNING
        seq.prefix_source = None
        reuse, donor = self._best_prefix(seq.prompt_ids) if self.prefix_caching else (0, None)
        if donor is not None and donor in self.free:
            seq.slot = donor  # the freed slot still holds the prefix: nothing to copy
        else:
            seq.slot = self._evict()
            if donor is not None:
                seq.prefix_source = (donor, reuse)  # the engine copies it before prefilling
        del self.free[seq.slot]
        self._freed_at.pop(seq.slot, None)
        seq.num_cached = reuse
        seq.metrics.cached_tokens = reuse
        self.running.append(seq)
        return seq

    def _best_prefix(self, prompt: list[int]) -> tuple[int, int | None]:
        """The longest reusable prefix of ``prompt`` and the slot holding it. At least the last
        prompt token is always prefilled: its logits give the first generated token."""
        limit = len(prompt) - 1
        holders = [(s.slot, s.cached_ids) for s in self.running if s.slot is not None]
        holders += [(slot, ids) for slot, ids in self.free.items() if ids]
        best, donor = 0, None
        for slot, ids in holders:
            n = min(common_prefix(prompt, ids), limit)
            # ties go to a freed slot (listed last): taking it over costs no copy
            if n > best or (n == best and n > 0 and slot in self.free):
                best, donor = n, slot
        return best, donor

    def _evict(self) -> int:
        """A free slot for a new sequence: an empty one, else the least recently freed."""
        empty = [slot for slot, ids in self.free.items() if not ids]
        if empty:
            return min(empty)
        return min(self.free, key=lambda slot: self._freed_at.get(slot, -1))

    def finish(self, seq: Sequence) -> None:
        """Release a finished or aborted sequence's slot; the slot keeps what it cached."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        if seq.slot is not None:
            self.free[seq.slot] = seq.cached_ids if self.prefix_caching else []
            self._freed_at[seq.slot] = next(self._clock)
            seq.slot = None
        seq.status = Status.FINISHED
