"""The tool loop of every family, end to end: real HTTP to a fake vLLM and a fake TensorRT-LLM
server, the model's call run in the real Docker sandbox, its output fed back, the answer read."""

from __future__ import annotations

import asyncio

import pytest
import pytest_asyncio

from mathagent.config import SandboxSettings
from mathagent.sandbox import ContainerPool
from mathagent.sandbox.image import build_image
from tests.agent.conformance.golden import PROBLEM, agent_at
from tests.agent.conformance.test_requests import CASES, _server

pytestmark = pytest.mark.docker


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sandbox():
    settings = SandboxSettings(pool_size=2, preload="")
    await asyncio.to_thread(build_image, settings)
    async with ContainerPool(settings) as pool:
        yield pool


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("mode", ["vllm", "trtllm"])
@pytest.mark.parametrize("name", list(CASES))
async def test_the_call_runs_in_the_sandbox_and_the_answer_is_read(sandbox, name, mode):
    case = CASES[name]
    with _server(case, mode) as server:
        solver = await agent_at(server, sandbox, case.template)
        try:
            async with asyncio.timeout(120):
                result = await solver.solve_sample(PROBLEM, 0)
        finally:
            await solver.llm.client.close()
    (call,) = result.tool_calls
    assert (call.status, call.stdout, call.state_lost) == ("completed", "104\n", False)
    assert server.requests[1]["prompt"] == case.prompts[1]  # the sandbox's own output, fed back
    assert result.answer == "104" and result.error is None
