"""`mathagent eval` in a real process: the real agent against a real (scripted) HTTP endpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.evals.fake_openai import serve


def _dataset(tmp_path: Path) -> Path:
    rows = [
        {"key": f"q{i}", "question": f"What is {i} + {i}?", "sol": str(2 * i)} for i in range(6)
    ]
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _eval(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mathagent", "eval", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_eval_against_an_endpoint_resumes_and_reports(tmp_path: Path):
    data, out = _dataset(tmp_path), tmp_path / "out"
    columns = ["--column", "id=key", "--column", "problem=question", "--column", "answer=sol"]
    with serve() as url:
        common = [
            "--dataset",
            str(data),
            "--out",
            str(out),
            "--no-tools",
            "--base-url",
            url,
            *columns,
        ]
        first = _eval(*common, "--limit", "4", "--samples", "2", "--json")
        assert first.returncode == 0, first.stderr
        summary = json.loads(first.stdout)
        assert summary["num_entries"] == 4 and summary["num_samples"] == 8
        assert summary["pass@1[avg-of-2]"] == 50.0 and summary["majority@2"] == 50.0
        assert summary["acceptance_length"] == 2.5
        assert summary["meta"]["model"] == "scripted" and summary["avg_tokens"] > 0
        second = _eval(*common, "--samples", "2")
        assert second.returncode == 0, second.stderr
        assert "pass@1[avg-of-2]" in second.stdout and "report:" in second.stdout
    lines = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(lines) == 12 and len({(r["id"], r["sample"]) for r in lines}) == 12
    assert {r["id"]: r["is_correct"] for r in lines}["q2"] is True
    assert (out / "report.html").exists()


def test_eval_with_a_dead_endpoint_records_nothing_and_fails(tmp_path: Path):
    out = tmp_path / "out"
    done = _eval(
        "--dataset", str(_dataset(tmp_path)), "--out", str(out), "--no-tools", "--limit", "2",
        "--base-url", "http://127.0.0.1:9/v1", "--model", "m", "--column", "id=key",
        "--column", "problem=question", "--column", "answer=sol",
    )  # fmt: skip
    assert done.returncode == 1
    assert "2 samples failed" in done.stderr
    assert not (out / "results.jsonl").exists()
    assert json.loads((out / "summary.json").read_text())["complete"] is False


def test_eval_with_a_bad_dataset_names_the_line(tmp_path: Path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"problem": "p", "answer": "1"}\n{oops\n')
    done = _eval("--dataset", str(bad), "--out", str(tmp_path / "o"), "--base-url", "http://x/v1")
    assert done.returncode == 1 and "bad.jsonl:2: invalid JSON" in done.stderr
