"""The draft length of each speculative step, from what speculation measurably buys.

In the spirit of TensorRT-LLM's AUTO speculation and vLLM's dynamic speculative decoding: a
step of ``k`` drafts costs ``t(b, k)`` seconds at batch bucket ``b`` and commits ``E(k)``
tokens per row, so the step worth running maximises ``E(k) / t(b, k)``; ``k = 0`` is a plain
decode step. The candidates are plain and the configured draft length (``lengths`` may add
others): on the CUDA path each new verify width is a graph capture of a second or more, which
an exploring policy would pay inside serving (measured on the H200: exploring widths 2 and 3
made n-gram 5x slower than either fixed choice). Both sides are measured while serving: step
times per (bucket, k) as the median
of the latest steps (the first steps of a shape are dropped: they capture graphs or compile),
acceptance as decayed counts of how often draft position ``i`` was accepted per row that asked
for drafts (a proposer with nothing to propose counts as a miss). While plain decoding wins,
speculation is probed again after a gap that doubles each time plain still wins, so a bad
drafter costs a vanishing share of the steps; a winning probe resets the gap.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median

_WARMUP, _WINDOW = 2, 9  # steps dropped per shape; steps the median is taken over
_DECAY = 0.97  # per speculative step, for the acceptance counts
_MIN_GAP, _MAX_GAP = 8, 1024  # plain steps between probes of speculation


def bucket(batch: int) -> int:
    """Batch sizes that cost about the same per step share one entry (powers of two)."""
    return 1 << max(0, batch - 1).bit_length()


@dataclass
class _Shape:
    seen: int = 0
    times: deque = field(default_factory=lambda: deque(maxlen=_WINDOW))

    def add(self, seconds: float) -> None:
        self.seen += 1
        if self.seen > _WARMUP:
            self.times.append(seconds)

    @property
    def ready(self) -> bool:
        return len(self.times) >= 3

    @property
    def seconds(self) -> float:
        return median(self.times)


class DraftPolicy:
    """Chooses the draft length of the next step; told what each step cost and accepted."""

    def __init__(self, max_len: int, adaptive: bool = True, lengths: tuple[int, ...] = ()) -> None:
        self.max_len = max_len
        self.adaptive = adaptive
        self.lengths = sorted({0, max_len, *lengths})  # the draft lengths it chooses among
        self._shapes: dict[tuple[int, int], _Shape] = {}
        self._rows = 0.0  # decayed count of rows that asked for drafts
        self._accepted = [0.0] * max_len  # decayed count of rows with position i accepted
        self._gap: dict[int, int] = {}  # bucket -> plain steps between probes
        self._since: dict[int, int] = {}  # bucket -> plain steps since the last probe
        self._probing: dict[int, int] = {}  # bucket -> speculative probe steps left

    def expected_tokens(self, k: int) -> float:
        """Tokens a row commits per step with ``k`` drafts (1 + accepted drafts)."""
        if self._rows == 0:
            return 1.0 + k  # nothing measured yet: optimistic, so speculation gets tried
        return 1.0 + sum(self._accepted[:k]) / self._rows

    def choose(self, batch: int) -> int:
        """The draft length of the next step of ``batch`` rows (0 = plain decode)."""
        if not self.adaptive:
            return self.max_len
        b = bucket(batch)
        top = self._shape(b, self.max_len)
        if self._probing.get(b):
            self._probing[b] -= 1
            return self.max_len
        if not top.ready:
            return self.max_len
        if not self._shape(b, 0).ready:
            return 0
        best = max(self.lengths, key=lambda k: self._rate(b, k))
        if best == 0:
            self._since[b] = self._since.get(b, 0) + 1
            gap = self._gap.get(b, _MIN_GAP)
            if self._since[b] >= gap:  # probe: a fresh hidden state, then real drafts
                self._since[b], self._gap[b] = 0, min(2 * gap, _MAX_GAP)
                self._probing[b] = 2
                return self.max_len
        else:
            self._gap[b] = _MIN_GAP
        return best

    def _rate(self, b: int, k: int) -> float:
        """Estimated tokens per second per row of a step with ``k`` drafts."""
        return self.expected_tokens(k) / self._cost(b, k)

    def _cost(self, b: int, k: int) -> float:
        """Measured seconds of a step, or for an untried ``k`` the line between plain and the
        full draft length (it gets measured once it is chosen)."""
        shape = self._shape(b, k)
        if shape.ready:
            return shape.seconds
        plain, full = self._shape(b, 0).seconds, self._shape(b, self.max_len).seconds
        return plain + (full - plain) * k / self.max_len

    def _shape(self, b: int, k: int) -> _Shape:
        return self._shapes.setdefault((b, k), _Shape())

    def observed(self, batch: int, k: int, seconds: float) -> None:
        """Count the wall time of one step of ``batch`` rows with ``k`` drafts."""
        self._shape(bucket(batch), k).add(seconds)

    def accepted(self, asked: int, accepted: list[int]) -> None:
        """Count one speculative step: ``asked`` rows wanted drafts, ``accepted`` holds each
        row's number of accepted drafts."""
        self._rows = _DECAY * self._rows + asked
        for i in range(self.max_len):
            hits = sum(1 for a in accepted if a > i)
            self._accepted[i] = _DECAY * self._accepted[i] + hits
