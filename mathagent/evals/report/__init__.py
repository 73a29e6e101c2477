"""Self-contained HTML reports: one eval or bench folder, or two eval runs compared.

``write_report(DIR)`` (re)builds ``DIR/report.html`` from bench.json, or from summary.json and
results.jsonl; ``write_comparison(A, B)`` writes the side-by-side page of two eval folders.
Pages embed their plots, style, highlighting and checks, and fetch nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from mathagent.evals.report.bench_page import bench_body
from mathagent.evals.report.compare_page import Run, comparison, comparison_body
from mathagent.evals.report.page import page
from mathagent.evals.report.run_page import eval_body
from mathagent.evals.results import RESULTS_FILE, SUMMARY_FILE, ResultsFile

REPORT_FILE = "report.html"
BENCH_FILE = "bench.json"

__all__ = [
    "BENCH_FILE",
    "REPORT_FILE",
    "comparison",
    "load_run",
    "write_comparison",
    "write_report",
]


def write_report(out_dir: Path) -> Path:
    """(Re)build ``out_dir/report.html`` from bench.json or summary.json + results.jsonl."""
    path = out_dir / REPORT_FILE
    if (out_dir / BENCH_FILE).exists():
        bench = json.loads((out_dir / BENCH_FILE).read_text())
        path.write_text(page("mathagent bench", bench_body(bench)), encoding="utf-8")
        return path
    run = load_run(out_dir)
    problems = len({str(r["id"]) for r in run.records})
    body = eval_body(run.summary, run.records)
    path.write_text(page("mathagent eval", body, problems), encoding="utf-8")
    return path


def load_run(out_dir: Path) -> Run:
    """An eval folder's summary and records; a clear error when it is not one."""
    if not (out_dir / SUMMARY_FILE).exists():
        raise FileNotFoundError(f"{out_dir} has neither {SUMMARY_FILE} nor {BENCH_FILE}")
    summary = json.loads((out_dir / SUMMARY_FILE).read_text())
    records = ResultsFile(out_dir / RESULTS_FILE).load()
    return Run(out_dir.resolve().name, out_dir, summary, records)


def write_comparison(dir_a: Path, dir_b: Path, out: Path | None = None) -> Path:
    """Write the comparison page of two eval folders (default ``A/compare-<B>.html``)."""
    a, b = load_run(dir_a), load_run(dir_b)
    if a.name == b.name:
        a.name, b.name = str(dir_a), str(dir_b)
    path = out or dir_a / f"compare-{b.name.replace('/', '_')}.html"
    ids = {str(r["id"]) for r in a.records} | {str(r["id"]) for r in b.records}
    title = f"mathagent: {a.name} vs {b.name}"
    path.write_text(page(title, comparison_body(a, b), len(ids)), encoding="utf-8")
    return path
