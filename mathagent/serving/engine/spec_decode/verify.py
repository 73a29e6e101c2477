"""Lossless verification of drafted tokens, as pure tensor functions.

Greedy: drafts are accepted while they equal the target's argmax; the target's own token follows.
Sampling (Leviathan et al. / Chen et al.): draft ``d`` drawn from ``q`` is accepted with
probability ``min(1, p(d) / q(d))``; on rejection the next token is drawn from
``norm(max(0, p - q))``; when every draft passes a bonus token is drawn from the next ``p``.
A deterministic proposer (n-gram) is the special case ``q = one_hot(d)``.
Trees (ReDrafter): candidate beams are merged into a prefix tree, verified in one target pass
under a tree attention mask, and the longest path the target agrees with is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class Verdict:
    """Outcome of verifying one batch of chains."""

    accepted: Tensor  # [B] drafts accepted per row
    tokens: Tensor  # [B, K+1] accepted drafts, then the target's token; -1 past accepted + 1


def _emit(drafts: Tensor, accepted: Tensor, last: Tensor) -> Tensor:
    """Rows of ``drafts[:n] + [last]`` padded with -1: the tokens a row commits."""
    b, k = drafts.shape
    out = torch.full((b, k + 1), -1, dtype=torch.long, device=drafts.device)
    cols = torch.arange(k + 1, device=drafts.device)
    keep = cols[None, :k] < accepted[:, None]
    out[:, :k] = torch.where(keep, drafts, out[:, :k])
    out[torch.arange(b, device=drafts.device), accepted] = last
    return out


def greedy_verify(drafts: Tensor, target_logits: Tensor) -> Verdict:
    """Accept drafts while they equal the target's argmax.

    drafts: [B, K] token ids, -1 where a row drafted fewer than K tokens.
    target_logits: [B, K+1, V] target logits at the last committed token and at each draft.
    """
    pred = target_logits.argmax(-1)  # [B, K+1]
    match = (drafts == pred[:, :-1]).long()
    accepted = match.cumprod(1).sum(1)
    last = pred.gather(1, accepted[:, None]).squeeze(1)
    return Verdict(accepted, _emit(drafts, accepted, last))


def _uniform(shape: tuple[int, ...], generator: torch.Generator | None, device) -> Tensor:
    """Uniforms from the request's (host) generator, used on ``device``: the draws stay the
    request's own and the arithmetic stays where the probabilities are."""
    return torch.rand(shape, generator=generator, dtype=torch.float64).to(device)


def _draw(probs: Tensor, u: Tensor) -> Tensor:
    """One sample per row of ``probs`` [B, V] by inverse CDF at the uniforms ``u`` [B] (no host
    sync on a GPU)."""
    cdf = probs.double().cumsum(-1)
    return (cdf <= u.double()[:, None] * cdf[:, -1:]).sum(-1).clamp(max=probs.shape[-1] - 1)


def sample_verify(
    drafts: Tensor,
    target_probs: Tensor,
    draft_probs: Tensor | None,
    generator: torch.Generator | None = None,
) -> Verdict:
    """Speculative sampling: exact samples of the (warped) target distribution.

    drafts: [B, K] token ids, -1 where a row drafted fewer than K tokens.
    target_probs: [B, K+1, V] warped target probabilities p.
    draft_probs: [B, K, V] warped probabilities q the drafts were drawn from, or None for a
        deterministic proposer (q is one-hot on the draft).
    generator: the request's; it draws K + 1 uniforms a row (:func:`sample_verify_at`).
    """
    b, k = drafts.shape
    return sample_verify_at(
        drafts, target_probs, draft_probs, _uniform((b, k + 1), generator, drafts.device)
    )


def sample_verify_at(
    drafts: Tensor, target_probs: Tensor, draft_probs: Tensor | None, u: Tensor
) -> Verdict:
    """:func:`sample_verify` at given uniforms ``u [B, K + 1]`` (float64): column ``i < K``
    decides draft ``i``, column ``K`` draws the token that follows. No host sync and no
    data-dependent shapes, so a captured step runs it (the uniforms copied in with its inputs)."""
    b, k = drafts.shape
    if k == 0:  # nothing drafted: a plain sample from p
        return Verdict(drafts.new_zeros(b), _draw(target_probs[:, 0], u[:, 0])[:, None])
    valid = drafts >= 0
    idx = drafts.clamp(min=0)[..., None]  # [B, K, 1]
    p_d = target_probs[:, :k].gather(-1, idx).squeeze(-1)  # [B, K]
    q_d = torch.ones_like(p_d) if draft_probs is None else draft_probs.gather(-1, idx).squeeze(-1)
    ok = (u[:, :k] * q_d.double() < p_d.double()) & valid  # u < p/q without dividing by q
    accepted = ok.long().cumprod(1).sum(1)
    rows = torch.arange(b, device=drafts.device)
    p_next = target_probs[rows, accepted]  # [B, V]
    rejected = accepted < valid.sum(1)
    if draft_probs is None:
        hit = drafts[rows, accepted.clamp(max=k - 1)].clamp(min=0)
        # scatter, not index_put of a Python number: that copies a host tensor (not in a graph)
        q_next = torch.zeros_like(p_next).scatter_(1, hit[:, None], 1.0)
    else:
        q_next = draft_probs[rows, accepted.clamp(max=k - 1)]
    residual = (p_next - q_next).clamp(min=0)
    mass = residual.sum(-1, keepdim=True)
    # p == q leaves no residual mass, but then rejection had probability zero; p is the safe fallback
    residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p_next)
    dist = torch.where(rejected[:, None], residual, p_next)
    return Verdict(accepted, _emit(drafts, accepted, _draw(dist, u[:, k])))


@dataclass
class Tree:
    """Candidate beams merged into a prefix tree; node 0 is the root (the last sampled token)."""

    tokens: Tensor  # [N] token at each node
    parents: Tensor  # [N] parent node, -1 for the root
    depths: Tensor  # [N] distance from the root (position offset)
    mask: Tensor  # [N, N] bool, node i attends to node j iff j is i or an ancestor of i


def build_tree(beams: Tensor) -> Tree:
    """Merge beams [W, L] (each starting with the same root token) into a prefix tree."""
    rows = beams.tolist()
    tokens, parents, depths = [rows[0][0]], [-1], [0]
    children: dict[tuple[int, int], int] = {}
    for row in rows:
        node = 0
        for depth, tok in enumerate(row[1:], start=1):
            key = (node, tok)
            if key not in children:
                children[key] = len(tokens)
                tokens.append(tok)
                parents.append(node)
                depths.append(depth)
            node = children[key]
    n = len(tokens)
    mask = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):
        mask[i] |= mask[parents[i]]
    return Tree(
        tokens=torch.tensor(tokens, dtype=torch.long),
        parents=torch.tensor(parents, dtype=torch.long),
        depths=torch.tensor(depths, dtype=torch.long),
        mask=mask,
    )


def tree_greedy_verify(tree: Tree, target_logits: Tensor) -> tuple[list[int], list[int]]:
    """Walk the tree along the target's argmax.

    target_logits: [N, V] target logits at each node.
    Returns (path, tokens): accepted node indices starting at the root, and the tokens to commit
    (the accepted drafts followed by the target's own next token).
    """
    pred = target_logits.argmax(-1).tolist()
    parents, toks = tree.parents.tolist(), tree.tokens.tolist()
    child = {(p, t): i for i, (p, t) in enumerate(zip(parents, toks, strict=True)) if p >= 0}
    path = [0]
    while (path[-1], pred[path[-1]]) in child:
        path.append(child[(path[-1], pred[path[-1]])])
    return path, [toks[i] for i in path[1:]] + [pred[path[-1]]]
