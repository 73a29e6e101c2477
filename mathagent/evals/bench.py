"""Speed comparison of serving configurations on the same problems (``mathagent bench``).

Each endpoint (an OpenAI-compatible server: the embedded engine with or without speculation,
trtllm-serve, vLLM, ...) gets the same streamed chat requests, one endpoint at a time so they
never compete. The table is the NeMo-Skills AIMO-2 recipe's: total generation time, batch
tokens/s, per-request tokens/s (mean ± sd), time to first token, acceptance length (from the
server's /metrics) and accuracy of the plain (no-tools) answers.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import mean, pstdev
from typing import Any

import httpx

from mathagent.evals.acceptance import AcceptanceMeter
from mathagent.evals.datasets import Problem
from mathagent.evals.grading import answers_match, extract_answer
from mathagent.evals.report import BENCH_FILE, write_report

PROMPT_SUFFIX = "\nPlease reason step by step, and put your final answer within \\boxed{}."


class BenchError(RuntimeError):
    """An endpoint that cannot be benchmarked (bad spec, unreachable)."""


@dataclass(frozen=True)
class Endpoint:
    """A named OpenAI-compatible server."""

    name: str
    base_url: str  # with or without /v1

    @classmethod
    def parse(cls, spec: str) -> Endpoint:
        """``NAME=URL`` as given to ``--endpoint``."""
        name, sep, url = spec.partition("=")
        if not sep or not name.strip() or not url.startswith(("http://", "https://")):
            raise BenchError(f"--endpoint wants NAME=http(s)://HOST:PORT, got {spec!r}")
        return cls(name.strip(), url.strip().rstrip("/"))

    @property
    def v1(self) -> str:
        return self.base_url if self.base_url.endswith("/v1") else f"{self.base_url}/v1"


@dataclass
class BenchConfig:
    """What every endpoint is asked to do."""

    out_dir: Path
    concurrency: int = 4
    max_tokens: int = 1024
    temperature: float = 0.0
    model: str | None = None  # None: the first model the endpoint lists
    request_timeout_s: float = 600.0


@dataclass
class RequestStats:
    """One streamed request."""

    id: str
    text: str
    answer: str | None
    is_correct: bool
    tokens: int
    ttft_s: float
    latency_s: float
    error: str | None = None


async def _model_name(client: httpx.AsyncClient, endpoint: Endpoint, wanted: str | None) -> str:
    if wanted:
        return wanted
    try:
        response = await client.get(f"{endpoint.v1}/models")
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise BenchError(
            f"endpoint {endpoint.name} ({endpoint.base_url}): no model list: {exc}"
        ) from exc


async def _stream_one(
    client: httpx.AsyncClient, endpoint: Endpoint, model: str, problem: Problem, config: BenchConfig
) -> RequestStats:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": problem.problem + PROMPT_SUFFIX}],
        "max_tokens": config.max_tokens,
        "temperature": config.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    ttft, pieces, chunks, usage_tokens = None, [], 0, None
    try:
        async with client.stream("POST", f"{endpoint.v1}/chat/completions", json=body) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode(errors="replace")[:300]
                raise BenchError(f"HTTP {response.status_code}: {detail}")
            async for line in response.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                event = json.loads(line[5:])
                if event.get("usage"):
                    usage_tokens = event["usage"].get("completion_tokens")
                for choice in event.get("choices") or []:
                    if delta := (choice.get("delta") or {}).get("content"):
                        ttft = time.perf_counter() - t0 if ttft is None else ttft
                        pieces.append(delta)
                        chunks += 1
    except (httpx.HTTPError, BenchError, ValueError) as exc:
        latency = time.perf_counter() - t0
        return RequestStats(problem.id, "", None, False, 0, latency, latency, error=str(exc))
    latency = time.perf_counter() - t0
    text = "".join(pieces)
    answer = extract_answer(text)
    correct = await asyncio.to_thread(answers_match, answer, problem.answer, modulo=problem.modulo)
    tokens = usage_tokens if usage_tokens is not None else chunks
    return RequestStats(problem.id, text, answer, correct, tokens, ttft or latency, latency)


async def bench_endpoint(
    endpoint: Endpoint, problems: Sequence[Problem], config: BenchConfig
) -> tuple[dict[str, Any], list[RequestStats]]:
    """One row of the table, and the per-request stats behind it."""
    timeout = httpx.Timeout(config.request_timeout_s, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout) as client:
        model = await _model_name(client, endpoint, config.model)
        gate = asyncio.Semaphore(config.concurrency)

        async def one(problem: Problem) -> RequestStats:
            async with gate:
                return await _stream_one(client, endpoint, model, problem, config)

        async with AcceptanceMeter(endpoint.base_url) as meter:
            t0 = time.perf_counter()
            stats = await asyncio.gather(*(one(p) for p in problems))
            wall = time.perf_counter() - t0
    row = _row(endpoint, model, stats, wall, meter.acceptance_length)
    if meter.policy_steps is not None:  # the embedded engine's draft lengths chosen, and the
        row["policy_steps"] = meter.policy_steps  # step costs it judged them by at the end
        row["policy_step_ms"] = meter.policy_step_ms
    return row, list(stats)


def _row(
    endpoint: Endpoint,
    model: str,
    stats: Sequence[RequestStats],
    wall: float,
    acceptance: float | None,
) -> dict[str, Any]:
    ok = [s for s in stats if s.error is None]
    rates = [s.tokens / s.latency_s for s in ok if s.latency_s > 0]
    return {
        "name": endpoint.name,
        "url": endpoint.base_url,
        "model": model,
        "num_requests": len(stats),
        "num_errors": len(stats) - len(ok),
        "total_tokens": sum(s.tokens for s in ok),
        "total_generation_s": wall,
        "batch_tokens_per_s": sum(s.tokens for s in ok) / wall if wall > 0 else 0.0,
        "per_request_tokens_per_s": mean(rates) if rates else 0.0,
        "per_request_tokens_per_s_sd": pstdev(rates) if rates else 0.0,
        "ttft_s": mean(s.ttft_s for s in ok) if ok else 0.0,
        "acceptance_length": acceptance,
        "accuracy": 100 * mean(s.is_correct for s in stats) if stats else 0.0,
    }


async def run_bench(
    endpoints: Sequence[Endpoint],
    problems: Sequence[Problem],
    config: BenchConfig,
    meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Bench every endpoint in turn; write bench.json, NAME.jsonl per endpoint, report.html."""
    if len({e.name for e in endpoints}) != len(endpoints):
        raise BenchError("endpoint names must be unique")
    config.out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for endpoint in endpoints:
        row, stats = await bench_endpoint(endpoint, problems, config)
        rows.append(row)
        lines = "".join(json.dumps(asdict(s), ensure_ascii=False) + "\n" for s in stats)
        (config.out_dir / f"{endpoint.name}.jsonl").write_text(lines, encoding="utf-8")
    bench = {
        "rows": rows,
        "meta": {
            **(meta or {}),
            "problems": len(problems),
            "concurrency": config.concurrency,
            "max_tokens": config.max_tokens,
            "temperature": config.temperature,
        },
    }
    (config.out_dir / BENCH_FILE).write_text(json.dumps(bench, indent=2) + "\n")
    write_report(config.out_dir)
    return bench
