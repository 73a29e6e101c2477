"""FP8 on one GPU (the issue's H200, or an H100): the fp8 GEMV launch sweep, then BF16 vs FP8 decode through ``LLMEngine``.

``--sweep``: ``fp8_gemv_sweep.sweep`` (each product of an 8B decode step over distinct random
e4m3 matrices, cold in L2, in one CUDA graph, for CUDA-core and tensor-core tiles); winners go
into ``cuda.fp8_gemv.FP8_GEMV_CONFIGS`` for the engine runs that follow. ``--split-sweep``:
``fp8_split_sweep.sweep`` (the tensor-core rows kernel with K split across programs, at one
row and at a verify width, against today's path); winners that beat it go into
``fp8_gemv.ONE_ROW_CONFIGS`` / ``fp8.ROWS_CONFIGS``. ``--runs-before`` runs engines before the
sweeps (the same process's A/B). Engine runs: random weights of
the 8B shape loaded by ``load_model`` (``quantization`` none, then fp8), greedy, batch 1 and
16 concurrent through ``LLMEngine.step``, the decode graph alone and a verify-shaped graph
(1 + 3 drafted tokens: the speculation speedup at acceptance 3 is ``3 x t(decode) / t(verify)``,
host bookkeeping left out), and greedy n-gram speculation against plain greedy (same
tokens?). gpu_bench.py is not imported: it needs the agent's packages (openai), which the
device machine lacks. Rooflines count the weight bytes a step reads (the embedding
table is not read, one row of it is) at the card's datasheet bandwidth (``roofline_tok_s``) and
at the H200's (``roofline_tok_s_h200``, the issue's 4.8 TB/s). Run:
``PYTHONPATH=.:benchmarks python3 benchmarks/fp8_bench.py --sweep --out fp8.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
import traceback
from pathlib import Path

import engine_runs
import fp8_split_sweep
import torch
from fp8_gemv_sweep import sweep
from fp8_step_probe import variant
from gpu_common import (
    DATASHEET_HBM_BYTES_PER_S,
    FP8_SHAPE,
    card_bytes_per_s,
    replay_ms,
    steady_tok_s,
)

from mathagent.config import EngineSettings
from mathagent.serving.engine import fp8_format
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.cuda import fp8 as cuda_fp8
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.loader import load_model
from mathagent.serving.engine.random_model import RANDOM_SHAPES
from mathagent.serving.engine.sampling_params import SamplingParams


def read_bytes(model: torch.nn.Module) -> int:
    """Weight bytes one decode step reads: every distinct tensor but the embedding table."""
    seen = {}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if not name.startswith("tok_embeddings") or model.output.weight is t:
            seen[t.data_ptr()] = t.numel() * t.element_size()
    if model.output.weight is model.tok_embeddings.weight:
        seen[model.output.weight.data_ptr()] = model.output.weight.nbytes
    return sum(seen.values())


def engine_run(run: str) -> dict:
    """Batch 1 and 16 through LLMEngine, the decode graphs, and speculation, for one run of
    ``engine_runs.RUNS`` (``none``, ``fp8``, ``fp8-static``, ``fp8-static-head``)."""
    t0 = time.perf_counter()
    engine = engine_runs.engine(run, FP8_SHAPE, max_batch_size=16)
    loaded = engine.loaded
    nbytes = read_bytes(loaded.model)
    # the card's own roofline, and the issue's (the H200's 4.8 TB/s) beside it
    res: dict = {"load_and_init_s": time.perf_counter() - t0, "weight_bytes_read": nbytes,
                 "roofline_tok_s": card_bytes_per_s() / nbytes,
                 "roofline_tok_s_h200": DATASHEET_HBM_BYTES_PER_S / nbytes}  # fmt: skip
    res["gemv_shapes"] = sorted(engine.runner.graphs.forward.shape.fast)
    decode_tok_s(engine, 1, 16)  # capture and warm up
    res["b1"] = decode_tok_s(engine, 1, 256)
    res["b1_fraction_of_roofline"] = res["b1"]["steady_tok_s"] / res["roofline_tok_s"]
    res["b1_fraction_of_h200_roofline"] = res["b1"]["steady_tok_s"] / res["roofline_tok_s_h200"]
    res["c16"] = decode_tok_s(engine, 16, 128)
    graphs = engine.runner.graphs
    graphs.capture(1, 4)
    res["graph_ms"] = {f"{b}x{t}": replay_ms(graphs.graphs[(b, t)][0]) for b, t in ((1, 1), (1, 4), (16, 1))}  # fmt: skip
    res["spec_speedup_at_acceptance_3_graphs"] = 3 * res["graph_ms"]["1x1"] / res["graph_ms"]["1x4"]
    del engine, loaded, graphs
    torch.cuda.empty_cache()
    return res


def prompts(n: int, seed: int, length: int = 32) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(
        0, RANDOM_SHAPES[FP8_SHAPE]["vocab_size"], (n, length), generator=gen
    ).tolist()


def decode_tok_s(engine: LLMEngine, n: int, max_tokens: int) -> dict:
    """Tokens/s of ``n`` concurrent greedy requests (``gpu_common.steady_tok_s``)."""
    return steady_tok_s(engine, prompts(n, seed=n), max_tokens)


def spec_equal(variant: str = ":stable") -> dict:
    """FP8 greedy n-gram speculation vs plain greedy on repetitive prompts: same tokens? On the
    stable random weights (``random_model.stabilize_greedy``): plain random weights nearly tie
    their top logits, so the verify rows' float32 sums in another order part the two there
    (run 114: 2 of 4 prompts, from token 4), which says nothing about the speculation."""
    settings = EngineSettings(device="cuda", quantization="fp8", max_batch_size=4,
                              max_seq_len=1024, eager=False)  # fmt: skip
    config = EngineConfig.from_settings(settings, f"random:{FP8_SHAPE}{variant}")
    loaded = load_model(config.model, Path("/tmp"), config.device, config.dtype, "fp8")
    ps = [p[:8] * 4 for p in prompts(4, seed=3)]
    params = SamplingParams(max_tokens=96, temperature=0.0, ignore_eos=True)
    outs, secs = {}, {}
    for method in ("none", "ngram"):
        cfg = EngineConfig(**{**config.__dict__, "speculative": method})
        engine = LLMEngine(cfg, model_dir=None, loaded=loaded)
        engine.generate(ps[:1], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
        t0 = time.perf_counter()
        outs[method] = [engine.generate([p], params)[0].token_ids for p in ps]
        secs[method] = time.perf_counter() - t0
    same = [a == b for a, b in zip(outs["none"], outs["ngram"], strict=True)]
    first = [next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
             for a, b in zip(outs["none"], outs["ngram"], strict=True)]  # fmt: skip
    return {"model": config.model, "identical_to_plain": all(same), "per_prompt": same,
            "first_divergence": first,
            "ngram_over_plain_wall": secs["none"] / secs["ngram"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument(
        "--sweep-products",
        nargs="+",
        choices=["qkv", "wo", "w13", "w2"],
        help="sweep only these products (default: all four)",
    )
    parser.add_argument("--sweep-split", action="store_true",
                        help="the sweep tries K in slices too (Fp8GemvConfig.split)")  # fmt: skip
    parser.add_argument("--out", default="fp8_bench.json")
    parser.add_argument("--split-sweep", action="store_true")
    parser.add_argument("--runs-before", nargs="*", default=[])
    parser.add_argument("--runs", nargs="+", default=["fp8", "none"])
    parser.add_argument("--variant", default="", help="GEMV settings for the whole run, "
                        "as fp8_step_probe.py --variants takes them (e.g. a probe's winner)")  # fmt: skip
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        if args.variant:  # for the whole run (held by the stack: a dropped context manager
            # is closed when collected, and its exit restores the tables at once)
            stack.enter_context(variant(args.variant))
            print(f"variant {args.variant}", flush=True)
        run_all(args)


def run_all(args: argparse.Namespace) -> None:
    """The sweeps and engine runs ``args`` names; JSON to ``args.out`` after each."""
    out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "shape": FP8_SHAPE, "variant": args.variant}  # fmt: skip
    q, s = cuda_fp8.quantize_rows(x := torch.randn(7, 14336, device="cuda", dtype=torch.bfloat16))
    q_ref, s_ref = fp8_format.quantize_rows(x)
    out["quantize_rows_bitwise_equal_reference"] = bool(
        torch.equal(s, s_ref) and torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    )

    def save() -> None:
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))

    sections = [(f"{q}_before_sweeps", lambda q=q: engine_run(q)) for q in args.runs_before]
    if args.sweep:
        sections.append(("sweep", lambda: sweep(args.sweep_products, args.sweep_split)))
    if args.split_sweep:

        def split() -> dict:
            res = fp8_split_sweep.sweep()
            res["installed"] = fp8_split_sweep.install(res)
            return res

        sections.append(("split_sweep", split))
    sections += [(q, lambda q=q: engine_run(q)) for q in args.runs]
    sections += [("fp8_ngram_equals_plain", spec_equal)]
    for name, fn in sections:
        t0 = time.perf_counter()
        try:
            out[name] = fn()
        except Exception:
            out[name] = {"error": traceback.format_exc()[-1500:]}
        out[name + "_s"] = time.perf_counter() - t0
        save()
        print(json.dumps({name: out[name]}, default=str)[:3000], flush=True)
    for run in [r for r in args.runs if r.startswith("fp8-")]:
        if "b1" in out.get("none", {}) and "b1" in out.get(run, {}):
            b1 = out[run]["b1"]["steady_tok_s"] / out["none"]["b1"]["steady_tok_s"]
            key = run.replace("-", "_")
            out[key + "_over_bf16_b1"] = b1
            out[f"goal_1.8x_bf16_{key}"] = b1 >= 1.8
            out[f"goal_80pct_fp8_roofline_{key}"] = out[run]["b1_fraction_of_roofline"] >= 0.8
    save()
    if "none" in out and "fp8" in out and "b1" in out["fp8"] and "b1" in out["none"]:
        fp8_b1, bf16_b1 = out["fp8"]["b1"]["steady_tok_s"], out["none"]["b1"]["steady_tok_s"]
        out["fp8_over_bf16_b1"] = fp8_b1 / bf16_b1
        out["goal_80pct_fp8_roofline"] = out["fp8"]["b1_fraction_of_roofline"] >= 0.8
        out["goal_1.8x_bf16"] = out["fp8_over_bf16_b1"] >= 1.8
        save()
    print(
        json.dumps(
            {k: v for k, v in out.items() if k.endswith("over_bf16_b1") or k.startswith("goal")}
        )
    )


if __name__ == "__main__":
    main()
