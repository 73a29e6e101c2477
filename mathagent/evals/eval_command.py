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

from mathagent.config import Settings
from mathagent.evals.acceptance import AcceptanceMeter
from mathagent.evals.datasets import load_dataset
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
    async with AsyncExitStack() as stack:
        base_url, model = settings.base_url, settings.model
        if base_url is None:
            from mathagent.serving.server import EmbeddedServer

            server = stack.enter_context(EmbeddedServer(settings, model=settings.model, port=0))
            base_url, model = server.base_url, server.model_name
        sandbox = None
        if tools:
            from mathagent.sandbox import open_sandbox

            sandbox = await stack.enter_async_context(open_sandbox(settings))
        yield _agent_solver(settings, base_url, model, sandbox, tools), base_url, model or ""


def _agent_solver(
    settings: Settings, base_url: str, model: str | None, sandbox: Any, tools: bool
) -> SampleSolver:
    raise RuntimeError("mathagent eval needs the agent, which is not merged into this build yet")
