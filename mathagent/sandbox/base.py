"""The sandbox interface the agent codes against, and the result every backend returns.

Backends: the HTTP client of the sandbox service and the in-process container pool. Both speak
exactly the JSON of the ``POST /execute`` contract in DESIGN.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import StrEnum
from types import TracebackType

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

SESSION_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"


class ExecStatus(StrEnum):
    completed = "completed"
    error = "error"
    timeout = "timeout"
    memory_limit = "memory_limit"


class ExecResult(BaseModel):
    """Outcome of running one cell in a session."""

    status: ExecStatus
    stdout: str = ""
    stderr: str = ""
    session_id: str
    state_lost: bool = Field(
        False, description="the session's container was replaced: earlier variables are gone"
    )
    duration_s: float = 0.0
    truncated: bool = Field(
        False, description="stdout or stderr was cut at max_output_chars and ends in <output cut>"
    )


class ExecRequest(BaseModel):
    """The ``POST /execute`` body; every backend validates its arguments with it."""

    model_config = ConfigDict(extra="forbid")

    code: StrictStr = Field(max_length=10_000_000)
    session_id: StrictStr | None = Field(None, pattern=SESSION_ID_PATTERN)
    timeout: StrictFloat | StrictInt = Field(10.0, gt=0, allow_inf_nan=False, description="seconds")
    max_output_chars: StrictInt = Field(1000, ge=1, le=1_000_000)


class Sandbox(ABC):
    """Runs Python cells in stateful, isolated sessions.

    Backends implement :meth:`execute_request`; :meth:`execute` validates its arguments as an
    :class:`ExecRequest` first (a ``ValueError`` when one is out of range), so every backend
    takes the same request the HTTP service does.
    """

    async def execute(
        self,
        code: str,
        session_id: str | None = None,
        timeout: float = 10.0,
        max_output_chars: int = 1000,
    ) -> ExecResult:
        """Run ``code`` in ``session_id`` (a new session when None) and return the result."""
        req = ExecRequest(
            code=code, session_id=session_id, timeout=timeout, max_output_chars=max_output_chars
        )
        return await self.execute_request(req)

    @abstractmethod
    async def execute_request(self, req: ExecRequest) -> ExecResult:
        """Run one validated request."""

    @abstractmethod
    async def close_session(self, session_id: str) -> None:
        """Destroy a session and its container; unknown ids are ignored."""

    @abstractmethod
    async def aclose(self) -> None:
        """Release every resource the backend holds."""

    async def __aenter__(self) -> Sandbox:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
