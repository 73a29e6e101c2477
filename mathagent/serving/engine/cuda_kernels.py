"""Triton kernels of the CUDA decode path: skinny matrix products and attention over the KV cache.

Decode reads every weight once per step, so its speed is the bandwidth of the matrix products
at a handful of rows, plus the attention over each slot's cached keys. :func:`gemv` is a
streaming kernel for one row with a launch shape measured per weight shape (cold in L2, as a
step reads it) and programmatic dependent launch, so each product starts reading its weights
while the kernel before it finishes (benchmarks/GPU_NOTES.md). :func:`decode_attention` is
split-KV ("flash-decoding"): each program covers one slot, one KV head and one stretch of
positions, reads only positions below the slot's length (read on the device, so the launch is
CUDA-graph safe), and the last stretch of each (row, KV head) to finish merges them. New
tokens (a decode token, a verify window or a flattened draft tree) sit at
``start .. start+T-1`` and see each other through ``tree [B, T, T]``; everything before
``start`` is visible.

Each kernel is a ``torch.library`` custom op, so ``torch.compile`` treats it as one opaque call.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs have no Triton; the CUDA path is then unavailable
    triton = None


def available() -> bool:
    """True when Triton and a CUDA device are present."""
    return triton is not None and torch.cuda.is_available()


if triton is not None:

    @triton.jit
    def _gemv_input(x_ptr, g_ptr, k0, rk, K, rstd, PRO: tl.constexpr, dt: tl.constexpr):
        # The product's input at k0 + rk, float32, rounded like the eager model's ops.
        x = tl.load(x_ptr + k0 + rk).to(tl.float32)  # [BK]
        if PRO == 1:
            g = tl.load(g_ptr + k0 + rk).to(tl.float32)
            x = ((x * rstd).to(dt).to(tl.float32) * g).to(dt).to(tl.float32)
        elif PRO == 2:
            up = tl.load(x_ptr + K + k0 + rk).to(tl.float32)
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
        rstd = 0.0
        if PRO == 1:  # every program recomputes the row's statistics: K values, from L2
            ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                xv = tl.load(x_ptr + k0 + rk).to(tl.float32)
                ss += xv * xv
            rstd = tl.rsqrt(tl.sum(ss, axis=0) / K + eps)
        # Elementwise partial sums; one cross-thread reduction at the end, not per K step.
        acc = w0.to(tl.float32) * _gemv_input(x_ptr, g_ptr, 0, rk, K, rstd, PRO, dt)[None, :]
        for k0 in range(BLOCK_K, K, BLOCK_K):
            w = tl.load(w_ptrs + k0, mask=w_ok, other=0.0, eviction_policy=EVICT)  # [BN, BK]
            acc += w.to(tl.float32) * _gemv_input(x_ptr, g_ptr, k0, rk, K, rstd, PRO, dt)[None, :]
        y = tl.sum(acc, axis=1).to(dt)
        if RESID:
            r = tl.load(r_ptr + rn, mask=rn < N, other=0.0)
            y = (y.to(tl.float32) + r.to(tl.float32)).to(dt)
        tl.store(y_ptr + rn, y, mask=rn < N)

    @triton.jit
    def _attn_kernel(
        q_ptr, k_ptr, v_ptr, slots_ptr, start_ptr, tree_ptr, m_ptr, l_ptr, acc_ptr, cnt_ptr,
        out_ptr, pos_ptr, cos_ptr, sin_ptr, qk_scale, stride_qb, stride_qt, stride_qh,
        stride_ks, stride_kh, stride_kp, stride_ob, stride_ot, stride_oh,
        HKV: tl.constexpr, T: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
        QROWS: tl.constexpr, PART: tl.constexpr, BLOCK_S: tl.constexpr, NSPLIT: tl.constexpr,
        MAX_SEQ: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr, ROPE: tl.constexpr,
        TP: tl.constexpr,
    ):  # fmt: skip
        # ROPE: q_ptr is the QKV projection [B, T, (H + 2 Hkv) * D] before rotary; this kernel
        # rotates q and the new k (positions pos [B, T], tables cos/sin [*, D]) and writes the
        # new k and v into the cache, so no separate rotary and scatter kernels run.
        if PDL:  # let the next product (launched with PDL) start streaming its weights
            tl.extra.cuda.gdc_launch_dependents()
        pid, split = tl.program_id(0), tl.program_id(1)
        b, kvh = pid // HKV, pid % HKV
        start = tl.load(start_ptr + b)
        total = start + T
        n_active = tl.minimum(tl.cdiv(total, PART), NSPLIT)
        lo = split * PART
        r = tl.arange(0, QROWS)
        t, g = r // G, r % G
        row_ok = r < T * G
        d = tl.arange(0, D)
        if lo >= total:  # past the row's length: only the active splits take part
            return
        slot = tl.load(slots_ptr + b).to(tl.int64)
        q_off = b * stride_qb + t[:, None] * stride_qt + (kvh * G + g)[:, None] * stride_qh
        q = tl.load(q_ptr + q_off + d[None, :], mask=row_ok[:, None], other=0.0)  # [QR, D]
        kv_base = slot * stride_ks + kvh * stride_kh
        hi = tl.minimum(lo + PART, total)
        if ROPE:
            pos = tl.load(pos_ptr + b * T + t, mask=row_ok, other=0)
            q = _rope(q, q_ptr + q_off, row_ok[:, None], pos, cos_ptr, sin_ptr, d, D)
            q = q.to(q_ptr.dtype.element_ty)
            # This stretch writes the new tokens that fall in it, then reads them back.
            tn = tl.arange(0, TP)
            p_new = start + tn
            ok = ((tn < T) & (p_new >= lo) & (p_new < hi) & (p_new < MAX_SEQ))[:, None]
            row = q_ptr + b * stride_qb + tn[:, None] * stride_qt  # [TP, 1]
            k_row = row + (HKV * G + kvh) * stride_qh
            k_new = tl.load(k_row + d[None, :], mask=ok, other=0.0)  # [TP, D]
            pos_k = tl.load(pos_ptr + b * T + tn, mask=tn < T, other=0)
            k_new = _rope(k_new, k_row, ok, pos_k, cos_ptr, sin_ptr, d, D)
            v_new = tl.load(row + (HKV * G + HKV + kvh) * stride_qh + d[None, :], mask=ok)
            dst = kv_base + p_new[:, None] * stride_kp + d[None, :]
            tl.store(k_ptr + dst, k_new.to(k_ptr.dtype.element_ty), mask=ok)
            tl.store(v_ptr + dst, v_new.to(v_ptr.dtype.element_ty), mask=ok)
            tl.debug_barrier()  # the loop below reads them, from other threads of this program
        m_i = tl.full((QROWS,), float("-inf"), tl.float32)
        l_i = tl.zeros((QROWS,), tl.float32)
        acc = tl.zeros((QROWS, D), tl.float32)
        kv_end = tl.minimum(total, MAX_SEQ)  # padded new tokens may run past the cache
        for s0 in range(lo, hi, BLOCK_S):
            p = s0 + tl.arange(0, BLOCK_S)
            kv_off = kv_base + p[:, None] * stride_kp + d[None, :]
            k = tl.load(k_ptr + kv_off, mask=p[:, None] < kv_end, other=0.0)  # [BS, D]
            if IEEE:
                s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
            else:
                s = tl.dot(q, tl.trans(k)) * qk_scale  # [QR, BS]
            rel = p[None, :] - start
            new = (rel >= 0) & (rel < T)
            tree_off = (b * T + t[:, None]) * T + rel
            seen = tl.load(tree_ptr + tree_off, mask=new & row_ok[:, None], other=0)
            s = tl.where((rel < 0) | (new & (seen != 0)), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            pr = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(pr, axis=1)
            v = tl.load(v_ptr + kv_off, mask=p[:, None] < kv_end, other=0.0)
            if IEEE:
                pv = tl.dot(pr, v.to(tl.float32), input_precision="ieee")
            else:
                pv = tl.dot(pr.to(v.dtype), v)
            acc = acc * alpha[:, None] + pv
            m_i = m_new
        o_off = b * stride_ob + t[:, None] * stride_ot + (kvh * G + g)[:, None] * stride_oh
        o_ptrs = out_ptr + o_off + d[None, :]
        if n_active == 1:  # one stretch covers the row: no merge
            out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
            tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
        else:
            ws = (pid * NSPLIT + split) * QROWS
            tl.store(m_ptr + ws + r, m_i)
            tl.store(l_ptr + ws + r, l_i)
            tl.store(acc_ptr + (ws + r)[:, None] * D + d[None, :], acc)
            tl.debug_barrier()  # every thread's stores precede the count (release below)
            # The last stretch to finish merges all of them (no second kernel per layer).
            if tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel") == n_active - 1:
                out = _attn_merge(m_ptr, l_ptr, acc_ptr, pid, r, d, n_active, D, QROWS, NSPLIT)
                tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
                tl.store(cnt_ptr + pid, 0)  # ready for the next launch

    @triton.jit
    def _rope(x, x_ptrs, mask, pos, cos_ptr, sin_ptr, d, D: tl.constexpr):
        # Half-split rotary of rows x [R, D] loaded from x_ptrs [R, 1] + d (float32 result).
        half = tl.load(x_ptrs + ((d + D // 2) % D)[None, :], mask=mask, other=0.0).to(tl.float32)
        rotated = tl.where((d < D // 2)[None, :], -half, half)
        cs = pos[:, None] * D + d[None, :]
        cos = tl.load(cos_ptr + cs).to(tl.float32)
        sin = tl.load(sin_ptr + cs).to(tl.float32)
        return x.to(tl.float32) * cos + rotated * sin

    @triton.jit
    def _attn_merge(m_ptr, l_ptr, acc_ptr, pid, r, d, n_active, D: tl.constexpr,
                    QROWS: tl.constexpr, NSPLIT: tl.constexpr):  # fmt: skip
        # Combine the stretches' (max, sum, weighted values) of one (row, KV head).
        m_run = tl.full((QROWS,), float("-inf"), tl.float32)
        l_run = tl.zeros((QROWS,), tl.float32)
        acc = tl.zeros((QROWS, D), tl.float32)
        for sp in range(0, n_active):
            ws = (pid * NSPLIT + sp) * QROWS + r
            m = tl.load(m_ptr + ws, cache_modifier=".cg")
            m_new = tl.maximum(m_run, m)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            c_old, c_new = tl.exp2(m_run - m_safe), tl.exp2(m - m_safe)
            l_run = l_run * c_old + tl.load(l_ptr + ws, cache_modifier=".cg") * c_new
            part = tl.load(acc_ptr + ws[:, None] * D + d[None, :], cache_modifier=".cg")
            acc = acc * c_old[:, None] + part * c_new[:, None]
            m_run = m_new
        return acc / tl.where(l_run == 0.0, 1.0, l_run)[:, None]


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
    if cfg.pdl and not _pdl_supported():
        cfg = GemvConfig(cfg.block_n, cfg.block_k, cfg.num_warps, cfg.evict, False)
    return cfg


@functools.cache
def _pdl_supported() -> bool:
    # Programmatic dependent launch needs Hopper (sm_90) or newer.
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


def attention_partition(batch: int) -> int:
    """Positions per split-KV program: short for one row (parallelism), long for many."""
    return 64 if batch <= 2 else 256 if batch <= 16 else 512


@torch.library.custom_op("mathagent::decode_attention", mutates_args=())
def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    start: torch.Tensor,
    tree: torch.Tensor,
) -> torch.Tensor:
    """Attention of ``q [B, T, H, D]`` over the slot cache ``[S, Hkv, max_seq, D]``.

    Row ``b``'s new tokens are cached at ``start[b] .. start[b]+T-1`` of slot ``slots[b]``;
    query ``t`` sees all positions before ``start[b]`` and new token ``j`` where
    ``tree[b, t, j]`` is non-zero. Returns ``[B, T, H, D]``.
    """
    return _attention(q, k_cache, v_cache, slots, start, tree, q.shape[2], None)


@decode_attention.register_fake
def _(q, k_cache, v_cache, slots, start, tree):
    return torch.empty_like(q)


@torch.library.custom_op("mathagent::rope_attention", mutates_args=("k_cache", "v_cache"))
def rope_attention(
    qkv: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    start: torch.Tensor,
    tree: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    n_heads: int,
) -> torch.Tensor:
    """:func:`decode_attention` fed by the QKV projection ``[B, T, (H + 2 Hkv) * D]``.

    Rotates q and the new k by ``positions [B, T]`` (half-split tables ``cos/sin [*, D]``),
    writes the new k and v into the cache at ``start[b] + t`` of slot ``slots[b]`` (positions
    past the cache are dropped) and attends as :func:`decode_attention`; one kernel instead of
    rotary, scatter and attention. Returns ``[B, T, H, D]``.
    """
    bsz, t = qkv.shape[:2]
    d = k_cache.shape[3]
    view = qkv.view(bsz, t, -1, d)  # [B, T, H + 2 Hkv, D]
    return _attention(view, k_cache, v_cache, slots, start, tree, n_heads, (positions, cos, sin))


@rope_attention.register_fake
def _(qkv, k_cache, v_cache, slots, start, tree, positions, cos, sin, n_heads):
    return qkv.new_empty(qkv.shape[0], qkv.shape[1], n_heads, k_cache.shape[3])


def _attention(q, k_cache, v_cache, slots, start, tree, h, rope) -> torch.Tensor:
    """Launch the split-KV kernel over ``q [B, T, >=H, D]`` (the first ``h`` heads are queries)."""
    bsz, t, _, d = q.shape
    hkv, max_seq = k_cache.shape[1], k_cache.shape[2]
    g = h // hkv
    qrows = max(16, triton.next_power_of_2(t * g))
    part = attention_partition(bsz)
    nsplit = triton.cdiv(max_seq, part)
    ws_rows = bsz * hkv * nsplit * qrows
    m = torch.empty(ws_rows, dtype=torch.float32, device=q.device)
    lsum = torch.empty(ws_rows, dtype=torch.float32, device=q.device)
    acc = torch.empty(ws_rows, d, dtype=torch.float32, device=q.device)
    out = q.new_empty(bsz, t, h, d)
    positions, cos, sin = rope if rope is not None else (start, start, start)
    assert positions.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()
    _attn_kernel[(bsz * hkv, nsplit)](
        q, k_cache, v_cache, slots, start, tree, m, lsum, acc, _counters(bsz * hkv, q.device),
        out, positions, cos, sin, math.log2(math.e) / math.sqrt(d),
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), out.stride(0), out.stride(1), out.stride(2),
        HKV=hkv, T=t, G=g, D=d, QROWS=qrows, PART=part, BLOCK_S=min(part, 64), NSPLIT=nsplit,
        MAX_SEQ=max_seq, IEEE=q.dtype == torch.float32, PDL=q.is_cuda and _pdl_supported(),
        ROPE=rope is not None, TP=triton.next_power_of_2(t), num_warps=4,
    )  # fmt: skip
    return out


_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _counters(n: int, device: torch.device) -> torch.Tensor:
    """Zeroed int32 arrival counters of the split-KV programs; each launch leaves them zero.

    Allocated once per device (outside graph capture: the step is always run before it is
    captured) and shared by all launches, which a stream runs one after another.
    """
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < n:
        buf = _COUNTERS[device] = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
    return buf
