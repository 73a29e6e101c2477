"""Two eval runs side by side: metrics, the paired accuracy difference, problem by problem.

The difference is B − A over the problems both runs hold (:mod:`mathagent.evals.paired`:
standard error of the per-problem differences, paired-bootstrap 95% interval). A problem is a
win for B when B's share of correct samples is higher, a loss when lower.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mathagent.evals.metrics import group_by_problem
from mathagent.evals.paired import paired_difference, problem_scores
from mathagent.evals.report.page import expand_buttons, meta, problems_head, table
from mathagent.evals.report.run_page import (
    answers_html,
    expected_html,
    natural_key,
    samples_html,
    score,
    statement_html,
)

SPEED_KEYS = [
    "no_answer",
    "avg_tokens",
    "tool_calls_per_solution",
    "tokens_per_s",
    "per_request_tokens_per_s",
    "acceptance_length",
    "latency_p50_s",
    "latency_p90_s",
    "num_entries",
    "num_samples",
]
OUTCOME = {
    "win": "B better",
    "loss": "A better",
    "tie": "tie",
    "only-a": "A only",
    "only-b": "B only",
}


@dataclass
class Run:
    """One eval folder as the report reads it."""

    name: str
    path: Path
    summary: dict[str, Any]
    records: list[dict[str, Any]]


def comparison(a: Run, b: Run) -> dict[str, Any]:
    """The numbers of the comparison (what ``mathagent report A B --json`` prints)."""
    scores_a, scores_b = problem_scores(a.records), problem_scores(b.records)
    paired = paired_difference(scores_a, scores_b)
    metrics = {"pass@1[avg-of-N]": [_avg_of_n(a.summary), _avg_of_n(b.summary)]}
    metrics |= {k: [a.summary.get(k), b.summary.get(k)] for k in metric_keys(a.summary, b.summary)}
    problems = []
    for pid in sorted(scores_a.keys() | scores_b.keys(), key=natural_key):
        sa, sb = scores_a.get(pid), scores_b.get(pid)
        problems.append({"id": pid, "a": sa, "b": sb, "outcome": _outcome(sa, sb)})
    return {
        "a": str(a.path),
        "b": str(b.path),
        "paired": asdict(paired),
        "metrics": metrics,
        "problems": problems,
    }


def metric_keys(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Accuracy keys both runs report (N of avg-of-N may differ: one row), then speed keys."""
    accuracy = [k for k in a if k.startswith(("pass@", "majority@")) and k in b and "[" not in k]
    return accuracy + [k for k in SPEED_KEYS if k in a or k in b]


def _avg_of_n(summary: Mapping[str, Any]) -> float | None:
    return next((v for k, v in summary.items() if k.startswith("pass@1[avg-of-")), None)


def _outcome(sa: float | None, sb: float | None) -> str:
    if sa is None:
        return "only-b"
    if sb is None:
        return "only-a"
    return "win" if sb > sa else "loss" if sb < sa else "tie"


def comparison_body(a: Run, b: Run) -> str:
    data = comparison(a, b)
    parts = [
        f"<p>A = <b>{html.escape(a.name)}</b> ({html.escape(str(a.path))}), "
        f"B = <b>{html.escape(b.name)}</b> ({html.escape(str(b.path))})</p>",
        meta(a.summary.get("meta", {}), "A: "),
        meta(b.summary.get("meta", {}), "B: "),
        "<h2>Paired accuracy difference</h2>",
        _paired_html(data["paired"]),
        "<h2>Metrics</h2>",
        _metrics_table(data["metrics"]),
        "<h2>Problems</h2>",
        _problems_html(a, b, data["problems"]),
    ]
    return "".join(parts)


def _paired_html(p: Mapping[str, Any]) -> str:
    sign = "+" if p["difference"] >= 0 else ""
    return (
        f"<p class=diff id=paired data-n='{p['n']}' data-wins='{p['b_better']}' "
        f"data-losses='{p['a_better']}' data-ties='{p['ties']}'>"
        f"B − A = <b>{sign}{p['difference']:.1f}</b> points ± {p['se']:.1f} (SE) · 95% interval "
        f"[{p['ci_low']:.1f}, {p['ci_high']:.1f}] over {p['n']} shared problems "
        f"(A {p['accuracy_a']:.1f}%, B {p['accuracy_b']:.1f}%)</p>"
        f"<p>B better on <span class=win>{p['b_better']}</span>, A better on "
        f"<span class=loss>{p['a_better']}</span>, tie on <span class=tie>{p['ties']}</span>.</p>"
        "<p class=meta>Per problem: the share of its samples graded correct. SE: standard "
        "deviation of the per-problem differences / √n (paired, McNemar-style); interval: "
        f"paired bootstrap over problems, {p['resamples']} resamples, seed 0.</p>"
    )


def _metrics_table(metrics: Mapping[str, list[Any]]) -> str:
    rows = []
    for key, (va, vb) in metrics.items():
        both = isinstance(va, int | float) and isinstance(vb, int | float)
        diff = vb - va if both else "n/a"
        rows.append([key, "n/a" if va is None else va, "n/a" if vb is None else vb, diff])
    return table(["metric", "A", "B", "B − A"], rows)


def _problems_html(a: Run, b: Run, problems: list[dict[str, Any]]) -> str:
    cols = "--cols:minmax(8em,1fr) minmax(6em,1fr) 3fr 3em 3fr 3em 6em"
    groups_a, groups_b = group_by_problem(a.records), group_by_problem(b.records)
    labels = ["id", "expected", "A answers", "A", "B answers", "B", "outcome"]
    rows = [expand_buttons(), problems_head(cols, labels)]
    for item in problems:
        pid, outcome = item["id"], item["outcome"]
        sa, sb = groups_a.get(pid, []), groups_b.get(pid, [])
        any_side = sa or sb
        side = [
            f"<div><h4>A · {html.escape(a.name)}</h4>{samples_html(sa, pid + ' A')}</div>",
            f"<div><h4>B · {html.escape(b.name)}</h4>{samples_html(sb, pid + ' B')}</div>",
        ]
        rows.append(
            f"<details class=problem data-id='{html.escape(pid)}' data-outcome='{outcome}' "
            f"style='{cols}'><summary><b>{html.escape(pid)}</b>"
            f"<span>expected {expected_html(any_side)}</span>"
            f"<span>{answers_html(sa)}</span><span>{score(sa) if sa else ''}</span>"
            f"<span>{answers_html(sb)}</span><span>{score(sb) if sb else ''}</span>"
            f"<span class={_css(outcome)}>{OUTCOME[outcome]}</span></summary>"
            f"<div class=body>{statement_html(any_side)}<div class=cols>{''.join(side)}</div>"
            "</div></details>"
        )
    return "".join(rows)


def _css(outcome: str) -> str:
    return {"win": "win", "loss": "loss"}.get(outcome, "tie")
