"""Acceptance counters of speculative decoding: overall (``/metrics``) or per request.

Acceptance length is generated tokens per target forward; drafted/accepted are counted overall
and per draft position; drafting and verification host times say where a step's time goes.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    """Acceptance counters: overall (``/metrics``) or for one request."""

    forwards: int = 0  # target forwards that committed tokens
    tokens: int = 0  # tokens committed by those forwards
    drafted: int = 0
    accepted: int = 0
    drafted_at: list[int] = field(default_factory=list)  # per draft position
    accepted_at: list[int] = field(default_factory=list)
    steps: int = 0  # speculative steps timed (a batched step counts once per request)
    draft_s: float = 0.0  # host wall time spent drafting (propose + tree building)
    verify_s: float = 0.0  # host wall time of the verify forward and acceptance

    def record(self, depth: int, accepted: int, committed: int) -> None:
        """Count one verified row: ``depth`` drafted, ``accepted`` kept, ``committed`` emitted."""
        self.forwards += 1
        self.tokens += committed
        self.drafted += depth
        self.accepted += accepted
        grow = depth - len(self.drafted_at)
        if grow > 0:
            self.drafted_at += [0] * grow
            self.accepted_at += [0] * grow
        for i in range(depth):
            self.drafted_at[i] += 1
            self.accepted_at[i] += i < accepted

    def timed(self, draft_s: float, verify_s: float) -> None:
        """Count one speculative step's drafting and verification time."""
        self.steps += 1
        self.draft_s += draft_s
        self.verify_s += verify_s

    def merge(self, other: dict) -> None:
        """Add a finished request's counters (its ``as_dict`` form, plus raw counts)."""
        self.steps += other.get("steps", 0)
        self.draft_s += other.get("draft_s", 0.0)
        self.verify_s += other.get("verify_s", 0.0)
        self.forwards += other["target_forwards"]
        self.tokens += other["tokens"]
        self.drafted += other["drafted_tokens"]
        self.accepted += other["accepted_tokens"]
        for i, (d, a) in enumerate(zip(other["drafted_at"], other["accepted_at"], strict=True)):
            if i == len(self.drafted_at):
                self.drafted_at.append(0)
                self.accepted_at.append(0)
            self.drafted_at[i] += d
            self.accepted_at[i] += a

    def as_dict(self) -> dict:
        """JSON form: acceptance length, accepted/drafted and per-position acceptance."""
        return {
            "acceptance_length": round(self.tokens / self.forwards, 4) if self.forwards else 1.0,
            "drafted_tokens": self.drafted,
            "accepted_tokens": self.accepted,
            "acceptance_rate": round(self.accepted / self.drafted, 4) if self.drafted else 0.0,
            "per_position_acceptance": [
                round(a / d, 4) for a, d in zip(self.accepted_at, self.drafted_at, strict=True)
            ],
            "draft_ms_per_step": _ms(self.draft_s, self.steps),
            "verify_ms_per_step": _ms(self.verify_s, self.steps),
            "target_forwards": self.forwards,
            "tokens": self.tokens,
            "drafted_at": list(self.drafted_at),
            "accepted_at": list(self.accepted_at),
            "steps": self.steps,
            "draft_s": round(self.draft_s, 6),
            "verify_s": round(self.verify_s, 6),
        }


def _ms(seconds: float, steps: int) -> float:
    return round(1000 * seconds / steps, 3) if steps else 0.0
