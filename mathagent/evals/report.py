"""``report.html``: one self-contained page (plots embedded as PNG) for an eval or a bench."""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, never a display
import matplotlib.pyplot as plt

from mathagent.evals.metrics import group_by_problem
from mathagent.evals.results import RESULTS_FILE, SUMMARY_FILE, ResultsFile

REPORT_FILE = "report.html"
BENCH_FILE = "bench.json"

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;
text-align:right}th{background:#f3f3f3}td.l,th.l{text-align:left}
img{max-width:100%;margin:0.5em 0}.meta{color:#666}
"""


def write_report(out_dir: Path) -> Path:
    """(Re)build ``out_dir/report.html`` from bench.json or summary.json + results.jsonl."""
    if (out_dir / BENCH_FILE).exists():
        body = _bench_body(json.loads((out_dir / BENCH_FILE).read_text()))
        title = "mathagent bench"
    elif (out_dir / SUMMARY_FILE).exists():
        summary = json.loads((out_dir / SUMMARY_FILE).read_text())
        records = ResultsFile(out_dir / RESULTS_FILE).load()
        body = _eval_body(summary, records)
        title = "mathagent eval"
    else:
        raise FileNotFoundError(f"{out_dir} has neither {SUMMARY_FILE} nor {BENCH_FILE}")
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{title}</h1>{body}</body></html>\n"
    )
    path = out_dir / REPORT_FILE
    path.write_text(page, encoding="utf-8")
    return path


def _png(fig: Any) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    data = base64.b64encode(buffer.getvalue()).decode()
    return f"<img alt='plot' src='data:image/png;base64,{data}'>"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1) -> str:
    def cell(tag: str, i: int, value: Any) -> str:
        text = f"{value:.2f}" if isinstance(value, float) else html.escape(str(value))
        return f"<{tag}{' class=l' if i < left else ''}>{text}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(header))
    body = "".join(
        "<tr>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _meta(meta: Mapping[str, Any]) -> str:
    items = ", ".join(f"{html.escape(str(k))}: {html.escape(str(v))}" for k, v in meta.items())
    return f"<p class=meta>{items}</p>"


def _eval_body(summary: Mapping[str, Any], records: list[dict[str, Any]]) -> str:
    scalars = [(k, v) for k, v in summary.items() if isinstance(v, int | float) and k != "meta"]
    parts = [_meta(summary.get("meta", {})), "<h2>Accuracy and speed</h2>"]
    parts.append(_table(["metric", "value"], scalars))
    ks = sorted(int(k.split("@")[1]) for k in summary if k.startswith("majority@"))
    if ks:
        parts += ["<h2>majority@k and pass@k</h2>", _png(_k_plot(summary, ks))]
    if records:
        parts += ["<h2>Generated tokens</h2>", _png(_tokens_plot(records))]
        parts += ["<h2>Latency</h2>", _png(_latency_plot(records))]
        parts += ["<h2>Problems</h2>", _problems_table(records)]
    return "".join(parts)


def _k_plot(summary: Mapping[str, Any], ks: list[int]) -> Any:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(ks, [summary[f"majority@{k}"] for k in ks], "o-", label="majority@k")
    ax.plot(ks, [summary.get(f"pass@{k}", 0) for k in ks], "s--", label="pass@k")
    ax.set(xlabel="k (samples)", ylabel="accuracy (%)", xscale="log", ylim=(0, 100))
    ax.minorticks_off()
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def _tokens_plot(records: list[dict[str, Any]]) -> Any:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    right = [r["num_generated_tokens"] for r in records if r["is_correct"]]
    wrong = [r["num_generated_tokens"] for r in records if not r["is_correct"]]
    ax.hist(
        [right, wrong], bins=20, stacked=True, label=["correct", "wrong"], color=["#4a4", "#c44"]
    )
    ax.set(xlabel="generated tokens per sample", ylabel="samples")
    ax.legend()
    return fig


def _latency_plot(records: list[dict[str, Any]]) -> Any:
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist([r["latency_s"] for r in records], bins=20, color="#48c")
    ax.set(xlabel="latency per sample (s)", ylabel="samples")
    return fig


def _problems_table(records: list[dict[str, Any]]) -> str:
    rows = []
    for pid, samples in group_by_problem(records).items():
        answers = ", ".join(str(s.get("predicted_answer")) for s in samples)
        correct = sum(bool(s["is_correct"]) for s in samples)
        rows.append([pid, samples[0]["expected_answer"], answers, f"{correct}/{len(samples)}"])
    return _table(["id", "expected", "predicted (per sample)", "correct"], rows, left=3)


BENCH_COLUMNS = [
    ("name", "endpoint"),
    ("total_generation_s", "total generation time (s)"),
    ("batch_tokens_per_s", "batch tokens/s"),
    ("per_request_tokens_per_s", "per-request tokens/s"),
    ("ttft_s", "time to first token (s)"),
    ("acceptance_length", "acceptance length"),
    ("accuracy", "accuracy (%)"),
]


def _bench_body(bench: Mapping[str, Any]) -> str:
    rows = bench.get("rows", [])
    table_rows = []
    for row in rows:
        cells = [row.get(key) for key, _ in BENCH_COLUMNS]
        cells[3] = (
            f"{row['per_request_tokens_per_s']:.1f} ± {row['per_request_tokens_per_s_sd']:.1f}"
        )
        cells[5] = "n/a" if cells[5] is None else cells[5]
        table_rows.append(cells)
    parts = [_meta(bench.get("meta", {})), "<h2>Speed and accuracy</h2>"]
    parts.append(_table([label for _, label in BENCH_COLUMNS], table_rows))
    if rows:
        parts += ["<h2>Speed comparison</h2>", _png(_speed_plot(rows))]
    return "".join(parts)


def _speed_plot(rows: Sequence[Mapping[str, Any]]) -> Any:
    names = [r["name"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.5))
    axes[0].bar(names, [r["batch_tokens_per_s"] for r in rows], color="#48c")
    axes[0].set(title="batch tokens/s")
    axes[1].bar(
        names,
        [r["per_request_tokens_per_s"] for r in rows],
        yerr=[r["per_request_tokens_per_s_sd"] for r in rows],
        color="#4a4",
        capsize=4,
    )
    axes[1].set(title="per-request tokens/s (± sd)")
    axes[2].bar(names, [r["ttft_s"] for r in rows], color="#c84")
    axes[2].set(title="time to first token (s)")
    for ax in axes:
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    return fig
