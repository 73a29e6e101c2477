"""FP8 (e4m3) products of the CUDA path: a one-row Triton GEMV and tensor-core matrix products.

One FP8 model, whatever the number of rows: weights are e4m3 codes with one float32 scale per
output row; activations are quantised per row (token) on the fly with the rule of
:func:`~mathagent.serving.engine.fp8_format.quantize_rows` (``scale = max|x| / 448``, codes
``x * (1 / scale)`` rounded to nearest even); products accumulate in float32 and are scaled back by
both scales. One row (batch-1 decode) goes to :func:`gemv`, which streams the fp8 weights with
the RMSNorm / SiLU product prologue and the residual epilogue of the bf16 GEMV
(:mod:`~mathagent.serving.engine.cuda.kernels`) and quantises its input itself; several rows
(batched decode, verify, prefill) go to :func:`linear`: a Triton kernel quantises the rows with
the same arithmetic, then ``torch._scaled_mm`` runs the FP8 tensor-core product with row-wise
scales. So a verify row and a decode row see the same codes and scales and differ only in the
order of float32 sums, as the bf16 path's GEMV and cuBLAS do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mathagent.serving.engine.cuda import kernels
from mathagent.serving.engine.fp8_format import FP8_MAX, FP8_MIN_SCALE

triton = kernels.triton
if triton is not None:
    import triton.language as tl

    from mathagent.serving.engine.cuda.kernels import _gemv_input

    _MAX = tl.constexpr(FP8_MAX)  # jit code reads module constants only as constexpr
    _INV_MAX = tl.constexpr(1.0 / FP8_MAX)
    _MIN_SCALE = tl.constexpr(FP8_MIN_SCALE)

    @triton.jit
    def _quantize(x, inv):
        # The rule of fp8_format.quantize_rows: x * (1 / scale), clamped, to e4m3 (RNE).
        return tl.clamp(x * inv, -_MAX, _MAX).to(tl.float8e4nv).to(tl.float32)

    @triton.jit
    def _row_scale(amax):
        return tl.maximum(amax * _INV_MAX, _MIN_SCALE)

    @triton.jit
    def _fp8_gemv_kernel(x_ptr, w_ptr, ws_ptr, y_ptr, g_ptr, r_ptr, N, K, stride_wn, eps,
                         PRO: tl.constexpr, RESID: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, EVICT: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
        # The bf16 GEMV's structure (kernels._gemv_kernel) over e4m3 weights; every program
        # recomputes the input row's scale (its max over K, from L2) before the stream.
        dt = y_ptr.dtype.element_ty
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        w_ptrs = w_ptr + rn[:, None] * stride_wn + rk[None, :]
        w_ok = rn[:, None] < N
        w0 = tl.load(w_ptrs, mask=w_ok, other=0.0, eviction_policy=EVICT)  # [BN, BK] e4m3
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        rstd = 0.0
        if PRO == 1:
            ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                xv = tl.load(x_ptr + k0 + rk).to(tl.float32)
                ss += xv * xv
            rstd = tl.rsqrt(tl.sum(ss, axis=0) / K + eps)
        amax = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            amax = tl.maximum(amax, tl.abs(_gemv_input(x_ptr, g_ptr, k0, rk, K, rstd, PRO, dt)))
        sx = _row_scale(tl.max(amax, axis=0))
        # one correctly rounded reciprocal per row: the per-element step is a product
        inv = tl.math.div_rn(tl.full([], 1.0, tl.float32), sx)
        x0 = _quantize(_gemv_input(x_ptr, g_ptr, 0, rk, K, rstd, PRO, dt), inv)
        acc = w0.to(tl.float32) * x0[None, :]
        for k0 in range(BLOCK_K, K, BLOCK_K):
            w = tl.load(w_ptrs + k0, mask=w_ok, other=0.0, eviction_policy=EVICT)
            xq = _quantize(_gemv_input(x_ptr, g_ptr, k0, rk, K, rstd, PRO, dt), inv)
            acc += w.to(tl.float32) * xq[None, :]
        ws = tl.load(ws_ptr + rn, mask=rn < N, other=0.0)
        y = (tl.sum(acc, axis=1) * (sx * ws)).to(dt)
        if RESID:
            r = tl.load(r_ptr + rn, mask=rn < N, other=0.0)
            y = (y.to(tl.float32) + r.to(tl.float32)).to(dt)
        tl.store(y_ptr + rn, y, mask=rn < N)

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
            q = tl.clamp(xv * inv, -_MAX, _MAX).to(tl.float8e4nv)
            tl.store(q_ptr + row * K + k0 + rk, q, mask=ok)
        tl.store(s_ptr + row, sx)


@dataclass(frozen=True)
class Fp8GemvConfig:
    """Launch shape of the fp8 one-row GEMV for one weight shape."""

    block_n: int
    block_k: int  # K must be a multiple
    num_warps: int
    evict: str = "evict_first"
    pdl: bool = True


# The fastest tiles on one H200 (benchmarks/fp8_bench.py --sweep, run 3; GPU_NOTES.md, "FP8"),
# weights cold in L2, one CUDA graph per product over 32 distinct matrices. Llama-3-8B shapes:
# qkv, wo, w13, w2 (the head stays bf16). Unmeasured shapes get fp8_gemv_config's heuristic.
FP8_GEMV_CONFIGS: dict[tuple[int, int], Fp8GemvConfig] = {
    (6144, 4096): Fp8GemvConfig(32, 512, 8),
    (4096, 4096): Fp8GemvConfig(8, 1024, 4),
    (28672, 4096): Fp8GemvConfig(32, 512, 8),
    (4096, 14336): Fp8GemvConfig(16, 1024, 8),
}


def fp8_gemv_config(n: int, k: int) -> Fp8GemvConfig:
    """The measured launch shape for ``[n, k]`` e4m3 weights, else a heuristic one."""
    cfg = FP8_GEMV_CONFIGS.get((n, k))
    if cfg is None:
        block_k = next(b for b in (2048, 1024, 512, 256) if k % b == 0)
        cfg = Fp8GemvConfig(8 if n >= 8192 else 4, block_k, 4)
    if cfg.pdl and not kernels.pdl_supported():
        cfg = Fp8GemvConfig(cfg.block_n, cfg.block_k, cfg.num_warps, cfg.evict, False)
    return cfg


def gemv_fits(weight: torch.Tensor) -> bool:
    """Whether :func:`gemv` takes this e4m3 weight (contiguous, K a multiple of 256)."""
    return weight.is_contiguous() and weight.shape[1] % 256 == 0


@torch.library.custom_op("mathagent::fp8_gemv", mutates_args=())
def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    norm: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    eps: float = 1e-6,
    silu_mul: bool = False,
    config: list[int] | None = None,
) -> torch.Tensor:
    """``f(x) @ (weight[N, K] * weight_scale[N]).T (+ residual)`` for one row, FP8 model.

    ``f`` as in :func:`kernels.gemv`; ``config`` ``[block_n, block_k, warps]`` overrides the
    launch shape (the sweep's knob).
    """
    n, k = weight.shape
    x1 = x.reshape(-1).contiguous()
    y = torch.empty(n, dtype=x.dtype, device=x.device)
    res = x1 if residual is None else residual.reshape(n)
    pro = 1 if norm is not None else 2 if silu_mul else 0
    cfg = fp8_gemv_config(n, k)
    if config is not None:
        cfg = Fp8GemvConfig(*config, pdl=cfg.pdl)
    _fp8_gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
        x1, weight, weight_scale, y, x1 if norm is None else norm, res, n, k, weight.stride(0),
        eps, PRO=pro, RESID=residual is not None, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        EVICT=cfg.evict, PDL=cfg.pdl, num_warps=cfg.num_warps, launch_pdl=cfg.pdl,
    )  # fmt: skip
    return y.view(*x.shape[:-1], n)


@gemv.register_fake
def _(x, weight, weight_scale, norm=None, residual=None, eps=1e-6, silu_mul=False, config=None):
    return x.new_empty(*x.shape[:-1], weight.shape[0])


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
