"""Is speculation ever slower than plain decoding? The default model at batch 1, 8 and 32 (CPU).

One engine, the agent's prompts for the first GSM8K test problems (as ``spec_bench.py``), greedy,
``B`` requests decoding together; per batch size: plain, then each speculative method with the
draft-length policy on (``auto``, the default; warmed by one untimed pass, as a serving engine's
policy has timed earlier requests; then ``--pairs`` plain and auto passes in turn, the speedup
the median of the pairs' ratios) and off (``fixed``: every step drafts, beside one plain pass).
Steady tokens/s counts the steps while all ``B`` requests decode (``gpu_spec.timed``). Prints JSON.

    flock /tmp/mathagent-bench.lock python benchmarks/spec_batch_bench.py [--config int4]
"""

from __future__ import annotations

import argparse
import json
from statistics import median

import torch
from engine_bench import CONFIGS, agent_prompts
from gpu_spec import timed
from spec_bench import DRAFTER

from mathagent.config import EngineSettings, Settings
from mathagent.model_store import resolve_model
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.sampling_params import SamplingParams
from mathagent.serving.engine.spec_decode.policy import DraftPolicy
from mathagent.serving.engine.spec_decode.stats import SpecStats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="int4")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--methods", default=f"ngram,redrafter:{DRAFTER}")
    parser.add_argument("--pairs", type=int, default=3, help="plain / auto pairs per row")
    args = parser.parse_args()
    torch.manual_seed(0)
    batches = [int(b) for b in args.batches.split(",")]
    settings = EngineSettings(device="cpu", max_batch_size=max(batches), max_seq_len=1024,
                              threads=args.threads, **CONFIGS[args.config])  # fmt: skip
    model_dir = Settings().model_dir
    engine = LLMEngine(
        EngineConfig.from_settings(settings, resolve_model(None, model_dir)), model_dir
    )
    prompts = agent_prompts(engine, max(batches))
    report: dict = {"model": engine.model_name, "config": args.config, "threads": args.threads,
                    "max_tokens": args.max_tokens, "draft_len": engine.config.draft_len,
                    "beams": engine.config.draft_beams}  # fmt: skip
    for b in batches:
        rows = prompts[:b]
        plain_params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True)
        timed(engine, rows, SamplingParams(max_tokens=4, temperature=0.0))  # warm the prefixes
        plain = timed(engine, rows, plain_params)
        entry: dict = {"plain_tok_s": round(plain["tok_s"], 2)}
        for method in args.methods.split(","):
            name = method.split(":")[0]
            params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True,
                                    speculative=method)  # fmt: skip
            # auto: warmed by one untimed pass (a serving engine's policy has timed earlier
            # requests), then plain and auto in turn, the ratio taken pair by pair (the
            # machine's speed drifts by more than the differences measured here)
            engine.speculator.policy = DraftPolicy(engine.config.draft_len, True)
            timed(engine, rows, params)
            engine.speculator.stats = SpecStats()
            pairs = []
            for _ in range(args.pairs):
                base = timed(engine, rows, plain_params)
                run = timed(engine, rows, params)
                pairs.append((base["tok_s"], run["tok_s"], run["outputs"] == base["outputs"]))
            stats = engine.speculator.stats.as_dict()
            entry[f"{name}@auto"] = {
                "tok_s": round(median(p[1] for p in pairs), 2),
                "plain_tok_s": round(median(p[0] for p in pairs), 2),
                "speedup": round(median(p[1] / p[0] for p in pairs), 3),
                "speedups": [round(p[1] / p[0], 3) for p in pairs],
                "acceptance_length": stats["acceptance_length"],
                "spec_forwards": stats["target_forwards"],
                "identical_to_plain_greedy": all(p[2] for p in pairs),
                "policy": engine.speculator.policy.describe(),
            }
            engine.speculator.policy = DraftPolicy(engine.config.draft_len, False)
            engine.speculator.stats = SpecStats()
            base = timed(engine, rows, plain_params)
            run = timed(engine, rows, params)
            stats = engine.speculator.stats.as_dict()
            entry[f"{name}@fixed"] = {
                "tok_s": round(run["tok_s"], 2),
                "speedup": round(run["tok_s"] / base["tok_s"], 3),
                "acceptance_length": stats["acceptance_length"],
                "spec_forwards": stats["target_forwards"],
                "identical_to_plain_greedy": run["outputs"] == base["outputs"],
            }
        report[f"batch_{b}"] = entry
        print(json.dumps({f"batch_{b}": entry}), flush=True)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
