"""Concurrent samples, majority vote, early stop and the per-problem time budget."""

from __future__ import annotations

import asyncio

from mathagent.agent.events import DoneEvent, ResultEvent, TextEvent
from mathagent.agent.solver import SolveOptions, Solver
from mathagent.config import AgentSettings
from tests.agent.fakes import FakeEndpoint, FakeSandbox, Turn, make_llm


def solver_for(script, llm_kw=None, **settings) -> tuple[Solver, FakeEndpoint, FakeSandbox]:
    endpoint = FakeEndpoint(script)
    sandbox = FakeSandbox()
    settings.setdefault("prompt_format", "fewshot")
    settings.setdefault("seed", 0)
    return (
        Solver(make_llm(endpoint, **(llm_kw or {})), sandbox, AgentSettings(**settings)),
        endpoint,
        sandbox,
    )


async def test_samples_run_concurrently_and_vote():
    script = {
        0: [Turn(["<tool_call>print(2 + 2)"]), Turn(["\\boxed{4}"])],
        1: [Turn(["\\boxed{5}"])],
        2: [Turn(["<tool_call>print(1 + 3)"]), Turn(["\\boxed{4}"])],
    }
    solver, _, sandbox = solver_for(script)
    async with asyncio.timeout(10):
        result = await solver.solve("2+2?", SolveOptions(samples=3))
    assert result.answer == "4"
    assert [s.answer for s in result.samples] == ["4", "5", "4"]
    assert len(result.tool_calls) == 2 and len(sandbox.closed) == 2
    assert result.usage.completion_tokens == sum(s.usage.completion_tokens for s in result.samples)
    assert result.error is None


async def test_early_stop_cancels_the_rest_once_k_agree():
    script = {i: [Turn(hang=True)] for i in range(2, 6)}
    script |= {0: [Turn(["\\boxed{7}"])], 1: [Turn(["\\boxed{7}"])]}
    solver, _, _ = solver_for(script, llm_kw={"request_timeout_s": 3600})
    async with asyncio.timeout(10):
        result = await solver.solve("p", SolveOptions(samples=6, early_stop=2))
    assert result.answer == "7"
    assert [s.finish_reason for s in result.samples] == ["answer"] * 2 + ["cancelled"] * 4


async def test_problem_time_budget_bounds_all_samples():
    script = {i: [Turn(hang=True)] for i in range(3)}
    solver, _, _ = solver_for(script, llm_kw={"request_timeout_s": 3600})
    async with asyncio.timeout(10):
        result = await solver.solve("p", SolveOptions(samples=3, wall_time_s=0.3))
    assert result.answer is None
    assert {s.finish_reason for s in result.samples} == {"time"}
    assert result.timing.total_s < 5


async def test_all_samples_failing_sets_the_result_error():
    solver, _, _ = solver_for({0: [Turn(status=500)] * 2}, llm_kw={"retries": 1})
    result = await solver.solve("p")
    assert result.answer is None
    assert (
        result.error == "model endpoint failed after 2 attempts: Error code: 500 - scripted failure"
    )


async def test_stream_ends_with_the_result_and_text_rebuilds_generation():
    script = {0: [Turn(["<tool_call>print(6 * 7)"]), Turn(["\\boxed{42}"])]}
    solver, _, _ = solver_for(script)
    events = [e async for e in solver.stream("p")]
    assert isinstance(events[-1], ResultEvent) and isinstance(events[-2], DoneEvent)
    assert [e.type for e in events if e.type != "text"] == [
        "tool_call",
        "tool_result",
        "answer",
        "done",
        "result",
    ]
    text = "".join(e.text if isinstance(e, TextEvent) else getattr(e, "output", "") for e in events)
    assert text == events[-1].result.samples[0].generation
