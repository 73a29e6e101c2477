"""Verification as pure tensor functions: greedy, speculative sampling, prefix trees."""

from __future__ import annotations

import torch

from mathagent.serving.engine.spec_decode.verify import (
    build_tree,
    greedy_verify,
    sample_verify,
    tree_greedy_verify,
)
from tests.serving.engine.spec_decode.stats import chi_square_p


def _onehot_logits(tokens: list[list[int]], vocab: int = 10) -> torch.Tensor:
    out = torch.zeros(len(tokens), len(tokens[0]), vocab)
    for b, row in enumerate(tokens):
        for t, tok in enumerate(row):
            out[b, t, tok] = 5.0
    return out


def test_greedy_accepts_matching_prefix_then_target_token() -> None:
    drafts = torch.tensor([[1, 2, 3], [1, 9, 3], [-1, -1, -1], [4, 5, -1]])
    logits = _onehot_logits([[1, 2, 3, 7], [1, 2, 3, 7], [6, 0, 0, 0], [4, 5, 8, 0]])
    v = greedy_verify(drafts, logits)
    assert v.accepted.tolist() == [3, 1, 0, 2]
    assert v.tokens.tolist() == [[1, 2, 3, 7], [1, 2, -1, -1], [6, -1, -1, -1], [4, 5, 8, -1]]


def test_tree_merges_shared_prefixes_and_walks_the_argmax() -> None:
    beams = torch.tensor([[5, 1, 2, 3], [5, 1, 4, 6], [5, 7, 8, 9]])
    tree = build_tree(beams)
    assert tree.tokens.tolist() == [5, 1, 2, 3, 4, 6, 7, 8, 9]
    assert tree.depths.tolist() == [0, 1, 2, 3, 2, 3, 1, 2, 3]
    assert tree.mask[5].nonzero().flatten().tolist() == [0, 1, 4, 5]
    # target says: after 5 -> 1, after 1 -> 4, after 4 -> 0 (no such child): accept [1, 4] + 0
    pred = [1, 4, 0, 0, 0, 0, 0, 0, 0]
    logits = torch.nn.functional.one_hot(torch.tensor(pred), 10).float()
    path, toks = tree_greedy_verify(tree, logits)
    assert path == [0, 1, 4]
    assert toks == [1, 4, 0]


def _two_token_marginals(deterministic: bool) -> None:
    """First and second committed tokens follow p exactly, whatever the drafter does."""
    g = torch.Generator().manual_seed(0)
    vocab, n = 6, 20000
    p = torch.softmax(torch.randn(1, 3, vocab, generator=g) * 1.5, -1).expand(n, 3, vocab)
    q = torch.softmax(torch.randn(1, 2, vocab, generator=g) * 1.5, -1).expand(n, 2, vocab)
    if deterministic:
        drafts = torch.tensor([[2, 3]]).expand(n, 2).contiguous()
        verdict = sample_verify(drafts, p, None, g)
    else:
        drafts = torch.stack(
            [torch.multinomial(q[:, i], 1, generator=g).squeeze(1) for i in range(2)], 1
        )
        verdict = sample_verify(drafts, p, q, g)
    first = verdict.tokens[:, 0]
    assert chi_square_p(torch.bincount(first, minlength=vocab), p[0, 0]) > 0.01
    # the second token's law given the first is p[1] when the context is fixed (p ignores it here)
    second = verdict.tokens[:, 1]
    has_second = second >= 0
    counts = torch.bincount(second[has_second], minlength=vocab)
    assert chi_square_p(counts, p[0, 1]) > 0.01


def test_sampling_with_a_drafter_distribution_is_exact() -> None:
    _two_token_marginals(deterministic=False)


def test_sampling_with_a_deterministic_proposer_is_exact() -> None:
    _two_token_marginals(deterministic=True)


def test_sampling_accepts_everything_when_q_equals_p() -> None:
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(500, 3, 8, generator=g), -1)
    drafts = torch.stack(
        [torch.multinomial(p[:, i], 1, generator=g).squeeze(1) for i in range(2)], 1
    )
    v = sample_verify(drafts, p, p[:, :2], g)
    assert (v.accepted == 2).all()
