"""Settings over the recipe over the family; the AIMO-2 recipe; the shared time buffer."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from mathagent.agent.plan import plan_for, planned_samples
from mathagent.agent.solver import SolveOptions, Solver
from mathagent.agent.timebank import TimeBank
from mathagent.config import AgentSettings
from tests.agent.fakes import FakeEndpoint, FakeSandbox, Turn, make_llm


@pytest.mark.parametrize(
    ("model", "family", "tokens", "temperature", "notices"),
    [
        ("nvidia/OpenMath-Nemotron-7B", "openmath", 32768, 0.6, True),
        ("nvidia/OpenMath-Nemotron-14B-Kaggle", "openmath-kaggle", 32768, 0.6, False),
        ("Qwen/Qwen3-32B", "qwen3", 32768, 0.6, False),
        ("openai/gpt-oss-120b", "gpt-oss", 120_000, 1.0, False),
        ("Qwen/Qwen2.5-Math-72B-Instruct", "qwen", 4096, 0.0, False),
        ("SmolLM2-135M-Instruct", "fewshot", 2048, 0.0, False),
    ],
)
def test_defaults_come_from_the_family(model, family, tokens, temperature, notices):
    plan = plan_for(AgentSettings(), model)
    assert plan.family.name == family
    assert (plan.max_tokens, plan.temperature, plan.remaining_notice) == (
        tokens,
        temperature,
        notices,
    )
    assert (plan.samples, plan.code_timeout_s, plan.max_output_chars) == (1, 10.0, 1000)


def test_gpt_oss_effort_defaults_to_high_and_can_be_set():
    assert plan_for(AgentSettings(), "openai/gpt-oss-20b").reasoning_effort == "high"
    low = AgentSettings(reasoning_effort="low")
    assert plan_for(low, "openai/gpt-oss-20b").reasoning_effort == "low"
    with pytest.raises(ValidationError):
        AgentSettings(reasoning_effort="extreme")


def test_aimo2_is_one_switch_and_explicit_settings_still_win():
    plan = plan_for(AgentSettings(recipe="aimo2"), "some-served-name")
    assert plan.family.name == "openmath-kaggle" and not plan.remaining_notice
    assert (plan.max_tool_calls, plan.code_timeout_s, plan.max_output_chars) == (6, 2.0, 200)
    assert (plan.samples, plan.early_stop, plan.wall_time_s, plan.time_buffer) == (
        16,
        4,
        360.0,
        True,
    )
    mine = AgentSettings(recipe="aimo2", samples=4, max_tool_calls=2, prompt_format="openmath")
    plan = plan_for(mine, "x")
    assert (plan.samples, plan.max_tool_calls, plan.family.name) == (4, 2, "openmath")
    assert planned_samples(AgentSettings(recipe="aimo2")) == 16
    with pytest.raises(ValidationError):
        AgentSettings(recipe="aimo3")


def test_unused_time_flows_to_later_problems():
    bank = TimeBank(360.0)
    first = bank.grant()
    bank.settle(first, 100.0)
    assert bank.buffer_s == 260.0
    second = bank.grant()
    assert second == 620.0 and bank.buffer_s == 0.0
    bank.settle(second, 900.0)  # overran: nothing comes back, nothing is owed
    assert bank.grant() == 360.0


async def test_the_recipe_runs_16_samples_and_stops_once_4_agree():
    script = {i: [Turn(["\\boxed{7}"])] for i in range(4)}
    script |= {i: [Turn(hang=True)] for i in range(4, 16)}
    endpoint = FakeEndpoint(script)
    llm = make_llm(endpoint, request_timeout_s=3600)
    solver = Solver(llm, FakeSandbox(), AgentSettings(recipe="aimo2", seed=0))
    async with asyncio.timeout(10):
        result = await solver.solve("p", SolveOptions())
    assert len(result.samples) == 16 and result.answer == "7"
    assert [s.finish_reason for s in result.samples].count("cancelled") == 12
    assert endpoint.requests[0]["max_tokens"] == 32768
    assert endpoint.requests[0]["prompt"].startswith("<|system|><|end|>\n<|user|>Solve the")
