"""The results disk fills up mid-eval (a real 64 KiB tmpfs): a clear error, only whole lines
on disk, and the same run resumes to exactly one record per sample once there is space."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from mathagent.agent.result import SampleResult
from mathagent.evals.datasets import Problem
from mathagent.evals.results import RESULTS_FILE, ResultsError
from mathagent.evals.runner import EvalConfig, run_eval

PROBLEMS = [Problem(f"p{i}", f"What is {i} + {i}?", str(2 * i)) for i in range(30)]
SAMPLES = 2


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (needs root: mount)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], check=True)
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


async def solve(problem: Problem, sample: int) -> SampleResult:
    # ~2.3 KiB per record: the 64 KiB disk fills after about 25 of the 60 records.
    await asyncio.sleep(0.01 * (sample + 1))  # workers in flight when the disk fills
    return SampleResult(answer=problem.answer, generation="x" * 2000, num_generated_tokens=3)


def records(path: Path) -> list[dict]:
    data = path.read_bytes()
    assert data.endswith(b"\n"), "a torn last line"
    return [json.loads(line) for line in data.splitlines()]


async def test_full_disk_is_a_clear_error_and_resume_finishes_exactly_once(small_disk):
    out = small_disk / "run"
    config = EvalConfig(out, samples=SAMPLES, concurrency=4, progress=False)
    with pytest.raises(ResultsError, match=r"No space left on device.*re-run"):
        await run_eval(PROBLEMS, solve, config)
    kept = records(out / RESULTS_FILE)
    assert 0 < len(kept) < len(PROBLEMS) * SAMPLES
    with pytest.raises(ResultsError):  # still full: the same clear error, nothing torn
        await run_eval(PROBLEMS, solve, config)
    assert records(out / RESULTS_FILE) == kept

    subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)
    summary = await run_eval(PROBLEMS, solve, config)
    done = records(out / RESULTS_FILE)
    assert summary["complete"] and done[: len(kept)] == kept
    pairs = [(r["id"], r["sample"]) for r in done]
    assert sorted(pairs) == sorted((p.id, s) for p in PROBLEMS for s in range(SAMPLES))
