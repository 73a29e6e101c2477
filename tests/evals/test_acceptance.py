"""Acceptance read over real HTTP from a server that answers like trtllm-serve's /metrics."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from mathagent.evals.acceptance import acceptance_from_stats, read_acceptance, read_iteration_stats
from mathagent.serving.launchers.process import ServerProcess

TINY_SERVER = Path(__file__).resolve().parents[1] / "serving" / "tiny_server.py"


@pytest.fixture
def metrics_server():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    def start(mode: str) -> str:
        argv = [sys.executable, str(TINY_SERVER), str(port), mode]
        server = ServerProcess(argv, health_url=f"http://127.0.0.1:{port}/health", log=None)
        server.__enter__()
        started.append(server)
        return f"http://127.0.0.1:{port}"

    started: list[ServerProcess] = []
    yield start
    for server in started:
        server.stop()


def test_read_acceptance_from_iteration_stats(metrics_server):
    base = metrics_server("metrics")
    stats = read_iteration_stats(base + "/v1")
    assert len(stats) == 4
    found = acceptance_from_stats(stats)
    # iterations 2 and 3 drafted: 9 drafted, 5 accepted over 3 request-steps.
    assert (found.iterations, found.drafted, found.accepted, found.requests) == (2, 9, 5, 3)
    assert found.acceptance_length == pytest.approx((5 + 3) / 3)
    assert found.acceptance_rate == pytest.approx(5 / 9)
    assert read_acceptance(base) == pytest.approx(8 / 3)


def test_non_trtllm_metrics_give_none(metrics_server):
    assert read_acceptance(metrics_server("prometheus")) is None


def test_no_drafting_gives_none():
    assert acceptance_from_stats([]) is None
    assert acceptance_from_stats([{"iter": 1, "specDecodingStats": {"numDraftTokens": 0}}]) is None
