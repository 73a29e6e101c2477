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


def bench_body(bench: Mapping[str, Any]) -> str:
    rows = bench.get("rows", [])
    table_rows = []
    for row in rows:
        cells = [row.get(key) for key, _ in BENCH_COLUMNS]
        cells[3] = (
            f"{row['per_request_tokens_per_s']:.1f} ± {row['per_request_tokens_per_s_sd']:.1f}"
        )
        cells[5] = "n/a" if cells[5] is None else cells[5]
        table_rows.append(cells)
    parts = [meta(bench.get("meta", {})), "<h2>Speed and accuracy</h2>"]
    parts.append(table([label for _, label in BENCH_COLUMNS], table_rows))
    if rows:
        parts += ["<h2>Speed comparison</h2>", png(speed_plot(rows))]
    return "".join(parts)
