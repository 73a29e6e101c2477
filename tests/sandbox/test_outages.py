"""Outages of the sandbox's parts, end to end (rows of ``benchmarks/soak.py``'s ``faults``).

The sandbox service killed with SIGKILL during a real ``mathagent eval``, and the Docker daemon
restarted during a session (about 10-20 s; other users of this Docker lose their containers too,
so it takes /tmp/mathagent-bench.lock, the lock of timed runs, waiting at most 5 minutes;
do not run it under `flock` of that file).
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import pytest

from benchmarks.faults import docker_restart_during_session, kill_sandbox_during_eval

pytestmark = pytest.mark.docker
LOCK = "/tmp/mathagent-bench.lock"
LOCK_WAIT_S = 300


def test_sandbox_service_killed_mid_eval_loses_and_repeats_nothing(tmp_path: Path, sandbox_image):
    row = kill_sandbox_during_eval(tmp_path, problems=16)
    assert row["eval_exit_code"] == 0, row["eval_error"]
    assert 0 < row["records_at_kill"] < 16, row  # the kill came mid-run
    assert row["complete"] and row["correct"] == 100.0
    assert row["lost"] == 0 and row["duplicated"] == 0 and row["samples_recorded"] == 16
    assert row["dead_service_containers_at_kill"] > 0  # what the dead one left...
    assert row["dead_service_containers_after_restart"] == 0  # ...the restarted one removed
    assert row["restarted_service_containers_after_stop"] == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="restarting dockerd needs root")
def test_docker_restart_mid_session_reports_state_lost_and_runs(tmp_path: Path, sandbox_image):
    with open(LOCK, "a") as lock:
        # Courtesy to timed runs, bounded: a long benchmark queue must not stall the suite.
        deadline = time.monotonic() + LOCK_WAIT_S
        while time.monotonic() < deadline:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(1)
        row = docker_restart_during_session(tmp_path)
    assert row["before"] == "completed"
    assert row["next_call_http"] == 200 and row["next_call_status"] == "completed", row
    assert row["next_call_stdout"] == "back\n" and row["next_call_state_lost"] is True
    assert row["then_status"] == "completed" and row["then_state_lost"] is False
    assert row["service_containers_after_stop"] == 0
