"""The KV cache: allocated once, one slot per concurrent sequence, indexed by position.

Layout ``[layers, slots, kv_heads, max_seq, head_dim]`` keeps each slot's keys contiguous per
head, so attention reads a plain view when a batch's slots are contiguous. Nothing is ever
copied to roll back: a slot's valid length lives with its sequence, and positions past it are
masked out and later overwritten.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CacheRows:
    """Where one forward's rows live in the cache; built once per step, read by every layer."""

    slots: torch.Tensor  # [B] int64 cache slot per row
    write_index: torch.Tensor  # [B*T*Hkv] flat rows of a layer's [S*Hkv*max_seq, D] view
    kv_len: int  # each row attends over cache positions [0, kv_len)
    slot_start: int | None = None  # rows are the contiguous slots [start, start+B): use views


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
        self.k = _zeros(shape, dtype, device)
        self.v = _zeros(shape, dtype, device)
        self.num_slots = num_slots
        self.max_seq = max_seq

    def rows(self, slots: list[int], positions: torch.Tensor, kv_len: int) -> CacheRows:
        """The rows of a forward over ``slots`` whose new K/V go to ``positions [B, T]``."""
        slot_ids = torch.tensor(slots, device=positions.device)
        heads = torch.arange(self.k.shape[2], device=positions.device)
        base = (slot_ids[:, None, None] * self.k.shape[2] + heads) * self.max_seq  # [B, 1, Hkv]
        index = (base + positions[:, :, None]).reshape(-1)
        contiguous = slots == list(range(slots[0], slots[0] + len(slots)))
        return CacheRows(slot_ids, index, kv_len, slots[0] if contiguous else None)

    def update(
        self, layer: int, rows: CacheRows, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k, v [B, T, Hkv, D]`` at ``rows.write_index``; return each row's cache.

        The returned keys/values are ``[B, Hkv, kv_len, D]``: views when the rows are
        contiguous slots, else gathered.
        """
        if torch.compiler.is_compiling():
            write_rows(self.k, self.v, layer, rows.write_index, k, v)
        else:
            _write_rows(self.k, self.v, layer, rows.write_index, k, v)
        k_layer, v_layer = self.k[layer], self.v[layer]  # [S, Hkv, max_seq, D]
        if rows.slot_start is not None:
            sl = slice(rows.slot_start, rows.slot_start + k.shape[0])
            return k_layer[sl, :, : rows.kv_len], v_layer[sl, :, : rows.kv_len]
        return k_layer[rows.slots, :, : rows.kv_len], v_layer[rows.slots, :, : rows.kv_len]

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Copy slot ``src``'s first ``length`` positions into slot ``dst`` (every layer)."""
        self.k[:, dst, :, :length].copy_(self.k[:, src, :, :length])
        self.v[:, dst, :, :length].copy_(self.v[:, src, :, :length])

    def nbytes(self) -> int:
        """Bytes held by keys and values together."""
        return 2 * self.k.numel() * self.k.element_size()


def _write_rows(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    layer: int,
    index: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    dim = k_cache.shape[-1]
    k_cache[layer].view(-1, dim).index_copy_(0, index, k.reshape(-1, dim))
    v_cache[layer].view(-1, dim).index_copy_(0, index, v.reshape(-1, dim))


# Compiled, an in-place index_copy_ into a view of the cache is functionalised: Inductor
# clones the whole layer, writes the clone and copies it back (4x a layer's K/V of traffic per
# layer call; ~1 GB a layer on the 8B shape). An op that declares the mutation runs in place.
# It takes the whole cache and the layer: handed a layer's view (a symbolic offset), Inductor
# wrote every layer into layer 0 (torch 2.13, CPU).
write_rows = torch.library.custom_op(
    "mathagent::kv_write_rows", _write_rows, mutates_args=("k_cache", "v_cache")
)


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zeros that cost memory only where written, on the CPU.

    ``torch.zeros`` touches every page (the default model's 8-slot float32 cache is 1.5 GB);
    fresh anonymous pages are zero-filled by the kernel on first touch, so a cache backed by
    them grows with the positions actually written. The tensor keeps the mapping alive.
    """
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * dtype.itemsize
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).view(shape)
