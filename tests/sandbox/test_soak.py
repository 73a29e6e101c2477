"""A small ``benchmarks/soak.py`` run (the full one is for the measurement): the sandbox
service under mixed load, and the /solve API and the embedded server under hostile requests.

The goals are the soak's: no 5xx, no container left behind, every oversized body answered
413, the services healthy and as fast as before afterwards.
"""

from __future__ import annotations

import pytest

from benchmarks.soak import sandbox_soak, services_rows


@pytest.mark.docker
def test_sandbox_service_under_mixed_load(sandbox_image):
    row = sandbox_soak(executions=240, sessions=12, seed=1)
    assert row["5xx"] == 0 and row["http"] == {"200": 240}, row
    assert {"completed", "timeout", "error"} <= set(row["results"])
    assert row["containers_after_stop"] == 0
    assert row["after_load"]["containers"] <= row["before"]["containers"] + 12


@pytest.mark.docker
@pytest.mark.model
def test_solve_api_and_embedded_server_under_hostile_requests():
    rows = services_rows(40, seed=2, parts={"solve_api", "openai_server"})
    for name, row in rows.items():
        assert row["5xx"] == 0, (name, row["by_kind"], "\n".join(row.get("server_log_tail", [])))
        assert row["oversized_413"] == row["oversized"], (name, row["by_kind"])
        assert row["healthy_after"] and row["normal_within_usual_time"], (name, row)
