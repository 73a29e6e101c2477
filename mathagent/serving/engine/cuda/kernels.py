"""Triton one-row matrix product (GEMV) of the CUDA decode path.

Decode reads every weight once per step, so its speed is the bandwidth of the matrix products
at a handful of rows. :func:`gemv` is a streaming kernel for one row with the RMSNorm, SiLU
product and residual add fused in, a launch shape measured per weight shape (cold in L2, as a
step reads it) and programmatic dependent launch, so each product starts reading its weights
while the kernel before it finishes (benchmarks/GPU_NOTES.md). The attention kernels are in
``attention.py``.

Each kernel is a ``torch.library`` custom op, so ``torch.compile`` treats it as one opaque call.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs have no Triton; the CUDA path is then unavailable
    triton = None


_ARRIVALS: dict[tuple[str, torch.device], list[torch.Tensor]] = {}


def arrival_counters(owner: str, n: int, device: torch.device) -> torch.Tensor:
    """Zeroed int32 arrival counters (the last program of a group to arrive merges the
    group's parts and zeroes its counter, so each launch leaves them zero), one buffer per
    kernel ``owner`` and device, shared by that kernel's launches, which a stream runs one
    after another. Made outside graph capture (a step always runs before it is captured); a
    larger need gets a new buffer and the old ones stay alive, since captured graphs keep
    their addresses."""
    bufs = _ARRIVALS.setdefault((owner, device), [])
    if not bufs or bufs[-1].numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # A buffer made during capture would be zeroed only when the graph replays.
            raise RuntimeError(f"run a {owner} launch once before capturing a CUDA graph")
        bufs.append(torch.zeros(max(n, 4096), dtype=torch.int32, device=device))
    return bufs[-1]


def available() -> bool:
    """True when Triton and a CUDA device are present."""
    return triton is not None and torch.cuda.is_available()


if triton is not None:

    @triton.jit
    def _rms_rstd(ss, K, eps):
        # 1 / rms of a row of K values from float32 squares ss (summed here), as the eager RMSNorm
        return tl.rsqrt(tl.sum(ss, axis=0) / K + eps)

    @triton.jit
    def _normed(x, rstd, g, dt: tl.constexpr):
        # RMSNorm(x) * g from float32 x and g, rounded like the eager model's ops
        return ((x * rstd).to(dt).to(tl.float32) * g).to(dt).to(tl.float32)

    @triton.jit
    def _gemv_input(x_ptr, g_ptr, k0, rk, K, rstd, PRO: tl.constexpr, dt: tl.constexpr, ok):
        # The product's input at k0 + rk, float32, rounded like the eager model's ops; ``ok``
        # masks the columns past K (None: all in range; masked values are undefined).
        x = tl.load(x_ptr + k0 + rk, mask=ok).to(tl.float32)  # [BK]
        if PRO == 1:
            x = _normed(x, rstd, tl.load(g_ptr + k0 + rk, mask=ok).to(tl.float32), dt)
        elif PRO == 2:
            up = tl.load(x_ptr + K + k0 + rk, mask=ok).to(tl.float32)
            x = ((x * tl.sigmoid(x)).to(dt).to(tl.float32) * up).to(dt).to(tl.float32)
        return x

    @triton.jit
    def _gemv_kernel(x_ptr, w_ptr, y_ptr, g_ptr, r_ptr, N, K, stride_wn, eps,
                     PRO: tl.constexpr, RESID: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, EVICT: tl.constexpr, PDL: tl.constexpr):  # fmt: skip
        # EVICT: the weights' L2 eviction policy ("evict_first": read once per step).
        # PRO: 0 plain input; 1 RMSNorm(x) * g; 2 silu(x[:K]) * x[K:]. RESID: y += r.
        # Roundings to the model dtype follow the eager model's op-by-op order.
        dt = y_ptr.dtype.element_ty
        rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        w_ptrs = w_ptr + rn[:, None] * stride_wn + rk[None, :]
        w_ok = rn[:, None] < N
        # Weights never change: the first tile is requested before waiting on the previous
        # kernel (programmatic dependent launch), so the next product's stream starts early.
        w0 = tl.load(w_ptrs, mask=w_ok, other=0.0, eviction_policy=EVICT)  # [BN, BK]
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        if RESID:  # requested now, not after the loop: no memory round trip at the end
            r = tl.load(r_ptr + rn, mask=rn < N, other=0.0)
        rstd = 0.0
        if PRO == 1:  # every program recomputes the row's statistics: K values, from L2
            ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                xv = tl.load(x_ptr + k0 + rk).to(tl.float32)
                ss += xv * xv
            rstd = _rms_rstd(ss, K, eps)
        # Elementwise partial sums; one cross-thread reduction at the end, not per K step.
        acc = w0.to(tl.float32) * _gemv_input(x_ptr, g_ptr, 0, rk, K, rstd, PRO, dt, None)[None, :]
        for k0 in range(BLOCK_K, K, BLOCK_K):
            w = tl.load(w_ptrs + k0, mask=w_ok, other=0.0, eviction_policy=EVICT)  # [BN, BK]
            acc += (
                w.to(tl.float32)
                * _gemv_input(x_ptr, g_ptr, k0, rk, K, rstd, PRO, dt, None)[None, :]
            )
        y = tl.sum(acc, axis=1).to(dt)
        if RESID:
            y = (y.to(tl.float32) + r.to(tl.float32)).to(dt)
        tl.store(y_ptr + rn, y, mask=rn < N)


@dataclass(frozen=True)
class GemvConfig:
    """Launch shape of the one-row GEMV for one weight shape."""

    block_n: int  # rows per program
    block_k: int  # columns per load; K must be a multiple
    num_warps: int
    evict: str = "evict_first"  # weights are read once per step: keep L2 for activations
    pdl: bool = True  # programmatic dependent launch: overlap the previous kernel's tail


# The fastest of 31 launch shapes per weight shape on one H200 (benchmarks/gemv_sweep.py;
# GPU_NOTES.md, "GEMV sweep"): weights cold in L2, each shape launched over distinct matrices in
# one CUDA graph, as in a decode step. Llama-3.2-1B and Llama-3-8B shapes: qkv, wo, w13, w2, head.
GEMV_CONFIGS: dict[tuple[int, int], GemvConfig] = {
    (3072, 2048): GemvConfig(8, 1024, 8),
    (2048, 2048): GemvConfig(4, 1024, 8),
    (16384, 2048): GemvConfig(4, 2048, 4),
    (2048, 8192): GemvConfig(8, 2048, 8),
    (128256, 2048): GemvConfig(4, 1024, 2),
    (6144, 4096): GemvConfig(16, 512, 8),
    (4096, 4096): GemvConfig(4, 1024, 2),
    (28672, 4096): GemvConfig(8, 1024, 8),
    (4096, 14336): GemvConfig(8, 1024, 4),
    (128256, 4096): GemvConfig(4, 2048, 4),
}
PDL_OK = True  # set False before the first product to launch without PDL anywhere


def gemv_config(n: int, k: int) -> GemvConfig:
    """The measured launch shape for ``[n, k]`` weights, else one that fills 132 SMs."""
    cfg = GEMV_CONFIGS.get((n, k))
    if cfg is None:
        block_k = 1024 if k % 1024 == 0 else 512 if k % 512 == 0 else 256
        cfg = GemvConfig(8 if n >= 8192 else 4, block_k, 4)
    if cfg.pdl and not pdl_supported():
        cfg = GemvConfig(cfg.block_n, cfg.block_k, cfg.num_warps, cfg.evict, False)
    return cfg


@functools.cache
def pdl_supported() -> bool:
    """Whether kernels may use programmatic dependent launch (Hopper, sm_90, or newer)."""
    return PDL_OK and torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)


@torch.library.custom_op("mathagent::gemv", mutates_args=())
def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    norm: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    eps: float = 1e-6,
    silu_mul: bool = False,
) -> torch.Tensor:
    """``f(x) @ weight[N, K].T (+ residual)`` for one row of ``x``; bandwidth-bound.

    ``f`` is the identity, ``RMSNorm(x) * norm`` when ``norm`` is given, or
    ``silu(x[:K]) * x[K:]`` when ``silu_mul`` (then ``x`` has ``2K`` values).
    """
    n, k = weight.shape
    x1 = x.reshape(-1).contiguous()
    y = torch.empty(n, dtype=x.dtype, device=x.device)
    res = x1 if residual is None else residual.reshape(n)
    pro = 1 if norm is not None else 2 if silu_mul else 0
    cfg = gemv_config(n, k)
    _gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
        x1, weight, y, x1 if norm is None else norm, res, n, k, weight.stride(0), eps,
        PRO=pro, RESID=residual is not None, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        EVICT=cfg.evict, PDL=cfg.pdl, num_warps=cfg.num_warps, launch_pdl=cfg.pdl,
    )  # fmt: skip
    return y.view(*x.shape[:-1], n)


@gemv.register_fake
def _(x, weight, norm=None, residual=None, eps=1e-6, silu_mul=False):
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def gemv_fits(weight: torch.Tensor) -> bool:
    """Whether :func:`gemv` can take products with this weight (K a multiple of 1024)."""
    return weight.is_contiguous() and weight.shape[1] % 1024 == 0


def gemv_preferred(weight: torch.Tensor, reps: int = 4, margin: float = 1.1) -> bool:
    """Whether one-row products with ``weight`` go to :func:`gemv` rather than cuBLAS.

    Both are timed as CUDA graphs, once per shape. :func:`gemv` is kept unless cuBLAS is more
    than ``margin`` times faster: it also fuses the norm, SiLU product and residual add that
    cost cuBLAS extra kernels, and overlaps the kernel before it. A decode step reads each
    matrix once, cold in L2, so the timed graph runs over enough copies of ``weight`` (at least
    256 MB) that none stays in the 60 MB L2.
    """
    copies = [weight] + [weight.clone() for _ in range(min(15, (256 << 20) // weight.nbytes))]
    x = torch.randn(1, weight.shape[1], dtype=weight.dtype, device=weight.device)
    times = []
    for fn in (gemv, torch.nn.functional.linear):
        fn(x, weight)  # compile / cuBLAS heuristics outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                for w in copies:
                    fn(x, w)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()
        start.record()
        for _ in range(3):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times[0] <= margin * times[1]
