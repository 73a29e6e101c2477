"""Triton attention of the CUDA decode path: split-KV ("flash-decoding") over the slot cache.

Each program covers one slot, one KV head and one stretch of positions, reads only positions
below the slot's length (read on the device, so the launch is CUDA-graph safe), and the last
stretch of each (row, KV head) to finish merges them. New tokens (a decode token, a verify
window or a flattened draft tree) sit at ``start .. start+T-1`` and see each other through
``tree [B, T, T]``; everything before ``start`` is visible. :func:`rope_attention` also does
the rotary of q and k and writes the new k and v into the cache (benchmarks/GPU_NOTES.md).

Each kernel is a ``torch.library`` custom op, so ``torch.compile`` treats it as one opaque call.
"""

from __future__ import annotations

import functools
import math

import torch

from mathagent.serving.engine.cuda.kernels import arrival_counters, pdl_supported

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs have no Triton; the CUDA path is then unavailable
    triton = None

if triton is not None:
    from mathagent.serving.engine.cuda.fp8 import _quantize_codes

    @triton.jit
    def _attn_kernel(
        q_ptr, k_ptr, v_ptr, slots_ptr, start_ptr, tree_ptr, m_ptr, l_ptr, acc_ptr, cnt_ptr,
        out_ptr, pos_ptr, cos_ptr, sin_ptr, os_ptr, qk_scale, stride_qb, stride_qt, stride_qh,
        stride_ks, stride_kh, stride_kp, stride_ob, stride_ot, stride_oh,
        HKV: tl.constexpr, T: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
        QROWS: tl.constexpr, PART: tl.constexpr, BLOCK_S: tl.constexpr, NSPLIT: tl.constexpr,
        MAX_SEQ: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr, ROPE: tl.constexpr,
        TP: tl.constexpr, GS: tl.constexpr, CODES: tl.constexpr = False, WAIT: tl.constexpr = False,
    ):  # fmt: skip
        """One program per (row, KV head, group of its query heads, split): online-softmax
        attention over a slot's cache. GS: the KV head's G query heads in GS programs of G / GS
        heads each (rows t x head), so a wide verify step runs more, shorter programs.

        It is one long function because a Triton kernel is one function: helpers are inlined
        anyway, and splitting the work into kernels would add launches to a step that is bound
        by them (benchmarks/GPU_NOTES.md).
        """
        # ROPE: q_ptr is the QKV projection [B, T, (H + 2 Hkv) * D] before rotary; this kernel
        # rotates q and the new k (positions pos [B, T], tables cos/sin [*, D]) and writes the
        # new k and v into the cache, so no separate rotary and scatter kernels run. CODES:
        # the output is stored as wo's e4m3 codes (its static input scale at os_ptr). WAIT:
        # launched with PDL; what the producer of q does not write (the step's inputs, the
        # tables, the first block's cached rows, wo's scale) is read before waiting for it.
        if PDL:  # let the next product (launched with PDL) start streaming its weights
            tl.extra.cuda.gdc_launch_dependents()
        pid, split = tl.program_id(0), tl.program_id(1)
        b, kvh, gs = pid // (HKV * GS), (pid // GS) % HKV, pid % GS
        GP: tl.constexpr = G // GS  # query heads of this program
        start = tl.load(start_ptr + b)
        slot = tl.load(slots_ptr + b).to(tl.int64)
        total = start + T
        # PART positions a stretch, more once the row needs more than the NSPLIT stretches
        part = tl.maximum(tl.cdiv(tl.cdiv(total, NSPLIT), BLOCK_S) * BLOCK_S, PART)
        n_active = tl.cdiv(total, part)
        lo = split * part
        if lo >= total:  # past the row's length: only the active splits take part
            return
        r = tl.arange(0, QROWS)
        t, g = r // GP, gs * GP + r % GP
        row_ok = r < T * GP
        d = tl.arange(0, D)
        kv_base = slot * stride_ks + kvh * stride_kh
        hi = tl.minimum(lo + part, total)
        kv_end = tl.minimum(total, MAX_SEQ)  # padded new tokens may run past the cache
        # The first block's rows before ``start`` were cached by earlier steps: read them now.
        p0 = lo + tl.arange(0, BLOCK_S)
        kv0 = kv_base + p0[:, None] * stride_kp + d[None, :]
        cached = (p0 < tl.minimum(start, kv_end))[:, None]
        k0 = tl.load(k_ptr + kv0, mask=cached, other=0.0)  # [BS, D]
        v0 = tl.load(v_ptr + kv0, mask=cached, other=0.0)
        if ROPE:
            tn = tl.arange(0, TP)
            pos = tl.load(pos_ptr + b * T + t, mask=row_ok, other=0)
            pos_k = tl.load(pos_ptr + b * T + tn, mask=tn < T, other=0)
            cos_q, sin_q = _rope_tables(pos, cos_ptr, sin_ptr, d, D)
            cos_k, sin_k = _rope_tables(pos_k, cos_ptr, sin_ptr, d, D)
        inv = tl.full([], 1.0, tl.float32)  # CODES: 1 / wo's static input scale
        if CODES:
            inv = tl.math.div_rn(inv, tl.load(os_ptr))
        if WAIT:
            tl.extra.cuda.gdc_wait()
        q_off = b * stride_qb + t[:, None] * stride_qt + (kvh * G + g)[:, None] * stride_qh
        q = tl.load(q_ptr + q_off + d[None, :], mask=row_ok[:, None], other=0.0)  # [QR, D]
        if ROPE:
            q = _rope(q, q_ptr + q_off, row_ok[:, None], cos_q, sin_q, d, D)
            q = q.to(q_ptr.dtype.element_ty)
            # This stretch writes the new tokens that fall in it, then reads them back (the GS
            # programs of a KV head write the same values).
            p_new = start + tn
            ok = ((tn < T) & (p_new >= lo) & (p_new < hi) & (p_new < MAX_SEQ))[:, None]
            row = q_ptr + b * stride_qb + tn[:, None] * stride_qt  # [TP, 1]
            k_row = row + (HKV * G + kvh) * stride_qh
            k_new = tl.load(k_row + d[None, :], mask=ok, other=0.0)  # [TP, D]
            k_new = _rope(k_new, k_row, ok, cos_k, sin_k, d, D)
            v_new = tl.load(row + (HKV * G + HKV + kvh) * stride_qh + d[None, :], mask=ok)
            dst = kv_base + p_new[:, None] * stride_kp + d[None, :]
            tl.store(k_ptr + dst, k_new.to(k_ptr.dtype.element_ty), mask=ok)
            tl.store(v_ptr + dst, v_new.to(v_ptr.dtype.element_ty), mask=ok)
            tl.debug_barrier()  # the blocks below read them, from other threads of this program
        # the first block's rows from ``start`` on (this step's) now, beside the cached ones
        fresh = ((p0 >= start) & (p0 < kv_end))[:, None]
        k0 = tl.where(cached, k0, tl.load(k_ptr + kv0, mask=fresh, other=0.0))
        v0 = tl.where(cached, v0, tl.load(v_ptr + kv0, mask=fresh, other=0.0))
        m_i = tl.full((QROWS,), float("-inf"), tl.float32)
        l_i = tl.zeros((QROWS,), tl.float32)
        acc = tl.zeros((QROWS, D), tl.float32)
        m_i, l_i, acc = _attend_block(q, k0, v0, p0, start, b, t, row_ok, tree_ptr, qk_scale,
                                      m_i, l_i, acc, T, IEEE)  # fmt: skip
        for s0 in range(lo + BLOCK_S, hi, BLOCK_S):
            p = s0 + tl.arange(0, BLOCK_S)
            kv_off = kv_base + p[:, None] * stride_kp + d[None, :]
            k = tl.load(k_ptr + kv_off, mask=p[:, None] < kv_end, other=0.0)  # [BS, D]
            v = tl.load(v_ptr + kv_off, mask=p[:, None] < kv_end, other=0.0)
            m_i, l_i, acc = _attend_block(q, k, v, p, start, b, t, row_ok, tree_ptr, qk_scale,
                                          m_i, l_i, acc, T, IEEE)  # fmt: skip
        o_off = b * stride_ob + t[:, None] * stride_ot + (kvh * G + g)[:, None] * stride_oh
        o_ptrs = out_ptr + o_off + d[None, :]
        if n_active == 1:  # one stretch covers the row: no merge
            out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
            tl.store(o_ptrs, _stored(out, q_ptr, inv, CODES), mask=row_ok[:, None])
        else:
            ws = (pid * NSPLIT + split) * QROWS
            tl.store(m_ptr + ws + r, m_i)
            tl.store(l_ptr + ws + r, l_i)
            tl.store(acc_ptr + (ws + r)[:, None] * D + d[None, :], acc)
            tl.debug_barrier()  # every thread's stores precede the count (release below)
            # The last stretch to finish merges all of them (no second kernel per layer).
            if tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel") == n_active - 1:
                out = _attn_merge(m_ptr, l_ptr, acc_ptr, pid, r, d, n_active, D, QROWS, NSPLIT)
                tl.store(o_ptrs, _stored(out, q_ptr, inv, CODES), mask=row_ok[:, None])
                tl.store(cnt_ptr + pid, 0)  # ready for the next launch

    @triton.jit
    def _attend_block(q, k, v, p, start, b, t, row_ok, tree_ptr, qk_scale, m_i, l_i, acc,
                      T: tl.constexpr, IEEE: tl.constexpr):  # fmt: skip
        # One block of positions p [BS] (keys k, values v [BS, D]) into the online softmax.
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
        if IEEE:
            pv = tl.dot(pr, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(pr.to(v.dtype), v)
        return m_new, l_i, acc * alpha[:, None] + pv

    @triton.jit
    def _stored(out, q_ptr, inv, CODES: tl.constexpr):  # in q's dtype, or its e4m3 codes
        val = out.to(q_ptr.dtype.element_ty)
        if CODES:
            val = _quantize_codes(val.to(tl.float32), inv)
        return val

    @triton.jit
    def _rope_tables(pos, cos_ptr, sin_ptr, d, D: tl.constexpr):
        # The rotary's cos and sin rows [R, D] at positions pos [R] (float32).
        cs = pos[:, None] * D + d[None, :]
        return tl.load(cos_ptr + cs).to(tl.float32), tl.load(sin_ptr + cs).to(tl.float32)

    @triton.jit
    def _rope(x, x_ptrs, mask, cos, sin, d, D: tl.constexpr):
        # Half-split rotary of rows x [R, D] loaded from x_ptrs [R, 1] + d (float32 result).
        half = tl.load(x_ptrs + ((d + D // 2) % D)[None, :], mask=mask, other=0.0).to(tl.float32)
        rotated = tl.where((d < D // 2)[None, :], -half, half)
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


def attention_partition(batch: int, groups: int = 1) -> int:
    """Positions per split-KV program (fewest; more once a row needs more than
    :func:`attention_splits` stretches): short for one row (parallelism), long for many;
    :data:`WIDE_PARTITION` for one or two rows whose KV heads' queries are in ``groups > 1``
    programs (a wide verify)."""
    if batch <= 2:
        return WIDE_PARTITION if groups > 1 else 64
    return 256 if batch <= 16 else 512


def attention_splits(max_seq: int, part: int, programs: int, device: torch.device) -> int:
    """Stretches of a (row, KV head, group), the launch's second grid dimension: as many as
    ``max_seq`` needs at ``part`` positions each, at most one wave of the card's SMs over the
    ``programs`` (flash-decoding's rule: longer rows take longer stretches, not more of them,
    so the last stretch's merge reads a bounded number of parts); unbounded when
    :data:`SPLITS_PER_WAVE` is off."""
    need = triton.cdiv(max_seq, part)
    if not SPLITS_PER_WAVE:
        return need
    sms = _sm_count(device) if device.type == "cuda" else 132  # the interpreter: an H100's
    return max(1, min(need, sms // programs))


SPLITS_PER_WAVE = True


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


# Alone, 128 positions a program ran the default model's 13-node verify faster (640 cached
# positions: 8.1 -> 6.5 us; benchmarks/attention_sweep_h200_2026-12-04.json), but in the engine
# the step took 1.113 ms against 1.095 at 64 (runs 82-83).
WIDE_PARTITION = 64


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
    out_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`decode_attention` fed by the QKV projection ``[B, T, (H + 2 Hkv) * D]``.

    Rotates q and the new k by ``positions [B, T]`` (half-split tables ``cos/sin [*, D]``),
    writes the new k and v into the cache at ``start[b] + t`` of slot ``slots[b]`` (positions
    past the cache are dropped) and attends as :func:`decode_attention`; one kernel instead of
    rotary, scatter and attention. Returns ``[B, T, H, D]``: in the model dtype, or with
    ``out_scale`` (the output projection's static FP8 input scale ``[1]``) its e4m3 codes.
    """
    bsz, t = qkv.shape[:2]
    d = k_cache.shape[3]
    view = qkv.view(bsz, t, -1, d)  # [B, T, H + 2 Hkv, D]
    return _attention(view, k_cache, v_cache, slots, start, tree, n_heads, (positions, cos, sin),
                      out_scale=out_scale)  # fmt: skip


@rope_attention.register_fake
def _(qkv, k_cache, v_cache, slots, start, tree, positions, cos, sin, n_heads, out_scale=None):
    dtype = qkv.dtype if out_scale is None else torch.float8_e4m3fn
    return qkv.new_empty(qkv.shape[0], qkv.shape[1], n_heads, k_cache.shape[3], dtype=dtype)


def head_groups(width: int, g: int) -> int:
    """Programs per KV head (GS, dividing its ``g`` query heads): the fewest that keep a
    program's rows (``width`` tokens x its heads) within 16, the smallest tile of the dots, or
    one per query head past that; 1 when :data:`SPLIT_HEADS` is off."""
    if not SPLIT_HEADS:
        return 1
    return next((n for n in range(1, g + 1) if g % n == 0 and width * g // n <= 16), g)


# One-token steps of one row with 128-wide heads and the rotary inside (the Llama layout; q/k
# norm models rotate before the kernel) launch it with PDL and 8 warps: it reads its step
# inputs, rotary tables and first block of cached rows while the QKV product finishes. The 8B
# decode graph on an H100 (run 136, 160 / 288 cached positions): 3.015 ->
# 2.953 / 3.051 -> 2.986 ms (PDL with 4 warps, or 8 warps alone: within 0.015), greedy tokens
# unchanged (run 138). Not for verify steps (FP8 4-token graph 3.208 -> 3.336 ms) nor 16 rows
# (+1.2%): there the early programs hold SMs the products use. Not for the default model's
# 64-wide heads: unmeasured there, and 8 warps sum its softmax in another order (its greedy
# tokens moved in run 138; with this rule they are run 133's code's again, run 139).
LAUNCH_PDL = True

# A 13-node verify of the default model (3 query heads a KV head) ran 39 rows padded to 64 in
# each program at 9.3 us a layer, where a one-token decode step's 3 rows took 6.1 us (H200,
# benchmarks/GPU_NOTES.md, session of 2026-12-04): one program per query head instead.
SPLIT_HEADS = True


def _attention(q, k_cache, v_cache, slots, start, tree, h, rope, launch=None,
               out_scale=None) -> torch.Tensor:  # fmt: skip
    """Launch the split-KV kernel over ``q [B, T, >=H, D]`` (the first ``h`` heads are queries);
    ``launch`` = (positions per split, positions per block, warps[, programs per KV head[,
    most splits]]) overrides the default (benchmarks/attention_sweep.py)."""
    bsz, t, _, d = q.shape
    hkv, max_seq = k_cache.shape[1], k_cache.shape[2]
    g = h // hkv
    gs = launch[3] if launch is not None and len(launch) > 3 else head_groups(t, g)
    assert g % gs == 0, (g, gs)
    qrows = max(16, triton.next_power_of_2(t * g // gs))
    part = attention_partition(bsz, gs) if launch is None else launch[0]
    # float32 (IEEE dots) at 64+ query rows spills with 4 warps: the default model's 11-node
    # verify took 231 us a launch, 19 us with 8 (GPU_NOTES run 50)
    wide = q.dtype == torch.float32 and qrows >= 64
    wait = (q.is_cuda and pdl_supported() and LAUNCH_PDL and t == 1 and bsz == 1 and d == 128
            and rope is not None)  # fmt: skip
    block_s, warps = (min(part, 64), 8 if wide or wait else 4) if launch is None else launch[1:3]
    programs = bsz * hkv * gs
    if launch is not None and len(launch) > 4:
        nsplit = min(triton.cdiv(max_seq, part), launch[4])
    else:
        nsplit = attention_splits(max_seq, part, programs, q.device)
    ws_rows = programs * nsplit * qrows
    m = torch.empty(ws_rows, dtype=torch.float32, device=q.device)
    lsum = torch.empty(ws_rows, dtype=torch.float32, device=q.device)
    acc = torch.empty(ws_rows, d, dtype=torch.float32, device=q.device)
    out = q.new_empty(bsz, t, h, d, dtype=q.dtype if out_scale is None else torch.float8_e4m3fn)
    positions, cos, sin = rope if rope is not None else (start, start, start)
    assert positions.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()
    pdl = q.is_cuda and pdl_supported()
    _attn_kernel[(programs, nsplit)](
        q, k_cache, v_cache, slots, start, tree, m, lsum, acc,
        arrival_counters("attention", programs, q.device), out, positions, cos, sin,
        m if out_scale is None else out_scale, math.log2(math.e) / math.sqrt(d),
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), out.stride(0), out.stride(1), out.stride(2),
        HKV=hkv, T=t, G=g, D=d, QROWS=qrows, PART=part, BLOCK_S=block_s, NSPLIT=nsplit,
        MAX_SEQ=max_seq, IEEE=q.dtype == torch.float32, PDL=pdl, ROPE=rope is not None,
        TP=triton.next_power_of_2(t), GS=gs, CODES=out_scale is not None,
        WAIT=wait, num_warps=warps, launch_pdl=wait,
    )  # fmt: skip
    return out
