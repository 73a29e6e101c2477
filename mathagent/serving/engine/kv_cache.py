"""The KV cache: allocated once, one slot per concurrent sequence, indexed by position.

Layout ``[layers, slots, kv_heads, max_seq, head_dim]`` keeps each slot's keys contiguous per
head, so attention reads a plain view when a batch's slots are contiguous. Nothing is ever
copied to roll back: a slot's valid length lives with its sequence, and positions past it are
masked out and later overwritten.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from mathagent.serving.engine.model import ForwardContext


class KVCache:
    """Preallocated keys and values for ``num_slots`` sequences of up to ``max_seq`` tokens."""

    def __init__(
        self,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        max_seq: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_layers, num_slots, num_kv_heads, max_seq, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_slots = num_slots
        self.max_seq = max_seq
        # forwards that wrote each slot: a freed slot's keys and values are reusable only while
        # this is unchanged (drafter training and distillation run the runner on slots directly)
        self.writes = [0] * num_slots

    def write_index(self, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Flat row indices ``[B*T*Hkv]`` of a layer's ``[S*Hkv*max_seq, D]`` view where the
        new tokens' K/V go; built once per step and shared by every layer."""
        heads = torch.arange(self.k.shape[2], device=positions.device)
        base = (slots[:, None, None] * self.k.shape[2] + heads) * self.max_seq  # [B, 1, Hkv]
        return (base + positions[:, :, None]).reshape(-1)

    def update(
        self, layer: int, ctx: ForwardContext, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k, v [B, T, Hkv, D]`` at ``ctx.write_index``; return each row's cache.

        The returned keys/values are ``[B, Hkv, kv_len, D]``: views when the rows are
        contiguous slots, else gathered.
        """
        k_layer, v_layer = self.k[layer], self.v[layer]  # [S, Hkv, max_seq, D]
        dim = k_layer.shape[-1]
        k_layer.view(-1, dim).index_copy_(0, ctx.write_index, k.reshape(-1, dim))
        v_layer.view(-1, dim).index_copy_(0, ctx.write_index, v.reshape(-1, dim))
        if ctx.slot_start is not None:
            sl = slice(ctx.slot_start, ctx.slot_start + k.shape[0])
            return k_layer[sl, :, : ctx.kv_len], v_layer[sl, :, : ctx.kv_len]
        return k_layer[ctx.slots, :, : ctx.kv_len], v_layer[ctx.slots, :, : ctx.kv_len]

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Copy slot ``src``'s first ``length`` positions into slot ``dst`` (every layer)."""
        self.k[:, dst, :, :length].copy_(self.k[:, src, :, :length])
        self.v[:, dst, :, :length].copy_(self.v[:, src, :, :length])

    def nbytes(self) -> int:
        """Bytes held by keys and values together."""
        return 2 * self.k.numel() * self.k.element_size()
