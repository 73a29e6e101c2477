"""The tool-integrated reasoning loop: generate → run the code block → feed the output back.

One async generator serves streaming and non-streaming callers alike: it emits typed events
(:mod:`mathagent.agent.events`) and ends with a ``done`` event carrying the sample's record.
Errors split in two: what the model can act on (its code failed, timed out, lost state) goes
back into its context as text; what it cannot (the endpoint or the sandbox is down, the
budget is spent) ends the sample with a finish reason and a clear message.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass

from mathagent.agent.answer import extract_answer, last_boxed
from mathagent.agent.events import (
    AnswerEvent,
    DoneEvent,
    Event,
    TextEvent,
    ToolCallEvent,
    ToolResultEvent,
)
from mathagent.agent.formats import ChunkSplitter, CodeFormat, feedback_text
from mathagent.agent.llm import LLM, NOT_REPORTED, DeadlineExceeded, Finish, GenParams, LLMError
from mathagent.agent.prompts import PromptTemplate
from mathagent.agent.result import SampleResult, Timing, ToolCall, Usage
from mathagent.agent.retry import wait_to_retry
from mathagent.sandbox.base import ExecResult, Sandbox

# How long past its own time limit a sandbox call may take before the loop gives up on it.
SANDBOX_GRACE_S = 30.0


class SandboxFailure(Exception):
    """The sandbox itself failed (not the model's code)."""


@dataclass
class SampleParams:
    """Limits and sampling for one generation."""

    tools: bool = True
    max_tool_calls: int = 8
    max_tokens: int = 2048
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    code_timeout_s: float = 10.0
    max_output_chars: int = 1000
    remaining_notice: bool = False
    stop_on_answer: bool = True
    wall_time_s: float = 600.0
    sandbox_retries: int = 3
    backoff_s: float = 0.5


class SampleLoop:
    """One generation for one problem, in its own sandbox session."""

    def __init__(
        self,
        llm: LLM,
        sandbox: Sandbox | None,
        template: PromptTemplate,
        problem: str,
        params: SampleParams,
        index: int = 0,
        deadline: float | None = None,
    ) -> None:
        self.llm, self.sandbox, self.template = llm, sandbox, template
        self.problem, self.params, self.index = problem, params, index
        self.fmt: CodeFormat | None = template.code_format if params.tools else None
        if self.fmt is not None and sandbox is None:
            raise ValueError("tools are on but no sandbox was given")
        self.deadline = deadline
        self.generation = ""
        self.calls: list[ToolCall] = []
        self.usage = Usage()
        self.session_id: str | None = None
        self._model_s = self._sandbox_s = 0.0
        self._reason = "eos"
        self._started = time.perf_counter()

    def snapshot(self, finish_reason: str, error: str | None = None) -> SampleResult:
        """The sample's record as it stands (used at the end, or when it is cancelled)."""
        total = time.perf_counter() - self._started
        agent = max(total - self._model_s - self._sandbox_s, 0.0)
        return SampleResult(
            answer=extract_answer(self.generation),
            generation=self.generation,
            tool_calls=list(self.calls),
            finish_reason=finish_reason,
            num_generated_tokens=self.usage.completion_tokens,
            usage=self.usage.model_copy(),
            timing=Timing(
                total_s=total, model_s=self._model_s, sandbox_s=self._sandbox_s, agent_s=agent
            ),
            error=error,
        )

    async def events(self) -> AsyncIterator[Event]:
        """Run the sample, yielding events; the last one is ``done``."""
        loop = asyncio.get_running_loop()
        self._started = time.perf_counter()
        if self.deadline is None:
            self.deadline = loop.time() + self.params.wall_time_s
        error = None
        try:
            async with aclosing(self._run()) as steps:
                async for event in steps:
                    yield event
            reason = self._reason
        except DeadlineExceeded:
            reason = "time"
        except (LLMError, SandboxFailure) as exc:
            reason, error = "error", str(exc)
        finally:
            await self._close_session()
        result = self.snapshot(reason, error)
        if result.answer is not None:
            yield AnswerEvent(sample=self.index, answer=result.answer)
        yield DoneEvent(sample=self.index, result=result)

    async def _run(self) -> AsyncIterator[Event]:
        p, fmt = self.params, self.fmt
        messages = self.template.messages(self.problem, p.max_tool_calls)
        conv = self.llm.conversation(messages, **self.template.chat_kwargs)
        stop = [fmt.code_end] if fmt else []
        while True:
            if asyncio.get_running_loop().time() >= self.deadline:
                raise DeadlineExceeded
            left = p.max_tokens - self.usage.completion_tokens
            if left <= 0:
                self._reason = "length"
                return
            gen = GenParams(stop, left, p.temperature, p.top_p, p.seed)
            turn_start = len(self.generation)
            finish = None
            async for event in self._turn(conv, gen):
                if isinstance(event, Finish):
                    finish = event
                else:
                    yield event
            turn = self.generation[turn_start:]
            if finish is None:
                self._reason = "answer"
                return
            if finish.finish_reason == "length":
                self._reason = "length"
                return
            if fmt is not None and self._restore_stop(turn, finish):
                yield TextEvent(sample=self.index, text=fmt.code_end, code=True)
            if fmt is None or not fmt.ends_with_block(self.generation):
                self._reason = "answer" if extract_answer(self.generation) else "eos"
                return
            if len(self.calls) >= p.max_tool_calls:
                self._reason = "tool_budget"
                return
            async for event in self._tool(fmt.last_code(self.generation)):
                yield event

    async def _turn(self, conv, gen: GenParams) -> AsyncIterator[Event | Finish]:
        """Stream one completion; stop early once a final answer is complete (yields no Finish)."""
        splitter = ChunkSplitter(self.fmt)
        turn, chunks_seen = "", 0
        async with aclosing(self.llm.stream(conv, self.generation, gen, self.deadline)) as chunks:
            while True:
                started = time.perf_counter()
                item = await anext(chunks, None)
                self._model_s += time.perf_counter() - started
                if item is None:
                    break
                if isinstance(item, Finish):
                    self._add_usage(item)
                    for text, code in splitter.flush():
                        yield TextEvent(sample=self.index, text=text, code=code)
                    yield item
                    return
                turn += item
                chunks_seen += 1
                self.generation += item
                for text, code in splitter.feed(item):
                    yield TextEvent(sample=self.index, text=text, code=code)
                if self._answer_complete(turn, item):
                    # Stopped before the server's usage report: count one token per chunk.
                    self._add_usage(Finish(None, completion_tokens=chunks_seen))
                    break
        for text, code in splitter.flush():
            yield TextEvent(sample=self.index, text=text, code=code)

    def _answer_complete(self, turn: str, chunk: str) -> bool:
        if not self.params.stop_on_answer or "}" not in chunk or "\\boxed" not in turn:
            return False
        if self.fmt is not None and self.fmt.is_block_open(turn):
            return False
        return last_boxed(turn) is not None

    def _restore_stop(self, turn: str, finish: Finish) -> bool:
        """Append the code end tag when the server stopped on it without returning it."""
        fmt = self.fmt
        assert fmt is not None
        if finish.finish_reason != "stop" or not fmt.is_block_open(self.generation):
            return False
        if finish.stop_reason is not NOT_REPORTED and finish.stop_reason != fmt.code_end:
            return False  # the server says it stopped for another reason (EOS)
        self.generation += fmt.code_end
        return True

    async def _tool(self, code: str) -> AsyncIterator[Event]:
        p, fmt, index = self.params, self.fmt, len(self.calls)
        assert fmt is not None and self.sandbox is not None
        yield ToolCallEvent(sample=self.index, index=index, code=code)
        res = await self._execute(code)
        call = ToolCall(
            code=code,
            status=res.status.value,
            stdout=res.stdout,
            stderr=res.stderr,
            state_lost=res.state_lost,
            duration_s=res.duration_s,
        )
        self.calls.append(call)
        remaining = p.max_tool_calls - len(self.calls) if p.remaining_notice else None
        output = fmt.output_block(
            feedback_text(res, p.max_output_chars, p.code_timeout_s), remaining
        )
        self.generation += output
        yield ToolResultEvent(sample=self.index, index=index, call=call, output=output)

    async def _execute(self, code: str) -> ExecResult:
        """Run ``code``; failures of the sandbox itself (not of the code) are retried."""
        assert self.deadline is not None
        p, started = self.params, time.perf_counter()
        try:
            for attempt in range(p.sandbox_retries + 1):
                try:
                    return await self._execute_once(code)
                except SandboxFailure:
                    last = attempt == p.sandbox_retries
                    if last or not await wait_to_retry(attempt + 1, p.backoff_s, self.deadline):
                        raise
            raise AssertionError("unreachable")
        finally:
            self._sandbox_s += time.perf_counter() - started

    async def _execute_once(self, code: str) -> ExecResult:
        assert self.sandbox is not None and self.deadline is not None
        loop, p = asyncio.get_running_loop(), self.params
        limit = min(loop.time() + p.code_timeout_s + SANDBOX_GRACE_S, self.deadline)
        try:
            async with asyncio.timeout_at(limit):
                res = await self.sandbox.execute(
                    code,
                    self.session_id,
                    timeout=p.code_timeout_s,
                    max_output_chars=p.max_output_chars,
                )
        except TimeoutError as exc:
            if loop.time() >= self.deadline:
                raise DeadlineExceeded from exc
            raise SandboxFailure(
                f"the sandbox did not answer within {p.code_timeout_s + SANDBOX_GRACE_S:g} s"
            ) from exc
        except Exception as exc:
            raise SandboxFailure(f"the sandbox failed: {type(exc).__name__}: {exc}") from exc
        self.session_id = res.session_id
        return res

    def _add_usage(self, finish: Finish) -> None:
        self.usage.prompt_tokens += finish.prompt_tokens
        self.usage.completion_tokens += finish.completion_tokens
        self.usage.total_tokens = self.usage.prompt_tokens + self.usage.completion_tokens

    async def _close_session(self) -> None:
        if self.session_id is None or self.sandbox is None:
            return
        session, self.session_id = self.session_id, None
        # Best effort: a session that fails to close is reaped by the pool's idle timeout.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(SANDBOX_GRACE_S):
                await self.sandbox.close_session(session)
