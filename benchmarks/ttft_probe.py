"""Where a request's time to first token goes in ``LLMEngine`` (a probe, printed as JSON).

The table's c1 rows (run 116) put 33 ms of TTFT on the default model on an H200, ~25% of a
256-token request, while a cached prefill took 1.1 ms (run 112). This times, per prompt
length, a fresh request (no prefix shared) from ``add_request`` to its first token through
``LLMEngine.step`` (the public path), and inside it the prefill forward: host time until the
call returns (launches) against the time until the device is done. Beside it, the same
prompt fed through the decode/verify CUDA graphs in 16-token chunks (what a graph prefill
would cost). Random weights of the model's shape need no checkpoint on the device:

    python benchmarks/ttft_probe.py --model random:smollm2-135m --device cuda [--speculative X]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import tempfile
import time
from pathlib import Path

import httpx
import torch

from mathagent.config import EngineSettings
from mathagent.serving.embedded import EmbeddedServer
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.llm_engine import LLMEngine
from mathagent.serving.engine.sampling_params import SamplingParams


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_forward(engine: LLMEngine, log: list[dict]) -> None:
    """Wrap the runner's forward: host time to return, then time until the device is done."""
    runner, inner = engine.runner, engine.runner.forward

    def forward(tokens, positions, slots, *args, **kwargs):
        _sync(runner.device)
        t0 = time.perf_counter()
        out = inner(tokens, positions, slots, *args, **kwargs)
        t1 = time.perf_counter()
        _sync(runner.device)
        t2 = time.perf_counter()
        log.append(
            {"width": tokens.shape[1], "host_ms": (t1 - t0) * 1e3, "done_ms": (t2 - t0) * 1e3}
        )
        return out

    runner.forward = forward
    spec, prefilled = engine.speculator, engine.speculator.prefilled

    def drafter_prefill(*args, **kwargs):
        t0 = time.perf_counter()
        prefilled(*args, **kwargs)
        _sync(runner.device)
        log.append({"width": 0, "drafter_ms": (time.perf_counter() - t0) * 1e3})

    spec.prefilled = drafter_prefill


def ttft(engine: LLMEngine, prompt: list[int], log: list[dict]) -> dict:
    """One fresh request to its first token; the forwards it ran on the way."""
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    log.clear()
    t0 = time.perf_counter()
    rid = engine.add_request(prompt, params)
    steps = 0
    while True:
        steps += 1
        outs = [o for o in engine.step() if o.request_id == rid]
        if outs and outs[0].delta_token_ids:
            break
    first = (time.perf_counter() - t0) * 1e3
    drafter = [f["drafter_ms"] for f in log if "drafter_ms" in f]
    prefill = [f for f in log if "host_ms" in f]  # the forwards before the first token
    while engine.has_unfinished():
        engine.step()
    return {
        "ttft_ms": first,
        "steps": steps,
        "prefill_host_ms": sum(f["host_ms"] for f in prefill),
        "prefill_done_ms": sum(f["done_ms"] for f in prefill),
        "forwards": len(prefill),
        "drafter_prefill_ms": sum(drafter),
    }


def graph_chunks(engine: LLMEngine, prompt: list[int], width: int) -> float | None:
    """ms to score ``prompt`` in slot 0 through the step graphs, ``width`` tokens a replay."""
    runner = engine.runner
    if runner.graphs is None or not runner.graphs.accepts(1, width):
        return None
    n = len(prompt) - len(prompt) % width
    _sync(runner.device)
    t0 = time.perf_counter()
    for start in range(0, n, width):
        tokens = torch.tensor([prompt[start : start + width]], device=runner.device)
        positions = torch.arange(start, start + width, device=runner.device)[None]
        runner.forward(tokens, positions, [0], logits_last_only=True)
    _sync(runner.device)
    return (time.perf_counter() - t0) * 1e3


def _ttft_sum(client: httpx.Client, root: str) -> float:
    for line in client.get(root + "/metrics").text.splitlines():
        if line.startswith("mathagent_time_to_first_token_seconds_sum"):
            return float(line.split()[-1])
    raise RuntimeError("the server exports no TTFT sum")


def server_rows(config: EngineConfig, lengths: list[int], reps: int, vocab: int) -> list[dict]:
    """The same fresh prompts through the embedded server (HTTP, one token each): the client's
    wait against the engine's own arrival-to-first-token (its /metrics sum)."""
    gen = torch.Generator().manual_seed(1)
    rows = []
    with EmbeddedServer(lambda: LLMEngine(config, Path(tempfile.mkdtemp()))) as srv:
        root = srv.base_url.removesuffix("/v1")
        with httpx.Client(timeout=600) as client:
            while client.get(root + "/health").status_code != 200:
                time.sleep(0.5)
            for n in [*sorted(set(lengths)), *lengths]:  # the first pass warms every length
                runs = []
                for _ in range(reps):
                    ids = torch.randint(0, vocab, (n,), generator=gen).tolist()
                    before = _ttft_sum(client, root)
                    t0 = time.perf_counter()
                    r = client.post(srv.base_url + "/completions", json={"model": srv.model_name,
                                    "prompt": ids, "max_tokens": 1, "temperature": 0})  # fmt: skip
                    wait = (time.perf_counter() - t0) * 1e3
                    r.raise_for_status()
                    runs.append((wait, (_ttft_sum(client, root) - before) * 1e3))
                rows.append({"prompt_tokens": n, "client_ms": statistics.median(w for w, _ in runs),
                             "engine_ttft_ms": statistics.median(e for _, e in runs)})  # fmt: skip
    return rows[len(set(lengths)) :]


def host_profile(engine: LLMEngine, prompt: list[int], log: list[dict]) -> dict:
    """Where a fresh request's host time goes: its prefill and one decode step (cProfile,
    functions by their own time)."""
    prof = cProfile.Profile()
    prof.enable()
    ttft(engine, prompt, log)
    prof.disable()
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:20]  # (cc, nc, tt, ct, callers)
    return {
        "prompt_tokens": len(prompt),
        "total_ms": round(stats.total_tt * 1e3, 3),
        "top_own_ms": [
            (f"{Path(file).name}:{line}:{func}", calls, round(own * 1e3, 3), round(cum * 1e3, 3))
            for (file, line, func), (_, calls, own, cum, _) in rows
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random:smollm2-135m")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quantization", default="none")
    parser.add_argument("--speculative", default="none")
    parser.add_argument("--fp8-activation-scales", default="auto",
                        help="MATHAGENT_ENGINE__FP8_ACTIVATION_SCALES (calibrate: static)")  # fmt: skip
    parser.add_argument("--fp8-head", action="store_true",
                        help="MATHAGENT_ENGINE__FP8_HEAD: the vocabulary head in FP8 too")  # fmt: skip
    parser.add_argument("--compiled-prefill", action="store_true",
                        help="MATHAGENT_ENGINE__COMPILED_PREFILL: compiled blocks for prefills")  # fmt: skip
    parser.add_argument("--lengths", type=int, nargs="*", default=[16, 48, 128, 256, 512])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--profile-length", type=int, default=128,
                        help="count the kernels of one eager prefill of this length (0: skip)")  # fmt: skip
    parser.add_argument("--server", action="store_true",
                        help="also through the embedded server, in its own engine")  # fmt: skip
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    chosen = dict(device=args.device, dtype=args.dtype, quantization=args.quantization,
                  speculative=args.speculative, compiled_prefill=args.compiled_prefill,
                  fp8_activation_scales=args.fp8_activation_scales, fp8_head=args.fp8_head)  # fmt: skip
    settings = EngineSettings(**chosen, max_batch_size=4, max_seq_len=2048)
    config = EngineConfig.from_settings(settings, args.model)
    t0 = time.perf_counter()
    engine = LLMEngine(config, Path(tempfile.mkdtemp()))
    res: dict = {"model": args.model, **chosen, "load_s": round(time.perf_counter() - t0, 2)}
    if config.device.type == "cuda":
        res["gpu"] = torch.cuda.get_device_name(config.device)
    log: list[dict] = []
    _timed_forward(engine, log)
    vocab = engine.loaded.model.args.vocab_size
    gen = torch.Generator().manual_seed(0)

    def prompt(n: int) -> list[int]:  # random ids: no two prompts share a prefix
        return torch.randint(0, vocab, (n,), generator=gen).tolist()

    t0 = time.perf_counter()
    for n in sorted(set(args.lengths)):  # warm-up: graphs captured, each length seen once
        ttft(engine, prompt(n), log)
    res["warmup_s"] = round(time.perf_counter() - t0, 2)
    rows = []
    for n in args.lengths:
        runs = [ttft(engine, prompt(n), log) for _ in range(args.reps)]
        row = {"prompt_tokens": n}
        for key in runs[0]:
            row[key] = round(statistics.median(r[key] for r in runs), 3)
        for width in (16,):
            graph_chunks(engine, prompt(n), width)  # its first use may capture
            row[f"graph_chunks_{width}_ms"] = graph_chunks(engine, prompt(n), width)
        rows.append(row)
        print(json.dumps(row), flush=True)
    res["rows"] = rows
    if args.profile_length:
        res["host_profile"] = host_profile(engine, prompt(args.profile_length), log)
    if args.profile_length and config.device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            ttft(engine, prompt(args.profile_length), log)
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        res["profile"] = {
            "prompt_tokens": args.profile_length,
            "cuda_kernels": len(kernels),
            "cuda_kernel_ms": round(sum(e.device_time for e in kernels) / 1e3, 3),
            "top": [
                (e.key[:80], e.count, round(e.device_time_total / 1e3, 3))
                for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:12]
            ],
        }
    if args.server:
        del engine, log
        res["server"] = server_rows(config, args.lengths, args.reps, vocab)
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
