"""The replica set under the agent's LLM: least-in-flight leases, take-out and probe-back.

The endpoints are the scripted fake (a real ``openai`` client over an httpx transport) and a
closed local port (a real refused connection); the fault runs on real servers live in
``tests/evals/test_replicas.py``.
"""

from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from mathagent.agent.llm import LLM, LLMError
from mathagent.agent.replicas import NoReplica, Replica, ReplicaSet
from mathagent.agent.request import Conversation, Finish, GenParams
from tests.agent.fakes import FakeEndpoint, Turn


def _replica(endpoint: FakeEndpoint, name: str) -> Replica:
    client = openai.AsyncOpenAI(
        base_url=f"http://{name}/v1",
        api_key="x",
        max_retries=0,
        http_client=httpx.AsyncClient(transport=endpoint.transport()),
    )
    return Replica(f"http://{name}/v1", client)


async def _text(llm: LLM, budget_s: float = 10) -> str:
    loop = asyncio.get_running_loop()
    parts = []
    params = GenParams(stop=[], max_tokens=16)
    async for item in llm.stream(Conversation(prompt="p"), "", params, loop.time() + budget_s):
        if not isinstance(item, Finish):
            parts.append(item)
    return "".join(parts)


async def test_leases_go_to_the_replica_with_fewest_in_flight():
    fake = FakeEndpoint([])
    replicas = ReplicaSet([_replica(fake, "a"), _replica(fake, "b")])
    async with replicas.lease() as first, replicas.lease() as second:
        assert {first.url, second.url} == {"http://a/v1", "http://b/v1"}
        async with replicas.lease() as third:
            assert third.in_flight == 2
    assert [r.in_flight for r in replicas.replicas] == [0, 0]
    assert sorted(r.requests for r in replicas.replicas) == [1, 2]


async def test_a_failing_replica_is_taken_out_and_the_request_retried_elsewhere():
    bad, good = FakeEndpoint([Turn(status=500)]), FakeEndpoint([Turn(["\\boxed{", "1}"])])
    replicas = ReplicaSet([_replica(bad, "a"), _replica(good, "b")], backoff_s=0.01)
    llm = LLM(replicas, "fake-model", chat_template=None, backoff_s=0.01)
    assert await _text(llm) == "\\boxed{1}"
    a, b = replicas.replicas
    assert (a.failures, a.taken_out, b.failures) == (1, 1, 0)
    assert b.completion_tokens == 2
    await asyncio.sleep(0.05)  # the probe (GET /v1/models answers) brings it back
    assert a.healthy


async def test_with_every_replica_out_a_lease_waits_for_the_deadline():
    replicas = ReplicaSet.open(["http://127.0.0.1:9/v1"], "x", timeout_s=1, backoff_s=0.05)
    (dead,) = replicas.replicas
    dead.seen_alive = True  # it served before, then died
    replicas.fail(dead)  # nothing listens there: the probe keeps failing
    loop = asyncio.get_running_loop()
    with pytest.raises(NoReplica):
        async with replicas.lease(loop.time() + 0.3):
            pass
    assert not dead.healthy and dead.taken_out == 1
    await replicas.aclose()


async def test_the_llm_reports_no_replica_as_an_endpoint_failure():
    replicas = ReplicaSet.open(["http://127.0.0.1:9/v1"], "x", timeout_s=1, backoff_s=0.05)
    replicas.replicas[0].seen_alive = True
    llm = LLM(replicas, "m", retries=1, backoff_s=0.05)
    with pytest.raises(LLMError, match="came back in time"):
        await _text(llm, budget_s=1.0)  # the retry waits for a replica until the deadline
    assert replicas.replicas[0].failures >= 1
    await replicas.aclose()


async def test_a_server_never_seen_alive_is_not_waited_for():
    replicas = ReplicaSet.open(["http://127.0.0.1:9/v1"], "x", timeout_s=1, backoff_s=0.05)
    llm = LLM(replicas, "m", retries=2, backoff_s=0.01)
    with pytest.raises(LLMError, match="failed after 3 attempts"):
        await _text(llm, budget_s=60)  # a wrong URL fails as fast as with a plain client
    assert replicas.replicas[0].requests == 3
    await replicas.aclose()
