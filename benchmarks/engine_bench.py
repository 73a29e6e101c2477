"""Embedded engine vs transformers ``generate`` on the same weights, plus server concurrency.

Prints one JSON object: batch-1 decode tokens/s and time to first token of the engine and of
transformers (default model, CPU), and aggregate tokens/s with 1 and 8 concurrent requests
through the real OpenAI-compatible server (``mathagent serve`` in its own process), with prefix
caching (the default) and without. Fixed prompt, fixed lengths, greedy; each timing is
the best of ``--repeats`` runs (the machine is shared, so the best run is the least disturbed).

    python benchmarks/engine_bench.py [--threads 2] [--configs float32,int4,int4_redrafter]
                                      [--tokens 64] [--no-server]

With the benchmark extra installed (``pip install -e '.[bench]'``: llama-cpp-python), llama.cpp's
plain greedy decode of the same GGUF with the same thread count runs interleaved in the same
run, as the anchor a CPU user would pick instead.

``float32`` is the engine on the converted weights, as transformers runs them; ``int4`` keeps
the GGUF's own 4-bit blocks (an int8 head) with bfloat16 activations.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import torch

from mathagent.config import EngineSettings, Settings
from mathagent.model_store import resolve_model
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.sampling_params import SamplingParams

DATASET = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "gsm8k_test.jsonl"
PROMPT = (
    "<|im_start|>user\nNatalia sold clips to 48 of her friends in April, and then she sold half "
    "as many clips in May. How many clips did Natalia sell altogether in April and May?"
    "<|im_end|>\n<|im_start|>assistant\n"
)


def agent_prompts(engine: LLMEngine, limit: int) -> list[str]:
    """The agent's rendered prompts (tools on) for the first ``limit`` GSM8K test problems:
    what ``solve`` and ``eval`` send the engine."""
    from mathagent.agent.plan import agent_prompt
    from mathagent.agent.prompts import ChatTemplate

    settings = Settings()
    chat = ChatTemplate(engine.tokenizer)
    rows = [json.loads(x) for x in DATASET.read_text().splitlines()[:limit]]
    return [
        agent_prompt(settings.agent, engine.model_name, r["problem"], chat_template=chat)
        for r in rows
    ]


def rate(runs: list[tuple[int, float, float]]) -> tuple[float, float]:
    """Decode tokens/s over prompts (tokens after each first, over decode time) and mean TTFT,
    from one ``(tokens, decode_s, ttft_s)`` per prompt."""
    tokens, decode_s = sum(r[0] - 1 for r in runs), sum(r[1] for r in runs)
    return tokens / max(decode_s, 1e-9), sum(r[2] for r in runs) / len(runs)


def engine_batch1(
    engine: LLMEngine, prompts: list[str], tokens: int, natural: bool = False
) -> tuple[float, float, list[int]]:
    """Decode tokens/s and TTFT of one request at a time on the bare engine, and each prompt's
    generated length; ``natural``: each stops at the end-of-sequence token, as ``solve`` does
    (a drafter predicts a real answer, not what follows its end), else exactly ``tokens``."""
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=not natural)
    runs = []
    for prompt in prompts:
        (res,) = engine.generate([prompt], params)
        m = res.metrics
        runs.append((m.generated_tokens, m.decode_s, m.ttft_s))
    return (*rate(runs), [r[0] for r in runs])


def transformers_batch1(model, ids: list[torch.Tensor], lengths: list[int]) -> tuple[float, float]:
    """Decode tokens/s and TTFT of transformers ``generate`` (greedy, KV cache), prompt ``i``
    for ``lengths[i]`` tokens."""

    def timed(prompt: torch.Tensor, n: int) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return time.perf_counter() - start

    runs = []
    for prompt, n in zip(ids, lengths, strict=True):
        ttft, full = timed(prompt, 1), timed(prompt, max(n, 2))
        runs.append((max(n, 2), full - ttft, ttft))
    return rate(runs)


def llama_cpp_runner(gguf: str, threads: int, prompts: list[str]):
    """llama.cpp's plain greedy decode on the same GGUF and thread count, or None when the
    benchmark extra (``pip install -e .[bench]``: llama-cpp-python) is not installed."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(model_path=gguf, n_threads=threads, n_threads_batch=threads, n_ctx=2048,
                verbose=False)  # fmt: skip
    ids = [llm.tokenize(p.encode(), add_bos=False, special=True) for p in prompts]

    def one(prompt: list[int], tokens: int) -> tuple[int, float, float]:
        start, first = time.perf_counter(), 0.0
        # generate() never stops at EOS by itself: the run is exactly ``tokens`` long
        for count, _ in enumerate(llm.generate(prompt, temp=0.0, top_k=1, reset=True), start=1):
            if count == 1:
                first = time.perf_counter()
            if count == tokens:
                break
        return tokens, time.perf_counter() - first, first - start

    def run(lengths: list[int]) -> tuple[float, float]:
        """The first ``len(lengths)`` prompts, prompt ``i`` for ``lengths[i]`` tokens."""
        return rate([one(p, max(n, 2)) for p, n in zip(ids, lengths, strict=False)])

    return run


def batch1(
    engines: dict[str, LLMEngine],
    prompts: list[str],
    tokens: int,
    repeats: int,
    llama_cpp=None,
    natural: bool = False,
) -> dict:
    """Every engine, transformers (float32, the converted weights) and llama.cpp (when given)
    interleaved, so load from other processes hits all alike; transformers and llama.cpp
    generate as many tokens per prompt as the first engine did."""
    from transformers import AutoModelForCausalLM

    first = next(iter(engines.values()))
    model = AutoModelForCausalLM.from_pretrained(first.loaded.path, dtype=torch.float32).eval()
    ids = [
        first.tokenizer(p, return_tensors="pt", add_special_tokens=False).input_ids for p in prompts
    ]
    for engine in engines.values():
        engine_batch1(engine, prompts[:1], 4)  # warm-up
    transformers_batch1(model, ids[:1], [4])
    names = [*engines, "transformers"] + (["llama.cpp"] if llama_cpp else [])
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    if llama_cpp:
        llama_cpp([4])
    for _ in range(repeats):
        lengths = None
        for name, engine in engines.items():
            tok_s, ttft, made = engine_batch1(engine, prompts, tokens, natural)
            runs[name].append((tok_s, ttft))
            lengths = lengths or made
        runs["transformers"].append(transformers_batch1(model, ids, lengths))
        if llama_cpp:
            runs["llama.cpp"].append(llama_cpp(lengths))
    return {
        name: {
            "decode_tokens_per_s": round(max(r[0] for r in rs), 2),
            "ttft_s": round(min(r[1] for r in rs), 4),
        }
        for name, rs in runs.items()
    }


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


def server_aggregate(
    config: dict, threads: int, tokens: int, repeats: int, prefix_caching: bool, port: int
) -> dict[str, float]:
    """Aggregate generated tokens/s with 1 and 8 concurrent requests through ``mathagent serve``,
    run as its own process the way users run it (its engine thread alone owns torch's threads).
    Every request sends the same prompt, so with prefix caching all but the first reuse it."""
    from mathagent.serving.launchers.process import ServerProcess

    settings = {**config, "device": "cpu", "max_batch_size": 8, "max_seq_len": 1024}
    settings |= {"threads": threads, "prefix_caching": str(prefix_caching).lower()}
    env = {f"MATHAGENT_ENGINE__{key.upper()}": str(value) for key, value in settings.items()}
    argv = [sys.executable, "-m", "mathagent", "serve", "--engine", "embedded", "--port", str(port)]
    server = ServerProcess(argv, health_url=f"http://127.0.0.1:{port}/health", env=env, log=None)
    server.start()
    try:
        server.wait_healthy()
        base_url = f"http://127.0.0.1:{port}/v1"
        asyncio.run(_aggregate(base_url, 1, 4))  # warm-up
        runs: dict[int, list[float]] = {1: [], 8: []}
        for _ in range(repeats):  # interleaved, as in batch1
            for c in runs:
                runs[c].append(asyncio.run(_aggregate(base_url, c, tokens)))
    finally:
        server.stop()
    out = {f"concurrency_{c}_tokens_per_s": round(max(r), 2) for c, r in runs.items()}
    out["scaling_8_over_1"] = round(
        out["concurrency_8_tokens_per_s"] / out["concurrency_1_tokens_per_s"], 2
    )
    return out


DRAFTER = Path(__file__).resolve().parents[1] / "mathagent/serving/drafters/SmolLM2-135M-Instruct"
EAGLE3 = DRAFTER.with_name("SmolLM2-135M-Instruct-eagle3")
CONFIGS = {  # name -> engine settings; int4 is the fast CPU path (bf16 activations)
    "float32": dict(dtype="float32", quantization="none"),
    "bfloat16": dict(dtype="bfloat16", quantization="none"),
    "int4": dict(dtype="auto", quantization="int4"),
    # the default `solve` configuration on a CPU: float32 with the shipped drafter on top
    "float32_redrafter": dict(
        dtype="float32", quantization="none", speculative=f"redrafter:{DRAFTER}"
    ),
    # prompt lookup (n-gram) on the int4 path: no drafter weights, only the prompt's tokens
    "int4_ngram": dict(dtype="auto", quantization="int4", speculative="ngram"),
    # the int4 path with the shipped drafter on top (draft-length policy on, its default)
    "int4_redrafter": dict(dtype="auto", quantization="int4", speculative=f"redrafter:{DRAFTER}"),
    "int4_eagle3": dict(dtype="auto", quantization="int4", speculative=f"eagle3:{EAGLE3}"),
    "int4_eagle3_k2": dict(
        dtype="auto", quantization="int4", speculative=f"eagle3:{EAGLE3}", draft_len=2
    ),
    # the head's chain without the prompt-lookup branch beside it
    "int4_eagle3_alone": dict(
        dtype="auto", quantization="int4", speculative=f"eagle3:{EAGLE3}", lookup_branch=False
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--configs", default="float32,int4", help="engine configs to measure")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--port", type=int, default=8765, help="for the server processes")
    parser.add_argument("--no-server", action="store_true", help="batch-1 timings only")
    parser.add_argument("--prompts", default="chat", choices=["chat", "agent"],
                        help="batch-1 workload: one chat prompt for exactly --tokens, or the "
                             "agent's prompts for the first --agent-limit GSM8K test problems "
                             "(what solve sends), each to its end of sequence or --tokens; "
                             "transformers and llama.cpp generate as many tokens as the first "
                             "config did")  # fmt: skip
    parser.add_argument("--agent-limit", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    engines = {}
    model_dir = Settings().model_dir
    gguf = resolve_model(None, model_dir)
    for name in args.configs.split(","):
        settings = EngineSettings(device="cpu", max_batch_size=8, max_seq_len=1024, **CONFIGS[name])
        config = EngineConfig.from_settings(settings, gguf)
        engines[name] = LLMEngine(config, model_dir)
    first = next(iter(engines.values()))
    prompts = [PROMPT] if args.prompts == "chat" else agent_prompts(first, args.agent_limit)
    llama_cpp = llama_cpp_runner(str(gguf), args.threads, prompts)
    natural = args.prompts == "agent"
    measured = batch1(engines, prompts, args.tokens, args.repeats, llama_cpp, natural)
    ref = measured.pop("transformers")
    anchor = measured.pop("llama.cpp", None)
    results = {}
    for name in engines:
        measure = (CONFIGS[name], args.threads, args.tokens, args.repeats)
        if args.no_server:
            server = cold = {"scaling_8_over_1": float("nan")}
        else:
            server = server_aggregate(*measure, prefix_caching=True, port=args.port)
            cold = server_aggregate(*measure, prefix_caching=False, port=args.port)
        speedup = measured[name]["decode_tokens_per_s"] / ref["decode_tokens_per_s"]
        results[name] = {
            "engine_batch1": measured[name],
            "decode_speedup_vs_transformers": round(speedup, 2),
            "server": server,
            "server_without_prefix_caching": cold,
            "decode_speedup_vs_llama_cpp": None
            if anchor is None
            else round(measured[name]["decode_tokens_per_s"] / anchor["decode_tokens_per_s"], 2),
            "goals": {
                "batch1_decode_2x_transformers": speedup >= 2.0,
                "concurrency_8_at_least_4x_of_1": server["scaling_8_over_1"] >= 4.0,
            },
        }
    result = {
        "model": next(iter(engines.values())).model_name,
        "device": "cpu",
        "threads": args.threads,
        "decode_tokens": args.tokens,
        "prompts": args.prompts if args.prompts == "chat" else f"agent x {args.agent_limit}",
        "transformers_batch1_float32": ref,
        "llama_cpp_batch1": anchor,  # same GGUF, same threads; None without the bench extra
        "engines": results,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
