"""The batch runner: results schema, resume without repeats, torn lines, killed runs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from mathagent.agent.result import SampleResult, ToolCall
from mathagent.evals.datasets import Problem
from mathagent.evals.results import ResultsError, ResultsFile
from mathagent.evals.runner import EvalConfig, run_eval

SCRIPT = Path(__file__).with_name("scripted_run.py")
PROBLEMS = [Problem("a", "1+1?", "2"), Problem("b", "2+2?", "4"), Problem("c", "big?", "1000", 10)]
SCHEMA = {
    "id", "sample", "problem", "expected_answer", "predicted_answer", "is_correct",
    "generation", "tool_calls", "num_generated_tokens", "latency_s",
}  # fmt: skip


class ScriptedSolver:
    """Answers from a script {(id, sample): answer}; records every call."""

    def __init__(self, answers: dict[tuple[str, int], str | None], fail: set | None = None):
        self.answers, self.fail, self.calls = answers, fail or set(), []

    async def __call__(self, problem: Problem, sample: int) -> SampleResult:
        self.calls.append((problem.id, sample))
        if (problem.id, sample) in self.fail:
            raise ConnectionError("server went away")
        answer = self.answers.get((problem.id, sample))
        calls = [ToolCall(code="print(1+1)", status="completed", stdout="2\n")]
        return SampleResult(
            answer=answer, generation="...", tool_calls=calls, num_generated_tokens=7
        )


ANSWERS = {
    ("a", 0): "2",
    ("a", 1): "3",
    ("b", 0): "4",
    ("b", 1): "4",
    ("c", 0): "10",
    ("c", 1): None,
}


async def test_run_writes_schema_summary_and_report(tmp_path: Path):
    solver = ScriptedSolver(ANSWERS)
    summary = await run_eval(PROBLEMS, solver, EvalConfig(tmp_path, samples=2, progress=False))
    records = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(records) == 6 and all(set(r) >= SCHEMA for r in records)
    by_key = {(r["id"], r["sample"]): r for r in records}
    assert by_key[("c", 0)]["is_correct"]  # modulo 10: 10 == 1000 (mod 10)
    assert not by_key[("a", 1)]["is_correct"]
    assert by_key[("a", 0)]["tool_calls"][0]["stdout"] == "2\n"
    assert summary["pass@1[avg-of-2]"] == pytest.approx(100 * (0.5 + 1 + 0.5) / 3)
    assert summary["complete"] and summary["num_failed"] == 0
    assert json.loads((tmp_path / "summary.json").read_text())["num_entries"] == 3
    assert (tmp_path / "report.html").read_text().count("data:image/png;base64,") >= 3


async def test_rerun_skips_done_and_retries_failed(tmp_path: Path):
    config = EvalConfig(tmp_path, samples=2, progress=False)
    first = ScriptedSolver(ANSWERS, fail={("b", 1)})
    summary = await run_eval(PROBLEMS, first, config)
    assert summary["num_failed"] == 1 and not summary["complete"]
    second = ScriptedSolver(ANSWERS)
    summary = await run_eval(PROBLEMS, second, config)
    assert second.calls == [("b", 1)]
    assert summary["complete"] and summary["num_samples"] == 6
    more = ScriptedSolver(ANSWERS)
    await run_eval(PROBLEMS, more, EvalConfig(tmp_path, samples=3, progress=False))
    assert sorted(more.calls) == [("a", 2), ("b", 2), ("c", 2)]


def test_torn_last_line_is_cut_and_damage_before_it_is_reported(tmp_path: Path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"id": "a", "sample": 0}\n{"id": "b", "sam')
    assert ResultsFile(path).load() == [{"id": "a", "sample": 0}]
    assert path.read_text() == '{"id": "a", "sample": 0}\n'
    path.write_text('{"id": "a", "sample": 0}\n{"id": "b", "sample": 0}')
    assert len(ResultsFile(path).load()) == 2  # whole record, only the newline missing
    assert path.read_text().endswith("}\n")
    path.write_text('{"id": "a", "sa\n{"id": "b", "sample": 0}\n')
    with pytest.raises(ResultsError, match=r"results\.jsonl:1"):
        ResultsFile(path).load()


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _start(out: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), str(out), "30", "3"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )


def _kill_after_lines(out: Path, at_least: int) -> int:
    proc = _start(out)
    deadline = time.monotonic() + 600  # a loaded machine can be slow to start Python
    while len(_lines(out / "results.jsonl")) < at_least and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    return len(ResultsFile(out / "results.jsonl").load())


def test_killed_twice_then_rerun_has_every_sample_exactly_once(tmp_path: Path):
    first = _kill_after_lines(tmp_path, 10)
    second = _kill_after_lines(tmp_path, first + 15)
    assert 10 <= first < second < 90
    proc = _start(tmp_path)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    keys = Counter((r["id"], r["sample"]) for r in _lines(tmp_path / "results.jsonl"))
    assert set(keys) == {(f"p{i}", s) for i in range(30) for s in range(3)}
    assert set(keys.values()) == {1}
    assert float(out.strip()) == pytest.approx(50.0)
    assert json.loads((tmp_path / "summary.json").read_text())["complete"]
