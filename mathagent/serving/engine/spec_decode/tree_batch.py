"""One speculative step's drafts as device tensors: node layout, greedy acceptance, K/V moves.

Every row's beams are padded to one ``[W, 1 + D]`` block (missing beams repeat beam 0, missing
drafts are -1, which no argmax matches) and flattened to ``1 + W * D`` nodes: the root, then
each beam's drafts. Beams are not merged into a prefix tree: merging needs the tokens on the
host, and a shared prefix only costs verify width, which on a GPU is nearly free. So the tree
mask, the rope depths and each node's parent depend only on ``(W, D)``: built once per shape on
the device and shared by all rows. Acceptance is the longest beam prefix that equals the
target's argmax (first beam on ties, so a chain behaves exactly like greedy verification).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

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
        return 1 + self.width * self.depth

    def tokens(self) -> Tensor:
        """Input tokens of the verify step [B, nodes] (padding fed as token 0)."""
        flat = torch.cat([self.beams[:, 0, :1], self.beams[:, :, 1:].flatten(1)], 1)
        return flat.clamp(min=0)

    def node_depths(self) -> Tensor:
        """Rope offset of each node from the row's first new position [nodes]."""
        return _layout(self.width, self.depth, self.beams.device)[0]

    def mask(self) -> Tensor | None:
        """[nodes, nodes] bool (node i sees node j); None for chains, which are causal."""
        return None if self.width == 1 else _layout(self.width, self.depth, self.beams.device)[1]

    def greedy_accept(self, logits: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Longest beam prefix equal to the target's argmax.

        logits: [B, nodes, V]. Returns ``accepted [B]``, ``path [B, 1 + D]`` (node of each
        committed position, root first; past ``accepted`` the node is repeated harmlessly) and
        ``tokens [B, 1 + D]`` (accepted drafts, then the target's own token, then -1).
        """
        if self.depth == 0:
            pred = greedy_tokens(logits)
            return pred.new_zeros(pred.shape[0]), pred.new_zeros(pred.shape[0], 1), pred[:, :1]
        return accept_longest(self.beams, logits, self.parents())

    def parents(self) -> Tensor:
        """Each draft node's parent node ``[W * D]`` (the root is node 0)."""
        return _layout(self.width, self.depth, self.beams.device)[2]


def accept_longest(beams: Tensor, logits: Tensor, parents: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """:meth:`TreeBatch.greedy_accept` of ``beams [B, W, 1 + D]`` (``D >= 1``) with the
    shape's ``parents``: tensors only, so a captured step compiles it into a few kernels."""
    b, w, d = beams.shape[0], beams.shape[1], beams.shape[2] - 1
    pred = greedy_tokens(logits)  # [B, nodes]
    match = beams[:, :, 1:] == pred[:, parents].view(b, w, d)
    per_beam = match.long().cumprod(-1).sum(-1)  # [B, W]
    accepted, best = per_beam.max(-1)
    steps = torch.arange(d + 1, device=pred.device)
    last_node = torch.where(accepted > 0, best * d + accepted, 0)  # node 1 + best*d + acc-1
    path = torch.minimum(1 + best[:, None] * d + steps[None] - 1, last_node[:, None])
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


@cache
def _layout(width: int, depth: int, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """Node depths [n], tree mask [n, n] and each draft node's parent [W * D] for a shape."""
    steps = torch.arange(1, depth + 1, device=device)
    depths = torch.cat([steps.new_zeros(1), steps.repeat(width)])
    beam = torch.cat(
        [steps.new_full((1,), -1), torch.arange(width, device=device).repeat_interleave(depth)]
    )
    same = (beam[:, None] == beam[None]) & (depths[None] <= depths[:, None])
    mask = same | (depths[None] == 0)
    flat = torch.arange(width * depth, device=device)
    parents = torch.where(flat % depth == 0, 0, flat)  # node 1 + f - 1 = f is the previous one
    return depths, mask, parents


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
