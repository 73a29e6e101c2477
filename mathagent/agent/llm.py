"""The model side of the loop: one streaming request through an OpenAI-compatible client.

Completions mode sends the rendered prompt with the assistant text so far appended, so tool
output lands inside the assistant turn. Chat mode sends messages instead (the partial answer as
an assistant message followed by "continue", as NeMo-Skills does for chat endpoints). Failures
are retried with exponential backoff, resuming from the text already received; what still fails
becomes one :class:`LLMError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx
import openai

from mathagent.agent.refusals import context_room
from mathagent.agent.replicas import NoReplica, Replica, ReplicaSet
from mathagent.agent.request import Conversation, Finish, GenParams
from mathagent.agent.retry import wait_to_retry
from mathagent.config import AgentSettings


class LLMError(Exception):
    """The model endpoint failed for good (after retries, or with a 4xx)."""


class DeadlineExceeded(Exception):
    """The wall-time budget ran out while waiting for the model."""


class _Retryable(Exception):
    """Worth another attempt; ``replica_down`` says the server itself failed (not a 408/429)."""

    def __init__(self, message: str, replica_down: bool = True) -> None:
        super().__init__(message)
        self.replica_down = replica_down


class LLM:
    """Streams completions from one model behind one or more OpenAI-compatible endpoints.

    ``client``: one endpoint's client, or a :class:`ReplicaSet` (each attempt leases the least
    loaded replica; one that fails is taken out). ``chat_template`` (completions mode) is what the prompt renderer uses; ``context_len`` is the
    server's context (``max_model_len`` of ``/v1/models``) when it reports one.
    """

    def __init__(
        self,
        client: openai.AsyncOpenAI | ReplicaSet,
        model: str,
        chat_template: Any = None,
        mode: Literal["completions", "chat"] = "completions",
        request_timeout_s: float = 300.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        context_len: int | None = None,
    ) -> None:
        if not isinstance(client, ReplicaSet):
            client = ReplicaSet([Replica(str(client.base_url), client)], backoff_s)
        self.replicas, self.model, self.mode = client, model, mode
        self.chat_template, self.context_len = chat_template, context_len
        self.request_timeout_s, self.retries, self.backoff_s = request_timeout_s, retries, backoff_s

    @property
    def client(self) -> openai.AsyncOpenAI:
        """The first replica's client (the only one for a single endpoint)."""
        return self.replicas.replicas[0].client

    async def stream(
        self, conv: Conversation, generation: str, params: GenParams, deadline: float
    ) -> AsyncIterator[str | Finish]:
        """Yield text chunks, then one :class:`Finish`; retry failures, resuming mid-text."""
        partial, spent, prompt_tokens, last = "", 0, 0, ""
        for attempt in range(self.retries + 1):
            if attempt and not await wait_to_retry(attempt, self.backoff_s, deadline):
                raise DeadlineExceeded
            budget = params.max_tokens - spent
            if budget <= 0:
                yield Finish("length", prompt_tokens=prompt_tokens, completion_tokens=spent)
                return
            chunks = 0
            try:
                now = dataclasses.replace(params, max_tokens=budget)
                async for item in self._attempt(conv, generation + partial, now, deadline):
                    if isinstance(item, str):
                        partial += item
                        chunks += 1
                        yield item
                        continue
                    item.prompt_tokens += prompt_tokens
                    item.completion_tokens = spent + (item.completion_tokens or chunks)
                    yield item
                    return
            except NoReplica as exc:
                raise LLMError(str(exc)) from exc
            except _Retryable as exc:
                last = str(exc)
                # A failed attempt still cost its streamed tokens (one chunk ~ one token).
                spent += chunks
        raise LLMError(f"model endpoint failed after {self.retries + 1} attempts: {last}")

    async def _attempt(
        self, conv: Conversation, generation: str, params: GenParams, deadline: float
    ) -> AsyncIterator[str | Finish]:
        """One request on a leased replica; a failure of the replica's own takes it out."""
        # Waiting for a replica to come back is bounded like waiting for a response.
        wait_until = min(deadline, asyncio.get_running_loop().time() + self.request_timeout_s)
        async with self.replicas.lease(wait_until) as replica:
            chunks, finished = 0, False
            try:
                async for item in self._request(replica, conv, generation, params, deadline):
                    replica.seen_alive = True  # it answered
                    if isinstance(item, Finish):
                        replica.completion_tokens += item.completion_tokens or chunks
                        finished = True
                    else:
                        chunks += 1
                    yield item
            except _Retryable as exc:
                if exc.replica_down:
                    self.replicas.fail(replica)
                raise
            finally:
                if not finished:  # cut short (a failure, or the agent stopped at the answer)
                    replica.completion_tokens += chunks

    async def _request(
        self, replica: Replica, conv: Conversation, gen: str, params: GenParams, deadline: float
    ) -> AsyncIterator[str | Finish]:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(min(loop.time() + self.request_timeout_s, deadline)):
                stream = await self._open(replica.client, conv, gen, params)
        except TimeoutError as exc:
            raise self._timeout(deadline) from exc
        except openai.APIStatusError as exc:
            room = context_room(exc.status_code, exc.message)  # None: not about the context
            if room is None:
                raise _classify(exc) from exc
            if 0 < room < params.max_tokens:  # the server counts the prompt longer: what fits
                fitted = dataclasses.replace(params, max_tokens=room)
                async for item in self._request(replica, conv, gen, fitted, deadline):
                    yield item
            else:  # the context is spent: the end a server that cuts the request short gives
                yield Finish("length")
            return
        except (openai.APIConnectionError, httpx.HTTPError) as exc:
            raise _Retryable(f"{type(exc).__name__}: {exc}") from exc
        finish: Finish | None = None
        try:
            iterator = stream.__aiter__()
            while True:
                try:
                    async with asyncio.timeout_at(
                        min(loop.time() + self.request_timeout_s, deadline)
                    ):
                        chunk = await anext(iterator, None)
                except TimeoutError as exc:
                    raise self._timeout(deadline) from exc
                except (openai.APIError, httpx.HTTPError) as exc:
                    raise _Retryable(f"{type(exc).__name__}: {exc}") from exc
                if chunk is None:
                    break
                text, finish = self._parse(chunk, finish)
                if text:
                    yield text
        finally:  # the server stops generating; a broken connection is fine
            with contextlib.suppress(openai.APIError, httpx.HTTPError, OSError):
                await stream.close()
        if finish is None or finish.finish_reason is None:
            raise _Retryable("the stream ended without a finish reason")
        yield finish

    def _timeout(self, deadline: float) -> Exception:
        if asyncio.get_running_loop().time() >= deadline:
            return DeadlineExceeded()
        return _Retryable(f"no response within {self.request_timeout_s:g} s")

    async def _open(
        self, client: openai.AsyncOpenAI, conv: Conversation, generation: str, params: GenParams
    ) -> Any:
        common: dict[str, Any] = {
            "model": self.model,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max(params.max_tokens, 1),
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop": params.stop or None,
        }
        if params.seed is not None:
            common["seed"] = params.seed
        if params.extra:
            common["extra_body"] = params.extra
        if self.mode == "completions":
            return await client.completions.create(prompt=conv.prompt + generation, **common)
        messages = list(conv.messages)
        if generation:
            messages += [
                {"role": "assistant", "content": generation},
                {"role": "user", "content": "continue"},
            ]
        return await client.chat.completions.create(messages=messages, **common)

    def _parse(self, chunk: Any, finish: Finish | None) -> tuple[str, Finish | None]:
        if chunk.usage is not None:
            finish = finish or Finish(finish_reason=None)
            finish.prompt_tokens = chunk.usage.prompt_tokens or 0
            finish.completion_tokens = chunk.usage.completion_tokens or 0
        if not chunk.choices:
            return "", finish
        choice = chunk.choices[0]
        text = choice.text if self.mode == "completions" else (choice.delta.content or "")
        if choice.finish_reason is not None:
            finish = finish or Finish(finish_reason=None)
            finish.finish_reason = choice.finish_reason
            extra = choice.model_extra or {}
            if "stop_reason" in extra:
                finish.stop_reason = extra["stop_reason"]
        return text or "", finish


def _classify(exc: openai.APIStatusError) -> Exception:
    """5xx, 408 and 429 are worth retrying; other 4xx mean the request itself is wrong."""
    if exc.status_code >= 500 or exc.status_code in (408, 429):
        return _Retryable(exc.message, replica_down=exc.status_code >= 500)
    return LLMError(f"model endpoint rejected the request: {exc.message}")


def open_llm(
    base_url: str | list[str],
    model: str,
    settings: AgentSettings,
    api_key: str = "EMPTY",
    chat_template: Any = None,
    context_len: int | None = None,
    renders_itself: bool = False,
) -> LLM:
    """An :class:`LLM` for an endpoint (or replicas of one): completions mode when the prompt
    can be rendered here.

    The caller finds the template (the runtime: the engine's own tokenizer, or local files);
    ``renders_itself`` says the model family renders its own prompt text (gpt-oss' harmony), so
    completions mode needs no template. ``api_mode`` ``completions`` without a way to render is
    an error; ``chat`` never renders here.
    """
    mode = settings.api_mode
    can_render = chat_template is not None or renders_itself
    if mode == "completions" and not can_render:
        raise LLMError(f"completions mode needs the chat template of {model!r}")
    if mode == "auto":
        mode = "completions" if can_render else "chat"
    urls = [base_url] if isinstance(base_url, str) else list(base_url)
    replicas = ReplicaSet.open(urls, api_key, settings.request_timeout_s, settings.backoff_s)
    return LLM(
        replicas,
        model,
        chat_template=chat_template if mode == "completions" else None,
        mode=mode,
        request_timeout_s=settings.request_timeout_s,
        retries=settings.retries,
        backoff_s=settings.backoff_s,
        context_len=context_len,
    )
