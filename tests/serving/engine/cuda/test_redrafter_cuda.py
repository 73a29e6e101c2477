"""ReDrafter on the CUDA graphs with the one-graph chain step (``redrafter_device.py``, on
since run 71): greedy output equals plain greedy in float32, the steps run as
one graph, and steps launched ahead are used.

Runs only where CUDA and Triton exist; skips on CPU. A float32 model with sharp random weights
and a random drafter whose head is the target's own (its drafts are sometimes right).
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


@pytest.mark.parametrize("beams", [1, 3])
def test_redrafter_on_graphs_is_one_graph_per_step_and_stays_plain_greedy(
    monkeypatch, tmp_path, beams
) -> None:
    from mathagent.serving.engine.sampling_params import SamplingParams
    from mathagent.serving.engine.spec_config import SpecMethod
    from mathagent.serving.engine.spec_decode import redrafter_device
    from mathagent.serving.engine.spec_decode.redrafter import Drafter, DrafterConfig

    monkeypatch.setattr(redrafter_device, "ENABLED", True)
    model = tiny.sharp_model()
    drafter = Drafter(DrafterConfig(vocab_size=512, hidden_size=256, exit_dim=512))
    with torch.no_grad():
        # the target's own head rows on the hidden-state half of the drafter's input
        drafter.lm_head[-1].weight.zero_()
        drafter.lm_head[-1].weight[:, :256].copy_(model.output.weight)
    drafter.save_pretrained(tmp_path / "redrafter")
    method = f"redrafter:{tmp_path / 'redrafter'}"
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 512, (n,), generator=gen).tolist() for n in (12, 7, 20)]
    plain = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    spec = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, speculative=method)
    eager = tiny.engine(model, True, beams=beams)
    reference = [r.token_ids for r in eager.generate(prompts, plain)]
    assert [r.token_ids for r in eager.generate(prompts, spec)] == reference
    graphs = tiny.engine(model, False, beams=beams)
    fused = graphs.generate(prompts, spec)
    assert [r.token_ids for r in fused] == reference
    proposer = graphs.speculator.proposer(SpecMethod("redrafter", str(tmp_path / "redrafter")))
    assert proposer.fused is not None and proposer.fused.steps.captured(), "no one-graph step"
    assert proposer.fused.steps.claimed > 0, "no step launched ahead was used"
    assert sum(r.metrics.speculative["drafted_tokens"] for r in fused) > 0
