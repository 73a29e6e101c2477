"""Agent benchmark: where the wall time of a solve goes, and /solve under concurrent load.

Part 1 solves the first N GSM8K test problems one after another with tools on and splits the
wall time into model (waiting for tokens), sandbox (code execution) and agent overhead (all
else: prompt rendering, parsing, events). Part 2 sends C concurrent ``POST /solve`` requests
over real HTTP to the /solve app. Goals: agent overhead <= 2% of wall time; every concurrent
request completes with no error. Prints one JSON object.

    python benchmarks/agent_bench.py [--problems 20] [--concurrency 64] [--base-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import uvicorn

from mathagent.agent.answer import answers_match
from mathagent.agent.api import create_app
from mathagent.agent.solver import SolveOptions, Solver
from mathagent.config import Settings
from mathagent.runtime import open_solver

DATASET = Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "gsm8k_test.jsonl"
LOAD_PROBLEM, LOAD_ANSWER = "What is 17 * 23 + 5?", "396"


def load_problems(n: int) -> list[dict]:
    with DATASET.open() as f:
        return [json.loads(line) for _, line in zip(range(n), f, strict=False)]


async def split_wall_time(solver: Solver, problems: list[dict], max_tokens: int) -> dict:
    """Sequential solves; sums of each part of the wall time."""
    parts = dict.fromkeys(("total_s", "model_s", "sandbox_s", "agent_s"), 0.0)
    correct = tool_calls = tokens = 0
    for i, p in enumerate(problems):
        result = await solver.solve(p["problem"], SolveOptions(max_tokens=max_tokens, seed=0))
        print(
            f"problem {i}: {result.timing.total_s:.1f} s, answer {result.answer}", file=sys.stderr
        )
        for key in parts:
            parts[key] += getattr(result.timing, key)
        correct += answers_match(result.answer, p["answer"])
        tool_calls += len(result.tool_calls)
        tokens += result.usage.completion_tokens
    return {
        "problems": len(problems),
        **{k: round(v, 3) for k, v in parts.items()},
        "model_pct": round(100 * parts["model_s"] / parts["total_s"], 2),
        "sandbox_pct": round(100 * parts["sandbox_s"] / parts["total_s"], 2),
        "agent_overhead_pct": round(100 * parts["agent_s"] / parts["total_s"], 3),
        "goal_agent_overhead_pct_max": 2.0,
        "tool_calls": tool_calls,
        "completion_tokens": tokens,
        "correct": correct,
    }


async def concurrent_http(solver: Solver, settings: Settings, n: int, max_tokens: int) -> dict:
    """``n`` simultaneous POST /solve over real HTTP; counts what did not complete cleanly."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(solver, settings), log_level="warning"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.05)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    limits = httpx.Limits(max_connections=n)
    body = {"problem": LOAD_PROBLEM, "max_tokens": max_tokens}

    async def one(c: httpx.AsyncClient) -> tuple[int, dict, float]:
        started = time.perf_counter()
        r = await c.post("/solve", json=body)
        return r.status_code, r.json(), time.perf_counter() - started

    try:
        async with httpx.AsyncClient(base_url=url, timeout=1800, limits=limits) as c:
            started = time.perf_counter()
            replies = await asyncio.gather(*(one(c) for _ in range(n)))
            wall = time.perf_counter() - started
    finally:
        server.should_exit = True
        await serving
    ok = [b for s, b, _ in replies if s == 200]
    errors = [
        b.get("error") or next((x["error"] for x in b["samples"] if x["error"]), None) for b in ok
    ]
    latencies = sorted(t for *_, t in replies)
    kinds = Counter(e[:160] for e in errors if e)
    return {
        "requests": n,
        "completed_200": len(ok),
        "http_errors": n - len(ok),
        "result_errors": sum(e is not None for e in errors),
        "error_kinds": dict(kinds),
        "answers_correct": sum(b["answer"] == LOAD_ANSWER for b in ok),
        "wall_s": round(wall, 2),
        "latency_p50_s": round(statistics.median(latencies), 2),
        "latency_max_s": round(latencies[-1], 2),
    }


async def main(args: argparse.Namespace) -> dict:
    settings = Settings()
    settings.agent.max_concurrency = max(settings.agent.max_concurrency, args.concurrency)
    settings.sandbox.max_sessions = max(settings.sandbox.max_sessions, args.concurrency)
    base_url = args.base_url or settings.base_url
    model = (settings.model or args.model) if base_url else settings.model
    settings = settings.model_copy(update={"base_url": base_url, "model": model})
    async with open_solver(settings, tools=True, concurrent_rows=args.concurrency) as rt:
        solver, base_url, model = rt.solver, rt.base_url, rt.model
        split = None
        if args.problems:
            split = await split_wall_time(solver, load_problems(args.problems), args.max_tokens)
        load = await concurrent_http(solver, settings, args.concurrency, args.max_tokens)
    return {
        "model": model,
        "endpoint": base_url,
        "wall_time_split": split,
        "concurrent_solve": load,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--problems", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument(
        "--base-url", default=None, help="an endpoint instead of the embedded engine"
    )
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=2))
