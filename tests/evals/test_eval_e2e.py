"""End to end on the real default model and the real agent, in real `mathagent eval` processes.

With tools, `mathagent eval` starts the embedded engine and the Docker sandbox itself. Without
tools, runs go to one embedded server started here (a single model load), and a run killed
with SIGKILL twice resumes to every (problem, sample) exactly once. The report renders and
passes its own checks in a headless Chromium.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from mathagent.config import EngineSettings, Settings
from tests.evals.browser import open_report

pytestmark = [pytest.mark.model]
LIMIT = 5
KILLED_LIMIT = 4
# Short generations keep a CPU run to a few minutes; the default model answers within them.
ENV = {
    **os.environ,
    "MATHAGENT_AGENT__MAX_TOKENS": "192",
    "MATHAGENT_AGENT__WALL_TIME_S": "240",
    "MATHAGENT_ENGINE__THREADS": "2",
    "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
}


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    from mathagent.runtime import engine_builder
    from mathagent.serving.embedded import EmbeddedServer

    settings = Settings(base_url=None, model=None, engine=EngineSettings(threads=2))
    with EmbeddedServer(engine_builder(settings), port=0) as server:
        yield server.base_url


def _command(out: Path, *extra: str) -> list[str]:
    args = ["eval", "--dataset", "sample", "--out", str(out), "--concurrency", "2"]
    return [sys.executable, "-m", "mathagent", *args, *extra]


def _eval(out: Path, *extra: str) -> dict:
    done = subprocess.run(
        _command(out, "--json", *extra),
        capture_output=True,
        text=True,
        timeout=900,
        env=ENV,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _records(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a torn last line of a killed run
            records.append(json.loads(line))
    return records


def _assert_report(out: Path) -> None:
    page = (out / "report.html").read_text()
    assert len(re.findall(r"data:image/png;base64,", page)) == 3
    assert "majority@1" in page
    # The fresh run's page in a real browser: its own checks, no console error, nothing fetched.
    seen = open_report(out / "report.html", out / "screenshots", "eval")
    assert seen.checks["ok"], seen.checks["failures"]
    assert seen.errors == [] and seen.blocked == []
    assert seen.checks["samples"] == len(_records(out))


@pytest.mark.docker
def test_sample_set_with_tools(tmp_path: Path):
    summary = _eval(tmp_path, "--limit", str(LIMIT))
    assert summary["num_entries"] == LIMIT and summary["complete"]
    assert summary["meta"]["tools"] is True
    records = _records(tmp_path)
    assert len(records) == LIMIT
    assert sum(len(r["tool_calls"]) for r in records) > 0  # the model did run code
    assert all(r["num_generated_tokens"] > 0 for r in records)
    _assert_report(tmp_path)


def _run_and_kill(out: Path, url: str, at_least: int) -> int:
    # A new session: SIGKILL reaches the CLI and anything it started, nothing else.
    proc = subprocess.Popen(
        _command(out, "--limit", str(KILLED_LIMIT), "--no-tools", "--base-url", url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
        start_new_session=True,
    )
    deadline = time.monotonic() + 600
    while len(_records(out)) < at_least and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)
    return len(_records(out))


def test_sample_set_without_tools_killed_twice_resumes_exactly_once(tmp_path: Path, server_url):
    first = _run_and_kill(tmp_path, server_url, 1)
    second = _run_and_kill(tmp_path, server_url, first + 1)
    assert 1 <= first < second < KILLED_LIMIT
    limit = ["--limit", str(KILLED_LIMIT)]
    summary = _eval(tmp_path, "--no-tools", "--base-url", server_url, *limit)
    keys = Counter((r["id"], r["sample"]) for r in _records(tmp_path))
    assert len(keys) == KILLED_LIMIT and set(keys.values()) == {1}
    assert summary["complete"] and summary["num_entries"] == KILLED_LIMIT
    assert summary["tool_calls_per_solution"] == 0 and summary["tokens_per_s"] > 0
    assert summary["meta"]["tools"] is False
    _assert_report(tmp_path)
