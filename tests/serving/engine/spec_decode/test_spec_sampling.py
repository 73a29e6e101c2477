"""Speculative sampling is exact: token distributions match plain sampling (chi-square).

A tiny random target (peaked by scaling its head) and drafters that disagree with it: a second
random tiny model, and a random ReDrafter. The first generated token comes from the prefill;
the next two come from the first speculative step (its first and second draft positions), so
their marginals are compared with the exact ones computed from the target.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from mathagent.config import EngineSettings
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.loader import load_model
from mathagent.serving.engine.sampler import Sampler, SamplingBatch
from mathagent.serving.engine.sampling_params import SamplingParams
from mathagent.serving.engine.spec_config import SpecMethod
from mathagent.serving.engine.spec_decode.draft_model import DraftModelProposer, draft_runner
from mathagent.serving.engine.spec_decode.redrafter import Drafter, DrafterConfig, ReDrafterProposer
from tests.serving.engine.spec_decode.stats import chi_square_p

PROMPT = [5, 17, 99, 3]
SAMPLES = 1200
PARAMS = dict(temperature=0.9, top_k=4, top_p=0.95)


@pytest.fixture(scope="module")
def tiny_engine() -> LLMEngine:
    settings = EngineSettings(
        device="cpu", dtype="float32", max_batch_size=48, max_seq_len=64, adaptive_draft=False
    )
    config = EngineConfig.from_settings(settings, "random:tiny")
    loaded = load_model("random:tiny", Path("/nonexistent"), config.device, config.dtype)
    with torch.no_grad():
        loaded.model.output.weight.mul_(12.0)  # peaked distributions: few tokens carry the mass
    engine = LLMEngine(config, Path("/nonexistent"), loaded)
    draft = load_model("random:tiny", Path("/nonexistent"), config.device, config.dtype).model
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.02)
        draft.output.weight.mul_(12.0)
    engine.speculator.proposers.register(
        SpecMethod("draft", "tiny"), DraftModelProposer(draft_runner(draft, engine.runner))
    )
    torch.manual_seed(3)
    drafter = Drafter(
        DrafterConfig(vocab_size=1024, hidden_size=64, exit_dim=128, num_draft_layers=1)
    )
    with torch.no_grad():
        drafter.lm_head[-1].weight.mul_(4.0)
    emb = engine.runner.model.tok_embeddings.weight
    engine.speculator.proposers.register(
        SpecMethod("redrafter", "tiny"), ReDrafterProposer(drafter, emb, 2)
    )
    # the same head drafting from half the vocabulary: q is zero elsewhere, the residual covers it
    narrow = Drafter(replace(drafter.config))
    narrow.load_state_dict(drafter.state_dict())
    narrow.set_draft_vocab(torch.randperm(1024, generator=torch.Generator().manual_seed(5))[:512])
    engine.speculator.proposers.register(
        SpecMethod("redrafter", "tiny-vocab"), ReDrafterProposer(narrow, emb, 2)
    )
    return engine


def _next_probs(engine: LLMEngine, prefix: list[int]) -> torch.Tensor:
    """The warped target distribution after ``prefix`` (slot 0, nothing else running)."""
    toks = torch.tensor([prefix])
    logits, _ = engine.runner.forward(
        toks, torch.arange(len(prefix))[None], [0], logits_last_only=True
    )
    params = SamplingParams(**PARAMS)
    return Sampler.probs(
        logits[:, -1], SamplingBatch.build([params], [None], engine.runner.device)
    )[0]


def _exact_marginals(engine: LLMEngine, depth: int) -> list[torch.Tensor]:
    """Marginal laws of generated tokens 1..depth, by enumerating the (top-k) support."""
    marginals = []
    frontier = [(1.0, [])]
    for _ in range(depth):
        law = torch.zeros(1024, dtype=torch.float64)
        nxt = []
        for weight, path in frontier:
            p = _next_probs(engine, PROMPT + path).double()
            law += weight * p
            nxt += [(weight * float(p[t]), [*path, t]) for t in p.nonzero().flatten().tolist()]
        marginals.append(law)
        frontier = nxt
    return marginals


@pytest.mark.parametrize("method", ["draft:tiny", "redrafter:tiny", "redrafter:tiny-vocab"])
def test_sampling_matches_the_target_distribution(tiny_engine, method) -> None:
    exact = _exact_marginals(tiny_engine, 3)
    params = [
        SamplingParams(max_tokens=3, seed=i, speculative=method, **PARAMS) for i in range(SAMPLES)
    ]
    results = tiny_engine.generate([PROMPT] * SAMPLES, params)
    assert all(len(r.token_ids) == 3 for r in results)
    for pos in range(3):
        counts = torch.bincount(torch.tensor([r.token_ids[pos] for r in results]), minlength=1024)
        p_value = chi_square_p(counts, exact[pos])
        assert p_value > 0.01, (method, pos, p_value)
    stats = [r.metrics.speculative for r in results]
    drafted = sum(s["drafted_tokens"] for s in stats)
    accepted = sum(s["accepted_tokens"] for s in stats)
    assert drafted > 0 and 0 < accepted < drafted  # the drafter is neither ignored nor the target


def test_a_drafter_that_always_wins_would_fail_this_test(tiny_engine) -> None:
    """The test can fail: the draft model's own law differs from the target's."""
    draft_runner_ = tiny_engine.speculator.proposer(SpecMethod("draft", "tiny")).runner
    toks = torch.tensor([PROMPT])
    logits, _ = draft_runner_.forward(toks, torch.arange(4)[None], [0], logits_last_only=True)
    params = SamplingParams(**PARAMS)
    q = Sampler.probs(logits[:, -1], SamplingBatch.build([params], [None], torch.device("cpu")))[0]
    counts = (q * SAMPLES).round()
    assert chi_square_p(counts, _next_probs(tiny_engine, PROMPT)) < 0.01
