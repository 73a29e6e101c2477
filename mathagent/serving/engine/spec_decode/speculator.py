"""Speculative decoding inside continuous batching: propose -> verify -> accept, per slot.

Every running sequence drafts with its own method (the engine's, or its request's), all drafts
are verified in one target forward (each row's beams as a token tree under one shared tree
mask, K/V written past the row's committed length), and each row keeps the longest accepted
beam prefix. Layout, acceptance (greedy argmax matching, lossless sampling) and the K/V moves of
a tree path run on the device; the host reads the outcome once per step. Rolling back is moving
``num_cached``. :meth:`Speculator.run` lets the :class:`DraftPolicy` pick each step's draft
length, plain decoding (0) whenever that is measurably faster.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from mathagent.serving.engine.sampler import Sampler, SamplingBatch
from mathagent.serving.engine.spec_config import SpecMethod, embedded_method
from mathagent.serving.engine.spec_decode.policy import DraftPolicy
from mathagent.serving.engine.spec_decode.proposal import Draft, Proposer, SpecRow
from mathagent.serving.engine.spec_decode.stats import SpecStats
from mathagent.serving.engine.spec_decode.tree_batch import TreeBatch, move_path
from mathagent.serving.engine.spec_decode.verify import sample_verify

if TYPE_CHECKING:
    from mathagent.serving.engine.model_runner import ModelRunner
    from mathagent.serving.engine.sampling_params import SamplingParams
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
        adaptive: bool = True,
    ) -> None:
        self.runner = runner
        self.proposers = proposers
        self.default = default
        self.draft_len = draft_len
        self.beams = beams
        self.stats = SpecStats()
        self.policy = DraftPolicy(draft_len, adaptive)
        self.last_depth = 0  # drafts per beam of the latest speculative step
        # (requests, draft length) of a step launched ahead: by a plain step (0) or a fused one
        self._ahead: tuple[list[str], int] | None = None
        self._fused_by: Proposer | None = None  # the proposer holding a fused step launched ahead
        # (requests, end, draft length) of the last step
        self._since: tuple[list[str], float, int] | None = None
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
        self._since = None  # the next step's wall time would hold this prefill

    def run(self, seqs: list[Sequence], plain: Callable[[list[Sequence], bool], list[int]]) -> list:
        """One decode step of ``seqs`` with the draft length the policy picks (0: ``plain``,
        told whether the next step is plain too, so it launches that one ahead only then: a
        step launched ahead of a speculative one would be a whole plain step thrown away)."""
        k = self.policy.choose(len(seqs))
        if k and any(s.num_cached + 1 + self.beams * k > self.runner.max_seq_len for s in seqs):
            k = 0  # a row near the context end has no room for a verify step's nodes
        ids = [s.request_id for s in seqs]
        # a step launched ahead for other rows, or of another draft length, is thrown away
        # after this step has waited for it (measured on the H200: drain steps timed 2x): that
        # is not what this step costs, so it is not timed
        wasted = self._ahead is not None and self._ahead != (ids, k)
        if wasted and self._fused_by is not None:
            self._fused_by.drop_ahead()  # type: ignore[attr-defined]
        self._fused_by = None
        captures = self._captures()
        start = time.perf_counter()
        if k == 0:
            ahead = self.policy.plain_next(len(seqs))
            out = [[t] for t in plain(seqs, ahead)]
            self._ahead = (ids, 0) if ahead else None
            for seq in seqs:  # a drafter's hidden state is now behind: the next step refreshes it
                if seq.request_id in self._tracks:
                    self._tracks[seq.request_id].hidden = None
        else:
            self._ahead = None
            out = self.step(seqs, k)
        # what a step costs is the wall time since the last step of these rows ended: the host's
        # work between steps (commit, detokenising, scheduling) included, which a step launched
        # ahead hides from its own start-to-end time (H200, batch 32: 7.0 ms timed, 9.2 ms paid)
        end = time.perf_counter()
        same_rows = self._since is not None and self._since[0] == ids
        begin = self._since[1] if same_rows else start
        # a step that captured a CUDA graph is not timed (compiling); a first speculative step
        # after plain ones is a probe's catch-up cost, not a step's (GPU_NOTES runs 65, 67), and
        # a first plain step after speculative ones was launched by no step ahead of it
        timed = not wasted and self._captures() == captures and (k == 0 or self.last_depth > 0)
        last_k = self._since[2] if same_rows and self._since is not None else None
        catching_up = k > 0 and last_k == 0
        timed = timed and not (k == 0 and last_k)
        self._since = (ids, end, k)
        if timed and catching_up:
            self.policy.caught_up(len(seqs), end - begin)
        elif timed:
            self.policy.observed(len(seqs), k, end - begin)
        return out

    def _captures(self) -> int:
        graphs = self.runner.graphs
        return 0 if graphs is None else graphs.captures

    def step(self, seqs: list[Sequence], k: int | None = None) -> list[list[int]]:
        """Propose, verify and accept for every sequence; return each one's new tokens.

        On the device: the node layout, the verify forward, greedy and sampled acceptance and
        the K/V moves; the host reads the committed tokens once, at the end.
        """
        k = self.draft_len if k is None else k
        self._tracks = {s.request_id: self._tracks.get(s.request_id) or _Track() for s in seqs}
        start = time.perf_counter()
        rows = [self._row(s) for s in seqs]
        fused = self._fused(rows, k)
        if fused is not None:  # drafted, verified and accepted in one graph
            drafts, host, last = fused
            self.last_depth = k
            drafted = start  # inside the step's graph: all of it counts as verify time
        else:
            drafts = self._propose(rows, k)
            batch = TreeBatch.stack(drafts, self.runner.device)
            self.last_depth = batch.depth
            drafted = time.perf_counter()
            base = [s.num_cached for s in seqs]
            slots = [s.slot for s in seqs if s.slot is not None]
            logits, hidden = self.runner.verify(
                batch.tokens(), batch.node_depths(), slots, base, batch.mask()
            )
            host, last = self._accept(rows, drafts, batch, logits, hidden, base, slots)
        out = [
            self._commit(r, d, h, last[i])
            for i, (r, d, h) in enumerate(zip(rows, drafts, host, strict=True))
        ]
        self.policy.accepted(
            sum(1 for r, d in zip(rows, drafts, strict=True) if d.depth or r.hidden is not None),
            [h[0] for h in host],
        )
        verified = time.perf_counter()  # host times; on CUDA verify includes waiting for it
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

            def warp(logits: Tensor, params: SamplingParams = seq.params) -> Tensor:
                rows = logits.shape[0]
                batch = SamplingBatch.build([params] * rows, [None] * rows, logits.device)
                return Sampler.probs(logits, batch)

        return SpecRow(seq, track.hidden, track.state, warp)

    def _fused(self, rows: list[SpecRow], k: int) -> tuple | None:
        """The step from a proposer that drafts, verifies and accepts in one captured graph
        (EAGLE-3 chains on CUDA), when all rows use it and it takes them; else None."""
        methods = {self.method_of(r.seq) for r in rows}
        proposer = self.proposer(methods.pop()) if len(methods) == 1 and k > 0 else None
        fused_step = getattr(proposer, "fused_step", None)
        if fused_step is None:
            return None
        if self.runner.lookahead is not None:
            self.runner.lookahead.drop()  # a plain step in flight would read stale K/V
        ahead = self._may_launch_ahead([r.seq for r in rows], k)
        out = fused_step(rows, k, len(self.runner.feature_sinks), ahead)
        if out is not None and ahead:
            self._ahead, self._fused_by = ([r.seq.request_id for r in rows], k), proposer
        return out

    def _may_launch_ahead(self, seqs: list[Sequence], k: int) -> bool:
        """Whether a fused step may launch the same rows' next step before it is read: the
        policy has settled on ``k`` (not probing or measuring), and no row can finish or run
        out of room in this step (its successor would be thrown away)."""
        room = self.runner.max_seq_len - 2 * (k + 1)
        return self.policy.keeps(len(seqs), k) and all(
            s.num_cached < room and s.params.max_tokens - len(s.output_ids) > 2 * (k + 1)
            for s in seqs
        )

    def _propose(self, rows: list[SpecRow], k: int) -> list[Draft]:
        """Group rows by method, draft, and give rows near the context end no drafts."""
        drafts: list[Draft | None] = [None] * len(rows)
        groups: dict[SpecMethod, list[int]] = {}
        budget = 1 + self.beams * k  # most tree nodes a row can bring
        for i, row in enumerate(rows):
            if row.seq.num_cached + budget <= self.runner.max_seq_len:
                groups.setdefault(self.method_of(row.seq), []).append(i)
        for method, idxs in groups.items():
            proposer = self.proposer(method)
            if proposer is None:
                continue
            for i, d in zip(idxs, proposer.propose([rows[i] for i in idxs], k), strict=True):
                drafts[i] = d
        return [d or Draft.chain(r.seq.last_token, []) for d, r in zip(drafts, rows, strict=True)]

    def _accept(
        self, rows: list[SpecRow], drafts: list[Draft], batch: TreeBatch, logits: Tensor,
        hidden: Tensor, base: list[int], slots: list[int],
    ) -> tuple[list[list[int]], Tensor]:  # fmt: skip
        """Accept on the device, move accepted tree K/V into place, then read the outcome once:
        per row [accepted, committed tokens..., -1...] on the host, and the hidden state [B, H]
        of each row's last accepted node (the next draft starts from it)."""
        accepted, path, tokens = batch.greedy_accept(logits)
        for b, (row, draft) in enumerate(zip(rows, drafts, strict=True)):
            if not row.greedy:
                self._sample_row(b, row, draft, batch, logits[b], (accepted, path, tokens))
        if batch.width > 1:
            dev = self.runner.device
            cache = (self.runner.cache.k, self.runner.cache.v)
            slot_t, base_t = torch.tensor(slots, device=dev), torch.tensor(base, device=dev)
            move_path(cache, slot_t, base_t, path)
            for proposer in filter(None, map(self.proposer, {self.method_of(r.seq) for r in rows})):
                moved = getattr(proposer, "moved", None)  # what a drafter keeps per position
                if moved is not None:
                    moved(slot_t, base_t, path)
        node = path.gather(1, accepted[:, None])  # [B, 1]
        last = hidden.gather(1, node[..., None].expand(-1, -1, hidden.shape[-1]))[:, 0]
        return torch.cat([accepted[:, None], tokens], 1).tolist(), last  # the one host sync

    def _sample_row(
        self, b: int, row: SpecRow, draft: Draft, batch: TreeBatch, logits: Tensor, into: tuple
    ) -> None:
        """Lossless speculative sampling of row ``b``'s chain (beam 0), on the logits' device;
        the outcome overwrites the row's entries of ``into`` = (accepted, path, tokens)."""
        accepted, path, tokens = into
        depth = draft.depth
        assert row.warp is not None
        p = row.warp(logits[: depth + 1])  # [1 + K, V]
        q = None if draft.q is None else draft.q.to(p.device)[None]
        verdict = sample_verify(
            batch.beams[b, 0, 1 : depth + 1][None], p[None], q, row.seq.generator
        )
        accepted[b] = verdict.accepted[0]
        steps = torch.arange(path.shape[1], device=path.device)
        path[b] = torch.minimum(steps, verdict.accepted[0])
        tokens[b] = -1
        tokens[b, : depth + 1] = verdict.tokens[0]

    def _commit(self, row: SpecRow, draft: Draft, host: list[int], hidden: Tensor) -> list[int]:
        """Record a row's outcome (``host`` = accepted count, then committed tokens, then -1)."""
        seq, n_acc = row.seq, host[0]
        tokens = host[1 : n_acc + 2]
        base = seq.num_cached
        seq.num_cached = base + n_acc + 1
        track = self._tracks[seq.request_id]
        track.hidden = hidden
        proposer = self.proposer(self.method_of(seq)) if draft.depth else None
        if proposer is not None:
            proposer.accepted(row, base, n_acc)
        for stats in (self.stats, track.stats):
            stats.record(draft.depth, n_acc, len(tokens))
        return tokens


def _mirror(seq: Sequence, stats: SpecStats) -> None:
    """Copy a request's acceptance counters into its metrics (read by the server and CLI)."""
    seq.metrics.speculative = stats.as_dict()
