"""FP8 weights on CPU: load-time quantisation, and published FP8 checkpoint layouts.

The checkpoints are small random Llamas rewritten in the layouts of ``nvidia/*-FP8`` models:
ModelOpt (``hf_quant_config.json``, quant_algo FP8: per-tensor ``weight_scale`` and
``input_scale`` scalars) and compressed-tensors (``quantization_config`` quant_method
"compressed-tensors", format float-quantized, per-channel ``weight_scale [N, 1]``), key names
as vLLM's ``modelopt.py`` / ``compressed_tensors`` loaders read them. Loading needs no GPU;
running fp8 does, so the engine refuses it on a CPU.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from mathagent.config import EngineSettings
from mathagent.serving.engine.config import EngineConfig, EngineConfigError
from mathagent.serving.engine.fp8_checkpoint import Fp8CheckpointError
from mathagent.serving.engine.fp8_format import FP8_DTYPE, quantize_rows, reference_linear
from mathagent.serving.engine.loader import ModelLoadError, load_model
from mathagent.serving.engine.quant import Fp8Linear, quantize_fp8

CPU, BF16 = torch.device("cpu"), torch.bfloat16
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _hf_llama(folder):
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16)  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(folder)
    return hf


def _rewrite_fp8(folder, strategy: str, e5m2: bool = False, drop_scale: str | None = None):
    """Quantise the folder's block linears in place, in the published layout of ``strategy``."""
    state = load_file(str(folder / "model.safetensors"))
    for key in [k for k in state if k.endswith(".weight") and k.split(".")[-2] in PROJ]:
        w = state[key].float()
        amax = w.abs().amax(dim=1, keepdim=True) if strategy == "channel" else w.abs().amax()
        scale = amax / 448
        state[key] = (w / scale).to(torch.float8_e5m2 if e5m2 else FP8_DTYPE)
        state[key.replace("weight", "weight_scale")] = scale.float()
        if strategy == "tensor":
            state[key.replace("weight", "input_scale")] = torch.tensor(0.02)
    if drop_scale:
        del state[drop_scale]
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return state


def _compressed_tensors_config(strategy: str) -> dict:
    return {"quant_method": "compressed-tensors", "format": "float-quantized",
            "quantization_status": "compressed", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": strategy,
                            "symmetric": True, "dynamic": False},
                "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                      "dynamic": True, "symmetric": True}}}}  # fmt: skip


def _modelopt(folder):
    doc = {"producer": {"name": "modelopt", "version": "0.19.0"},
           "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": None,
                            "exclude_modules": ["lm_head"]}}  # fmt: skip
    (folder / "hf_quant_config.json").write_text(json.dumps(doc))


def _modelopt_in_config(folder):
    """Newer ModelOpt exports: the fields in config.json, per-channel weights, no input scale."""
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "modelopt",
                                  "quant_algo": "FP8_PER_CHANNEL_PER_TOKEN",
                                  "exclude_modules": ["lm_head"]}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(cfg))


def _compressed(folder, strategy="channel"):
    cfg = json.loads((folder / "config.json").read_text())
    cfg["quantization_config"] = _compressed_tensors_config(strategy)
    (folder / "config.json").write_text(json.dumps(cfg))


LAYOUTS = {"modelopt": ("tensor", _modelopt), "modelopt-config": ("channel", _modelopt_in_config),
           "compressed-tensors": ("channel", _compressed)}  # fmt: skip


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_published_fp8_layouts_load_their_codes_exactly(tmp_path, layout):
    hf = _hf_llama(tmp_path)
    strategy, declare = LAYOUTS[layout]
    state = _rewrite_fp8(tmp_path, strategy)
    declare(tmp_path)
    model = load_model(str(tmp_path), tmp_path, CPU, BF16, "fp8").model
    qkv = model.layers[1].attention.wqkv
    assert isinstance(qkv, Fp8Linear) and qkv.weight.dtype == FP8_DTYPE
    parts = [f"model.layers.1.self_attn.{p}_proj" for p in "qkv"]
    codes = torch.cat([state[f"{p}.weight"] for p in parts])
    assert torch.equal(qkv.weight.view(torch.uint8), codes.view(torch.uint8))  # no round trip
    scales = torch.cat([state[f"{p}.weight_scale"].reshape(-1).expand(
        state[f"{p}.weight"].shape[0]) for p in parts])  # fmt: skip
    assert torch.equal(qkv.weight_scale, scales)
    up = model.layers[0].feed_forward.w13  # gate rows first, then up
    gate_codes = state["model.layers.0.mlp.gate_proj.weight"]
    assert torch.equal(up.weight[:128].view(torch.uint8), gate_codes.view(torch.uint8))
    assert model.output.weight.dtype == BF16 and type(model.output) is torch.nn.Linear
    # the loaded model computes what the dequantised transformers model does, to fp8 noise
    with torch.no_grad():
        for key, w in state.items():
            if w.dtype == FP8_DTYPE:
                param = hf.get_parameter(key)
                param.copy_(w.float() * state[key.replace("weight", "weight_scale")])
        tokens = torch.tensor([[5, 17, 99, 3, 42, 7]])
        ours = _logits(model, tokens)
        ref = hf(tokens).logits[0].float()
    assert torch.corrcoef(torch.stack([ours.flatten(), ref.flatten()]))[0, 1] > 0.99


def _logits(model, tokens, dtype=BF16, device=CPU):
    from mathagent.serving.engine.kv_cache import KVCache
    from mathagent.serving.engine.model import ForwardContext, rope_table

    args = model.args
    cache = KVCache(args.num_layers, 1, args.num_kv_heads, 64, args.head_dim, dtype, device)
    cos, sin = (t.to(device) for t in rope_table(args, 64))
    tokens = tokens.to(device)
    pos = torch.arange(tokens.shape[1], device=device)[None]
    ctx = ForwardContext(cache=cache, rows=cache.rows([0], pos, tokens.shape[1]), attn_mask=None,
                         is_causal=True, cos=cos.to(dtype)[pos][:, :, None],
                         sin=sin.to(dtype)[pos][:, :, None])  # fmt: skip
    return model.logits(model(tokens, ctx))[0].float()


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda f: _rewrite_fp8(f, "tensor", e5m2=True), "e5m2"),
        (lambda f: _rewrite_fp8(f, "tensor", drop_scale="model.layers.0.mlp.down_proj.weight_scale"),
         "has no weight_scale"),
        (lambda f: _rewrite_fp8(f, "channel"), "tensor scale"),  # channel scales, tensor config
    ],
)  # fmt: skip
def test_mismatched_modelopt_checkpoints_are_refused(tmp_path, change, match):
    _hf_llama(tmp_path)
    change(tmp_path)
    _modelopt(tmp_path)
    with pytest.raises(Fp8CheckpointError, match=match):
        load_model(str(tmp_path), tmp_path, CPU, BF16, "fp8")


def test_unsupported_schemes_and_settings_are_refused(tmp_path):
    _hf_llama(tmp_path)
    _rewrite_fp8(tmp_path, "channel")
    _compressed(tmp_path, "group")
    with pytest.raises(Fp8CheckpointError, match="strategy 'group'"):
        load_model(str(tmp_path), tmp_path, CPU, BF16, "fp8")
    _compressed(tmp_path, "channel")
    with pytest.raises(ModelLoadError, match="load it with quantization fp8"):
        load_model(str(tmp_path), tmp_path, CPU, BF16, "none")
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "quantization_config": None}))
    with pytest.raises(Fp8CheckpointError, match="declares the checkpoint's quantization"):
        load_model(str(tmp_path), tmp_path, CPU, BF16, "fp8")
    doc = {"quantization": {"quant_algo": "NVFP4"}}
    (tmp_path / "hf_quant_config.json").write_text(json.dumps(doc))
    with pytest.raises(Fp8CheckpointError, match="NVFP4"):
        load_model(str(tmp_path), tmp_path, CPU, BF16, "fp8")
    with pytest.raises(EngineConfigError, match=r"compute capability 9\.0"):
        EngineConfig.from_settings(EngineSettings(device="cpu", quantization="fp8"))


def test_a_static_scheme_needs_its_input_scales(tmp_path):
    """compressed-tensors with ``input_activations.dynamic: false`` (and ModelOpt FP8) declare
    static scales: a product without one is refused by name; groups must agree."""
    _hf_llama(tmp_path)
    _rewrite_fp8(tmp_path, "channel")  # channel weights, no input_scale written
    cfg = json.loads((tmp_path / "config.json").read_text())
    qc = _compressed_tensors_config("channel")
    qc["config_groups"]["group_0"]["input_activations"]["dynamic"] = False
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "quantization_config": qc}))
    with pytest.raises(
        Fp8CheckpointError, match=r"static activation scales but layers\.0\..* has no input_scale"
    ):
        load_model(str(tmp_path), tmp_path, CPU, BF16, "fp8")
    second = json.loads(json.dumps(qc["config_groups"]["group_0"]))
    second["input_activations"]["dynamic"] = True
    qc["config_groups"]["group_1"] = second
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "quantization_config": qc}))
    with pytest.raises(Fp8CheckpointError, match="one activation scheme"):
        load_model(str(tmp_path), tmp_path, CPU, BF16, "fp8")


def test_load_time_quantisation_follows_the_fp8_rule():
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 48, bias=False)
    fp8 = Fp8Linear.quantize(linear)
    codes, scale = quantize_rows(linear.weight.detach())
    assert torch.equal(fp8.weight.view(torch.uint8), codes.view(torch.uint8))
    assert fp8.to(BF16).weight.dtype == FP8_DTYPE and fp8.weight_scale.dtype == torch.float32
    x = torch.randn(3, 256, dtype=BF16)
    assert torch.equal(fp8(x), reference_linear(x, codes, scale.squeeze(-1)))
    err = (fp8(x).float() - x.float() @ linear.weight.detach().t()).abs().max()
    assert err < 0.05 * (x.float() @ linear.weight.detach().t()).abs().max()
    model = load_model("random:tiny", None, CPU, BF16).model
    assert all(isinstance(b.feed_forward.w2, Fp8Linear) for b in quantize_fp8(model).layers)


def test_calibrated_static_input_scales_are_each_products_largest_input(tmp_path):
    """fp8_activation_scales "calibrate": one static scale per product, the largest |x| its
    input reached in the calibration forward over 448 (ModelOpt's max calibration); the model
    then computes near its per-token self, and a checkpoint keeps its own scheme."""
    from mathagent.serving.engine import fp8_calibration

    dynamic = load_model("random:tiny", tmp_path, CPU, BF16, "fp8").model
    static = load_model("random:tiny", tmp_path, CPU, BF16, "fp8", "calibrate").model
    linears = [m for m in static.modules() if isinstance(m, Fp8Linear)]
    assert len(linears) == 8 and all(m.input_scale.shape == (1,) for m in linears)
    assert all(m.input_scale is None for m in dynamic.modules() if isinstance(m, Fp8Linear))
    # the scale is the largest input a hook on the per-token model sees in the same forward
    seen = []
    w2 = dynamic.layers[1].feed_forward.w2
    hook = w2.register_forward_pre_hook(lambda m, a: seen.append(a[0].abs().amax().float()))
    fp8_calibration.calibrate(dynamic, None, BF16)
    hook.remove()
    assert len(seen) == 1 and torch.equal(w2.input_scale, (seen[0] / 448).reshape(1))
    assert torch.equal(w2.input_scale, static.layers[1].feed_forward.w2.input_scale)
    ids = torch.randint(0, 1024, (1, 60), generator=torch.Generator().manual_seed(1))
    for m in dynamic.modules():
        if isinstance(m, Fp8Linear):
            m.input_scale = None
    with torch.no_grad():
        ref, got = _logits(dynamic, ids), _logits(static, ids)
    assert 0 < float((got - ref).norm() / ref.norm()) < 0.1
    with pytest.raises(ModelLoadError, match="needs quantization fp8"):
        load_model("random:tiny", tmp_path, CPU, BF16, "none", "calibrate")
    _hf_llama(tmp_path / "ckpt")
    _rewrite_fp8(tmp_path / "ckpt", "channel")
    _compressed(tmp_path / "ckpt")
    with pytest.raises(ModelLoadError, match="its activation scales are its own"):
        load_model(str(tmp_path / "ckpt"), tmp_path, CPU, BF16, "fp8", "calibrate")


def test_the_fp8_head_is_opt_in_and_quantised_per_row(tmp_path):
    """fp8_head: the vocabulary head as e4m3 codes with per-row scales (the block linears'
    rule), calibrated with the rest; a drafter reading the head's rows gets them dequantised."""
    from mathagent.serving.engine.spec_decode.registry import head_rows

    plain = load_model("random:tiny", tmp_path, CPU, BF16, "fp8").model
    assert type(plain.output) is torch.nn.Linear
    model = load_model("random:tiny", tmp_path, CPU, BF16, "fp8", "calibrate", fp8_head=True).model
    head = model.output
    assert isinstance(head, Fp8Linear) and head.input_scale is not None
    codes, scale = quantize_rows(plain.output.weight.float())
    assert torch.equal(head.weight.view(torch.uint8), codes.view(torch.uint8))
    assert torch.equal(head.weight_scale, scale.squeeze(-1))
    assert model.tok_embeddings.weight.dtype == BF16  # lookups stay in the model dtype
    ids = torch.tensor([3, 7, 11])
    rows = head_rows(head, ids).rows_weight
    assert torch.equal(rows, (codes.float() * scale)[ids].to(BF16))
    with pytest.raises(ModelLoadError, match="fp8_head needs quantization fp8"):
        load_model("random:tiny", tmp_path, CPU, BF16, "none", fp8_head=True)
    # the settings say so before any load
    with pytest.raises(EngineConfigError, match="fp8_head and fp8_activation_scales calibrate"):
        EngineConfig.from_settings(EngineSettings(device="cpu", fp8_head=True,
                                                  fp8_activation_scales="calibrate"))  # fmt: skip
