"""Probe: two consecutive one-row FP8 products in one persistent kernel, against the shipped pair.

The H200's FP8 decode step is within 3% of the sum of its products run alone, and each product
streams below what the largest reaches (GPU_NOTES run 167): the cost looks like each product's
first and last microseconds. This probe asks whether removing a boundary pays, on one layer's
wo -> RMSNorm -> w13 (GLU, codes out) of the 8B shape, weights cold in L2 (a distinct copy per
layer, ``--layers`` of them in one CUDA graph):

- ``shipped``: ``fp8_gemv.gemv`` as the engine calls it (wo from codes with the residual; w13
  from the bf16 row with the norm, static scales, GLU, codes out): wo GEMV, row kernel, w13 GEMV,
  launched with PDL.
- ``persistent``: one kernel, ``programs`` resident programs. Each streams wo's row blocks
  (pid, pid + programs, ...), requests its first w13 tiles, arrives at a grid-wide counter and
  waits for all; then makes the norm's codes itself from the whole new residual (8 KB from L2,
  into a private row of scratch) and streams w13's row blocks. The arrival counters return to
  zero at the end (the last program out), so a captured graph replays it.
- ``two_launches``: the same kernel's two phases as two plain launches (no PDL): what the
  counter replaces, with the same loops.

Every variant's new residual and codes are compared with the shipped ones (the same tiles sum in
the same order, so bit-equal is expected where the tiles match). The grid must be resident as a
whole, or the counter never fills: ``programs`` is held to what the compiled kernel's registers
allow, and the wait gives up after ``SPIN_LIMIT`` polls (``timed_out`` in the result).

    PYTHONPATH=.:benchmarks python3 benchmarks/fp8_pair_probe.py --out probe.json
    PYTHONPATH=.:benchmarks python3 benchmarks/fp8_pair_probe.py --check  (CPU: small shapes)
"""

from __future__ import annotations

import argparse
import functools
import json
import sys

import torch

if "--check" in sys.argv:  # before any kernel is defined: the interpreter, as the tests run it
    from tests import triton_interpreter

    triton_interpreter.enable()

from gemv_sweep import graph_us

from mathagent.serving.engine import fp8_format
from mathagent.serving.engine.cuda import fp8_gemv, kernels

triton = kernels.triton
SPIN_LIMIT = 1 << 20  # polls (~1 s): a grid that never fills is reported, not hung
if triton is not None:
    import triton.language as tl

    from mathagent.serving.engine.cuda.fp8 import _quantize_codes
    from mathagent.serving.engine.cuda.fp8_gemv_kernels import _fma_tile, _fp8_gemv_epilogue
    from mathagent.serving.engine.cuda.kernels import _normed, _rms_rstd

    @triton.jit
    def _glu_block(wa, wb, ua, ub, w_ptrs, u_ptrs, q_ptr, rn, rk, N, K, sx, ws_ptr, inv, y_ptr,
                   BK: tl.constexpr, dt: tl.constexpr):  # fmt: skip
        # One GLU row block from its first two tiles (already requested) to its codes
        ok = rn[:, None] < N
        z = tl.zeros(wa.shape, dtype=tl.float32)
        acc = _fma_tile(z, wa, q_ptr, 0, rk, rn, q_ptr, K, 0, dt)
        acc = _fma_tile(acc, wb, q_ptr, BK, rk, rn, q_ptr, K, 0, dt)
        up = _fma_tile(z, ua, q_ptr, 0, rk, rn, q_ptr, K, 0, dt)
        up = _fma_tile(up, ub, q_ptr, BK, rk, rn, q_ptr, K, 0, dt)
        for k0 in range(2 * BK, K, 2 * BK):
            wa = tl.load(w_ptrs + k0, mask=ok, other=0.0, eviction_policy="evict_first")
            wb = tl.load(w_ptrs + k0 + BK, mask=ok, other=0.0, eviction_policy="evict_first")
            ua = tl.load(u_ptrs + k0, mask=ok, other=0.0, eviction_policy="evict_first")
            ub = tl.load(u_ptrs + k0 + BK, mask=ok, other=0.0, eviction_policy="evict_first")
            acc = _fma_tile(acc, wa, q_ptr, k0, rk, rn, q_ptr, K, 0, dt)
            acc = _fma_tile(acc, wb, q_ptr, k0 + BK, rk, rn, q_ptr, K, 0, dt)
            up = _fma_tile(up, ua, q_ptr, k0, rk, rn, q_ptr, K, 0, dt)
            up = _fma_tile(up, ub, q_ptr, k0 + BK, rk, rn, q_ptr, K, 0, dt)
        ws = tl.load(ws_ptr + rn, mask=rn < N, other=0.0)
        ws_up = tl.load(ws_ptr + N + rn, mask=rn < N, other=0.0)
        _fp8_gemv_epilogue(tl.sum(acc, axis=1), tl.sum(up, axis=1), sx, ws, ws_up, ws, inv,
                           y_ptr, rn, N, dt, False, True, True)  # fmt: skip

    @triton.jit
    def _pair_kernel(q_ptr, s_ptr, wo_ptr, wos_ptr, r_ptr, h_ptr, g_ptr, s13_ptr, w13_ptr,
                     w13s_ptr, s2_ptr, y_ptr, scratch_ptr, cnt_ptr, N1, N2, eps, K1: tl.constexpr,
                     K2: tl.constexpr,
                     PROGRAMS: tl.constexpr, PHASES: tl.constexpr, BN1: tl.constexpr,
                     BK1: tl.constexpr, BN2: tl.constexpr, BK2: tl.constexpr,
                     SPIN: tl.constexpr):  # fmt: skip
        # PHASES 3: both, with the grid-wide wait; 1: wo alone; 2: the norm and w13 alone
        pid = tl.program_id(0)
        dt = r_ptr.dtype.element_ty
        rk1 = tl.arange(0, BK1)
        if PHASES & 1:  # h = wo(codes) + r, row blocks pid, pid + PROGRAMS, ...
            sx = tl.load(s_ptr)
            for t in range(pid, tl.cdiv(N1, BN1), PROGRAMS):
                rn = t * BN1 + tl.arange(0, BN1)
                ok = rn[:, None] < N1
                w_ptrs = wo_ptr + rn[:, None] * K1 + rk1[None, :]
                acc = tl.zeros((BN1, BK1), dtype=tl.float32)
                for k0 in range(0, K1, 2 * BK1):
                    wa = tl.load(w_ptrs + k0, mask=ok, other=0.0, eviction_policy="evict_first")
                    wb = tl.load(w_ptrs + k0 + BK1, mask=ok, other=0.0,
                                 eviction_policy="evict_first")  # fmt: skip
                    acc = _fma_tile(acc, wa, q_ptr, k0, rk1, rn, q_ptr, K1, 0, dt)
                    acc = _fma_tile(acc, wb, q_ptr, k0 + BK1, rk1, rn, q_ptr, K1, 0, dt)
                ws = tl.load(wos_ptr + rn, mask=rn < N1, other=0.0)
                r = tl.load(r_ptr + rn, mask=rn < N1, other=0.0)
                total = tl.sum(acc, axis=1)
                _fp8_gemv_epilogue(total, total, sx, ws, ws, r, ws, h_ptr, rn, N1, dt, True,
                                   False, False)  # fmt: skip
        rk2 = tl.arange(0, BK2)
        rn = pid * BN2 + tl.arange(0, BN2)  # this program's first w13 row block
        ok = rn[:, None] < N2
        w_ptrs = w13_ptr + rn[:, None] * K2 + rk2[None, :]
        u_ptrs = w_ptrs + N2 * K2
        if PHASES & 2:  # its first tiles now: they stream while the others finish wo
            wa = tl.load(w_ptrs, mask=ok, other=0.0, eviction_policy="evict_first")
            wb = tl.load(w_ptrs + BK2, mask=ok, other=0.0, eviction_policy="evict_first")
            ua = tl.load(u_ptrs, mask=ok, other=0.0, eviction_policy="evict_first")
            ub = tl.load(u_ptrs + BK2, mask=ok, other=0.0, eviction_policy="evict_first")
        if PHASES == 3:  # every h written before any program reads it
            tl.debug_barrier()
            seen = tl.atomic_add(cnt_ptr, 1, sem="acq_rel") + 1
            spins = 0
            while (seen < PROGRAMS) & (spins < SPIN):
                seen = tl.atomic_add(cnt_ptr, 0, sem="acquire")
                spins += 1
            if spins >= SPIN:
                tl.atomic_add(cnt_ptr + 2, 1)  # timed out: reported, not hidden
            tl.debug_barrier()
        if PHASES & 2:  # codes of RMSNorm(h) * g with w13's static scale, into own scratch
            kk = tl.arange(0, K2)
            hv = tl.load(h_ptr + kk, cache_modifier=".cg").to(tl.float32)
            v = _normed(hv, _rms_rstd(hv * hv, K2, eps), tl.load(g_ptr + kk).to(tl.float32), dt)
            sx13 = tl.load(s13_ptr)
            inv13 = tl.math.div_rn(tl.full([], 1.0, tl.float32), sx13)
            q13 = scratch_ptr + pid * K2
            tl.store(q13 + kk, _quantize_codes(v, inv13))
            tl.debug_barrier()
            inv2 = tl.math.div_rn(tl.full([], 1.0, tl.float32), tl.load(s2_ptr))
            _glu_block(wa, wb, ua, ub, w_ptrs, u_ptrs, q13, rn, rk2, N2, K2, sx13, w13s_ptr,
                       inv2, y_ptr, BK2, dt)  # fmt: skip
            for t in range(pid + PROGRAMS, tl.cdiv(N2, BN2), PROGRAMS):
                rn = t * BN2 + tl.arange(0, BN2)
                ok = rn[:, None] < N2
                w_ptrs = w13_ptr + rn[:, None] * K2 + rk2[None, :]
                u_ptrs = w_ptrs + N2 * K2
                wa = tl.load(w_ptrs, mask=ok, other=0.0, eviction_policy="evict_first")
                wb = tl.load(w_ptrs + BK2, mask=ok, other=0.0, eviction_policy="evict_first")
                ua = tl.load(u_ptrs, mask=ok, other=0.0, eviction_policy="evict_first")
                ub = tl.load(u_ptrs + BK2, mask=ok, other=0.0, eviction_policy="evict_first")
                _glu_block(wa, wb, ua, ub, w_ptrs, u_ptrs, q13, rn, rk2, N2, K2, sx13,
                           w13s_ptr, inv2, y_ptr, BK2, dt)  # fmt: skip
        if PHASES == 3:  # the last program out zeroes the counters for the next launch
            tl.debug_barrier()
            if tl.atomic_add(cnt_ptr + 1, 1, sem="acq_rel") == PROGRAMS - 1:
                tl.store(cnt_ptr, 0)
                tl.store(cnt_ptr + 1, 0)


class Layer:
    """One layer's wo and w13 (e4m3, per-row scales), static input scales and inputs."""

    def __init__(self, h: int, inter: int, device: str, gen: torch.Generator) -> None:
        def rand(*shape):
            return torch.randn(*shape, generator=gen, device="cpu").to(device, torch.bfloat16)

        self.wo, s = fp8_format.quantize_rows(rand(h, h))
        self.wo_s = s.squeeze(-1).contiguous()
        self.w13, s = fp8_format.quantize_rows(rand(2 * inter, h))
        self.w13_s = s.squeeze(-1).contiguous()


class Pair:
    """The shared inputs of every layer and the two ways of running wo -> norm -> w13."""

    def __init__(self, h: int, inter: int, layers: int, device: str) -> None:
        gen = torch.Generator().manual_seed(0)
        self.h, self.inter, self.device = h, inter, device
        self.layers = [Layer(h, inter, device, gen) for _ in range(layers)]
        x = torch.randn(h, generator=gen).to(device, torch.bfloat16)
        self.s_in = torch.tensor([0.02], device=device)
        self.q_in = fp8_format.quantize_rows(x.view(1, -1), self.s_in)[0].view(h)
        self.r = torch.randn(h, generator=gen).to(device, torch.bfloat16)
        self.g = (1 + 0.1 * torch.randn(h, generator=gen)).to(device, torch.bfloat16)
        self.s13 = torch.tensor([0.01], device=device)
        self.s2 = torch.tensor([0.05], device=device)
        self.cnt = torch.zeros(3, dtype=torch.int32, device=device)

    def shipped(self, layer: Layer) -> tuple[torch.Tensor, torch.Tensor]:
        h = fp8_gemv.gemv(self.q_in, layer.wo, layer.wo_s, residual=self.r, input_scale=self.s_in)
        y = fp8_gemv.gemv(h, layer.w13, layer.w13_s, norm=self.g, eps=1e-5, glu=True,
                          input_scale=self.s13, out_scale=self.s2)  # fmt: skip
        return h, y

    def persistent(self, layer: Layer, programs: int, phases: tuple[int, ...], tiles: list[int],
                   warps: int) -> tuple[torch.Tensor, torch.Tensor, object]:  # fmt: skip
        h = torch.empty(self.h, dtype=torch.bfloat16, device=self.device)
        y = torch.empty(self.inter, dtype=torch.float8_e4m3fn, device=self.device)
        scratch = torch.empty(programs, self.h, dtype=torch.float8_e4m3fn, device=self.device)
        bn1, bk1, bn2, bk2 = tiles
        for ph in phases:
            kernel = _pair_kernel[(programs,)](
                self.q_in, self.s_in, layer.wo, layer.wo_s, self.r, h, self.g, self.s13,
                layer.w13, layer.w13_s, self.s2, y, scratch, self.cnt, self.h, self.inter, 1e-5,
                K1=self.h, K2=self.h, PROGRAMS=programs, PHASES=ph, BN1=bn1, BK1=bk1,
                BN2=bn2, BK2=bk2, SPIN=SPIN_LIMIT, num_warps=warps,
            )  # fmt: skip
        return h, y, kernel  # the last phase's compiled kernel (registers, shared memory)


def _diff(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> dict:
    return {"h_max_abs": float((a[0].float() - b[0].float()).abs().max()),
            "codes_unequal": int((a[1].float() != b[1].float()).sum())}  # fmt: skip


def check() -> dict:
    """Small shapes, one program (the interpreter runs programs one after another), the
    shipped launch's tiles (the heuristic's for shapes outside the tables): bit-equal expected."""
    pair = Pair(256, 512, 1, "cuda" if torch.cuda.is_available() else "cpu")
    layer = pair.layers[0]
    ref = pair.shipped(layer)
    out = {}
    for name, phases in (("persistent", (3,)), ("two_launches", (1, 2))):
        got = pair.persistent(layer, 1, phases, [4, 128, 4, 128], 4)[:2]
        out[name] = {**_diff(got, ref), "counters": pair.cnt.tolist(),
                     "codes_nonzero": int((got[1].float() != 0).sum())}  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="small shapes, one program (CPU too)")
    p.add_argument("--layers", type=int, default=8, help="distinct weight copies (cold L2)")
    # runs 170-171 (H100): the shipped pair 46.7-46.8 us, these 51.1-56.7 (the H100's own
    # tiles, 4,512,2,2048,4, 53.1): the grid-stride loops lose (GPU_NOTES.md)
    p.add_argument("--tiles", nargs="+", default=["16,1024,8,512,8", "4,512,2,2048,4",
                   "16,1024,8,512,4", "8,512,8,512,8", "16,1024,4,1024,4"],
                   help="BN1,BK1,BN2,BK2,warps (wo tile, w13 GLU tile, warps)")  # fmt: skip
    p.add_argument("--out", default="fp8_pair_probe.json")
    args = p.parse_args()
    if args.check:
        print(json.dumps(check(), indent=1))
        return
    props = torch.cuda.get_device_properties(0)
    pair = Pair(4096, 14336, args.layers, "cuda")
    ref = [pair.shipped(layer) for layer in pair.layers]
    result: dict = {"device": props.name, "sms": props.multi_processor_count,
                    "layers": args.layers, "variants": {}}  # fmt: skip
    result["shipped_us"] = graph_us(lambda: [pair.shipped(x) for x in pair.layers], args.layers)
    mb = (pair.layers[0].wo.numel() + pair.layers[0].w13.numel()) / 1e6
    result["weight_mb_a_pair"] = mb
    for spec in args.tiles:
        bn1, bk1, bn2, bk2, warps = (int(v) for v in spec.split(","))
        tiles, sms = [bn1, bk1, bn2, bk2], props.multi_processor_count
        # one program an SM is always resident; more where registers and shared memory allow
        kernel = pair.persistent(pair.layers[0], sms, (3,), tiles, warps)[2]
        torch.cuda.synchronize()
        regs = -(-kernel.n_regs * 32 // 256) * 256  # a warp's registers, as allocated
        smem = kernel.metadata.shared
        per_sm = min(65536 // (regs * warps), 64 // warps,
                     props.shared_memory_per_multiprocessor // max(1, smem + 1024))  # fmt: skip
        for mult in sorted({1, max(1, per_sm)}):
            programs = sms * mult
            row: dict = {"tiles": tiles, "warps": warps, "programs": programs,
                         "regs": kernel.n_regs, "spills": kernel.n_spills, "shared": smem}  # fmt: skip
            pair.cnt.zero_()
            for name, phases in (("persistent", (3,)), ("two_launches", (1, 2))):
                got = pair.persistent(pair.layers[0], programs, phases, tiles, warps)[:2]
                torch.cuda.synchronize()
                row[name] = _diff(got, ref[0])
            row["timed_out"] = int(pair.cnt[2])
            if not row["timed_out"]:  # a grid that is not resident as a whole is not timed
                for name, phases in (("persistent", (3,)), ("two_launches", (1, 2))):
                    launch = functools.partial(pair.persistent, programs=programs,
                                               phases=phases, tiles=tiles, warps=warps)  # fmt: skip
                    row[name]["us"] = graph_us(lambda f=launch: [f(x) for x in pair.layers],
                                               args.layers)  # fmt: skip
                    row[name]["tb_s"] = mb / row[name]["us"]
                row["timed_out"] = int(pair.cnt[2])
            result["variants"][f"{spec}x{mult}"] = row
            print(json.dumps(row), flush=True)
    result["shipped_tb_s"] = mb / result["shipped_us"]
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "variants"}))


if __name__ == "__main__":
    main()
