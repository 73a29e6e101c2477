"""GPU benchmark of the embedded engine's CUDA path; prints JSON (and writes $OUT/gpu_bench.json).

Everything in one run on one GPU, over random-weight models of real shapes built once on the
GPU and shared between transformers and the engine: the HBM roofline from the weights' bytes
(datasheet and measured copy bandwidth), transformers ``generate`` at batch 1, the engine's
batch-1 decode, its aggregate tokens/s at 8 and 64 concurrent requests, the ReDrafter head's
drafting cost, and speculative decoding through ``LLMEngine`` only (``gpu_spec.py``: a replay
proposer registered in the engine controls the acceptance length 1 to 5 at batch 1, 8 and 32,
draft-length policy fixed and auto; a ReDrafter head of the shape drafting inside the loop).
``--only-spec`` runs just the speculation sections (``--spec-dtype float32`` also in float32, where
the replay reference is plain greedy; ``--acceptances 1,3,5`` a subset; ``--skip-redrafter``). With ``--default-model MODEL --drafter DIR --prompts JSONL``
also the default model with its trained drafter on the GPU path (real acceptance; see
``gpu_default_model.py``); ``--tune-gemv`` first re-measures the GEMV launch shapes.
Run: ``PYTHONPATH=. python3 benchmarks/gpu_bench.py [--default-model ...]``.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
import gpu_default_model
import gpu_spec
from gpu_common import (
    build_hf_model,
    copy_bandwidth,
    hf_generate_tok_s,
    load_fused_table,
    roofline,
    steady_tok_s,
)

from mathagent.serving.engine import fp8_calibration
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.cuda.kernels import GEMV_CONFIGS
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.loader import LoadedModel, _hf_to_engine
from mathagent.serving.engine.model import ModelArgs, Transformer
from mathagent.serving.engine.quant import quantize_fp8, quantize_fp8_head
from mathagent.serving.engine.random_model import stabilize_greedy

PROMPT_LEN, DECODE_TOKENS, DRAFT_LEN = 32, 256, 4  # verify steps: the root + 4 drafts


def engine_from_hf(hf: torch.nn.Module) -> Transformer:
    """The engine's model over the transformers model's weights (q/k/v and gate/up fused)."""
    cfg = {**hf.config.to_dict(), "architectures": ["LlamaForCausalLM"]}
    args = ModelArgs.from_hf_config(cfg)
    with torch.device("meta"):
        model = Transformer(args)
    pieces: dict[str, dict[int, torch.Tensor]] = {}
    for name, tensor in hf.state_dict().items():
        mapped = _hf_to_engine(name)
        if mapped is not None:
            pieces.setdefault(mapped[0], {})[mapped[1]] = tensor
    state = {k: torch.cat([v[i] for i in sorted(v)]) for k, v in pieces.items()}
    state.setdefault("output.weight", state["tok_embeddings.weight"])
    model.load_state_dict(state, assign=True, strict=True)
    if args.tie_word_embeddings:
        model.output.weight = model.tok_embeddings.weight
    return model.eval()


def make_engine(model: Transformer, shape: str, max_batch: int, dtype=torch.bfloat16,
                quantization: str = "none") -> LLMEngine:  # fmt: skip
    """The engine over ``model`` on CUDA graphs (bf16); speculation per request."""
    config = EngineConfig(model=None, device=torch.device("cuda"), dtype=dtype,
                          max_batch_size=max_batch, max_seq_len=1024, speculative="none",
                          draft_len=DRAFT_LEN, draft_beams=1, eager=False, threads=None,
                          quantization=quantization)  # fmt: skip
    loaded = LoadedModel(model, None, f"random:{shape}", None, ())
    return LLMEngine(config, model_dir=None, loaded=loaded)


def prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n, PROMPT_LEN), generator=gen).tolist()


def engine_tok_s(engine: LLMEngine, n: int, max_tokens: int, vocab: int) -> dict:
    """Aggregate tokens/s of ``n`` concurrent greedy requests (``gpu_common.steady_tok_s``)."""
    return steady_tok_s(engine, prompts(n, vocab, seed=n), max_tokens)


def redrafter_cost(model: Transformer, decode_step_s: float) -> dict:
    """Milliseconds of one ReDrafter beam search (4 beams x 4 tokens) on the target's shape."""
    from mathagent.serving.engine.spec_decode.redrafter import Drafter, DrafterConfig

    args = model.args
    cfg = DrafterConfig(vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                        exit_dim=args.hidden_size, num_draft_layers=2)  # fmt: skip
    drafter = Drafter(cfg).to("cuda", torch.bfloat16).eval()
    context = torch.randn(1, args.hidden_size, device="cuda", dtype=torch.bfloat16)
    root = torch.zeros(1, dtype=torch.long, device="cuda")
    emb = model.tok_embeddings.weight

    def search() -> None:
        drafter.beam_search(context, root, emb, width=4, length=DRAFT_LEN)

    eager_ms = _ms_per_call(search)
    search()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        search()
    graph_ms = _ms_per_call(graph.replay)
    return {"beam_width": 4, "draft_len": DRAFT_LEN, "exit_dim": args.hidden_size,
            "ms_per_draft_eager": eager_ms, "ms_per_draft_cuda_graph": graph_ms,
            "graph_fraction_of_decode_step": graph_ms / 1e3 / decode_step_s}  # fmt: skip


def _ms_per_call(fn) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 100


def graph_step_ms(engine: LLMEngine, batch: int) -> float:
    """Milliseconds of one replay of the captured decode step (no host work around it)."""
    graph = engine.runner.graphs.graphs[(batch, 1)][0]
    return _ms_per_call(graph.replay)


def profile_step(engine: LLMEngine) -> list:
    """Kernel times of one un-graphed batch-1 decode step: [name, launches, total us]."""
    from torch.profiler import ProfilerActivity, profile

    forward = engine.runner.graphs.forward
    inp = engine.runner.graphs.graphs[(1, 1)][1]
    forward(inp)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        forward(inp)
        torch.cuda.synchronize()
    rows = [
        [e.key[:70], e.count, round(e.device_time_total, 1)]
        for e in prof.key_averages()
        if e.device_time_total > 0
    ]
    return sorted(rows, key=lambda r: -r[2])[:12]


@torch.inference_mode()
def bench_shape(shape: str, copy_bw: float) -> dict:
    t0 = time.perf_counter()
    hf = build_hf_model(shape)
    res: dict = {"build_s": time.perf_counter() - t0, **roofline(hf, copy_bw)}
    res["transformers_generate_b1_tok_s"] = hf_generate_tok_s(hf, PROMPT_LEN, 24)
    vocab = hf.config.vocab_size
    model = engine_from_hf(hf)
    del hf
    torch.cuda.empty_cache()
    t0 = time.perf_counter()
    engine = make_engine(model, shape, 64)
    res["engine_init_s"] = time.perf_counter() - t0
    res["triton_gemv_shapes"] = sorted(engine.runner.graphs.forward.shape.fast)
    t0 = time.perf_counter()
    for b in (1, 2, 4, 8, 16, 32, 48, 64):
        engine.runner.graphs.capture(b, 1)
    res["capture_decode_buckets_s"] = time.perf_counter() - t0
    b1 = engine_tok_s(engine, 1, DECODE_TOKENS, vocab)["steady_tok_s"]
    res["engine_b1_decode_tok_s"] = b1
    res["b1_fraction_of_roofline_datasheet"] = b1 / res["roofline_tok_s_datasheet"]
    res["b1_fraction_of_roofline_measured_copy"] = b1 / res["roofline_tok_s_measured_copy"]
    res["engine_b1_speedup_over_transformers"] = b1 / res["transformers_generate_b1_tok_s"]
    for n in (8, 64):
        res[f"engine_{n}_concurrent"] = engine_tok_s(engine, n, 192, vocab)
    res["concurrent64_over_b1"] = res["engine_64_concurrent"]["steady_tok_s"] / b1
    res["graph_replay_ms"] = {b: graph_step_ms(engine, b) for b in (1, 8, 64)}
    res["profile_b1_kernels_us"] = profile_step(engine)
    res["redrafter"] = redrafter_cost(model, 1 / b1)
    res.update(spec_sections(engine, vocab))
    return res


@torch.inference_mode()
def bench_spec_only(shape: str, args) -> dict:
    """Only the speculation sections (``--only-spec``): plain and speculative through the engine,
    per ``--spec-dtype`` (the model converted in place; float32 first, bf16 restored exactly,
    fp8 last: quantised from the bf16 weights, its rows also over bf16 plain, issue 18's 4x)."""
    hf = build_hf_model(shape)
    vocab, model = hf.config.vocab_size, engine_from_hf(hf)
    del hf
    if args.weights == "stable":  # plain and verify steps decode alike: the replay holds
        stabilize_greedy(model)
    torch.cuda.empty_cache()
    res: dict = {"weights": args.weights}
    order = {"float32": 0, "bfloat16": 1}
    for name in sorted(args.spec_dtype, key=lambda n: order.get(n, 2)):
        key = "speculative" + ("" if name == "bfloat16" else f"_{name}")
        fp8 = name.startswith("fp8")
        if fp8:  # each FP8 row from its own copy of the bf16 weights
            dtype, model = torch.bfloat16, model.to(torch.bfloat16)
            engine_model = fp8_variant(model, name)
        else:
            dtype, model = getattr(torch, name), model.to(getattr(torch, name))
            engine_model = model
        engine = make_engine(engine_model, shape, 32, dtype, "fp8" if fp8 else "none")
        res[key] = {"dtype": name}
        accepts = [int(a) for a in args.acceptances.split(",")]
        gpu_spec.run(engine, vocab, DRAFT_LEN, batches=args.spec_batches, acceptances=accepts,
                     out=res[key], replays=tuple(args.replay))  # fmt: skip
        if fp8 and "batch_1" in res.get("speculative", {}):
            res[key]["over_bf16_plain_b1"] = over_plain(res[key], res["speculative"])
        _write_out(args.partial, json.dumps({shape: res}, indent=1))
        if not args.skip_redrafter and dtype == torch.bfloat16:
            res["redrafter_in_loop_b1"] = gpu_spec.redrafter_section(engine, vocab, DRAFT_LEN)
        del engine, engine_model
        gc.collect()
        torch.cuda.empty_cache()
        # the next dtype's engine compiles the same layer function again: each (batch, width)
        # shape counts against Dynamo's per-function recompile limit across engines (run 55:
        # float32 then bf16 at batches 1, 8, 32 hit it mid-run)
        torch._dynamo.reset()
    return res


def fp8_variant(model: Transformer, name: str) -> Transformer:
    """A copy of ``model`` quantised as the ``--spec-dtype`` row names it: ``fp8`` (per-token
    activation scales), ``-static`` (calibrated static input scales, as
    ``fp8_activation_scales=calibrate``), ``-head`` (the head in FP8 too, ``fp8_head``)."""
    extras = name.split("-")[1:]
    quantized = quantize_fp8(copy.deepcopy(model))
    if "head" in extras:
        quantize_fp8_head(quantized)
    if "static" in extras:
        fp8_calibration.calibrate(quantized, None, torch.bfloat16)
    return quantized


def over_plain(section: dict, bf16: dict) -> dict:
    """Batch-1 tokens/s of each FP8 row over the bf16 plain row (issue 18: >= 4x at AL 3)."""
    base = bf16["batch_1"]["plain_tok_s"]
    b1 = section["batch_1"]
    out = {"plain": b1["plain_tok_s"] / base}
    for key, row in b1.items():
        if key.startswith("acceptance_"):
            out.update(
                {f"{key}_{m}": r["tok_s"] / base for m, r in row.items() if isinstance(r, dict)}
            )
    return out


def spec_sections(engine: LLMEngine, vocab: int) -> dict:
    """Replay speculation at batch 1/8/32 and ReDrafter drafting in the loop, via LLMEngine."""
    return {"speculative": gpu_spec.run(engine, vocab, DRAFT_LEN),
            "redrafter_in_loop_b1": gpu_spec.redrafter_section(engine, vocab, DRAFT_LEN)}  # fmt: skip


def main() -> None:
    global DRAFT_LEN
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shapes", nargs="*", default=["llama-3.2-1b", "llama-3-8b"],
                        help="random-weight model shapes (none: only the default-model section)")  # fmt: skip
    parser.add_argument("--tune-gemv", action="store_true",
                        help="sweep the GEMV launch shapes first and use the winners")  # fmt: skip
    parser.add_argument("--only-spec", action="store_true",
                        help="per shape only the speculation sections (through LLMEngine)")  # fmt: skip
    parser.add_argument("--spec-dtype", nargs="+", default=["bfloat16"],
                        choices=["bfloat16", "float32", "fp8", "fp8-static", "fp8-static-head"],
                        help="--only-spec: model dtypes (fp8 rows as fp8_bench.py --runs names them)")  # fmt: skip
    parser.add_argument("--acceptances", default="1,2,3,4,5", help="--only-spec: lengths")
    parser.add_argument("--spec-batches", nargs="+", type=int, default=[1, 8, 32],
                        help="--only-spec: batch sizes")  # fmt: skip
    parser.add_argument("--partial", default="gpu_bench_partial.json",
                        help="--only-spec: file under $OUT rewritten after each dtype")  # fmt: skip
    parser.add_argument("--fp8-unfused-rows", action="store_true",
                        help="FP8 verify rows through fp8.linear, norm / SiLU / residual apart (fp8_gemv.FUSED_ROWS off)")  # fmt: skip
    parser.add_argument("--skip-redrafter", action="store_true", help="--only-spec: no ReDrafter")
    parser.add_argument("--draft-len", type=int, default=DRAFT_LEN, help="drafts per verify step")
    parser.add_argument("--auto-warm-passes", type=int, default=1,
                        help="untimed passes before an auto row is timed")  # fmt: skip
    parser.add_argument("--weights", default="stable", choices=["stable", "random"],
                        help="--only-spec: random weights, or stable ones (random_model.stabilize_greedy: "
                             "bf16/fp8 plain steps keep the replayed path)")  # fmt: skip
    parser.add_argument("--replay", nargs="+", default=["device"], choices=["device", "host"],
                        help="--only-spec: where the replay proposer drafts (first fills fixed/auto)")  # fmt: skip
    gpu_default_model.add_arguments(parser)
    args = parser.parse_args()
    DRAFT_LEN = args.draft_len
    gpu_spec.AUTO_WARM_PASSES = args.auto_warm_passes
    if args.fused_table:
        load_fused_table(args.fused_table)
    if args.fp8_unfused_rows:
        from mathagent.serving.engine.cuda import fp8_gemv

        fp8_gemv.FUSED_ROWS = False
    torch.manual_seed(0)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    out: dict = {"device": gpu, "torch": torch.__version__}
    if args.tune_gemv:
        from gemv_sweep import tune

        t0 = time.perf_counter()
        sweep = tune(args.shapes)
        _write_out("gemv_sweep.json", json.dumps(sweep, indent=1))
        out["gemv_sweep"] = _sweep_summary(sweep, time.perf_counter() - t0)
    out["gemv_configs"] = {f"{n}x{k}": c.__dict__ for (n, k), c in GEMV_CONFIGS.items()}
    from mathagent.serving.engine.cuda import skinny

    out["fused_configs"] = {str(key): c.__dict__ for key, c in skinny.FUSED_CONFIGS.items()}
    if args.shapes:
        out["copy_bytes_per_s"] = copy_bandwidth()
    for shape in args.shapes:
        out[shape] = (
            bench_spec_only(shape, args)
            if args.only_spec
            else bench_shape(shape, out["copy_bytes_per_s"])
        )
        print(json.dumps({shape: out[shape]}), flush=True)
        torch.cuda.empty_cache()
    eight = out.get("llama-3-8b")
    if eight:
        out["goals_8b"] = {
            f"{key}_{goal}": met
            for key in eight if key.startswith("speculative")
            for goal, met in gpu_spec.goals(eight[key], DRAFT_LEN).items()
        }  # fmt: skip
        if "engine_b1_decode_tok_s" in eight:
            out["goals_8b"].update({
                "b1_ge_240_tok_s": eight["engine_b1_decode_tok_s"] >= 240,
                "b1_ge_80pct_roofline": eight["b1_fraction_of_roofline_datasheet"] >= 0.8,
                "concurrent64_ge_20x_b1": eight["concurrent64_over_b1"] >= 20,
            })  # fmt: skip
    one = out.get("llama-3.2-1b")
    if one and "b1_fraction_of_roofline_datasheet" in one:
        out["goals_1b"] = {"b1_ge_55pct_roofline": one["b1_fraction_of_roofline_datasheet"] >= 0.55}
    if args.default_model:
        out["default_model"] = gpu_default_model.run(args)
        print(json.dumps({"default_model": out["default_model"]}), flush=True)
    text = json.dumps(out, indent=1)
    print(text)
    _write_out("gpu_bench.json", text)


def _write_out(name: str, text: str) -> None:
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], name), "w") as f:
            f.write(text)


def _sweep_summary(sweep: dict, seconds: float) -> dict:
    """Per shape and product: the winner's microseconds against cuBLAS and the two toggles."""
    res: dict = {"pdl_works": sweep["pdl_works"], "seconds": seconds}
    for shape, rows in sweep.items():
        if isinstance(rows, dict):
            res[shape] = {"chain_us": rows["chain_us"]}
            for name, row in rows.items():
                if name != "chain_us":
                    keys = ("best_us", "best_tb_s", "cublas_us", "no_evict_us", "no_pdl_us")
                    res[shape][name] = {k: row[k] for k in keys}
    return res


if __name__ == "__main__":
    main()
