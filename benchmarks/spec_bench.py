"""Speculative decoding speed on the default model (CPU): none vs n-gram vs ReDrafter vs EAGLE-3.

One run, one engine, the agent's prompts (its template for the model, tools on) for the first
20 problems of ../shared/datasets/gsm8k_test.jsonl, greedy, one request at a time. Methods are
interleaved per problem so that load on a shared machine hits them alike. Prints JSON: decode
tokens/s, acceptance length (tokens per target forward) and accepted/drafted per method, each
method's speedup over plain decoding of the same run, whether outputs equal plain greedy, and
where a speculative step's time goes (drafting vs the verify forward, ms per step) against a
plain decode step.

    python benchmarks/spec_bench.py [--limit 20] [--max-tokens 128] [--draft-len 3]
                                    [--config float32|bfloat16|int4] [--eagle3 DIR | --no-eagle3]

``float32`` is the engine's default CPU configuration; ``bfloat16`` dense weights (AMX); ``int4`` its quantised CPU path (4-bit
weights, int8 head, bf16 activations), where the drafter runs through the same int8 head.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from engine_bench import CONFIGS, agent_prompts  # the engine bench's configurations, prompts

from mathagent.config import EngineSettings, Settings
from mathagent.model_store import resolve_model
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.sampling_params import SamplingParams
from mathagent.serving.engine.spec_decode.stats import SpecStats

REPO = Path(__file__).resolve().parents[1]
DRAFTER = REPO / "mathagent" / "serving" / "drafters" / "SmolLM2-135M-Instruct"
EAGLE3 = REPO / "mathagent" / "serving" / "drafters" / "SmolLM2-135M-Instruct-eagle3"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--draft-len", type=int, default=3)
    parser.add_argument("--beams", type=int, default=None, help="ReDrafter beams (default: config)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--drafter", type=Path, default=DRAFTER)
    parser.add_argument("--eagle3", type=Path, default=EAGLE3, help="EAGLE-3 head folder")
    parser.add_argument("--no-eagle3", action="store_true", help="leave EAGLE-3 out")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="float32")
    args = parser.parse_args()
    torch.manual_seed(0)
    settings = EngineSettings(
        device="cpu", max_batch_size=1, max_seq_len=1024, **CONFIGS[args.config],
        draft_len=args.draft_len, threads=args.threads,
        **({"draft_beams": args.beams} if args.beams else {}),
    )  # fmt: skip
    model_dir = Settings().model_dir
    config = EngineConfig.from_settings(settings, resolve_model(None, model_dir))
    engine = LLMEngine(config, model_dir)
    prompts = agent_prompts(engine, args.limit)
    methods = ["none", "ngram", f"redrafter:{args.drafter}"]
    if not args.no_eagle3:
        methods.append(f"eagle3:{args.eagle3}")
    seconds = dict.fromkeys(methods, 0.0)
    wall = dict.fromkeys(methods, 0.0)
    tokens = dict.fromkeys(methods, 0)
    stats = {m: SpecStats() for m in methods}
    outputs: dict[str, list[list[int]]] = {m: [] for m in methods}
    engine.generate(prompts[:1], SamplingParams(max_tokens=4, temperature=0.0))  # warm-up
    for prompt in prompts:
        for method in methods:
            params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, speculative=method)
            start = time.perf_counter()
            (res,) = engine.generate([prompt], params)
            wall[method] += time.perf_counter() - start
            m = res.metrics
            # decode speed: tokens after the first (which the prefill makes) over their time
            if m.decode_s and len(res.token_ids) > 1:
                tokens[method] += len(res.token_ids) - 1
                seconds[method] += m.decode_s
            outputs[method].append(res.token_ids)
            if m.speculative is not None:
                stats[method].merge(m.speculative)
    base_tps = tokens["none"] / seconds["none"]
    report = {
        "model": engine.model_name,
        "device": "cpu",
        "config": args.config,
        "threads": args.threads,
        "problems": len(prompts),
        "max_tokens": args.max_tokens,
        "draft_len": args.draft_len,
        "beams": engine.config.draft_beams,
        "methods": {},
    }
    for method in methods:
        tps = tokens[method] / seconds[method]
        entry = {
            "decode_tokens_per_s": round(tps, 2),
            "speedup": round(tps / base_tps, 3),
            "tokens": tokens[method],
            "end_to_end_s": round(wall[method], 2),
            "identical_to_plain_greedy": outputs[method] == outputs["none"],
        }
        if method != "none":
            d = stats[method].as_dict()
            entry.update({k: d[k] for k in ("acceptance_length", "drafted_tokens", "accepted_tokens",
                                             "acceptance_rate", "per_position_acceptance",
                                             "draft_ms_per_step", "verify_ms_per_step")})  # fmt: skip
        else:
            entry["acceptance_length"] = 1.0
            entry["ms_per_step"] = round(1000 / tps, 3)
        report["methods"][method.split(":")[0]] = entry
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
