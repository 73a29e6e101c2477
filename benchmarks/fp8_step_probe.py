"""Where the FP8 one-row decode step's time goes (8B shape, random weights, one H200).

The engine's captured batch-1 decode graph is replayed whole, then captured again with parts
replaced by tensors made once beforehand (``--ablate``: the row kernels that quantise each
product's input, the attention, the vocabulary head, all layers), and with settings of the fp8
GEMV (``--variants``, :func:`variant`). A kernel profile of the whole graph (torch.profiler)
lists each kernel's count and time. These are probes: an ablated graph computes nothing useful; it
says what a part costs in place, programmatic-dependent-launch overlap included. The engine's
own figures (``fp8_bench.py``) are the results. ``combined``: the variants that beat the
shipped graph (:func:`winners`), one a setting, as ``fp8_bench.py --variant`` takes them.

Run: ``PYTHONPATH=.:benchmarks python3 benchmarks/fp8_step_probe.py --out probe.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import engine_runs
import torch
from gpu_common import FP8_SHAPE, replay_ms, trace_events

from mathagent.serving.engine.cuda import attention, fp8_gemv


@contextlib.contextmanager
def static_rows():
    """Each product's codes and scale made once (no row kernel in the graph)."""
    real, made = fp8_gemv.quantize_row, {}

    def quantize_row(x, k, norm, eps, pro, pdl, input_scale=None):
        key = (k, pro)
        if key not in made:
            made[key] = real(x, k, norm, eps, pro, pdl, input_scale)
        return made[key]

    fp8_gemv.quantize_row = quantize_row
    try:
        yield
    finally:
        fp8_gemv.quantize_row = real


@contextlib.contextmanager
def static_attention():
    """The attention's output made once (no attention kernel in the graph)."""
    real, made = attention._attention, {}

    def fake(q, k_cache, v_cache, slots, start, tree, h, rope, launch=None, out_scale=None):
        key = (tuple(q.shape), h, out_scale is None)
        if key not in made:
            made[key] = real(q, k_cache, v_cache, slots, start, tree, h, rope, launch, out_scale)
        return made[key]

    attention._attention = fake
    try:
        yield
    finally:
        attention._attention = real


@contextlib.contextmanager
def static_head(forward):
    real, made = forward.head, []

    def head(h, delta):
        if not made:
            made.append(real(h, delta))
        return made[0]

    forward.head = head
    try:
        yield
    finally:
        forward.head = real


@contextlib.contextmanager
def no_layers(forward):
    real = forward.weights
    forward.weights = []
    try:
        yield
    finally:
        forward.weights = real


@contextlib.contextmanager
def variant(spec: str):
    """fp8 GEMV settings for one A/B, restored after: ``;``-separated ``GLU=0|1``, ``A16=0|1``
    (one-row products read the plain row: W8A16, no row kernels), ``GLU_CODES=0|1``,
    ``ATTENTION_CODES=0|1`` (static scales: w13 / the attention write w2's / wo's codes),
    ``cfg=NxK:bn,bk,warps`` (a plain launch shape), ``glu=NxK:bn,bk,warps`` (w13's GLU launch
    shape, rows of each half), ``attn=part,block,warps[,gs[,splits]]`` (the one-token
    attention's launch, as attention_sweep.py's candidates), ``SPLITS_PER_WAVE=0|1``,
    ``LAUNCH_PDL=0|1``, ``NEW_IN_REGISTERS=0|1``, ``MERGE_LOADS=n`` (the attention's),
    ``row=K,pro:warps`` (the row kernel's warps for inputs of width K, prologue pro: 0 plain,
    1 norm, 2 SiLU product)."""
    # every module setting a variant may change, restored after it
    settings = {fp8_gemv: ("GLU", "A16", "GLU_CODES", "ATTENTION_CODES"),
                attention: ("_attention", *ATTENTION_FLAGS, *ATTENTION_COUNTS)}  # fmt: skip
    saved = {(mod, name): getattr(mod, name) for mod, names in settings.items() for name in names}
    tables = {"cfg": fp8_gemv.FP8_GEMV_CONFIGS, "glu": fp8_gemv.GLU_CONFIGS}
    # relative to this card's shapes: its own table moved into the plain ones for the variant
    cards = {"cfg": fp8_gemv.CARD_FP8_GEMV_CONFIGS, "glu": fp8_gemv.CARD_GLU_CONFIGS}
    dicts = [*tables.values(), *cards.values(), fp8_gemv.ROW_WARPS]
    saved_dicts = [dict(table) for table in dicts]
    card = fp8_gemv.card_key()
    for key, table in cards.items():
        tables[key].update(table.pop(card, {}))
    for part in filter(None, spec.split(";")):
        key, value = part.split("=")
        if key in settings[fp8_gemv]:
            setattr(fp8_gemv, key, value == "1")
        elif key in ATTENTION_FLAGS:
            setattr(attention, key, value == "1")
        elif key in ATTENTION_COUNTS:
            setattr(attention, key, int(value))
        elif key == "row":
            shape_text, warps = value.split(":")
            k, pro = (int(v) for v in shape_text.split(","))
            fp8_gemv.ROW_WARPS[(k, pro)] = int(warps)
        elif key == "attn":
            attention._attention = one_token_launch(saved[(attention, "_attention")], value)
        else:
            shape_text, launch = value.split(":")
            shape = tuple(int(v) for v in shape_text.split("x"))
            tables[key][shape] = fp8_gemv.Fp8GemvConfig.of([int(v) for v in launch.split(",")])
    try:
        yield
    finally:
        for table, kept in zip(dicts, saved_dicts, strict=True):
            table.clear()
            table.update(kept)
        for (mod, name), value in saved.items():
            setattr(mod, name, value)


ATTENTION_FLAGS = ("SPLITS_PER_WAVE", "LAUNCH_PDL", "NEW_IN_REGISTERS")
ATTENTION_COUNTS = ("MERGE_LOADS",)


def one_token_launch(real, value: str):
    """``attention._attention`` launching one-token rows as ``value`` says (part,block,warps...)."""
    launch = tuple(int(v) for v in value.split(","))

    def launched(q, k_cache, v_cache, slots, start, tree, h, rope, launch_=None, out_scale=None):
        if launch_ is None and q.shape[1] == 1:
            launch_ = launch
        return real(q, k_cache, v_cache, slots, start, tree, h, rope, launch_, out_scale)

    return launched


CONTEXT = 0  # cached positions the probed step attends over (--context)


def graph_ms(graphs, reps: int = 50) -> float:
    """Capture the (1, 1) decode graph anew and time its replay (median of 3 timings), the
    step's token at position :data:`CONTEXT`."""
    return sorted(replay_ms(decode_graph(graphs), reps) for _ in range(3))[1]


def decode_graph(graphs, warm: int = 0) -> torch.cuda.CUDAGraph:
    """The (1, 1) decode graph captured anew, its token at position :data:`CONTEXT`, replayed
    ``warm`` times."""
    graphs.graphs.clear()
    graphs.capture(1, 1)
    graph, inp, _ = graphs.graphs[(1, 1)]
    inp.start.fill_(CONTEXT)
    inp.positions.fill_(CONTEXT)
    for _ in range(warm):
        graph.replay()
    torch.cuda.synchronize()
    return graph


def kernel_profile(graphs, reps: int = 10) -> list[dict]:
    """Kernels of ``reps`` replays of the (1, 1) graph: name, count per step, us per step."""
    graph = decode_graph(graphs, warm=3)
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if us:
            rows.append(
                {"kernel": e.key[:90], "per_step": e.count / reps, "us_per_step": us / reps}
            )
    return sorted(rows, key=lambda r: -r["us_per_step"])[:30]


def kernel_timeline(graphs, reps: int = 5) -> dict:
    """Each kernel's share of the (1, 1) graph's critical path, from the profiler's timestamps.

    A step is a chain (each kernel waits on the one before it; PDL starts it early, so its own
    duration includes waiting): a kernel's segment is its end minus the previous kernel's end.
    Kernels are told apart by name and grid (the products' grids differ); per step, the median
    over ``reps`` replays. ``layer``: one middle layer's kernels in order."""
    graph = decode_graph(graphs, warm=3)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.replay()
            torch.cuda.synchronize()
    return timeline(trace_events(prof), reps)


def timeline(events: list[dict], reps: int) -> dict:
    """:func:`kernel_timeline`'s figures from a Chrome trace's events of ``reps`` replays."""
    kernels = sorted(
        (e for e in events if e.get("cat") == "kernel" and "dur" in e), key=lambda e: e["ts"]
    )
    per = len(kernels) // reps
    steps = [kernels[i * per : (i + 1) * per] for i in range(reps)]
    tables: list[dict[str, list[float]]] = []
    spans = []
    for step in steps:
        table: dict[str, list[float]] = {}
        prev_end = step[0]["ts"]
        for e in step:
            end = e["ts"] + e["dur"]
            key = f"{e['name'][:60]} grid={e.get('args', {}).get('grid', '')}"
            table.setdefault(key, []).append(max(0.0, end - prev_end))
            prev_end = max(prev_end, end)
        tables.append(table)
        spans.append(prev_end - step[0]["ts"])
    rows = []
    for key in tables[0]:
        sums = sorted(sum(t.get(key, [])) for t in tables)
        rows.append({"kernel": key, "per_step": len(tables[0][key]),
                     "segment_us_per_step": round(sums[len(sums) // 2], 2)})  # fmt: skip
    # one middle layer, in order: from two kernels before an attention to two before the next
    mid = steps[len(steps) // 2]
    attn = [i for i, e in enumerate(mid) if "attn" in e["name"]]
    order = []
    if len(attn) > 2:
        j = len(attn) // 2
        lo, hi = attn[j] - 2, attn[j + 1] - 2
        for prev, e in zip(mid[lo - 1 : hi - 1], mid[lo:hi], strict=True):
            gap = e["ts"] + e["dur"] - (prev["ts"] + prev["dur"])
            order.append([e["name"][:40], e.get("args", {}).get("grid"), round(gap, 2)])
    return {
        "kernels_per_step": per,
        "span_us": sorted(spans)[len(spans) // 2],
        "segments": sorted(rows, key=lambda r: -r["segment_us_per_step"]),
        "layer": order,
    }


def probe(quantization: str, variants: list[str], ablate: bool) -> dict:
    t0 = time.perf_counter()
    eng = engine_runs.engine(quantization, FP8_SHAPE)
    graphs = eng.runner.graphs
    fwd = graphs.forward
    res: dict = {"load_s": time.perf_counter() - t0, "whole_ms": graph_ms(graphs)}
    ablations = {
        "no_row_kernels": [static_rows],
        "no_attention": [static_attention],
        "no_head": [lambda: static_head(fwd)],
        "no_rows_no_attention": [static_rows, static_attention],
        "no_layers": [lambda: no_layers(fwd)],
    }
    for name, parts in ablations.items() if ablate else ():
        with contextlib.ExitStack() as stack:
            for part in parts:
                stack.enter_context(part())
            res[name + "_ms"] = graph_ms(graphs)
        print(name, round(res[name + "_ms"], 4), flush=True)
    for i, spec in enumerate(variants):
        if not quantization.startswith("fp8"):  # the variants set the fp8 GEMV only
            continue
        if i == len(variants) // 2 and i:  # the shipped graph again, halfway (the drift)
            res["whole_mid_ms"] = graph_ms(graphs)
        try:
            with variant(spec):
                res[f"variant {spec}"] = graph_ms(graphs)
        except Exception as exc:  # a launch shape that does not compile: reported, skipped
            res[f"variant {spec}"] = repr(exc)[:300]
        print(spec, res[f"variant {spec}"], flush=True)
    res["whole_again_ms"] = graph_ms(graphs)
    res["winners"] = winners(res)
    res["combined"] = ";".join(spec for spec, _ in res["winners"].values())
    try:
        res["timeline"] = kernel_timeline(graphs)
    except Exception as exc:  # a profiler without CUPTI: the timings stand alone
        res["timeline"] = repr(exc)[:300]
    try:
        res["profile"] = kernel_profile(graphs)
    except Exception as exc:  # a profiler without CUPTI: the timings stand alone
        res["profile"] = repr(exc)[:300]
    return res


def winners(res: dict, margin: float = 0.003) -> dict[str, tuple[str, float]]:
    """The fastest variant of each setting (a launch table's key, or a flag) that beat the
    shipped graph by more than ``margin`` of it and by more than the spread of the shipped
    graph's own timings (start, halfway, end): setting -> (variant, ms)."""
    shipped = [res[k] for k in ("whole_ms", "whole_mid_ms", "whole_again_ms") if k in res]
    ref, spread = sum(shipped) / len(shipped), max(shipped) - min(shipped)
    best: dict[str, tuple[str, float]] = {}
    for key, ms in res.items():
        if not key.startswith("variant ") or not isinstance(ms, float):
            continue  # a variant that failed holds its error
        spec = key.removeprefix("variant ")
        # a table entry (cfg=NxK:..., glu=..., row=K,pro:...) is its key; a flag, its name
        setting = spec.split(":")[0] if ":" in spec else spec.split("=")[0]
        if ms < ref - max(margin * ref, spread) and ms < best.get(setting, ("", ref))[1]:
            best[setting] = (spec, ms)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="fp8_step_probe.json")
    parser.add_argument("--quantizations", nargs="+", default=["fp8"])
    parser.add_argument("--variants", nargs="*", default=["GLU=0"])
    parser.add_argument("--ablate", action="store_true", help="also the ablations")
    parser.add_argument("--context", type=int, default=0,
                        help="cached positions the step attends over (0: the first token)")  # fmt: skip
    args = parser.parse_args()
    global CONTEXT
    CONTEXT = args.context
    out: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": FP8_SHAPE,
                 "context": CONTEXT}  # fmt: skip
    for q in args.quantizations:
        out[q] = probe(q, args.variants, args.ablate)
        torch.cuda.empty_cache()
        Path(args.out).write_text(json.dumps(out, indent=1))
    print(json.dumps({q: {k: v for k, v in out[q].items() if k != "profile"}
                      for q in args.quantizations}))  # fmt: skip


if __name__ == "__main__":
    main()
