"""Several OpenAI-compatible servers of one model, used as one: the least loaded serves.

Each request leases the healthy replica with the fewest requests in flight (ties: the one that
has served fewest). A replica whose request failed for reasons of its own (connection refused
or reset, a 5xx, a timeout, a stream cut short) is taken out and probed back in
(``GET /v1/models``) by a background task: at once, then with the backoff of
:mod:`mathagent.agent.retry`; the caller retries its request on another one. When every
replica is out, a lease waits until one is back (or the caller's deadline). One URL is the
same set with one member, so a single server that restarts is waited for too. A replica that
has never answered (a wrong URL, a server not up yet) is not waited for: it is tried as it is,
so the caller's own retries decide, as with a plain client.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import openai

from mathagent.agent.retry import wait_to_retry

PROBE_TIMEOUT_S = 5.0
PROBE_MAX_WAIT_S = 5.0  # probes back off to at most this (a restarted server is found fast)
PROBE_MIN_WAIT_S = 0.05  # a zero backoff setting must not make the probe spin


class NoReplica(Exception):
    """No replica came back before the deadline."""


@dataclass
class Replica:
    """One server and what it has done in this process."""

    url: str
    client: Any  # openai.AsyncOpenAI
    in_flight: int = 0
    requests: int = 0
    failures: int = 0
    taken_out: int = 0
    completion_tokens: int = 0
    healthy: bool = True
    seen_alive: bool = False  # it has answered a request or a probe
    busy_s: float = 0.0  # time with at least one request in flight
    _busy_since: float | None = field(default=None, repr=False)

    def stats(self) -> dict[str, Any]:
        """The per-replica row of the eval summary."""
        return {
            "url": self.url,
            "requests": self.requests,
            "failures": self.failures,
            "taken_out": self.taken_out,
            "healthy": self.healthy,
            "completion_tokens": self.completion_tokens,
            "busy_s": round(self.busy_s, 3),
            "tokens_per_s": round(self.completion_tokens / self.busy_s, 3) if self.busy_s else 0.0,
        }


class ReplicaSet:
    """The replicas behind one model name; :meth:`lease` hands one out per request."""

    def __init__(self, replicas: list[Replica], backoff_s: float = 0.5) -> None:
        if not replicas:
            raise ValueError("a replica set needs at least one server")
        self.replicas = replicas
        self.backoff_s = backoff_s
        self._changed: asyncio.Condition | None = None
        self._probes: set[asyncio.Task[None]] = set()

    @classmethod
    def open(
        cls, urls: list[str], api_key: str, timeout_s: float, backoff_s: float = 0.5
    ) -> ReplicaSet:
        """One OpenAI client per URL (``/v1`` roots)."""
        clients = [
            openai.AsyncOpenAI(base_url=u, api_key=api_key, max_retries=0, timeout=timeout_s)
            for u in urls
        ]
        return cls([Replica(u, c) for u, c in zip(urls, clients, strict=True)], backoff_s)

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    @contextlib.asynccontextmanager
    async def lease(self, deadline: float = math.inf) -> AsyncIterator[Replica]:
        """The healthy replica with the fewest requests in flight, for one request.

        Waits while every replica is out; :class:`NoReplica` when ``deadline`` (event-loop
        time) passes first.
        """
        changed = self._condition()
        async with changed:
            try:
                async with asyncio.timeout_at(deadline if deadline < math.inf else None):
                    await changed.wait_for(lambda: any(map(_usable, self.replicas)))
            except TimeoutError:
                raise NoReplica(f"no model server of {self.urls} came back in time") from None
            replica = min(
                filter(_usable, self.replicas),
                key=lambda r: (not r.healthy, r.in_flight, r.requests),
            )
            _start(replica)
        try:
            yield replica
        finally:
            _stop(replica)

    def fail(self, replica: Replica) -> None:
        """``replica`` failed a request: take it out and probe it back in."""
        replica.failures += 1
        if not replica.healthy:
            return
        replica.healthy = False
        replica.taken_out += 1
        task = asyncio.get_running_loop().create_task(self._probe(replica))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _probe(self, replica: Replica) -> None:
        attempt = 0
        while True:
            try:
                await asyncio.wait_for(replica.client.models.list(), PROBE_TIMEOUT_S)
                break
            except Exception:  # any failure means "not back yet"
                attempt += 1
                base = max(self.backoff_s, PROBE_MIN_WAIT_S)
                await wait_to_retry(attempt, base, math.inf, max_s=PROBE_MAX_WAIT_S)
        changed = self._condition()
        async with changed:
            replica.healthy = replica.seen_alive = True
            changed.notify_all()

    def stats(self) -> list[dict[str, Any]]:
        """Per-replica counts, failures and tokens/s (over each one's busy time)."""
        return [r.stats() for r in self.replicas]

    async def aclose(self) -> None:
        """Stop the probes and close every client."""
        for task in list(self._probes):
            task.cancel()
        for replica in self.replicas:
            with contextlib.suppress(Exception):
                await replica.client.close()


def _usable(replica: Replica) -> bool:
    """Healthy, or never seen alive (then tried as it is, not waited for)."""
    return replica.healthy or not replica.seen_alive


def _start(replica: Replica) -> None:
    if replica.in_flight == 0:
        replica._busy_since = time.perf_counter()
    replica.in_flight += 1
    replica.requests += 1


def _stop(replica: Replica) -> None:
    replica.in_flight -= 1
    if replica.in_flight == 0 and replica._busy_since is not None:
        replica.busy_s += time.perf_counter() - replica._busy_since
        replica._busy_since = None
