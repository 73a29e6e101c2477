"""End to end with the real parts: the embedded engine on the default model, the Docker
sandbox, real HTTP. The transcripts below are the model's own greedy output."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from mathagent.agent.api import create_app
from mathagent.agent.solver import SolveOptions, Solver
from mathagent.config import AgentSettings, SandboxSettings, Settings
from mathagent.runtime import open_solver

pytestmark = [pytest.mark.docker, pytest.mark.model]

PROBLEM = "What is 17 * 23 + 5?"
TRANSCRIPT = (
    "<tool_call>print(17 * 23 + 5)</tool_call>\n```output\n396\n```\n"
    "The final answer is \\boxed{396}."
)


def _settings() -> Settings:
    return Settings(
        base_url=None,
        model=None,
        sandbox=SandboxSettings(pool_size=1, preload=""),
        agent=AgentSettings(max_tokens=256),
    )


@pytest.fixture(scope="module")
def server() -> Iterator[object]:
    from mathagent.runtime import engine_builder
    from mathagent.serving.embedded import EmbeddedServer

    with EmbeddedServer(engine_builder(_settings()), port=0) as srv:
        yield srv


def _at(server, settings: Settings | None = None) -> Settings:
    """Settings that point the runtime at the module's embedded server."""
    settings = settings or _settings()
    return settings.model_copy(update={"base_url": server.base_url, "model": server.model_name})


async def test_tools_turn_a_wrong_answer_right(server):
    async with open_solver(_at(server), tools=True) as rt:
        solver = rt.solver
        result = await solver.solve(PROBLEM)
    assert result.answer == "396"
    (sample,) = result.samples
    assert sample.generation == TRANSCRIPT
    assert [(c.code, c.status, c.stdout) for c in result.tool_calls] == [
        ("print(17 * 23 + 5)", "completed", "396\n")
    ]
    assert solver.llm.mode == "completions"


async def test_tools_off_runs_no_code(server):
    async with open_solver(_at(server), tools=True) as rt:
        result = await rt.solver.solve(PROBLEM, SolveOptions(tools=False))
        assert rt.solver.sandbox.stats()["sessions"] == 0
    assert result.tool_calls == [] and "<tool_call>" not in result.samples[0].generation
    assert result.answer is not None and result.answer != "396"  # the model alone gets it wrong


async def test_chat_mode_also_solves(server):
    settings = _settings()
    settings.agent.api_mode = "chat"
    settings.agent.max_tokens = 64  # after its tool call the model may ramble in a new turn
    async with open_solver(_at(server, settings), tools=True) as rt:
        solver = rt.solver
        result = await solver.solve(PROBLEM)
    assert solver.llm.mode == "chat"
    assert [c.stdout for c in result.tool_calls] == ["396\n"]


async def _serve(solver: Solver, settings: Settings):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(create_app(solver, settings), log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.05)
    return server, task, f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_solve_over_real_http(server):
    settings = _settings()
    settings.api_key = "k"
    async with open_solver(_at(server, settings), tools=True) as rt:
        http, task, url = await _serve(rt.solver, settings)
        try:
            async with httpx.AsyncClient(base_url=url, timeout=300) as c:
                auth = {"Authorization": "Bearer k"}
                r = await c.post("/solve", json={"problem": PROBLEM}, headers=auth)
                stream = await c.post("/solve/stream", json={"problem": PROBLEM}, headers=auth)
                denied = await c.post("/solve", json={"problem": PROBLEM})
                empty = await c.post("/solve", json={"problem": ""}, headers=auth)
        finally:
            http.should_exit = True
            await task
    assert r.status_code == 200 and r.json()["answer"] == "396"
    assert r.json()["samples"][0]["generation"] == TRANSCRIPT
    kinds = [line[7:] for line in stream.text.splitlines() if line.startswith("event: ")]
    assert {"text", "tool_call", "tool_result", "answer", "done", "result"} == set(kinds)
    assert kinds[-1] == "result"
    assert denied.status_code == 401 and empty.status_code == 422


def test_cli_main_job_prints_396_last():
    done = subprocess.run(
        [sys.executable, "-m", "mathagent", "solve", PROBLEM],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[-1] == "396"
    assert "print(17 * 23 + 5)" in done.stdout
