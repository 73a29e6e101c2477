"""The body of one eval's report: metrics, plots, then every problem with its samples."""

from __future__ import annotations

import html
import re
from collections.abc import Mapping, Sequence
from typing import Any

from mathagent.evals.metrics import group_by_problem
from mathagent.evals.report.page import expand_buttons, meta, problems_head, table
from mathagent.evals.report.plots import k_plot, latency_plot, png, tokens_plot
from mathagent.evals.report.transcript import answer_html, sample_html

Record = Mapping[str, Any]


def eval_body(summary: Mapping[str, Any], records: list[dict[str, Any]]) -> str:
    scalars = [(k, v) for k, v in summary.items() if isinstance(v, int | float) and k != "meta"]
    parts = [meta(summary.get("meta", {})), "<h2>Accuracy and speed</h2>"]
    parts.append(table(["metric", "value"], scalars))
    ks = sorted(int(k.split("@")[1]) for k in summary if k.startswith("majority@"))
    if ks:
        parts += ["<h2>majority@k and pass@k</h2>", png(k_plot(summary, ks))]
    if records:
        parts += ["<h2>Generated tokens</h2>", png(tokens_plot(records))]
        parts += ["<h2>Latency</h2>", png(latency_plot(records))]
        parts += ["<h2>Problems</h2>", problems_html(records)]
    return "".join(parts)


def problems_html(records: list[dict[str, Any]]) -> str:
    """One collapsible row per problem: id, expected, each sample's answer, score."""
    cols = "--cols:minmax(8em,1fr) minmax(6em,1fr) 4fr 4em"
    rows = [expand_buttons(), "<p class=meta>a problem opens to its samples' transcripts</p>"]
    rows.append(problems_head(cols, ["id", "expected", "answers (per sample)", "correct"]))
    groups = group_by_problem(records)
    for pid in sorted(groups, key=natural_key):
        samples = groups[pid]
        rows.append(
            f"<details class=problem data-id='{html.escape(pid)}' style='{cols}'><summary>"
            f"<b>{html.escape(pid)}</b><span>expected {expected_html(samples)}</span>"
            f"<span>{answers_html(samples)}</span><span>{score(samples)}</span></summary>"
            f"<div class=body>{statement_html(samples)}{samples_html(samples, pid)}</div>"
            "</details>"
        )
    return "".join(rows)


def natural_key(pid: str) -> list[Any]:
    """Order ids as people do: sample-2 before sample-10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", pid)]


def expected_html(samples: Sequence[Record]) -> str:
    return f"<code>{html.escape(str(samples[0].get('expected_answer')))}</code>"


def answers_html(samples: Sequence[Record]) -> str:
    return "".join(answer_html(s) for s in samples)


def score(samples: Sequence[Record]) -> str:
    return f"{sum(bool(s['is_correct']) for s in samples)}/{len(samples)}"


def statement_html(samples: Sequence[Record]) -> str:
    return f"<div class=statement>{html.escape(str(samples[0].get('problem') or ''))}</div>"


def samples_html(samples: Sequence[Record], where: str) -> str:
    """The samples of one problem; the page checks that it shows as many as it counts."""
    inner = "".join(sample_html(s, where) for s in samples)
    return f"<div class=samples data-count='{len(samples)}' data-where='{html.escape(where)}'>{inner}</div>"
