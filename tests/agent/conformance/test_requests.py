"""The agent's first and second requests are the reference's, byte for byte, per model family.

Each case runs the agent with its defaults (family, budgets, sampling) against a fake vLLM and a
fake TensorRT-LLM server answering with the fixture's scripted model turns; the sandbox is
scripted (its real output "104\\n" is the fixtures'). Golden bytes per family, and why that era:

- OpenMath-Nemotron 1.5B-32B (tool use): ``openmath_tir_empty_system.json`` = the release bytes
  (NeMo-Skills 0b012df8 with ``system_message=""``, the training layout; 0f7bd733 renders the
  same).
- OpenMath-Nemotron-14B-Kaggle: prompts of ``openmath_kaggle_release.json`` (0f7bd733, the
  model's evaluation era: empty system block), request fields of ``openmath_kaggle.json``.
- Qwen2.5-Math-Instruct: prompts of ``qwen25_math_tir_release.json`` (``\\boxed{}`` as Qwen's own
  evaluation writes it), request fields of ``qwen25_math_tir.json`` (0b012df8).
- Qwen3 (thinking): ``qwen3_think.json`` (0b012df8) with its one unformatted ``\\boxed{{}}``
  written ``\\boxed{}`` as Qwen3's evaluation prompt has it; nothing else differs.
- gpt-oss: harmony's own first and second prompt (``harmony/gpt_oss_harmony.json``,
  openai/harmony ec7606df; the call re-rendered as harmony renders it, the tool answer as
  harmony's tool message), request fields of ``gpt_oss_tir.json`` (0b012df8).

Compared fields: the prompt and ``max_tokens``, ``stop``, ``temperature``, ``top_p``, ``seed``,
``skip_special_tokens``, ``spaces_between_special_tokens``. The reference's other fields are
vLLM's defaults (``n: 1``, penalties 0, ``min_p: 0``, ``echo: false``); the agent streams.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.agent.conformance.fake_servers import (
    HARMONY,
    QWEN_IM_END,
    QWEN_TOOL_CALL_END,
    FakeServer,
    Token,
    gpt_oss_model,
    qwen_model,
)
from tests.agent.conformance.golden import PROBLEM, agent_at, load, scripted
from tests.agent.fakes import FakeSandbox

FIELDS = (
    "max_tokens",
    "stop",
    "temperature",
    "top_p",
    "seed",
    "skip_special_tokens",
    "spaces_between_special_tokens",
)
QWEN_FENCE_END = Token("```\n", 73594)  # one token: the qwen tags' end


@dataclass(frozen=True)
class Case:
    model: str
    prompts: tuple[str, str]
    bodies: tuple[dict, dict]
    template: str | None
    answers: list[dict]
    call_end: Token


def _newest(name: str) -> tuple[tuple[str, str], tuple[dict, dict], list[dict]]:
    data = load(f"requests/{name}.json")
    bodies = tuple(r["body"] for r in data["requests"])
    return tuple(b["prompt"] for b in bodies), bodies, data["scripted_server_answers"]


def _release_prompts(name: str) -> tuple[str, str]:
    return tuple(r["prompt"] for r in load(f"requests/{name}.json")["model_requests"])


def _cases() -> dict[str, Case]:
    openmath = _newest("openmath_tir_empty_system")
    kaggle = _newest("openmath_kaggle")
    qwen = _newest("qwen25_math_tir")
    qwen3 = _newest("qwen3_think")
    gpt = _newest("gpt_oss_tir")
    harmony = load("harmony/gpt_oss_harmony.json")
    qwen3_prompts = tuple(p.replace("\\boxed{{}}", "\\boxed{}") for p in qwen3[0])
    return {
        "openmath": Case(
            "nvidia/OpenMath-Nemotron-14B",
            openmath[0],
            openmath[1],
            "Qwen-Qwen2.5-7B-Instruct.jinja",
            openmath[2],
            QWEN_TOOL_CALL_END,
        ),
        "openmath-kaggle": Case(
            "nvidia/OpenMath-Nemotron-14B-Kaggle",
            _release_prompts("openmath_kaggle_release"),
            kaggle[1],
            "Qwen-Qwen2.5-7B-Instruct.jinja",
            kaggle[2],
            QWEN_TOOL_CALL_END,
        ),
        "qwen2.5-math": Case(
            "Qwen/Qwen2.5-Math-7B-Instruct",
            _release_prompts("qwen25_math_tir_release"),
            qwen[1],
            "Qwen-Qwen2.5-7B-Instruct.jinja",
            qwen[2],
            QWEN_FENCE_END,
        ),
        "qwen3": Case(
            "Qwen/Qwen3-8B",
            qwen3_prompts,
            qwen3[1],
            "Qwen-Qwen3-0.6B.jinja",
            qwen3[2],
            QWEN_FENCE_END,
        ),
        "gpt-oss": Case(
            "openai/gpt-oss-120b",
            (harmony["first_prompt"]["builtin_python"], harmony["second_prompt"]["builtin_python"]),
            gpt[1],
            None,
            gpt[2],
            HARMONY["<|call|>"],
        ),
    }


CASES = _cases()


def _server(case: Case, mode: str) -> FakeServer:
    first, second = case.answers
    if case.call_end.id == HARMONY["<|call|>"].id:
        model = gpt_oss_model(case.model)
        done = HARMONY["<|return|>"]
    else:
        # A served context with room for the whole budget, as NeMo-Skills' evaluation needs.
        model = qwen_model(case.model, max_model_len=131072)
        model.tokenization["```\n"] = [QWEN_FENCE_END.id]
        done = QWEN_IM_END
    script = [
        scripted(first["text"], first["completion_tokens"], case.call_end),
        scripted(second["text"], None, done),
    ]
    return FakeServer(script, mode, model)


@pytest.mark.parametrize("mode", ["vllm", "trtllm"])
@pytest.mark.parametrize("name", list(CASES))
async def test_first_and_second_requests_are_the_references(name: str, mode: str):
    case = CASES[name]
    with _server(case, mode) as server:
        solver = await agent_at(server, FakeSandbox(), case.template)
        result = await solver.solve_sample(PROBLEM, 0)
        await solver.llm.client.close()
    first, second = server.requests
    assert (first["prompt"], second["prompt"]) == case.prompts  # 0 differing bytes
    assert {k: first.get(k) for k in FIELDS} == {k: case.bodies[0][k] for k in FIELDS}
    # max_tokens shrinks by what the server reports: vLLM counts the stop token, TensorRT-LLM
    # cuts it before counting (the fixtures are vLLM's).
    spent = case.answers[0]["completion_tokens"] - (mode == "trtllm")
    expected = {**case.bodies[1], "max_tokens": case.bodies[0]["max_tokens"] - spent}
    assert {k: second.get(k) for k in FIELDS} == {k: expected[k] for k in FIELDS}
    assert result.answer == "104" and [c.stdout for c in result.tool_calls] == ["104\n"]


@pytest.mark.parametrize("name", list(CASES))
async def test_no_reasoning_model_gets_less_than_16k_tokens(name: str):
    case = CASES[name]
    with _server(case, "vllm") as server:
        solver = await agent_at(server, FakeSandbox(), case.template)
        await solver.llm.client.close()
    budget = solver.plan.max_tokens
    assert budget >= 16384 if name != "qwen2.5-math" else budget == 4096  # its whole context


@pytest.mark.parametrize("mode", ["vllm", "trtllm"])
async def test_chat_endpoint_requests_are_the_references_after_the_empty_system(mode: str):
    """``openmath_tir_chat.json`` (0b012df8, chat endpoint): the partial answer goes back as an
    assistant message and a user "continue". The agent also sends OpenMath-Nemotron's empty
    system message first (its training layout), which the reference's default leaves out."""
    data = load("requests/openmath_tir_chat.json")
    bodies = [r["body"] for r in data["requests"]]
    case = CASES["openmath"]
    with _server(case, mode) as server:
        solver = await agent_at(server, FakeSandbox(), None, api_mode="chat")
        result = await solver.solve_sample(PROBLEM, 0)
        await solver.llm.client.close()
    assert solver.llm.mode == "chat"
    for sent, ref in zip(server.requests, bodies, strict=True):
        assert sent["messages"][0] == {"role": "system", "content": ""}
        assert sent["messages"][1:] == ref["messages"]
        assert "skip_special_tokens" not in sent
        fields = ("stop", "temperature", "top_p", "seed", "spaces_between_special_tokens")
        assert {k: sent.get(k) for k in fields} == {k: ref[k] for k in fields}
    assert result.answer == "104"
