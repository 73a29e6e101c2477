"""EAGLE-3 acceptance through the engine on the benchmark's prompts (no timing): tree and chain.

For the first ``--limit`` GSM8K test problems in the agent's prompt (as ``spec_bench.py``
renders them), greedy, one request at a time, CPU (float32 unless ``--dtype``): acceptance
length, accepted/drafted, per-position acceptance and whether the output equals plain greedy,
for a tree of 4 beams of 3 tokens and a chain of 5 tokens by default, every step drafting.
Prints JSON.

    python benchmarks/eagle3_acceptance.py [--limit 5] [--offset 0] [--max-tokens 64] [--eagle3 DIR]
                                           [--configs 4x3,1x5]  (beams x draft tokens)
                                           [--dtype float32|bfloat16] [--lookup-branch auto|on|off]
                                           [--lookup-len auto|N]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from spec_bench import EAGLE3, agent_prompts

from mathagent.config import EngineSettings, Settings
from mathagent.model_store import resolve_model
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.sampling_params import SamplingParams
from mathagent.serving.engine.spec_decode.stats import SpecStats

KEYS = ("acceptance_length", "drafted_tokens", "accepted_tokens", "per_position_acceptance")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument(
        "--offset", type=int, default=0, help="skip the first N (20: the head's held-out problems)"
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--eagle3", type=Path, default=EAGLE3)
    parser.add_argument(
        "--configs", default="4x3,1x5", help="beams x draft tokens, comma-separated"
    )
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument(
        "--lookup-branch",
        choices=["auto", "on", "off"],
        default="auto",
        help="verify the prompt-lookup chain beside EAGLE-3's (auto: off on a CPU)",
    )
    parser.add_argument(
        "--lookup-len",
        default="auto",
        help="drafts of the lookup branch (at least the chain's; auto: the chain's on a CPU)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    model_dir, out = Settings().model_dir, {}
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    for beams, length in configs:
        # every step drafts: the draft-length policy would choose plain for a wide tree
        settings = EngineSettings(device="cpu", max_batch_size=1, max_seq_len=1024,
                                  draft_beams=beams, draft_len=length, threads=1,
                                  adaptive_draft=False, dtype=args.dtype,
                                  lookup_branch=args.lookup_branch,
                                  lookup_len=args.lookup_len)  # fmt: skip
        engine = LLMEngine(EngineConfig.from_settings(settings, resolve_model(None, model_dir)),
                           model_dir)  # fmt: skip
        prompts = agent_prompts(engine, args.offset + args.limit)[args.offset :]
        greedy = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
        plain = [r.token_ids for r in engine.generate(prompts, greedy)]
        spec = greedy.model_copy(update={"speculative": f"eagle3:{args.eagle3}"})
        stats, same = SpecStats(), True
        for prompt, ref in zip(prompts, plain, strict=True):
            (res,) = engine.generate([prompt], spec)
            stats.merge(res.metrics.speculative)
            same &= res.token_ids == ref
        d = stats.as_dict()
        out[f"beams{beams}_len{length}"] = {k: d[k] for k in KEYS} | {
            "identical_to_plain_greedy": same
        }
    head = {
        "problems": args.limit,
        "offset": args.offset,
        "max_tokens": args.max_tokens,
        "dtype": args.dtype,
        "lookup_branch": args.lookup_branch,
        "lookup_len": args.lookup_len,
        "eagle3": str(args.eagle3),
    }
    print(json.dumps(head | out, indent=2))


if __name__ == "__main__":
    main()
