"""The /solve app in process: contract fields, bad input, auth, SSE and the 429 limit."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx
import pytest

from mathagent.agent.api import create_app
from mathagent.agent.solver import Solver
from mathagent.config import AgentSettings, Settings
from tests.agent.fakes import FakeEndpoint, FakeSandbox, Turn, make_llm


def app_for(turns, api_key=None, **agent):
    agent.setdefault("prompt_format", "fewshot")
    settings = Settings(api_key=api_key, agent=AgentSettings(**agent))
    endpoint = FakeEndpoint(turns)
    solver = Solver(make_llm(endpoint, request_timeout_s=3600), FakeSandbox(), settings.agent)
    return create_app(solver, settings), endpoint


def client(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t")


async def test_solve_returns_the_contract_fields():
    app, _ = app_for([Turn(["<tool_call>print(17 * 23 + 5)"]), Turn(["\\boxed{396}"])])
    async with client(app) as c:
        r = await c.post("/solve", json={"problem": "What is 17 * 23 + 5?"})
    assert r.status_code == 200
    body = r.json()
    assert {"answer", "samples", "tool_calls", "usage", "timing"} <= set(body)
    assert body["answer"] == "396" and body["tool_calls"][0]["stdout"] == "396\n"


async def test_health_and_openapi():
    app, _ = app_for([])
    async with client(app) as c:
        health = (await c.get("/health")).json()
        spec = (await c.get("/openapi.json")).json()
    assert health["status"] == "ok" and health["model"] == "fake-model"
    assert {"/solve", "/solve/stream", "/health"} <= set(spec["paths"])


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"problem": ""}, 422),
        ({"problem": "   \n"}, 422),
        ({"problem": "x" * 2001}, 413),
        ({"problem": "x" * 20_000}, 413),
        ({"problem": "p", "samples": 0}, 422),
        ({"problem": "p", "samples": 9}, 422),
        ({"problem": "p", "max_tokens": -1}, 422),
        ({"problem": "p", "max_tokens": 10**9}, 422),
        ({"problem": "p", "max_tool_calls": -2}, 422),
        ({"problem": "p", "max_tool_calls": 10**6}, 422),
        ({"problem": "p", "temperature": -0.5}, 422),
        ({"problem": "p", "unknown": 1}, 422),
        ({}, 422),
    ],
)
async def test_bad_input_is_a_4xx_with_a_message(body, status):
    app, endpoint = app_for([], max_problem_chars=2000, max_samples=8)
    async with client(app) as c:
        r = await c.post("/solve", json=body)
        r_stream = await c.post("/solve/stream", json=body)
    assert r.status_code == status and r_stream.status_code == status
    assert r.json()["detail"]
    assert endpoint.requests == []


async def test_non_json_body_is_a_4xx():
    app, _ = app_for([])
    async with client(app) as c:
        r = await c.post(
            "/solve", content=b"not json", headers={"content-type": "application/json"}
        )
    assert r.status_code == 422


@pytest.mark.parametrize(
    "body",
    [
        b'{"code": "\xed\xa0\x80"}',  # a lone surrogate that json.loads lets through
        b'{"problem": "\\ud800"}',
        b'{"problem": "p", "\\udcff": 1}',
        b'{"problem": "p", "max_tokens": NaN}',
        b'{"problem": "p", "temperature": Infinity}',
        b'{"problem": "p", "top_p": -Infinity}',
    ],
)
async def test_hostile_values_echoed_in_errors_are_a_4xx_not_a_500(body):
    app, _ = app_for([])
    async with client(app) as c:
        r = await c.post("/solve", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["detail"]


@pytest.mark.parametrize(
    ("headers", "status", "challenge"),
    [
        ({}, 401, 'Bearer realm="mathagent"'),
        ({"Authorization": "s3cret"}, 401, 'error="invalid_request"'),
        ({"Authorization": "Basic czNjcmV0"}, 401, 'error="invalid_request"'),
        ({"Authorization": "Bearer "}, 401, 'error="invalid_request"'),
        ({"Authorization": "Bearer nope"}, 403, None),
        ({"Authorization": "Bearer s3cret-and-more"}, 403, None),
        ({"Authorization": "bearer s3cret"}, 200, None),
        ({"Authorization": "Bearer s3cret"}, 200, None),
    ],
)
async def test_bearer_auth_401_for_bad_credentials_403_for_a_wrong_token(
    headers, status, challenge, caplog
):
    app, _ = app_for([Turn(["\\boxed{1}"])], api_key="s3cret")
    caplog.set_level(logging.DEBUG)
    async with client(app) as c:
        r = await c.post("/solve", json={"problem": "p", "tools": False}, headers=headers)
        assert (await c.get("/health")).status_code == 200
    assert r.status_code == status, r.text
    if status == 401:
        assert challenge in r.headers["www-authenticate"]
    assert "s3cret" not in r.text and "s3cret" not in caplog.text


def test_an_empty_key_is_refused_at_start():
    with pytest.raises(ValueError, match="empty"):
        app_for([], api_key="")


async def test_stream_sends_one_event_per_step():
    app, _ = app_for([Turn(["Use code. ", "<tool_call>print(2 + 3)"]), Turn(["\\boxed{5}"])])
    async with client(app) as c:
        r = await c.post("/solve/stream", json={"problem": "2+3?"})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [
        (block.split("\n")[0].removeprefix("event: "), json.loads(block.split("\n")[1][6:]))
        for block in r.text.strip().split("\n\n")
    ]
    kinds = [k for k, _ in events]
    assert kinds[0] == "text" and kinds[-1] == "result"
    assert [k for k in kinds if k != "text"] == [
        "tool_call",
        "tool_result",
        "answer",
        "done",
        "result",
    ]
    assert events[-1][1]["result"]["answer"] == "5"
    assert all(data["type"] == kind for kind, data in events)


async def test_concurrency_limit_answers_429():
    app, _ = app_for([Turn(hang=True)], max_concurrency=1)
    async with client(app) as c:
        first = asyncio.create_task(c.post("/solve", json={"problem": "p", "tools": False}))
        for _ in range(100):
            if (await c.get("/health")).json()["in_flight"] == 1:
                break
            await asyncio.sleep(0.01)
        r = await c.post("/solve", json={"problem": "p"})
        assert r.status_code == 429 and "too many requests" in r.json()["detail"]
        first.cancel()
