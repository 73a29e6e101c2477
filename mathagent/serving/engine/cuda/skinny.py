"""Triton matrix product for 2..16 rows (the verify steps of speculative decoding), and fused.

A verify step of T tokens per row runs every product at M = rows x T. At M <= 16 the products
are bound by memory and latency like the one-row GEMV, but cuBLAS picks tiled GEMMs, often with
a split-K reduce kernel after them: on the default model (float32) a 6-row step's products cost
2.3x the one-row step's (benchmarks/spec_step_profile_h200_eagle3_k5.json). :func:`skinny`
streams each weight once for all M rows: a program owns ``BLOCK_N`` output columns of every row
and walks K (unrolled: K is a compile-time constant), accumulating in float32 either by
broadcast FMAs (rows padded to a power of two, one cross-thread reduction at the end) or by
``tl.dot`` (rows padded to 16; float32 at IEEE precision, never TF32, so outputs stay within
float32 rounding of cuBLAS and speculative greedy output stays the plain greedy output).

The fused form takes the one-row GEMV's prologue and epilogue (RMSNorm or SiLU product of the
input, residual add of the output) for 1..16 rows, so a layer of a model whose widths the
one-row GEMV does not take (the default model's K = 576 and 1536) runs four kernels and its
attention instead of Inductor's norm, SiLU and add kernels around four products: on a small
model the step is bound by the number of kernels, not by bytes. The launch shapes are in
``skinny_tables.py``; the kernel and its launch helpers stay one file because the helpers pick
the kernel's compile-time forms.
"""

from __future__ import annotations

import dataclasses

import torch

from mathagent.serving.engine.cuda import kernels
from mathagent.serving.engine.cuda.skinny_tables import FUSED_CONFIGS, SKINNY_CONFIGS, SkinnyConfig

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs have no Triton; the CUDA path is then unavailable
    triton = None

MAX_ROWS = 16
MAX_UNROLL = 16  # K steps unrolled at most; longer K loops over whole tiles

if triton is not None:

    @triton.jit
    def _tile(ptrs, row_ok, rk, k0: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr,
              EVICT: tl.constexpr):  # fmt: skip
        # One [rows, BLOCK_K] tile at column k0; only a last, partial tile masks columns.
        mask = row_ok
        if k0 + BLOCK_K > K:
            mask = row_ok & (k0 + rk[None, :] < K)
        return tl.load(ptrs + k0, mask=mask, other=0.0, eviction_policy=EVICT)

    @triton.jit
    def _accumulate(acc, x, w, DOT: tl.constexpr, IEEE: tl.constexpr):
        # One result variable: Triton compiles the code after a constexpr branch's return too.
        if DOT and IEEE:
            out = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
        elif DOT:
            out = tl.dot(x, tl.trans(w), acc)
        else:
            out = acc + x.to(tl.float32)[:, None, :] * w.to(tl.float32)[None, :, :]
        return out

    @triton.jit
    def _row_stats(x_ptrs, m_ok, rk, K: tl.constexpr, BLOCK_K: tl.constexpr, MP: tl.constexpr,
                   UNROLL: tl.constexpr, eps):  # fmt: skip
        # Each row's RMSNorm factor 1 / sqrt(mean(x^2) + eps); every program recomputes it
        # from L2 (K values per row), as the one-row GEMV does.
        ss = tl.zeros((MP, BLOCK_K), dtype=tl.float32)
        if UNROLL:
            for k0 in tl.static_range(0, K, BLOCK_K):
                xv = _tile(x_ptrs, m_ok, rk, k0, K, BLOCK_K, "").to(tl.float32)
                ss += xv * xv
        else:
            for k0 in range(0, K, BLOCK_K):
                xv = tl.load(x_ptrs + k0, mask=m_ok, other=0.0).to(tl.float32)
                ss += xv * xv
        return tl.rsqrt(tl.sum(ss, axis=1) / K + eps)

    @triton.jit
    def _input(x_ptrs, g_ptr, m_ok, rk, k0, K: tl.constexpr, BLOCK_K: tl.constexpr, rstd,
               PRO: tl.constexpr, CHECK: tl.constexpr):  # fmt: skip
        # The product's input f(x) for one [MP, BLOCK_K] tile, rounded to the model dtype
        # step by step as the one-row GEMV's prologue (kernels._gemv_input) and the eager
        # model round it. PRO: 0 x; 1 RMSNorm(x) * g; 2 silu(x[:, :K]) * x[:, K:].
        # CHECK: a tile that may pass K (masked); else only rows are masked.
        dt = x_ptrs.dtype.element_ty
        mask = m_ok
        if CHECK:
            mask = m_ok & (k0 + rk[None, :] < K)
        x = tl.load(x_ptrs + k0, mask=mask, other=0.0)
        if PRO == 1:
            g = tl.load(g_ptr + k0 + rk, mask=k0 + rk < K, other=0.0).to(tl.float32)
            xf = (x.to(tl.float32) * rstd[:, None]).to(dt).to(tl.float32)
            x = (xf * g[None, :]).to(dt)
        elif PRO == 2:
            up = tl.load(x_ptrs + K + k0, mask=mask, other=0.0).to(tl.float32)
            xf = x.to(tl.float32)
            x = ((xf * tl.sigmoid(xf)).to(dt).to(tl.float32) * up).to(dt)
        return x

    @triton.jit(do_not_specialize=["M"])
    def _skinny_kernel(x_ptr, w_ptr, y_ptr, g_ptr, r_ptr, ws_ptr, cnt_ptr, M, N, stride_xm,
                       stride_wn, eps, K: tl.constexpr, MP: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, DOT: tl.constexpr, IEEE: tl.constexpr,
                       UNROLL: tl.constexpr, EVICT: tl.constexpr, PDL: tl.constexpr,
                       PRO: tl.constexpr, RESID: tl.constexpr, GLU: tl.constexpr,
                       SPLIT: tl.constexpr):  # fmt: skip
        """y[M, N] = f(x)[M, K] @ w[N, K]^T (+ r[M, N]); one kernel for every form because the
        forms share the tile walk and its PDL placement, and each is a compile-time flag.

        MP: rows padded (16 for tl.dot, a power of two else). f: the prologue of _input (PRO).
        IEEE: float32 operands, multiplied in full precision by tl.dot (no TF32). UNROLL: the K
        loop is unrolled (a partial last tile allowed), else a loop over K // BLOCK_K >= 2
        whole tiles. RESID: the residual add of the eager model (product rounded, then added).
        GLU (unrolled only): w is [2N, K] (gate rows, then up rows); each program also streams
        the up rows of its columns and writes silu(gate) * up, so the next product reads a
        plain row (its own SiLU prologue cost a 16-row step more than the product).
        SPLIT: program (n, s) sums the s-th of SPLIT equal slices of K (whole tiles) into the
        float32 workspace ws [SPLIT (x2 with GLU), M, N]; the last slice of a column block to
        arrive (a counter in cnt, reset by it) adds the slices in order and runs the epilogue,
        so a product with few column blocks still spreads over the SMs and stays deterministic.
        """
        pid_n = tl.program_id(0)
        KL: tl.constexpr = K // SPLIT  # the K this program walks
        k_base = tl.program_id(1) * KL
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = tl.arange(0, MP)
        rk = tl.arange(0, BLOCK_K)
        w_ptrs = w_ptr + k_base + rn[:, None] * stride_wn + rk[None, :]
        x_rows = x_ptr + rm[:, None] * stride_xm + rk[None, :]  # whole rows: the norm's statistics
        x_ptrs = x_rows + k_base
        gk_ptr = g_ptr + k_base
        n_ok, m_ok = rn[:, None] < N, rm[:, None] < M
        # Weights never change: the first tile is requested before waiting on the kernel
        # before (programmatic dependent launch), as the one-row GEMV does.
        w = _tile(w_ptrs, n_ok, rk, 0, KL, BLOCK_K, EVICT)
        u_ptrs = w_ptrs + N * stride_wn  # GLU's up rows
        wu = w
        if GLU:
            wu = _tile(u_ptrs, n_ok, rk, 0, KL, BLOCK_K, EVICT)
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        rstd = tl.zeros((MP,), dtype=tl.float32)
        if PRO == 1:
            rstd = _row_stats(x_rows, m_ok, rk, K, BLOCK_K, MP, UNROLL, eps)
        if DOT:
            acc = tl.zeros((MP, BLOCK_N), dtype=tl.float32)
        else:  # elementwise partial sums; one reduction over K at the end
            acc = tl.zeros((MP, BLOCK_N, BLOCK_K), dtype=tl.float32)
        acc_u = acc
        # A split's slices are whole tiles (launch checks), so only SPLIT == 1 masks columns.
        x = _input(x_ptrs, gk_ptr, m_ok, rk, 0, K, BLOCK_K, rstd, PRO, BLOCK_K > KL)
        acc = _accumulate(acc, x, w, DOT, IEEE)
        if GLU:
            acc_u = _accumulate(acc_u, x, wu, DOT, IEEE)
        if UNROLL:
            for k0 in tl.static_range(BLOCK_K, KL, BLOCK_K):
                w = _tile(w_ptrs, n_ok, rk, k0, KL, BLOCK_K, EVICT)
                if GLU:
                    wu = _tile(u_ptrs, n_ok, rk, k0, KL, BLOCK_K, EVICT)
                x = _input(x_ptrs, gk_ptr, m_ok, rk, k0, K, BLOCK_K, rstd, PRO,
                           k0 + BLOCK_K > KL)  # fmt: skip
                acc = _accumulate(acc, x, w, DOT, IEEE)
                if GLU:
                    acc_u = _accumulate(acc_u, x, wu, DOT, IEEE)
        else:  # each step requests the next tile before it multiplies (one tile ahead)
            w = tl.load(w_ptrs + BLOCK_K, mask=n_ok, other=0.0, eviction_policy=EVICT)
            x = _input(x_ptrs, gk_ptr, m_ok, rk, BLOCK_K, K, BLOCK_K, rstd, PRO, False)
            for k0 in range(2 * BLOCK_K, KL, BLOCK_K):
                w_next = tl.load(w_ptrs + k0, mask=n_ok, other=0.0, eviction_policy=EVICT)
                x_next = _input(x_ptrs, gk_ptr, m_ok, rk, k0, K, BLOCK_K, rstd, PRO, False)
                acc = _accumulate(acc, x, w, DOT, IEEE)
                w, x = w_next, x_next
            acc = _accumulate(acc, x, w, DOT, IEEE)
        if DOT:
            y = acc
            yu = acc_u
        else:
            y = tl.sum(acc, axis=2)
            yu = tl.sum(acc_u, axis=2)
        out_ok = m_ok & (rn[None, :] < N)
        if SPLIT > 1:  # slices to the workspace; the last to arrive reduces them in order
            ws_tile = ws_ptr + rm[:, None] * N + rn[None, :]
            slice_size = M * N
            tl.store(ws_tile + tl.program_id(1) * slice_size, y, mask=out_ok)
            if GLU:
                tl.store(ws_tile + (SPLIT + tl.program_id(1)) * slice_size, yu, mask=out_ok)
            tl.debug_barrier()  # every thread's slice stored before the counter's release
            last = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu") == SPLIT - 1
            out_ok = out_ok & last
            y = tl.zeros((MP, BLOCK_N), dtype=tl.float32)
            yu = y
            for s in tl.static_range(SPLIT):  # L2, not L1: other SMs wrote these
                y += tl.load(ws_tile + s * slice_size, mask=out_ok, other=0.0, cache_modifier=".cg")
                if GLU:
                    yu += tl.load(ws_tile + (SPLIT + s) * slice_size, mask=out_ok, other=0.0,
                                  cache_modifier=".cg")  # fmt: skip
            tl.atomic_xchg(cnt_ptr + pid_n, 0, mask=last)  # ready for the next launch
        y = y.to(y_ptr.dtype.element_ty)
        if GLU:  # the eager rounding: gate and up rounded, silu(gate) rounded, the product
            gate = y.to(tl.float32)
            up = yu.to(y_ptr.dtype.element_ty).to(tl.float32)
            silu = (gate * tl.sigmoid(gate)).to(y_ptr.dtype.element_ty).to(tl.float32)
            y = (silu * up).to(y_ptr.dtype.element_ty)
        if RESID:
            r = tl.load(r_ptr + rm[:, None] * N + rn[None, :], mask=out_ok, other=0.0)
            y = (y.to(tl.float32) + r.to(tl.float32)).to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + rm[:, None] * N + rn[None, :], y, mask=out_ok)


def bucket(rows: int) -> int:
    """The padded row count a product of ``rows`` rows compiles for; 0 outside 2..16."""
    if rows < 2 or rows > MAX_ROWS:
        return 0
    return 1 << (rows - 1).bit_length()


def skinny_buckets(weight: torch.Tensor) -> frozenset[int]:
    """The row buckets whose products with ``weight`` go to :func:`skinny` (measured faster)."""
    if not skinny_fits(weight):
        return frozenset()
    n, k = weight.shape
    size = weight.element_size()
    return frozenset(b for (n2, k2, s2, b) in SKINNY_CONFIGS if (n2, k2, s2) == (n, k, size))


def skinny_config(n: int, k: int, itemsize: int, rows: int, fused: bool = False) -> SkinnyConfig:
    """The measured launch shape (the fused table's first when ``fused``), else a heuristic one
    (broadcast FMAs, ~2 programs per SM)."""
    cfg = FUSED_CONFIGS.get((n, k, itemsize, fused_bucket(rows))) if fused else None
    cfg = cfg or SKINNY_CONFIGS.get((n, k, itemsize, bucket(rows)))
    if cfg is None:
        block_n = 4 if n <= 2048 else 8 if n <= 8192 else 16
        # ~32 float32 partial sums per thread (4 warps): MP x BLOCK_N x BLOCK_K / 128
        block_k = min(256, max(32, 4096 // (max(2, bucket(rows)) * block_n)))
        cfg = SkinnyConfig(block_n, block_k, 4, False)
    if cfg.pdl and not kernels.pdl_supported():
        cfg = dataclasses.replace(cfg, pdl=False)
    return cfg


def glu_form(weight: torch.Tensor, rows: int) -> bool:
    """Whether a fused layer at ``rows`` rows runs w13 (this weight) in the GLU form: its entry
    in the fused table says so (measured faster than w2's SiLU prologue there)."""
    n, k = weight.shape
    return skinny_config(n, k, weight.element_size(), rows, fused=True).glu


def unrolled(k: int, mp: int, cfg: SkinnyConfig) -> bool:
    """Whether the K loop (of one split slice) is unrolled: always for a partial last tile, else
    when the unrolled loads fit in ~160 registers a thread. ptxas hoists every load of an
    unrolled loop (that is the point: all tiles in flight at once), and past that it spills
    (sm_90a, 8B shapes)."""
    k //= cfg.split
    if k % cfg.block_k or k < 2 * cfg.block_k:
        return True
    in_flight = k * (cfg.block_n + mp) + (0 if cfg.dot else mp * cfg.block_n * cfg.block_k)
    return k <= MAX_UNROLL * cfg.block_k and in_flight <= 160 * 32 * cfg.num_warps


def launch(
    x2: torch.Tensor,
    weight: torch.Tensor,
    y: torch.Tensor,
    cfg: SkinnyConfig,
    norm: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    eps: float = 1e-6,
    silu_mul: bool = False,
    glu: bool = False,
) -> None:
    """Run the kernel on ``x2 [M, K]`` (``[M, 2K]`` with ``silu_mul``; last stride 1) into
    ``y [M, N]`` (``N`` = half the weight's rows with ``glu``; contiguous), ``residual [M, N]``
    contiguous."""
    m, (n, k) = x2.shape[0], weight.shape
    n = n // 2 if glu else n
    mp = MAX_ROWS if cfg.dot else max(2, bucket(m) or 2)
    unroll = unrolled(k, mp, cfg) or glu
    blocks = triton.cdiv(n, cfg.block_n)
    ws, counters = y, y  # unused without a split
    if cfg.split > 1:
        if k % (cfg.split * cfg.block_k):
            raise ValueError(f"K = {k} is not {cfg.split} slices of whole {cfg.block_k} tiles")
        ws = torch.empty((2 if glu else 1) * cfg.split, m, n, dtype=torch.float32, device=y.device)
        counters = kernels.arrival_counters("skinny", blocks, y.device)
    _skinny_kernel[(blocks, cfg.split)](
        x2, weight, y, x2 if norm is None else norm, y if residual is None else residual, ws,
        counters, m, n, x2.stride(0), weight.stride(0), eps, K=k, MP=mp, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, DOT=cfg.dot, IEEE=x2.dtype == torch.float32, UNROLL=unroll,
        EVICT=cfg.evict, PDL=cfg.pdl, PRO=1 if norm is not None else 2 if silu_mul else 0,
        RESID=residual is not None, GLU=glu, SPLIT=cfg.split, num_warps=cfg.num_warps,
        launch_pdl=cfg.pdl,
    )  # fmt: skip


@torch.library.custom_op("mathagent::skinny", mutates_args=())
def skinny(
    x: torch.Tensor,
    weight: torch.Tensor,
    norm: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    eps: float = 1e-6,
    silu_mul: bool = False,
    glu: bool = False,
) -> torch.Tensor:
    """``f(x) @ weight[N, K].T (+ residual)`` for 1..16 rows of ``x [..., K]``; bandwidth-bound.

    ``f`` as in :func:`kernels.gemv`: the identity, ``RMSNorm(x) * norm``, or
    ``silu(x[..., :K]) * x[..., K:]`` when ``silu_mul``. ``glu``: ``weight`` holds gate rows then
    up rows, and the result is ``silu(gate) * up`` (``N / 2`` columns). With any of these (or
    ``residual``) the launch shape is the fused table's (:data:`FUSED_CONFIGS`), else
    :data:`SKINNY_CONFIGS`'.
    """
    n, k = weight.shape
    x2 = x.reshape(-1, x.shape[-1])
    rows = x2.shape[0]
    fused = norm is not None or residual is not None or silu_mul or glu
    if not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"skinny takes 1..{MAX_ROWS} rows, got {rows}")
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    cfg = skinny_config(n, k, weight.element_size(), rows, fused)
    n = n // 2 if glu else n
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    r = None if residual is None else residual.reshape(rows, n).contiguous()
    launch(x2, weight, y, cfg, norm, r, eps, silu_mul, glu)
    return y.view(*x.shape[:-1], n)


@skinny.register_fake
def _(x, weight, norm=None, residual=None, eps=1e-6, silu_mul=False, glu=False):
    return x.new_empty(*x.shape[:-1], weight.shape[0] // 2 if glu else weight.shape[0])


def fused_bucket(rows: int) -> int:
    """The fused table's row bucket: 1 for one row, else :func:`bucket`."""
    return 1 if rows == 1 else bucket(rows)


def fused_buckets(weight: torch.Tensor) -> frozenset[int]:
    """The row buckets whose products with ``weight`` take the fused kernel (measured: a
    layer's four products there beat cuBLAS with the norms, SiLU and adds around it)."""
    if not skinny_fits(weight):
        return frozenset()
    n, k = weight.shape
    size = weight.element_size()
    return frozenset(b for (n2, k2, s2, b) in FUSED_CONFIGS if (n2, k2, s2) == (n, k, size))


def skinny_fits(weight: torch.Tensor) -> bool:
    """Whether :func:`skinny` can take products with this weight."""
    return (
        weight.dim() == 2
        and weight.stride(1) == 1
        and weight.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and weight.shape[1] % 16 == 0
    )
