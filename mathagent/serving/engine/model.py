"""The Llama / Qwen2 / Qwen3 decoder family in plain PyTorch.

One forward serves prefill, decode and speculative verification: it takes ``tokens [B, T]`` at
``positions [B, T]`` for the KV-cache ``slots [B]``, writes their K/V into the cache, attends
over each slot's cache, and returns the final-normed hidden states ``[B, T, H]``. Logits come
from :meth:`Transformer.logits` so callers score only the rows they need.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mathagent.serving.engine.kv_cache import CacheRows, KVCache

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")


class UnsupportedModelError(ValueError):
    """The model's architecture or one of its features is not implemented."""


@dataclass(frozen=True)
class ModelArgs:
    """Shape and numerics of one model, read from a Hugging Face ``config.json``."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 4096
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any]) -> ModelArgs:
        """Map a ``config.json`` dict (transformers 4.x or 5.x spelling) onto the args."""
        arch = (cfg.get("architectures") or ["?"])[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        theta = rope.pop("rope_theta", None) or cfg.get("rope_theta", 10000.0)
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id")
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=float(theta),
            rope_scaling=None if rope_type == "default" else rope,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=arch == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            eos_token_ids=tuple(eos if isinstance(eos, list) else [] if eos is None else [eos]),
        )


def rope_inv_freq(args: ModelArgs) -> torch.Tensor:
    """Inverse frequencies ``[D/2]`` including the model's rope scaling (linear, llama3)."""
    dim = args.head_dim
    inv_freq = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = args.rope_scaling
    if scaling is None:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor, low, high = (
            scaling["factor"],
            scaling["low_freq_factor"],
            scaling["high_freq_factor"],
        )
        old_ctx = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_ctx / low, inv_freq / factor, inv_freq)
        smooth = (old_ctx / wavelen - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= old_ctx / high) & (wavelen <= old_ctx / low)
        return torch.where(is_mid, mid, scaled)
    raise UnsupportedModelError(f"unsupported rope scaling {kind!r}; supported: linear, llama3")


def rope_table(args: ModelArgs, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables ``[max_len, D]`` in float32, indexed by position."""
    freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), rope_inv_freq(args))
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, T, H, D]`` by ``cos/sin [B, T, 1, D]`` (half-split layout, as HF)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, as the reference implementations do."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Attention(nn.Module):
    """Grouped-query attention over the slot KV cache; q, k, v share one fused projection."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = args.num_heads, args.num_kv_heads, args.head_dim
        qkv_out = (self.n_heads + 2 * self.n_kv) * self.head_dim
        self.wqkv = nn.Linear(args.hidden_size, qkv_out, bias=args.qkv_bias)
        self.wo = nn.Linear(self.n_heads * self.head_dim, args.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, args.rms_norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, args.rms_norm_eps) if args.qk_norm else None

    def forward(self, x: torch.Tensor, ctx: ForwardContext, layer: int) -> torch.Tensor:
        """``layer``: the index of the cache layer this block's K/V live in."""
        bsz, seqlen, _ = x.shape
        q_size, kv_size = self.n_heads * self.head_dim, self.n_kv * self.head_dim
        qkv = self.wqkv(x)
        qk = qkv[..., : q_size + kv_size].view(bsz, seqlen, self.n_heads + self.n_kv, -1)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = qk.split([self.n_heads, self.n_kv], dim=2)
            qk = torch.cat((self.q_norm(q), self.k_norm(k)), dim=2)
        qk = apply_rope(qk, ctx.cos, ctx.sin)  # q and k heads rotated together: [B, T, H+Hkv, D]
        q, k = qk.split([self.n_heads, self.n_kv], dim=2)
        v = qkv[..., q_size + kv_size :].view(bsz, seqlen, self.n_kv, self.head_dim)
        keys, values = ctx.cache.update(layer, ctx.rows, k, v)  # [B, Hkv, S, D]
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            keys,
            values,
            attn_mask=ctx.attn_mask,
            is_causal=ctx.is_causal,
            enable_gqa=self.n_kv != self.n_heads,
        )
        return self.wo(out.transpose(1, 2).reshape(bsz, seqlen, q_size))


class FeedForward(nn.Module):
    """SwiGLU MLP; gate and up projections fused into one matmul."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.inter = args.intermediate_size
        self.w13 = nn.Linear(args.hidden_size, 2 * self.inter, bias=False)
        self.w2 = nn.Linear(self.inter, args.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).split(self.inter, dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.attention = Attention(args)
        self.ffn_norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.feed_forward = FeedForward(args)

    def forward(self, x: torch.Tensor, ctx: ForwardContext, layer: int) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), ctx, layer)
        return h + self.feed_forward(self.ffn_norm(h))


def call_layer(block: Block, x: torch.Tensor, ctx: ForwardContext, layer: int) -> torch.Tensor:
    """Block ``layer``'s forward, as :class:`Transformer` calls it unless the runner swaps it.

    The index is an argument, not an attribute of the block, so one compiled call serves every
    layer (a compiler specialises on a module's int attributes).
    """
    return block(x, ctx, layer)


@dataclass
class ForwardContext:
    """Per-forward inputs shared by every layer (built once per step by the runner)."""

    cache: KVCache
    rows: CacheRows  # the rows' slots and where their new K/V go
    attn_mask: torch.Tensor | None  # [B, 1, T, kv_len] additive (0 or -inf); None = all
    is_causal: bool  # no mask tensor: plain causal attention from position 0
    cos: torch.Tensor  # [B, T, 1, D]
    sin: torch.Tensor  # [B, T, 1, D]


class Transformer(nn.Module):
    """Decoder-only LM: embeddings, blocks, final norm and (tied or own) LM head."""

    def __init__(self, args: ModelArgs) -> None:
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(Block(args) for _ in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.output = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        if args.tie_word_embeddings:
            self.output.weight = self.tok_embeddings.weight
        # Opt-in (EAGLE-3): the hidden states entering these layers (``num_layers``: the last
        # one's output) are kept, concatenated, in ``captured [B, T, len * H]``.
        self.capture: tuple[int, ...] = ()
        self.captured: torch.Tensor | None = None
        # How each block is called: the runner may give a compiled call (one for every layer)
        self.layer_call: Callable[[Block, torch.Tensor, ForwardContext, int], torch.Tensor] = (
            call_layer
        )

    def forward(self, tokens: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Hidden states ``[B, T, H]`` after the final norm; K/V written into ``ctx.cache``."""
        x = self.tok_embeddings(tokens)
        kept = []
        for i, layer in enumerate(self.layers):
            if i in self.capture:
                kept.append(x)
            x = self.layer_call(layer, x, ctx, i)
        if self.capture:
            kept += [x] if len(self.layers) in self.capture else []
            self.captured = torch.cat(kept, dim=-1)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits ``[..., V]`` from final hidden states."""
        return self.output(hidden).float()
