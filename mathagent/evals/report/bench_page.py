"""The body of a ``mathagent bench`` report: one row per endpoint, then the speed plot."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mathagent.evals.report.page import meta, table
from mathagent.evals.report.plots import png, speed_plot

BENCH_COLUMNS = [
    ("name", "endpoint"),
    ("total_generation_s", "total generation time (s)"),
    ("batch_tokens_per_s", "batch tokens/s"),
    ("per_request_tokens_per_s", "per-request tokens/s"),
    ("ttft_s", "time to first token (s)"),
    ("acceptance_length", "acceptance length"),
    ("accuracy", "accuracy (%)"),
]


def policy_cell(steps: Mapping[str, Mapping[str, int]] | None) -> str:
    """The embedded engine's policy choices over a row's run: ``plain 12 · k3 579`` per batch
    bucket (``b16: ...`` when more than one), so a low acceptance length that came from plain
    steps reads as such."""
    if not steps:
        return "n/a"
    parts = []
    for bucket, by_len in sorted(steps.items(), key=lambda item: int(item[0])):
        chosen = " · ".join(
            f"{'plain' if k == '0' else f'k{k}'} {n}"
            for k, n in sorted(by_len.items(), key=lambda item: int(item[0]))
        )
        parts.append(chosen if len(steps) == 1 else f"b{bucket}: {chosen}")
    return "; ".join(parts)


def bench_body(bench: Mapping[str, Any]) -> str:
    rows = bench.get("rows", [])
    columns = [label for _, label in BENCH_COLUMNS]
    with_policy = any("policy_steps" in row for row in rows)
    if with_policy:
        columns.append("policy steps")
    table_rows = []
    for row in rows:
        cells = [row.get(key) for key, _ in BENCH_COLUMNS]
        cells[3] = (
            f"{row['per_request_tokens_per_s']:.1f} ± {row['per_request_tokens_per_s_sd']:.1f}"
        )
        cells[5] = "n/a" if cells[5] is None else cells[5]
        if with_policy:
            cells.append(policy_cell(row.get("policy_steps")))
        table_rows.append(cells)
    parts = [meta(bench.get("meta", {})), "<h2>Speed and accuracy</h2>"]
    parts.append(table(columns, table_rows))
    if rows:
        parts += ["<h2>Speed comparison</h2>", png(speed_plot(rows))]
    return "".join(parts)
