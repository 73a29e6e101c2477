"""``mathagent eval`` after wiring: a dataset and a ready solver → the resumable runner.

The runtime opens the solver (endpoint or embedded engine, sandbox); this module only loads
the problems and turns the agent's samples into the runner's records. A sample whose endpoint
or sandbox failed is raised as :class:`SampleFailed`, so it is not recorded and a re-run
retries it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mathagent.agent.result import SampleResult
from mathagent.agent.solver import SolveOptions, Solver
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


class SampleFailed(RuntimeError):
    """The endpoint or the sandbox failed a sample; it is not recorded, so a re-run retries it."""


def load_problems(request: EvalRequest, data_dir: Path | None) -> list[Problem]:
    """The request's problems (checked before any engine or sandbox starts)."""
    problems = load_dataset(
        request.dataset, data_dir=data_dir, columns=request.columns, limit=request.limit
    )
    if request.modulo:
        problems = [dataclasses.replace(p, modulo=request.modulo) for p in problems]
    return problems


def sample_solver(agent: Solver, tools: bool) -> SampleSolver:
    """The runner's view of the agent: one sample of one problem."""
    options = SolveOptions(tools=tools)

    async def solve(problem: Problem, sample: int) -> SampleResult:
        result = await agent.solve_sample(problem.problem, sample, options)
        if result.finish_reason == "error":
            raise SampleFailed(result.error or "the agent failed without a message")
        return result

    return solve


async def evaluate(
    request: EvalRequest,
    problems: list[Problem],
    agent: Solver,
    base_url: str,
    meta: dict[str, Any],
) -> dict[str, Any]:
    """Run (or resume) the eval over a ready solver and return its summary."""
    config = EvalConfig(
        request.out,
        samples=request.samples,
        concurrency=request.concurrency,
        progress=request.progress,
        meta=meta,
    )
    solve = sample_solver(agent, request.tools)
    return await run_eval(problems, solve, config, meter=lambda: AcceptanceMeter(base_url))
