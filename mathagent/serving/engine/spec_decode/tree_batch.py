"""One speculative step's drafts as device tensors: node layout, greedy acceptance, K/V moves.

Every row's beams are padded to one ``[W, 1 + D]`` block (missing beams repeat beam 0, missing
drafts are -1, which no argmax matches) and flattened to nodes: the root, then each beam's
drafts, ``D`` of each, or ``lengths[w]`` of beam ``w`` when the beams are ragged (EAGLE-3's
chain of ``k`` beside a longer prompt-lookup chain: the columns past a beam's length are
padding that gets no node, and the longest beam's nodes come first, :func:`layout`). Beams
are not merged into a prefix tree: merging needs the tokens on the host, and a shared prefix
only costs verify width, which on a GPU is nearly free. So the tree mask, the rope depths and
each node's parent depend only on the beams' lengths: built once per shape on the device and
shared by all rows. Acceptance is the longest beam prefix that equals the target's argmax
(first beam on ties, so a chain behaves exactly like greedy verification).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import NamedTuple

import torch
from torch import Tensor

from mathagent.serving.engine.sampler import Cuts, Sampler, SamplingBatch, greedy_tokens
from mathagent.serving.engine.spec_decode.proposal import Draft
from mathagent.serving.engine.spec_decode.verify import sample_verify_at


@dataclass
class TreeBatch:
    """Drafts of all rows of a step on the device."""

    beams: Tensor  # [B, W, 1 + D] int64, column 0 the root; -1 past a row's drafts
    depths: list[int]  # drafts per beam of each row (host values)
    lengths: tuple[int, ...] | None = None  # drafts each beam verifies; None: D each

    @classmethod
    def stack(cls, drafts: list[Draft], device: torch.device) -> TreeBatch:
        """Pad every row's beams to one block (a row's tensors may live on host or device)."""
        width = max(d.beams.shape[0] for d in drafts)
        depth = max(d.depth for d in drafts)
        rows = [_pad(d.beams, width, depth) for d in drafts]
        if all(r.device.type == "cpu" for r in rows):  # one copy to the device, not one per row
            return cls(torch.stack(rows).to(device), [d.depth for d in drafts])
        return cls(torch.stack([r.to(device) for r in rows]), [d.depth for d in drafts])

    @property
    def width(self) -> int:
        return self.beams.shape[1]

    @property
    def depth(self) -> int:
        return self.beams.shape[2] - 1

    @property
    def nodes(self) -> int:
        return 1 + sum(self.shape)

    @property
    def shape(self) -> tuple[int, ...]:
        """Drafts each beam verifies."""
        return self.lengths or (self.depth,) * self.width

    def layout(self) -> Layout:
        return layout(self.shape, self.depth, self.beams.device)

    def tokens(self) -> Tensor:
        """Input tokens of the verify step [B, nodes] (padding fed as token 0)."""
        return self.beams.flatten(1)[:, self.layout().gather].clamp(min=0)

    def node_depths(self) -> Tensor:
        """Rope offset of each node from the row's first new position [nodes]."""
        return self.layout().depths

    def mask(self) -> Tensor | None:
        """[nodes, nodes] bool (node i sees node j); None for chains, which are causal."""
        return None if self.width == 1 else self.layout().mask

    def greedy_accept(self, logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Longest beam prefix equal to the target's argmax.

        logits: [B, nodes, V]. Returns ``accepted [B]``, ``path [B, 1 + D]`` (node of each
        committed position, root first; past ``accepted`` the node is repeated harmlessly) and
        ``tokens [B, 1 + D]`` (accepted drafts, then the target's own token, then -1).
        """
        if self.depth == 0:
            pred = greedy_tokens(logits)
            return pred.new_zeros(pred.shape[0]), pred.new_zeros(pred.shape[0], 1), pred[:, :1]
        lay = self.layout()
        return accept_longest(self.beams, logits, lay.parents, lay.offsets)

    def parents(self) -> Tensor:
        """Each draft column's parent node ``[W * D]`` (the root is node 0; a padding column,
        which matches nothing, names the root)."""
        return self.layout().parents

    def offsets(self) -> Tensor:
        """The node of each beam's first draft ``[W]``."""
        return self.layout().offsets


def accept_longest(
    beams: Tensor, logits: Tensor, parents: Tensor, offsets: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """:meth:`TreeBatch.greedy_accept` of ``beams [B, W, 1 + D]`` (``D >= 1``) with the
    shape's ``parents`` and beam ``offsets`` (None: every beam ``D`` nodes): tensors only, so a
    captured step compiles it into a few kernels."""
    b, w, d = beams.shape[0], beams.shape[1], beams.shape[2] - 1
    pred = greedy_tokens(logits)  # [B, nodes]
    match = beams[:, :, 1:] == pred[:, parents].view(b, w, d)
    per_beam = match.long().cumprod(-1).sum(-1)  # [B, W]
    accepted, best = per_beam.max(-1)
    steps = torch.arange(d + 1, device=pred.device)
    if offsets is None:
        offsets = 1 + torch.arange(w, device=pred.device) * d
    first = offsets[best]  # [B] the node of the best beam's first draft
    last_node = torch.where(accepted > 0, first + accepted - 1, 0)
    path = torch.minimum(first[:, None] + steps[None] - 1, last_node[:, None])
    path[:, 0] = 0
    drafts = beams[torch.arange(b, device=pred.device), best, 1:]  # [B, D]
    last = pred.gather(1, path.gather(1, accepted[:, None]))  # [B, 1]
    tokens = torch.cat([drafts, drafts.new_full((b, 1), -1)], 1)
    tokens = torch.where(steps[None] < accepted[:, None], tokens, -1)
    tokens.scatter_(1, accepted[:, None], last)
    return accepted, path, tokens


SAMPLING_COLUMNS = 3  # a step's sampling row: temperature, top-p, top-k, then its uniforms


def sampling_row(temperature: float, top_p: float, top_k: int, uniforms: Tensor) -> Tensor:
    """One row of :func:`accept_sampled`'s ``sampling`` (float64): the request's warp and
    the ``D + 1`` uniforms its generator drew for the step; temperature 0 keeps it greedy."""
    warp = torch.tensor([temperature, top_p, float(top_k)], dtype=torch.float64)
    return torch.cat([warp, uniforms.to(torch.float64)])


def accept_sampled(
    beams: Tensor, logits: Tensor, sampling: Tensor, greedy: tuple[Tensor, Tensor, Tensor],
    cuts: Cuts, q: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Rows with a temperature take lossless speculative sampling of their first beam (the
    drafter's chain: drawn from ``q [B, D, V]``, or drafted deterministically when None: q
    one-hot); the others keep ``greedy``, the outcome of :func:`accept_longest`. Same outputs
    as it; no host sync, so it runs inside a captured step.

    sampling: ``[B, 3 + D + 1 (+ D)]`` rows of :func:`sampling_row` (the drafter's own
    uniforms last); ``cuts``: the cuts any of them asks for (the captured graph's own).
    """
    b, d = beams.shape[0], beams.shape[2] - 1
    temperature, top_p, top_k = sampling[:, :SAMPLING_COLUMNS].T
    per_node = SamplingBatch(
        temperature.float().repeat_interleave(d + 1), top_p.float().repeat_interleave(d + 1),
        top_k.long().repeat_interleave(d + 1), [], False, cuts,
    )  # fmt: skip
    chain = logits[:, : d + 1]  # the root, then beam 0's nodes 1 .. D
    p = Sampler.probs(chain.reshape(b * (d + 1), -1), per_node).view(b, d + 1, -1)
    u = sampling[:, SAMPLING_COLUMNS : SAMPLING_COLUMNS + d + 1]
    verdict = sample_verify_at(beams[:, 0, 1:], p, q, u)
    steps = torch.arange(d + 1, device=beams.device)
    path = torch.minimum(steps[None], verdict.accepted[:, None])  # beam 0's node j is node j
    sampled = temperature > 0
    accepted, greedy_path, tokens = greedy
    return (
        torch.where(sampled, verdict.accepted, accepted),
        torch.where(sampled[:, None], path, greedy_path),
        torch.where(sampled[:, None], verdict.tokens, tokens),
    )


def _pad(beams: Tensor, width: int, depth: int) -> Tensor:
    """``beams [w, 1 + d]`` as ``[width, 1 + depth]``: drafts padded with -1, beams repeated."""
    beams = torch.nn.functional.pad(beams, (0, depth + 1 - beams.shape[1]), value=-1)
    return beams[torch.arange(width, device=beams.device).clamp(max=beams.shape[0] - 1)]


class Layout(NamedTuple):
    """The nodes of one tree shape, on the device."""

    depths: Tensor  # [n] rope offset of each node from the root
    mask: Tensor  # [n, n] bool: node i sees node j
    parents: Tensor  # [W * D] the parent node of each draft column (padding: the root)
    offsets: Tensor  # [W] the node of each beam's first draft
    gather: Tensor  # [n] each node's column in a row's flattened [W, 1 + D] beams


@cache
def layout(lengths: tuple[int, ...], depth: int, device: torch.device) -> Layout:
    """The :class:`Layout` of beams drafting ``lengths[w]`` tokens each, padded to ``depth``.

    Nodes go root first, then beam by beam, the longest beam first (ties in beam order): an
    accepted path then moves its K/V (``move_path``, one program per position) from nodes that
    lie at or past every position it writes, so no move overwrites what another reads. With a
    short chain ahead of a long beam, a long accepted stretch of it would be moved onto itself.
    """
    order = sorted(range(len(lengths)), key=lambda w: -lengths[w])
    beam, step, offsets = [-1], [0], [0] * len(lengths)  # the root
    for w in order:
        offsets[w] = len(beam)
        beam += [w] * lengths[w]
        step += list(range(1, lengths[w] + 1))
    parents = [
        0 if j == 0 or j >= n else offsets[w] + j - 1
        for w, n in enumerate(lengths)
        for j in range(depth)
    ]
    gather = [0] + [w * (depth + 1) + j for w in order for j in range(1, lengths[w] + 1)]
    beams, depths = torch.tensor(beam, device=device), torch.tensor(step, device=device)
    same = (beams[:, None] == beams[None]) & (depths[None] <= depths[:, None])
    mask = same | (depths[None] == 0)

    def t(x: list[int]) -> Tensor:
        return torch.tensor(x, dtype=torch.long, device=device)

    return Layout(depths, mask, t(parents), t(offsets), t(gather))


def move_path(cache_kv: tuple[Tensor, Tensor], slots: Tensor, base: Tensor, path: Tensor) -> None:
    """Move the K/V of each row's accepted path to consecutive positions after ``base``.

    cache tensors [L, S, Hkv, max_seq, D]; slots, base [B]; path [B, 1 + D] node indices.
    Positions past a row's accepted length repeat its last node (a copy nobody reads).
    """
    src = base[:, None] + path
    dst = base[:, None] + torch.arange(path.shape[1], device=path.device)
    rows = slots[:, None]
    for kv in cache_kv:
        kv[:, rows, :, dst] = kv[:, rows, :, src]
