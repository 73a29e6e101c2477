"""FP8 products of the 8B shape on the tensor-core rows kernel with K split across programs,
against the paths a step takes today (``cuda.fp8_gemv``): the CUDA-core GEMV at one row, the
unsplit rows kernel (``fp8.ROWS_CONFIGS``) at verify widths.

Each product (qkv, wo, w13, w2 with the prologue and residual a step fuses into it; the head
stays bf16) runs over 32 distinct random e4m3 matrices (one per layer, cold in L2) in one CUDA
graph; a timed product is the row kernel plus the product, as in a step. Every candidate is
checked against the plain-torch FP8 rule (``fp8_format.reference_linear``); one off by more
than 1e-2 cannot win. ``install`` puts the winners into ``fp8_gemv.ONE_ROW_CONFIGS`` (one row,
where a split launch beat the GEMV) and ``fp8.ROWS_CONFIGS`` (verify rows), so an engine run in
the same process takes them. Used by ``fp8_bench.py --split-sweep``; a probe of kernels, not a
figure through the engine.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from dataclasses import asdict

import torch
from fp8_gemv_sweep import Fp8Product
from gemv_sweep import graph_us, uses
from gpu_common import FP8_SHAPE

from mathagent.serving.engine.cuda import fp8, fp8_gemv
from mathagent.serving.engine.cuda.fp8 import RowsConfig
from mathagent.serving.engine.random_model import RANDOM_SHAPES

ROWS = (1, 4)  # a decode row; a verify step at acceptance 3 (1 + 3 drafted)
SMS = 132


def candidates(n: int, k: int) -> list[RowsConfig]:
    """Split launch shapes for ``[n, k]``: 1-8 programs per column block, at most ~4 per SM."""
    out = []
    for bn in (64, 128):
        for bk in (128, 256):
            for stages in (3, 5):
                for split in (1, 2, 4, 8):
                    cfg = RowsConfig(bn, bk, 4, stages, split)
                    if cfg.fits(k) and -(-n // bn) * split <= 4 * SMS:
                        out.append(cfg)
    return out


class Product(Fp8Product):
    """``fp8_gemv_sweep``'s product (distinct cold weights, its reference check) over an input
    of ``rows`` rows, run on the split rows kernel or on today's path."""

    def __init__(self, n: int, k: int, pro: int, resid: bool, copies: int, rows: int) -> None:
        super().__init__(n, k, pro, resid, copies)
        self.rows = rows
        self.x = torch.randn(rows, self.x.shape[1], device="cuda", dtype=torch.bfloat16)
        self.r = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)

    def run(self, cfg: RowsConfig | None, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """One product: the split rows kernel at ``cfg``, else what a step runs today."""
        norm = self.g if self.pro == 1 else None
        resid = self.r if self.resid else None
        if cfg is None:
            return fp8_gemv.gemv(self.x, w, s, norm=norm, residual=resid, eps=1e-5,
                                 silu_mul=self.pro == 2)  # fmt: skip
        return fp8_gemv._rows_gemv(self.x, w, s, norm, resid, 1e-5, self.pro == 2, cfg)


def _compile(job: tuple) -> str | None:
    """Worker: one launch of a candidate on a small copy, so Triton compiles it to its cache."""
    n, k, pro, resid, cfg = job
    try:
        Product(n, k, pro, resid, 1, 4).check(RowsConfig(**cfg))
        torch.cuda.synchronize()
        return None
    except Exception as exc:
        return repr(exc)[:300]


def precompile(workers: int = 12) -> dict:
    jobs = {}
    for name, (n, k, pro, resid) in uses(FP8_SHAPE).items():
        if name != "head":
            for cfg in candidates(n, k):  # one compile per (K, launch shape, prologue kind)
                jobs.setdefault((k, pro, resid, cfg), (n, k, pro, resid, asdict(cfg)))
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        errors = pool.map(_compile, list(jobs.values()), chunksize=1)
    return {"jobs": len(jobs), "failed": [[j[4], e] for j, e in zip(jobs.values(), errors, strict=True) if e]}  # fmt: skip


def sweep() -> dict:
    """Per product and row count: today's path and every split candidate (us, error)."""
    layers = RANDOM_SHAPES[FP8_SHAPE]["num_hidden_layers"]
    t0 = time.perf_counter()
    res: dict = {"precompile": precompile()}
    res["precompile_s"] = time.perf_counter() - t0
    for name, (n, k, pro, resid) in uses(FP8_SHAPE).items():
        if name == "head":
            continue
        res[name] = {"n": n, "k": k, "mb": (n * k + 4 * n) / 1e6}
        for rows in ROWS:
            p = Product(n, k, pro, resid, layers, rows)
            timed, errs = {}, {}
            for cfg in [None, *candidates(n, k)]:
                key = "current" if cfg is None else json.dumps(asdict(cfg))
                try:
                    errs[key] = p.check(cfg)
                    timed[key] = graph_us(lambda: p.launch(cfg), layers)  # noqa: B023
                except Exception as exc:  # reported, not fatal
                    res.setdefault("failed", []).append([name, rows, key, repr(exc)[:300]])
            ok = [c for c in timed if c != "current" and errs[c] < 1e-2]
            best = min(ok, key=timed.get)
            again = graph_us(lambda: p.launch(RowsConfig(**json.loads(best))), layers)  # noqa: B023
            res[name][rows] = {
                "current_us": timed.get("current"), "current_err": errs.get("current"),
                "best": json.loads(best), "best_us": timed[best], "best_us_again": again,
                "best_err": errs[best], "best_tb_s": res[name]["mb"] / timed[best],
                "all": sorted(([c, round(t, 2), round(errs[c], 5)] for c, t in timed.items()),
                              key=lambda i: i[1]),
            }  # fmt: skip
            brief = {key: v for key, v in res[name][rows].items() if key != "all"}
            print(json.dumps({name: {rows: brief}}), flush=True)
            torch.cuda.empty_cache()
    return res


def install(res: dict) -> dict:
    """Winners into the dispatch tables where they beat today's path; what was installed."""
    done = {}
    for name in ("qkv", "wo", "w13", "w2"):
        row = res.get(name, {})
        n, k = row.get("n"), row.get("k")
        for rows, table in ((1, fp8_gemv.ONE_ROW_CONFIGS), (4, fp8.ROWS_CONFIGS)):
            r = row.get(rows)
            if r and r["current_us"] and min(r["best_us"], r["best_us_again"]) < r["current_us"]:
                table[(n, k)] = RowsConfig(**r["best"])
                done[f"{name}@{rows}"] = r["best"]
    return done
