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


@asynccontextmanager
async def open_agent_solver(
    settings: Settings, *, tools: bool
) -> AsyncIterator[tuple[SampleSolver, str, str]]:
    """(solver, base URL, model name): the agent over the configured or embedded endpoint."""
    from mathagent.agent.llm import LLMError, served_model
    from mathagent.agent.solver import SolveOptions, build_solver

    async with AsyncExitStack() as stack:
        base_url, model = settings.base_url, settings.model
        if base_url is None:
            from mathagent.serving.embedded import EmbeddedServer

            server = stack.enter_context(EmbeddedServer(settings, model=settings.model, port=0))
            base_url, model = server.base_url, server.model_name
        base_url = _v1(base_url)
        try:
            model = model or await served_model(base_url, settings.llm_api_key)
        except LLMError as exc:
            raise RuntimeError(f"{exc} (give --model)") from exc
        sandbox = None
        if tools:
            from mathagent.sandbox import open_sandbox

            sandbox = await stack.enter_async_context(open_sandbox(settings))
        agent = build_solver(settings, base_url, model, sandbox)
        options = SolveOptions(tools=tools)

        async def solve(problem: Problem, sample: int) -> SampleResult:
            result = await agent.solve_sample(problem.problem, sample, options)
            if result.finish_reason == "error":
                raise SampleFailed(result.error or "the agent failed without a message")
            return result

        yield solve, base_url, model


def _v1(base_url: str) -> str:
    """The OpenAI client wants the /v1 root; users give either form."""
    root = base_url.rstrip("/")
    return root if root.endswith("/v1") else f"{root}/v1"


class SampleFailed(RuntimeError):
    """The endpoint or the sandbox failed a sample; it is not recorded, so a re-run retries it."""
