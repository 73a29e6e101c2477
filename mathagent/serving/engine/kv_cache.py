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

    def update(
        self, layer: int, ctx: ForwardContext, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k, v [B, Hkv, T, D]`` at ``ctx.write_positions``; return each row's cache.

        The returned keys/values are ``[B, Hkv, kv_len, D]``: views when the rows are
        contiguous slots, else gathered.
        """
        k_layer, v_layer = self.k[layer], self.v[layer]  # [S, Hkv, max_seq, D]
        pos = ctx.write_positions  # [B, T]
        rows = ctx.slots[:, None].expand_as(pos)
        k_layer[rows, :, pos] = k.transpose(1, 2)
        v_layer[rows, :, pos] = v.transpose(1, 2)
        if ctx.slot_start is not None:
            sl = slice(ctx.slot_start, ctx.slot_start + pos.shape[0])
            return k_layer[sl, :, : ctx.kv_len], v_layer[sl, :, : ctx.kv_len]
        return k_layer[ctx.slots, :, : ctx.kv_len], v_layer[ctx.slots, :, : ctx.kv_len]

    def nbytes(self) -> int:
        """Bytes held by keys and values together."""
        return 2 * self.k.numel() * self.k.element_size()
