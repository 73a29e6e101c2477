"""The FP8 model's one-row product (batch-1 decode): quantise the input row once, then stream;
and the same fused product for 2..16 verify rows (:func:`gemv` there too).

Two kernels per product, chained with programmatic dependent launch (PDL):
``_fp8_row_kernel`` (one program) computes the product's input ``f(x)`` (the bf16 GEMV's
RMSNorm / SiLU prologue, :func:`kernels._gemv_input`), its scale and its e4m3 codes with the rule
of :func:`~mathagent.serving.engine.fp8_format.quantize_rows`; the GEMV then streams the e4m3
weights against those codes with no pre-pass of its own. The earlier single kernel repeated the
row's statistics (two passes over K from L2) in every program before its stream, and re-quantised
every input chunk in every program (benchmarks/GPU_NOTES.md, "FP8").

The GEMV runs on the CUDA cores (float32 products of converted codes): ``tl.dot`` tiles on
the tensor cores (wgmma at 64+ rows) and L2 prefetches of more tiles before the wait were
measured and lost (GPU_NOTES.md, "FP8 v2"). Each program loads its first two weight tiles
before waiting on the row kernel, so the stream overlaps it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mathagent.serving.engine.cuda import fp8, kernels

triton = kernels.triton
if triton is not None:
    import triton.language as tl

    from mathagent.serving.engine.cuda.fp8 import _quantize_codes, _row_scale
    from mathagent.serving.engine.cuda.kernels import _gemv_input

    @triton.jit
    def _fp8_row_kernel(x_ptr, g_ptr, q_ptr, s_ptr, K, stride_x, eps, PRO: tl.constexpr,
                        BLOCK: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
        # One program holds a whole row: f(x), max |f(x)|, scale, codes (one read of x).
        dt = x_ptr.dtype.element_ty
        row = tl.program_id(0)
        x_ptr += row * stride_x
        q_ptr += row * K
        s_ptr += row
        rk = tl.arange(0, BLOCK)
        ok = rk < K
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        rstd = 0.0
        if PRO == 1:
            xv = tl.load(x_ptr + rk, mask=ok, other=0.0).to(tl.float32)
            rstd = tl.rsqrt(tl.sum(xv * xv, axis=0) / K + eps)
        v = tl.where(ok, _gemv_input(x_ptr, g_ptr, 0, rk, K, rstd, PRO, dt, ok), 0.0)
        sx = _row_scale(tl.max(tl.abs(v), axis=0))
        inv = tl.math.div_rn(tl.full([], 1.0, tl.float32), sx)
        tl.store(q_ptr + rk, _quantize_codes(v, inv), mask=ok)
        tl.store(s_ptr, sx)

    @triton.jit
    def _epilogue(acc, s_ptr, ws_ptr, y_ptr, r_ptr, rn, N, RESID: tl.constexpr):
        # y = sum * (x scale * w scale) (+ residual), rounded like the bf16 GEMV's epilogue.
        dt = y_ptr.dtype.element_ty
        ws = tl.load(ws_ptr + rn, mask=rn < N, other=0.0)
        y = (acc * (tl.load(s_ptr) * ws)).to(dt)
        if RESID:
            r = tl.load(r_ptr + rn, mask=rn < N, other=0.0)
            y = (y.to(tl.float32) + r.to(tl.float32)).to(dt)
        tl.store(y_ptr + rn, y, mask=rn < N)

    @triton.jit
    def _fma_tile(acc, w, q_ptr, k0, rk, rn):
        # The codes are loaded in the weight tile's own layout (one 16-byte load per thread,
        # shared by its rows): a [BK] load would cross threads through shared memory.
        x = tl.load(q_ptr + k0 + rk[None, :] + 0 * rn[:, None]).to(tl.float32)
        return acc + w.to(tl.float32) * x

    @triton.jit
    def _fp8_gemv_kernel(q_ptr, s_ptr, w_ptr, ws_ptr, y_ptr, r_ptr, N, K, stride_wn,
                         RESID: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         EVICT: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
        # Two weight tiles are requested before waiting on the row kernel, then two per step,
        # both loaded before either is used (run F4: loading the second after using the first
        # left ptxas issuing it late, 10-19% slower). No tile is carried from one step to the
        # next: Triton keeps a carried e4m3 tile one byte per register (it spilled).
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        w_ptrs = w_ptr + rn[:, None] * stride_wn + rk[None, :]
        w_ok = rn[:, None] < N
        wa = tl.load(w_ptrs, mask=w_ok, other=0.0, eviction_policy=EVICT)
        wb = tl.load(w_ptrs + BLOCK_K, mask=w_ok, other=0.0, eviction_policy=EVICT)
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        acc = _fma_tile(tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32), wa, q_ptr, 0, rk, rn)
        acc = _fma_tile(acc, wb, q_ptr, BLOCK_K, rk, rn)
        for k0 in range(2 * BLOCK_K, K, 2 * BLOCK_K):
            wa = tl.load(w_ptrs + k0, mask=w_ok, other=0.0, eviction_policy=EVICT)
            wb = tl.load(w_ptrs + k0 + BLOCK_K, mask=w_ok, other=0.0, eviction_policy=EVICT)
            acc = _fma_tile(_fma_tile(acc, wa, q_ptr, k0, rk, rn), wb, q_ptr, k0 + BLOCK_K, rk, rn)
        _epilogue(tl.sum(acc, axis=1), s_ptr, ws_ptr, y_ptr, r_ptr, rn, N, RESID)


# Verify rows of the FP8 model through gemv (norm / SiLU / residual fused, as at one row): on
# the H200, 8B shape, batch 1, AL 3, the step ran at 990.8 tok/s against 872.4 unfused (4.08x
# BF16 plain; GPU_NOTES.md run 35). False routes verify rows back to fp8.linear.
FUSED_ROWS = True


@dataclass(frozen=True)
class Fp8GemvConfig:
    """Launch shape of the fp8 one-row GEMV for one weight shape."""

    block_n: int
    block_k: int  # 2 * block_k must divide K
    num_warps: int
    evict: str = "evict_first"
    pdl: bool = True


# The fastest launch shapes on one H200 (benchmarks/fp8_bench.py --sweep, run F4 call 1;
# GPU_NOTES.md, "FP8 v2"), weights cold in L2, one CUDA graph per product over 32 distinct
# matrices, row kernel included. Llama-3-8B shapes: qkv, wo, w13, w2 (the head stays bf16).
FP8_GEMV_CONFIGS: dict[tuple[int, int], Fp8GemvConfig] = {
    (6144, 4096): Fp8GemvConfig(16, 512, 8),
    (4096, 4096): Fp8GemvConfig(16, 1024, 8),
    (28672, 4096): Fp8GemvConfig(16, 512, 8),
    (4096, 14336): Fp8GemvConfig(16, 1024, 8),
}
# Warps of the row kernel per (K, prologue: 0 plain, 1 norm, 2 SiLU product); else row_warps.
ROW_WARPS: dict[tuple[int, int], int] = {}


def fp8_gemv_config(n: int, k: int) -> Fp8GemvConfig:
    """The measured launch shape for ``[n, k]`` e4m3 weights, else a heuristic one."""
    cfg = FP8_GEMV_CONFIGS.get((n, k))
    if cfg is None:
        block_k = next(b for b in (1024, 512, 256, 128) if k % (2 * b) == 0)
        cfg = Fp8GemvConfig(8 if n >= 8192 else 4, block_k, 4)
    if cfg.pdl and not kernels.pdl_supported():
        cfg = Fp8GemvConfig(cfg.block_n, cfg.block_k, cfg.num_warps, cfg.evict, False)
    return cfg


def row_warps(k: int, pro: int) -> int:
    """Warps of the row kernel (a sweep may measure them per shape into ``ROW_WARPS``)."""
    return ROW_WARPS.get((k, pro), 16 if k > 8192 else 8)


def gemv_fits(weight: torch.Tensor) -> bool:
    """Whether :func:`gemv` takes this e4m3 weight (contiguous, K a multiple of 256)."""
    return weight.is_contiguous() and weight.shape[1] % 256 == 0


def quantize_row(
    x: torch.Tensor, k: int, norm: torch.Tensor | None, eps: float, pro: int, pdl: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 codes ``[k]`` and scale ``[1]`` of the product input ``f(x)`` (one row)."""
    q, s = quantize_input_rows(x.view(1, -1), k, norm, eps, pro, pdl)
    return q.view(k), s


def quantize_input_rows(
    x2: torch.Tensor, k: int, norm: torch.Tensor | None, eps: float, pro: int, pdl: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 codes ``[M, k]`` and scales ``[M]`` of the product input ``f(x)`` of each row of
    ``x2 [M, k or 2k]`` (last stride 1): the one-row kernel, one program per row."""
    m = x2.shape[0]
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x2.device)
    s = torch.empty(m, dtype=torch.float32, device=x2.device)
    _fp8_row_kernel[(m,)](
        x2, x2 if norm is None else norm, q, s, k, x2.stride(0), eps, PRO=pro,
        BLOCK=triton.next_power_of_2(k), PDL=pdl, num_warps=row_warps(k, pro), launch_pdl=pdl,
    )  # fmt: skip
    return q, s


def rows_fit(weight: torch.Tensor, rows: int) -> bool:
    """Whether a ``rows``-row product with this e4m3 weight takes :func:`gemv` (the fused
    verify path is on, the rows fit one tile, the shape has a measured launch shape)."""
    return FUSED_ROWS and 2 <= rows <= fp8.MAX_ROWS and tuple(weight.shape) in fp8.ROWS_CONFIGS


# One-row products that run on the tensor-core rows kernel (K split across programs) instead of
# the CUDA-core GEMV, per weight shape: filled by a sweep where it measured faster
# (benchmarks/fp8_split_sweep.py); empty, every one-row product takes the GEMV.
ONE_ROW_CONFIGS: dict[tuple[int, int], fp8.RowsConfig] = {}


def _rows_gemv(x, weight, weight_scale, norm, residual, eps, silu_mul, cfg) -> torch.Tensor:
    # Each row's f(x) quantised by the row kernel, then the tensor-core rows kernel
    # (fp8.rows_launch) with the residual add in its epilogue
    n, k = weight.shape
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    pro = 1 if norm is not None else 2 if silu_mul else 0
    pdl = kernels.pdl_supported()
    q, s = quantize_input_rows(x2, k, norm, eps, pro, pdl)
    y = torch.empty(x2.shape[0], n, dtype=x.dtype, device=x.device)
    r = None if residual is None else residual.reshape(-1, n).contiguous()
    fp8.rows_launch(q, s, weight, weight_scale, y, cfg, r, pdl)
    return y.view(*x.shape[:-1], n)


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
    """``f(x) @ (weight[N, K] * weight_scale[N]).T (+ residual)`` for one row, FP8 model; for
    2..16 rows (verify, where :func:`rows_fit`) the same through the tensor-core rows kernel.

    ``f`` as in :func:`kernels.gemv`. ``config`` (the sweep's knob) overrides the one-row
    launch shape: ``[block_n, block_k, warps]``.
    """
    n, k = weight.shape
    if x.numel() != x.shape[-1]:
        cfg = fp8.rows_config(n, k, x.numel() // x.shape[-1])
        return _rows_gemv(x, weight, weight_scale, norm, residual, eps, silu_mul, cfg)
    if config is None and (n, k) in ONE_ROW_CONFIGS:
        cfg = ONE_ROW_CONFIGS[(n, k)]
        return _rows_gemv(x, weight, weight_scale, norm, residual, eps, silu_mul, cfg)
    x1 = x.reshape(-1).contiguous()
    pro = 1 if norm is not None else 2 if silu_mul else 0
    cfg = fp8_gemv_config(n, k)
    if config is not None:
        cfg = Fp8GemvConfig(*config, pdl=cfg.pdl)
    q, s = quantize_row(x1, k, norm, eps, pro, cfg.pdl)
    y = torch.empty(n, dtype=x.dtype, device=x.device)
    _fp8_gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
        q, s, weight, weight_scale, y, x1 if residual is None else residual.reshape(n), n, k,
        weight.stride(0), RESID=residual is not None, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        EVICT=cfg.evict, PDL=cfg.pdl, num_warps=cfg.num_warps, launch_pdl=cfg.pdl,
    )  # fmt: skip
    return y.view(*x.shape[:-1], n)


@gemv.register_fake
def _(x, weight, weight_scale, norm=None, residual=None, eps=1e-6, silu_mul=False, config=None):
    return x.new_empty(*x.shape[:-1], weight.shape[0])
