"""Launch sweep of the FP8 one-row product (``cuda.fp8_gemv``) on the 8B shape's four products.

Each product (qkv, wo, w13, w2; the head stays bf16) runs over distinct random e4m3 matrices
(one per layer, cold in L2) inside one CUDA graph, with the prologue / epilogue the decode step
uses there; a timed product is the row kernel plus the GEMV, as in a step of the per-token
``fp8`` run. The ``fp8-static-head`` run has no row kernel before wo and w2 (their codes come
from the attention and w13's GLU epilogue) and reads w13's launch from ``GLU_CONFIGS``, which
this sweep does not fill: time its launch shapes in its own graph (``fp8_step_probe.py
--quantizations fp8-static-head --variants``; GPU_NOTES.md, run 167's correction). First the row
kernel alone per warp count, then the GEMV's tiles (``split``: also with K in 2, 4 or 7
slices, ``Fp8GemvConfig.split``, for the products that are not w13). Every
candidate is checked against the plain-torch FP8 rule (``fp8_format.reference_linear``); one
off by more than 1e-2 cannot win; the winner is timed a second time (the spread). Triton compiles
the candidates first in parallel worker processes (the JIT's file cache then serves the timed
process). Winners go into ``fp8_gemv.FP8_GEMV_CONFIGS`` and ``fp8_gemv.ROW_WARPS``. Used by ``fp8_bench.py --sweep``.
"""

from __future__ import annotations

import json
import multiprocessing
import time

import torch
from gemv_sweep import graph_us, uses
from gpu_common import FP8_SHAPE

from mathagent.serving.engine import fp8_format
from mathagent.serving.engine.cuda import fp8_gemv
from mathagent.serving.engine.random_model import RANDOM_SHAPES

# [block_n, block_k, warps]: run F4 call 1's tiles (two 16-byte loads per thread and tile)
TILES = ([16, 512, 8], [32, 512, 8], [16, 1024, 8], [8, 1024, 4], [32, 256, 8], [8, 512, 4])
# K slices per row block (fp8_bench.py --sweep-split): the tiles above and two narrower
SPLITS = (2, 4, 7)
SPLIT_TILES = (*TILES, [4, 512, 4], [16, 256, 8])
ROW_WARPS = (4, 8, 16, 32)


def candidates(n: int, k: int, split: bool = False) -> list[list[int]]:
    """[block_n, block_k, warps(, split)] launch shapes that fit ``k`` (two tiles per step),
    first the one this card runs now (a card's own table may hold one the tiles lack: the
    H100's wo 4 x 512 x 4; without it, run 168 installed a slower wo there)."""
    now = fp8_gemv.fp8_gemv_config(n, k)
    out = [[now.block_n, now.block_k, now.num_warps] + ([now.split] if now.split > 1 else [])]
    out += [list(t) for t in TILES if k % (2 * t[1]) == 0]
    if split:
        out += [[*t, sp] for t in SPLIT_TILES for sp in SPLITS if k % (2 * t[1] * sp) == 0]
    return [c for i, c in enumerate(out) if c not in out[:i]]


class Fp8Product:
    """Distinct e4m3 weights of one use (one per layer) and its inputs."""

    def __init__(self, n: int, k: int, pro: int, resid: bool, copies: int) -> None:
        self.n, self.k, self.pro, self.resid = n, k, pro, resid
        self.weights = []
        for _ in range(copies):
            codes, scale = fp8_format.quantize_rows(
                torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            )
            self.weights.append((codes, scale.squeeze(-1).contiguous()))
        self.x = torch.randn(1, 2 * k if pro == 2 else k, device="cuda", dtype=torch.bfloat16)
        self.g = torch.randn(k, device="cuda", dtype=torch.bfloat16)
        self.r = torch.randn(1, n, device="cuda", dtype=torch.bfloat16)

    def kwargs(self) -> dict:
        kw = {1: dict(norm=self.g, eps=1e-5), 2: dict(silu_mul=True)}.get(self.pro, {})
        return {**kw, "residual": self.r} if self.resid else kw

    def run(self, cfg: list[int], w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return fp8_gemv.gemv(self.x, w, s, config=cfg, **self.kwargs())

    def check(self, cfg: list[int]) -> float:
        """Relative error of one product against the plain-torch FP8 rule."""
        from mathagent.serving.engine.cuda.forward import rms_norm

        x = self.x
        if self.pro == 1:
            x = rms_norm(x, self.g, 1e-5)
        elif self.pro == 2:
            x = torch.nn.functional.silu(x[:, : self.k]) * x[:, self.k :]
        w, s = self.weights[0]
        ref = fp8_format.reference_linear(x, w, s).float() + (self.r.float() if self.resid else 0)
        return float((self.run(cfg, w, s).float() - ref).norm() / ref.norm())

    def rows(self, count: int) -> None:
        """The row kernel alone, ``count`` times (its share of a product's time)."""
        for _ in range(count):
            norm = self.g if self.pro == 1 else None
            fp8_gemv.quantize_row(self.x.view(-1), self.k, norm, 1e-5, self.pro, True)

    def launch(self, cfg: list[int]) -> None:
        for w, s in self.weights:
            self.run(cfg, w, s)


def _compile(job: tuple[int, int, int, bool, list[int]]) -> str | None:
    """Worker: one launch of a candidate on small copies, so Triton compiles it to its cache."""
    n, k, pro, resid, cfg = job
    try:
        Fp8Product(n, k, pro, resid, 1).check(cfg)
        torch.cuda.synchronize()
        return None
    except Exception as exc:
        return repr(exc)[:300]


def products(names: list[str] | None, split: bool) -> dict[str, tuple[int, int, int, bool, bool]]:
    """The swept products (all four, or ``names``): (N, K, prologue, residual, split)."""
    return {name: (*use, split and name != "w13") for name, use in uses(FP8_SHAPE).items()
            if name != "head" and (names is None or name in names)}  # fmt: skip


def precompile(names: list[str] | None, split: bool, workers: int = 12) -> dict:
    jobs = [(n, k, pro, resid, cfg) for (n, k, pro, resid, sp) in products(names, split).values()
            for cfg in candidates(n, k, sp)]  # fmt: skip
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers) as pool:
        errors = pool.map(_compile, jobs, chunksize=1)
    return {
        "jobs": len(jobs),
        "failed": [[j[4], e] for j, e in zip(jobs, errors, strict=True) if e],
    }


def row_sweep(p: Fp8Product, layers: int) -> dict:
    """Time the row kernel alone per warp count; install the fastest for this (K, prologue)."""
    timed = {}
    for warps in ROW_WARPS:
        fp8_gemv.ROW_WARPS[(p.k, p.pro)] = warps
        timed[warps] = graph_us(lambda: p.rows(layers), layers)
    fp8_gemv.ROW_WARPS[(p.k, p.pro)] = best = min(timed, key=timed.get)
    return {"best_warps": best, "us": timed}


def sweep(names: list[str] | None = None, split: bool = False) -> dict:
    """Time every candidate per product (all four, or ``names``; ``split``: K in slices too);
    install the winners; report (us per product, TB/s)."""
    layers = RANDOM_SHAPES[FP8_SHAPE]["num_hidden_layers"]
    t0 = time.perf_counter()
    res: dict = {"precompile": precompile(names, split)}
    res["precompile_s"] = time.perf_counter() - t0
    for name, (n, k, pro, resid, sp) in products(names, split).items():
        p = Fp8Product(n, k, pro, resid, layers)
        rows = row_sweep(p, layers)
        mb = (n * k + 4 * n) / 1e6
        timed, errs = {}, {}
        for cfg in candidates(n, k, sp):
            try:
                errs[tuple(cfg)] = p.check(cfg)
                timed[tuple(cfg)] = graph_us(lambda: p.launch(cfg), layers)  # noqa: B023
            except Exception as exc:  # a shape that does not compile is skipped, and reported
                res.setdefault("failed", []).append([name, cfg, repr(exc)[:300]])
        best = min((c for c in timed if errs[c] < 1e-2), key=timed.get)
        fp8_gemv.FP8_GEMV_CONFIGS[(n, k)] = fp8_gemv.Fp8GemvConfig.of(list(best))
        fp8_gemv.CARD_FP8_GEMV_CONFIGS.get(fp8_gemv.card_key(), {}).pop((n, k), None)
        again = graph_us(lambda: p.launch(list(best)), layers)  # noqa: B023
        res[name] = {"n": n, "k": k, "mb": mb, "best": list(best), "best_us": timed[best],
                     "best_us_again": again, "best_tb_s": mb / timed[best],
                     "rel_err_vs_reference": errs[best], "row_kernel": rows,
                     "all": sorted(([list(c), round(t, 2), round(errs[c], 5)]
                                    for c, t in timed.items()), key=lambda i: i[1])}  # fmt: skip
        print(json.dumps({name: {k: v for k, v in res[name].items() if k != "all"}}), flush=True)
        torch.cuda.empty_cache()
    res["per_layer_us"] = sum(res[u]["best_us"] for u in ("qkv", "wo", "w13", "w2") if u in res)
    return res
