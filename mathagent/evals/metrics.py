"""Accuracy and speed metrics over result records, with NeMo-Skills' metric names.

Accuracies are percentages as in NeMo-Skills: ``pass@1[avg-of-N]`` (mean per-sample accuracy),
``majority@k`` (vote over the first k samples, answers clustered by the grader's equivalence as
the agent's vote clusters them; no-answers do not vote; a tie between t answers gives each 1/t
credit), ``pass@k`` (the unbiased estimator of Chen et al. 2021 over all n
samples of a problem), ``no_answer`` (samples without an answer).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from math import comb
from statistics import mean, pstdev
from typing import Any

import numpy as np

from mathagent.agent.answer import cluster_answers


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn from n (c correct) is correct."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def majority_score(votes: Sequence[tuple[int | str | None, bool]]) -> float:
    """Credit of a majority vote over (answer cluster, is_correct) pairs; ties share credit."""
    counts = Counter(key for key, _ in votes if key is not None)
    if not counts:
        return 0.0
    top = max(counts.values())
    tied = [key for key, count in counts.items() if count == top]
    correct = {key for key, ok in votes if ok and key is not None}
    return sum(key in correct for key in tied) / len(tied)


def k_values(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks = [1 << i for i in range(n.bit_length()) if 1 << i <= n]
    return sorted({*ks, n}) if n >= 1 else []


def group_by_problem(records: Iterable[Mapping[str, Any]]) -> dict[str, list[Mapping[str, Any]]]:
    """Records per problem id, each list sorted by sample index."""
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for record in records:
        groups[str(record["id"])].append(record)
    return {pid: sorted(rows, key=lambda r: int(r["sample"])) for pid, rows in groups.items()}


def accuracy_metrics(records: Iterable[Mapping[str, Any]]) -> dict[str, float | int]:
    """pass@1[avg-of-N], majority@k, pass@k and no_answer (percentages), plus counts."""
    groups = group_by_problem(records)
    if not groups:
        return {"num_entries": 0, "num_samples": 0}
    n = max(len(rows) for rows in groups.values())
    samples = [row for rows in groups.values() for row in rows]
    out: dict[str, float | int] = {
        "num_entries": len(groups),
        "num_samples": len(samples),
        f"pass@1[avg-of-{n}]": 100
        * mean(mean(bool(r["is_correct"]) for r in rows) for rows in groups.values()),
    }
    # One clustering per problem serves every k: a prefix clusters as it does inside the whole.
    clusters = {
        pid: cluster_answers([r.get("predicted_answer") for r in rows])
        for pid, rows in groups.items()
    }
    for k in k_values(n):
        votes = [
            [(c, bool(r["is_correct"])) for c, r in zip(clusters[pid], rows[:k], strict=False)]
            for pid, rows in groups.items()
        ]
        out[f"majority@{k}"] = 100 * mean(majority_score(v) for v in votes)
        out[f"pass@{k}"] = 100 * mean(
            pass_at_k(len(rows), sum(bool(r["is_correct"]) for r in rows), min(k, len(rows)))
            for rows in groups.values()
        )
    out["no_answer"] = 100 * mean(label is None for labels in clusters.values() for label in labels)
    return out


def busy_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals: wall time with work in flight."""
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def speed_metrics(records: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Tokens, tool calls, latency percentiles and throughput of the samples."""
    if not records:
        return {}
    tokens = [int(r.get("num_generated_tokens") or 0) for r in records]
    latencies = [float(r.get("latency_s") or 0.0) for r in records]
    per_request = [t / s for t, s in zip(tokens, latencies, strict=True) if s > 0]
    spans = [
        (float(r["started_at"]), float(r["finished_at"]))
        for r in records
        if r.get("started_at") is not None and r.get("finished_at") is not None
    ]
    wall = busy_seconds(spans) if spans else sum(latencies)
    return {
        "avg_tokens": mean(tokens),
        "tool_calls_per_solution": mean(len(r.get("tool_calls") or []) for r in records),
        "latency_p50_s": float(np.percentile(latencies, 50)),
        "latency_p90_s": float(np.percentile(latencies, 90)),
        "gen_seconds": wall,
        "tokens_per_s": sum(tokens) / wall if wall > 0 else 0.0,
        "per_request_tokens_per_s": mean(per_request) if per_request else 0.0,
        "per_request_tokens_per_s_sd": pstdev(per_request) if per_request else 0.0,
    }


def summarize(
    records: Sequence[Mapping[str, Any]], *, acceptance_length: float | None = None
) -> dict[str, Any]:
    """The summary.json body: accuracy, then speed, then acceptance when the server reports it."""
    summary: dict[str, Any] = {**accuracy_metrics(records), **speed_metrics(records)}
    if acceptance_length is not None:
        summary["acceptance_length"] = acceptance_length
    return summary
