"""The sandbox interface the agent codes against, and the result every backend returns.

Backends: the HTTP client of the sandbox service and the in-process container pool. Both speak
exactly the JSON of the ``POST /execute`` contract in DESIGN.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from enum import StrEnum
from types import TracebackType

from pydantic import BaseModel, Field


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


class Sandbox(ABC):
    """Runs Python cells in stateful, isolated sessions."""

    @abstractmethod
    async def execute(
        self,
        code: str,
        session_id: str | None = None,
        timeout: float = 10.0,
        max_output_chars: int = 1000,
    ) -> ExecResult:
        """Run ``code`` in ``session_id`` (a new session when None) and return the result."""

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
