"""A draft model on the CUDA graphs with the one-graph chain step (``draft_model_device.py``,
on since run 69): greedy output equals plain greedy in float32, the steps run as
one graph, and steps launched ahead are used.

Runs only where CUDA and Triton exist; skips on CPU. A float32 target with sharp random weights
and a draft model that is the target slightly perturbed (its drafts are often right).
"""

from __future__ import annotations

import copy

import pytest
import torch

from mathagent.serving.engine.cuda import kernels as cuda_kernels
from tests.serving.engine.cuda import tiny

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not cuda_kernels.available(), reason="needs a CUDA device and Triton"),
]


def test_a_draft_model_on_graphs_is_one_graph_per_step_and_stays_plain_greedy() -> None:
    from mathagent.serving.engine.sampling_params import SamplingParams
    from mathagent.serving.engine.spec_config import SpecMethod
    from mathagent.serving.engine.spec_decode.draft_model import DraftModelProposer, draft_runner
    from mathagent.serving.engine.spec_decode.draft_model_device import FusedDraftModel

    model = tiny.sharp_model()
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (12, 7, 20)]
    plain = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    method = SpecMethod("draft", "perturbed")
    spec = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, speculative=str(method))
    outs, fused = [], None
    for eager in (True, False):
        engine = tiny.engine(model, eager)
        proposer = DraftModelProposer(draft_runner(draft, engine.runner))
        if not eager:
            fused = proposer.fused = FusedDraftModel(proposer, engine.runner)
        engine.speculator.proposers.register(method, proposer)
        reference = [r.token_ids for r in engine.generate(prompts, plain)]
        results = engine.generate(prompts, spec)
        assert [r.token_ids for r in results] == reference
        outs.append(results)
    assert fused is not None and fused.steps.captured(), "no one-graph step"
    assert fused.steps.claimed > 0, "no step launched ahead was used"
    accepted = [sum(r.metrics.speculative["accepted_tokens"] for r in rs) for rs in outs]
    assert accepted[1] > 0.5 * accepted[0]  # the device chain drafts as well as the host's
