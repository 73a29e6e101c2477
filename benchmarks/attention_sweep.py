"""Launch-shape sweep of the CUDA path's split-KV attention (``cuda/attention.py``) per model.

A decode or verify step runs the kernel once per layer at short lengths, where it is bound by
latency, not bytes (benchmarks/GPU_NOTES.md, run 27: 8-12 us per launch on the default model).
For each model's head layout, dtype, tokens per row (1: decode, 6: a verify of 5 drafts) and
cached length, the sweep replays one CUDA graph of ``--layers`` launches of the rotary variant
(the target's layers) per candidate (positions per split, positions per block, warps,
programs per KV head) and
reports microseconds per launch against the engine's default choice, and the winner.

    PYTHONPATH=. python3 benchmarks/attention_sweep.py [--models smollm2-135m llama-3-8b] \
        [--candidates 64,64,8 32,16,2] > attn.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))

from gemv_sweep import graph_us

from mathagent.serving.engine.cuda import attention as attn
from mathagent.serving.engine.random_model import RANDOM_SHAPES

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
CANDIDATES = [
    (part, block, warps, gs)
    for part, block, warps, gs in itertools.product(
        (32, 64, 128, 256), (16, 32, 64), (2, 4, 8), (1, 3)
    )
    if block <= part
]


def layout(model: str) -> tuple[int, int, int]:
    """(query heads, KV heads, head dim) of a named shape, or of the default model."""
    if model == "smollm2-135m":
        return 9, 3, 64
    cfg = RANDOM_SHAPES[model]
    return (cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["hidden_size"] // cfg["num_attention_heads"])  # fmt: skip


def sweep_case(h, hkv, d, dtype, width, length, layers, max_seq, batch=1) -> dict:
    """Microseconds per launch of every candidate at one case; the default's and the best."""
    dev = torch.device("cuda")
    qkv = torch.randn(batch, width, (h + 2 * hkv) * d, device=dev, dtype=dtype)
    caches = [(torch.randn(batch + 1, hkv, max_seq, d, device=dev, dtype=dtype),
               torch.randn(batch + 1, hkv, max_seq, d, device=dev, dtype=dtype))
              for _ in range(layers)]  # fmt: skip
    slots = torch.arange(batch, device=dev)
    start = torch.full((batch,), length, device=dev)
    tree = torch.tril(torch.ones(width, width, dtype=torch.int8, device=dev))
    tree = tree.expand(batch, width, width).contiguous()
    pos = start[:, None] + torch.arange(width, device=dev)
    cos = torch.randn(max_seq, d, device=dev, dtype=dtype)
    sin = torch.randn(max_seq, d, device=dev, dtype=dtype)
    view = qkv.view(batch, width, -1, d)
    rope = (pos, cos, sin)

    def launches(cfg):
        def fn():
            for k, v in caches:
                attn._attention(view, k, v, slots, start, tree, h, rope, cfg)

        return fn

    ref = attn._attention(view, *caches[0], slots, start, tree, h, rope, None).float()
    gs = attn.head_groups(width, h // hkv)
    part = attn.attention_partition(batch, gs)
    splits = attn.attention_splits(max_seq, part, batch * hkv * gs, dev)
    out: dict = {"default": [part, gs, splits]}
    times = {}
    for cfg in [None, *CANDIDATES]:
        if cfg is not None and len(cfg) > 3 and (h // hkv) % cfg[3]:
            continue  # the programs of a KV head share its query heads evenly
        got = attn._attention(view, *caches[0], slots, start, tree, h, rope, cfg).float()
        err = ((got - ref).abs().max() / ref.abs().max().clamp(min=1e-6)).item()
        if err > (1e-4 if dtype == torch.float32 else 2e-2):
            times[str(cfg)] = f"wrong: {err:.2e}"
            continue
        times[str(cfg)] = round(graph_us(launches(cfg), layers), 2)
    ok = {k: v for k, v in times.items() if isinstance(v, float) and k != "None"}
    best = min(ok, key=ok.get)
    out.update(default_us=times["None"], best=best, best_us=ok[best], us=times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m"])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--widths", nargs="+", type=int, default=[1, 6])
    parser.add_argument("--lengths", nargs="+", type=int, default=[128, 384, 768, 1536])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--max-seq", type=int, default=2048)
    parser.add_argument("--batches", nargs="+", type=int, default=[1])
    parser.add_argument("--candidates", nargs="+", metavar="PART,BLOCK,WARPS[,GS[,SPLITS]]",
                        help="launch shapes to time instead of the full grid (GS: programs "
                             "per KV head, dividing its query heads; SPLITS: most stretches "
                             "a row takes)")  # fmt: skip
    args = parser.parse_args()
    if args.candidates:
        CANDIDATES[:] = [tuple(int(x) for x in c.split(",")) for c in args.candidates]
    res: dict = {"candidates": [list(c) for c in CANDIDATES], "cases": []}
    for model, dt, batch, width, length in itertools.product(
        args.models, args.dtypes, args.batches, args.widths, args.lengths
    ):
        h, hkv, d = layout(model)
        case = sweep_case(h, hkv, d, DTYPES[dt], width, length, args.layers, args.max_seq, batch)
        case.update(model=model, dtype=dt, batch=batch, width=width, length=length)
        print({k: case[k] for k in ("model", "dtype", "batch", "width", "length", "default",
                                    "default_us", "best", "best_us")},
              file=sys.stderr, flush=True)  # fmt: skip
        res["cases"].append(case)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
