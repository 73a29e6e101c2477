"""What proposers see and return: one row per running sequence, one draft per row.

A proposer turns rows into drafts. A draft is a set of beams that all start with the row's last
sampled token (the root, not yet in the KV cache); a chain is one beam. Sampled chains carry the
draft distribution ``q`` they were drawn from, so verification can stay lossless.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from mathagent.serving.engine.sequence import Sequence

Warp = Callable[[Tensor], Tensor]  # logits [N, V] -> the row's warped probabilities [N, V]


@dataclass
class SpecRow:
    """One sequence in a speculative step."""

    seq: Sequence
    hidden: Tensor | None  # [H] target hidden state that produced ``seq.last_token``
    state: dict[str, Any] = field(default_factory=dict)  # the proposer's own per-sequence state
    warp: Warp | None = None  # None for greedy rows

    @property
    def greedy(self) -> bool:
        """True when the row decodes by argmax (tree verification allowed)."""
        return self.warp is None


@dataclass
class Draft:
    """Candidates for one row."""

    beams: Tensor  # [W, 1 + K] int64, column 0 is the root; W == 1 for a chain
    q: Tensor | None = None  # [K, V] probabilities the chain was sampled from; None = argmax/copied

    @classmethod
    def chain(cls, root: int, tokens: list[int], q: Tensor | None = None) -> Draft:
        """A single beam ``[root, *tokens]``."""
        return cls(torch.tensor([[root, *tokens]], dtype=torch.long), q)

    @property
    def depth(self) -> int:
        """Drafted tokens per beam."""
        return self.beams.shape[1] - 1


class Proposer(Protocol):
    """Drafts tokens for rows; told afterwards how many were accepted."""

    def propose(self, rows: list[SpecRow], k: int) -> list[Draft]:
        """Up to ``k`` draft tokens per row (greedy rows may get several beams)."""
        ...

    def accepted(self, row: SpecRow, old_cached: int, num_accepted: int) -> None:
        """Hook after verification: ``num_accepted`` drafts of ``row`` were kept."""
        ...
