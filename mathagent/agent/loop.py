"""The tool-integrated reasoning loop: generate → run the call → feed the output back.

One async generator serves streaming and non-streaming callers alike: it emits typed events
(:mod:`mathagent.agent.events`) and ends with a ``done`` event carrying the sample's record.
Errors split in two: what the model can act on (its code failed, timed out, called an unknown
tool) goes back into its context as text; what it cannot (the endpoint or the sandbox is down,
the server mangled the text, the budget is spent) ends the sample with a finish reason and a
clear message.
"""

from __future__ import annotations

import asyncio
import json
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
from mathagent.agent.families import Family
from mathagent.agent.feedback import feedback_text
from mathagent.agent.formats import ChunkSplitter, ToolSyntax, TurnEnd
from mathagent.agent.llm import LLM, DeadlineExceeded, LLMError
from mathagent.agent.request import Conversation, Finish, GenParams
from mathagent.agent.result import SampleResult, Timing, ToolCall, Usage
from mathagent.agent.segments import SegmentLog
from mathagent.agent.session import CodeSession, SandboxFailure, SessionLimits
from mathagent.sandbox.base import Sandbox


class TextRejected(Exception):
    """The server returned text the loop cannot read (e.g. special tokens stripped)."""


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
    reasoning_effort: str = "high"
    date: str | None = None  # harmony's conversation date; None = today


class SampleLoop:
    """One generation for one problem, in its own sandbox session."""

    def __init__(
        self,
        llm: LLM,
        sandbox: Sandbox | None,
        family: Family,
        problem: str,
        params: SampleParams,
        index: int = 0,
        deadline: float | None = None,
    ) -> None:
        self.llm, self.family, self.problem = llm, family, problem
        self.params, self.index = params, index
        self.syntax: ToolSyntax | None = family.syntax if params.tools else None
        if self.syntax is not None and sandbox is None:
            raise ValueError("tools are on but no sandbox was given")
        limits = SessionLimits(
            params.code_timeout_s, params.max_output_chars, params.sandbox_retries, params.backoff_s
        )
        self.session = CodeSession(sandbox, limits) if sandbox is not None else None
        self.deadline = deadline
        self.generation = ""
        self.calls: list[ToolCall] = []
        self.log = SegmentLog()
        self.usage = Usage()
        self._model_s = 0.0
        self._reason, self._error = "eos", None
        self._seen: tuple[int, int] | None = None  # (tokens the server counted, chars they cover)
        self._started = time.perf_counter()

    def snapshot(self, finish_reason: str, error: str | None = None) -> SampleResult:
        """The sample's record as it stands (used at the end, or when it is cancelled)."""
        total = time.perf_counter() - self._started
        sandbox_s = self.session.busy_s if self.session else 0.0
        region = self.family.answer_text(self.generation)
        return SampleResult(
            answer=extract_answer(region) if region is not None else None,
            generation=self.generation,
            tool_calls=list(self.calls),
            finish_reason=finish_reason,
            num_generated_tokens=self.usage.completion_tokens,
            usage=self.usage.model_copy(),
            timing=Timing(
                total_s=total,
                model_s=self._model_s,
                sandbox_s=sandbox_s,
                agent_s=max(total - self._model_s - sandbox_s, 0.0),
            ),
            error=error,
            segments=[s.model_copy() for s in self.log.segments],
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
                    self.log.add(event)
                    yield event
            reason, error = self._reason, self._error
        except DeadlineExceeded:
            reason = "time"
        except (LLMError, SandboxFailure, TextRejected) as exc:
            reason, error = "error", str(exc)
        finally:
            if self.session is not None:
                await self.session.close()
        result = self.snapshot(reason, error)
        if result.answer is not None:
            yield AnswerEvent(sample=self.index, answer=result.answer)
        yield DoneEvent(sample=self.index, result=result)

    async def _run(self) -> AsyncIterator[Event]:
        p, syntax, llm = self.params, self.syntax, self.llm
        chat = llm.mode == "chat"
        conv = self.family.conversation(
            self.problem,
            tools=p.tools,
            max_tool_calls=p.max_tool_calls,
            chat=chat,
            chat_template=llm.chat_template,
            reasoning_effort=p.reasoning_effort,
            date=p.date,
        )
        stop = list(syntax.stop) if syntax else []
        extras = self.family.chat_extras if chat else self.family.text_extras
        while True:
            if asyncio.get_running_loop().time() >= self.deadline:
                raise DeadlineExceeded
            context = syntax.context(self.generation) if syntax else self.generation
            left = self._budget(conv, context)
            if left <= 0:
                self._reason = "length"
                return
            gen = GenParams(stop, left, p.temperature, p.top_p, p.seed, dict(extras))
            turn_start = len(self.generation)
            finish = None
            async for event in self._turn(conv, context, gen):
                if isinstance(event, Finish):
                    finish = event
                else:
                    yield event
            turn = self.generation[turn_start:]
            if (problem := self.family.syntax.check_turn(turn)) is not None:
                raise TextRejected(problem)
            if finish is None:
                self._reason = "answer"
                return
            self._remember_usage(finish, len(context) + len(turn))
            end = syntax.end_turn(self.generation, finish) if syntax else TurnEnd()
            if end.restored:
                self.generation += end.restored
                yield TextEvent(sample=self.index, text=end.restored, code=True)
            if finish.finish_reason == "length" or end.error:
                self._reason = "length" if finish.finish_reason == "length" else "eos"
                self._error = end.error
                return
            if end.code is None:
                self._reason = "answer" if self._answer() else "eos"
                return
            if len(self.calls) >= p.max_tool_calls:
                self._reason = "tool_budget"
                return
            async for event in self._tool(end):
                yield event

    def _budget(self, conv: Conversation, context: str) -> int:
        """Tokens the next turn may generate: what is left, within the server's context."""
        left = self.params.max_tokens - self.usage.completion_tokens
        limit = self.llm.context_len
        if limit is None:
            return left
        if self._seen is None:  # nothing counted by the server yet: count the prompt here
            prompt = conv.prompt if conv.prompt is not None else json.dumps(conv.messages)
            used = self._count(prompt + context)
        else:
            tokens, chars = self._seen
            used = tokens + self._count(context[chars:])
        return min(left, limit - used)

    def _count(self, text: str) -> int:
        if not text:
            return 0
        template = self.llm.chat_template
        counted = template.count(text) if template is not None else None
        # Without a tokenizer, two characters a token over-counts math and code text: the
        # request then stays inside the context.
        return counted if counted is not None else len(text) // 2 + 1

    def _remember_usage(self, finish: Finish, chars: int) -> None:
        if finish.prompt_tokens:
            self._seen = (finish.prompt_tokens + finish.completion_tokens, chars)

    async def _turn(
        self, conv: Conversation, context: str, gen: GenParams
    ) -> AsyncIterator[Event | Finish]:
        """Stream one completion; stop early once a final answer is complete (yields no Finish)."""
        splitter = ChunkSplitter(self.syntax)
        turn, chunks_seen = "", 0
        async with aclosing(self.llm.stream(conv, context, gen, self.deadline)) as chunks:
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
        """A final answer closed in this turn, outside any call and after any thinking."""
        if not self.params.stop_on_answer or "}" not in chunk or "\\boxed" not in turn:
            return False
        if self.syntax is not None and self.syntax.is_open(self.generation):
            return False
        region = self.family.answer_text(self.generation)
        if region is None:
            return False
        return last_boxed(region[-len(turn) :]) is not None

    def _answer(self) -> bool:
        region = self.family.answer_text(self.generation)
        return region is not None and extract_answer(region) is not None

    async def _tool(self, end: TurnEnd) -> AsyncIterator[Event]:
        p, index = self.params, len(self.calls)
        assert self.syntax is not None and self.session is not None and self.deadline
        code = end.code or ""
        yield ToolCallEvent(sample=self.index, index=index, code=code)
        if end.reply is not None:  # nothing to run: the model reads why
            call, output = ToolCall(code=code, status="error", stderr=end.reply), end.reply
            self.calls.append(call)
        else:
            res = await self.session.run(code, self.deadline)
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
            output = self.syntax.output_block(
                feedback_text(res, p.max_output_chars), remaining, end
            )
        self.generation += output
        yield ToolResultEvent(sample=self.index, index=index, call=call, output=output)

    def _add_usage(self, finish: Finish) -> None:
        self.usage.prompt_tokens += finish.prompt_tokens
        self.usage.completion_tokens += finish.completion_tokens
        self.usage.total_tokens = self.usage.prompt_tokens + self.usage.completion_tokens
