"""FP8 (e4m3) products of the CUDA path: the quantisation rule in Triton, tensor-core products.

One FP8 model, whatever the number of rows: weights are e4m3 codes with one float32 scale per
output row; activations are quantised per row (token) on the fly with the rule of
:func:`~mathagent.serving.engine.fp8_format.quantize_rows` (``scale = max|x| / 448``, codes
``x * (1 / scale)`` rounded to nearest even); products accumulate in float32 and are scaled back by
both scales. One row (batch-1 decode) goes to :func:`~mathagent.serving.engine.cuda.fp8_gemv.gemv`
(a row kernel quantises the product input once, then a GEMV streams the fp8 weights with the
bf16 GEMV's prologue and residual epilogue); several rows
(batched decode, verify, prefill) go to :func:`linear`: a Triton kernel quantises the rows with
the same arithmetic, then ``torch._scaled_mm`` runs the FP8 tensor-core product with row-wise
scales. So a verify row and a decode row see the same codes and scales and differ only in the
order of float32 sums, as the bf16 path's GEMV and cuBLAS do.
"""

from __future__ import annotations

import torch

from mathagent.serving.engine.cuda import kernels
from mathagent.serving.engine.fp8_format import FP8_MAX, FP8_MIN_SCALE

triton = kernels.triton
if triton is not None:
    import triton.language as tl

    _MAX = tl.constexpr(FP8_MAX)  # jit code reads module constants only as constexpr
    _INV_MAX = tl.constexpr(1.0 / FP8_MAX)
    _MIN_SCALE = tl.constexpr(FP8_MIN_SCALE)

    @triton.jit
    def _quantize_codes(x, inv):
        # The rule of fp8_format.quantize_rows: x * (1 / scale), clamped, to e4m3 (RNE).
        return tl.clamp(x * inv, -_MAX, _MAX).to(tl.float8e4nv)

    @triton.jit
    def _row_scale(amax):
        return tl.maximum(amax * _INV_MAX, _MIN_SCALE)

    @triton.jit
    def _quant_rows_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, BLOCK_K: tl.constexpr):
        # One program per row: its max, its scale, its codes (two passes over K, from L2).
        row = tl.program_id(0)
        rk = tl.arange(0, BLOCK_K)
        amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ok = k0 + rk < K
            xv = tl.load(x_ptr + row * stride_x + k0 + rk, mask=ok, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.abs(xv))
        sx = _row_scale(tl.max(amax, axis=0))
        inv = tl.math.div_rn(tl.full([], 1.0, tl.float32), sx)
        for k0 in range(0, K, BLOCK_K):
            ok = k0 + rk < K
            xv = tl.load(x_ptr + row * stride_x + k0 + rk, mask=ok, other=0.0).to(tl.float32)
            tl.store(q_ptr + row * K + k0 + rk, _quantize_codes(xv, inv), mask=ok)
        tl.store(s_ptr + row, sx)


@torch.library.custom_op("mathagent::fp8_quantize_rows", mutates_args=())
def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row e4m3 codes ``[M, K]`` and float32 scales ``[M, 1]`` of ``x [M, K]``."""
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    if m:
        _quant_rows_kernel[(m,)](x, q, s, k, x.stride(0), BLOCK_K=1024, num_warps=4)
    return q, s


@quantize_rows.register_fake
def _(x):
    m, k = x.shape
    return (
        x.new_empty(m, k, dtype=torch.float8_e4m3fn),
        x.new_empty(m, 1, dtype=torch.float32),
    )


def linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """``x @ W.T`` of the FP8 model for any number of rows, on the FP8 tensor cores."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    q, s = quantize_rows(flat)
    out = torch._scaled_mm(
        q, weight.t(), scale_a=s, scale_b=weight_scale.view(1, -1), out_dtype=x.dtype
    )
    return out.view(*x.shape[:-1], weight.shape[0])


def supported() -> str | None:
    """None when this machine runs the FP8 path, else why not (for the config's refusal)."""
    if not kernels.available():
        return "it needs a CUDA GPU and Triton"
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (9, 0):
        return (
            f"it needs compute capability 9.0 or newer (Hopper: FP8 tensor cores with row-wise "
            f"scaled products); this GPU has {major}.{minor}"
        )
    return None
