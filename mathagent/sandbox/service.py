"""The sandbox HTTP service: ``POST /execute``, ``DELETE /sessions/{id}``, ``GET /health``.

The body is read and parsed by hand so every malformed request gets a precise 4xx (413 past the
size limit, answered by :class:`~mathagent.body_limit.BodyLimit` before the body is read; 400
for bytes that are not a JSON object, 422 for fields of the wrong type or range); failures of
the sandbox itself are 503, and 429 when every session slot is taken.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from mathagent import __version__
from mathagent.body_limit import BodyLimit
from mathagent.config import SandboxSettings
from mathagent.http_errors import SafeJSONResponse
from mathagent.sandbox.base import SESSION_ID_PATTERN, ExecRequest
from mathagent.sandbox.pool import ContainerPool, SandboxBusy, SandboxError


class _BadRequest(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status, self.message = status, message


def create_app(settings: SandboxSettings, pool: ContainerPool | None = None) -> FastAPI:
    """The FastAPI app; it owns (starts and closes) ``pool``, made from ``settings`` when None."""
    pool = pool or ContainerPool(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await pool.start()
        try:
            yield
        finally:
            await pool.aclose()

    app = FastAPI(
        title="mathagent sandbox",
        version=__version__,
        lifespan=lifespan,
        default_response_class=SafeJSONResponse,
    )
    app.add_middleware(BodyLimit, max_bytes=settings.max_request_bytes)

    _add_error_handlers(app)

    @app.post("/execute")
    async def execute(request: Request) -> dict[str, Any]:
        body = _parse_json(await request.body())
        try:
            req = ExecRequest.model_validate(body)
        except ValidationError as exc:
            raise _BadRequest(422, _describe(exc.errors())) from None
        try:
            result = await pool.execute_request(req)
        except SandboxBusy as exc:
            raise _BadRequest(429, str(exc)) from None
        except ValueError as exc:
            raise _BadRequest(422, str(exc)) from None
        except SandboxError as exc:
            raise _BadRequest(503, str(exc)) from None
        return result.model_dump(mode="json")

    @app.delete("/sessions/{session_id}")
    async def close_session(session_id: str) -> dict[str, Any]:
        if not re.match(SESSION_ID_PATTERN, session_id):
            raise _BadRequest(422, "session_id must match " + SESSION_ID_PATTERN)
        await pool.close_session(session_id)
        return {"session_id": session_id, "closed": True}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "version": __version__, **pool.stats()}

    return app


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(_BadRequest)
    async def bad_request(request: Request, exc: _BadRequest) -> SafeJSONResponse:
        return SafeJSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> SafeJSONResponse:
        return SafeJSONResponse({"detail": _describe(exc.errors())}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> SafeJSONResponse:
        return SafeJSONResponse({"detail": exc.detail}, status_code=exc.status_code)


def _parse_json(raw: bytes) -> Any:
    """The body as a JSON object, or a 400/422 saying what is wrong with it."""
    if not raw:
        raise _BadRequest(400, "request body is empty; expected a JSON object")
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise _BadRequest(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise _BadRequest(422, "request body must be a JSON object")
    return body


def _describe(errors: Any) -> str:
    """Pydantic errors as one readable line: ``timeout: Input should be greater than 0``."""
    parts = []
    for err in errors:
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)
