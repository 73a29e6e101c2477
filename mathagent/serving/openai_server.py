"""OpenAI-compatible HTTP app over the embedded engine (FastAPI + SSE).

The engine steps in its own thread (:class:`AsyncEngine`); handlers only await outputs, so many
requests share each decode step. A client that goes away mid-request has its request aborted,
which frees the slot. A body larger than any prompt the model's context can hold is refused
with 413 before it is read (:class:`~mathagent.body_limit.BodyLimit`). Starting it:
:mod:`mathagent.serving.embedded`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.sse import EventSourceResponse, format_sse_event

from mathagent.body_limit import BodyLimit
from mathagent.http_errors import SafeJSONResponse
from mathagent.serving.engine.async_engine import AsyncEngine
from mathagent.serving.engine.llm_engine import PromptError
from mathagent.serving.engine.sequence import RequestOutput
from mathagent.serving.metrics import ServerMetrics
from mathagent.serving.protocol import ChatCompletionRequest, CompletionRequest

# One response body from the text so far, the output it came with (None: a usage-only chunk)
# and the request id.
Render = Callable[[str, RequestOutput | None, str], dict[str, Any]]
# A context's worth of prompt is at most ~6 bytes of JSON per character (\uXXXX escapes) and
# ~4 characters per token, or 8 bytes per token id; the slack covers the other fields.
BODY_BYTES_PER_TOKEN = 32
BODY_SLACK_BYTES = 1024 * 1024


def body_limit(max_seq_len: int) -> int:
    """The largest request body the server reads, for a model of ``max_seq_len`` tokens."""
    return BODY_BYTES_PER_TOKEN * max_seq_len + BODY_SLACK_BYTES


def create_app(async_engine: AsyncEngine) -> FastAPI:
    """The FastAPI app; the engine thread starts (if it has not) and stops with its lifespan."""
    engine = async_engine.engine
    metrics = ServerMetrics(engine.model_name, lambda: engine.speculator.policy)
    async_engine.on_output.append(metrics.observe)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async_engine.start()
        yield
        async_engine.stop()

    app = FastAPI(title="mathagent embedded engine", lifespan=lifespan)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_middleware(BodyLimit, max_bytes=body_limit(engine.max_seq_len), render=_error_body)
    name, created = engine.model_name, int(time.time())

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": name, "object": "model", "created": created, "owned_by": "mathagent"}
        return {"object": "list", "data": [{**card, "max_model_len": engine.max_seq_len}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        render = partial(_completion_body, name)
        return await _respond(async_engine, request, body.prompt, body, 16, render, "cmpl")

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Any:
        if engine.tokenizer is None or not getattr(engine.tokenizer, "chat_template", None):
            return _error(400, f"model {name} has no chat template; use /v1/completions")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        prompt = engine.tokenizer.apply_chat_template(
            messages, add_generation_prompt=body.add_generation_prompt, tokenize=False
        )
        render = partial(_chat_body, name, bool(body.stream))
        return await _respond(async_engine, request, prompt, body, None, render, "chatcmpl")

    return app


async def _respond(
    async_engine: AsyncEngine,
    request: Request,
    prompt: str | list[int],
    body: CompletionRequest | ChatCompletionRequest,
    default_max: int | None,
    render: Render,
    kind: str,
) -> Any:
    """Run one request: a 400 before any byte is sent, then an SSE stream or one JSON body.
    ``default_max``: the ``max_tokens`` of a request that sets none (None: the rest of the
    context)."""
    rid = f"{kind}-{uuid.uuid4().hex}"
    engine = async_engine.engine
    try:
        ids = engine.encode(prompt)  # here, once: the room check needs the prompt's length
        room = engine.max_seq_len - len(ids)
        params = body.sampling_params(default_max or room)
        if params.max_tokens > room:
            raise PromptError(_past_context(engine.max_seq_len, len(ids), params.max_tokens))
        stream = async_engine.generate(ids, params, rid, stream=bool(body.stream))
        first = await anext(stream)  # validation errors surface before any bytes are sent
    except (PromptError, ValueError) as exc:
        return _error(400, str(exc))
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return EventSourceResponse(_stream_events(first, stream, render, rid, include_usage))
    collect = asyncio.create_task(_collect(first, stream))
    watcher = asyncio.create_task(_until_disconnect(request, collect))
    try:
        text, last = await collect
    except asyncio.CancelledError:
        return _error(499, "client disconnected", "ClientDisconnected")
    finally:
        watcher.cancel()
    return render(text, last, rid)


def _past_context(limit: int, prompt: int, asked: int) -> str:
    """vLLM's refusal of a ``max_tokens`` that does not fit after the prompt: its server answers
    400, it does not cut the request short (``serving_engine.py`` @ 7ded96b3, ``_validate_input``;
    the message is its words)."""
    return (
        f"This model's maximum context length is {limit} tokens. However, you requested "
        f"{prompt + asked} tokens ({prompt} in the messages, {asked} in the completion). "
        "Please reduce the length of the messages or completion."
    )


def _completion_body(model: str, text: str, out: RequestOutput | None, rid: str) -> dict[str, Any]:
    """A ``text_completion`` body (or streamed chunk); the final one carries the totals."""
    choice = {"index": 0, "text": text, "logprobs": None, **_finish(out)}
    resp = {"id": rid, "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": [choice]}  # fmt: skip
    if out is not None and out.finished:
        resp.update(_totals(out))
    return resp


def _chat_body(
    model: str, stream: bool, text: str, out: RequestOutput | None, rid: str
) -> dict[str, Any]:
    """A ``chat.completion`` body, or a ``chat.completion.chunk`` when streaming."""
    done = out is not None and out.finished
    message = {"role": "assistant", "content": text}
    if stream:
        choice = {"index": 0, "delta": message, **_finish(out)}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "message": message, **_finish(out)}
        obj = "chat.completion"
    resp = {"id": rid, "object": obj, "created": int(time.time()), "model": model,
            "choices": [choice]}  # fmt: skip
    if done and out is not None and not stream:
        resp.update(_totals(out))
    return resp


def _finish(out: RequestOutput | None) -> dict[str, Any]:
    """A choice's ``finish_reason`` and vLLM's ``stop_reason`` (the stop string or token id)."""
    done = out is not None and out.finished
    return {
        "finish_reason": out.finish_reason if done else None,
        "stop_reason": out.stop_reason if done else None,
    }


def _totals(out: RequestOutput) -> dict[str, Any]:
    """``usage``, plus ``speculative`` (this request's acceptance) when it speculated."""
    totals: dict[str, Any] = {"usage": _usage(out)}
    if out.metrics.speculative is not None:
        totals["speculative"] = out.metrics.speculative
    return totals


def _usage(out: RequestOutput) -> dict[str, Any]:
    m = out.metrics
    return {
        "prompt_tokens": m.prompt_tokens,
        "completion_tokens": m.generated_tokens,
        "total_tokens": m.prompt_tokens + m.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": m.cached_tokens},
    }


def _error(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
    return SafeJSONResponse(_error_body(status, message, kind), status_code=status)


def _error_body(status: int, message: str, kind: str = "BadRequestError") -> dict[str, Any]:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
    """Validation errors as OpenAI's 400 body (FastAPI's default would be a 422)."""
    parts = [f"{'.'.join(str(x) for x in e['loc'][1:])}: {e['msg']}" for e in exc.errors()]
    return _error(400, "; ".join(parts) or "invalid request")


def _sse(obj: Any) -> bytes:
    """One ``data: {json}`` event, as OpenAI's streaming clients parse it."""
    return format_sse_event(data_str=json.dumps(obj))


async def _until_disconnect(request: Request, task: asyncio.Task) -> None:
    """Cancel ``task`` (and so abort its engine request) when the client goes away."""
    while not task.done():
        if await request.is_disconnected():
            task.cancel()
            return
        await asyncio.sleep(0.2)


async def _collect(first: RequestOutput, rest: AsyncIterator[RequestOutput]) -> tuple[str, Any]:
    text, last = first.delta_text, first
    try:
        async for out in rest:
            text, last = text + out.delta_text, out
    finally:
        await rest.aclose()  # on cancellation this aborts the engine request
    return text, last


async def _stream_events(
    first: RequestOutput,
    rest: AsyncIterator[RequestOutput],
    render: Render,
    rid: str,
    include_usage: bool,
) -> AsyncIterator[bytes]:
    """SSE chunks: one per output with text or an end, a usage chunk if asked, ``[DONE]``."""
    out: RequestOutput | None = first
    try:
        while out is not None:
            if out.delta_text or out.finished:
                yield _sse(render(out.delta_text, out, rid))
            if out.finished:
                if include_usage:
                    yield _sse({**render("", None, rid), "choices": [], "usage": _usage(out)})
                break
            out = await anext(rest, None)
        yield format_sse_event(data_str="[DONE]")
    finally:
        await rest.aclose()  # a client disconnect lands here and aborts the request
