"""``mathagent eval`` after wiring: a dataset and a ready solver → the resumable runner.

The runtime opens the solver (endpoint or embedded engine, sandbox); this module only loads
the problems and turns the agent's samples into the runner's records. A sample whose endpoint
or sandbox failed is not recorded, so a re-run retries it. With early stop or a shared time
buffer (``--recipe aimo2``) a problem's samples run together: the vote may cancel the rest, and
each problem gets its time from a :class:`~mathagent.agent.timebank.TimeBank`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mathagent.agent.result import SampleResult
from mathagent.agent.solver import SolveOptions, Solver
from mathagent.agent.timebank import TimeBank
from mathagent.evals.acceptance import AcceptanceMeter
from mathagent.evals.datasets import Problem, load_dataset
from mathagent.evals.runner import EvalConfig, ProblemSolver, SampleSolver, run_eval


@dataclass
class EvalRequest:
    """What the user asked ``mathagent eval`` for."""

    dataset: str
    out: Path
    samples: int | None = None  # unset = the agent's (recipe, then 1)
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


def problem_solver(agent: Solver, tools: bool, bank: TimeBank | None) -> ProblemSolver:
    """The runner's view of the agent for whole problems: vote, early stop, the time bank."""

    async def solve(problem: Problem, samples: list[int]) -> list[SampleResult | None]:
        granted = bank.grant() if bank else None
        options = SolveOptions(tools=tools, samples=len(samples), wall_time_s=granted)
        started = time.perf_counter()
        try:
            result = await agent.solve(problem.problem, options, sample_ids=samples)
        finally:
            if bank is not None and granted is not None:
                bank.settle(granted, time.perf_counter() - started)
        # Samples the early stop cancelled are kept (finish_reason "cancelled"): the vote was made.
        return [None if r.finish_reason == "error" else r for r in result.samples]

    return solve


async def evaluate(
    request: EvalRequest,
    problems: list[Problem],
    agent: Solver,
    base_url: str,
    meta: dict[str, Any],
) -> dict[str, Any]:
    """Run (or resume) the eval over a ready solver and return its summary."""
    plan = agent.plan
    per_problem = plan.early_stop > 0 or plan.time_buffer
    config = EvalConfig(
        request.out,
        samples=request.samples or plan.samples,
        concurrency=request.concurrency,
        progress=request.progress,
        per_problem=per_problem,
        meta=meta,
    )
    bank = TimeBank(plan.wall_time_s) if plan.time_buffer else None
    solve = (
        problem_solver(agent, request.tools, bank)
        if per_problem
        else sample_solver(agent, request.tools)
    )
    return await run_eval(
        problems,
        solve,
        config,
        meter=lambda: AcceptanceMeter(base_url),
        extra=lambda: {"replicas": agent.llm.replicas.stats()},
    )
