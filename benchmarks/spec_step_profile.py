"""Where a speculative step's time goes on the GPU: host work against device work.

Generates through ``LLMEngine`` (the public path) under ``torch.profiler`` for a few agent
prompts, once plain and once with a speculative method, and prints JSON per method: wall
milliseconds per target step, device (kernel) milliseconds per step, kernel launches and graph
replays per step, and the host operators with the most self time. A step whose device time is
far under its wall time is bound by the host (Python and launches), not by the GPU.

    python benchmarks/spec_step_profile.py --default-model MODEL.gguf --prompts P.jsonl \
        --method eagle3:DIR [--draft-len 5] [--beams 1] [--limit 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from gpu_default_model import agent_prompts, make_engine
from torch.profiler import ProfilerActivity, profile

from mathagent.serving.engine.sampling_params import SamplingParams


def profile_method(engine, prompts: list[str], method: str, max_tokens: int) -> dict:
    """One method's per-step figures over ``prompts`` (after a warm-up that captures graphs)."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, speculative=method)
    engine.generate(prompts[:1], SamplingParams(max_tokens=8, temperature=0.0, speculative=method))
    torch.cuda.synchronize()
    steps, tokens = 0, 0
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        for prompt in prompts:
            (res,) = engine.generate([prompt], params)
            spec = res.metrics.speculative or {}
            steps += spec.get("target_forwards") or len(res.token_ids)
            tokens += len(res.token_ids)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    events = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in events if e.device_type.name == "CUDA")
    kernels = sum(e.count for e in events if e.device_type.name == "CUDA")
    replays = sum(e.count for e in events if e.key == "cudaGraphLaunch")
    launches = sum(e.count for e in events if e.key in ("cudaLaunchKernel", "cuLaunchKernel",
                                                         "cudaLaunchKernelExC", "cuLaunchKernelEx"))  # fmt: skip
    host = sorted(
        (e for e in events if e.device_type.name == "CPU"),
        key=lambda e: e.self_cpu_time_total,
        reverse=True,
    )[:20]
    per = max(steps, 1)
    device = sorted(
        (e for e in events if e.device_type.name == "CUDA"),
        key=lambda e: e.self_device_time_total,
        reverse=True,
    )[:25]
    return {
        "method": method, "tokens": tokens, "target_steps": steps,
        "tokens_per_step": round(tokens / per, 3),
        "wall_ms_per_step": round(wall * 1e3 / per, 3),
        "device_ms_per_step": round(device_us / 1e3 / per, 3),
        "kernels_per_step": round(kernels / per, 1),
        "eager_launches_per_step": round(launches / per, 1),
        "graph_replays_per_step": round(replays / per, 2),
        "host_self_ms_per_step": {e.key: round(e.self_cpu_time_total / 1e3 / per, 4) for e in host},
        "device_kernels_per_step": [
            {"kernel": e.key[:120], "calls": round(e.count / per, 2),
             "us": round(e.self_device_time_total / per, 2)} for e in device
        ],
        "note": "profiled (the profiler adds host time); speeds come from gpu_default_model.py",
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--default-model", required=True)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--method", action="append", required=True, help="e.g. eagle3:DIR")
    parser.add_argument("--draft-len", type=int, default=5)
    parser.add_argument("--beams", type=int, default=1)
    parser.add_argument("--limit", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    ns = argparse.Namespace(default_model=args.default_model, default_device="cuda",
                            default_dtype=args.dtype, default_draft_len=args.draft_len,
                            default_beams=args.beams)  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        engine = make_engine(ns, Path(tmp))
        engine.speculator.policy.adaptive = False  # every step drafts: the step is profiled
        prompts = agent_prompts(engine, args.prompts, args.limit)
        rows = [profile_method(engine, prompts, m, args.max_tokens) for m in ["none", *args.method]]
    text = json.dumps({"draft_len": args.draft_len, "beams": args.beams, "rows": rows}, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
