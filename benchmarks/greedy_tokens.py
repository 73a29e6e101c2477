"""Greedy tokens through ``LLMEngine``, to hold two versions of the code to the same output.

A kernel change that claims to leave the arithmetic alone (operands read earlier, another
launch, another warp count) is checked by running this script under both versions on one card
and comparing the JSON (``--compare``): every token of every prompt equal, on random weights
whose top logits nearly tie, says the model's function did not move, so accuracy measured
before the change still holds. Each run is ``<shape>:<quantization>`` as fp8_bench.py names
them (``none``, ``fp8``, ``fp8-static``, ``fp8-static-head``).

    PYTHONPATH=.:benchmarks python3 benchmarks/greedy_tokens.py --out a.json
    python3 benchmarks/greedy_tokens.py --compare a.json b.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RUNS = ["smollm2-135m:none", "smollm2-135m:fp8-static-head", "llama-3-8b:none",
        "llama-3-8b:fp8-static-head", "llama-3-8b:fp8"]  # fmt: skip


def tokens(run: str, n: int, length: int) -> list[list[int]]:
    """Greedy continuations of ``n`` random prompts, one request at a time (batch 1)."""
    import torch
    from engine_runs import engine as run_engine

    from mathagent.serving.engine.random_model import RANDOM_SHAPES
    from mathagent.serving.engine.sampling_params import SamplingParams

    shape, quantization = run.split(":")
    engine = run_engine(quantization, shape)
    params = SamplingParams(max_tokens=length, temperature=0.0, ignore_eos=True)
    vocab = RANDOM_SHAPES[shape]["vocab_size"]
    gen = torch.Generator().manual_seed(5)
    prompts = torch.randint(0, vocab, (n, 32), generator=gen).tolist()
    out = [engine.generate([p], params)[0].token_ids for p in prompts]
    del engine
    torch.cuda.empty_cache()
    return out


def compare(a: dict, b: dict) -> dict:
    """Per run: identical, and the first differing token of each prompt (None: equal)."""
    res = {}
    for run in sorted(set(a) & set(b)):
        first = [next((i for i, (x, y) in enumerate(zip(p, q, strict=False)) if x != y),
                      None if len(p) == len(q) else min(len(p), len(q)))
                 for p, q in zip(a[run], b[run], strict=True)]  # fmt: skip
        res[run] = {"identical": all(f is None for f in first), "first_difference": first}
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="greedy_tokens.json")
    parser.add_argument("--runs", nargs="+", default=RUNS)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--compare", nargs=2, metavar="JSON", help="compare two outputs")
    args = parser.parse_args()
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        res = compare(a, b)
        print(json.dumps(res))
        sys.exit(0 if all(r["identical"] for r in res.values()) else 1)
    out = {run: tokens(run, args.prompts, args.tokens) for run in args.runs}
    Path(args.out).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
