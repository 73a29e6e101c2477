"""Speculative-decoding acceptance read from a running TensorRT-LLM server.

``trtllm-serve`` answers ``GET /metrics`` with a JSON list of per-iteration stats; with
speculation each entry carries ``specDecodingStats`` (``numDraftTokens``,
``numAcceptedTokens``, ``numRequestsWithDraftTokens``, ``acceptanceLength``, ...). The pytorch
backend collects them only with ``enable_iter_perf_stats: true`` in the LLM API YAML
(``mathagent serve --iter-stats``). Reading drains the server's queue: each call sees the
iterations since the previous one, so read after the workload whose acceptance you want.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx


@dataclass(frozen=True)
class Acceptance:
    """Speculation totals over the iterations that drafted anything."""

    iterations: int
    drafted: int
    accepted: int
    requests: int  # request-steps with at least one draft token

    @property
    def acceptance_length(self) -> float:
        """Tokens produced per target forward per request: 1 + accepted drafts per step."""
        return (self.accepted + self.requests) / self.requests

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


def read_iteration_stats(base_url: str, timeout_s: float = 10.0) -> list[dict | str]:
    """``GET {base_url}/metrics`` as a list (``base_url`` with or without ``/v1``)."""
    root = base_url.rstrip("/").removesuffix("/v1")
    response = httpx.get(f"{root}/metrics", timeout=timeout_s)
    response.raise_for_status()
    data = response.json()
    if not isinstance(data, list):
        raise ValueError(f"{root}/metrics did not return TensorRT-LLM iteration stats (a list)")
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
