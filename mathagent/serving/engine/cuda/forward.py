"""The decode/verify forward of the CUDA path, over the weights of the engine's ``Transformer``.

Same function as :meth:`Transformer.forward` + :meth:`Transformer.logits` for a few new tokens
per row, laid out for a bandwidth-bound step: skinny products go to the Triton
:func:`~mathagent.serving.engine.cuda.kernels.gemv` (with the norms, SiLU product and residual
adds inside it at one row), attention reads only each slot's cached positions and does the
rotary and the K/V write itself
(:func:`~mathagent.serving.engine.cuda.attention.rope_attention`), and each layer is one
``torch.compile`` region whose remaining elementwise work Inductor fuses. The residual add of
a layer's MLP output is deferred into the next region, so it fuses with that layer's first
norm. Everything reads its inputs from tensors, so
the whole step can be captured in a CUDA graph. The eager model stays the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mathagent.serving.engine.cuda import attention, fp8_head, kernels
from mathagent.serving.engine.cuda import skinny as skinny_kernel
from mathagent.serving.engine.cuda.products import (
    attention_codes,
    fused_ok,
    gemv,
    glu_codes,
    glu_form,
    linear,
    product_weight,
)
from mathagent.serving.engine.model import Transformer


@dataclass
class StepInputs:
    """Static input buffers of one captured step shape ``[B, T]``.

    The integer inputs are views of one device buffer ``packed``; a decode step fills one of
    two pinned host twins (``host``) and sends it in a single copy. ``host_done[i]`` marks
    when twin ``i``'s last copy has run, so the host never overwrites a pending copy.
    """

    packed: torch.Tensor  # [4 * B * T + 2 * B] int64, the fields below in this order
    host: torch.Tensor  # [2, len(packed)] pinned CPU staging buffers
    host_done: list  # [2] torch.cuda.Event | None
    tokens: torch.Tensor  # [B, T] int64
    positions: torch.Tensor  # [B, T] int64 rope positions
    write: torch.Tensor  # [B, T] int64 cache position of each new token's K/V
    write_slot: torch.Tensor  # [B, T] int64 its slot (padding goes to a scratch slot)
    slots: torch.Tensor  # [B] int64 cache slot per row
    start: torch.Tensor  # [B] int64 where row b's T new tokens are cached (consecutively)
    tree: torch.Tensor  # [B, T, T] int8 which new tokens each new token sees

    @classmethod
    def allocate(cls, batch: int, width: int, device: torch.device) -> StepInputs:
        """Zeroed buffers; ``tree`` starts causal, ``write`` at ``0 .. T-1``."""
        bt = batch * width
        packed = torch.zeros(4 * bt + 2 * batch, dtype=torch.long, device=device)
        grids = packed[: 4 * bt].view(4, batch, width)
        grids[2].copy_(torch.arange(width, device=device).expand(batch, width))
        causal = torch.tril(torch.ones(width, width, dtype=torch.int8, device=device))
        host = torch.zeros(2, packed.numel(), dtype=torch.long)
        return cls(
            packed=packed,
            host=host.pin_memory() if packed.is_cuda else host,
            host_done=[None, None],
            tokens=grids[0],
            positions=grids[1],
            write=grids[2],
            write_slot=grids[3],
            slots=packed[4 * bt : 4 * bt + batch],
            start=packed[4 * bt + batch :],
            tree=causal.expand(batch, width, width).contiguous(),
        )


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm with the eager model's rounding order (float32 statistics, cast, then scale)."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Half-split rotary embedding of ``x [B, T, H, D]`` by ``cos/sin [B, T, 1, D]``."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


@dataclass(frozen=True)
class LayerShape:
    """The constants every layer shares (one object, so one compiled region serves all)."""

    n_heads: int
    n_kv: int
    head_dim: int
    inter: int
    eps: float
    fast: frozenset[tuple[int, int]]  # weight shapes where the Triton GEMV beats cuBLAS
    skinny: frozenset[tuple[int, int, int]] = frozenset()  # (N, K, rows bucket): skinny wins
    fused_rows: frozenset[tuple[int, int, int]] = frozenset()  # (N, K, fused bucket): fused wins


def layer_weights(block: torch.nn.Module) -> tuple[torch.Tensor | None, ...]:
    """A layer's tensors in :func:`layer_step` order (absent bias / q-k norms are None)."""
    attn, ffn = block.attention, block.feed_forward
    q_norm = None if attn.q_norm is None else attn.q_norm.weight
    k_norm = None if attn.k_norm is None else attn.k_norm.weight
    return (block.attention_norm.weight, product_weight(attn.wqkv), attn.wqkv.bias, q_norm,
            k_norm, product_weight(attn.wo), block.ffn_norm.weight, product_weight(ffn.w13),
            product_weight(ffn.w2))  # fmt: skip


def layer_step(
    shape: LayerShape,
    weights: tuple[torch.Tensor | None, ...],
    h: torch.Tensor,
    delta: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cos: torch.Tensor,  # [max_seq, D] rotary tables, indexed by position
    sin: torch.Tensor,
    inp: StepInputs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One decoder layer; returns the residual stream and an MLP output still to be added.

    With one row and Triton GEMVs for all four products (or FP8 verify rows, ``fused_ok``), the
    norms, the SiLU product and the residual adds run inside the products (no delta is left
    over); otherwise Inductor fuses them around cuBLAS products and the MLP output is added in
    the next region.
    """
    ln1, wqkv, bqkv, q_norm, k_norm, wo, ln2, w13, w2 = weights
    nh, nkv, hd, eps = shape.n_heads, shape.n_kv, shape.head_dim, shape.eps
    h = h if delta is None else h + delta  # [B, T, H]
    bsz, width, _ = h.shape
    fused = all(fused_ok(w, shape.fast, bsz * width, shape.fused_rows) for w in (wqkv, wo, w13, w2))
    if fused:
        qkv = gemv(h, wqkv, shape.fast, norm=ln1, eps=eps)
        qkv = qkv if bqkv is None else qkv + bqkv
    else:
        qkv = linear(rms_norm(h, ln1, eps), wqkv, shape.fast, bqkv, shape.skinny)
    if q_norm is None or k_norm is None:  # rotary and the K/V write run in the attention
        codes = attention_codes(wo, bsz * width, shape.fast) if fused else {}
        o = attention.rope_attention(qkv, k_cache, v_cache, inp.slots, inp.start, inp.tree,
                                        inp.positions, cos, sin, nh, **codes)  # fmt: skip
    else:
        q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=-1)
        q, k = q.view(bsz, width, nh, hd), k.view(bsz, width, nkv, hd)
        q, k = rms_norm(q, q_norm, eps), rms_norm(k, k_norm, eps)
        rows_cos, rows_sin = cos[inp.positions][:, :, None], sin[inp.positions][:, :, None]
        q, k = rotate(q, rows_cos, rows_sin), rotate(k, rows_cos, rows_sin)
        k_cache[inp.write_slot, :, inp.write] = k
        v_cache[inp.write_slot, :, inp.write] = v.view(bsz, width, nkv, hd)
        o = attention.decode_attention(q, k_cache, v_cache, inp.slots, inp.start, inp.tree)
    o = o.reshape(bsz, width, nh * hd)
    if fused:
        h = gemv(o, wo, shape.fast, residual=h)
        rows = bsz * width
        if glu_form(w13, rows, shape.fast):
            act = gemv(h, w13, shape.fast, norm=ln2, eps=eps, glu=True, **glu_codes(w13, w2))
            return gemv(act, w2, shape.fast, residual=h), None
        gate_up = gemv(h, w13, shape.fast, norm=ln2, eps=eps)
        return gemv(gate_up, w2, shape.fast, residual=h, silu_mul=True), None
    h = h + linear(o, wo, shape.fast, skinny=shape.skinny)
    gate, up = linear(rms_norm(h, ln2, eps), w13, shape.fast, skinny=shape.skinny).split(
        shape.inter, dim=-1
    )
    return h, linear(F.silu(gate) * up, w2, shape.fast, skinny=shape.skinny)


class CudaForward:
    """Callable ``inputs -> (logits [B, T, V] float32, hidden [B, T, H])`` over a model."""

    def __init__(self, model: Transformer, cache: object, cos: torch.Tensor, sin: torch.Tensor):
        self.model = model
        args = model.args
        self.weights = [layer_weights(block) for block in model.layers]
        self.shape = LayerShape(
            args.num_heads, args.num_kv_heads, args.head_dim, args.intermediate_size,
            args.rms_norm_eps, self._fast_shapes(), self._skinny_shapes(), self._fused_shapes(),
        )  # fmt: skip
        self.k, self.v = cache.k, cache.v  # [L, S, Hkv, max_seq, D]
        self.cos, self.sin = cos, sin  # [max_seq, D] in the model dtype
        # One region per layer: same code and shapes in every layer, so it compiles once.
        self.layer = torch.compile(layer_step, fullgraph=True, dynamic=False)
        self.head = torch.compile(self._head, fullgraph=True, dynamic=False)
        # the embedding as Inductor's gather: ATen's index kernel took 6.3 us for a 13-node
        # verify step's rows on the H200 (1.9 for one token; GPU_NOTES, 2026-12-04)
        self.embed = torch.compile(F.embedding, fullgraph=True, dynamic=False)
        # the kept streams are concatenated beside the last layers and the head (GPU_NOTES run 75)
        self.side = torch.cuda.Stream(device=cos.device) if cos.is_cuda else None

    def _product_weights(self) -> list[torch.Tensor]:
        """One layer's plain (not FP8) product weights and the head's (unless FP8)."""
        head = product_weight(self.model.output)
        return [*self._layer_weights(), *([head] if isinstance(head, torch.Tensor) else [])]

    def _layer_weights(self) -> list[torch.Tensor]:
        """One layer's plain (not FP8) product weights."""
        return [w for w in self.weights[0] if isinstance(w, torch.Tensor) and w.dim() == 2]

    def _fast_shapes(self) -> frozenset[tuple[int, int]]:
        """The weight shapes whose one-row products go to the Triton GEMV (measured)."""
        return frozenset(
            tuple(w.shape)
            for w in self._product_weights()
            if kernels.gemv_fits(w) and kernels.gemv_preferred(w)
        )

    def _skinny_shapes(self) -> frozenset[tuple[int, int, int]]:
        """(N, K, rows bucket) whose 2..16-row products go to the Triton skinny product (where
        the sweep measured it faster than cuBLAS: ``skinny.SKINNY_CONFIGS``)."""
        return frozenset(
            (*w.shape, rows)
            for w in self._product_weights()
            for rows in skinny_kernel.skinny_buckets(w)
        )

    def _fused_shapes(self) -> frozenset[tuple[int, int, int]]:
        """(N, K, fused row bucket) whose products take the fused skinny kernel (measured:
        ``skinny.FUSED_CONFIGS``)."""
        return frozenset(
            (*w.shape, rows)
            for w in self._layer_weights()
            for rows in skinny_kernel.fused_buckets(w)
        )

    def _head(
        self, h: torch.Tensor, delta: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        norm = self.model.norm
        head = product_weight(self.model.output)
        if delta is None and fp8_head.fused_ok(head, h.numel() // h.shape[-1]):
            return fp8_head.head(h, *head, norm.weight, norm.eps)  # two kernels, not four
        hidden = rms_norm(h if delta is None else h + delta, norm.weight, norm.eps)
        out = linear(hidden, head, self.shape.fast, skinny=self.shape.skinny)
        return out.float(), hidden

    def __call__(self, inp: StepInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(logits, hidden, captured)``: ``captured [B, T, len * H]`` holds the residual
        streams entering the model's ``capture`` layers (EAGLE-3's features), else None."""
        h = self.embed(inp.tokens, self.model.tok_embeddings.weight)  # [B, T, H]
        delta, capture, kept = None, self.model.capture, []
        joined = None
        for i, weights in enumerate(self.weights):
            if i in capture:
                kept.append(h if delta is None else h + delta)
                if len(kept) == len(capture):
                    joined = self._join(kept)
            h, delta = self.layer(
                self.shape, weights, h, delta, self.k[i], self.v[i], self.cos, self.sin, inp
            )
        if len(self.weights) in capture:
            kept.append(h if delta is None else h + delta)
            joined = self._join(kept)
        logits, hidden = self.head(h, delta)
        if joined is not None and self.side is not None:
            torch.cuda.current_stream().wait_stream(self.side)  # ``kept`` stays alive until here
        return logits, hidden, joined

    def _join(self, kept: list[torch.Tensor]) -> torch.Tensor:
        """The kept streams as one tensor [B, T, n * H], made on the side stream (off the
        step's critical path) when there is one; the caller waits for it before returning."""
        if self.side is None:
            return torch.cat(kept, dim=-1)
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            return torch.cat(kept, dim=-1)
