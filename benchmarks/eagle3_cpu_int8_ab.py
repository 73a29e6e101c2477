"""EAGLE-3 on the CPU int4 engine: the head's layer from int8 rows against float32, in turn.

One engine (int4, 2 threads), the agent's prompts for the first GSM8K test problems, greedy,
every step drafting 3 tokens (the draft-length policy off, so both sides draft the same steps);
the head's products swapped between runs of the same prompts, twice. Prints JSON: decode
tokens/s, acceptance length, per-position acceptance and drafting / verify ms a step.

    PYTHONPATH=.:benchmarks python benchmarks/eagle3_cpu_int8_ab.py [--limit 12] [--max-tokens 256]
"""

from __future__ import annotations

import argparse
import json

from engine_bench import CONFIGS, agent_prompts
from spec_bench import EAGLE3

from mathagent.config import EngineSettings, Settings
from mathagent.model_store import resolve_model
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.sampling_params import SamplingParams
from mathagent.serving.engine.spec_config import SpecMethod
from mathagent.serving.engine.spec_decode.policy import DraftPolicy
from mathagent.serving.engine.spec_decode.stats import SpecStats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    settings = EngineSettings(device="cpu", max_batch_size=2, max_seq_len=1024, threads=2,
                              **CONFIGS["int4_eagle3"])  # fmt: skip
    model_dir = Settings().model_dir
    engine = LLMEngine(EngineConfig.from_settings(settings, resolve_model(None, model_dir)),
                       model_dir)  # fmt: skip
    prompts = agent_prompts(engine, args.limit)
    engine.generate(prompts[:1], SamplingParams(max_tokens=8, temperature=0.0))  # loads the head
    mid = engine.speculator.proposer(SpecMethod("eagle3", str(EAGLE3))).head.midlayer
    int8 = mid.products
    runs = []
    for repeat in range(args.repeats):
        for name, products in (("float32", None), ("int8", int8)):
            mid.products = products
            engine.speculator.policy = DraftPolicy(engine.config.draft_len, adaptive=False)
            stats, tokens, seconds = SpecStats(), 0, 0.0
            for prompt in prompts:
                params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
                (res,) = engine.generate([prompt], params)
                stats.merge(res.metrics.speculative)
                tokens, seconds = tokens + len(res.token_ids) - 1, seconds + res.metrics.decode_s
            d = stats.as_dict()
            runs.append({"repeat": repeat, "head_products": name,
                         "decode_tokens_per_s": round(tokens / seconds, 2),
                         **{k: d[k] for k in ("acceptance_length", "per_position_acceptance",
                                              "draft_ms_per_step", "verify_ms_per_step")}})  # fmt: skip
    print(json.dumps({"model": engine.model_name, "config": "int4", "threads": 2,
                      "problems": len(prompts), "max_tokens": args.max_tokens,
                      "draft_len": engine.config.draft_len, "runs": runs}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
