"""Per-shape launch sweep of the one-row Triton GEMV, measured as a decode step reads weights.

Each weight shape of a model is launched over distinct random matrices (one per layer) inside
one CUDA graph, so every matrix is cold in L2 and kernels follow each other as in a step; the
time per product gives the streaming rate. For every shape the sweep tries row/column tiles
and warps (with the prologue/epilogue the decode step uses there), then toggles the L2
eviction hint and programmatic dependent launch (PDL) on the winner, and times cuBLAS the
same way. ``chain`` times the whole step's products in order (qkv, wo, w13, w2 per layer,
then the head). Run: ``PYTHONPATH=. python3 benchmarks/gemv_sweep.py`` (JSON on stdout).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))

from mathagent.serving.engine.cuda import kernels as cuda_kernels
from mathagent.serving.engine.cuda.kernels import GemvConfig
from mathagent.serving.engine.random_model import RANDOM_SHAPES as SHAPES


def uses(shape: str) -> dict[str, tuple[int, int, int, bool]]:
    """Each product of a decode step: (N, K, prologue, residual epilogue)."""
    c = SHAPES[shape]
    h, hd = c["hidden_size"], c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    qkv = (c["num_attention_heads"] + 2 * c["num_key_value_heads"]) * hd
    return {"qkv": (qkv, h, 1, False), "wo": (c["num_attention_heads"] * hd, h, 0, True),
            "w13": (2 * c["intermediate_size"], h, 1, False),
            "w2": (h, c["intermediate_size"], 2, True), "head": (c["vocab_size"], h, 0, False)}  # fmt: skip


def candidates(k: int) -> list[GemvConfig]:
    """Tiles whose per-thread share is one to eight 16-byte loads."""
    out = []
    for bn in (1, 2, 4, 8, 16):
        for bk in (512, 1024, 2048):
            for warps in (2, 4, 8):
                if k % bk == 0 and 8 <= bn * bk // (32 * warps) <= 64:
                    out.append(GemvConfig(bn, bk, warps))
    return out


class Product:
    """Distinct weights of one use plus its inputs; launches the kernel over all of them."""

    def __init__(self, n: int, k: int, pro: int, resid: bool, copies: int) -> None:
        self.n, self.k, self.pro, self.resid = n, k, pro, resid
        self.weights = [
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)
        ]
        self.x = torch.randn(2 * k if pro == 2 else k, device="cuda", dtype=torch.bfloat16)
        self.g = torch.randn(k, device="cuda", dtype=torch.bfloat16)
        self.r = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        self.y = torch.empty(n, device="cuda", dtype=torch.bfloat16)

    def launch(self, cfg: GemvConfig | None, weights: list[torch.Tensor] | None = None) -> None:
        for w in self.weights if weights is None else weights:
            if cfg is None:  # cuBLAS reference (prologue left out: it only helps cuBLAS)
                F.linear(self.x[None, : self.k], w)
                continue
            cuda_kernels._gemv_kernel[(triton_cdiv(self.n, cfg.block_n),)](
                self.x, w, self.y, self.g, self.r, self.n, self.k, self.k, 1e-5,
                PRO=self.pro, RESID=self.resid, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                EVICT=cfg.evict, PDL=cfg.pdl, num_warps=cfg.num_warps, launch_pdl=cfg.pdl,
            )  # fmt: skip

    def check(self, cfg: GemvConfig) -> float:
        """Relative error of one product against float32 torch."""
        w, x = self.weights[0].float(), self.x.float()
        if self.pro == 1:
            x = F.rms_norm(x, (self.k,), self.g.float(), 1e-5)
        elif self.pro == 2:
            x = F.silu(x[: self.k]) * x[self.k :]
        ref = w @ x + (self.r.float() if self.resid else 0)
        self.launch(cfg, self.weights[:1])
        return float((self.y.float() - ref).norm() / ref.norm())


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def graph_us(fn, per: int, reps: int = 7) -> float:
    """Median microseconds per product of ``fn`` (``per`` products) replayed as one graph."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / per)
    return sorted(times)[reps // 2]


def pdl_works() -> bool:
    """Whether a PDL launch captures into a CUDA graph and computes the right product."""
    p = Product(4096, 4096, 0, True, 2)
    try:
        cfg = GemvConfig(4, 1024, 4)
        graph_us(lambda: p.launch(cfg), 2, reps=1)
        return p.check(cfg) < 1e-2
    except Exception as e:  # any failure means: launch without PDL
        print(f"PDL unavailable: {e!r}", file=sys.stderr)
        return False


def sweep_shape(shape: str, pdl: bool) -> dict:
    layers = SHAPES[shape]["num_hidden_layers"]
    res: dict = {}
    for name, (n, k, pro, resid) in uses(shape).items():
        p = Product(n, k, pro, resid, 2 if name == "head" else layers)
        mb = n * k * 2 / 1e6
        timed = {}
        for cfg in candidates(k):
            cfg = GemvConfig(cfg.block_n, cfg.block_k, cfg.num_warps, "evict_first", pdl)
            timed[cfg] = graph_us(lambda: p.launch(cfg), len(p.weights))  # noqa: B023
        best = min(timed, key=timed.get)
        toggles = {
            "no_evict": GemvConfig(best.block_n, best.block_k, best.num_warps, "", best.pdl),
            "no_pdl": GemvConfig(best.block_n, best.block_k, best.num_warps, best.evict, False),
        }
        row = {"n": n, "k": k, "mb": mb, "best": best.__dict__, "best_us": timed[best],
               "best_tb_s": mb / timed[best] / 1e6, "rel_err": p.check(best),
               "cublas_us": graph_us(lambda: p.launch(None), len(p.weights)),  # noqa: B023
               "top5": [[c.__dict__, t] for c, t in sorted(timed.items(), key=lambda i: i[1])[:5]]}  # fmt: skip
        for key, cfg in toggles.items():
            row[f"{key}_us"] = graph_us(lambda: p.launch(cfg), len(p.weights))  # noqa: B023
        res[name] = row
        torch.cuda.empty_cache()
        print(
            json.dumps({shape: {name: {k: v for k, v in row.items() if k != "top5"}}}), flush=True
        )
    return res


def chain_us(shape: str, configs: dict[str, GemvConfig | None]) -> float:
    """Microseconds of one step's products in order, per the given configs (None: cuBLAS)."""
    layers = SHAPES[shape]["num_hidden_layers"]
    prods = {name: Product(*u, layers if name != "head" else 1) for name, u in uses(shape).items()}

    def step() -> None:
        for i in range(layers):
            for name in ("qkv", "wo", "w13", "w2"):
                prods[name].launch(configs[name], prods[name].weights[i : i + 1])
        prods["head"].launch(configs["head"])

    return graph_us(step, 1, reps=5)


def tune(shapes: list[str]) -> dict:
    """Sweep every shape; install the winners in ``cuda_kernels.GEMV_CONFIGS``; report."""
    out: dict = {"pdl_works": pdl_works()}
    cuda_kernels.PDL_OK = out["pdl_works"]
    for shape in shapes:
        res = sweep_shape(shape, out["pdl_works"])
        best = {name: GemvConfig(**row["best"]) for name, row in res.items()}
        for name, row in res.items():
            cuda_kernels.GEMV_CONFIGS[(row["n"], row["k"])] = best[name]
        plain = {
            n: GemvConfig(c.block_n, c.block_k, c.num_warps, "", False) for n, c in best.items()
        }
        res["chain_us"] = {"tuned": chain_us(shape, best), "tuned_no_pdl_no_evict": chain_us(shape, plain),
                           "cublas": chain_us(shape, dict.fromkeys(best))}  # fmt: skip
        out[shape] = res
        torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", nargs="+", default=["llama-3.2-1b", "llama-3-8b"])
    args = parser.parse_args()
    print(json.dumps(tune(args.shapes), indent=1))


if __name__ == "__main__":
    main()
