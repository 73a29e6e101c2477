"""FP8 checkpoints written by their producers themselves load as written and compute as they do.

``fixtures/fp8/`` was written by ``scripts/fp8_reference_fixtures.py`` running the producers of
the published layouts on one tiny random Llama (versions in ``fixtures/fp8/provenance.json``):
NVIDIA ModelOpt 0.47.0 (``mtq.quantize`` + ``export_hf_checkpoint``: the ``nvidia/*-FP8``
layout) and llm-compressor 0.14.0.1 / compressed-tensors 0.19.0 (``oneshot`` +
``save_pretrained(save_compressed=True)``). ``reference_logits.safetensors`` holds each
producer's own float32 forward of its quantised model on ``TOKENS``.

What the producers write that our own test checkpoints did not: bfloat16 ``weight_scale`` and
``input_scale`` of shape ``[1]`` (compressed-tensors), 0-dim scales and 1-D ``[N]`` channel
scales (ModelOpt), ``k_scale`` / ``v_scale`` with ``kv_cache_quant_algo`` FP8, and
``model.embed_tokens`` in ModelOpt's exclude list.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mathagent.serving.engine.fp8_checkpoint import Fp8CheckpointError
from mathagent.serving.engine.fp8_format import FP8_DTYPE
from mathagent.serving.engine.loader import load_model
from tests.serving.engine.test_fp8_checkpoint import _logits

FIXTURES = Path(__file__).with_name("fixtures") / "fp8"
CPU, F32 = torch.device("cpu"), torch.float32
FUSED = {
    "attention.wqkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "attention.wo": ("self_attn.o_proj",),
    "feed_forward.w13": ("mlp.gate_proj", "mlp.up_proj"),
    "feed_forward.w2": ("mlp.down_proj",),
}
LOADABLE = [
    "compressed-tensors/fp8_dynamic",  # channel weights, dynamic per-token activations
    "compressed-tensors/fp8",  # tensor weights, static input scales
    "modelopt/fp8_default",  # tensor weights, static input scales
    "modelopt/fp8_per_channel",  # FP8_PER_CHANNEL_PER_TOKEN
    "modelopt/fp8_default_kv",  # + k_scale / v_scale, kv_cache_quant_algo FP8
]
QUANTISED = {name: FUSED for name in LOADABLE}
# the down projections left in bf16 (ignore "re:.*down_proj"): those stay plain linears
QUANTISED["compressed-tensors/fp8_dynamic_ignore_down"] = {
    k: v for k, v in FUSED.items() if k != "feed_forward.w2"
}


def _load(name: str, dtype: torch.dtype = F32):
    folder = FIXTURES / name
    return load_model(str(folder), folder, CPU, dtype, "fp8").model


def _tokens() -> torch.Tensor:
    return torch.tensor([json.loads((FIXTURES / "provenance.json").read_text())["tokens"]])


@pytest.mark.parametrize("name", list(QUANTISED))
def test_codes_and_scales_load_as_the_producer_wrote_them(name):
    model = _load(name)
    written = load_file(str(FIXTURES / name / "model.safetensors"))
    for i, layer in enumerate(model.layers):
        for engine, parts in QUANTISED[name].items():
            linear = layer.get_submodule(engine)
            keys = [f"model.layers.{i}.{part}" for part in parts]
            codes = torch.cat([written[f"{k}.weight"] for k in keys])
            assert linear.weight.dtype == FP8_DTYPE  # the codes themselves, no round trip
            assert torch.equal(linear.weight.view(torch.uint8), codes.view(torch.uint8))
            scales = torch.cat([
                written[f"{k}.weight_scale"].float().reshape(-1).expand(written[f"{k}.weight"].shape[0])
                for k in keys
            ])  # fmt: skip
            assert torch.equal(linear.weight_scale, scales)
        for engine in FUSED.keys() - QUANTISED[name].keys():  # left unquantised
            plain = layer.get_submodule(engine)
            assert type(plain) is torch.nn.Linear
            (part,) = FUSED[engine]  # unfused ones only, here
            assert torch.equal(plain.weight, written[f"model.layers.{i}.{part}.weight"].float())
    head = written["lm_head.weight"]
    assert type(model.output) is torch.nn.Linear and torch.equal(model.output.weight, head.float())


@pytest.mark.parametrize(
    "name",
    [
        "compressed-tensors/fp8_dynamic",
        "compressed-tensors/fp8_dynamic_ignore_down",
        "compressed-tensors/fp8",  # static input scales (0.33 off while they were not used)
    ],
)
def test_activations_compute_what_compressed_tensors_computes(name):
    """FP8_DYNAMIC (the "FP8-dynamic" models): same codes, same per-token activation rule; FP8
    (static): same codes, each product's calibrated ``input_scale`` on every row. The float32
    forwards agree to rounding; weights dequantised alone would be ~0.24 off."""
    reference = load_file(str(FIXTURES / "reference_logits.safetensors"))[name]
    ours = _logits(_load(name), _tokens(), F32)
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    ("name", "bound"),
    [
        # static input scales, used as compressed-tensors uses them (exact above); ModelOpt's
        # forward is its fake quantisation, whose weights are not its export's (below): 0.30
        ("modelopt/fp8_default", 0.5),
        # ModelOpt's CPU fake quantisation rounds off its own exported codes by a step here and
        # there (its fake-quant weight vs its export: 0.014 on a 0.38 row); measured 0.15
        ("modelopt/fp8_per_channel", 0.25),
    ],
)
def test_other_layouts_stay_near_their_producers_forward(name, bound):
    reference = load_file(str(FIXTURES / "reference_logits.safetensors"))[name]
    ours = _logits(_load(name), _tokens(), F32)
    assert reference.abs().max() > 2.0  # each bound: a tenth to a fifth of the largest logit
    assert (ours - reference).abs().max() < bound


def test_static_input_scales_are_used_and_a_fused_product_takes_its_parts_largest():
    model = _load("compressed-tensors/fp8")
    written = load_file(str(FIXTURES / "compressed-tensors/fp8/model.safetensors"))
    for i, layer in enumerate(model.layers):
        for engine, parts in FUSED.items():
            scales = [written[f"model.layers.{i}.{p}.input_scale"].float() for p in parts]
            assert torch.equal(
                layer.get_submodule(engine).input_scale, torch.cat(scales).amax(0, keepdim=True)
            )
    # the per-token schemes keep no static scale
    assert _load("compressed-tensors/fp8_dynamic").layers[0].attention.wqkv.input_scale is None
    assert _load("modelopt/fp8_per_channel").layers[0].attention.wqkv.input_scale is None
    # static, not the per-token rule: the same codes scaled per token compute other logits
    static = _logits(model, _tokens(), F32)
    for layer in model.layers:
        for engine in FUSED:
            layer.get_submodule(engine).input_scale = None
    assert (static - _logits(model, _tokens(), F32)).abs().max() > 0.05


def test_kv_cache_scales_are_not_read():
    """The KV cache stays in the model dtype (vLLM's ``kv_cache_dtype="auto"``): a checkpoint
    with calibrated ``k_scale`` / ``v_scale`` computes what the same weights without them do."""
    with_kv, without = _load("modelopt/fp8_default_kv"), _load("modelopt/fp8_default")
    tokens = _tokens()
    assert torch.equal(_logits(with_kv, tokens, F32), _logits(without, tokens, F32))
    assert any(k.endswith("k_scale") for k in load_file(
        str(FIXTURES / "modelopt/fp8_default_kv/model.safetensors")))  # fmt: skip


def test_block_scales_and_half_quantised_fused_products_are_refused_by_name():
    with pytest.raises(Fp8CheckpointError, match="strategy 'block'"):
        _load("compressed-tensors/fp8_block", torch.bfloat16)
    # k_proj left in bf16, q_proj and v_proj FP8: one fused q/k/v product cannot be both
    with pytest.raises(Fp8CheckpointError, match=r"layers\.0\.attention\.wqkv\.weight .*"
                       r"float8_e4m3fn, bfloat16, float8_e4m3fn"):  # fmt: skip
        _load("compressed-tensors/fp8_dynamic_ignore_k", torch.bfloat16)
