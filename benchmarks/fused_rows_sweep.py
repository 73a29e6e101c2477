"""Launch shapes of the fused skinny kernel (1..16 rows, norm / SiLU prologue, residual epilogue)
against the unfused layer it replaces, on one GPU.

A model whose widths the one-row GEMV does not take (the default model: K = 576 and 1536) runs
each layer's four products through cuBLAS or the plain skinny kernel with Inductor's RMSNorm,
SiLU-product and residual-add kernels around them; the fused kernel (``cuda/skinny.py``) folds
those into the products, as the one-row GEMV does for the 8B shapes. For every product of a
layer (qkv with its norm, wo with its residual, w13 with its norm and silu(gate) * up in its
epilogue, w2 with its residual), row count and dtype the sweep times every candidate launch shape over distinct weight
copies cold in L2 in one CUDA graph and picks per row bucket the fastest; then it times a whole
model's layers of products both ways (the unfused form compiled as ``forward.layer_step``
compiles it, attention left out) and prints ``FUSED_CONFIGS`` lines for the buckets where the
fused layers won.

    PYTHONPATH=.:benchmarks python3 benchmarks/fused_rows_sweep.py \
        [--models smollm2-135m:bfloat16 smollm2-135m:float32] [--rows 1 2 4 5 7 9 13 16] > fused.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
from dataclasses import asdict

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))

import skinny_sweep
from gemv_sweep import graph_us, uses

from mathagent.serving.engine.cuda import forward, kernels
from mathagent.serving.engine.cuda import skinny as sk
from mathagent.serving.engine.cuda.skinny import SkinnyConfig
from mathagent.serving.engine.random_model import RANDOM_SHAPES

COLD_BYTES = 192 << 20  # over three times the H200's 60 MB L2
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
ROWS = [1, 2, 4, 5, 7, 9, 13, 16]  # one row (plain decode), chains of 4 / 6, trees of 9 / 13
EPS = 1e-5
LAYER = ("qkv", "wo", "w13", "w2")


SPLITS = (2, 3, 4, 6, 8)


def candidates(k: int, mp_rows: int, dtype: str) -> list[SkinnyConfig]:
    """``skinny_sweep.py``'s candidates (broadcast-FMA tiles at 4 warps, tl.dot tiles), the
    same FMA tiles at 8 warps (the prologue's work per tile is the fused form's own), and from
    4 rows up tiles that split K in slices of whole tiles: a tl.dot tile owns 16-32 columns, so
    a 576-wide product has only 18-36 of them to walk K with."""
    pdl = kernels.pdl_supported()
    more = [
        SkinnyConfig(bn, bk, 8, False, pdl=pdl)
        for bn in (2, 4, 8, 16)
        for bk in (64, 128, 256, 512)
        if (-(-k // bk) <= sk.MAX_UNROLL or k % bk == 0)
        and 8 <= mp_rows * bn * bk // 256 <= 64
        and bk <= k
    ]
    if mp_rows >= 4:
        tiles = [(bn, bk, True) for bn in (16, 32) for bk in (32, 64, 128)]
        tiles += [(bn, bk, False) for bn in (4, 8) for bk in (64, 128)
                  if 8 <= mp_rows * bn * bk // 128 <= 64]  # fmt: skip
        if dtype == "float32":  # IEEE tl.dot past BLOCK_K 64 spills (skinny_sweep.candidates)
            tiles = [t for t in tiles if not (t[2] and t[1] > 64)]
        more += [SkinnyConfig(bn, bk, 4, dot, pdl=pdl, split=s) for bn, bk, dot in tiles
                 for s in SPLITS if k % (s * bk) == 0]  # fmt: skip
    return [*skinny_sweep.candidates(k, mp_rows, dtype), *more]


def fused_args(name: str, rows: int, n: int, k: int, dtype: torch.dtype) -> tuple:
    """The product's input and its fused keyword arguments (as ``layer_step`` passes them)."""
    if name in ("w2", "wo"):
        return torch.randn(rows, k, device="cuda", dtype=dtype), dict(
            residual=torch.randn(rows, n, device="cuda", dtype=dtype)
        )
    norm = (torch.rand(k, device="cuda") + 0.5).to(dtype)
    glu = {"glu": True} if name == "w13" else {}  # silu(gate) * up in the epilogue
    return torch.randn(rows, k, device="cuda", dtype=dtype), dict(norm=norm, eps=EPS, **glu)


def reference(x: torch.Tensor, w: torch.Tensor, kw: dict) -> torch.Tensor:
    """The eager model's rounding: f(x) in the model dtype, the product, then the residual."""
    if "norm" in kw:
        x = forward.rms_norm(x, kw["norm"], kw["eps"])
    y = F.linear(x.double(), w.double()).to(x.dtype)
    if kw.get("glu"):
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return y + kw["residual"] if "residual" in kw else y


def launch(x: torch.Tensor, w: torch.Tensor, kw: dict, cfg: SkinnyConfig) -> torch.Tensor:
    n = w.shape[0] // 2 if kw.get("glu") else w.shape[0]
    y = torch.empty(x.shape[0], n, device="cuda", dtype=x.dtype)
    sk.launch(x, w, y, cfg, kw.get("norm"), kw.get("residual"), kw.get("eps", EPS),
              kw.get("silu_mul", False), kw.get("glu", False))  # fmt: skip
    return y


def _compile(task: tuple) -> str:
    """Pool worker: compile (by one launch) one candidate; '' or the error."""
    dtype, name, n, k, rows, cfg = task
    try:
        x, kw = fused_args(name, rows, n, k, DTYPES[dtype])
        launch(x, torch.randn(n, k, device="cuda", dtype=DTYPES[dtype]), kw, SkinnyConfig(**cfg))
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # a candidate that does not compile is left out of the sweep
        return repr(e)[:200]


def padded(rows: int, cfg: SkinnyConfig) -> int:
    return sk.MAX_ROWS if cfg.dot else max(2, sk.bucket(rows) or 2)


def sweep_product(name, n, k, dtype, rows_list, failed) -> dict:
    """Per row count: every compiled candidate's us (cold weights) and its worst error."""
    dt = DTYPES[dtype]
    copies = max(1, min(64, -(-COLD_BYTES // (n * k * dt.itemsize))))
    weights = [torch.randn(n, k, device="cuda", dtype=dt) * k**-0.5 for _ in range(copies)]
    out = {}
    for rows in rows_list:
        x, kw = fused_args(name, rows, n, k, dt)
        ref = reference(x, weights[0], kw).double()
        timed, worst = {}, 0.0
        for cfg in candidates(k, max(2, sk.bucket(rows) or 2), dtype):
            if (dtype, name, padded(rows, cfg), cfg) in failed:
                continue
            timed[json.dumps(asdict(cfg))] = graph_us(
                lambda cfg=cfg, x=x, kw=kw: [launch(x, w, kw, cfg) for w in weights], copies, reps=5
            )
            err = (launch(x, weights[0], kw, cfg).double() - ref).abs().max() / ref.abs().max()
            worst = max(worst, float(err))
        out[rows] = {"timed": timed, "worst_rel_err": worst}
    return out


def pick(row_out: dict) -> dict:
    """Per fused row bucket, the launch shape with the least time summed over its rows."""
    table = {}
    for b in sorted({sk.fused_bucket(r) for r in row_out}):
        rows = [r for r in row_out if sk.fused_bucket(r) == b]
        common = set.intersection(*(set(row_out[r]["timed"]) for r in rows))
        totals = {c: sum(row_out[r]["timed"][c] for r in rows) for c in common}
        best = min(totals, key=totals.get)
        table[b] = {"cfg": json.loads(best), "us": totals[best] / len(rows)}
    return table


def layers_us(model: str, dtype: str, rows: int, table: dict) -> dict:
    """A model's layers of products (attention left out), us per layer: unfused as
    ``layer_step`` runs it (compiled; cuBLAS or plain skinny per the engine's dispatch) and
    fused at the picked launch shapes."""
    dt, n_layers = DTYPES[dtype], RANDOM_SHAPES[model]["num_hidden_layers"]
    shapes = {name: uses(model)[name][:2] for name in LAYER}
    ws = [{nm: torch.randn(*shapes[nm], device="cuda", dtype=dt) * 0.05 for nm in LAYER}
          for _ in range(n_layers)]  # fmt: skip
    norms = [(torch.rand(shapes["qkv"][1], device="cuda") + 0.5).to(dt) for _ in range(2)]
    skinny_set = frozenset((*shapes[nm], b) for nm in LAYER for b in sk.skinny_buckets(ws[0][nm]))
    h = torch.randn(rows, shapes["qkv"][1], device="cuda", dtype=dt)
    width, inter = shapes["wo"][1], shapes["w2"][1]  # wo reads q's columns in attention's place

    def unfused(h, w):
        qkv = forward.linear(
            forward.rms_norm(h, norms[0], EPS), w["qkv"], frozenset(), None, skinny_set
        )
        h = h + forward.linear(qkv[:, :width], w["wo"], frozenset(), skinny=skinny_set)
        gate, up = forward.linear(forward.rms_norm(h, norms[1], EPS), w["w13"], frozenset(),
                                  skinny=skinny_set).split(inter, dim=-1)  # fmt: skip
        return h + forward.linear(F.silu(gate) * up, w["w2"], frozenset(), skinny=skinny_set)

    b = sk.fused_bucket(rows)
    cfgs = {nm: SkinnyConfig(**table[nm][b]["cfg"]) for nm in LAYER}

    def fused(h, w):
        qkv = launch(h, w["qkv"], dict(norm=norms[0], eps=EPS), cfgs["qkv"])
        h = launch(qkv[:, :width], w["wo"], dict(residual=h), cfgs["wo"])
        act = launch(h, w["w13"], dict(norm=norms[1], eps=EPS, glu=True), cfgs["w13"])
        return launch(act, w["w2"], dict(residual=h), cfgs["w2"])

    step = torch.compile(unfused, fullgraph=True, dynamic=False)
    res = {}
    for label, fn in (("unfused", step), ("fused", fused)):

        def run(fn=fn) -> None:
            x = h
            for w in ws:
                x = fn(x, w)

        res[f"{label}_us_per_layer"] = graph_us(run, n_layers, reps=7)
    res["fused_over_unfused"] = res["unfused_us_per_layer"] / res["fused_us_per_layer"]
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=["smollm2-135m:bfloat16", "smollm2-135m:float32"])  # fmt: skip
    parser.add_argument("--rows", nargs="+", type=int, default=ROWS)
    parser.add_argument("--layer-rows", nargs="+", type=int, default=[1, 2, 4, 7, 13],
                        help="rows at which whole layers are timed (a bucket is listed only where "
                             "these rows are timed and the fused layers won at every one)")  # fmt: skip
    parser.add_argument("--table-out", default=None, help="write the picked table (JSON) here")
    args = parser.parse_args()
    tasks = {}
    for spec in args.models:
        model, dtype = spec.split(":")
        for name in LAYER:
            n, k = uses(model)[name][:2]
            for rows in args.rows:
                for cfg in candidates(k, max(2, sk.bucket(rows) or 2), dtype):
                    key = (dtype, name, padded(rows, cfg), cfg)
                    tasks.setdefault(key, (dtype, name, n, k, rows, asdict(cfg)))
    with mp.get_context("spawn").Pool(min(12, os.cpu_count() or 2)) as pool:
        errors = pool.map(_compile, list(tasks.values()), chunksize=1)
    failed = {key for key, err in zip(tasks, errors, strict=True) if err}
    out: dict = {"device": torch.cuda.get_device_name(), "compiled": len(tasks),
                 "compile_failures": sorted(set(errors) - {""})[:20], "table": []}  # fmt: skip
    entries = []
    for spec in args.models:
        model, dtype = spec.split(":")
        res: dict = {}
        for name in LAYER:
            n, k = uses(model)[name][:2]
            row_out = sweep_product(name, n, k, dtype, args.rows, failed)
            res[name] = {"n": n, "k": k, "rows": row_out, "table": pick(row_out)}
            brief = {r: min(d["timed"].values()) for r, d in row_out.items() if d["timed"]}
            print(json.dumps({spec: {name: brief}}), file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
        tables = {name: res[name]["table"] for name in LAYER}
        res["layers"] = {}
        for rows in args.layer_rows:
            res["layers"][rows] = layers_us(model, dtype, rows, tables)
            print(json.dumps({spec: {"layers": {rows: res["layers"][rows]}}}), file=sys.stderr,
                  flush=True)  # fmt: skip
        size = DTYPES[dtype].itemsize
        for b in sorted({sk.fused_bucket(r) for r in args.layer_rows}):
            wins = [res["layers"][r]["fused_over_unfused"] for r in args.layer_rows
                    if sk.fused_bucket(r) == b]  # fmt: skip
            if min(wins) <= 1.0:
                continue
            for name in LAYER:
                c = SkinnyConfig(**tables[name][b]["cfg"])
                n, k = res[name]["n"], res[name]["k"]
                glu = name == "w13"  # the sweep times w13 in the GLU form
                entries.append(
                    [n, k, size, b, c.block_n, c.block_k, c.num_warps, c.dot, glu, c.split]
                )
                out["table"].append(
                    f"({n}, {k}, {size}, {b}): SkinnyConfig({c.block_n}, {c.block_k}, "
                    f"{c.num_warps}, {c.dot}{', glu=True' if glu else ''}"
                    f"{f', split={c.split}' if c.split > 1 else ''}),  "
                    f"# {name}: layers {min(wins):.2f}x unfused"
                )
        out[spec] = res
    if args.table_out:
        with open(args.table_out, "w") as f:
            json.dump(entries, f)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
