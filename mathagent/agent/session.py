"""One sample's sandbox session: runs its cells, retries sandbox failures, keeps its state.

The state survives a restart of the sandbox as it did in the reference: NeMo-Skills keeps the
cells that completed and, when a call lands in a new session (newest 0b012df8,
``code_execution/sandbox.py`` ``execute_code``: ``new_session_created`` and not a timeout),
replays them into a clean session and runs the call again; when a replay fails, the history is
cleared and the model reads the reference's restoration error instead of the call's output. (The
release-era sandbox replayed every cell on every call, so its models never saw state vanish.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from mathagent.agent.llm import DeadlineExceeded
from mathagent.agent.retry import wait_to_retry
from mathagent.sandbox.base import ExecResult, ExecStatus, Sandbox

# How long past its own time limit a sandbox call may take before the loop gives up on it.
SANDBOX_GRACE_S = 30.0
RESTORE_FAILED = (
    "RuntimeError: Sandbox state restoration failed after the execution worker restarted. "
    "The interactive session history has been cleared; please re-run the last code block "
    "without relying on prior state.\n"
)


class SandboxFailure(Exception):
    """The sandbox itself failed (not the model's code)."""


@dataclass
class SessionLimits:
    timeout_s: float = 10.0
    max_output_chars: int = 1000
    retries: int = 3
    backoff_s: float = 0.5


class CodeSession:
    """Cells of one sample in one sandbox session (opened by the first call)."""

    def __init__(self, sandbox: Sandbox, limits: SessionLimits) -> None:
        self.sandbox, self.limits = sandbox, limits
        self.session_id: str | None = None
        self.history: list[str] = []  # cells that completed, in order
        self.busy_s = 0.0

    async def run(self, code: str, deadline: float) -> ExecResult:
        """Run ``code``; ``state_lost`` on the result says the session had to be restored."""
        started = time.perf_counter()
        try:
            res = await self._execute(code, deadline)
            if res.state_lost and res.status != ExecStatus.timeout and self.history:
                res = await self._restore_then(code, deadline)
            if res.status == ExecStatus.completed:
                self.history.append(code)
            return res
        finally:
            self.busy_s += time.perf_counter() - started

    async def _restore_then(self, code: str, deadline: float) -> ExecResult:
        """Replay the completed cells into a clean session, then run ``code`` again."""
        await self.close()
        for cell in self.history:
            replayed = await self._execute(cell, deadline)
            if replayed.status != ExecStatus.completed:
                self.history.clear()
                await self.close()
                return ExecResult(
                    status=ExecStatus.error,
                    stderr=RESTORE_FAILED,
                    session_id=replayed.session_id,
                    state_lost=True,
                )
        res = await self._execute(code, deadline)
        return res.model_copy(update={"state_lost": True})

    async def _execute(self, code: str, deadline: float) -> ExecResult:
        """One call; failures of the sandbox itself (not of the code) are retried."""
        limits = self.limits
        for attempt in range(limits.retries + 1):
            try:
                return await self._execute_once(code, deadline)
            except SandboxFailure:
                last = attempt == limits.retries
                if last or not await wait_to_retry(attempt + 1, limits.backoff_s, deadline):
                    raise
        raise AssertionError("unreachable")

    async def _execute_once(self, code: str, deadline: float) -> ExecResult:
        loop, limits = asyncio.get_running_loop(), self.limits
        limit = min(loop.time() + limits.timeout_s + SANDBOX_GRACE_S, deadline)
        try:
            async with asyncio.timeout_at(limit):
                res = await self.sandbox.execute(
                    code,
                    self.session_id,
                    timeout=limits.timeout_s,
                    max_output_chars=limits.max_output_chars,
                )
        except TimeoutError as exc:
            if loop.time() >= deadline:
                raise DeadlineExceeded from exc
            raise SandboxFailure(
                f"the sandbox did not answer within {limits.timeout_s + SANDBOX_GRACE_S:g} s"
            ) from exc
        except Exception as exc:
            raise SandboxFailure(f"the sandbox failed: {type(exc).__name__}: {exc}") from exc
        self.session_id = res.session_id
        return res

    async def close(self) -> None:
        """End the session (best effort: one that fails to close is reaped by idle timeout)."""
        if self.session_id is None:
            return
        session, self.session_id = self.session_id, None
        with contextlib.suppress(Exception):
            async with asyncio.timeout(SANDBOX_GRACE_S):
                await self.sandbox.close_session(session)
