"""The bench and the acceptance meter against a real HTTP server with scripted replies."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, StreamingResponse

from mathagent.evals.acceptance import AcceptanceMeter, parse_prometheus, parse_trtllm
from mathagent.evals.bench import BenchConfig, BenchError, Endpoint, run_bench
from mathagent.evals.datasets import Problem

PROBLEMS = [Problem(f"q{i}", f"What is {i} + {i}?", str(2 * i)) for i in range(6)]


def _app(trtllm: bool) -> FastAPI:
    """An OpenAI-compatible server that answers 2i right for even i, streams 5 chunks."""
    app = FastAPI()
    state = {"accepted": 0, "drafts": 0, "pending": []}

    @app.get("/v1/models")
    def models() -> dict:
        return {"data": [{"id": "scripted"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> StreamingResponse:
        body = await request.json()
        i = int(re.search(r"What is (\d+)", body["messages"][0]["content"]).group(1))
        answer = 2 * i if i % 2 == 0 else 0
        pieces = ["Adding ", "gives ", "\\boxed{", str(answer), "}"]
        state["accepted"] += 6
        state["drafts"] += 4
        state["pending"].append(
            {"specDecodingStats": {"numAcceptedTokens": 6, "numRequestsWithDraftTokens": 4}}
        )

        async def events() -> Iterator[str]:
            for piece in pieces:
                await asyncio.sleep(0.01)
                yield f"data: {json.dumps({'choices': [{'delta': {'content': piece}}]})}\n\n"
            yield f"data: {json.dumps({'choices': [], 'usage': {'completion_tokens': 9}})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/metrics")
    def metrics():
        if trtllm:
            drained, state["pending"] = state["pending"], []
            return drained
        return PlainTextResponse(
            "# TYPE mathagent:spec_decode_num_accepted_tokens_total counter\n"
            f"mathagent:spec_decode_num_accepted_tokens_total {state['accepted']}\n"
            f'mathagent:spec_decode_num_drafts_total{{model="x"}} {state["drafts"]}\n'
        )

    return app


@pytest.fixture(params=[False, True], ids=["prometheus", "trtllm-json"])
def server(request) -> Iterator[str]:
    config = uvicorn.Config(_app(request.param), host="127.0.0.1", port=0, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        thread.join(0.02)
    port = srv.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(10)


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


def test_parsers():
    text = "# HELP x\nvllm:spec_decode_num_accepted_tokens_total 30\nvllm:spec_decode_num_drafts_total 10\n"
    assert parse_prometheus(text).acceptance_length == 4.0
    assert parse_prometheus("other_metric 1\n") is None
    stats = [
        {"specDecodingStats": {"numAcceptedTokens": 3, "numRequestsWithDraftTokens": 2}},
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
