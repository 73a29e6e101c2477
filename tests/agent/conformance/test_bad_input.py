"""What goes wrong in the wild ends in text the model can read or a clear ``error`` on the
sample: never a hang, never a lost sample. Real HTTP to the fake servers, a scripted sandbox."""

from __future__ import annotations

import asyncio

import pytest

from mathagent.agent.llm import LLMError, open_llm
from mathagent.agent.prompts import ChatTemplate
from mathagent.agent.refusals import context_room
from mathagent.agent.solver import Solver
from mathagent.config import AgentSettings, Settings
from mathagent.runtime import open_solver
from tests.agent.conformance.fake_servers import (
    HARMONY,
    QWEN_IM_END,
    FakeServer,
    gpt_oss_model,
    qwen_model,
    text_tokens,
)
from tests.agent.conformance.golden import PROBLEM, JinjaTokenizer, agent_at, load, scripted
from tests.agent.fakes import FakeSandbox

CALL, RETURN = HARMONY["<|call|>"], HARMONY["<|return|>"]
FINAL = "<|channel|>final<|message|>The answer is $\\boxed{104}$."
QWEN25 = "Qwen-Qwen2.5-7B-Instruct.jinja"
MODES = ["vllm", "trtllm"]


async def _solve(server: FakeServer, template: str | None = QWEN25, **settings):
    solver = await agent_at(server, FakeSandbox(), template, **settings)
    try:
        async with asyncio.timeout(30):
            return await solver.solve_sample(PROBLEM, 0)
    finally:
        await solver.llm.client.close()


@pytest.mark.parametrize("mode", MODES)
async def test_a_tool_call_that_never_closes(mode):
    turn = [*text_tokens("<tool_call>\nprint(1)\n"), QWEN_IM_END]  # the model's EOS mid-call
    with FakeServer([turn], mode, qwen_model()) as server:
        result = await _solve(server)
    assert result.finish_reason == "eos" and result.tool_calls == []
    assert result.error == (
        "the model's last code block never closed (it ended before </tool_call>)"
    )
    with FakeServer([text_tokens("<tool_call>\nwhile True: pass")], mode, qwen_model()) as server:
        result = await _solve(server, max_tokens=16)
    assert result.finish_reason == "length" and "token budget ran out" in result.error


@pytest.mark.parametrize("mode", MODES)
async def test_an_unknown_recipient_is_answered_and_the_model_goes_on(mode):
    call = "<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>{}"
    script = [scripted(call, None, CALL), scripted(FINAL, None, RETURN)]
    with FakeServer(script, mode, gpt_oss_model()) as server:
        result = await _solve(server, None)
    reply = (
        "<|start|>functions.lookup to=assistant<|channel|>commentary<|message|>Error: there is "
        "no tool named 'functions.lookup'; the only tool is python.<|end|><|start|>assistant"
    )
    assert server.requests[1]["prompt"].endswith(reply)
    assert result.answer == "104" and result.tool_calls[0].status == "error"


@pytest.mark.parametrize("mode", MODES)
async def test_malformed_harmony_is_a_clear_error(mode):
    script = [scripted("<|channel|>analysis<|message|>let me think", None, CALL)]
    with FakeServer(script, mode, gpt_oss_model()) as server:
        result = await _solve(server, None)
    assert result.finish_reason == "eos"
    assert result.error == "malformed harmony: <|call|> ended a message to no recipient"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", ["openmath", "gpt-oss"])
async def test_an_empty_completion_ends_the_sample(mode, family):
    model = gpt_oss_model() if family == "gpt-oss" else qwen_model()
    end = RETURN if family == "gpt-oss" else QWEN_IM_END
    with FakeServer([[end]], mode, model) as server:
        result = await _solve(server, None if family == "gpt-oss" else QWEN25)
    assert (result.finish_reason, result.answer, result.error) == ("eos", None, None)
    assert result.generation == ""


async def test_a_server_that_strips_harmony_markers_is_an_error_not_a_toolless_answer():
    turn = load("requests/gpt_oss_tir.json")["scripted_server_answers"][0]
    script = [scripted(turn["text"], None, CALL), scripted(FINAL, None, RETURN)]
    with FakeServer(script, "ignores-skip-special-tokens", gpt_oss_model()) as server:
        result = await _solve(server, None)
    assert server.requests[0]["skip_special_tokens"] is False
    assert result.finish_reason == "error" and "skip_special_tokens" in result.error
    assert len(server.requests) == 1 and result.tool_calls == []


@pytest.mark.parametrize("mode", MODES)
async def test_a_first_message_call_runs(mode):
    turn = load("requests/gpt_oss_tir_first_message_call.json")["scripted_server_answers"][0]
    script = [scripted(turn["text"], None, CALL), scripted(FINAL, None, RETURN)]
    with FakeServer(script, mode, gpt_oss_model()) as server:
        result = await _solve(server, None)
    # NeMo-Skills does not run this call (the fixture); harmony parses it, so the agent runs it.
    assert [c.code for c in result.tool_calls] == ["print(12 * 9 - 4)\n"]
    assert server.requests[1]["prompt"].endswith(
        "<|start|>assistant to=python<|channel|>analysis code<|message|>print(12 * 9 - 4)\n"
        "<|call|><|start|>python to=assistant<|channel|>analysis<|message|>104\n<|end|>"
        "<|start|>assistant"
    )
    assert result.answer == "104"


async def test_gpt_oss_over_a_chat_endpoint_fails_with_one_clear_message():
    with FakeServer([], "vllm", gpt_oss_model()) as server:
        agent = AgentSettings(api_mode="chat")
        settings = Settings(base_url=server.base_url, model="openai/gpt-oss-120b", agent=agent)
        with pytest.raises(LLMError, match="declares no python tool"):
            async with open_solver(settings, tools=False):
                pass


@pytest.mark.parametrize("mode", MODES)
async def test_the_answer_is_read_after_the_thinking(mode):
    text = "<think>\nMaybe \\boxed{7}? No.\n</think>\n\nThe answer is \\boxed{104}."
    with FakeServer(
        [[*text_tokens(text), QWEN_IM_END]], mode, qwen_model("Qwen/Qwen3-8B")
    ) as server:
        result = await _solve(server, "Qwen-Qwen3-0.6B.jinja")
    # No stop at the box inside the thinking; the stop at the final one may cut the ".".
    assert result.answer == "104" and result.generation.startswith(text.removesuffix("."))
    unclosed = "<think>\nSo \\boxed{7}"
    with FakeServer(
        [[*text_tokens(unclosed), QWEN_IM_END]], mode, qwen_model("Qwen/Qwen3-8B")
    ) as server:
        result = await _solve(server, "Qwen-Qwen3-0.6B.jinja")
    assert result.answer is None and result.finish_reason == "eos"


async def test_max_tokens_fits_the_servers_context():
    model = qwen_model("Qwen/Qwen2.5-Math-7B-Instruct", max_model_len=4096)
    with FakeServer([[*text_tokens("\\boxed{104}"), QWEN_IM_END]], "vllm", model) as server:
        result = await _solve(server)
    sent = server.requests[0]["max_tokens"]
    prompt_chars = len(server.requests[0]["prompt"])
    # Without the tokenizer's count, two characters a token: never past the context.
    assert sent == 4096 - (prompt_chars // 2 + 1) and result.answer == "104"


class _ShortCountingTokenizer(JinjaTokenizer):
    """Counts a token per 8 characters, half what the fake server counts: the agent's count of
    its prompt falls short of the server's, as a re-tokenised model text can."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [0] * (len(text) // 8)


async def test_a_context_refusal_is_asked_again_for_what_fits():
    """vLLM refuses prompt + max_tokens past the context (a 400) and says what it counted; the
    agent, whose count was short, asks again for the rest of the context and goes on."""
    model = qwen_model("Qwen/Qwen2.5-Math-7B-Instruct", max_model_len=4096)
    with FakeServer([[*text_tokens("\\boxed{104}"), QWEN_IM_END]], "vllm", model) as server:
        agent = AgentSettings(seed=0, retries=0)
        template = ChatTemplate(_ShortCountingTokenizer(QWEN25))
        llm = open_llm(server.base_url, model.name, agent, chat_template=template, context_len=4096)
        try:
            result = await Solver(llm, FakeSandbox(), agent).solve_sample(PROBLEM, 0)
        finally:
            await llm.client.close()
    first, second = server.requests
    counted = len(first["prompt"]) // 4  # the fake server's count
    assert first["max_tokens"] > 4096 - counted and second["max_tokens"] == 4096 - counted
    assert (result.finish_reason, result.error, result.answer) == ("answer", None, "104")


@pytest.mark.parametrize(
    ("message", "room"),
    [
        ("This model's maximum context length is 100 tokens. However, you requested 101 tokens "
         "(8 in the messages, 93 in the completion). Please reduce the length of the messages or "
         "completion.", 92),  # vLLM @ 7ded96b3
        ("'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum "
         "context length is 4096 tokens and your request has 2778 input tokens "
         "(8000 > 4096 - 2778).", 1318),  # vLLM's later wording
        ("Requested token count exceeds the model's maximum context length", 0),
        ("The sum of prompt length (4000) and query length (0) max_tokens (2048) should not "
         "exceed max_seq_len (4096)", 0),
        ("temperature must be non-negative", None),
    ],
)  # fmt: skip
def test_context_refusals_are_read_for_what_fits(message, room):
    assert context_room(400, message) == room
    assert context_room(422, message) is None
