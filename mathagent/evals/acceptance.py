"""Speculative-decoding acceptance read from a server's ``/metrics`` during a run.

Acceptance length is generated tokens per target-model forward. Two formats exist. Prometheus
text (the embedded engine, vLLM, SGLang) exposes running counters, so a run's value comes from
the difference of two scrapes: vLLM-style ``*spec_decode_num_accepted_tokens_total`` and
``*spec_decode_num_drafts_total`` (tokens = drafts + accepted per draft step), or the embedded
engine's ``*generation_tokens_total`` with ``*target_forwards_total`` (or, without that counter,
its ``*acceptance_length`` gauge, from which the forwards are recovered). TensorRT-LLM's
``trtllm-serve`` answers JSON: the iteration stats since the last call, each with
``specDecodingStats`` {numAcceptedTokens, numRequestsWithDraftTokens, ...}; those are drained
by every read, so the meter polls them while the run goes on and sums them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from dataclasses import dataclass

import httpx

from mathagent.serving.acceptance import acceptance_from_stats

_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)")


@dataclass(frozen=True)
class SpecCounters:
    """Running totals: tokens produced and target-model forwards that produced them."""

    tokens: float = 0.0
    forwards: float = 0.0

    def __sub__(self, other: SpecCounters) -> SpecCounters:
        return SpecCounters(self.tokens - other.tokens, self.forwards - other.forwards)

    def __add__(self, other: SpecCounters) -> SpecCounters:
        return SpecCounters(self.tokens + other.tokens, self.forwards + other.forwards)

    @property
    def acceptance_length(self) -> float | None:
        """Tokens per target forward; None when nothing was generated."""
        return self.tokens / self.forwards if self.forwards > 0 else None


def parse_prometheus(text: str) -> SpecCounters | None:
    """Acceptance counters from Prometheus text; None when the server exports none."""
    counters: dict[str, float] = {}
    gauges: dict[str, float] = {}  # gauges are not summed: pick one by name below
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or line.startswith("#"):
            continue
        name, value = match.group(1), float(match.group(3))
        if name.endswith("acceptance_length"):
            gauges[name] = value
        for suffix in _COUNTERS:
            if name.endswith(suffix):
                counters[suffix] = counters.get(suffix, 0.0) + value
    drafts = counters.get("spec_decode_num_drafts_total")
    if drafts is not None:
        accepted = counters.get("spec_decode_num_accepted_tokens_total", 0.0)
        return SpecCounters(drafts + accepted, drafts)
    tokens = counters.get("generation_tokens_total")
    if tokens is None:
        return None
    if "target_forwards_total" in counters:
        return SpecCounters(tokens, counters["target_forwards_total"])
    # The plainest name (``mathagent_acceptance_length``) is the whole engine's figure.
    gauge = gauges[min(gauges, key=len)] if gauges else None
    return SpecCounters(tokens, tokens / gauge) if gauge else None


_COUNTERS = (
    "spec_decode_num_accepted_tokens_total",
    "spec_decode_num_drafts_total",
    "generation_tokens_total",
    "target_forwards_total",
)


def parse_trtllm(stats: object) -> SpecCounters | None:
    """Acceptance counters summed over TensorRT-LLM iteration stats (a JSON list)."""
    if not isinstance(stats, list):
        return None
    found = acceptance_from_stats(stats)
    if found is None:
        return None
    # Each request-step with drafts is one target forward yielding 1 + its accepted tokens.
    return SpecCounters(found.accepted + found.requests, found.requests)


def metrics_url(base_url: str) -> str:
    """The server's /metrics address from its OpenAI base URL (with or without /v1)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    return f"{root}/metrics"


class AcceptanceMeter:
    """Measures a server's acceptance length over a stretch of work.

    ``async with AcceptanceMeter(url) as meter: ...`` then ``meter.acceptance_length``
    (None when the server reports no speculative-decoding stats).
    """

    def __init__(self, base_url: str, poll_s: float = 2.0, timeout_s: float = 5.0) -> None:
        self._url = metrics_url(base_url)
        self._client = httpx.AsyncClient(timeout=timeout_s)
        self._poll_s = poll_s
        self._start: SpecCounters | None = None
        self._polled = SpecCounters()
        self._is_json = False
        self._task: asyncio.Task[None] | None = None
        self.acceptance_length: float | None = None

    async def __aenter__(self) -> AcceptanceMeter:
        self._start = await self._read()
        if self._is_json:
            self._polled = SpecCounters()  # the first read only drained older iterations
            self._task = asyncio.create_task(self._poll())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        end = await self._read()
        if self._is_json:
            self.acceptance_length = self._polled.acceptance_length
        elif end is not None and self._start is not None:
            self.acceptance_length = (end - self._start).acceptance_length
        await self._client.aclose()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            await self._read()

    async def _read(self) -> SpecCounters | None:
        try:
            response = await self._client.get(self._url)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        if "json" in response.headers.get("content-type", "") or response.text.lstrip()[:1] == "[":
            self._is_json = True
            try:
                counters = parse_trtllm(json.loads(response.text))
            except json.JSONDecodeError:
                return None
            if counters is not None:
                self._polled += counters
            return counters
        return parse_prometheus(response.text)
