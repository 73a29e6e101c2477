"""The default model with its trained drafter on the GPU path: real acceptance, real speed.

Same workload as ``benchmarks/spec_bench.py`` (the agent's prompts for the first GSM8K test
problems, tools on, greedy, one request at a time, methods interleaved per problem), but on
the engine's CUDA path (CUDA graphs; ``eager`` off) and with the problems read from a JSONL
path, since ``../shared`` does not travel to the GPU machine. Reports per method (none,
ngram, redrafter:DIR, eagle3:DIR) decode tokens/s, speedup over plain decoding of the same run, acceptance
length (tokens per target forward), accepted/drafted, and whether the outputs equal plain
greedy token for token. Used by ``gpu_bench.py --default-model``; runs alone too:

    python benchmarks/gpu_default_model.py --default-model MODEL.gguf|DIR --drafter DIR \
        --prompts gsm8k_test.jsonl [--default-device cuda] [--default-limit 20] [--eagle3 DIR]

EAGLE-3 runs in an engine of its own: a loaded head makes every target forward keep the
low/middle/high streams it fuses (the CUDA graphs return them) and sends them to its feature
sink, so no plain step runs ahead there; its speedup is against the first engine's plain
decoding, and the head's engine's own plain rate is reported beside it (``none_eager``).
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from gpu_common import load_fused_table

from mathagent.config import EngineSettings, Settings
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.sampling_params import SamplingParams
from mathagent.serving.engine.spec_config import embedded_method
from mathagent.serving.engine.spec_decode.policy import DraftPolicy
from mathagent.serving.engine.spec_decode.stats import SpecStats


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The section's options (shared with gpu_bench.py)."""
    group = parser.add_argument_group("default model (skipped unless --default-model is given)")
    group.add_argument("--default-model", help="GGUF file or Hugging Face folder of the model")
    group.add_argument("--drafter", type=Path, help="ReDrafter checkpoint folder for the model")
    group.add_argument("--prompts", type=Path, help="JSONL of problems (id, problem, answer)")
    group.add_argument("--default-limit", type=int, default=20, help="first N problems")
    group.add_argument("--default-max-tokens", type=int, default=128)
    group.add_argument("--default-draft-len", type=int, default=3)
    group.add_argument("--default-beams", type=int, help="draft beams (default: the engine's)")
    group.add_argument("--eagle3", type=Path, help="EAGLE-3 head folder (timed in its own engine)")
    group.add_argument("--default-methods", default="ngram,redrafter",
                       help="speculative methods of the graph engine, comma-separated")  # fmt: skip
    group.add_argument("--default-device", default="cuda", help="cuda (graphs) or cpu (eager)")
    group.add_argument("--default-dtype", default="float32", choices=["float32", "bfloat16"])
    group.add_argument("--default-temperature", type=float, default=0.0,
                       help="sample at this temperature (seeded per problem) instead of greedy")  # fmt: skip
    group.add_argument("--default-top-p", type=float, default=1.0,
                       help="top-p of the sampled runs (below 1: the warp sorts the vocabulary)")  # fmt: skip
    group.add_argument("--model-dir", type=Path, help="where a GGUF is converted (default: temp)")
    group.add_argument("--default-batch", type=int, default=1,
                       help="problems decoded together (>1: tok/s from each group's wall time)")  # fmt: skip
    group.add_argument("--default-policy", default="both", choices=["auto", "fixed", "both"],
                       help="draft-length policy of the speculative methods (both: each twice)")  # fmt: skip
    group.add_argument("--no-lookup-branch", action="store_true",
                       help="EAGLE-3 chains without the prompt-lookup branch beside them")  # fmt: skip
    group.add_argument("--lookup-len", default="auto",
                       help="drafts of the lookup branch (auto: the engine's; N: at least the "
                       "chain's, so N = the draft length keeps the branches even)")  # fmt: skip
    group.add_argument("--no-fused-rows", action="store_true",
                       help="no layer takes the fused skinny form (cuda/skinny.py FUSED_CONFIGS "
                            "emptied): the path before run 59, for an A/B in one run")  # fmt: skip
    group.add_argument("--one-graph-drafters", choices=["on", "off"],
                       help="ReDrafter and draft-model steps in one graph (redrafter_device / "
                            "draft_model_device ENABLED) or on the general path; default: "
                            "the modules' own setting")  # fmt: skip
    group.add_argument("--draft-top-p", choices=["on", "off"],
                       help="sampled EAGLE-3 chains drawn with the row's top-p cut (on) or at "
                            "its temperature and top-k only (off, the default; "
                            "eagle3_chain.DRAFT_TOP_P)")  # fmt: skip
    group.add_argument("--chain-glue", choices=["on", "off"],
                       help="the chain step's verify inputs, K/V moves and advance as three Triton "
                            "kernels (on, the default) or PyTorch (cuda.chain_glue.ENABLED)")  # fmt: skip
    group.add_argument("--split-heads", choices=["on", "off"],
                       help="a verify step's attention in one program per query head (on, the "
                            "default) or per KV head (cuda.attention.SPLIT_HEADS)")  # fmt: skip
    group.add_argument("--wide-partition", type=int,
                       help="cached positions per attention program of a wide verify step at "
                            "batch 1-2 (cuda.attention.WIDE_PARTITION)")  # fmt: skip
    group.add_argument("--split-argmax", choices=["on", "off"],
                       help="greedy argmax over the vocabulary in the split kernel (on, the "
                            "default) or torch.argmax (cuda.argmax.ENABLED)")  # fmt: skip
    group.add_argument("--probe-budget", type=float,
                       help="share of plain time the draft-length policy's probes may cost "
                            "(spec_decode.policy._BUDGET)")  # fmt: skip
    group.add_argument("--policy-trace", action="store_true",
                       help="record the auto policy's calls in order (choose, observed, "
                            "caught_up, accepted); each choice with the fused steps claimed "
                            "so far")  # fmt: skip
    group.add_argument("--fused-table", help="fused_rows_sweep.py --table-out JSON: these "
                       "launch shapes replace cuda/skinny.py FUSED_CONFIGS")  # fmt: skip


def agent_prompts(engine: LLMEngine, path: Path, limit: int) -> list[str]:
    """The agent's rendered prompts (tools on) for the first ``limit`` problems of ``path``;
    rows that carry a rendered ``prompt`` already (made where the agent's dependencies are
    installed: ``--render-prompts OUT``) are used as they are."""
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()][:limit]
    if all("prompt" in r for r in rows):
        return [r["prompt"] for r in rows]
    from mathagent.agent.plan import agent_prompt
    from mathagent.agent.prompts import ChatTemplate

    settings = Settings()
    chat = ChatTemplate(engine.tokenizer)
    return [
        agent_prompt(settings.agent, engine.model_name, r["problem"], chat_template=chat)
        for r in rows
    ]


def make_engine(args: argparse.Namespace, model_dir: Path, graphs: bool = True) -> LLMEngine:
    beams = getattr(args, "default_beams", None)
    settings = EngineSettings(
        device=args.default_device, dtype=args.default_dtype, max_seq_len=2048,
        max_batch_size=max(1, getattr(args, "default_batch", 1)),  # rows decoded together
        draft_len=args.default_draft_len,
        eager=not (graphs and args.default_device.startswith("cuda")),
        lookup_branch=not getattr(args, "no_lookup_branch", False),
        lookup_len=getattr(args, "lookup_len", "auto"),  # "auto" or a number: the setting parses it
        **({"draft_beams": beams} if beams else {}),
    )  # fmt: skip
    return LLMEngine(EngineConfig.from_settings(settings, model=args.default_model), model_dir)


def _first_difference(a: list[int], b: list[int]) -> int:
    """The first token index where two outputs differ (the shorter length if one extends the
    other)."""
    return next(
        (j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


# option -> the module setting it sets ("a+b.NAME": in both modules); "on" / "off" as booleans
_SWITCHES = {
    "draft_top_p": "spec_decode.eagle3_chain.DRAFT_TOP_P",
    "probe_budget": "spec_decode.policy._BUDGET",
    "chain_glue": "cuda.chain_glue.ENABLED",
    "split_heads": "cuda.attention.SPLIT_HEADS",
    "wide_partition": "cuda.attention.WIDE_PARTITION",
    "split_argmax": "cuda.argmax.ENABLED",
    "one_graph_drafters": "spec_decode.redrafter_device+spec_decode.draft_model_device.ENABLED",
}


def run(args: argparse.Namespace) -> dict:
    """Time none / ngram / redrafter (and eagle3) on the default model; the section's JSON."""
    if not (args.drafter and args.prompts):
        raise SystemExit("--default-model needs --drafter DIR and --prompts JSONL")
    if getattr(args, "fused_table", None):
        load_fused_table(args.fused_table)
    if getattr(args, "no_fused_rows", False):
        from mathagent.serving.engine.cuda import skinny

        skinny.FUSED_CONFIGS.clear()
    for option, target in _SWITCHES.items():  # the A/B switches: module settings
        value = getattr(args, option, None)
        if value is not None:
            module, _, name = target.rpartition(".")
            for mod in module.split("+"):
                setattr(importlib.import_module(f"mathagent.serving.engine.{mod}"), name,
                        value == "on" if value in ("on", "off") else value)  # fmt: skip
    named = {"ngram": "ngram", "redrafter": f"redrafter:{args.drafter}"}
    spec = [named[m] for m in getattr(args, "default_methods", "ngram,redrafter").split(",") if m]
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir or Path(tmp)
        engine = make_engine(args, model_dir)
        prompts = agent_prompts(engine, args.prompts, args.default_limit)
        timed = time_methods(engine, args, prompts, spec)
        out = report(engine, args, prompts, timed)
        if getattr(args, "eagle3", None):
            del engine  # one model on the device at a time
            eagle = make_engine(args, model_dir)  # its own engine (graphs keep its streams)
            extra = time_methods(eagle, args, prompts, [f"eagle3:{args.eagle3}"])
            extra["outputs"]["reference"] = timed["outputs"]["none"]  # the graph engine's plain
            plain = out["methods"]["none"]["decode_tokens_per_s"]
            whole = out["methods"]["none"]["whole_request_tokens_per_s"]
            for name, entry in report(eagle, args, prompts, extra)["methods"].items():
                entry["speedup"] = round(entry["decode_tokens_per_s"] / plain, 3)
                entry["whole_request_speedup"] = round(
                    entry["whole_request_tokens_per_s"] / whole, 3
                )
                out["methods"]["none_eager" if name == "none" else name] = entry
        return out


def time_methods(engine: LLMEngine, args: argparse.Namespace, prompts: list[str],
                 spec: list[str]) -> dict:  # fmt: skip
    """Decode totals, speculation stats and greedy outputs of none + ``spec``, interleaved
    per problem, each speculative method with its own policy."""
    modes = ["auto", "fixed"] if args.default_policy == "both" else [args.default_policy]
    methods = ["none"] + [f"{m}@{mode}" for m in spec for mode in modes]
    policies = {m: DraftPolicy(args.default_draft_len, m.endswith("@auto")) for m in methods}
    traces = {m: trace_policy(policies[m], lambda m=m: _claimed(engine, m)) for m in methods
              if m.endswith("@auto") and getattr(args, "policy_trace", False)}  # fmt: skip
    totals = {m: {"tokens": 0, "seconds": 0.0, "wall": 0.0, "ahead": 0, "all_tokens": 0}
              for m in methods}  # fmt: skip
    stats = {m: SpecStats() for m in methods}
    outputs: dict[str, list[list[int]]] = {m: [] for m in methods}
    timelines: dict[str, dict[str, list[float]]] = {m: {} for m in methods}
    temperature = getattr(args, "default_temperature", 0.0)
    top_p = getattr(args, "default_top_p", 1.0)
    size = max(1, getattr(args, "default_batch", 1))
    # warm-up: each method's graphs captured outside the timing, at every batch bucket a group
    # passes through as its rows finish (run 92, batch 8: captures inside the timed runs)
    buckets = sorted({min(size, 1 << i) for i in range(size.bit_length() + 1)})
    for method, rows in itertools.product(methods, buckets):
        engine.speculator.policy = DraftPolicy(args.default_draft_len, False)  # every step drafts
        engine.generate(prompts[:rows], SamplingParams(max_tokens=8, temperature=temperature,
                                                       top_p=top_p, seed=0,
                                                       speculative=method.split("@")[0]))  # fmt: skip
    for n, group in enumerate(prompts[i : i + size] for i in range(0, len(prompts), size)):
        # the speculative methods take turns going first: a fixed order gave the auto policy
        # the first run of every problem, and taking turns moved the auto/fixed gap from 7.9%
        # to 4.2% (H200, bf16, runs 52-53; the rest is not located)
        turn = n % max(1, len(methods) - 1)
        # every method starts from the same cache: the prompt cached but its last token (the
        # first method timed would otherwise pay the prefill the others reuse)
        engine.generate(group, SamplingParams(max_tokens=1, temperature=0.0))
        for method in methods[:1] + methods[1:][turn:] + methods[1:][:turn]:
            params = SamplingParams(max_tokens=args.default_max_tokens, temperature=temperature,
                                    top_p=top_p, seed=n, speculative=method.split("@")[0])  # fmt: skip
            engine.speculator.policy = policies[method]  # each method learns its own
            claimed, start = _claimed(engine, method), time.perf_counter()
            steps = {place: len(ts) for place, ts in timelines[method].items()}
            results = _generate(engine, group, params, timelines[method])
            wall = time.perf_counter() - start
            totals[method]["wall"] += wall
            totals[method]["all_tokens"] += sum(len(r.token_ids) for r in results)
            totals[method]["ahead"] += _claimed(engine, method) - claimed
            for res in results:
                m = res.metrics
                if m.decode_s and len(res.token_ids) > 1:  # the prefill makes the first token
                    totals[method]["tokens"] += len(res.token_ids) - 1
                    totals[method]["seconds"] += m.decode_s if size == 1 else 0.0
                outputs[method].append(res.token_ids)
                if m.speculative is not None:
                    stats[method].merge(m.speculative)
            if size > 1:  # rows overlap: the group's decode steps are what they cost together
                totals[method]["seconds"] += sum(
                    sum(ts[steps.get(place, 0) :])
                    for place, ts in timelines[method].items()
                    if place != "prefill"
                )
    return {"methods": methods, "totals": totals, "stats": stats, "outputs": outputs,
            "timelines": timelines, "policies": policies, "traces": traces}  # fmt: skip


def trace_policy(policy: DraftPolicy, claimed) -> list[list]:
    """Record ``policy``'s calls in order, in place: [name, its arguments (seconds in ms), and
    for choose its answer and the fused steps claimed so far]; a probe of where the auto
    policy's inputs come from (which steps it times, after what, launched ahead or not). Its own
    host work (microseconds a call) falls into the steps the policy times."""
    events: list[list] = []
    for name in ("choose", "observed", "caught_up", "accepted"):
        real = getattr(policy, name)

        def wrapped(*a, _real=real, _name=name):
            out = _real(*a)
            args = [round(1e3 * x, 4) if isinstance(x, float) else x for x in a]
            events.append([_name, *args, *([out, claimed()] if _name == "choose" else [])])
            return out

        setattr(policy, name, wrapped)
    return events


def _generate(engine: LLMEngine, prompts: list[str], params: SamplingParams,
              timeline: dict[str, list[float]]) -> list:  # fmt: skip
    """``engine.generate``'s loop, timing each step by its place in a request's life: the
    prefill, the first decode step (a drafter settles on the prompt; nothing was launched
    ahead), the middle steps and the last (where a step launched ahead is thrown away), so a
    per-request cost beside the steady step shows (GPU_NOTES, run 53: ~3.6 ms a request)."""
    ids = [engine.add_request(p, params) for p in prompts]
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    done: dict[str, object] = {}
    while len(done) < len(ids):
        t0 = time.perf_counter()
        outs = engine.step()
        dt = time.perf_counter() - t0
        place = "middle"
        for out in outs:
            if not tokens[out.request_id]:
                place = "prefill"
            elif out.finished:
                place = "last"
            elif len(tokens[out.request_id]) == 1 and place == "middle":
                place = "first_decode"
            tokens[out.request_id] += out.delta_token_ids
            if out.finished:
                done[out.request_id] = out
        timeline.setdefault(place, []).append(dt)
    return [SimpleNamespace(token_ids=tokens[i], metrics=done[i].metrics) for i in ids]


def _claimed(engine: LLMEngine, method: str) -> int:
    """Steps launched ahead and then used: plain decode's lookahead, or a method's one-graph
    steps (fused EAGLE-3 chains)."""
    spec = method.split("@")[0]
    if spec == "none":
        return getattr(engine.runner.lookahead, "claimed", 0)
    proposer = engine.speculator.proposer(embedded_method(spec))
    return getattr(getattr(proposer, "steps", None), "claimed", 0)


def report(engine: LLMEngine, args: argparse.Namespace, prompts: list[str], timed: dict) -> dict:
    """The section's JSON of one engine's timings; outputs are compared with ``reference``
    (another engine's plain greedy) when given, else with this engine's plain greedy."""
    totals, outputs = timed["totals"], timed["outputs"]
    reference = outputs.get("reference", outputs["none"])
    base = totals["none"]["tokens"] / max(totals["none"]["seconds"], 1e-9)
    base_whole = totals["none"]["all_tokens"] / max(totals["none"]["wall"], 1e-9)
    out = {"model": engine.model_name, "device": str(engine.config.device),
           "dtype": str(engine.config.dtype).removeprefix("torch."),
           "cuda_graphs": engine.runner.graphs is not None, "problems": len(prompts),
           "max_tokens": args.default_max_tokens, "draft_len": args.default_draft_len,
           "beams": engine.config.draft_beams, "batch": getattr(args, "default_batch", 1),
           "lookup_branch": engine.config.lookup_branch,
           "lookup_len": getattr(args, "lookup_len", "auto"),
           "eagle3": str(args.eagle3) if getattr(args, "eagle3", None) else None,
           "prompts": str(args.prompts) if getattr(args, "prompts", None) else None,
           "temperature": getattr(args, "default_temperature", 0.0),
           "top_p": getattr(args, "default_top_p", 1.0),
           "methods": {}}  # fmt: skip
    for method in timed["methods"]:
        t = totals[method]
        tps = t["tokens"] / max(t["seconds"], 1e-9)
        whole = t["all_tokens"] / max(t["wall"], 1e-9)
        entry = {"decode_tokens_per_s": round(tps, 2), "speedup": round(tps / base, 3),
                 # every step of each request, its first included (from a cached prompt)
                 "whole_request_tokens_per_s": round(whole, 2),
                 "whole_request_speedup": round(whole / base_whole, 3),
                 "tokens": t["tokens"], "end_to_end_s": round(t["wall"], 3),
                 "identical_to_plain_greedy": outputs[method] == reference,
                 "steps_launched_ahead": t["ahead"]}  # fmt: skip
        if outputs[method] != reference:  # [problem, first differing token, its length]
            entry["divergent"] = [
                [i, _first_difference(a, b), len(a)]
                for i, (a, b) in enumerate(zip(outputs[method], reference, strict=True)) if a != b
            ]  # fmt: skip
        if method == "none":
            entry["acceptance_length"] = 1.0
        else:
            d = timed["stats"][method].as_dict()
            keys = ("acceptance_length", "drafted_tokens", "accepted_tokens", "acceptance_rate",
                    "per_position_acceptance", "draft_ms_per_step", "verify_ms_per_step")  # fmt: skip
            entry.update({k: d[k] for k in keys if k in d})
        if timed.get("timelines", {}).get(method):  # ms per step by place in a request
            entry["step_ms_by_place"] = {
                place: {"steps": len(ts), "mean_ms": round(1e3 * sum(ts) / len(ts), 4)}
                for place, ts in timed["timelines"][method].items()
            }
        if method.endswith("@auto"):  # what the policy measured: its step ms per (bucket, k)
            entry["policy"] = timed["policies"][method].describe()
            if method in timed.get("traces", {}):
                entry["policy_trace"] = timed["traces"][method]
        kind, at, mode = method.partition("@")
        out["methods"][kind.split(":")[0] + at + mode] = entry
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    parser.add_argument("--render-prompts", type=Path, metavar="OUT",
                        help="write the --prompts rows with the agent's rendered prompt to OUT "
                             "(for a machine without the agent's dependencies) and stop")  # fmt: skip
    args = parser.parse_args()
    if not args.default_model:
        raise SystemExit("--default-model is required")
    if args.render_prompts:  # here, where the agent's dependencies are: the CPU engine
        rows = [json.loads(x) for x in args.prompts.read_text().splitlines() if x.strip()]
        args.default_device = "cpu"
        with tempfile.TemporaryDirectory() as tmp:
            engine = make_engine(args, args.model_dir or Path(tmp), graphs=False)
            rendered = agent_prompts(engine, args.prompts, args.default_limit)
        lines = [json.dumps({**r, "prompt": p}) for r, p in zip(rows, rendered, strict=False)]
        args.render_prompts.write_text("\n".join(lines) + "\n")
        return
    torch.manual_seed(0)
    print(json.dumps(run(args), indent=1))


if __name__ == "__main__":
    main()
