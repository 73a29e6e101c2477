"""Sampled acceptance inside a captured chain step, as tensor functions on the CPU.

:func:`accept_sampled` is what a :class:`ChainStep` graph runs for a batch with sampled rows: it
must give greedy rows the greedy outcome and sampled rows exactly what the host path's rule
(:func:`sample_verify` on the chain, the warp of :meth:`Sampler.probs`) gives at the same
uniforms. The warp (one order of the logits for both cuts, none when no row cuts) must follow the
sorted rule.
"""

from __future__ import annotations

import torch

from mathagent.serving.engine.sampler import Cuts, Sampler, SamplingBatch
from mathagent.serving.engine.sampling_params import SamplingParams
from mathagent.serving.engine.spec_decode.tree_batch import (
    accept_longest,
    accept_sampled,
    sampling_row,
)
from mathagent.serving.engine.spec_decode.verify import sample_verify, sample_verify_at
from tests.serving.engine.spec_decode.stats import chi_square_p

VOCAB = 50


def _batch(temps, top_ps, top_ks) -> SamplingBatch:
    cuts = Cuts(max(top_ks), any(p < 1.0 for p in top_ps))
    return SamplingBatch(
        torch.tensor(temps), torch.tensor(top_ps), torch.tensor(top_ks), [], False, cuts
    )


def _sorted_rule(logits, temps, top_ps, top_ks) -> torch.Tensor:
    """The warp as the rule reads, one row at a time over a full descending sort: temperature,
    keep the k largest, then keep a token while the mass before it is below top-p."""
    out = []
    for row, t, top_p, top_k in zip(logits, temps, top_ps, top_ks, strict=True):
        row = row / (t if t > 0 else 1.0)
        order = row.argsort(descending=True)
        keep = torch.ones_like(row, dtype=torch.bool)
        if top_k:
            keep[order[top_k:]] = False
        if top_p < 1.0:
            mass = row.masked_fill(~keep, float("-inf")).softmax(-1)[order]
            before = mass.cumsum(0) - mass
            keep[order[before >= top_p]] = False
        out.append(row.masked_fill(~keep, float("-inf")).softmax(-1))
    return torch.stack(out)


def test_the_warp_follows_the_sorted_rule_from_one_order() -> None:
    gen = torch.Generator().manual_seed(0)
    for trial in range(20):
        logits = torch.randn(4, VOCAB, generator=gen) * 3
        for warp in (
            ([0.7, 1.0, 0.0, 1.3], [0.9, 1.0, 0.8, 1.0], [0, 5, 3, 0]),  # both cuts, mixed rows
            ([0.7, 1.0, 0.5, 1.3], [1.0, 1.0, 1.0, 1.0], [0, 7, 2, 60]),  # top-k only: topk
            ([0.7, 1.0, 0.5, 1.3], [0.5, 1.0, 0.99, 0.2], [0, 0, 0, 0]),  # top-p only
            ([0.7, 1.0, 0.5, 1.3], [1.0, 1.0, 1.0, 1.0], [0, 0, 0, 0]),  # no cut: no order
        ):
            got = Sampler.probs(logits, _batch(*warp))
            assert torch.allclose(got, _sorted_rule(logits, *warp), atol=1e-6), (trial, warp)
    whole = Sampler.probs(logits, _batch([1.0] * 4, [1.0] * 4, [0] * 4))
    assert torch.allclose(whole, logits.softmax(-1), atol=1e-7)  # top-p 1 keeps every token


def test_a_batch_without_cuts_sorts_nothing(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("sorted a batch that asks for no cut")

    monkeypatch.setattr(torch.Tensor, "sort", refuse)
    monkeypatch.setattr(torch.Tensor, "topk", refuse)
    logits = torch.randn(3, VOCAB)
    params = [SamplingParams(temperature=t) for t in (0.5, 1.0, 0.0)]
    batch = SamplingBatch.build(params, [None] * 3, torch.device("cpu"))
    assert batch.cuts == Cuts()
    probs = Sampler.probs(logits, batch)
    assert torch.allclose(probs[0], (logits[0] / 0.5).softmax(-1))


def test_sample_verify_draws_its_uniforms_from_the_generator() -> None:
    gen = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(3, 4, VOCAB, generator=gen), -1)
    q = torch.softmax(torch.randn(3, 3, VOCAB, generator=gen), -1)
    drafts = torch.randint(0, VOCAB, (3, 3), generator=gen)
    for draft_probs in (None, q):
        a = sample_verify(drafts, p, draft_probs, torch.Generator().manual_seed(9))
        u = torch.rand((3, 4), generator=torch.Generator().manual_seed(9), dtype=torch.float64)
        b = sample_verify_at(drafts, p, draft_probs, u)
        assert torch.equal(a.accepted, b.accepted) and torch.equal(a.tokens, b.tokens)


def _step_inputs(seed: int, rows: int, width: int, depth: int):
    gen = torch.Generator().manual_seed(seed)
    nodes = 1 + width * depth
    logits = torch.randn(rows, nodes, VOCAB, generator=gen) * 2
    beams = torch.randint(0, VOCAB, (rows, width, 1 + depth), generator=gen)
    # drafts that are often the target's argmax, so some rows accept several
    pred = logits.argmax(-1)
    for b in range(rows):
        for d in range(depth):
            if torch.rand(1, generator=gen) < 0.7:
                beams[b, 0, 1 + d] = pred[b, d]
    beams[:, 1:, 0] = beams[:, :1, 0]
    parents = torch.where(torch.arange(width * depth) % depth == 0, 0, torch.arange(width * depth))
    return beams, logits, parents


def test_sampled_rows_follow_the_host_rule_and_greedy_rows_stay_greedy() -> None:
    depth, width, rows = 4, 2, 5
    warps = [None, (0.8, 0.9, 0), None, (1.2, 1.0, 4), (0.5, 0.95, 10)]
    for seed in range(30):
        beams, logits, parents = _step_inputs(seed, rows, width, depth)
        greedy = accept_longest(beams, logits, parents)
        draws = torch.rand(rows, depth + 1, generator=torch.Generator().manual_seed(seed),
                           dtype=torch.float64)  # fmt: skip
        sampling = torch.stack([
            sampling_row(0.0, 1.0, 0, draws[b]) if w is None else sampling_row(*w, draws[b])
            for b, w in enumerate(warps)
        ])  # fmt: skip
        cuts = Cuts(10, True)
        accepted, path, tokens = accept_sampled(beams, logits, sampling, greedy, cuts)
        for b, w in enumerate(warps):
            if w is None:
                assert accepted[b] == greedy[0][b] and torch.equal(path[b], greedy[1][b])
                assert torch.equal(tokens[b], greedy[2][b])
                continue
            p = Sampler.probs(logits[b, : depth + 1], _batch([w[0]] * 5, [w[1]] * 5, [w[2]] * 5))
            want = sample_verify_at(beams[b : b + 1, 0, 1:], p[None], None, draws[b : b + 1])
            assert accepted[b] == want.accepted[0]
            assert tokens[b].tolist() == want.tokens[0].tolist()
            assert path[b].tolist() == [min(j, int(want.accepted[0])) for j in range(depth + 1)]


def test_the_first_committed_token_follows_the_warped_target() -> None:
    """Over many uniforms the token a sampled row commits first has the warped law of the
    root's logits, whatever the chain drafted (lossless); a test that can fail: the chain's
    first draft alone would not."""
    depth, n = 3, 6000
    beams, logits, parents = _step_inputs(3, 1, 1, depth)
    beams, logits = beams.expand(n, -1, -1), logits.expand(n, -1, -1)
    greedy = accept_longest(beams, logits, parents)
    draws = torch.rand(
        n, depth + 1, generator=torch.Generator().manual_seed(4), dtype=torch.float64
    )
    sampling = torch.stack([sampling_row(0.9, 1.0, 0, draws[b]) for b in range(n)])
    _, _, tokens = accept_sampled(beams, logits, sampling, greedy, Cuts())
    law = Sampler.probs(logits[:1, 0], _batch([0.9], [1.0], [0]))[0]
    counts = torch.bincount(tokens[:, 0], minlength=VOCAB)
    assert chi_square_p(counts, law) > 0.01
    first_draft = torch.zeros(VOCAB)
    first_draft[beams[0, 0, 1]] = 1.0
    assert chi_square_p(counts, first_draft + 1e-3) < 0.01


def test_chains_drawn_from_q_keep_the_warped_target_law() -> None:
    """A drafter that samples its chain (EAGLE-3's head in the one-graph step) hands its laws
    ``q``; the first committed token still has the target's warped law, and a q near p
    accepts more than the argmax chain of the same q."""
    depth, n = 3, 6000
    _, logits, parents = _step_inputs(5, 1, 1, depth)
    logits = logits.expand(n, -1, -1)
    gen = torch.Generator().manual_seed(6)
    # the drafter's laws: the target's own at each node, blurred (close to p, not equal)
    q = torch.softmax(
        logits[:1, :depth] / 0.9 + 0.3 * torch.randn(1, depth, VOCAB, generator=gen), -1
    )
    drafts = torch.stack([torch.multinomial(q[0, j], n, replacement=True, generator=gen)
                          for j in range(depth)], 1)  # fmt: skip
    beams = torch.cat([torch.zeros(n, 1, dtype=torch.long), drafts], 1)[:, None]  # [n, 1, 1 + d]
    greedy = accept_longest(beams, logits, parents)
    draws = torch.rand(
        n, 2 * depth + 1, generator=torch.Generator().manual_seed(7), dtype=torch.float64
    )
    sampling = torch.stack([sampling_row(0.9, 1.0, 0, draws[b]) for b in range(n)])
    accepted, _, tokens = accept_sampled(
        beams, logits, sampling, greedy, Cuts(), q.expand(n, -1, -1)
    )
    law = Sampler.probs(logits[:1, 0], _batch([0.9], [1.0], [0]))[0]
    counts = torch.bincount(tokens[:, 0], minlength=VOCAB)
    assert chi_square_p(counts, law) > 0.01
    argmax_chain = q[0].argmax(-1).expand(n, -1)
    one_hot_beams = torch.cat([torch.zeros(n, 1, dtype=torch.long), argmax_chain], 1)[:, None]
    one_hot, _, _ = accept_sampled(one_hot_beams, logits, sampling, greedy, Cuts())
    assert accepted.double().mean() > one_hot.double().mean()
