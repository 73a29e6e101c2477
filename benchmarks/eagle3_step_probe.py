"""Where a fused EAGLE-3 step's time goes on CUDA: a probe, not a benchmark result.

Loads the default model and a head as ``gpu_default_model.py`` does (same options), decodes
the prompts with the auto and the fixed draft-length policy taking turns going first, then
replays the captured whole-step graph (batch 1, the fixed draft length) back to back from a
saved input state for its device time, times replay + outcome read without a step launched
ahead, and writes a torch-profiler kernel table and trace of five replays and a cProfile of
the host path (fixed policy, first 10 prompts) into ``--out``. The replays run past the last
generation's positions and overwrite that slot's cache beyond them: nothing is decoded after.
GPU_NOTES runs 51-53 used it:

    python benchmarks/eagle3_step_probe.py --default-model GGUF --drafter REDRAFTER \
        --prompts bench20.jsonl --eagle3 HEAD --default-beams 1 --default-draft-len 6 \
        --default-limit 20 --default-max-tokens 256 --default-dtype bfloat16 --out DIR
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(__file__))

from gpu_common import load_fused_table
from gpu_default_model import add_arguments, agent_prompts, make_engine

from mathagent.serving.engine.sampling_params import SamplingParams
from mathagent.serving.engine.spec_config import embedded_method
from mathagent.serving.engine.spec_decode.policy import DraftPolicy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--out", type=Path, required=True, help="folder for the probe's files")
    parser.add_argument("--rounds", type=int, default=2, help="passes over the prompts")
    parser.add_argument("--plain-tokens", type=int, default=64,
                        help="plain greedy tokens profiled for the plain step's kernel table")  # fmt: skip
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.fused_table:  # as gpu_default_model.run
        load_fused_table(args.fused_table)
    engine = make_engine(args, Path(tempfile.mkdtemp()))
    prompts = agent_prompts(engine, args.prompts, args.default_limit)
    spec, k = f"eagle3:{args.eagle3}", args.default_draft_len
    params = SamplingParams(max_tokens=args.default_max_tokens, temperature=0.0, speculative=spec)
    engine.speculator.policy = DraftPolicy(k, False)
    engine.generate(prompts[:1], SamplingParams(max_tokens=8, temperature=0.0, speculative=spec))
    policies = {"auto": DraftPolicy(k, True), "fixed": DraftPolicy(k, False)}

    def decode(mode: str, prompt: str) -> tuple[int, float]:
        engine.speculator.policy = policies[mode]
        res = engine.generate([prompt], params)[0]
        return len(res.token_ids) - 1, res.metrics.decode_s

    report: dict = {"order": {}}
    for rnd in range(args.rounds):
        order = ("fixed", "auto") if rnd % 2 == 0 else ("auto", "fixed")
        for prompt in prompts:
            for place, mode in enumerate(order):
                tokens, seconds = decode(mode, prompt)
                key = f"{mode}_round{rnd}_{'first' if place == 0 else 'second'}"
                entry = report["order"].setdefault(key, {"tokens": 0, "decode_s": 0.0})
                entry["tokens"] += tokens
                entry["decode_s"] += seconds
    for entry in report["order"].values():
        entry["tok_s"] = round(entry["tokens"] / max(entry["decode_s"], 1e-9), 1)

    prof = cProfile.Profile()
    for prompt in prompts[:10]:
        prof.enable()
        decode("fixed", prompt)
        prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(60)
    (args.out / "host_profile.txt").write_text(text.getvalue())

    steps = engine.speculator.proposer(embedded_method(spec)).steps
    if steps is None:
        raise SystemExit("the step probe needs the fused step: CUDA with graphs")
    key = (1, k, None)  # (bucket, k, cuts): greedy
    graph = steps._graphs[key]  # a probe: the step's own captured graph and inputs
    saved = graph.inp.packed.clone()
    device_ms = []
    for _ in range(6):
        graph.inp.packed.copy_(saved)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(20):
            graph.graph.replay()
        end.record()
        torch.cuda.synchronize()
        device_ms.append(round(start.elapsed_time(end) / 20, 4))
    report["step_device_ms"] = device_ms
    graph.inp.packed.copy_(saved)
    torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(20):
        launch = steps._launch(key, 1)
        launch.done.synchronize()
        launch.host.tolist()
    report["step_replay_and_read_ms"] = round((time.perf_counter() - begin) / 20 * 1e3, 4)
    graph.inp.packed.copy_(saved)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as kernels:
        for _ in range(5):
            graph.graph.replay()
        torch.cuda.synchronize()
    table = kernels.key_averages().table(sort_by="cuda_time_total", row_limit=60)
    (args.out / "kernels.txt").write_text(table)
    kernels.export_chrome_trace(str(args.out / "trace.json"))
    launched = [e for e in kernels.events() if e.device_type.name == "CUDA"]
    report["kernels_per_step"] = len(launched) / 5
    report["plain_kernels_per_token"] = _plain_profile(engine, prompts[0], args)
    (args.out / "probe.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


def _plain_profile(engine, prompt: str, args: argparse.Namespace) -> float:
    """Kernel table and trace of plain greedy decoding of one prompt in the same engine (its
    decode graph), for the per-layer costs at one row beside the step's at its verify width."""
    params = SamplingParams(max_tokens=args.plain_tokens, temperature=0.0)
    engine.generate([prompt], params)  # warm: the prompt cached, the decode graph captured
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as kernels:
        res = engine.generate([prompt], params)[0]
        torch.cuda.synchronize()
    table = kernels.key_averages().table(sort_by="cuda_time_total", row_limit=60)
    (args.out / "plain_kernels.txt").write_text(table)
    kernels.export_chrome_trace(str(args.out / "plain_trace.json"))
    launched = [e for e in kernels.events() if e.device_type.name == "CUDA"]
    return round(len(launched) / max(1, len(res.token_ids)), 1)


if __name__ == "__main__":
    main()
