"""The in-process backend: a warm pool of single-use containers, one per session.

A session takes a warm container and keeps it, so its variables persist; the container is
destroyed when the session closes or idles out. A background task refills the pool so taking a
session never waits for a container start while warm ones exist. Docker SDK calls are blocking
and run in threads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import docker
import docker.errors

from mathagent.config import SandboxSettings
from mathagent.sandbox.base import ExecRequest, ExecResult, ExecStatus, Sandbox
from mathagent.sandbox.container import (
    LABEL,
    OWNER_LABEL,
    POOL_LABEL,
    Container,
    ContainerSpec,
    WorkerDied,
    WorkerTimeout,
    owner_id,
    remove_labelled,
    remove_orphans,
)
from mathagent.sandbox.image import image_tag
from mathagent.sandbox.session_ids import SessionIds

log = logging.getLogger(__name__)
EXPIRED_MEMORY = 10_000
START_SLOTS = max(2, os.cpu_count() or 1)


class SandboxError(RuntimeError):
    """The sandbox cannot serve the call (Docker unavailable, image missing, ...)."""


class SandboxBusy(SandboxError):
    """``max_sessions`` sessions are open already."""


@dataclass
class _Session:
    id: str
    container: Container | None = None
    lost: bool = False
    last_used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ContainerPool(Sandbox):
    """Runs cells in locked-down Docker containers owned by this process."""

    def __init__(self, settings: SandboxSettings, client: docker.DockerClient | None = None):
        self.settings = settings
        self._client = client
        self._spec: ContainerSpec | None = None
        self._warm: list[Container] = []
        self._starting = 0
        self._sessions: dict[str, _Session] = {}
        self._expired: OrderedDict[str, None] = OrderedDict()
        self._ids = SessionIds()
        self._tasks: set[asyncio.Task] = set()
        self._wake = asyncio.Event()
        self._reaper: asyncio.Task | None = None
        self._start_lock = asyncio.Lock()
        self._start_slots = asyncio.Semaphore(START_SLOTS)
        self._closed = False

    async def start(self) -> None:
        """Check Docker and the image, sweep orphans, and begin filling the pool."""
        async with self._start_lock:  # the first calls may arrive together
            if self._spec is not None:
                return
            tag = image_tag(self.settings)
            try:
                self._client = self._client or await asyncio.to_thread(docker.from_env)
                await asyncio.to_thread(self._client.images.get, tag)
                await asyncio.to_thread(remove_orphans, self._client)
            except docker.errors.ImageNotFound:
                raise SandboxError(
                    f"image {tag} is missing: run `mathagent sandbox build`"
                ) from None
            except docker.errors.DockerException as exc:
                raise SandboxError(f"Docker is not available: {exc}") from exc
            mine = {OWNER_LABEL: owner_id(os.getpid()), POOL_LABEL: self._ids.instance}
            self._spec = ContainerSpec(tag, self.settings, {LABEL: "1", **mine})
            self._spawn_task(self._refill_forever())
            self._reaper = self._spawn_task(self._reap_idle_forever())

    async def __aenter__(self) -> ContainerPool:
        await self.start()
        return self

    @property
    def labels(self) -> dict[str, str]:
        """The labels on this pool's containers (a per-pool id among them)."""
        return dict(self._spec.labels) if self._spec else {}

    def stats(self) -> dict[str, Any]:
        """Counts for ``GET /health``."""
        return {
            "warm": len(self._warm),
            "starting": self._starting,
            "sessions": len(self._sessions),
        }

    async def execute_request(self, req: ExecRequest) -> ExecResult:
        if req.timeout > self.settings.max_timeout_s:
            raise ValueError(f"timeout must be at most {self.settings.max_timeout_s:g} s")
        await self.start()
        session = self._session(req.session_id or self._ids.mint())
        async with session.lock:
            # Closed while this call waited for the lock: it runs in a new session of that id.
            self._sessions.setdefault(session.id, session)
            start = time.monotonic()
            result = await self._run(session, req)
            result.duration_s = time.monotonic() - start
            session.last_used = time.monotonic()
            return result

    def _session(self, session_id: str) -> _Session:
        if self._closed:
            raise SandboxError("the sandbox pool is closed")
        session = self._sessions.get(session_id)
        if session is None:
            if len(self._sessions) >= self.settings.max_sessions:
                raise SandboxBusy(f"{self.settings.max_sessions} sessions are open already")
            # A session that idled out, or one a restarted service held, comes back empty: say so.
            expired = self._expired.pop(session_id, 0) is None
            session = _Session(session_id, lost=expired or self._ids.minted_elsewhere(session_id))
            self._sessions[session_id] = session
        return session

    async def _run(self, session: _Session, req: ExecRequest) -> ExecResult:
        if session.container is not None and not session.container.alive:
            # It died while idle (a Docker restart): nothing ran, so run the cell afresh.
            await self._drop_container(session)
        lost, session.lost = session.lost, False
        if session.container is None:
            try:
                session.container = await self._take()
            except BaseException:
                self._sessions.pop(session.id, None)
                raise
        payload = req.model_dump(exclude={"session_id"})
        deadline = req.timeout + self.settings.kill_grace_s
        try:
            reply = await session.container.call(payload, deadline)
        except (WorkerTimeout, WorkerDied) as exc:
            await self._drop_container(session)
            return self._failure(session.id, exc, req)
        return ExecResult(
            status=ExecStatus(reply["status"]),
            stdout=reply["stdout"],
            stderr=reply["stderr"],
            session_id=session.id,
            state_lost=lost,
            truncated=reply.get("truncated", False),
        )

    def _failure(
        self, session_id: str, exc: WorkerTimeout | WorkerDied, req: ExecRequest
    ) -> ExecResult:
        """The result of a call whose worker died or hung; the next call gets a new container."""
        if isinstance(exc, WorkerTimeout):
            status = ExecStatus.timeout
            message = (
                f"TimeoutError: the cell ran longer than {req.timeout:g} s and did not stop, "
                "so its Python process was stopped"
            )
        else:
            status = ExecStatus.memory_limit if exc.oom_killed else ExecStatus.error
            # state_lost says what it costs; a client (the agent) may restore it by replay.
            message = f"{_crash_lines(exc.diagnostics)}{exc}; its Python process was stopped"
        return ExecResult(
            status=status,
            stderr=message[-req.max_output_chars :],
            session_id=session_id,
            state_lost=True,
        )

    async def _drop_container(self, session: _Session) -> None:
        container, session.container, session.lost = session.container, None, True
        if container is not None:
            await container.destroy()

    async def _take(self) -> Container:
        """A warm container if one is ready, else a fresh one started now."""
        while self._warm:
            container = self._warm.pop()
            if container.alive:
                self._wake.set()
                return container
            self._spawn_task(container.destroy())  # died warm (a Docker restart): remove it
        self._wake.set()
        return await self._new_container()

    async def _new_container(self) -> Container:
        assert self._client is not None and self._spec is not None
        self._starting += 1
        try:
            # Starts share the CPU: a few at a time finish sooner than all at once.
            async with self._start_slots:
                return await Container.start(
                    self._client.api, self._spec, self.settings.start_timeout_s
                )
        except TimeoutError:
            limit = self.settings.start_timeout_s
            raise SandboxError(f"a sandbox container was not ready within {limit:g} s") from None
        except docker.errors.DockerException as exc:
            raise SandboxError(f"could not start a sandbox container: {exc}") from exc
        finally:
            self._starting -= 1

    async def _refill_forever(self) -> None:
        while not self._closed:
            busy = len(self._sessions) + len(self._warm) + self._starting
            room = self.settings.max_sessions + self.settings.pool_size - busy
            if len(self._warm) + self._starting < self.settings.pool_size and room > 0:
                try:
                    container = await self._new_container()
                except Exception as exc:  # Docker hiccup: retry later, calls start their own
                    log.warning("sandbox pool refill failed: %s", exc)
                    await asyncio.sleep(2.0)
                    continue
                if self._closed:
                    await container.destroy()
                    return
                self._warm.append(container)
                continue
            self._wake.clear()
            await self._wake.wait()

    async def _reap_idle_forever(self) -> None:
        period = min(5.0, self.settings.idle_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for session in list(self._sessions.values()):
                idle = now - session.last_used > self.settings.idle_timeout_s
                if idle and not session.lock.locked():
                    self._remember_expired(session.id)
                    await self.close_session(session.id)

    def _remember_expired(self, session_id: str) -> None:
        self._expired[session_id] = None
        while len(self._expired) > EXPIRED_MEMORY:
            self._expired.popitem(last=False)

    async def close_session(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        self._wake.set()
        if session is not None and session.container is not None:
            container, session.container = session.container, None
            self._spawn_task(container.destroy())

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._wake.set()  # the refill loop finishes its start in flight and stops
        if self._reaper is not None:
            self._reaper.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        containers = self._warm + [s.container for s in self._sessions.values() if s.container]
        self._warm, self._sessions = [], {}
        await asyncio.gather(*(c.destroy() for c in containers), return_exceptions=True)
        if self._client is not None and self._spec is not None:
            # Whatever a cancelled call left half-made carries this pool's label: remove it too.
            await asyncio.to_thread(
                remove_labelled, self._client, POOL_LABEL, self.labels[POOL_LABEL]
            )

    def _spawn_task(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def _crash_lines(diagnostics: str) -> str:
    """From a faulthandler dump, the fatal error and the user's own frames."""
    keep = [
        line
        for line in diagnostics.splitlines()
        if line.startswith("Fatal Python error") or "<cell-" in line
    ]
    return "".join(f"{line}\n" for line in keep)
