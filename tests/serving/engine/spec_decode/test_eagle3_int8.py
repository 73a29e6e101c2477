"""A CPU int4 engine's EAGLE-3 head serves its layer's four products from int8 rows (one
scale per row, bf16 activations): the weights then stay in the cores' L2 between draft steps
instead of streaming from L3 after each target forward (README, "Speculation by default").
Each product stays within ~1% of its float32 form, and the shipped head lands as many drafts
on the real default model as with its float32 layer. ``fc`` (rows near the identity, which
one scale a row quantises to 6% of error) stays float32. ReDrafter's layers, a third of the
bytes, gained 0.1 ms a step from the same (GPU_NOTES, twelfth session) and stay float32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mathagent.config import EngineSettings, Settings
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.quant import Int8Linear
from mathagent.serving.engine.sampling_params import SamplingParams
from mathagent.serving.engine.spec_config import SpecMethod
from tests.conftest import PROMPTS

DRAFTERS = Path(__file__).resolve().parents[4] / "mathagent/serving/drafters"
EAGLE3 = f"eagle3:{DRAFTERS / 'SmolLM2-135M-Instruct-eagle3'}"


@pytest.fixture(scope="module")
def int4_engine(default_model) -> LLMEngine:
    settings = EngineSettings(device="cpu", dtype="auto", quantization="int4", max_batch_size=2,
                              max_seq_len=512, adaptive_draft=False, draft_len=3, draft_beams=1)  # fmt: skip
    return LLMEngine(EngineConfig.from_settings(settings, default_model), Settings().model_dir)


def acceptance(engine: LLMEngine, method: str) -> float:
    params = SamplingParams(max_tokens=48, temperature=0.0, speculative=method)
    results = engine.generate(PROMPTS[:8], params)
    drafted = sum(r.metrics.speculative["drafted_tokens"] for r in results)
    return sum(r.metrics.speculative["accepted_tokens"] for r in results) / drafted


def within_a_percent(product, weight: torch.Tensor) -> bool:
    x = torch.randn(3, weight.shape[1])
    ref = F.linear(x, weight.detach().float())
    return float((product(x).float() - ref).norm() / ref.norm()) < 2e-2  # ~1%


def test_the_heads_layer_drafts_from_int8_rows(int4_engine) -> None:
    int8 = acceptance(int4_engine, EAGLE3)
    proposer = int4_engine.speculator.proposer(SpecMethod.parse(EAGLE3))
    mid = proposer.head.midlayer
    assert mid.products is not None and all(isinstance(f, Int8Linear) for f in mid.products)
    weights = (mid.qkv, mid.self_attn.o_proj.weight, mid.mlp.gate_up, mid.mlp.down_proj.weight)
    assert all(within_a_percent(f, w) for f, w in zip(mid.products, weights, strict=True))
    mid.products = None  # the float32 layer, for comparison
    assert int8 > 0.8 * acceptance(int4_engine, EAGLE3) > 0
