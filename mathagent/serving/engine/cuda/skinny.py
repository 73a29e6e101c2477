"""Triton matrix product for 2..16 rows: the verify steps of speculative decoding.

A verify step of T tokens per row runs every product at M = rows x T. At M <= 16 the products
are bound by memory and latency like the one-row GEMV, but cuBLAS picks tiled GEMMs, often with
a split-K reduce kernel after them: on the default model (float32) a 6-row step's products cost
2.3x the one-row step's (benchmarks/spec_step_profile_h200_eagle3_k5.json). :func:`skinny`
streams each weight once for all M rows: a program owns ``BLOCK_N`` output columns of every row
and walks K (unrolled: K is a compile-time constant), accumulating in float32 either by
broadcast FMAs (rows padded to a power of two, one cross-thread reduction at the end) or by
``tl.dot`` (rows padded to 16; float32 at IEEE precision, never TF32, so outputs stay within
float32 rounding of cuBLAS and speculative greedy output stays the plain greedy output).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mathagent.serving.engine.cuda import kernels

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

    @triton.jit(do_not_specialize=["M"])
    def _skinny_kernel(x_ptr, w_ptr, y_ptr, M, N, stride_xm, stride_wn, K: tl.constexpr,
                       MP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                       DOT: tl.constexpr, IEEE: tl.constexpr, UNROLL: tl.constexpr,
                       EVICT: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
        # y[M, N] = x[M, K] @ w[N, K]^T; MP: rows padded (16 for tl.dot, a power of two else).
        # IEEE: float32 operands, multiplied in full precision by tl.dot (no TF32).
        # UNROLL: the K loop is unrolled (a partial last tile allowed), else a loop over
        # K // BLOCK_K >= 2 whole tiles.
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rm = tl.arange(0, MP)
        rk = tl.arange(0, BLOCK_K)
        w_ptrs = w_ptr + rn[:, None] * stride_wn + rk[None, :]
        x_ptrs = x_ptr + rm[:, None] * stride_xm + rk[None, :]
        n_ok, m_ok = rn[:, None] < N, rm[:, None] < M
        # Weights never change: the first tile is requested before waiting on the kernel
        # before (programmatic dependent launch), as the one-row GEMV does.
        w = _tile(w_ptrs, n_ok, rk, 0, K, BLOCK_K, EVICT)
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        if DOT:
            acc = tl.zeros((MP, BLOCK_N), dtype=tl.float32)
        else:  # elementwise partial sums; one reduction over K at the end
            acc = tl.zeros((MP, BLOCK_N, BLOCK_K), dtype=tl.float32)
        acc = _accumulate(acc, _tile(x_ptrs, m_ok, rk, 0, K, BLOCK_K, ""), w, DOT, IEEE)
        if UNROLL:
            for k0 in tl.static_range(BLOCK_K, K, BLOCK_K):
                w = _tile(w_ptrs, n_ok, rk, k0, K, BLOCK_K, EVICT)
                x = _tile(x_ptrs, m_ok, rk, k0, K, BLOCK_K, "")
                acc = _accumulate(acc, x, w, DOT, IEEE)
        else:  # each step requests the next tile before it multiplies (one tile ahead)
            w = tl.load(w_ptrs + BLOCK_K, mask=n_ok, other=0.0, eviction_policy=EVICT)
            x = tl.load(x_ptrs + BLOCK_K, mask=m_ok, other=0.0)
            for k0 in range(2 * BLOCK_K, K, BLOCK_K):
                w_next = tl.load(w_ptrs + k0, mask=n_ok, other=0.0, eviction_policy=EVICT)
                x_next = tl.load(x_ptrs + k0, mask=m_ok, other=0.0)
                acc = _accumulate(acc, x, w, DOT, IEEE)
                w, x = w_next, x_next
            acc = _accumulate(acc, x, w, DOT, IEEE)
        if DOT:  # noqa: SIM108 (a compile-time branch, spelled as Triton kernels spell them)
            y = acc
        else:
            y = tl.sum(acc, axis=2)
        tl.store(y_ptr + rm[:, None] * N + rn[None, :], y.to(y_ptr.dtype.element_ty),
                 mask=m_ok & (rn[None, :] < N))  # fmt: skip


@dataclass(frozen=True)
class SkinnyConfig:
    """Launch shape of :func:`skinny` for one weight shape and row bucket."""

    block_n: int  # output columns per program
    block_k: int  # reduction columns per unrolled step
    num_warps: int
    dot: bool  # tl.dot over rows padded to 16, else broadcast FMAs over a power of two
    evict: str = "evict_first"  # weights are read once per step: keep L2 for activations
    pdl: bool = True  # programmatic dependent launch: overlap the previous kernel's tail


# From benchmarks/skinny_sweep.py on one H200 (weights cold in L2, one graph per shape): per
# (N, K, bytes per weight value, row bucket) the fastest launch shape, listed only where it beat
# cuBLAS. The table is also the dispatch rule (skinny_buckets): measured once by the sweep
# rather than timed at every engine start, so start-up compiles nothing extra and a float32
# model's products take the same kernels (the same rounding) on every run. Measured in run 24
# (`skinny_sweep.py --models smollm2-135m:float32 smollm2-135m:bfloat16`,
# benchmarks/skinny_sweep_h200.json): the default model's shapes, microseconds against cuBLAS.
SKINNY_CONFIGS: dict[tuple[int, int, int, int], SkinnyConfig] = {
    (960, 576, 4, 2): SkinnyConfig(2, 512, 4, False),  # 3.7 vs 5.0 us
    (960, 576, 4, 4): SkinnyConfig(4, 512, 4, False),  # 4.2 vs 6.5 us
    (960, 576, 4, 8): SkinnyConfig(2, 512, 4, False),  # 4.2 vs 6.9 us
    (960, 576, 4, 16): SkinnyConfig(2, 256, 4, False),  # 6.2 vs 11.3 us
    (576, 576, 4, 2): SkinnyConfig(8, 256, 4, False),  # 2.9 vs 10.0 us
    (576, 576, 4, 4): SkinnyConfig(4, 512, 4, False),  # 4.0 vs 10.0 us
    (576, 576, 4, 8): SkinnyConfig(2, 512, 4, False),  # 4.1 vs 9.1 us
    (576, 576, 4, 16): SkinnyConfig(2, 256, 4, False),  # 6.1 vs 10.1 us
    (3072, 576, 4, 2): SkinnyConfig(8, 512, 4, False),  # 4.6 vs 6.0 us
    (3072, 576, 4, 4): SkinnyConfig(8, 256, 4, False),  # 5.9 vs 7.4 us
    (3072, 576, 4, 8): SkinnyConfig(16, 64, 4, False),  # 6.5 vs 7.8 us
    (3072, 576, 4, 16): SkinnyConfig(8, 64, 4, False),  # 10.1 vs 12.4 us
    (576, 1536, 4, 2): SkinnyConfig(4, 512, 4, False),  # 3.8 vs 15.0 us
    (576, 1536, 4, 4): SkinnyConfig(4, 512, 4, False),  # 4.1 vs 12.5 us
    (576, 1536, 4, 8): SkinnyConfig(2, 512, 4, False),  # 4.4 vs 14.2 us
    (576, 1536, 4, 16): SkinnyConfig(2, 128, 4, False),  # 9.5 vs 13.6 us
    (49152, 576, 4, 2): SkinnyConfig(16, 64, 4, False),  # 35.3 vs 38.4 us
    (49152, 576, 4, 4): SkinnyConfig(16, 64, 4, False),  # 42.4 vs 53.2 us
    (49152, 576, 4, 8): SkinnyConfig(16, 32, 4, False),  # 52.3 vs 56.1 us
    (960, 576, 2, 2): SkinnyConfig(4, 256, 4, False),  # 2.7 vs 4.1 us
    (960, 576, 2, 4): SkinnyConfig(4, 256, 4, False),  # 3.7 vs 3.9 us
    (576, 576, 2, 2): SkinnyConfig(4, 512, 4, False),  # 2.3 vs 3.5 us
    (576, 576, 2, 4): SkinnyConfig(8, 256, 4, False),  # 3.1 vs 3.6 us
    (3072, 576, 2, 2): SkinnyConfig(2, 512, 4, False),  # 3.7 vs 4.1 us
    (576, 1536, 2, 2): SkinnyConfig(8, 512, 4, False),  # 3.1 vs 5.2 us
    (576, 1536, 2, 4): SkinnyConfig(2, 512, 4, False),  # 3.6 vs 5.2 us
    (576, 1536, 2, 8): SkinnyConfig(2, 512, 4, False),  # 4.7 vs 5.1 us
}  # fmt: skip


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


def skinny_config(n: int, k: int, itemsize: int, rows: int) -> SkinnyConfig:
    """The measured launch shape, else a heuristic one (broadcast FMAs, ~2 programs per SM)."""
    cfg = SKINNY_CONFIGS.get((n, k, itemsize, bucket(rows)))
    if cfg is None:
        block_n = 4 if n <= 2048 else 8 if n <= 8192 else 16
        # ~32 float32 partial sums per thread (4 warps): MP x BLOCK_N x BLOCK_K / 128
        block_k = min(256, max(32, 4096 // (bucket(rows) * block_n)))
        cfg = SkinnyConfig(block_n, block_k, 4, False)
    if cfg.pdl and not kernels.pdl_supported():
        cfg = SkinnyConfig(cfg.block_n, cfg.block_k, cfg.num_warps, cfg.dot, cfg.evict, False)
    return cfg


def unrolled(k: int, mp: int, cfg: SkinnyConfig) -> bool:
    """Whether the K loop is unrolled: always for a partial last tile, else when the unrolled
    loads fit in ~160 registers a thread. ptxas hoists every load of an unrolled loop (that is
    the point: all tiles in flight at once), and past that it spills (sm_90a, 8B shapes)."""
    if k % cfg.block_k or k < 2 * cfg.block_k:
        return True
    in_flight = k * (cfg.block_n + mp) + (0 if cfg.dot else mp * cfg.block_n * cfg.block_k)
    return k <= MAX_UNROLL * cfg.block_k and in_flight <= 160 * 32 * cfg.num_warps


def launch(x2: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, cfg: SkinnyConfig) -> None:
    """Run the kernel on ``x2 [M, K]`` (last stride 1) into ``y [M, N]`` (contiguous)."""
    m, (n, k) = x2.shape[0], weight.shape
    mp = MAX_ROWS if cfg.dot else bucket(m)
    unroll = unrolled(k, mp, cfg)
    _skinny_kernel[(triton.cdiv(n, cfg.block_n),)](
        x2, weight, y, m, n, x2.stride(0), weight.stride(0), K=k, MP=mp, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, DOT=cfg.dot, IEEE=x2.dtype == torch.float32, UNROLL=unroll,
        EVICT=cfg.evict, PDL=cfg.pdl,
        num_warps=cfg.num_warps, launch_pdl=cfg.pdl,
    )  # fmt: skip


@torch.library.custom_op("mathagent::skinny", mutates_args=())
def skinny(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight[N, K].T`` for 2..16 rows of ``x [..., K]``; bandwidth-bound."""
    n, k = weight.shape
    x2 = x.reshape(-1, k)
    if not bucket(x2.shape[0]):
        raise ValueError(f"skinny takes 2..{MAX_ROWS} rows, got {x2.shape[0]}")
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y = torch.empty(x2.shape[0], n, dtype=x.dtype, device=x.device)
    launch(x2, weight, y, skinny_config(n, k, weight.element_size(), x2.shape[0]))
    return y.view(*x.shape[:-1], n)


@skinny.register_fake
def _(x, weight):
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def skinny_fits(weight: torch.Tensor) -> bool:
    """Whether :func:`skinny` can take products with this weight."""
    return (
        weight.dim() == 2
        and weight.stride(1) == 1
        and weight.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and weight.shape[1] % 16 == 0
    )
