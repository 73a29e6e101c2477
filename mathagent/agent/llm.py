"""The model side of the loop: one streaming request through an OpenAI-compatible client.

Completions mode renders the conversation with the model's chat template once and appends the
assistant text so far, so tool output lands inside the assistant turn. Chat mode sends
messages instead (the partial answer as an assistant message followed by "continue", as
NeMo-Skills does for chat endpoints). Failures are retried with exponential backoff, resuming
from the text already received; what still fails becomes one :class:`LLMError`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import openai

from mathagent.agent.prompts import ChatTemplate, Message
from mathagent.agent.retry import wait_to_retry
from mathagent.config import AgentSettings

# vLLM reports which stop string ended a completion; others omit the field.
NOT_REPORTED = object()


class LLMError(Exception):
    """The model endpoint failed for good (after retries, or with a 4xx)."""


class DeadlineExceeded(Exception):
    """The wall-time budget ran out while waiting for the model."""


class _Retryable(Exception):
    pass


@dataclass
class Finish:
    """How a streamed completion ended."""

    finish_reason: str | None
    stop_reason: Any = NOT_REPORTED
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class GenParams:
    """Per-request sampling parameters."""

    stop: list[str]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass
class Conversation:
    """What is sent before the assistant text: a rendered prompt or chat messages."""

    prompt: str | None = None
    messages: list[Message] = field(default_factory=list)


class LLM:
    """Streams completions from one model behind an OpenAI-compatible endpoint."""

    def __init__(
        self,
        client: openai.AsyncOpenAI,
        model: str,
        chat_template: ChatTemplate | None = None,
        mode: Literal["completions", "chat"] = "completions",
        request_timeout_s: float = 300.0,
        retries: int = 3,
        backoff_s: float = 0.5,
    ) -> None:
        if mode == "completions" and chat_template is None:
            raise ValueError("completions mode needs the model's chat template")
        self.client, self.model, self.mode = client, model, mode
        self.chat_template = chat_template
        self.request_timeout_s, self.retries, self.backoff_s = request_timeout_s, retries, backoff_s

    def conversation(self, messages: list[Message], **chat_kwargs: Any) -> Conversation:
        """Prepare a conversation once per sample (renders the chat template in completions mode)."""
        if self.mode == "chat":
            return Conversation(messages=messages)
        assert self.chat_template is not None
        return Conversation(prompt=self.chat_template.render(messages, **chat_kwargs))

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
                now = GenParams(params.stop, budget, params.temperature, params.top_p, params.seed)
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
            except _Retryable as exc:
                last = str(exc)
                # A failed attempt still cost its streamed tokens (one chunk ~ one token).
                spent += chunks
        raise LLMError(f"model endpoint failed after {self.retries + 1} attempts: {last}")

    async def _attempt(
        self, conv: Conversation, generation: str, params: GenParams, deadline: float
    ) -> AsyncIterator[str | Finish]:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(min(loop.time() + self.request_timeout_s, deadline)):
                stream = await self._open(conv, generation, params)
        except TimeoutError as exc:
            raise self._timeout(deadline) from exc
        except openai.APIStatusError as exc:
            raise _classify(exc) from exc
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
        finally:
            await _close(stream)
        if finish is None or finish.finish_reason is None:
            raise _Retryable("the stream ended without a finish reason")
        yield finish

    def _timeout(self, deadline: float) -> Exception:
        if asyncio.get_running_loop().time() >= deadline:
            return DeadlineExceeded()
        return _Retryable(f"no response within {self.request_timeout_s:g} s")

    async def _open(self, conv: Conversation, generation: str, params: GenParams) -> Any:
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
        if self.mode == "completions":
            return await self.client.completions.create(prompt=conv.prompt + generation, **common)
        messages = list(conv.messages)
        if generation:
            messages += [
                {"role": "assistant", "content": generation},
                {"role": "user", "content": "continue"},
            ]
        return await self.client.chat.completions.create(messages=messages, **common)

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


async def _close(stream: Any) -> None:
    """Close the response so the server stops generating; a broken connection is fine."""
    with contextlib.suppress(openai.APIError, httpx.HTTPError, OSError):
        await stream.close()


def _classify(exc: openai.APIStatusError) -> Exception:
    """5xx, 408 and 429 are worth retrying; other 4xx mean the request itself is wrong."""
    if exc.status_code >= 500 or exc.status_code in (408, 429):
        return _Retryable(exc.message)
    return LLMError(f"model endpoint rejected the request: {exc.message}")


def open_llm(
    base_url: str,
    model: str,
    settings: AgentSettings,
    api_key: str = "EMPTY",
    chat_template: ChatTemplate | None = None,
) -> LLM:
    """An :class:`LLM` for an endpoint: completions mode with a chat template, else chat.

    The caller finds the template (the runtime: the engine's own tokenizer, or local files);
    ``api_mode`` ``completions`` without one is an error, ``chat`` ignores it.
    """
    mode = settings.api_mode
    if mode == "completions" and chat_template is None:
        raise LLMError(f"completions mode needs the chat template of {model!r}")
    if mode == "auto":
        mode = "completions" if chat_template is not None else "chat"
    client = openai.AsyncOpenAI(
        base_url=base_url, api_key=api_key, max_retries=0, timeout=settings.request_timeout_s
    )
    return LLM(
        client,
        model,
        chat_template=chat_template if mode == "completions" else None,
        mode=mode,
        request_timeout_s=settings.request_timeout_s,
        retries=settings.retries,
        backoff_s=settings.backoff_s,
    )


async def served_model(base_url: str, api_key: str = "EMPTY") -> str:
    """The first model an endpoint lists (for ``--base-url`` without ``--model``)."""
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=1) as client:
        try:
            models = await client.models.list()
        except openai.APIError as exc:
            raise LLMError(f"cannot list the models at {base_url}: {exc}") from exc
    if not models.data:
        raise LLMError(f"the endpoint at {base_url} serves no model")
    return models.data[0].id
