"""Whole-problem evaluation (early stop, a shared time buffer): the samples of a problem run
together, what is missing is run again on resume, failed samples are not recorded."""

from __future__ import annotations

import json
from pathlib import Path

from mathagent.agent.result import SampleResult, SolveResult
from mathagent.agent.timebank import TimeBank
from mathagent.evals.datasets import Problem
from mathagent.evals.eval_command import problem_solver
from mathagent.evals.runner import EvalConfig, run_eval

PROBLEMS = [Problem("a", "1+1?", "2"), Problem("b", "2+2?", "4")]


class Groups:
    """A scripted ProblemSolver: sample 2 of problem b fails the first time."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list[int]]] = []

    async def __call__(self, problem: Problem, samples: list[int]):
        self.calls.append((problem.id, list(samples)))
        first = len(self.calls) <= len(PROBLEMS)
        return [
            None
            if (problem.id, s, first) == ("b", 2, True)
            else SampleResult(answer=problem.answer)
            for s in samples
        ]


async def test_samples_of_a_problem_run_together_and_missing_ones_on_resume(tmp_path: Path):
    solver = Groups()
    config = EvalConfig(tmp_path, samples=3, progress=False, per_problem=True)
    summary = await run_eval(PROBLEMS, solver, config)
    assert sorted(solver.calls) == [("a", [0, 1, 2]), ("b", [0, 1, 2])]
    assert summary["num_failed"] == 1 and not summary["complete"]
    summary = await run_eval(PROBLEMS, solver, config)
    assert solver.calls[-1] == ("b", [2]) and summary["complete"]
    records = [json.loads(x) for x in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert sorted((r["id"], r["sample"]) for r in records) == [
        (p, s) for p in ("a", "b") for s in range(3)
    ]


class TimedAgent:
    """Stands in for the Solver: records each problem's budget, 'uses' 100 s of it."""

    def __init__(self, clock: list[float]) -> None:
        self.budgets: list[float] = []
        self.clock = clock

    async def solve(self, problem, options, sample_ids):
        self.budgets.append(options.wall_time_s)
        self.clock[0] += 100.0
        return SolveResult(samples=[SampleResult(answer="1") for _ in sample_ids])


async def test_each_problem_gets_its_time_plus_what_the_earlier_ones_left(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("mathagent.evals.eval_command.time.perf_counter", lambda: clock[0])
    agent = TimedAgent(clock)
    solve = problem_solver(agent, tools=True, bank=TimeBank(360.0))  # type: ignore[arg-type]
    for problem in PROBLEMS:
        await solve(problem, [0, 1])
    assert agent.budgets == [360.0, 620.0]
