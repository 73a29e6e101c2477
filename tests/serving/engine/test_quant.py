"""Weight-only quantisation on CPU: exact Q4_1 round trip, kernel accuracy, engine wiring."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from mathagent.config import EngineSettings, Settings
from mathagent.model_store import resolve_model
from mathagent.serving.engine.config import EngineConfig, EngineConfigError
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.loader import load_model, resolve_folder
from mathagent.serving.engine.quant import (
    Int4Linear,
    Int8Linear,
    QuantizationError,
    quantize_int4,
    quantize_model,
)
from mathagent.serving.engine.sampling_params import SamplingParams


def _default_weight(name: str) -> torch.Tensor:
    folder, _ = resolve_folder(resolve_model(None, Settings().model_dir), Settings().model_dir)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        return f.get_tensor(name)


def test_int4_recovers_the_gguf_q4_1_codes_exactly() -> None:
    # The default model was dequantised from Q4_1 blocks: quantising again loses nothing.
    weight = _default_weight("model.layers.3.mlp.up_proj.weight")
    codes, scales, low = quantize_int4(weight)
    assert codes.min() >= 0 and codes.max() <= 15
    blocks = codes.float().reshape(weight.shape[0], -1, 32) * scales[..., None] + low[..., None]
    assert torch.equal(blocks.reshape(weight.shape), weight)


def test_int4_rounds_a_random_matrix_within_half_a_step() -> None:
    weight = torch.randn(64, 96, generator=torch.Generator().manual_seed(0))
    codes, scales, low = quantize_int4(weight)
    back = (codes.float().reshape(64, 3, 32) * scales[..., None] + low[..., None]).reshape(64, 96)
    step = scales.repeat_interleave(32, dim=1)
    assert bool(((back - weight).abs() <= step / 2 + 1e-6).all())


@pytest.mark.parametrize("bias", [False, True])
def test_int4_linear_matches_the_float_product(bias: bool) -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(128, 48, bias=bias)
    codes, scales, low = quantize_int4(linear.weight.detach())
    deq = (codes.float().reshape(48, 4, 32) * scales[..., None] + low[..., None]).reshape(48, 128)
    x = torch.randn(2, 3, 128)
    ref = x @ deq.t() + (linear.bias.detach() if bias else 0)
    out = Int4Linear(linear)(x).float()
    assert out.shape == (2, 3, 48)
    assert (out - ref).norm() / ref.norm() < 0.02  # bf16 activations and scales


def test_int8_head_matches_the_float_product() -> None:
    torch.manual_seed(0)
    weight = torch.randn(300, 64)
    x = torch.randn(5, 64)
    out = Int8Linear(weight)(x).float()
    ref = x @ weight.t()
    assert (out - ref).norm() / ref.norm() < 0.02


def test_int4_refuses_a_width_not_divisible_by_the_group() -> None:
    with pytest.raises(QuantizationError, match="divisible by 32"):
        Int4Linear(torch.nn.Linear(40, 8))


def test_unknown_method_is_refused() -> None:
    loaded = load_model("random:tiny", Settings().model_dir, torch.device("cpu"), torch.float32)
    with pytest.raises(QuantizationError, match="unknown quantization"):
        quantize_model(loaded.model, "int3")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(device="cpu", dtype="float32"), "bfloat16 activations"),
        (dict(device="cpu", dtype="float16"), "bfloat16 activations"),
    ],
)
def test_engine_config_rejects_int4_with_other_activations(settings: dict, message: str) -> None:
    with pytest.raises(EngineConfigError, match=message):
        EngineConfig.from_settings(EngineSettings(quantization="int4", **settings))


def test_int4_engine_generates_from_the_default_model(default_model) -> None:
    torch.set_num_threads(2)
    settings = EngineSettings(device="cpu", quantization="int4", max_batch_size=2, max_seq_len=256)
    engine = LLMEngine(EngineConfig.from_settings(settings, default_model), Settings().model_dir)
    layer = engine.loaded.model.layers[0]
    assert isinstance(layer.feed_forward.w13, Int4Linear)
    assert isinstance(engine.loaded.model.output, Int8Linear)
    params = SamplingParams(max_tokens=12, temperature=0)
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    single = engine.generate([prompt], params)[0]
    assert "Paris" in single.text
    batched = engine.generate([prompt, "<|im_start|>user\nHi<|im_end|>\n"], params)[0]
    assert batched.token_ids[:4] == single.token_ids[:4]
