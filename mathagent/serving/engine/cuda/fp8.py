"""FP8 (e4m3) products of the CUDA path: the quantisation rule in Triton, tensor-core products.

One FP8 model, whatever the number of rows: weights are e4m3 codes with one float32 scale per
output row; activations are quantised per row (token) on the fly with the rule of
:func:`~mathagent.serving.engine.fp8_format.quantize_rows` (``scale = max|x| / 448``, or a
static input scale; codes ``x * (1 / scale)`` rounded to nearest even); products accumulate in
float32 and are scaled back by both scales. One row (batch-1 decode) goes to :func:`~mathagent.serving.engine.cuda.fp8_gemv.gemv`
(a row kernel quantises the product input once, then a GEMV streams the fp8 weights with the
bf16 GEMV's prologue and residual epilogue); several rows
(batched decode, verify, prefill) go to :func:`linear`: a Triton kernel quantises the rows with
the same arithmetic, then ``torch._scaled_mm`` runs the FP8 tensor-core product with row-wise
scales, except at 2..16 rows (verify steps) where a measured launch shape exists
(``ROWS_CONFIGS``): there :func:`rows_linear` streams each weight tile once through the tensor
cores with the operands swapped (the weight tile is the MMA's 64-row side, the few token rows
its narrow side), because ``_scaled_mm`` at 5 rows streamed the 8B shape's weights at 1.3-2.5
TB/s (run 30, ``skinny_sweep.py --models llama-3-8b:fp8``) and broadcast FMAs on the CUDA cores
were slower still. So a verify row and a decode row see the same codes and scales and differ only in the
order of float32 sums, as the bf16 path's GEMV and cuBLAS do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mathagent.serving.engine import fp8_format
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
    def _quant_rows_kernel(x_ptr, is_ptr, q_ptr, s_ptr, K, stride_x, BLOCK_K: tl.constexpr,
                           STATIC: tl.constexpr):  # fmt: skip
        # One program per row: its max, its scale, its codes (two passes over K, from L2).
        # STATIC: the product's one input scale (is_ptr) on every row, one pass.
        row = tl.program_id(0)
        rk = tl.arange(0, BLOCK_K)
        if STATIC:
            sx = tl.load(is_ptr)
        else:
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

    @triton.jit
    def _rows_epilogue(acc, qs_ptr, ws_ptr, y_ptr, r_ptr, rn, rm, M, N, RESID: tl.constexpr):
        # y = acc * (ws * qs) rounded to y's dtype (the one-row GEMV's rounding), + residual.
        qs = tl.load(qs_ptr + rm, mask=rm < M, other=0.0)
        ws = tl.load(ws_ptr + rn, mask=rn < N, other=0.0)
        dt = y_ptr.dtype.element_ty
        y = (acc * (ws[:, None] * qs[None, :])).to(dt)
        offs, ok = rm[None, :] * N + rn[:, None], (rm[None, :] < M) & (rn[:, None] < N)
        if RESID:
            y = (y.to(tl.float32) + tl.load(r_ptr + offs, mask=ok, other=0.0).to(tl.float32)).to(dt)
        tl.store(y_ptr + offs, y, mask=ok)

    @triton.jit(do_not_specialize=["M"])
    def _rows_kernel(q_ptr, qs_ptr, w_ptr, ws_ptr, y_ptr, r_ptr, part_ptr, cnt_ptr, M, N,
                     K: tl.constexpr, MP: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, RESID: tl.constexpr,
                     PDL: tl.constexpr):  # fmt: skip
        # y[M, N] = (q[M, K] . w[N, K]) * qs[M] * ws[N] (+ r[M, N]), computed as [BLOCK_N, MP]
        # tiles of w . q^T: BLOCK_N >= 64 makes the weight the wgmma's M side; MP (16) the rows.
        # SPLIT > 1: program (n, s) sums K's s-th stretch into part[s]; the last of a column
        # block's SPLIT programs to finish (a counter) adds the parts in order 0..SPLIT-1 (the
        # same sums whoever finishes last) and writes y, then zeroes the counter for the next
        # launch. Short products (N / BLOCK_N blocks under the SM count) fill the GPU this way.
        # PDL: launched while the row kernel before it runs; waits for its codes.
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        pid = tl.program_id(0)
        KS: tl.constexpr = K // SPLIT
        k_lo = tl.program_id(1) * KS
        rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = tl.arange(0, MP)
        rk = tl.arange(0, BLOCK_K)
        w_ptrs = w_ptr + rn[:, None] * K + k_lo + rk[None, :]
        q_ptrs = q_ptr + rm[:, None] * K + k_lo + rk[None, :]
        n_ok, m_ok = rn[:, None] < N, rm[:, None] < M
        acc = tl.zeros((BLOCK_N, MP), dtype=tl.float32)
        for k0 in range(0, KS, BLOCK_K):  # KS % BLOCK_K == 0 (RowsConfig.fits)
            w = tl.load(w_ptrs + k0, mask=n_ok, other=0.0, eviction_policy="evict_first")
            q = tl.load(q_ptrs + k0, mask=m_ok, other=0.0)
            acc = tl.dot(w, tl.trans(q), acc)
        if SPLIT == 1:
            _rows_epilogue(acc, qs_ptr, ws_ptr, y_ptr, r_ptr, rn, rm, M, N, RESID)
        else:
            offs = rm[None, :] * N + rn[:, None]
            ok = (rm[None, :] < M) & (rn[:, None] < N)
            tl.store(part_ptr + tl.program_id(1) * M * N + offs, acc, mask=ok)
            tl.debug_barrier()  # every thread's part is written before the counter moves
            if tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel") == SPLIT - 1:
                total = tl.zeros((BLOCK_N, MP), dtype=tl.float32)
                for s in tl.static_range(SPLIT):
                    total += tl.load(part_ptr + s * M * N + offs, mask=ok, other=0.0,
                                     cache_modifier=".cg")  # fmt: skip
                tl.store(cnt_ptr + pid, 0)
                _rows_epilogue(total, qs_ptr, ws_ptr, y_ptr, r_ptr, rn, rm, M, N, RESID)


@torch.library.custom_op("mathagent::fp8_quantize_rows", mutates_args=())
def quantize_rows(
    x: torch.Tensor, input_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row e4m3 codes ``[M, K]`` and float32 scales ``[M, 1]`` of ``x [M, K]``: each row's
    own scale, or the static ``input_scale [1]`` on every row."""
    m, k = x.shape
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    s = torch.empty(m, 1, dtype=torch.float32, device=x.device)
    if m:
        static = input_scale is not None
        _quant_rows_kernel[(m,)](x, input_scale if static else s, q, s, k, x.stride(0),
                                 BLOCK_K=1024, STATIC=static, num_warps=4)  # fmt: skip
    return q, s


@quantize_rows.register_fake
def _(x, input_scale=None):
    m, k = x.shape
    return (
        x.new_empty(m, k, dtype=torch.float8_e4m3fn),
        x.new_empty(m, 1, dtype=torch.float32),
    )


@dataclass(frozen=True)
class RowsConfig:
    """Launch shape of :func:`rows_linear` for one weight shape."""

    block_n: int  # weight rows per program (64 or 128: the wgmma's M side)
    block_k: int  # must divide K / split
    num_warps: int
    num_stages: int  # tiles in flight (Triton's software pipeline of the K loop)
    split: int = 1  # programs per column block, each over K / split (summed in a fixed order)

    def fits(self, k: int) -> bool:
        """Whether this launch shape takes a product of inner size ``k``."""
        return k % self.split == 0 and (k // self.split) % self.block_k == 0


MAX_ROWS = 16  # token rows of one rows_linear call (padded to 16)
# Measured launch shapes per (N, K), where rows_linear beat _scaled_mm at 2..16 rows; the table
# is also the dispatch rule (a shape not listed goes to _scaled_mm). Run 32 on one H200
# (`skinny_sweep.py --models llama-3-8b:fp8 --big-rows 2 5 8`, weights cold in L2,
# benchmarks/fp8_rows_sweep_h200.json): the Llama-3-8B shapes, us against _scaled_mm.
ROWS_CONFIGS: dict[tuple[int, int], RowsConfig] = {
    (6144, 4096): RowsConfig(64, 256, 4, 5),  # 2 rows 8.8 vs 19.1, 5 rows 8.8 vs 20.2, 8 rows 9.2 vs 19.1 us
    (4096, 4096): RowsConfig(64, 256, 4, 5),  # 2 rows 7.3 vs 14.8, 5 rows 7.4 vs 14.6, 8 rows 7.4 vs 14.7 us
    (28672, 4096): RowsConfig(64, 256, 4, 2),  # 2 rows 31.5 vs 47.5, 5 rows 32.3 vs 46.9, 8 rows 31.8 vs 51.5 us
    (4096, 14336): RowsConfig(64, 256, 4, 5),  # 2 rows 20.1 vs 46.6, 5 rows 19.9 vs 42.6, 8 rows 19.8 vs 42.5 us
    # the 8B vocabulary head in FP8 (fp8_head, opt-in): w13's launch shape by analogy (same
    # K, a long N), not swept
    (128256, 4096): RowsConfig(64, 256, 4, 2),
}  # fmt: skip
# Verify widths (2..FEW_ROWS rows) of the same shapes, with K split across programs where that
# filled the GPU: run 70 on one H200 (`fp8_bench.py --split-sweep`, benchmarks/
# fp8_split_sweep_h200_run70.json), 4 rows, row kernel included, us against ROWS_CONFIGS:
# the verify graph (1 x 4 tokens) went 2.751 -> 2.645 ms; at 16 rows these shapes were 1.5%
# slower (batch-16 decode), so more rows keep ROWS_CONFIGS.
FEW_ROWS = 8
FEW_ROWS_CONFIGS: dict[tuple[int, int], RowsConfig] = {
    (6144, 4096): RowsConfig(64, 256, 4, 3, split=4),  # 10.30 vs 11.63 us
    (4096, 4096): RowsConfig(64, 256, 4, 5, split=2),  # 7.61 vs 8.07 us
    (28672, 4096): RowsConfig(64, 128, 4, 3),  # 31.57 vs 37.31 us
    (4096, 14336): RowsConfig(64, 256, 4, 5, split=2),  # 20.05 vs 25.57 us
}


def rows_config(n: int, k: int, rows: int) -> RowsConfig:
    """The launch shape of a ``rows``-row product with ``[n, k]`` weights (a listed shape)."""
    few = FEW_ROWS_CONFIGS.get((n, k)) if rows <= FEW_ROWS else None
    return few or ROWS_CONFIGS[(n, k)]


def rows_launch(q: torch.Tensor, s: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                y: torch.Tensor, cfg: RowsConfig, residual: torch.Tensor | None = None,
                pdl: bool = False) -> None:  # fmt: skip
    """Run the rows kernel: codes ``q [M, K]`` (contiguous, M <= 16), scales ``s [M]``, into
    ``y [M, N]``, adding ``residual [M, N]`` (contiguous) if given."""
    m, (n, k) = q.shape[0], weight.shape
    blocks = triton.cdiv(n, cfg.block_n)
    part, counts = y, y  # unused at split 1
    if cfg.split > 1:
        part = torch.empty(cfg.split, m, n, dtype=torch.float32, device=q.device)
        counts = kernels.arrival_counters("fp8_rows", blocks, q.device)
    _rows_kernel[(blocks, cfg.split)](
        q, s, weight, weight_scale, y, y if residual is None else residual, part, counts, m, n,
        K=k, MP=MAX_ROWS, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT=cfg.split,
        RESID=residual is not None, PDL=pdl, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages, launch_pdl=pdl,
    )  # fmt: skip


@torch.library.custom_op("mathagent::fp8_rows_linear", mutates_args=())
def rows_linear(
    q: torch.Tensor, s: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
    out_dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    """``(q * s) @ (weight * weight_scale).T`` for 2..16 rows of e4m3 codes ``q [M, K]``."""
    y = torch.empty(q.shape[0], weight.shape[0], dtype=out_dtype, device=q.device)
    rows_launch(q, s.reshape(-1), weight, weight_scale, y, rows_config(*weight.shape, q.shape[0]))
    return y


@rows_linear.register_fake
def _(q, s, weight, weight_scale, out_dtype):
    return q.new_empty(q.shape[0], weight.shape[0], dtype=out_dtype)


def linear(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
    input_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """``x @ W.T`` of the FP8 model for any number of rows, on the FP8 tensor cores
    (``input_scale``: the product's static activation scale, else per row)."""
    flat = x.reshape(-1, x.shape[-1])
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    q, s = quantize_rows(flat, input_scale)
    if 2 <= flat.shape[0] <= MAX_ROWS and tuple(weight.shape) in ROWS_CONFIGS:
        out = rows_linear(q, s, weight, weight_scale, x.dtype)
    else:
        out = fp8_format.scaled_product(q, s, weight, weight_scale, x.dtype)
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
