"""The bench and the acceptance meter against a real HTTP server with scripted replies."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from mathagent.evals.acceptance import (
    AcceptanceMeter,
    parse_policy_steps,
    parse_prometheus,
    parse_trtllm,
    policy_step_ms,
    policy_steps_between,
)
from mathagent.evals.bench import BenchConfig, BenchError, Endpoint, run_bench
from mathagent.evals.datasets import Problem
from mathagent.evals.report.bench_page import bench_body, policy_cell
from mathagent.serving.engine.spec_decode.policy import DraftPolicy
from mathagent.serving.metrics import ServerMetrics
from tests.evals.fake_openai import serve

PROBLEMS = [Problem(f"q{i}", f"What is {i} + {i}?", str(2 * i)) for i in range(6)]


@pytest.fixture(params=[False, True], ids=["prometheus", "trtllm-json"])
def server(request) -> Iterator[str]:
    with serve(trtllm=request.param) as url:
        yield url


async def test_bench_table_over_two_endpoints(server: str, tmp_path: Path):
    endpoints = [Endpoint.parse(f"plain={server}"), Endpoint.parse(f"again={server}/v1")]
    bench = await run_bench(endpoints, PROBLEMS, BenchConfig(tmp_path, concurrency=3))
    assert [r["name"] for r in bench["rows"]] == ["plain", "again"]
    for row in bench["rows"]:
        assert row["model"] == "scripted" and row["num_errors"] == 0
        assert row["accuracy"] == 50.0
        assert row["total_tokens"] == 54
        assert row["acceptance_length"] == pytest.approx(2.5)
        assert 0 < row["ttft_s"] < row["total_generation_s"]
        assert row["batch_tokens_per_s"] > 0 and row["per_request_tokens_per_s"] > 0
        assert "policy_steps" not in row  # only the embedded engine counts its policy's steps
    saved = json.loads((tmp_path / "bench.json").read_text())
    assert saved["rows"][0]["name"] == "plain"
    assert len((tmp_path / "plain.jsonl").read_text().splitlines()) == 6
    page = (tmp_path / "report.html").read_text()
    assert "batch tokens/s" in page and page.count("data:image/png;base64,") == 1


async def test_unreachable_endpoint_and_bad_spec(tmp_path: Path):
    with pytest.raises(BenchError, match="NAME=http"):
        Endpoint.parse("no-equals")
    with pytest.raises(BenchError, match="no model list"):
        await run_bench(
            [Endpoint.parse("dead=http://127.0.0.1:9")], PROBLEMS, BenchConfig(tmp_path)
        )


async def test_meter_without_spec_stats_reports_none():
    async with AcceptanceMeter("http://127.0.0.1:9") as meter:
        pass
    assert meter.acceptance_length is None


def test_policy_figures_as_the_engine_exports_them():
    """Parsed from ServerMetrics' own exposition (prometheus-client) of a real DraftPolicy."""
    policy = DraftPolicy(max_len=4)
    for _ in range(12):  # plain and speculative steps, each timed, as the speculator does
        k = policy.choose(1)
        policy.observed(1, k, 0.001 * (1 + k))
        if k:
            policy.accepted(1, [2])
    text = ServerMetrics("m", lambda: policy).render()
    assert parse_policy_steps(text) == dict(policy.choices) and policy.choices
    ms, timed = policy_step_ms(text), policy.step_seconds()
    assert timed and {(int(b), int(k)) for b in ms for k in ms[b]} == set(timed)
    for (b, k), t in timed.items():
        assert ms[str(b)][str(k)] == round(1e3 * t, 4)
    assert (
        f'mathagent_spec_policy_expected_tokens{{model_name="m"}} {policy.expected_tokens(4)}'
        in text
    )
    assert parse_policy_steps('mathagent_spec_policy_steps_total{draft_len="x"} 3\n') == {}
    counts = {(1, 0): 7, (1, 4): 30, (8, 3): 2}
    later = {**counts, (1, 4): 45, (16, 0): 1}
    assert policy_steps_between(counts, later) == {"1": {"4": 15}, "16": {"0": 1}}
    assert ServerMetrics("m").render().count("policy") == 0


def test_the_report_shows_what_the_policy_chose():
    row = {"name": "eagle3", "per_request_tokens_per_s": 9.0, "per_request_tokens_per_s_sd": 1.0,
           "batch_tokens_per_s": 9.0, "ttft_s": 0.1,
           "acceptance_length": 2.0, "policy_steps": {"1": {"4": 300, "0": 290}}}  # fmt: skip
    page = bench_body({"rows": [row, {**row, "name": "plain", "policy_steps": None}]})
    assert "policy steps" in page and "plain 290 · k4 300" in page and "n/a" in page
    assert policy_cell({"16": {"3": 5}, "2": {"0": 1}}) == "b2: plain 1; b16: k3 5"
    other = {k: v for k, v in row.items() if k != "policy_steps"}  # a server other than ours
    assert "policy steps" not in bench_body({"rows": [other]})


def test_parsers():
    text = "# HELP x\nvllm:spec_decode_num_accepted_tokens_total 30\nvllm:spec_decode_num_drafts_total 10\n"
    assert parse_prometheus(text).acceptance_length == 4.0
    assert parse_prometheus("other_metric 1\n") is None
    engine = 'mathagent_generation_tokens_total{model_name="m"} 300\nmathagent_target_forwards_total 120\n'
    assert parse_prometheus(engine).acceptance_length == 2.5
    gauge = 'mathagent_generation_tokens_total{model_name="m"} 300\nmathagent_acceptance_length{model_name="m"} 2.000\n'
    assert parse_prometheus(gauge).forwards == 150
    both = gauge + 'mathagent_spec_acceptance_length{model_name="m"} 2.1\n'
    assert parse_prometheus(both).acceptance_length == 2.0  # gauges are not added up
    assert (
        parse_prometheus(
            "mathagent_generation_tokens_total 0\nmathagent_acceptance_length 1.0\n"
        ).acceptance_length
        is None
    )
    stats = [
        {
            "specDecodingStats": {
                "numDraftTokens": 6,
                "numAcceptedTokens": 3,
                "numRequestsWithDraftTokens": 2,
            }
        },
        {"x": 1},
    ]
    assert parse_trtllm(stats).acceptance_length == 2.5
    assert parse_trtllm([json.dumps(stats[0])]).acceptance_length == 2.5
    assert parse_trtllm({"not": "a list"}) is None


def test_bench_command_in_a_real_process(server: str, tmp_path: Path):
    import subprocess
    import sys

    data = tmp_path / "set.jsonl"
    data.write_text(
        "".join(
            json.dumps({"id": p.id, "problem": p.problem, "answer": p.answer}) + "\n"
            for p in PROBLEMS
        )
    )
    out = tmp_path / "out"
    args = ["bench", "--endpoint", f"a={server}", "--dataset", str(data), "--out", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "mathagent", *args, "--limit", "4", "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)["rows"][0]
    assert row["num_requests"] == 4 and row["accuracy"] == 50.0
    bad = subprocess.run(
        [sys.executable, "-m", "mathagent", "bench", "--endpoint", "oops", "--dataset", str(data), "--out", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 1 and "NAME=http" in bad.stderr
