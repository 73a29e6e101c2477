"""The /solve HTTP API: ``POST /solve``, ``POST /solve/stream`` (SSE) and ``GET /health``.

Bad input gets a 4xx with a message: empty problems and absurd limits 422, oversized bodies
413 (before they are read whole: :class:`~mathagent.body_limit.BodyLimit`), more requests in
flight than allowed 429. Model or sandbox outages do not fail the request: they come back as
``error`` fields in the result.

Auth, when ``MATHAGENT_API_KEY`` is set (``/health`` stays open): 401 with
``WWW-Authenticate: Bearer realm="mathagent"`` when credentials are missing (no error code,
RFC 6750 §3.1) or malformed (not ``Bearer <token>``: ``error="invalid_request"``), since sending
credentials fixes it; 403 when a well-formed token is not the key (the caller authenticated
and is refused). Tokens are compared in constant time (``hmac.compare_digest`` of SHA-256
digests, so not even the length leaks) and never logged or echoed.
"""

import hashlib
import hmac
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.sse import EventSourceResponse, format_sse_event
from pydantic import BaseModel, ConfigDict, Field, field_validator

from mathagent.agent.result import SolveResult
from mathagent.agent.solver import SolveOptions, Solver
from mathagent.body_limit import BodyLimit
from mathagent.config import Settings
from mathagent.http_errors import SafeJSONResponse, validation_errors

# Declares the scheme in the OpenAPI schema; the header itself is checked by _bearer_check.
_BEARER = HTTPBearer(auto_error=False)
REALM = 'Bearer realm="mathagent"'
# Bodies beyond this many bytes over the problem limit are refused before parsing.
BODY_SLACK_BYTES = 64 * 1024


class SolveRequest(BaseModel):
    """One problem and its limits (unset limits take the server's configured defaults)."""

    model_config = ConfigDict(extra="forbid")

    problem: str = Field(min_length=1, description="the problem statement")
    tools: bool = Field(True, description="let the model run Python in the sandbox")
    samples: int = Field(1, ge=1, description="generations to vote over")
    max_tool_calls: int | None = Field(None, ge=0, le=64)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1, le=131_072)
    early_stop: int | None = Field(None, ge=0, description="stop once this many samples agree")
    seed: int | None = None

    @field_validator("problem")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("problem is empty")
        return value


class Health(BaseModel):
    status: str = "ok"
    model: str
    mode: str
    tools: bool
    in_flight: int


class _Gate:
    """Counts requests in flight; beyond the limit the API answers 429 at once."""

    def __init__(self, limit: int) -> None:
        self.limit, self.in_flight = limit, 0

    def enter(self) -> None:
        if self.in_flight >= self.limit:
            raise HTTPException(429, f"too many requests in flight (limit {self.limit})")
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1


def _bearer_check(api_key: str | None) -> Callable[..., None]:
    """The dependency that checks the bearer token (none when no key is configured)."""
    want = hashlib.sha256(api_key.encode()).digest() if api_key is not None else b""

    def authorize(
        request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)]
    ) -> None:
        if api_key is None:
            return
        header = request.headers.get("authorization")
        if header is None:
            raise _unauthorized("missing bearer token: send Authorization: Bearer <key>", None)
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise _unauthorized("the Authorization header must be Bearer <key>", "invalid_request")
        got = hashlib.sha256(token.encode()).digest()
        if not hmac.compare_digest(got, want):
            raise HTTPException(403, "wrong bearer token")

    return authorize


async def _invalid(_: Request, exc: Exception) -> SafeJSONResponse:
    assert isinstance(exc, RequestValidationError)
    return SafeJSONResponse({"detail": validation_errors(exc.errors())}, status_code=422)


async def _http_error(_: Request, exc: Exception) -> SafeJSONResponse:
    assert isinstance(exc, HTTPException)
    return SafeJSONResponse({"detail": exc.detail}, exc.status_code, exc.headers)


def _unauthorized(message: str, error: str | None) -> HTTPException:
    challenge = REALM if error is None else f'{REALM}, error="{error}"'
    return HTTPException(401, message, {"WWW-Authenticate": challenge})


def create_app(solver: Solver, settings: Settings) -> FastAPI:
    """The FastAPI app over a ready :class:`Solver` (the caller owns its model and sandbox)."""
    limits = settings.agent
    gate = _Gate(limits.max_concurrency)
    app = FastAPI(
        title="mathagent",
        summary="Solve math problems with a tool-calling model and sandboxed Python.",
        version="0.1.0",
        default_response_class=SafeJSONResponse,
    )
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(HTTPException, _http_error)

    if settings.api_key == "":
        # An empty key would lock every caller out, or (read as unset) open the API unseen.
        raise ValueError("MATHAGENT_API_KEY is set but empty: give a key or unset it")
    authorize = _bearer_check(settings.api_key)
    app.add_middleware(BodyLimit, max_bytes=4 * limits.max_problem_chars + BODY_SLACK_BYTES)

    def options(req: SolveRequest) -> SolveOptions:
        if len(req.problem) > limits.max_problem_chars:
            raise HTTPException(413, f"problem longer than {limits.max_problem_chars} characters")
        if req.samples > limits.max_samples:
            raise HTTPException(422, f"samples must be at most {limits.max_samples}")
        if req.tools and solver.sandbox is None:
            raise HTTPException(400, "tools are unavailable: this server has no sandbox")
        return SolveOptions(**req.model_dump(exclude={"problem"}))

    @app.get("/health")
    async def health() -> Health:
        llm = solver.llm
        tools = solver.sandbox is not None
        return Health(model=llm.model, mode=llm.mode, tools=tools, in_flight=gate.in_flight)

    @app.post("/solve", dependencies=[Depends(authorize)])
    async def solve(req: SolveRequest) -> SolveResult:
        """Solve one problem; returns the voted answer, every sample, tool calls and timing."""
        opts = options(req)
        gate.enter()
        try:
            return await solver.solve(req.problem, opts)
        finally:
            gate.leave()

    @app.post(
        "/solve/stream",
        dependencies=[Depends(authorize)],
        response_class=StreamingResponse,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    async def solve_stream(req: SolveRequest) -> StreamingResponse:
        """Server-sent events: text, tool_call, tool_result, answer, done (per sample), result."""
        opts = options(req)
        gate.enter()
        return EventSourceResponse(_sse(solver, req.problem, opts, gate))

    return app


async def _sse(
    solver: Solver, problem: str, opts: SolveOptions, gate: _Gate
) -> AsyncIterator[bytes]:
    try:
        async with aclosing(solver.stream(problem, opts)) as events:
            async for event in events:
                yield format_sse_event(event=event.type, data_str=event.model_dump_json())
    finally:
        gate.leave()
