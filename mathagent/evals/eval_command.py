"""``mathagent eval`` end to end: dataset → model endpoint and sandbox → agent → runner.

Without a base URL the embedded engine is started here and stopped at the end; with tools the
sandbox is opened here too. The runner only sees a :class:`~mathagent.evals.runner.SampleSolver`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from mathagent.agent.result import SampleResult
from mathagent.config import Settings
from mathagent.evals.acceptance import AcceptanceMeter
from mathagent.evals.datasets import Problem, load_dataset
from mathagent.evals.runner import EvalConfig, SampleSolver, run_eval


@dataclass
class EvalRequest:
    """What the user asked ``mathagent eval`` for."""

    dataset: str
    out: Path
    samples: int = 1
    concurrency: int = 4
    tools: bool = True
    limit: int | None = None
    columns: dict[str, str] = field(default_factory=dict)
    modulo: int | None = None
    progress: bool = True


async def run_eval_command(request: EvalRequest, settings: Settings) -> dict[str, Any]:
    """Run (or resume) the eval and return its summary."""
    problems = load_dataset(
        request.dataset, data_dir=settings.data_dir, columns=request.columns, limit=request.limit
    )
    if request.modulo:
        problems = [dataclasses.replace(p, modulo=request.modulo) for p in problems]
    async with open_agent_solver(settings, tools=request.tools) as (solve, base_url, model):
        meta = {
            "dataset": request.dataset,
            "tools": request.tools,
            "model": model,
            "base_url": base_url if settings.base_url else "embedded",
            "temperature": settings.agent.temperature,
            "max_tokens": settings.agent.max_tokens,
            "prompt_format": settings.agent.prompt_format,
        }
        config = EvalConfig(
            request.out,
            samples=request.samples,
            concurrency=request.concurrency,
            progress=request.progress,
            meta=meta,
        )
        return await run_eval(problems, solve, config, meter=lambda: AcceptanceMeter(base_url))


async def _first_model(base_url: str, api_key: str) -> str:
    """The first model an OpenAI-compatible endpoint lists (when --model is not given)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    headers = {"Authorization": f"Bearer {api_key}"}
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.get(f"{root}/v1/models", headers=headers)
            response.raise_for_status()
            return str(response.json()["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise RuntimeError(f"{base_url}: cannot list models (give --model): {exc}") from exc


@asynccontextmanager
async def open_agent_solver(
    settings: Settings, *, tools: bool
) -> AsyncIterator[tuple[SampleSolver, str, str]]:
    """(solver, base URL, model name): the agent over the configured or embedded endpoint."""
    async with AsyncExitStack() as stack:
        base_url, model, tokenizer = settings.base_url, settings.model, None
        if base_url is None:
            from mathagent.serving.server import EmbeddedServer

            server = stack.enter_context(EmbeddedServer(settings, model=settings.model, port=0))
            base_url, model = server.base_url, server.model_name
            tokenizer = getattr(server, "model_path", None)
        elif model is None:
            model = await _first_model(base_url, settings.llm_api_key)
        sandbox = None
        if tools:
            from mathagent.sandbox import open_sandbox

            sandbox = await stack.enter_async_context(open_sandbox(settings))
        solve = _agent_solver(settings, base_url, model, sandbox, tools, tokenizer)
        yield solve, base_url, model


class SampleFailed(RuntimeError):
    """The endpoint or the sandbox failed a sample; it is not recorded, so a re-run retries it."""


def _agent_solver(
    settings: Settings, base_url: str, model: str, sandbox: Any, tools: bool, tokenizer: str | None
) -> SampleSolver:
    """Each call solves one sample with the agent; sample i samples with seed + i."""
    from mathagent.agent.llm import open_llm
    from mathagent.agent.solver import SolveOptions, Solver

    v1 = base_url.rstrip("/")
    v1 = v1 if v1.endswith("/v1") else f"{v1}/v1"  # the OpenAI client wants the /v1 root
    llm = open_llm(v1, model, settings.agent, settings.llm_api_key, tokenizer=tokenizer)
    solver = Solver(llm, sandbox, settings.agent)
    base_seed = settings.agent.seed or 0

    async def solve(problem: Problem, sample: int) -> SampleResult:
        options = SolveOptions(tools=tools, samples=1, early_stop=0, seed=base_seed + sample)
        result = await solver.solve(problem.problem, options)
        if not result.samples:
            raise SampleFailed("the agent returned no sample")
        one = result.samples[0]
        if one.finish_reason == "error":
            raise SampleFailed(one.error or "the agent failed without a message")
        return one

    return solve
