"""OpenAI-compatible HTTP server over the embedded engine (FastAPI + SSE).

The engine steps in its own thread (:class:`AsyncEngine`); handlers only await outputs, so many
requests share each decode step. A client that goes away mid-request has its request aborted,
which frees the slot.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from mathagent.config import Settings
from mathagent.model_store import resolve_model
from mathagent.serving.engine.async_engine import AsyncEngine
from mathagent.serving.engine.config import EngineConfig
from mathagent.serving.engine.llm_engine import LLMEngine, PromptError
from mathagent.serving.engine.sequence import RequestOutput
from mathagent.serving.metrics import ServerMetrics
from mathagent.serving.protocol import ChatCompletionRequest, CompletionRequest


def _error(status: int, message: str, kind: str = "BadRequestError") -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return JSONResponse(body, status_code=status)


def _usage(out: RequestOutput) -> dict[str, Any]:
    m = out.metrics
    return {
        "prompt_tokens": m.prompt_tokens,
        "completion_tokens": m.generated_tokens,
        "total_tokens": m.prompt_tokens + m.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": m.cached_tokens},
    }


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


async def _until_disconnect(request: Request, task: asyncio.Task) -> None:
    """Cancel ``task`` (and so abort its engine request) when the client goes away."""
    while not task.done():
        if await request.is_disconnected():
            task.cancel()
            return
        await asyncio.sleep(0.2)


def create_app(async_engine: AsyncEngine) -> FastAPI:
    """The FastAPI app; the engine thread starts (if it has not) and stops with its lifespan."""
    engine = async_engine.engine
    metrics = ServerMetrics(engine.model_name)
    async_engine.on_output.append(metrics.observe)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async_engine.start()
        yield
        async_engine.stop()

    app = FastAPI(title="mathagent embedded engine", lifespan=lifespan)
    name, created = engine.model_name, int(time.time())

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(x) for x in e['loc'][1:])}: {e['msg']}" for e in exc.errors()]
        return _error(400, "; ".join(parts) or "invalid request")

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

    async def run(
        request: Request,
        prompt: str | list[int],
        body: CompletionRequest | ChatCompletionRequest,
        default_max: int,
        render: Callable[[str, RequestOutput | None, str], dict[str, Any]],
        kind: str,
    ) -> Any:
        rid = f"{kind}-{uuid.uuid4().hex}"
        try:
            params = body.sampling_params(default_max)
            stream = async_engine.generate(prompt, params, rid, stream=bool(body.stream))
            first = await anext(stream)  # validation errors surface before any bytes are sent
        except (PromptError, ValueError) as exc:
            return _error(400, str(exc))
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(
                _stream_events(first, stream, render, rid, include_usage),
                media_type="text/event-stream",
            )
        collect = asyncio.create_task(_collect(first, stream))
        watcher = asyncio.create_task(_until_disconnect(request, collect))
        try:
            text, last = await collect
        except asyncio.CancelledError:
            return _error(499, "client disconnected", "ClientDisconnected")
        finally:
            watcher.cancel()
        return render(text, last, rid)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Any:
        def render(text: str, out: RequestOutput | None, rid: str) -> dict[str, Any]:
            choice = {"index": 0, "text": text, "logprobs": None}
            choice["finish_reason"] = out.finish_reason if out and out.finished else None
            resp = {"id": rid, "object": "text_completion", "created": int(time.time()),
                    "model": name, "choices": [choice]}  # fmt: skip
            if out is not None and out.finished:
                resp["usage"] = _usage(out)
                if out.metrics.speculative is not None:
                    resp["speculative"] = out.metrics.speculative
            return resp

        return await run(request, body.prompt, body, 16, render, "cmpl")

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Any:
        if engine.tokenizer is None or not getattr(engine.tokenizer, "chat_template", None):
            return _error(400, f"model {name} has no chat template; use /v1/completions")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        prompt = engine.tokenizer.apply_chat_template(
            messages, add_generation_prompt=body.add_generation_prompt, tokenize=False
        )

        def render(text: str, out: RequestOutput | None, rid: str) -> dict[str, Any]:
            done = out is not None and out.finished
            finish = out.finish_reason if done and out else None
            if body.stream:
                delta = {"role": "assistant", "content": text}
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
                obj = "chat.completion.chunk"
            else:
                message = {"role": "assistant", "content": text}
                choice = {"index": 0, "message": message, "finish_reason": finish}
                obj = "chat.completion"
            resp = {"id": rid, "object": obj, "created": int(time.time()), "model": name,
                    "choices": [choice]}  # fmt: skip
            if done and out is not None and not body.stream:
                resp["usage"] = _usage(out)
                if out.metrics.speculative is not None:
                    resp["speculative"] = out.metrics.speculative
            return resp

        return await run(request, prompt, body, engine.max_seq_len, render, "chatcmpl")

    return app


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
    render: Callable[[str, RequestOutput | None, str], dict[str, Any]],
    rid: str,
    include_usage: bool,
) -> AsyncIterator[str]:
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
        yield "data: [DONE]\n\n"
    finally:
        await rest.aclose()  # a client disconnect lands here and aborts the request


def build_engine(settings: Settings, model: str | None = None) -> LLMEngine:
    """The embedded engine for ``settings`` (``model`` overrides ``settings.model``)."""
    spec = resolve_model(model or settings.model, settings.model_dir)
    config = EngineConfig.from_settings(settings.engine, spec)
    return LLMEngine(config, settings.model_dir)


def serve(settings: Settings, model: str | None, host: str, port: int) -> None:
    """Run the server in the foreground until interrupted (the engine loads in its thread)."""
    app = create_app(AsyncEngine.launch(lambda: build_engine(settings, model)))
    uvicorn.run(app, host=host, port=port, log_level="warning")


class EmbeddedServer:
    """The embedded engine's OpenAI server on 127.0.0.1 in a background thread.

    ``with EmbeddedServer(settings) as srv:`` then point an OpenAI client at ``srv.base_url``
    with model ``srv.model_name``. ``port=0`` picks a free port. The engine is built in its own
    thread (see :meth:`AsyncEngine.launch`); ``engine`` serves one already built instead.
    """

    def __init__(
        self,
        settings: Settings,
        model: str | None = None,
        port: int = 0,
        engine: LLMEngine | None = None,
    ) -> None:
        front = (
            AsyncEngine(engine)
            if engine is not None
            else AsyncEngine.launch(lambda: build_engine(settings, model))
        )
        self.engine = front.engine
        self.model_name = self.engine.model_name
        config = uvicorn.Config(create_app(front), host="127.0.0.1", port=port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="mathagent-server")
        self.port = port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> EmbeddedServer:
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the embedded server failed to start")
            time.sleep(0.02)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
