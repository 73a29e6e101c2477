"""The Triton kernel of the CUDA path's split-KV attention (launched by ``attention.py``).

``_attn_kernel``: one program per (row, KV head, group of its query heads, stretch of
positions), online softmax over the slot's cache, the last stretch of a (row, KV head) to finish
merging the others; the rotary, the new K/V write and wo's e4m3 codes optionally inside.
"""

from __future__ import annotations

from mathagent.serving.engine.cuda import kernels

triton = kernels.triton
if triton is not None:
    import triton.language as tl

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
        NEW_IN_REGS: tl.constexpr = False, RROWS: tl.constexpr = 16, MERGE_LOADS: tl.constexpr = 1,
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
        # tables, the first block's cached rows and tree entries, wo's scale) is read before
        # waiting for it (the tree read after the k / v store's barrier had cost a round trip:
        # 6.7 -> 4.7 us a layer, benchmarks/GPU_NOTES.md run 144).
        # NEW_IN_REGS (one token, rotary inside): the first block takes the new k / v from
        # registers, not read back after their store (a memory round trip fewer).
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
        seen0 = _tree_seen(tree_ptr, p0, start, b, t, row_ok, T)  # a step input too
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
            # the blocks below read them, from other threads of this program (with the first
            # block's new rows from registers, only a stretch's later blocks do)
            if NEW_IN_REGS and T == 1:
                if hi - lo > BLOCK_S:
                    tl.debug_barrier()
            else:
                tl.debug_barrier()
        # the first block's rows from ``start`` on (this step's) now, beside the cached ones
        fresh = ((p0 >= start) & (p0 < kv_end))[:, None]
        if ROPE and NEW_IN_REGS and T == 1:  # the stored values themselves: same rounding
            k0 = tl.where(fresh, tl.broadcast_to(k_new.to(k_ptr.dtype.element_ty), k0.shape), k0)
            v0 = tl.where(fresh, tl.broadcast_to(v_new.to(v_ptr.dtype.element_ty), v0.shape), v0)
        else:
            k0 = tl.where(cached, k0, tl.load(k_ptr + kv0, mask=fresh, other=0.0))
            v0 = tl.where(cached, v0, tl.load(v_ptr + kv0, mask=fresh, other=0.0))
        m_i = tl.full((QROWS,), float("-inf"), tl.float32)
        l_i = tl.zeros((QROWS,), tl.float32)
        acc = tl.zeros((QROWS, D), tl.float32)
        m_i, l_i, acc = _attend_block(q, k0, v0, p0, start, seen0, qk_scale, m_i, l_i, acc,
                                      T, IEEE)  # fmt: skip
        for s0 in range(lo + BLOCK_S, hi, BLOCK_S):
            p = s0 + tl.arange(0, BLOCK_S)
            kv_off = kv_base + p[:, None] * stride_kp + d[None, :]
            k = tl.load(k_ptr + kv_off, mask=p[:, None] < kv_end, other=0.0)  # [BS, D]
            v = tl.load(v_ptr + kv_off, mask=p[:, None] < kv_end, other=0.0)
            seen = _tree_seen(tree_ptr, p, start, b, t, row_ok, T)
            m_i, l_i, acc = _attend_block(q, k, v, p, start, seen, qk_scale, m_i, l_i, acc, T,
                                          IEEE)  # fmt: skip
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
                # the merge holds only the real rows (a one-token step's 4 of the dots' 16)
                rr = tl.arange(0, RROWS)
                tr, gr = rr // GP, gs * GP + rr % GP
                out = _attn_merge(m_ptr, l_ptr, acc_ptr, pid, rr, d, n_active, D, QROWS, NSPLIT,
                                  MERGE_LOADS)  # fmt: skip
                o_rows = (
                    b * stride_ob + tr[:, None] * stride_ot + (kvh * G + gr)[:, None] * stride_oh
                )
                tl.store(out_ptr + o_rows + d[None, :], _stored(out, q_ptr, inv, CODES),
                         mask=(rr < T * GP)[:, None])  # fmt: skip
                tl.store(cnt_ptr + pid, 0)  # ready for the next launch

    @triton.jit
    def _tree_seen(tree_ptr, p, start, b, t, row_ok, T: tl.constexpr):
        # tree[b, t, p - start] for the block's new positions p [BS] (0 elsewhere): [QR, BS]
        rel = p[None, :] - start
        new = (rel >= 0) & (rel < T)
        return tl.load(tree_ptr + (b * T + t[:, None]) * T + rel, mask=new & row_ok[:, None],
                       other=0)  # fmt: skip

    @triton.jit
    def _attend_block(q, k, v, p, start, seen, qk_scale, m_i, l_i, acc, T: tl.constexpr,
                      IEEE: tl.constexpr):  # fmt: skip
        # One block of positions p [BS] (keys k, values v [BS, D]; seen: the tree's entries
        # for its new positions, :func:`_tree_seen`) into the online softmax.
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        else:
            s = tl.dot(q, tl.trans(k)) * qk_scale  # [QR, BS]
        rel = p[None, :] - start
        new = (rel >= 0) & (rel < T)
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
                    QROWS: tl.constexpr, NSPLIT: tl.constexpr, LOADS: tl.constexpr):  # fmt: skip
        # Combine the stretches' (max, sum, weighted values) of one (row, KV head), rows r, in
        # stretch order. LOADS stretches' parts are requested at once (one memory round trip
        # for LOADS stretches, not one each); a stretch past n_active changes nothing (its max
        # is -inf: factors 1 and 0 on zeros), so the sums are the one-by-one loop's exactly.
        m_run = tl.full(r.shape, float("-inf"), tl.float32)
        l_run = tl.zeros(r.shape, tl.float32)
        acc = tl.zeros((r.shape[0], D), tl.float32)
        for sp0 in range(0, n_active, LOADS):
            for j in tl.static_range(LOADS):
                sp = sp0 + j
                ws = (pid * NSPLIT + sp) * QROWS + r
                on = sp < n_active
                m = tl.load(m_ptr + ws, mask=on, other=float("-inf"), cache_modifier=".cg")
                l_part = tl.load(l_ptr + ws, mask=on, other=0.0, cache_modifier=".cg")
                part = tl.load(acc_ptr + ws[:, None] * D + d[None, :], mask=on, other=0.0,
                               cache_modifier=".cg")  # fmt: skip
                m_new = tl.maximum(m_run, m)
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
                c_old, c_new = tl.exp2(m_run - m_safe), tl.exp2(m - m_safe)
                l_new = l_run * c_old + l_part * c_new
                acc_new = acc * c_old[:, None] + part * c_new[:, None]
                m_run = tl.where(on, m_new, m_run)
                l_run = tl.where(on, l_new, l_run)
                acc = tl.where(on, acc_new, acc)
        return acc / tl.where(l_run == 0.0, 1.0, l_run)[:, None]
