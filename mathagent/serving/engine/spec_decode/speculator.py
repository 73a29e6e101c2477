"""Speculative decoding inside continuous batching: propose -> verify -> accept, per slot.

Every running sequence drafts with its own method (the engine's, or its request's), all drafts
are verified in one target forward (each row's candidates as a prefix tree under its own tree
attention mask, K/V written past the row's committed length), and each row keeps the longest
accepted prefix. Rolling back is moving ``num_cached``; only a tree path that is not the first
branch has its K/V moved to consecutive positions (at most ``draft_len`` entries).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from mathagent.serving.engine.sampler import Sampler, SamplingBatch
from mathagent.serving.engine.spec_config import SpecMethod, embedded_method
from mathagent.serving.engine.spec_decode.proposal import Draft, Proposer, SpecRow
from mathagent.serving.engine.spec_decode.stats import SpecStats
from mathagent.serving.engine.spec_decode.verify import (
    Tree,
    build_tree,
    sample_verify,
    tree_greedy_verify,
)

if TYPE_CHECKING:
    from mathagent.serving.engine.model_runner import ModelRunner
    from mathagent.serving.engine.sequence import Sequence
    from mathagent.serving.engine.spec_decode.registry import Proposers


@dataclass
class _Track:
    """What the speculator remembers about one running sequence between steps."""

    hidden: Tensor | None = None
    state: dict = field(default_factory=dict)
    stats: SpecStats = field(default_factory=SpecStats)


class Speculator:
    """Runs decode steps for running sequences with drafting and verification."""

    def __init__(
        self,
        runner: ModelRunner,
        proposers: Proposers,
        default: SpecMethod,
        draft_len: int,
        beams: int,
    ) -> None:
        self.runner = runner
        self.proposers = proposers
        self.default = default
        self.draft_len = draft_len
        self.beams = beams
        self.stats = SpecStats()
        self._tracks: dict[str, _Track] = {}

    def proposer(self, method: SpecMethod) -> Proposer | None:
        """The proposer for ``method`` (loaded on first use); None for ``none``."""
        return self.proposers.get(method)

    def method_of(self, seq: Sequence) -> SpecMethod:
        """The sequence's own method if its request named one, else the engine's."""
        spec = getattr(seq.params, "speculative", None)
        return embedded_method(spec) if spec else self.default

    def request_stats(self, request_id: str) -> SpecStats | None:
        """Acceptance counters of a running request."""
        track = self._tracks.get(request_id)
        return None if track is None else track.stats

    def prefilled(self, seq: Sequence, hidden: Tensor) -> None:
        """Remember the hidden state a finished prefill produced its first token from."""
        self._tracks[seq.request_id] = _Track(hidden=hidden)

    def step(self, seqs: list[Sequence]) -> list[list[int]]:
        """Propose, verify and accept for every sequence; return each one's new tokens."""
        self._tracks = {s.request_id: self._tracks.get(s.request_id) or _Track() for s in seqs}
        start = time.perf_counter()
        rows = [self._row(s) for s in seqs]
        drafts = self._propose(rows)
        trees = [build_tree(d.beams) for d in drafts]
        drafted = time.perf_counter()
        logits, hidden = self._verify_forward(seqs, trees)
        out = []
        for b, (row, draft, tree) in enumerate(zip(rows, drafts, trees, strict=True)):
            out.append(self._accept(row, draft, tree, logits[b], hidden[b]))
        # host times; a CUDA step's verify time includes waiting for its results
        verified = time.perf_counter()
        self.stats.timed(drafted - start, verified - drafted)
        for seq in seqs:
            track = self._tracks[seq.request_id]
            track.stats.timed(drafted - start, verified - drafted)
            _mirror(seq, track.stats)
        return out

    def _row(self, seq: Sequence) -> SpecRow:
        track = self._tracks[seq.request_id]
        warp = None
        if not seq.params.greedy:
            batch = SamplingBatch.build([seq.params], [None], self.runner.device)

            def warp(logits: Tensor, batch: SamplingBatch = batch) -> Tensor:
                rows = logits.shape[0]
                expanded = SamplingBatch(
                    batch.temperature.expand(rows),
                    batch.top_p.expand(rows),
                    batch.top_k.expand(rows),
                    [None] * rows,
                    False,
                )
                return Sampler.probs(logits, expanded)

        return SpecRow(seq, track.hidden, track.state, warp)

    def _propose(self, rows: list[SpecRow]) -> list[Draft]:
        """Group rows by method, draft, and give rows near the context end no drafts."""
        drafts: list[Draft | None] = [None] * len(rows)
        groups: dict[SpecMethod, list[int]] = {}
        budget = 1 + self.beams * self.draft_len  # most tree nodes a row can bring
        for i, row in enumerate(rows):
            if row.seq.num_cached + budget <= self.runner.max_seq_len:
                groups.setdefault(self.method_of(row.seq), []).append(i)
        for method, idxs in groups.items():
            proposer = self.proposer(method)
            if proposer is None:
                continue
            for i, d in zip(
                idxs, proposer.propose([rows[i] for i in idxs], self.draft_len), strict=True
            ):
                drafts[i] = d
        return [d or Draft.chain(r.seq.last_token, []) for d, r in zip(drafts, rows, strict=True)]

    def _verify_forward(self, seqs: list[Sequence], trees: list[Tree]) -> tuple[Tensor, Tensor]:
        """One target forward over every row's tree: logits [B, N, V], hidden [B, N, H]."""
        dev = self.runner.device
        n = max(t.tokens.numel() for t in trees)
        base = [s.num_cached for s in seqs]
        kv_len = max(base) + n
        tokens = torch.zeros(len(seqs), n, dtype=torch.long)
        rope = torch.tensor(base)[:, None].repeat(1, n)
        write = rope + torch.arange(n)
        mask = torch.zeros(len(seqs), n, kv_len, dtype=torch.bool)
        for b, (c, tree) in enumerate(zip(base, trees, strict=True)):
            m = tree.tokens.numel()
            tokens[b, :m] = tree.tokens
            rope[b, :m] += tree.depths
            mask[b, :, :c] = True
            mask[b, :m, c : c + m] = tree.mask
            pad = torch.arange(m, n)
            mask[b, pad, c + pad] = True  # padding rows see the prefix and themselves only
        write = write.clamp(max=self.runner.max_seq_len - 1)  # pads past the end of a full row
        slots = [s.slot for s in seqs if s.slot is not None]
        return self.runner.forward(
            tokens.to(dev),
            rope.to(dev),
            slots,
            attn_mask=mask.to(dev),
            write_positions=write.to(dev),
        )

    def _accept(
        self, row: SpecRow, draft: Draft, tree: Tree, logits: Tensor, hidden: Tensor
    ) -> list[int]:
        """Verify one row, move its accepted K/V into place and record the outcome."""
        seq, m = row.seq, tree.tokens.numel()
        if row.greedy:
            path, tokens = tree_greedy_verify(tree, logits[:m])
        else:
            p = row.warp(logits[:m]).cpu()  # [1 + K, V]
            q = None if draft.q is None else draft.q.cpu()[None]
            verdict = sample_verify(tree.tokens[1:][None], p[None], q, seq.generator)
            n_acc = int(verdict.accepted[0])
            path, tokens = list(range(n_acc + 1)), verdict.tokens[0, : n_acc + 1].tolist()
        base = seq.num_cached
        self._compact(seq.slot, base, path)
        seq.num_cached = base + len(path)
        track = self._tracks[seq.request_id]
        track.hidden = hidden[path[-1]]
        proposer = self.proposer(self.method_of(seq)) if draft.depth else None
        if proposer is not None:
            proposer.accepted(row, base, len(path) - 1)
        for stats in (self.stats, track.stats):
            stats.record(draft.depth, len(path) - 1, len(tokens))
        return tokens

    def _compact(self, slot: int | None, base: int, path: list[int]) -> None:
        """Move the K/V of an accepted tree path to consecutive positions after ``base``."""
        if slot is None or path == list(range(len(path))):
            return
        src = torch.tensor(path, device=self.runner.device) + base
        dst = torch.arange(len(path), device=self.runner.device) + base
        for cache in (self.runner.cache.k, self.runner.cache.v):
            layer_view = cache[:, slot]  # [L, Hkv, max_seq, D]
            layer_view[:, :, dst] = layer_view[:, :, src]


def _mirror(seq: Sequence, stats: SpecStats) -> None:
    """Copy a request's acceptance counters into its metrics (read by the server and CLI)."""
    seq.metrics.speculative = stats.as_dict()
