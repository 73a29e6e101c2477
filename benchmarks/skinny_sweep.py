"""Launch-shape sweep of the Triton skinny product (2..16 rows) against cuBLAS, per weight shape.

Each product of a verify step is launched over distinct random matrices (enough that each one is
cold in L2, as a step reads it) inside one CUDA graph; the time per product is what a step pays.
For every weight shape, row count and dtype the sweep times cuBLAS (``F.linear``) and every
candidate launch shape (broadcast FMAs or ``tl.dot``, column and K tiles, warps), then picks per
row bucket the candidate with the least time summed over the bucket's row counts (the table of
``cuda/skinny.py``). ``chain`` times one verify step's products in order at ``--chain-rows``
(qkv, wo, w13, w2 per layer, then the head) on cuBLAS and on the picked shapes. Candidates are
compiled first in a process pool (Triton caches them on disk), so the sweep is bound by timing.

    PYTHONPATH=. python3 benchmarks/skinny_sweep.py [--models smollm2-135m:float32 ...]
        [--rows 2 3 4 6 8 12 16] [--table-only] > skinny.json

``MODEL:fp8`` sweeps the FP8 model's multi-row kernel (``cuda/fp8.py`` ``rows_linear``: e4m3
codes times e4m3 weights on the tensor cores, both scaled; the head stays bf16 and is left out)
against ``torch._scaled_mm`` (both without the row-quantise kernel, which each pays alike).
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import os
import sys
from dataclasses import asdict

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))

from gemv_sweep import graph_us, uses

from mathagent.serving.engine.cuda import fp8, kernels
from mathagent.serving.engine.cuda import skinny as sk
from mathagent.serving.engine.cuda.fp8 import RowsConfig
from mathagent.serving.engine.cuda.skinny import SkinnyConfig
from mathagent.serving.engine.random_model import RANDOM_SHAPES

COLD_BYTES = 192 << 20  # over three times the H200's 60 MB L2
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "fp8": torch.float8_e4m3fn}
FP8 = torch.float8_e4m3fn
ROWS = [2, 3, 4, 6, 8, 12, 16]  # the default model's; the 8B shapes' (BIG_ROWS) fewer, larger
BIG_ROWS = [2, 6, 16]


def candidates(k: int, mp_rows: int, dtype: str) -> list[SkinnyConfig]:
    """Broadcast-FMA tiles of 8 to 64 float32 partial sums per thread, and tl.dot tiles; 4 warps
    only, to bound the compile count. Float32 tl.dot (IEEE, on FMA units) keeps whole operand
    tiles in registers: past BLOCK_K 64 ptxas spills (24-59 KB compiling for sm_90a) and takes
    10-60 s per kernel, so float32 tries only 64; bfloat16 stops where registers reach 255."""
    pdl = kernels.pdl_supported()
    if dtype == "fp8":  # fp8.rows_linear: tensor-core tiles, rows padded to 16
        return [RowsConfig(bn, bk, w, st) for bn in (64, 128) for bk in (64, 128, 256)
                for w in (4, 8) for st in (2, 3, 4, 5) if k % bk == 0]  # fmt: skip
    out = []
    for bn in (2, 4, 8, 16):
        for bk in (64, 128, 256, 512):
            fits = -(-k // bk) <= sk.MAX_UNROLL or k % bk == 0
            if fits and 8 <= mp_rows * bn * bk // 128 <= 64 and bk <= k:
                out.append(SkinnyConfig(bn, bk, 4, False, pdl=pdl))
    dots = (
        ((16, 64), (32, 64)) if dtype == "float32" else ((16, 64), (16, 128), (32, 64), (32, 128))
    )
    for bn, bk in dots:
        if -(-k // bk) <= sk.MAX_UNROLL or k % bk == 0:
            out.append(SkinnyConfig(bn, bk, 4, True, pdl=pdl))
    return out


def _compile(task: tuple) -> str:
    """Pool worker: compile (by one launch) one candidate; '' or the error."""
    dtype, n, k, rows, cfg = task
    try:
        x, w = rand(rows, k, DTYPES[dtype]), rand(n, k, DTYPES[dtype])
        Product.launch(x, w, config_class(dtype)(**cfg))
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # a candidate that does not compile is left out of the sweep
        return repr(e)[:200]


def compile_key(dtype: str, n: int, k: int, rows: int, cfg: SkinnyConfig) -> tuple:
    """What Triton compiles one kernel per (rows are not specialised: only their bucket)."""
    if dtype == "fp8":
        return dtype, k, cfg
    return dtype, n % 16 == 0, k, sk.MAX_ROWS if cfg.dot else sk.bucket(rows), cfg


def precompile(tasks: list[tuple]) -> list[str]:
    """Compile every (dtype, n, k, rows, cfg) in a pool; the error of each ('' if none)."""
    with mp.get_context("spawn").Pool(min(12, os.cpu_count() or 2)) as pool:
        return pool.map(_compile, tasks, chunksize=1)


def rand(rows: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """Random values of ``dtype`` (e4m3 codes from normal samples)."""
    return torch.randn(rows, cols, device="cuda").to(dtype)


@functools.cache
def _ones(*shape: int) -> torch.Tensor:
    # unit scales, made once per shape in the untimed warm-up run (not inside a timed graph)
    return torch.ones(*shape, device="cuda")


class Product:
    """Distinct cold copies of one weight shape and an input of each row count."""

    def __init__(self, n: int, k: int, dtype: torch.dtype, copies: int | None = None) -> None:
        copies = copies or max(1, min(64, -(-COLD_BYTES // (n * k * dtype.itemsize))))
        self.weights = [rand(n, k, dtype) for _ in range(copies)]
        self.n, self.k, self.dtype = n, k, dtype

    @staticmethod
    def launch(x: torch.Tensor, w: torch.Tensor, cfg: SkinnyConfig | None) -> torch.Tensor:
        """One product: the kernel at ``cfg``, else the path it replaces (cuBLAS / _scaled_mm)."""
        m, n = x.shape[0], w.shape[0]
        if w.dtype != FP8:
            if cfg is None:
                return F.linear(x, w)
            y = torch.empty(m, n, device="cuda", dtype=x.dtype)
            sk.launch(x, w, y, cfg)
            return y
        xs, ws = _ones(m, 1), _ones(n)
        if cfg is None:
            return torch._scaled_mm(x, w.t(), scale_a=xs, scale_b=ws.view(1, -1),
                                    out_dtype=torch.bfloat16)  # fmt: skip
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        fp8.rows_launch(x, xs.view(-1), w, ws, y, cfg)
        return y

    def run(self, x: torch.Tensor, cfg: SkinnyConfig | None, weights=None) -> None:
        for w in self.weights if weights is None else weights:
            self.launch(x, w, cfg)

    def us(self, x: torch.Tensor, cfg: SkinnyConfig | None) -> float:
        return graph_us(lambda: self.run(x, cfg), len(self.weights), reps=5)

    def rel_err(self, x: torch.Tensor, cfg: SkinnyConfig, ref: torch.Tensor) -> float:
        """Max error against ``ref`` (float64), relative to the output's largest value."""
        y = self.launch(x, self.weights[0], cfg)
        return float((y.double() - ref).abs().max() / ref.abs().max())


def config_class(dtype: str) -> type:
    """The launch-shape class of ``dtype``'s multi-row kernel."""
    return RowsConfig if dtype == "fp8" else SkinnyConfig


def products(model: str, dtype: str) -> dict:
    """The step's products of ``model`` (the FP8 model's head stays bf16: not an FP8 product)."""
    return {n: u for n, u in uses(model).items() if dtype != "fp8" or n != "head"}


def plan(model: str, dtype: str, rows_list: list[int], table_only: bool) -> dict:
    """{(product, rows): launch shapes to time}; the current skinny_config always among them."""
    plans = {}
    for name, (n, k, _, _) in products(model, dtype).items():
        for rows in rows_list:
            cands = [] if table_only else candidates(k, sk.bucket(rows), dtype)
            if dtype == "fp8":  # the table's shape if any, else the first candidate
                current = fp8.ROWS_CONFIGS.get((n, k)) or candidates(k, 16, dtype)[0]
            else:
                current = sk.skinny_config(n, k, DTYPES[dtype].itemsize, rows)
            plans[name, rows] = [current, *(c for c in cands if c != current)]
    return plans


def sweep_model(model: str, dtype: str, plans: dict, failed: set) -> dict:
    """Per product and row count: cuBLAS us, the best candidate's us; the picked table."""
    dt, out = DTYPES[dtype], {}
    for name, (n, k, _, _) in products(model, dtype).items():
        p, row_out = Product(n, k, dt), {}
        for rows in sorted({r for nm, r in plans if nm == name}):
            x = rand(rows, k, dt)
            timed, worst = {}, 0.0
            ref = F.linear(x.double(), p.weights[0].double())
            for c in plans[name, rows]:
                if compile_key(dtype, n, k, rows, c) not in failed:
                    timed[c] = p.us(x, c)
                    worst = max(worst, p.rel_err(x, c, ref))
            del ref
            best = min(timed, key=timed.get)
            row_out[rows] = {"cublas_us": p.us(x, None), "skinny_us": timed[best],
                             "current_us": timed.get(plans[name, rows][0]),
                             "best": asdict(best), "worst_rel_err": worst,
                             "timed": {json.dumps(asdict(c)): t for c, t in timed.items()}}  # fmt: skip
        out[name] = {"n": n, "k": k, "copies": len(p.weights), "rows": row_out}
        out[name]["table"] = pick(row_out)
        del p
        torch.cuda.empty_cache()
        brief = {r: {k2: v for k2, v in d.items() if k2 != "timed"} for r, d in row_out.items()}
        print(json.dumps({model: {dtype: {name: brief}}}), file=sys.stderr, flush=True)
    return out


def pick(row_out: dict) -> dict:
    """Per row bucket, the launch shape with the least time summed over the bucket's rows."""
    table = {}
    for b in sorted({sk.bucket(r) for r in row_out}):
        totals: dict[str, float] = {}
        rows = [r for r in row_out if sk.bucket(r) == b]
        for cfg in set.intersection(*(set(row_out[r]["timed"]) for r in rows)):
            totals[cfg] = sum(row_out[r]["timed"][cfg] for r in rows)
        best = min(totals, key=totals.get)
        cublas = sum(row_out[r]["cublas_us"] for r in rows)
        table[b] = {"cfg": json.loads(best), "us": totals[best] / len(rows),
                    "cublas_us": cublas / len(rows)}  # fmt: skip
    return table


def chain_us(model: str, dtype: str, rows: int, tables: dict) -> dict:
    """One verify step's products in order (us): on cuBLAS, on the picked launch shapes, and
    on the picked shape only where it beat cuBLAS."""
    dt, layers = DTYPES[dtype], RANDOM_SHAPES[model]["num_hidden_layers"]
    prods = {name: Product(n, k, dt, 1 if name == "head" else layers)
             for name, (n, k, _, _) in products(model, dtype).items()}  # fmt: skip
    x = {name: rand(rows, p.k, dt) for name, p in prods.items()}
    res, b = {}, sk.bucket(rows)
    for label in ("cublas", "skinny", "dispatch"):  # dispatch: skinny only where it won
        cls = config_class(dtype)
        cfgs = {name: None if label == "cublas" else cls(**t[b]["cfg"]) for name, t in tables.items()}  # fmt: skip
        if label == "dispatch":
            cfgs = {n: c if tables[n][b]["us"] < tables[n][b]["cublas_us"] else None for n, c in cfgs.items()}  # fmt: skip

        def step(cfgs=cfgs) -> None:
            for i in range(layers):
                for name in ("qkv", "wo", "w13", "w2"):
                    prods[name].run(x[name], cfgs[name], prods[name].weights[i : i + 1])
            if "head" in prods:
                prods["head"].run(x["head"], cfgs["head"])

        res[label] = graph_us(step, 1, reps=5)
    return res


def table_lines(out: dict) -> list[str]:
    """``SKINNY_CONFIGS`` entries (Python source) where the picked shape beat cuBLAS."""
    lines = []
    for spec, res in out.items():
        if ":" not in spec:
            continue
        size = DTYPES[spec.split(":")[1]].itemsize
        for name in products(*spec.split(":")):
            row = res[name]
            for b, t in row["table"].items():
                if t["us"] < t["cublas_us"] and size == 1:
                    lines.append(f"({row['n']}, {row['k']}): RowsConfig(**{t['cfg']}),  # rows {b}: "
                                 f"{t['us']:.1f} vs {t['cublas_us']:.1f} us")  # fmt: skip
                elif t["us"] < t["cublas_us"]:
                    c = SkinnyConfig(**t["cfg"])
                    lines.append(f"({row['n']}, {row['k']}, {size}, {b}): SkinnyConfig({c.block_n}, "
                                 f"{c.block_k}, {c.num_warps}, {c.dot}),  # {t['us']:.1f} vs {t['cublas_us']:.1f} us")  # fmt: skip
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=["smollm2-135m:float32", "smollm2-135m:bfloat16", "llama-3-8b:bfloat16"])  # fmt: skip
    parser.add_argument("--rows", nargs="+", type=int, default=ROWS)
    parser.add_argument("--big-rows", nargs="+", type=int, default=BIG_ROWS, help="8B rows")
    parser.add_argument("--chain-rows", type=int, default=6)
    parser.add_argument("--table-only", action="store_true", help="time skinny_config only")
    args = parser.parse_args()
    plans = {}
    for spec in args.models:
        model, dtype = spec.split(":")
        rows = args.big_rows if RANDOM_SHAPES[model]["hidden_size"] >= 4096 else args.rows
        plans[spec] = plan(model, dtype, rows, args.table_only)
    tasks = {}
    for spec, spec_plans in plans.items():
        model, dtype = spec.split(":")
        for (name, rows), cs in spec_plans.items():
            n, k = products(model, dtype)[name][:2]
            for c in cs:
                tasks[compile_key(dtype, n, k, rows, c)] = (dtype, n, k, rows, asdict(c))
    errors = precompile(list(tasks.values()))
    failed = {key for key, err in zip(tasks, errors, strict=True) if err}
    out: dict = {"device": torch.cuda.get_device_name(), "compiled": len(tasks),
                 "compile_failures": sorted(set(errors) - {""})}  # fmt: skip
    for spec, spec_plans in plans.items():
        model, dtype = spec.split(":")
        res = sweep_model(model, dtype, spec_plans, failed)
        if any(r == args.chain_rows for _, r in spec_plans):
            tables = {name: res[name]["table"] for name in products(model, dtype)}
            res["chain_us"] = chain_us(model, dtype, args.chain_rows, tables)
        out[spec] = res
        torch.cuda.empty_cache()
    out["table"] = table_lines(out)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
