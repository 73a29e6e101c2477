"""Which kernel takes one of a layer's matrix products on the CUDA path, and its fused forms.

One row goes to the Triton GEMV where its launch shape was measured faster than cuBLAS (the
8B shapes), FP8 weights to their GEMV or tensor-core rows kernel, 2..16 rows to the skinny
product where the sweep listed it; a layer whose four products all take a fused form (the
norm / SiLU prologue and residual epilogue inside the product) runs without Inductor's
elementwise kernels around them (:func:`fused_ok`). ``forward.layer_step`` asks here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mathagent.serving.engine.cuda import fp8, fp8_gemv, kernels
from mathagent.serving.engine.cuda import skinny as skinny_kernel
from mathagent.serving.engine.quant import Fp8Linear

# A layer's product weight: a tensor, or (e4m3 codes, scales per row, static input scale or
# None) of an FP8 linear.
Weight = torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


def linear(
    x: torch.Tensor,
    weight: Weight,
    fast: frozenset[tuple[int, int]],
    bias: torch.Tensor | None = None,
    skinny: frozenset[tuple[int, int, int]] = frozenset(),
) -> torch.Tensor:
    """``F.linear``, through the Triton GEMV for one row when ``fast`` holds the weight's shape,
    through the Triton skinny product for 2..16 rows when ``skinny`` holds (N, K, row bucket);
    an FP8 weight goes to its GEMV at one row, to the FP8 tensor cores at more."""
    if isinstance(weight, tuple):
        one_row = x.numel() == x.shape[-1] and gemv_ok(weight, fast)
        codes, scales, input_scale = weight
        if one_row:
            y = fp8_gemv.gemv(x, codes, scales, input_scale=input_scale)
        else:
            y = fp8.linear(x, codes, scales, input_scale)
        return y if bias is None else y + bias
    rows = x.numel() // x.shape[-1]
    rows_bucket = skinny_kernel.bucket(rows)  # 0 outside 2..16 rows
    if rows == 1 and tuple(weight.shape) in fast:
        y = kernels.gemv(x, weight)
    elif rows_bucket and (*weight.shape, rows_bucket) in skinny:
        y = skinny_kernel.skinny(x, weight)
    else:
        return F.linear(x, weight, bias)
    return y if bias is None else y + bias


def gemv_ok(weight: Weight, fast: frozenset[tuple[int, int]]) -> bool:
    """Whether one-row products with ``weight`` take a Triton GEMV (bf16 measured, fp8 fits)."""
    if isinstance(weight, tuple):
        return fp8_gemv.gemv_fits(weight[0])
    return tuple(weight.shape) in fast


def fused_ok(
    weight: Weight,
    fast: frozenset[tuple[int, int]],
    rows: int,
    fused_rows: frozenset[tuple[int, int, int]] = frozenset(),
) -> bool:
    """Whether a ``rows``-row product with ``weight`` takes :func:`gemv`: one row through a
    Triton GEMV, FP8 verify rows through :func:`fp8_gemv.gemv`'s rows kernel, or 1..16 rows
    through the fused skinny kernel where ``fused_rows`` holds (N, K, fused row bucket)."""
    if isinstance(weight, tuple):
        return gemv_ok(weight, fast) if rows == 1 else fp8_gemv.rows_fit(weight[0], rows)
    if rows == 1 and gemv_ok(weight, fast):
        return True
    return (
        rows <= skinny_kernel.MAX_ROWS
        and (*weight.shape, skinny_kernel.fused_bucket(rows)) in fused_rows
    )


def on_skinny(weight: Weight, rows: int, fast: frozenset[tuple[int, int]]) -> bool:
    """Whether :func:`gemv` sends this product to the fused skinny kernel (neither a one-row
    Triton GEMV nor FP8)."""
    return not isinstance(weight, tuple) and not (rows == 1 and tuple(weight.shape) in fast)


def glu_form(weight: Weight, rows: int, fast: frozenset[tuple[int, int]]) -> bool:
    """Whether the fused w13 product writes ``silu(gate) * up`` itself (``glu=True``): the
    fused skinny kernel where its table says so, the FP8 one-row GEMV where
    :data:`fp8_gemv.GLU` is on."""
    if isinstance(weight, tuple):
        return rows == 1 and fp8_gemv.GLU and fp8_gemv.gemv_fits(weight[0])
    return on_skinny(weight, rows, fast) and skinny_kernel.glu_form(weight, rows)


def attention_codes(wo: Weight, rows: int, fast: frozenset[tuple[int, int]]) -> dict:
    """``rope_attention``'s ``out_scale`` where the output projection is a one-row FP8 GEMV
    with a static input scale (:data:`fp8_gemv.ATTENTION_CODES`: the attention writes its
    codes), else nothing."""
    if isinstance(wo, tuple) and wo[2] is not None and rows == 1 and gemv_ok(wo, fast):
        return {"out_scale": wo[2]} if fp8_gemv.ATTENTION_CODES else {}
    return {}


def glu_codes(w13: Weight, w2: Weight) -> dict[str, torch.Tensor]:
    """``gemv``'s ``out_scale`` for a GLU-form w13 whose w2 is FP8 with a static input scale
    (:data:`fp8_gemv.GLU_CODES`: w13 writes w2's codes), else nothing."""
    if isinstance(w13, tuple) and isinstance(w2, tuple) and w2[2] is not None:
        return {"out_scale": w2[2]} if fp8_gemv.GLU_CODES else {}
    return {}


def gemv(
    x: torch.Tensor, weight: Weight, fast: frozenset[tuple[int, int]], **fused
) -> torch.Tensor:
    """The fused product for ``weight``'s kind (one row, FP8 verify rows, or the fused skinny
    kernel's rows: :func:`fused_ok`), with the prologue/epilogue in ``fused``."""
    if isinstance(weight, tuple):
        codes, scales, input_scale = weight
        return fp8_gemv.gemv(x, codes, scales, input_scale=input_scale, **fused)
    if not on_skinny(weight, x.numel() // x.shape[-1], fast):
        return kernels.gemv(x, weight, **fused)
    return skinny_kernel.skinny(x, weight, **fused)


def product_weight(linear_module: torch.nn.Module) -> Weight:
    if isinstance(linear_module, Fp8Linear):
        return linear_module.weight, linear_module.weight_scale, linear_module.input_scale
    return linear_module.weight
