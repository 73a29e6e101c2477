"""Samples of one problem run concurrently, then a majority vote (the AIMO-2 Kaggle recipe).

Optional early stop cancels the remaining samples once ``early_stop`` finished samples agree;
the per-problem time budget bounds every sample. Cancelled samples keep their partial text
with ``finish_reason = "cancelled"``.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing

from pydantic import BaseModel, Field

from mathagent.agent.answer import cluster_answers
from mathagent.agent.events import DoneEvent, Event, ResultEvent
from mathagent.agent.llm import LLM
from mathagent.agent.loop import SampleLoop, SampleParams
from mathagent.agent.plan import AgentPlan, plan_for
from mathagent.agent.result import SampleResult, SolveResult, Timing, ToolCall, Usage
from mathagent.config import AgentSettings
from mathagent.sandbox.base import Sandbox

# The solver waits this long past the budget for samples to wind down before cancelling them.
WIND_DOWN_S = 5.0


class SolveOptions(BaseModel):
    """Per-problem knobs; unset fields take the :class:`AgentSettings` defaults."""

    tools: bool = True
    samples: int | None = Field(None, ge=1)
    max_tool_calls: int | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    early_stop: int | None = Field(None, ge=0, description="stop once this many samples agree")
    wall_time_s: float | None = Field(None, gt=0)
    seed: int | None = None


def majority_vote(answers: list[str | None]) -> str | None:
    """The answer of the largest cluster of equal answers (equal as the grader judges them:
    ``1/2``, ``\\frac{1}{2}`` and ``0.5`` are one answer); ties go to the cluster of the
    earliest sample, no-answers do not vote. Returns that cluster's first answer.

    Symbolic comparisons may take a while: async callers run this in a thread.
    """
    labels = cluster_answers(answers)
    counts = Counter(label for label in labels if label is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(
        a for a, k in zip(answers, labels, strict=True) if k is not None and counts[k] == best
    )


class Solver:
    """Solves problems with one model endpoint and one sandbox."""

    def __init__(
        self,
        llm: LLM,
        sandbox: Sandbox | None,
        settings: AgentSettings,
    ) -> None:
        self.llm, self.sandbox, self.settings = llm, sandbox, settings
        self.plan: AgentPlan = plan_for(settings, llm.model)

    def _params(self, o: SolveOptions) -> tuple[SampleParams, int, int]:
        s, plan = self.settings, self.plan
        params = SampleParams(
            tools=o.tools,
            max_tool_calls=plan.max_tool_calls if o.max_tool_calls is None else o.max_tool_calls,
            max_tokens=o.max_tokens or plan.max_tokens,
            temperature=plan.temperature if o.temperature is None else o.temperature,
            top_p=o.top_p or plan.top_p,
            seed=o.seed if o.seed is not None else s.seed,
            code_timeout_s=plan.code_timeout_s,
            max_output_chars=plan.max_output_chars,
            remaining_notice=plan.remaining_notice,
            stop_on_answer=s.stop_on_answer,
            wall_time_s=o.wall_time_s or plan.wall_time_s,
            sandbox_retries=s.retries,
            backoff_s=s.backoff_s,
            reasoning_effort=plan.reasoning_effort,
            date=s.conversation_date,
        )
        early = plan.early_stop if o.early_stop is None else o.early_stop
        return params, o.samples or plan.samples, early

    def _loop(
        self, problem: str, params: SampleParams, sample: int, deadline: float | None = None
    ) -> SampleLoop:
        p = SampleParams(**params.__dict__)
        if p.seed is not None:
            p.seed += sample
        return SampleLoop(self.llm, self.sandbox, self.plan.family, problem, p, sample, deadline)

    def _loops(
        self, problem: str, o: SolveOptions, sample_ids: Sequence[int] | None
    ) -> tuple[list[SampleLoop], int, float]:
        params, n, early = self._params(o)
        deadline = asyncio.get_running_loop().time() + params.wall_time_s
        ids = range(n) if sample_ids is None else sample_ids
        return [self._loop(problem, params, i, deadline) for i in ids], early, deadline

    async def stream(
        self,
        problem: str,
        options: SolveOptions | None = None,
        sample_ids: Sequence[int] | None = None,
    ) -> AsyncIterator[Event]:
        """Yield every sample's events as they happen, then one ``result`` event.

        ``sample_ids`` (default ``0..samples-1``) numbers the samples (seed + number), so an
        evaluator can run again only the samples it lacks.
        """
        started = time.perf_counter()
        loops, early, deadline = self._loops(problem, options or SolveOptions(), sample_ids)
        queue: asyncio.Queue[Event | None] = asyncio.Queue()
        tasks = [asyncio.create_task(self._pump(lp, queue)) for lp in loops]
        done: dict[int, SampleResult] = {}
        unfinished = "cancelled"
        try:
            while len(done) < len(loops):
                event = await self._next(queue, deadline)
                if event is None:
                    unfinished = "time"
                    break
                yield event
                if isinstance(event, DoneEvent):
                    done[event.sample] = event.result
                    if early and await asyncio.to_thread(_agreed, done, early):
                        break
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        samples = [done.get(lp.index) or lp.snapshot(unfinished) for lp in loops]
        answer = await asyncio.to_thread(majority_vote, [s.answer for s in samples])
        yield ResultEvent(result=_combine(samples, answer, time.perf_counter() - started))

    async def solve(
        self,
        problem: str,
        options: SolveOptions | None = None,
        sample_ids: Sequence[int] | None = None,
    ) -> SolveResult:
        """Solve without streaming (the same code path as :meth:`stream`)."""
        result = None
        async with aclosing(self.stream(problem, options, sample_ids)) as events:
            async for event in events:
                if isinstance(event, ResultEvent):
                    result = event.result
        assert result is not None
        return result

    async def solve_sample(
        self, problem: str, sample: int, options: SolveOptions | None = None
    ) -> SampleResult:
        """Run only sample number ``sample`` (seed + sample), e.g. for a batch evaluator."""
        params, _, _ = self._params(options or SolveOptions())
        loop = self._loop(problem, params, sample)
        result = None
        async with aclosing(loop.events()) as events:
            async for event in events:
                if isinstance(event, DoneEvent):
                    result = event.result
        assert result is not None
        return result

    @staticmethod
    async def _pump(loop: SampleLoop, queue: asyncio.Queue[Event | None]) -> None:
        try:
            async with aclosing(loop.events()) as events:
                async for event in events:
                    queue.put_nowait(event)
        except Exception as exc:  # a bug must not leave the solver waiting for this sample
            error = f"internal error: {type(exc).__name__}: {exc}"
            queue.put_nowait(DoneEvent(sample=loop.index, result=loop.snapshot("error", error)))

    @staticmethod
    async def _next(queue: asyncio.Queue[Event | None], deadline: float) -> Event | None:
        try:
            async with asyncio.timeout_at(deadline + WIND_DOWN_S):
                return await queue.get()
        except TimeoutError:
            return None


def _agreed(done: dict[int, SampleResult], k: int) -> bool:
    """``k`` finished samples state one answer (clustered as the vote clusters them)."""
    counts = Counter(label for label in cluster_answers(_answers(done)) if label is not None)
    return bool(counts) and max(counts.values()) >= k


def _answers(done: dict[int, SampleResult]) -> list[str | None]:
    """Answers in sample order, so clusters (and ties) do not depend on finishing order."""
    return [done[i].answer for i in sorted(done)]


def _combine(samples: list[SampleResult], answer: str | None, wall_s: float) -> SolveResult:
    """Vote and add up; with concurrent samples the time parts sum to more than ``total_s``."""
    usage = Usage()
    timing = Timing(total_s=wall_s)
    calls: list[ToolCall] = []
    for s in samples:
        usage.prompt_tokens += s.usage.prompt_tokens
        usage.completion_tokens += s.usage.completion_tokens
        timing.model_s += s.timing.model_s
        timing.sandbox_s += s.timing.sandbox_s
        timing.agent_s += s.timing.agent_s
        calls.extend(s.tool_calls)
    usage.total_tokens = usage.prompt_tokens + usage.completion_tokens
    errors = [s.error for s in samples if s.error]
    return SolveResult(
        answer=answer,
        samples=samples,
        tool_calls=calls,
        usage=usage,
        timing=timing,
        error=errors[0] if errors and len(errors) == len(samples) else None,
    )
