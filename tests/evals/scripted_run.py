"""A real eval run over a scripted solver, for the kill-and-resume test (run as a script).

Usage: python scripted_run.py OUT_DIR PROBLEMS SAMPLES
Every sample takes 30-120 ms; even-numbered problems are answered right.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from mathagent.agent.result import SampleResult
from mathagent.evals.datasets import Problem
from mathagent.evals.runner import EvalConfig, run_eval


async def solve(problem: Problem, sample: int) -> SampleResult:
    index = int(problem.id.removeprefix("p"))
    await asyncio.sleep(0.03 + ((index * 7 + sample * 3) % 10) / 100)
    answer = problem.answer if index % 2 == 0 else "-1"
    return SampleResult(answer=answer, generation=f"\\boxed{{{answer}}}", num_generated_tokens=10)


def main() -> None:
    out, count, samples = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    problems = [Problem(f"p{i}", f"What is {i} + {i}?", str(2 * i)) for i in range(count)]
    config = EvalConfig(out, samples=samples, concurrency=4, progress=False)
    summary = asyncio.run(run_eval(problems, solve, config))
    print(summary[f"pass@1[avg-of-{samples}]"])


if __name__ == "__main__":
    main()
