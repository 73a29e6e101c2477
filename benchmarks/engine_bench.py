"""Embedded engine vs transformers ``generate`` on the same weights, plus server concurrency.

Prints one JSON object: batch-1 decode tokens/s and time to first token of the engine and of
transformers (default model, CPU), and aggregate tokens/s with 1 and 8 concurrent requests
through the real OpenAI-compatible server. Fixed prompt, fixed lengths, greedy; each timing is
the best of ``--repeats`` runs (the machine is shared, so the best run is the least disturbed).

    python benchmarks/engine_bench.py [--threads 2] [--dtype float32] [--tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time

import torch

from mathagent.config import EngineSettings, Settings
from mathagent.serving.engine.config import EngineConfig, SamplingParams
from mathagent.serving.engine.llm_engine import LLMEngine

PROMPT = (
    "<|im_start|>user\nNatalia sold clips to 48 of her friends in April, and then she sold half "
    "as many clips in May. How many clips did Natalia sell altogether in April and May?"
    "<|im_end|>\n<|im_start|>assistant\n"
)


def engine_batch1(engine: LLMEngine, tokens: int) -> tuple[float, float]:
    """Decode tokens/s and TTFT of one request on the bare engine."""
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    (res,) = engine.generate([PROMPT], params)
    m = res.metrics
    return (m.generated_tokens - 1) / m.decode_s, m.ttft_s


def transformers_batch1(model, ids: torch.Tensor, tokens: int) -> tuple[float, float]:
    """Decode tokens/s and TTFT of transformers ``generate`` (greedy, KV cache)."""

    def timed(n: int) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return time.perf_counter() - start

    ttft, full = timed(1), timed(tokens)
    return (tokens - 1) / (full - ttft), ttft


def batch1(engine: LLMEngine, dtype: torch.dtype, tokens: int, repeats: int) -> dict:
    """Engine and transformers runs interleaved, so load from other processes hits both alike."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(engine.loaded.path, dtype=dtype).eval()
    ids = engine.tokenizer(PROMPT, return_tensors="pt", add_special_tokens=False).input_ids
    engine_batch1(engine, 4)  # warm-up
    transformers_batch1(model, ids, 4)
    ours, ref = [], []
    for _ in range(repeats):
        ours.append(engine_batch1(engine, tokens))
        ref.append(transformers_batch1(model, ids, tokens))

    def best(runs: list[tuple[float, float]]) -> dict[str, float]:
        return {
            "decode_tokens_per_s": round(max(r[0] for r in runs), 2),
            "ttft_s": round(min(r[1] for r in runs), 4),
        }

    return {"engine_batch1": best(ours), "transformers_batch1": best(ref)}


async def _aggregate(base_url: str, concurrency: int, tokens: int) -> float:
    import openai

    client = openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0)

    async def one() -> int:
        resp = await client.completions.create(
            model="bench", prompt=PROMPT, max_tokens=tokens, temperature=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        return resp.usage.completion_tokens

    start = time.perf_counter()
    counts = await asyncio.gather(*(one() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    await client.close()
    return sum(counts) / elapsed


def server_aggregate(engine: LLMEngine, tokens: int, repeats: int) -> dict[str, float]:
    """Aggregate generated tokens/s with 1 and 8 concurrent requests via the real server."""
    import uvicorn

    from mathagent.serving.server import create_app

    config = uvicorn.Config(create_app(engine), host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/v1"
    try:
        asyncio.run(_aggregate(url, 1, 4))  # warm-up
        runs: dict[int, list[float]] = {1: [], 8: []}
        for _ in range(repeats):  # interleaved, as in batch1
            for c in runs:
                runs[c].append(asyncio.run(_aggregate(url, c, tokens)))
        out = {f"concurrency_{c}_tokens_per_s": round(max(r), 2) for c, r in runs.items()}
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    out["scaling_8_over_1"] = round(
        out["concurrency_8_tokens_per_s"] / out["concurrency_1_tokens_per_s"], 2
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    settings = EngineSettings(device="cpu", dtype=args.dtype, max_batch_size=8, max_seq_len=1024)
    engine = LLMEngine(EngineConfig.from_settings(settings), Settings().model_dir)
    measured = batch1(engine, getattr(torch, args.dtype), args.tokens, args.repeats)
    ours, ref = measured["engine_batch1"], measured["transformers_batch1"]
    server = server_aggregate(engine, args.tokens, args.repeats)
    speedup = ours["decode_tokens_per_s"] / ref["decode_tokens_per_s"]
    result = {
        "model": engine.model_name,
        "device": "cpu",
        "dtype": args.dtype,
        "threads": args.threads,
        "decode_tokens": args.tokens,
        "engine_batch1": ours,
        "transformers_batch1": ref,
        "decode_speedup_vs_transformers": round(speedup, 2),
        "server": server,
        "goals": {
            "batch1_decode_2x_transformers": speedup >= 2.0,
            "concurrency_8_at_least_4x_of_1": server["scaling_8_over_1"] >= 4.0,
        },
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
