"""The Triton kernels of the FP8 model's one-row product (:mod:`.fp8_gemv` launches them).

``_fp8_row_kernel`` (one program a row) computes a product's input ``f(x)`` (the bf16 GEMV's
RMSNorm / SiLU prologue, :func:`kernels._gemv_input`), its scale and its e4m3 codes with the rule
of :func:`~mathagent.serving.engine.fp8_format.quantize_rows`; ``_fp8_gemv_kernel`` streams the
e4m3 weights against those codes on the CUDA cores (float32 products of converted codes), in
the GLU form for w13 (gate and up rows in one program, ``silu(gate) * up`` in its epilogue).
"""

from __future__ import annotations

from mathagent.serving.engine.cuda import kernels

triton = kernels.triton
if triton is not None:
    import triton.language as tl

    from mathagent.serving.engine.cuda.fp8 import _quantize_codes, _row_scale
    from mathagent.serving.engine.cuda.kernels import _gemv_input, _normed, _rms_rstd

    @triton.jit
    def _fp8_row_kernel(x_ptr, g_ptr, is_ptr, q_ptr, s_ptr, n_ptr, K, stride_x, eps,
                        PRO: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
                        STATIC: tl.constexpr = False, NORMED: tl.constexpr = False):  # fmt: skip
        # One program holds a whole row: f(x), max |f(x)|, scale, codes (one read of x).
        # STATIC: the product's static input scale (is_ptr) instead of the row's max. The
        # norm's weight and the static scale never change: read before the PDL wait, so no
        # memory round trip follows the row's statistics. NORMED: f(x) itself is stored too
        # (n_ptr, the model dtype; the head's normed hidden state).
        dt = x_ptr.dtype.element_ty
        row = tl.program_id(0)
        x_ptr += row * stride_x
        q_ptr += row * K
        s_ptr += row
        rk = tl.arange(0, BLOCK)
        ok = rk < K
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
        if PRO == 1:
            g = tl.load(g_ptr + rk, mask=ok, other=0.0).to(tl.float32)
        if STATIC:
            sx = tl.load(is_ptr)
        if PDL:
            tl.extra.cuda.gdc_wait()
        if PRO == 1:
            xv = tl.load(x_ptr + rk, mask=ok, other=0.0).to(tl.float32)
            v = tl.where(ok, _normed(xv, _rms_rstd(xv * xv, K, eps), g, dt), 0.0)
        else:
            v = tl.where(ok, _gemv_input(x_ptr, g_ptr, 0, rk, K, 0.0, PRO, dt, ok), 0.0)
        if not STATIC:
            sx = _row_scale(tl.max(tl.abs(v), axis=0))
        inv = tl.math.div_rn(tl.full([], 1.0, tl.float32), sx)
        tl.store(q_ptr + rk, _quantize_codes(v, inv), mask=ok)
        tl.store(s_ptr, sx)
        if NORMED:
            tl.store(n_ptr + row * K + rk, v.to(dt), mask=ok)

    @triton.jit
    def _scaled(acc, sx, ws, dt: tl.constexpr):
        # sum * (x scale * w scale), rounded to the model dtype like the bf16 GEMV's epilogue
        return (acc * (sx * ws)).to(dt)

    @triton.jit
    def _fma_tile(acc, w, q_ptr, k0, rk, rn, g_ptr, K, PRO: tl.constexpr, dt: tl.constexpr):
        # The codes are loaded in the weight tile's own layout (one 16-byte load per thread,
        # shared by its rows): a [BK] load would cross threads through shared memory. A16: q_ptr
        # is the plain row and f(x) is made here per element: RMSNorm's weight only (its 1/rms
        # is one scalar, applied in the epilogue), the SiLU product in the eager roundings.
        offs = rk[None, :] + 0 * rn[:, None]
        if PRO == 1:
            x = tl.load(q_ptr + k0 + offs).to(tl.float32)
            x = x * tl.load(g_ptr + k0 + offs).to(tl.float32)
        else:  # the codes, or the plain row / its SiLU product by the bf16 GEMV's rule
            x = _gemv_input(q_ptr, g_ptr, k0, offs, K, 0.0, PRO, dt, None)
        return acc + w.to(tl.float32) * x

    @triton.jit
    def _fp8_gemv_epilogue(total, up, sx, ws, ws_up, r, inv, y_ptr, rn, N, dt: tl.constexpr,
                           RESID: tl.constexpr, GLU: tl.constexpr, CODES: tl.constexpr):  # fmt: skip
        # Row sums -> y: scales, GLU, residual, codes (the one-row GEMV's epilogue)
        y = _scaled(total, sx, ws, dt)
        if GLU:  # the eager rounding: gate and up rounded, silu(gate) rounded, the product
            u = _scaled(up, sx, ws_up, dt).to(tl.float32)
            gate = y.to(tl.float32)
            y = ((gate * tl.sigmoid(gate)).to(dt).to(tl.float32) * u).to(dt)
        if RESID:
            y = (y.to(tl.float32) + r.to(tl.float32)).to(dt)
        if CODES:
            y = _quantize_codes(y.to(tl.float32), inv)
        tl.store(y_ptr + rn, y, mask=rn < N)

    @triton.jit
    def _fp8_gemv_kernel(q_ptr, s_ptr, w_ptr, ws_ptr, y_ptr, r_ptr, g_ptr, os_ptr, N, K,
                         stride_wn, eps, RESID: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, EVICT: tl.constexpr, PDL: tl.constexpr,
                         GLU: tl.constexpr, A16: tl.constexpr = False, PRO: tl.constexpr = 0,
                         CODES: tl.constexpr = False, SPLIT: tl.constexpr = 1, part_ptr=None,
                         cnt_ptr=None):  # fmt: skip
        """One program streams BLOCK_N rows (GLU: of gate and of up) against the codes.

        One long function because a Triton kernel is one function. Two weight tiles are
        requested before the PDL wait, then two per step, both loaded before either is used
        (run F4: loading the second after using the first left ptxas issuing it late, 10-19%
        slower). No tile is carried from one step to the next: Triton keeps a carried e4m3
        tile one byte per register (it spilled). q_ptr / s_ptr: the row kernel's codes and
        scale of f(x); A16: q_ptr is the plain bf16 row (no codes, no row kernel: W8A16) and PRO
        its f. GLU: w is [2N, K] (gate rows, then up rows); y = silu(gate) * up, rounded as the
        eager model does. CODES: y is stored as the next product's e4m3 codes with its static
        input scale (os_ptr), the row kernel's rule on the rounded y. No bulk L2 prefetch of the
        rest of the rows before the wait: it lost at every product on the H200 (run 114) and the
        H100 (runs 154-156: whole rows +0.2 to +2.7% a step; 2 KB of wo's, within the spread).
        SPLIT > 1 (codes, not GLU or A16): program (n, s) streams K's s-th slice and stores its row
        sums in part[s]; the last of the row block's SPLIT programs to arrive (a counter) adds
        the parts in slice order (the same sums whoever arrives last), runs the epilogue and
        zeroes the counter for the next launch, as the rows kernel's split does (fp8.py).
        """
        pid = tl.program_id(0)
        if SPLIT > 1:  # this program's slice of K (K % (SPLIT * 2 * BLOCK_K) == 0): said
            # to the compiler, else a slice of 7 loses the 16-byte loads (byte-wide weights)
            K = tl.multiple_of(K // SPLIT, 2 * BLOCK_K)
            k_lo = tl.program_id(1) * K
            w_ptr += k_lo
            q_ptr += k_lo
        rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        w_ptrs = w_ptr + rn[:, None] * stride_wn + rk[None, :]
        u_ptrs = w_ptrs + N * stride_wn
        w_ok = rn[:, None] < N
        wa = tl.load(w_ptrs, mask=w_ok, other=0.0, eviction_policy=EVICT)
        wb = tl.load(w_ptrs + BLOCK_K, mask=w_ok, other=0.0, eviction_policy=EVICT)
        if GLU:
            ua = tl.load(u_ptrs, mask=w_ok, other=0.0, eviction_policy=EVICT)
            ub = tl.load(u_ptrs + BLOCK_K, mask=w_ok, other=0.0, eviction_policy=EVICT)
        # The epilogue's constants now, its residual right after the wait: nothing is read
        # after the stream, so a program's end is not a memory round trip.
        ws = tl.load(ws_ptr + rn, mask=rn < N, other=0.0)
        # placeholders where GLU, CODES or RESID leaves them unread
        ws_up = ws
        inv = ws
        r = ws
        if GLU:
            ws_up = tl.load(ws_ptr + N + rn, mask=rn < N, other=0.0)
        if CODES:
            inv = tl.math.div_rn(tl.full([], 1.0, tl.float32), tl.load(os_ptr))
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        if RESID:
            r = tl.load(r_ptr + rn, mask=rn < N, other=0.0)
        dt = r_ptr.dtype.element_ty  # the model dtype (y_ptr holds codes with CODES)
        sx = tl.full([], 1.0, tl.float32) if A16 else tl.load(s_ptr)  # A16: f(x) per tile
        z = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        acc = _fma_tile(z, wa, q_ptr, 0, rk, rn, g_ptr, K, PRO, dt)
        acc = _fma_tile(acc, wb, q_ptr, BLOCK_K, rk, rn, g_ptr, K, PRO, dt)
        if GLU:
            up = _fma_tile(z, ua, q_ptr, 0, rk, rn, g_ptr, K, PRO, dt)
            up = _fma_tile(up, ub, q_ptr, BLOCK_K, rk, rn, g_ptr, K, PRO, dt)
        for k0 in range(2 * BLOCK_K, K, 2 * BLOCK_K):
            wa = tl.load(w_ptrs + k0, mask=w_ok, other=0.0, eviction_policy=EVICT)
            wb = tl.load(w_ptrs + k0 + BLOCK_K, mask=w_ok, other=0.0, eviction_policy=EVICT)
            if GLU:
                ua = tl.load(u_ptrs + k0, mask=w_ok, other=0.0, eviction_policy=EVICT)
                ub = tl.load(u_ptrs + k0 + BLOCK_K, mask=w_ok, other=0.0, eviction_policy=EVICT)
            acc = _fma_tile(acc, wa, q_ptr, k0, rk, rn, g_ptr, K, PRO, dt)
            acc = _fma_tile(acc, wb, q_ptr, k0 + BLOCK_K, rk, rn, g_ptr, K, PRO, dt)
            if GLU:
                up = _fma_tile(up, ua, q_ptr, k0, rk, rn, g_ptr, K, PRO, dt)
                up = _fma_tile(up, ub, q_ptr, k0 + BLOCK_K, rk, rn, g_ptr, K, PRO, dt)
        if A16 and PRO == 1:  # every program recomputes the row's 1/rms (K values, from L2)
            ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                xv = tl.load(q_ptr + k0 + rk).to(tl.float32)
                ss += xv * xv
            sx = _rms_rstd(ss, K, eps)
        total = tl.sum(acc, axis=1)
        up_total = tl.sum(up, axis=1) if GLU else total
        if SPLIT == 1:
            _fp8_gemv_epilogue(total, up_total, sx, ws, ws_up, r, inv, y_ptr, rn, N, dt, RESID,
                               GLU, CODES)  # fmt: skip
        else:
            tl.store(part_ptr + tl.program_id(1) * N + rn, total, mask=rn < N)
            tl.debug_barrier()  # every thread's sums are written before the counter moves
            if tl.atomic_add(cnt_ptr + pid, 1, sem="acq_rel") == SPLIT - 1:
                total = tl.zeros((BLOCK_N,), dtype=tl.float32)
                for s in tl.static_range(SPLIT):
                    total += tl.load(part_ptr + s * N + rn, mask=rn < N, other=0.0,
                                     cache_modifier=".cg")  # fmt: skip
                tl.store(cnt_ptr + pid, 0)
                _fp8_gemv_epilogue(total, total, sx, ws, ws, r, inv, y_ptr, rn, N, dt, RESID,
                                   False, CODES)  # fmt: skip
