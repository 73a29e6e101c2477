"""A random EAGLE-3 checkpoint written key by key in the published layout (see
tests/fixtures/eagle3/README.md for the references), independent of the project's own writer."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def reference_tensors(cfg: dict, seed: int = 0, std: float = 0.05) -> dict[str, torch.Tensor]:
    """The tensors SafeAILab/EAGLE's ``Model`` (eagle/model/cnets.py) saves, random, float16."""
    g = torch.Generator().manual_seed(seed)
    h, i = cfg["hidden_size"], cfg["intermediate_size"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    th = cfg.get("target_hidden_size", h)
    shapes = {
        "fc.weight": (h, 3 * th),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (q, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, q),
        "midlayer.mlp.gate_proj.weight": (i, h),
        "midlayer.mlp.up_proj.weight": (i, h),
        "midlayer.mlp.down_proj.weight": (h, i),
        "norm.weight": (h,),
        "lm_head.weight": (cfg["draft_vocab_size"], h),
    }
    out = {}
    for key, shape in shapes.items():
        if key.endswith("norm.weight"):
            out[key] = (1 + 0.1 * torch.randn(shape, generator=g)).half()
        else:
            out[key] = (std * torch.randn(shape, generator=g)).half()
    used = torch.randperm(cfg["vocab_size"], generator=g)[: cfg["draft_vocab_size"]].sort().values
    out["d2t"] = used - torch.arange(used.numel())  # target id = draft id + d2t[draft id]
    t2d = torch.zeros(cfg["vocab_size"], dtype=torch.bool)
    t2d[used] = True
    out["t2d"] = t2d
    return out


def write_reference_head(path: Path, cfg: dict, tensors: dict[str, torch.Tensor]) -> Path:
    """``config.json`` + ``model.safetensors`` as a published head folder holds them."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return path


def smollm_head_config(draft_vocab: int = 2048) -> dict:
    """A head shaped for SmolLM2-135M (hidden 576, 9 heads, 3 KV heads, vocab 49152)."""
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": 576,
        "intermediate_size": 768,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "num_hidden_layers": 1,
        "vocab_size": 49152,
        "draft_vocab_size": draft_vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": 100000.0,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
    }
