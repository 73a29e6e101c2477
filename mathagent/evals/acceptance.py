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

TensorRT-LLM's pytorch backend keeps those stats only with ``enable_iter_perf_stats: true`` in
the LLM API YAML (``mathagent serve --iter-stats``). :func:`read_acceptance` is the one-shot
reading: the iterations since the previous read, so call it after the workload.

The embedded engine also counts its draft-length policy's choices
(``mathagent_spec_policy_steps_total{batch_bucket, draft_len}``); the meter keeps their change
over the run, so a table row says how many of its steps drafted, and how far, and at the end
the costs the policy then judged each step shape by (``*_spec_policy_step_seconds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from dataclasses import dataclass
from typing import TypeVar

import httpx

_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="([^"]*)"')
_POLICY_STEPS = "spec_policy_steps_total"
_POLICY_SECONDS = "spec_policy_step_seconds"
_V = TypeVar("_V", int, float)


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


def parse_policy_steps(text: str) -> dict[tuple[int, int], float]:
    """The draft-length policy's step counts by (batch bucket, draft length; 0 is plain)."""
    return _policy_samples(text, _POLICY_STEPS)


def policy_step_ms(text: str) -> dict[str, dict[str, float]]:
    """The policy's step-cost estimates now, as JSON: {batch bucket: {draft length: ms}}."""
    seconds = _policy_samples(text, _POLICY_SECONDS)
    return _by_bucket({key: round(1e3 * t, 4) for key, t in seconds.items()})


def policy_steps_between(
    start: dict[tuple[int, int], float], end: dict[tuple[int, int], float]
) -> dict[str, dict[str, int]]:
    """Steps taken between two readings, as JSON: {batch bucket: {draft length: steps}}."""
    taken = {key: round(n - start.get(key, 0.0)) for key, n in end.items()}
    return _by_bucket({key: n for key, n in taken.items() if n > 0})


def _policy_samples(text: str, suffix: str) -> dict[tuple[int, int], float]:
    """Samples named ``*suffix`` labelled by batch bucket and draft length, summed per label."""
    samples: dict[tuple[int, int], float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or not match.group(1).endswith(suffix):
            continue
        labels = dict(_LABEL.findall(match.group(2) or ""))
        try:
            key = (int(labels["batch_bucket"]), int(labels["draft_len"]))
        except (KeyError, ValueError):
            continue
        samples[key] = samples.get(key, 0.0) + float(match.group(3))
    return samples


def _by_bucket(values: dict[tuple[int, int], _V]) -> dict[str, dict[str, _V]]:
    """{(bucket, draft length): value} as JSON-keyed {bucket: {draft length: value}}."""
    nested: dict[str, dict[str, _V]] = {}
    for (bucket, k), value in sorted(values.items()):
        nested.setdefault(str(bucket), {})[str(k)] = value
    return nested


_COUNTERS = (
    "spec_decode_num_accepted_tokens_total",
    "spec_decode_num_drafts_total",
    "generation_tokens_total",
    "target_forwards_total",
)


@dataclass(frozen=True)
class Acceptance:
    """TensorRT-LLM speculation totals over the iterations that drafted anything."""

    iterations: int
    drafted: int
    accepted: int
    requests: int  # request-steps with at least one draft token

    @property
    def tokens(self) -> int:
        """Tokens produced: each request-step is one target forward giving 1 + its accepted."""
        return self.accepted + self.requests

    @property
    def acceptance_length(self) -> float:
        """Tokens produced per target forward per request: 1 + accepted drafts per step."""
        return self.tokens / self.requests

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0


def acceptance_from_stats(stats: list[dict | str]) -> Acceptance | None:
    """Sum ``specDecodingStats`` over iteration stats; ``None`` when nothing was drafted."""
    iterations = drafted = accepted = requests = 0
    for entry in stats:
        # Some versions queue each iteration as a JSON string rather than an object.
        item = json.loads(entry) if isinstance(entry, str) else entry
        spec = item.get("specDecodingStats") if isinstance(item, dict) else None
        if not spec or int(spec.get("numDraftTokens", 0)) <= 0:
            continue
        iterations += 1
        drafted += int(spec["numDraftTokens"])
        accepted += int(spec.get("numAcceptedTokens", 0))
        requests += int(spec.get("numRequestsWithDraftTokens", 0))
    if iterations == 0 or requests == 0:
        return None
    return Acceptance(iterations, drafted, accepted, requests)


def parse_trtllm(stats: object) -> SpecCounters | None:
    """Acceptance counters summed over TensorRT-LLM iteration stats (a JSON list)."""
    if not isinstance(stats, list):
        return None
    found = acceptance_from_stats(stats)
    return None if found is None else SpecCounters(found.tokens, found.requests)


def metrics_url(base_url: str) -> str:
    """The server's /metrics address from its OpenAI base URL (with or without /v1)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    return f"{root}/metrics"


def read_iteration_stats(base_url: str, timeout_s: float = 10.0) -> list[dict | str]:
    """TensorRT-LLM's ``GET /metrics`` as a list (``base_url`` with or without ``/v1``)."""
    url = metrics_url(base_url)
    response = httpx.get(url, timeout=timeout_s)
    response.raise_for_status()
    data = response.json()
    if not isinstance(data, list):
        raise ValueError(f"{url} did not return TensorRT-LLM iteration stats (a list)")
    return data


def read_acceptance(base_url: str, timeout_s: float = 10.0) -> float | None:
    """Mean acceptance length since the last read, or ``None`` when the server drafted nothing.

    ``None`` also when the server has no iteration stats (not TensorRT-LLM, or
    ``enable_iter_perf_stats`` off); network errors propagate.
    """
    try:
        stats = read_iteration_stats(base_url, timeout_s)
    except (ValueError, httpx.HTTPStatusError):
        return None
    found = acceptance_from_stats(stats)
    return None if found is None else found.acceptance_length


class AcceptanceMeter:
    """Measures a server's acceptance length over a stretch of work.

    ``async with AcceptanceMeter(url) as meter: ...`` then ``meter.acceptance_length``
    (None when the server reports no speculative-decoding stats), ``meter.policy_steps`` (the
    embedded engine's policy choices over the run) and ``meter.policy_step_ms`` (its step-cost
    estimates at the end); both None from other servers.
    """

    def __init__(self, base_url: str, poll_s: float = 2.0, timeout_s: float = 5.0) -> None:
        self._url = metrics_url(base_url)
        self._client = httpx.AsyncClient(timeout=timeout_s)
        self._poll_s = poll_s
        self._start: SpecCounters | None = None
        self._polled = SpecCounters()
        self._is_json = False
        self._task: asyncio.Task[None] | None = None
        self._steps_start: dict[tuple[int, int], float] = {}
        self._steps_end: dict[tuple[int, int], float] = {}
        self.acceptance_length: float | None = None
        self.policy_steps: dict[str, dict[str, int]] | None = None
        self.policy_step_ms: dict[str, dict[str, float]] | None = None
        self._text = ""  # the last Prometheus scrape

    async def __aenter__(self) -> AcceptanceMeter:
        self._start = await self._read()
        self._steps_start = self._steps_end
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
        if self._steps_end:
            self.policy_steps = policy_steps_between(self._steps_start, self._steps_end)
            self.policy_step_ms = policy_step_ms(self._text)
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
        self._text = response.text
        self._steps_end = parse_policy_steps(response.text)
        return parse_prometheus(response.text)
