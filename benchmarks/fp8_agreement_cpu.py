"""How far the FP8 model strays from BF16 on the default model: greedy first divergence (CPU).

Not the issue's accuracy guard (that needs the eval on a Hopper GPU, where the engine runs
fp8); a CPU stand-in for its first-divergence statistics. The FP8 model here is the same codes,
scales and per-token activation rule as on CUDA, computed by the float32 reference
(``fp8_format.reference_linear``: :class:`Fp8Linear` off CUDA), so it matches the GPU's model
up to the order of float32 sums. Both run through ``LLMEngine`` on the agent's prompts (tools
on) for the first GSM8K test problems, greedy, bfloat16 activations; the FP8 model is handed to
the engine loaded, since the engine's settings refuse fp8 on a CPU. Run:

    flock /tmp/mathagent-bench.lock .venv/bin/python benchmarks/fp8_agreement_cpu.py \
        --prompts ../shared/datasets/gsm8k_test.jsonl --limit 10 --max-tokens 64
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
from gpu_default_model import agent_prompts

from mathagent.config import EngineSettings, Settings
from mathagent.model_store import resolve_model
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.fp8_calibration import calibrate
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.loader import load_model
from mathagent.serving.engine.quant import quantize_fp8
from mathagent.serving.engine.sampling_params import SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--activation-scales", choices=["auto", "calibrate"], default="auto",
                        help="calibrate: the FP8 model with static input scales "
                        "(MATHAGENT_ENGINE__FP8_ACTIVATION_SCALES=calibrate's calibration)")  # fmt: skip
    args = parser.parse_args()
    model_dir = Settings().model_dir
    spec = resolve_model(None, model_dir)
    settings = EngineSettings(device="cpu", dtype="bfloat16", max_batch_size=1, max_seq_len=2048)
    config = EngineConfig.from_settings(settings, spec)
    bf16 = LLMEngine(config, model_dir)
    fp8_loaded = load_model(spec, model_dir, config.device, torch.float32)
    fp8_loaded.model = quantize_fp8(fp8_loaded.model, torch.bfloat16)
    if args.activation_scales == "calibrate":
        calibrate(fp8_loaded.model, fp8_loaded.tokenizer, torch.bfloat16)
    fp8 = LLMEngine(replace(config, model=None), model_dir, fp8_loaded)
    prompts = agent_prompts(bf16, args.prompts, args.limit)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    rows, t0 = [], time.perf_counter()
    for prompt in prompts:
        (a,), (b,) = bf16.generate([prompt], params), fp8.generate([prompt], params)
        first = next(
            (i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False)) if x != y),
            None,
        )
        rows.append({"bf16_tokens": len(a.token_ids), "fp8_tokens": len(b.token_ids),
                     "first_divergence": first, "identical": a.token_ids == b.token_ids})  # fmt: skip
    firsts = [r["first_divergence"] for r in rows if r["first_divergence"] is not None]
    out = {"model": bf16.model_name, "activation_scales": args.activation_scales,
           "problems": len(rows), "max_tokens": args.max_tokens,
           "identical": sum(r["identical"] for r in rows),
           "median_first_divergence": sorted(firsts)[len(firsts) // 2] if firsts else None,
           "seconds": time.perf_counter() - t0, "rows": rows}  # fmt: skip
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
