"""The EAGLE-3 draft head and its checkpoint, in the layout published EAGLE-3 heads use.

EAGLE-3 (SafeAILab/EAGLE, ``eagle/model/cnets.py``): the target's hidden states entering three of
its layers (low, middle, high; vLLM's default ids ``(2, L // 2, L - 3)``) are fused by ``fc``
(``3 * target_hidden -> hidden``, no bias). One decoder layer (``midlayer``) reads
``cat(input_layernorm(embed(token)), hidden_norm(hidden))`` (``2 * hidden`` wide, so its q/k/v
projections take ``2 * hidden``), adds attention and a SwiGLU MLP residually onto ``hidden``, and
``lm_head(norm(out))`` scores a reduced draft vocabulary; draft id ``d`` is target id
``d + d2t[d]`` and ``t2d`` marks the target ids that have one. Later draft steps feed the layer's
own (pre-norm) output back as ``hidden``; the pair at position ``t`` is (features at ``t``, the
token at ``t + 1``).

Checkpoint folder: ``config.json`` (``hidden_size``, ``intermediate_size``,
``num_attention_heads``, ``num_key_value_heads``, ``vocab_size`` = the target's,
``draft_vocab_size``, ``rms_norm_eps``, ``rope_theta``, optional ``target_hidden_size`` and
``eagle_aux_hidden_state_layer_ids``) and ``model.safetensors`` (or ``pytorch_model.bin``) with
``fc.weight``, ``midlayer.{hidden_norm,input_layernorm,post_attention_layernorm}.weight``,
``midlayer.self_attn.{q,k,v,o}_proj.weight``, ``midlayer.mlp.{gate,up,down}_proj.weight``,
``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d`` and optionally ``embed_tokens.weight`` (else
the target's embedding is used, as vLLM does). This project's compact heads may leave
``lm_head.weight`` out when ``config["lm_head_from_target"]`` says it is the target's own head
restricted to the draft vocabulary.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from mathagent.serving.engine.model import ModelArgs, RMSNorm, apply_rope


class Eagle3CheckpointError(ValueError):
    """An EAGLE-3 checkpoint that is malformed or not shaped for the target."""


@dataclass(frozen=True)
class Eagle3Config:
    """The keys of an EAGLE-3 head's ``config.json`` that shape it."""

    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int  # the target's vocabulary
    draft_vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    head_dim: int | None = None
    target_hidden_size: int | None = None  # None: the head's own hidden size
    aux_layer_ids: tuple[int, ...] | None = None  # None: (2, L // 2, L - 3) of the target
    norm_before_residual: bool = False
    lm_head_from_target: bool = False
    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # other keys, kept

    @property
    def dim(self) -> int:
        """Attention head width."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def fused_width(self) -> int:
        """Width of the three concatenated target hidden states ``fc`` reads."""
        return 3 * (self.target_hidden_size or self.hidden_size)

    def layer_args(self) -> ModelArgs:
        """The decoder layer's shape as the engine's model args (rope tables, norms)."""
        rope = self.rope_scaling
        kind = None if rope is None else rope.get("rope_type", rope.get("type", "default"))
        return ModelArgs(
            architecture="LlamaForCausalLMEagle3", vocab_size=self.vocab_size,
            hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_layers=1, num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads, head_dim=self.dim,
            rms_norm_eps=self.rms_norm_eps, rope_theta=self.rope_theta,
            rope_scaling=None if kind in (None, "default") else rope,
        )  # fmt: skip

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Eagle3Config:
        """Read a published ``config.json`` (SafeAILab, vLLM / NVIDIA ModelOpt spellings)."""
        need = ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
        missing = [k for k in need if k not in raw]
        if missing:
            raise Eagle3CheckpointError(f"config.json lacks {', '.join(missing)}")
        if raw.get("num_hidden_layers", 1) != 1:
            raise Eagle3CheckpointError(
                f"EAGLE-3 heads have one decoder layer; config.json says {raw['num_hidden_layers']}"
            )
        eagle = raw.get("eagle_config") or {}
        ids = raw.get("eagle_aux_hidden_state_layer_ids") or eagle.get(
            "eagle_aux_hidden_state_layer_ids"
        )
        known = set(cls.__dataclass_fields__) | {"eagle_aux_hidden_state_layer_ids"}
        return cls(
            hidden_size=raw["hidden_size"], intermediate_size=raw["intermediate_size"],
            num_attention_heads=raw["num_attention_heads"],
            num_key_value_heads=raw.get("num_key_value_heads") or raw["num_attention_heads"],
            vocab_size=raw["vocab_size"],
            draft_vocab_size=raw.get("draft_vocab_size") or raw["vocab_size"],
            rms_norm_eps=raw.get("rms_norm_eps", 1e-5), rope_theta=raw.get("rope_theta", 1e4),
            rope_scaling=raw.get("rope_scaling"), head_dim=raw.get("head_dim"),
            target_hidden_size=raw.get("target_hidden_size"),
            aux_layer_ids=None if not ids else tuple(int(i) for i in ids),
            norm_before_residual=bool(raw.get("norm_before_residual", False)),
            lm_head_from_target=bool(raw.get("lm_head_from_target", False)),
            extra={k: v for k, v in raw.items() if k not in known},
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        """``config.json`` as SafeAILab writes it, plus this project's optional keys."""
        out: dict[str, Any] = {
            "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
            **self.extra, "num_hidden_layers": 1, "hidden_act": "silu",
            "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads, "head_dim": self.dim,
            "vocab_size": self.vocab_size, "draft_vocab_size": self.draft_vocab_size,
            "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling, "tie_word_embeddings": False,
        }  # fmt: skip
        if self.target_hidden_size is not None:
            out["target_hidden_size"] = self.target_hidden_size
        if self.aux_layer_ids is not None:
            out["eagle_aux_hidden_state_layer_ids"] = list(self.aux_layer_ids)
        if self.norm_before_residual:
            out["norm_before_residual"] = True
        if self.lm_head_from_target:
            out["lm_head_from_target"] = True
        return out


class _Attention(nn.Module):
    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        h, d = cfg.hidden_size, cfg.dim
        self.q_proj = nn.Linear(2 * h, cfg.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(2 * h, cfg.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(2 * h, cfg.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * d, h, bias=False)


class _MLP(nn.Module):
    gate_up: Tensor | None = None  # gate and up rows in one product (set for inference)

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.gate_up is not None:
            gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MidLayer(nn.Module):
    """The one decoder layer; attention itself is left to the caller (cache, tree or TTT)."""

    qkv: Tensor | None = None  # q, k and v rows in one product (set for inference)
    # the qkv, o, gate/up and down products as callables (int8 rows on a CPU int4 engine)
    products: tuple[Callable[[Tensor], Tensor], ...] | None = None

    def __init__(self, cfg: Eagle3Config) -> None:
        super().__init__()
        self.cfg = cfg
        eps = cfg.rms_norm_eps
        self.hidden_norm = RMSNorm(cfg.hidden_size, eps)
        self.input_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, eps)
        self.self_attn = _Attention(cfg)
        self.mlp = _MLP(cfg)

    def project(
        self, emb: Tensor, hidden: Tensor, cos: Tensor, sin: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Residual ``[B, T, H]`` and rotated q ``[B, Hq, T, D]``, k and v ``[B, Hkv, T, D]``.

        emb, hidden: [B, T, H]; cos, sin: [B, T, 1, D] at each row's rope position.
        """
        normed = self.hidden_norm(hidden)
        residual = normed if self.cfg.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(emb), normed], dim=-1)  # [B, T, 2H]
        b, t, _ = x.shape
        attn, d = self.self_attn, self.cfg.dim
        if self.products is not None:
            q, k, v = self.products[0](x).to(x.dtype).split(self._qkv_sizes, dim=-1)
        elif self.qkv is not None:
            q, k, v = F.linear(x, self.qkv).split(self._qkv_sizes, dim=-1)
        else:
            q, k, v = attn.q_proj(x), attn.k_proj(x), attn.v_proj(x)
        q = apply_rope(q.reshape(b, t, -1, d), cos, sin)
        k = apply_rope(k.reshape(b, t, -1, d), cos, sin)
        v = v.reshape(b, t, -1, d)
        return residual, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def fuse_projections(self) -> None:
        """Serve q/k/v and gate/up each as one product (copies of the current weights, for
        inference: a drafted token's head step on the H200 launched five small products where
        two do; benchmarks/GPU_NOTES.md, run 51). Training keeps the separate modules."""
        attn, mlp = self.self_attn, self.mlp
        with torch.no_grad():
            parts = (attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)
            self.qkv = torch.cat(parts).detach()
            self._qkv_sizes = [w.shape[0] for w in parts]
            mlp.gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach()

    def finish(self, residual: Tensor, attn_out: Tensor) -> Tensor:
        """The layer's output ``[B, T, H]`` from attention's output ``[B, Hq, T, D]``."""
        b, _, t, _ = attn_out.shape
        flat = attn_out.transpose(1, 2).reshape(b, t, -1)
        if self.products is None:
            h = residual + self.self_attn.o_proj(flat)
            return h + self.mlp(self.post_attention_layernorm(h))
        _, o, gate_up, down = self.products
        h = residual + o(flat).to(flat.dtype)
        gate, up = gate_up(self.post_attention_layernorm(h)).to(h.dtype).chunk(2, dim=-1)
        return h + down(F.silu(gate) * up).to(h.dtype)


def attend(q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None) -> Tensor:
    """Grouped-query attention: q [B, Hq, T, D] over keys/values [B, Hkv, S, D]; mask
    [B or 1, 1, T, S] bool (True = attend) or None (all)."""
    gqa = q.shape[1] != keys.shape[1]
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=gqa)


class Eagle3Head(nn.Module):
    """The head's weights; parameter and buffer names are the published checkpoint's keys."""

    def __init__(self, cfg: Eagle3Config, with_embedding: bool = False) -> None:
        super().__init__()
        self.config = cfg
        self.fc = nn.Linear(cfg.fused_width, cfg.hidden_size, bias=False)
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.draft_vocab_size, bias=False)
        self.embed_tokens = (
            nn.Embedding(cfg.vocab_size, cfg.hidden_size) if with_embedding else None
        )
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))

    def set_draft_vocab(self, target_ids: Tensor) -> None:
        """Draft from ``target_ids`` (sorted here), as the reference writes ``d2t``/``t2d``."""
        ids = target_ids.to(torch.long).flatten().unique().to(self.d2t.device)
        if ids.numel() != self.config.draft_vocab_size:
            raise ValueError(f"{ids.numel()} ids for a draft vocabulary of {self.d2t.numel()}")
        self.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        self.t2d.zero_()
        self.t2d[ids] = True

    def target_ids(self) -> Tensor:
        """Target token id of every draft-vocabulary column ``[V']``."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def logits(self, out: Tensor) -> Tensor:
        """Draft-vocabulary logits ``[..., V']`` (float32) from the layer's output."""
        return self.lm_head(self.norm(out)).float()

    def save_pretrained(self, out: Path, dtype: torch.dtype = torch.bfloat16) -> None:
        """Write ``config.json`` + ``model.safetensors``; a target-tied head leaves out
        ``lm_head.weight``, an absent own embedding ``embed_tokens.weight``."""
        out.mkdir(parents=True, exist_ok=True)
        state = {}
        for k, v in self.state_dict().items():
            if k == "lm_head.weight" and self.config.lm_head_from_target:
                continue
            state[k] = v.detach().contiguous() if k in ("d2t", "t2d") else v.detach().to(dtype)
        save_file(state, str(out / "model.safetensors"))
        raw = {**self.config.to_json(), "torch_dtype": str(dtype).removeprefix("torch.")}
        (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")


def read_checkpoint(path: Path) -> tuple[Eagle3Config, dict[str, Tensor]]:
    """``config.json`` and the tensors of an EAGLE-3 folder (safetensors or a torch .bin)."""
    path = Path(path).expanduser()
    if not (path / "config.json").is_file():
        raise Eagle3CheckpointError(f"{path} is not an EAGLE-3 checkpoint: no config.json")
    cfg = Eagle3Config.from_json(json.loads((path / "config.json").read_text()))
    if (path / "model.safetensors").is_file():
        return cfg, load_file(str(path / "model.safetensors"))
    if (path / "pytorch_model.bin").is_file():
        return cfg, torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise Eagle3CheckpointError(f"{path} holds no model.safetensors or pytorch_model.bin")
