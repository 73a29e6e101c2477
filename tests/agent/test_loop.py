"""The TIR loop against a scripted endpoint and sandbox: transcripts byte for byte, and faults."""

from __future__ import annotations

import asyncio

import pytest

from mathagent.agent.events import DoneEvent, TextEvent, ToolCallEvent, ToolResultEvent
from mathagent.agent.families import BY_NAME
from mathagent.agent.formats import remaining_notice
from mathagent.agent.loop import SampleLoop, SampleParams
from mathagent.agent.prompts import ChatTemplate
from mathagent.agent.session import RESTORE_FAILED
from mathagent.sandbox.base import ExecResult, ExecStatus
from tests.agent.fakes import FakeEndpoint, FakeSandbox, FakeTokenizer, Turn, make_llm

PROBLEM = "What is 17 * 23 + 5?"
DATE = "2025-11-14"


async def run(turns, template="openmath", sandbox=None, mode="completions", llm_kw=None, **params):
    endpoint = FakeEndpoint(turns)
    llm = make_llm(endpoint, mode=mode, **(llm_kw or {}))
    sandbox = FakeSandbox() if sandbox is None else sandbox
    family = BY_NAME[template]
    params.setdefault("remaining_notice", family.notices)
    params.setdefault("backoff_s", 0.01)
    params.setdefault("date", DATE)
    loop = SampleLoop(llm, sandbox, family, PROBLEM, SampleParams(**params))
    async with asyncio.timeout(20):
        events = [e async for e in loop.events()]
    assert isinstance(events[-1], DoneEvent)
    return events, events[-1].result, endpoint, sandbox


def base_prompt(template: str) -> str:
    chat = ChatTemplate(FakeTokenizer())
    family = BY_NAME[template]
    return family.render(PROBLEM, tools=True, max_tool_calls=8, chat_template=chat, date=DATE)


def rebuilt(events) -> str:
    """Text events plus tool outputs, in order: must equal the generation."""
    parts = []
    for e in events:
        if isinstance(e, TextEvent):
            parts.append(e.text)
        elif isinstance(e, ToolResultEvent):
            parts.append(e.output)
    return "".join(parts)


async def test_openmath_transcript_byte_for_byte():
    turns = [
        Turn(["Let me compute.\n", "<tool_", "call>print(17 * 23", " + 5)"]),
        Turn(["So the answer is \\boxed{396}."]),
    ]
    events, result, endpoint, sandbox = await run(turns)
    first = "Let me compute.\n<tool_call>print(17 * 23 + 5)</tool_call>"
    output = "\n```output\n396\n```\n" + remaining_notice(7)
    assert result.generation == first + output + "So the answer is \\boxed{396}."
    assert result.answer == "396" and result.finish_reason == "answer"
    assert endpoint.requests[0]["prompt"] == base_prompt("openmath")
    assert endpoint.requests[1]["prompt"] == base_prompt("openmath") + first + output
    assert endpoint.requests[0]["stop"] == ["</tool_call>"]
    assert sandbox.calls[0]["code"] == "print(17 * 23 + 5)"
    assert rebuilt(events) == result.generation
    code = "".join(e.text for e in events if isinstance(e, TextEvent) and e.code)
    assert code == "<tool_call>print(17 * 23 + 5)</tool_call>"
    assert [c.status for c in result.tool_calls] == ["completed"]


async def test_qwen_transcript_byte_for_byte():
    turns = [Turn(["```python\nprint(2 + 2)\n"]), Turn(["\\boxed{4}"])]
    _, result, endpoint, _ = await run(turns, template="qwen")
    assert result.generation == "```python\nprint(2 + 2)\n```\n```output\n4\n```\n\\boxed{4}"
    assert endpoint.requests[0]["stop"] == ["```\n"]
    assert result.answer == "4"


async def test_gpt_oss_transcript_byte_for_byte():
    begin = "<|start|>assistant<|channel|>analysis to=python code<|message|>"
    turns = [
        Turn(["<|channel|>analysis<|message|>Compute.<|end|>", begin, "print(3 * 3)"]),
        Turn(["<|channel|>final<|message|>\\boxed{9}"]),
    ]
    _, result, endpoint, _ = await run(turns, template="gpt-oss")
    output = (
        "<|start|>python to=assistant<|channel|>analysis<|message|>9\n<|end|><|start|>assistant"
    )
    expected = (
        "<|channel|>analysis<|message|>Compute.<|end|>"
        + begin
        + "print(3 * 3)<|call|>"
        + output
        + "<|channel|>final<|message|>\\boxed{9}"
    )
    assert result.generation == expected and result.answer == "9"
    assert endpoint.requests[0]["stop"] == ["<|call|>"]
    assert endpoint.requests[0]["prompt"] == base_prompt("gpt-oss")
    # The call goes back as harmony renders it: the recipient before the channel.
    canonical = (
        "<|start|>assistant to=python<|channel|>analysis code<|message|>print(3 * 3)<|call|>"
    )
    assert endpoint.requests[1]["prompt"] == (
        base_prompt("gpt-oss")
        + "<|channel|>analysis<|message|>Compute.<|end|>"
        + canonical
        + output
    )


async def test_stop_string_returned_by_server_is_not_doubled():
    turns = [Turn(["<tool_call>print(1 + 1)</tool_call>"]), Turn(["\\boxed{2}"])]
    _, result, _, sandbox = await run(turns, template="fewshot")
    assert result.generation.count("</tool_call>") == 1
    assert sandbox.calls[0]["code"] == "print(1 + 1)"


async def test_block_never_closed_runs_no_code():
    _, result, _, sandbox = await run(
        [Turn(["<tool_call>print(1", " + 1"], finish_reason="length")]
    )
    assert sandbox.calls == [] and result.finish_reason == "length" and result.answer is None
    assert result.error == (
        "the model's last code block never closed (the token budget ran out before </tool_call>)"
    )


async def test_eos_inside_block_reported_by_server_runs_no_code():
    _, result, _, sandbox = await run([Turn(["<tool_call>print(1"], stop_reason=None)])
    assert sandbox.calls == [] and result.finish_reason == "eos"
    assert result.generation == "<tool_call>print(1"
    assert "never closed" in result.error


async def test_two_blocks_in_one_turn_runs_only_the_last():
    text = "<tool_call>x = 1</tool_call> then <tool_call>print(41 + 1)</tool_call>"
    _, result, _, sandbox = await run([Turn([text]), Turn(["\\boxed{42}"])], template="fewshot")
    assert [c["code"] for c in sandbox.calls] == ["print(41 + 1)"]
    assert result.answer == "42"


async def test_code_timeout_reads_as_the_reference_sandbox_wrote_it():
    timeout = ExecResult(
        status=ExecStatus.timeout, stdout="partial\n", stderr="TimeoutError: ...", session_id=""
    )
    turns = [Turn(["<tool_call>while True: pass"]), Turn(["\\boxed{0}"])]
    _, result, endpoint, _ = await run(turns, template="fewshot", sandbox=FakeSandbox([timeout]))
    # NeMo-Skills 0f7bd733: a timed-out cell reads "Timed out", once, and nothing else.
    assert endpoint.requests[1]["prompt"].endswith("\n```output\nTimed out\n```\n")
    assert result.tool_calls[0].status == "timeout" and result.tool_calls[0].stdout == "partial\n"


async def test_error_and_memory_limit_feedback():
    err = ExecResult(
        status=ExecStatus.error, stderr="NameError: name 'y' is not defined", session_id=""
    )
    oom = ExecResult(status=ExecStatus.memory_limit, stderr="MemoryError\n", session_id="")
    turns = [Turn(["<tool_call>y"]), Turn(["<tool_call>[0] * 10**12"]), Turn(["\\boxed{1}"])]
    _, result, _, _ = await run(turns, template="fewshot", sandbox=FakeSandbox([err, oom]))
    assert "\n```output\nNameError: name 'y' is not defined\n```\n" in result.generation
    assert "\n```output\nMemoryError\n```\n" in result.generation


async def test_outputs_are_stripped_and_end_in_one_newline():
    noisy = ExecResult(
        status=ExecStatus.completed, stdout="\n  42\n\n", stderr="warn\n\n", session_id=""
    )
    turns = [Turn(["<tool_call>print(42)"]), Turn(["\\boxed{42}"])]
    _, result, _, _ = await run(turns, template="fewshot", sandbox=FakeSandbox([noisy]))
    assert "\n```output\n42\nwarn\n```\n" in result.generation


def _done(stdout: str = "", **kw) -> ExecResult:
    return ExecResult(status=ExecStatus.completed, stdout=stdout, session_id="", **kw)


async def test_state_lost_in_a_restart_is_restored_then_the_call_runs_again():
    lost = ExecResult(
        status=ExecStatus.error, stderr="NameError: x\n", state_lost=True, session_id=""
    )
    turns = [Turn(["<tool_call>x = 5"]), Turn(["<tool_call>print(x)"]), Turn(["\\boxed{5}"])]
    sandbox = FakeSandbox([_done(), lost, _done(), _done("5\n")])
    _, result, _, sandbox = await run(turns, template="fewshot", sandbox=sandbox)
    # As the reference client does: replay the completed cells in a clean session, run again.
    assert [c["code"] for c in sandbox.calls] == ["x = 5", "print(x)", "x = 5", "print(x)"]
    assert [c["session_id"] for c in sandbox.calls] == [None, "s1", None, "s3"]
    assert "\n```output\n5\n```\n" in result.generation and "NameError" not in result.generation
    assert result.tool_calls[1].state_lost and sandbox.closed == ["s1", "s3"]


async def test_a_failed_restoration_reads_as_the_reference_error():
    lost = ExecResult(status=ExecStatus.error, stderr="NameError\n", state_lost=True, session_id="")
    failed = ExecResult(status=ExecStatus.error, stderr="boom\n", session_id="")
    turns = [Turn(["<tool_call>x = 5"]), Turn(["<tool_call>print(x)"]), Turn(["\\boxed{5}"])]
    sandbox = FakeSandbox([_done(), lost, failed])
    _, result, _, sandbox = await run(turns, template="fewshot", sandbox=sandbox)
    assert f"\n```output\n{RESTORE_FAILED}```\n" in result.generation
    assert len(sandbox.calls) == 3  # the call itself is not run again


async def test_a_restart_by_timeout_keeps_the_history_for_later():
    killed = ExecResult(status=ExecStatus.timeout, state_lost=True, session_id="")
    turns = [
        Turn(["<tool_call>x = 5"]),
        Turn(["<tool_call>while True: pass"]),
        Turn(["<tool_call>print(x)"]),
        Turn(["\\boxed{5}"]),
    ]
    fresh = ExecResult(
        status=ExecStatus.error, stderr="NameError\n", state_lost=True, session_id=""
    )
    sandbox = FakeSandbox([_done(), killed, fresh, _done(), _done("5\n")])
    _, result, _, sandbox = await run(turns, template="fewshot", sandbox=sandbox)
    codes = [c["code"] for c in sandbox.calls]
    assert codes == ["x = 5", "while True: pass", "print(x)", "x = 5", "print(x)"]
    assert "\n```output\nTimed out\n```\n" in result.generation
    assert result.generation.endswith("\n```output\n5\n```\n\\boxed{5}")


async def test_output_is_cut_with_marker():
    big = ExecResult(status=ExecStatus.completed, stdout="x" * 50, session_id="")
    turns = [Turn(["<tool_call>print('x' * 50)"]), Turn(["\\boxed{1}"])]
    _, result, _, sandbox = await run(
        turns, template="fewshot", sandbox=FakeSandbox([big]), max_output_chars=10
    )
    assert "\n```output\nxxxxxxxxxx<output cut>\n```\n" in result.generation
    assert sandbox.calls[0]["max_output_chars"] == 10


async def test_output_cut_by_the_sandbox_gets_the_marker():
    flagged = ExecResult(
        status=ExecStatus.completed, stdout="y" * 10, truncated=True, session_id=""
    )
    turns = [Turn(["<tool_call>print('y' * 99)"]), Turn(["\\boxed{1}"])]
    _, result, _, _ = await run(
        turns, template="fewshot", sandbox=FakeSandbox([flagged]), max_output_chars=10
    )
    assert "\n```output\nyyyyyyyyyy<output cut>\n```\n" in result.generation


async def test_tool_budget_stops_the_sample():
    turns = [Turn(["<tool_call>print(1)"]), Turn(["<tool_call>print(2)"])]
    _, result, _, sandbox = await run(turns, template="fewshot", max_tool_calls=1)
    assert len(sandbox.calls) == 1 and result.finish_reason == "tool_budget"


async def test_tools_off_never_touches_the_sandbox():
    _, result, endpoint, sandbox = await run([Turn(["355. \\boxed{355}"])], tools=False)
    assert sandbox.calls == [] and result.answer == "355"
    assert endpoint.requests[0].get("stop") is None


async def test_generation_stops_at_the_first_complete_answer():
    turns = [Turn(["The answer is \\boxed{", "7}.", " Now some rambling", " more"])]
    _, result, _, _ = await run(turns, template="fewshot")
    assert result.generation == "The answer is \\boxed{7}."
    assert result.finish_reason == "answer"


async def test_token_budget_shrinks_across_turns():
    turns = [Turn(["<tool_call>", "print(1)"]), Turn(["\\boxed{1}"])]
    _, result, endpoint, _ = await run(turns, template="fewshot", max_tokens=100)
    assert endpoint.requests[0]["max_tokens"] == 100
    assert endpoint.requests[1]["max_tokens"] == 98
    # The second turn stops at its answer, before the usage report: one token per chunk.
    assert result.usage.completion_tokens == 3 and result.usage.prompt_tokens == 10


async def test_llm_failures_are_retried_then_reported():
    turns = [Turn(status=500), Turn(status=503), Turn(["\\boxed{1}"])]
    _, result, endpoint, _ = await run(turns, llm_kw={"retries": 2})
    assert len(endpoint.requests) == 3 and result.answer == "1" and result.error is None

    turns = [Turn(status=500)] * 3
    _, result, endpoint, _ = await run(turns, llm_kw={"retries": 2})
    assert len(endpoint.requests) == 3 and result.finish_reason == "error"
    assert (
        result.error == "model endpoint failed after 3 attempts: Error code: 500 - scripted failure"
    )


async def test_llm_4xx_is_not_retried():
    _, result, endpoint, _ = await run([Turn(status=400)], llm_kw={"retries": 3})
    assert len(endpoint.requests) == 1 and result.finish_reason == "error"
    assert result.error == "model endpoint rejected the request: Error code: 400 - scripted failure"


async def test_hanging_llm_times_out_then_errors_never_hangs():
    turns = [Turn(hang=True), Turn(hang=True)]
    _, result, _, _ = await run(turns, llm_kw={"retries": 1, "request_timeout_s": 0.2})
    assert result.finish_reason == "error"
    assert result.error == "model endpoint failed after 2 attempts: no response within 0.2 s"


async def test_dropped_stream_resumes_from_received_text():
    turns = [
        Turn(["<tool_", "call>print(", "never"], break_after=2),
        Turn(["6 * 7)"]),
        Turn(["\\boxed{42}"]),
    ]
    _, result, endpoint, sandbox = await run(turns, template="fewshot")
    assert endpoint.requests[1]["prompt"].endswith("<tool_call>print(")
    assert sandbox.calls[0]["code"] == "print(6 * 7)" and result.answer == "42"


async def test_wall_time_budget_ends_a_hanging_sample():
    turns = [Turn(hang=True)]
    _, result, _, _ = await run(turns, wall_time_s=0.3, llm_kw={"request_timeout_s": 60})
    assert result.finish_reason == "time"


async def test_sandbox_failure_is_retried_then_a_clear_error():
    turns = [Turn(["<tool_call>print(1)"]), Turn(["\\boxed{1}"])]
    sandbox = FakeSandbox([ConnectionError("container did not start")])
    _, result, _, sandbox = await run(turns, template="fewshot", sandbox=sandbox)
    assert result.answer == "1" and len(sandbox.calls) == 2

    turns = [Turn(["<tool_call>print(1)"])]
    sandbox = FakeSandbox([ConnectionError("sandbox service down")] * 3)
    _, result, _, _ = await run(turns, template="fewshot", sandbox=sandbox, sandbox_retries=2)
    assert result.finish_reason == "error" and len(sandbox.calls) == 3
    assert result.error == "the sandbox failed: ConnectionError: sandbox service down"


async def test_chat_mode_feeds_output_inside_the_assistant_message():
    turns = [Turn(["<tool_call>print(2 * 3)"]), Turn(["\\boxed{6}"])]
    _, result, endpoint, _ = await run(turns, template="fewshot", mode="chat")
    second = endpoint.requests[1]["messages"]
    assert second[-2] == {
        "role": "assistant",
        "content": "<tool_call>print(2 * 3)</tool_call>\n```output\n6\n```\n",
    }
    assert second[-1] == {"role": "user", "content": "continue"}
    assert result.answer == "6"


@pytest.mark.parametrize("kind", [ToolCallEvent, ToolResultEvent])
async def test_events_carry_the_sample_index(kind):
    turns = [Turn(["<tool_call>print(1)"]), Turn(["\\boxed{1}"])]
    events, _, _, _ = await run(turns, template="fewshot")
    assert [e.index for e in events if isinstance(e, kind)] == [0]
