"""What a batch-1 decode step through ``LLMEngine`` costs beyond its captured graph (one GPU).

``fp8_bench.py`` reads tokens/s from ``LLMEngine.step``; ``fp8_step_probe.py`` times the decode
graph alone. The difference is the work around the model's forward: the tail (argmax or
sampling), getting the tokens to the host and the next step's inputs in place (since run 159 one
graph with the forward, ``cuda/decode_advance.py``; before, copies between the graphs), and any
host time the lookahead (``cuda/lookahead.py``) does not hide. Measured on one engine, in order:

- ``engine``: steady tokens/s and ms a step of one greedy request through ``LLMEngine.step``;
- ``steps``: each step's wall time (median, mean, the slow steps) and the Python garbage
  collections during them; ``steps_gc_frozen``: the same after ``gc.freeze()``;
- ``graph_ms``: the (1, 1) decode graph replayed back to back, on the inputs it last held (the
  finished request's last position, ~290: longer attention than the steps' average);
- ``tail_ms``: the lookahead's greedy graph replayed back to back (the whole step: forward,
  tail and advance; in trees before run 159, the tail alone; each replay moves the inputs one
  position on, so its context grows);
- ``lookahead_ms``: ``DecodeLookahead.decode`` in a loop (no scheduler, sequences or outputs);
- ``between``: a profiler trace of engine steps, each GPU operation from the end of one step's
  forward (the (1, 1) graph's kernels, found by its first kernel and count) to the next step's
  first (name, kind, us after the forward, us long: a step graph's argmax and advance too),
  and the median step period on the GPU.

These are probes; ``fp8_bench.py``'s figures are the results. Run:
``PYTHONPATH=.:benchmarks python3 benchmarks/engine_step_probe.py --runs fp8-static-head``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import statistics
import time
from pathlib import Path

import engine_runs
import torch
from fp8_bench import decode_tok_s, prompts
from gpu_common import FP8_SHAPE, replay_ms, trace_events

from mathagent.serving.engine.sampling_params import SamplingParams

GPU_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")


def tail_of(eng) -> tuple:
    """The (1, 1) decode graph and the lookahead's greedy step graph of one row (a tree from
    before run 159: its tail graph), for an A/B against such a tree."""
    la = eng.runner.lookahead
    graph = eng.runner.graphs.graphs[(1, 1)][0]
    tail = (la._step_graphs if hasattr(la, "_step_graphs") else la._tail)(1, None)
    return graph, tail.graphs[0] if hasattr(tail, "graphs") else tail.graph


def zero_copy() -> bool | None:
    """``decode_advance.ZERO_COPY`` where the package has it (None: a tree from before it)."""
    try:
        from mathagent.serving.engine.cuda import decode_advance
    except ImportError:
        return None
    return decode_advance.ZERO_COPY[0]


def lookahead_ms(eng, steps: int = 100) -> float:
    """Milliseconds a step of ``DecodeLookahead.decode`` at batch 1 from position 40."""
    la = eng.runner.lookahead
    slot = 0  # no request runs now: the first slot is free
    tokens, pos = [1], 40
    for _ in range(5):
        tokens, pos = la.decode(tokens, [pos], [slot]), pos + 1
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        tokens, pos = la.decode(tokens, [pos], [slot]), pos + 1
    dt = time.perf_counter() - t0
    la.drop()
    return dt / steps * 1e3


def engine_steps(eng, steps: int = 256) -> dict:
    """Wall time of each steady step of one greedy request through ``LLMEngine.step``, and the
    Python garbage collections that ran during them (generation, ms)."""
    params = SamplingParams(max_tokens=steps + 2, temperature=0.0, ignore_eos=True)
    eng.add_request(prompts(1, seed=5)[0], params)
    eng.step()  # the prefill
    walls, collections, began = [], [], [0.0]

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            collections.append([info["generation"], (time.perf_counter() - began[0]) * 1e3])

    gc.callbacks.append(timed)
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            eng.step()
            walls.append((time.perf_counter() - t0) * 1e3)
    finally:
        gc.callbacks.remove(timed)
    while eng.has_unfinished():
        eng.step()
    med = statistics.median(walls)
    return {"ms_mean": statistics.fmean(walls), "ms_median": med, "ms_max": max(walls),
            "steps_over_1_5x_median": sum(w > 1.5 * med for w in walls),
            "ms_over_median_in_slow_steps": sum(w - med for w in walls if w > 1.5 * med),
            "gc_collections": collections}  # fmt: skip


def traced_steps(eng, steps: int = 100) -> list[dict]:
    """GPU operations of ``steps`` steady engine steps of one greedy request, in time order."""
    params = SamplingParams(max_tokens=steps + 40, temperature=0.0, ignore_eos=True)
    eng.add_request(prompts(1, seed=7)[0], params)
    for _ in range(10):
        eng.step()
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            eng.step()
        torch.cuda.synchronize()
    while eng.has_unfinished():
        eng.step()
    ops = [e for e in trace_events(prof) if e.get("cat") in GPU_KINDS and "dur" in e]
    return sorted(ops, key=lambda e: e["ts"])


def between(ops: list[dict], first: str, graph_kernels: int) -> dict:
    """Each step's operations outside its decode graph: a graph starts at a kernel named
    ``first`` and holds ``graph_kernels`` kernels (copies inside it are counted as inside)."""
    steps, i = [], 0  # each step: (index of its graph's first op, of its last)
    while i < len(ops):
        if ops[i]["cat"] == "kernel" and ops[i]["name"] == first:
            j, seen = i, 1
            while seen < graph_kernels and j + 1 < len(ops):
                j += 1
                seen += ops[j]["cat"] == "kernel"
            steps.append((i, j))
            i = j
        i += 1
    rows, periods, outside = [], [], []
    for (a0, a1), (b0, _) in itertools.pairwise(steps):
        end = ops[a1]["ts"] + ops[a1]["dur"]
        periods.append(ops[b0]["ts"] - ops[a0]["ts"])
        outside.append(ops[b0]["ts"] - end)
        rows.append([[e["name"][:50], e["cat"], round(e["ts"] - end, 2), round(e["dur"], 2)]
                     for e in ops[a1 + 1 : b0 + 1]])  # fmt: skip
    return {"graph_kernels": graph_kernels, "first_kernel": first[:80], "steps_found": len(steps),
            "period_us_median": statistics.median(periods) if periods else None,
            "period_us_mean": statistics.fmean(periods) if periods else None,
            "period_us_max": max(periods) if periods else None,
            "outside_graph_us_median": statistics.median(outside) if outside else None,
            "outside_graph_us_max": max(outside) if outside else None,
            "examples": rows[len(rows) // 2 : len(rows) // 2 + 2]}  # fmt: skip


def graph_kernels(graph) -> tuple[str, int]:
    """The name of the first kernel of one replay of ``graph``, and how many kernels it runs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    events = trace_events(prof)
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    return kernels[0]["name"], len(kernels)


def probe(run: str) -> dict:
    eng = engine_runs.engine(run, FP8_SHAPE)
    decode_tok_s(eng, 1, 16)  # capture the graph and its tail, warm up
    b1 = decode_tok_s(eng, 1, 256)
    res: dict = {"engine_tok_s": b1["steady_tok_s"], "engine_ms": 1e3 / b1["steady_tok_s"]}
    graph, tail = tail_of(eng)
    res["graph_ms"] = sorted(replay_ms(graph, 50) for _ in range(3))[1]
    res["tail_ms"] = sorted(replay_ms(tail, 50) for _ in range(3))[1]
    res["lookahead_ms"] = sorted(lookahead_ms(eng) for _ in range(3))[1]
    res["zero_copy"] = zero_copy()  # whether the step stores its tokens in host memory
    res["steps"] = engine_steps(eng)
    gc.collect()
    gc.freeze()  # what vLLM does after its warm-up (freeze_gc_heap): the heap left out of GC
    res["steps_gc_frozen"] = engine_steps(eng)
    b1 = decode_tok_s(eng, 1, 256)
    res["engine_gc_frozen_ms"] = 1e3 / b1["steady_tok_s"]
    gc.unfreeze()
    try:
        first, count = graph_kernels(graph)
        res["between"] = between(traced_steps(eng), first, count)
    except Exception as exc:  # a profiler without CUPTI: the timings stand alone
        res["between"] = repr(exc)[:300]
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", nargs="+", default=["fp8-static-head"])
    parser.add_argument("--out", default="engine_step_probe.json")
    args = parser.parse_args()
    out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__}
    for run in args.runs:
        out[run] = probe(run)
        torch.cuda.empty_cache()
        Path(args.out).write_text(json.dumps(out, indent=1))
        brief = {k: v for k, v in out[run].items() if k != "between"}
        print(run, json.dumps(brief)[:3000], flush=True)


if __name__ == "__main__":
    main()
