"""N-gram on the CUDA graphs takes the one-graph chain step (``ngram_device.py`` drafting inside
``ChainStep``'s graph, launched one ahead): output equals plain greedy in float32, the same
tokens are drafted as on the host path, and steps launched ahead are used.

Runs only where CUDA and Triton exist; skips on CPU. A float32 model with sharp random weights
on prompts that repeat themselves, so lookups land.
"""

from __future__ import annotations

import pytest
import torch

from mathagent.serving.engine.cuda import kernels as cuda_kernels
from tests.serving.engine.cuda import tiny

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_kernels.available(), reason="needs a CUDA device and Triton"),
]


def test_ngram_on_graphs_is_one_graph_per_step_and_stays_plain_greedy() -> None:
    from mathagent.serving.engine.sampling_params import SamplingParams
    from mathagent.serving.engine.spec_config import SpecMethod

    model = tiny.sharp_model()
    gen = torch.Generator().manual_seed(3)
    base = torch.randint(0, 512, (6,), generator=gen).tolist()
    prompts = [base * 4, (base[::-1] * 3)[:15], base * 2 + [7, 8]]
    plain = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, speculative="none")
    spec = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    eager = tiny.engine(model, True, "ngram", draft_len=4)
    reference = [r.token_ids for r in eager.generate(prompts, plain)]
    host = eager.generate(prompts, spec)
    graphs = tiny.engine(model, False, "ngram", draft_len=4)
    fused = graphs.generate(prompts, spec)
    assert [r.token_ids for r in host] == reference
    assert [r.token_ids for r in fused] == reference
    proposer = graphs.speculator.proposer(SpecMethod("ngram", None))
    assert proposer.fused is not None and proposer.fused.steps.captured(), "no one-graph step"
    assert proposer.fused.steps.claimed > 0, "no step launched ahead was used"
    assert sum(r.metrics.speculative["accepted_tokens"] for r in fused) > 0


def test_sampled_ngram_rows_take_the_one_graph_step() -> None:
    """Sampled requests (with greedy ones in the same batches) run the one-graph step with
    sampled acceptance: greedy rows stay plain greedy, a seed gives the same tokens again from
    the same cache state (a cached prompt starts on another schedule, and a step launched
    ahead and thrown away draws too), and lookups are accepted at a low temperature."""
    from mathagent.serving.engine.sampling_params import SamplingParams
    from mathagent.serving.engine.spec_config import SpecMethod

    model = tiny.sharp_model()
    base = torch.randint(0, 512, (6,), generator=torch.Generator().manual_seed(3)).tolist()
    prompts = [base * 4, base * 3 + [7], base * 4, base * 2 + [7, 8]]
    greedy = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    # near-greedy sampling: the random model falls into its cycles, where lookups land
    sampled = [SamplingParams(max_tokens=40, temperature=0.05, seed=s, ignore_eos=True)
               for s in (1, 2)]  # fmt: skip
    params = [greedy, sampled[0], greedy, sampled[1]]
    engine = tiny.engine(model, False, "ngram", draft_len=4)
    reference = [r.token_ids for r in engine.generate([prompts[0], prompts[2]],
                 greedy.model_copy(update={"speculative": "none"}))]  # fmt: skip
    engine.generate(prompts, params)  # the prompts cached: the runs below start alike
    first = engine.generate(prompts, params)
    again = engine.generate(prompts, params)
    assert [first[0].token_ids, first[2].token_ids] == reference
    assert [r.token_ids for r in again] == [r.token_ids for r in first]
    assert all(len(r.token_ids) == 40 for r in first)
    steps = engine.speculator.proposer(SpecMethod("ngram", None)).fused.steps
    assert steps.sampled_launches > 0, "sampled rows did not take the one-graph step"
    assert sum(first[i].metrics.speculative["accepted_tokens"] for i in (1, 3)) > 0
