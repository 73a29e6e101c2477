"""``serve --engine embedded --replicas N``: the plan (one GPU or a thread share each) and the
dry run through the real CLI; the started replicas are exercised in tests/evals/test_replicas.py."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from mathagent.cli import app
from mathagent.serving.replicas import ReplicaError, plan_replicas


def test_cuda_replicas_get_one_visible_gpu_each_on_consecutive_ports():
    plan = plan_replicas(2, "127.0.0.1", 8000, "auto", None, [], gpus=["2", "5", "7"])
    assert plan.device == "cuda"
    assert [plan.own_env(i) for i in range(2)] == [
        {"CUDA_VISIBLE_DEVICES": "2"},
        {"CUDA_VISIBLE_DEVICES": "5"},
    ]
    assert plan.urls() == ["http://127.0.0.1:8000/v1", "http://127.0.0.1:8001/v1"]
    assert plan.command(1)[-2:] == ["--port", "8001"]


def test_more_replicas_than_gpus_is_refused():
    with pytest.raises(ReplicaError, match="2 visible GPUs"):
        plan_replicas(3, "127.0.0.1", 8000, "cuda", None, [], gpus=["0", "1"])


def test_cpu_replicas_split_the_threads():
    plan = plan_replicas(2, "127.0.0.1", 8000, "cpu", 6, ["--model", "m"])
    assert plan.device == "cpu" and plan.own_env(0) == {"MATHAGENT_ENGINE__THREADS": "3"}
    assert plan.command(0)[-2:] == ["--model", "m"]


def test_dry_run_prints_each_replica_and_the_base_url(clean_env):
    clean_env.setenv("MATHAGENT_ENGINE__DEVICE", "cpu")
    clean_env.setenv("MATHAGENT_ENGINE__THREADS", "2")
    args = ["serve", "--engine", "embedded", "--replicas", "2", "--port", "9100", "--dry-run"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("MATHAGENT_ENGINE__THREADS=1 ") and "--port 9100" in lines[0]
    assert "--port 9101" in lines[1]
    assert lines[2] == "MATHAGENT_BASE_URL=http://127.0.0.1:9100/v1,http://127.0.0.1:9101/v1"


def test_replicas_are_for_the_embedded_engine(clean_env):
    result = CliRunner().invoke(app, ["serve", "--engine", "vllm", "--replicas", "2"])
    assert result.exit_code != 0 and "--replicas is for the embedded engine" in result.output


def test_a_chosen_none_reaches_every_replica(clean_env):
    # the replicas would otherwise pick the default model's default drafter themselves
    clean_env.setenv("MATHAGENT_ENGINE__DEVICE", "cpu")
    args = [
        "serve",
        "--engine",
        "embedded",
        "--replicas",
        "2",
        "--speculative",
        "none",
        "--dry-run",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert all(line.endswith("--speculative none") for line in lines[:2]), lines
