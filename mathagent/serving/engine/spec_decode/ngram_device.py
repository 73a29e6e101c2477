"""N-gram (prompt lookup) drafting on the device, so an n-gram step is one CUDA graph.

The same lookup as :class:`~.ngram.NgramProposer` (the last ``n`` tokens searched for in the
latest ``max_window`` tokens, longest ``n`` first, the most recent match wins, the tokens after
it are the draft) over a per-slot token table on the device, in static shapes, so
:class:`~.chain_step.ChainStep` captures it with the verify forward and acceptance and launches
the next step before the host reads this one. Each step first writes its window (the last
``k + 1`` committed tokens) into the table, which keeps the table whole across steps; the host
fills it when a request first drafts here or after plain steps. A draft shorter than ``k`` is
padded with -1, which no argmax matches (the verify feeds it as token 0), so padding costs only
the verify width it fills and accepts what the host's lookup would.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from mathagent.serving.engine.spec_decode.chain_step import ChainInputs, OneGraphStep
from mathagent.serving.engine.spec_decode.ngram import NgramProposer
from mathagent.serving.engine.spec_decode.proposal import SpecRow

if TYPE_CHECKING:
    from mathagent.serving.engine.model_runner import ModelRunner

_NONE = -2  # a table cell before the history starts: equals no token
log = logging.getLogger(__name__)


class DeviceNgram:
    """The lookup of ``lookup`` over a ``[slots, max_seq]`` token table on ``device``."""

    def __init__(self, lookup: NgramProposer, slots: int, max_seq: int, device: torch.device):
        self.lookup, self.device, self.max_seq = lookup, device, max_seq
        self.table = torch.full((slots, max_seq), _NONE, dtype=torch.long, device=device)
        self._known: dict[int, tuple[str, int]] = {}  # slot -> (request, tokens the table holds)
        # On CUDA the lookup is one compiled region: eager, its ~60 small kernels cost ~150 us
        # of a 1.5 ms EAGLE-3 step on the H200 (benchmarks/GPU_NOTES.md, run 51)
        self._run = self._lookup
        if device.type == "cuda":
            self._run = torch.compile(self._lookup, dynamic=False)

    def sync(self, seq, width: int) -> None:
        """Bring the table of ``seq``'s slot up to its committed tokens and root, unless the
        window of its next step (its last ``width`` tokens) covers what is missing."""
        slot, ids, c = seq.slot, seq.all_ids, seq.num_cached  # ids[c] is the root
        owner, held = self._known.get(slot, (None, 0))
        if owner != seq.request_id:
            self.table[slot].fill_(_NONE)
            held = 0
        if held < c + 1 - width:
            self.table[slot, held : c + 1] = torch.tensor(ids[held : c + 1], device=self.device)
        self._known[slot] = (seq.request_id, c + 1)

    def run(self, inp: ChainInputs, k: int) -> Tensor:
        """Beams ``[B, 1 + k]``: each row's root and its lookup draft (padded with -1)."""
        return self._run(inp.slots, inp.start, inp.window, k)

    def _lookup(self, slots: Tensor, start: Tensor, window: Tensor, k: int) -> Tensor:
        width = window.shape[1]
        cols = start[:, None] + 1 + torch.arange(width, device=self.device)  # c-T+1 .. c
        rows = slots[:, None].expand_as(cols)
        self.table[rows, cols.clamp(min=0)] = window  # keeps the table whole
        return torch.cat([window[:, -1:], self.draft(rows[:, :1], cols[:, -1], k)], 1)

    def draft(self, slots: Tensor, root: Tensor, k: int) -> Tensor:
        """Drafts ``[B, k]`` for slots ``[B, 1]`` whose histories end at positions ``root [B]``."""
        w = self.lookup.max_window
        at = root[:, None] - w + 1 + torch.arange(w, device=self.device)  # [B, W]
        hist = torch.where(at >= 0, self.table[slots, at.clamp(min=0)], _NONE)
        ends = torch.arange(w - 1, device=self.device)  # where an earlier match ends
        best = torch.full_like(root, -1)
        for n in range(self.lookup.min_ngram, self.lookup.max_ngram + 1):  # longest n wins
            pad = torch.full((hist.shape[0], n - 1), _NONE, dtype=hist.dtype, device=self.device)
            padded = torch.cat([pad, hist], 1)
            hit = torch.ones_like(hist[:, :-1], dtype=torch.bool)
            for i in range(n):  # token i back from the window's end against the suffix's
                hit &= padded[:, n - 1 - i : n - 1 - i + w - 1] == hist[:, w - 1 - i : w - i]
            last = torch.where(hit, ends, -1).amax(1)  # the most recent match
            found = (last >= 0) & (root + 1 > n)
            best = torch.where(found, last, best)
        pos = best[:, None] + 1 + torch.arange(k, device=self.device)  # after the match
        ok = (best[:, None] >= 0) & (pos <= w - 1)
        return torch.where(ok, hist.gather(1, pos.clamp(max=w - 1)), -1)

    def verified(self, inp: ChainInputs, pos: Tensor, captured: Tensor | None) -> None:
        pass


class FusedNgram(OneGraphStep):
    """The one-graph n-gram step of :class:`~.ngram.NgramDrafts` on CUDA graphs (greedy or
    sampled rows)."""

    name = "n-gram one-graph"

    def __init__(self, lookup: NgramProposer, runner: ModelRunner) -> None:
        assert runner.graphs is not None
        slots = runner.cache.k.shape[1]
        super().__init__(
            DeviceNgram(lookup, slots, runner.max_seq_len, runner.device), runner.graphs
        )

    def before(self, row: SpecRow, k: int) -> None:
        self.drafter.sync(row.seq, k + 1)  # type: ignore[attr-defined]
