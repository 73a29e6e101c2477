"""N-gram (prompt lookup) proposer: drafts by copying what followed the latest earlier match.

No model: the last ``n`` tokens of a sequence are searched for in its own history (prompt and
generated text), longest ``n`` first, and the tokens that followed the most recent match are the
draft. Math transcripts repeat numbers, variable names and code, so this is often right.
:class:`NgramDrafts` is the proposer behind ``--speculative ngram``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mathagent.serving.engine.spec_decode.proposal import Draft, SpecRow


@dataclass(frozen=True)
class NgramProposer:
    """Prompt-lookup drafting over a sequence's own tokens."""

    max_ngram: int = 3
    min_ngram: int = 1
    max_window: int = 1024  # only the latest tokens are searched, so a step stays cheap

    def propose(self, history: Tensor, k: int) -> list[int]:
        """Up to ``k`` draft tokens continuing ``history`` [S] (may be fewer, or none)."""
        hist = history[-self.max_window :]
        s = hist.numel()
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if s <= n:
                continue
            windows = hist[: s - 1].unfold(0, n, 1)  # [S-n, n], excludes the suffix itself
            hits = (windows == hist[s - n :]).all(1).nonzero().flatten()
            if hits.numel():
                start = int(hits[-1]) + n
                return hist[start : start + k].tolist()
        return []

    def propose_batch(self, histories: list[Tensor], k: int) -> Tensor:
        """Drafts [B, k] for each history, padded with -1."""
        out = torch.full((len(histories), k), -1, dtype=torch.long)
        for row, hist in enumerate(histories):
            draft = self.propose(hist, k)
            if draft:
                out[row, : len(draft)] = torch.tensor(draft)
        return out


class NgramDrafts:
    """Prompt lookup over each sequence's own tokens (drafts are copied, so q is one-hot).
    On CUDA graphs chains (greedy or sampled) take the one-graph step (:mod:`.ngram_device`)."""

    def __init__(self, lookup: NgramProposer | None = None, fused=None) -> None:
        self.lookup = lookup or NgramProposer()
        self.fused = fused  # a FusedNgram over the same lookup, on CUDA graphs

    def fused_step(self, rows: list[SpecRow], k: int, sinks: int, ahead: bool = False):
        """Draft, verify and accept in one CUDA graph (None: the engine's general path)."""
        return None if self.fused is None else self.fused.step(rows, k, ahead)

    def drop_ahead(self) -> None:
        if self.fused is not None:
            self.fused.steps.drop()

    def propose(self, rows: list[SpecRow], k: int) -> list[Draft]:
        out = []
        for row in rows:
            ids = row.seq.all_ids
            out.append(Draft.chain(ids[-1], self.lookup.propose(torch.tensor(ids), k)))
        return out

    def accepted(self, row: SpecRow, old_cached: int, num_accepted: int) -> None:
        pass
