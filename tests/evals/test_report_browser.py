"""Reports in a real headless Chromium: one run, two runs compared, and checks that can fail.

The data are two real eval runs of the default model (fixtures/report_runs/README.md); the
pages come from the real `mathagent report` command. Screenshots go to the test's tmp_path
(their paths are printed); the page's own checks must pass with no console error and no
request leaving the file.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.evals.browser import open_report

FIXTURES = Path(__file__).with_name("fixtures") / "report_runs"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def runs(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "tools", tmp_path / "no-tools"
    shutil.copytree(FIXTURES / "tools", a)
    shutil.copytree(FIXTURES / "no-tools", b)
    return a, b


def _report(*args: object) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "mathagent", "report", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]


def test_one_run_shows_every_sample_transcript(runs, tmp_path: Path):
    a, _ = runs
    path = Path(_report(a).strip())
    seen = open_report(path, tmp_path / "screenshots", "one-run")
    assert seen.checks["ok"], seen.checks["failures"]
    assert seen.errors == [] and seen.blocked == []
    rows = _rows(a)
    assert seen.checks["problems"] == len({r["id"] for r in rows})
    assert seen.checks["samples"] == len(rows)
    assert seen.checks["outputs"] == sum(len(r["tool_calls"]) for r in rows) > 0
    assert seen.facts["problem_open"]
    assert seen.facts["transcripts_visible"] == seen.facts["samples"] == 2
    assert all(shot.stat().st_size > 5_000 for shot in seen.shots)
    page = path.read_text()
    assert 'class="nb">print</span>' in page  # highlighted by pygments
    assert "output · completed · " in page  # the terminal's box title
    # Each no-answer shows twice: in its problem's row and in its sample's header.
    assert page.count("no answer</span>") == 2 * sum(r["predicted_answer"] is None for r in rows)
    assert ">None<" not in page


def test_two_runs_side_by_side_with_the_paired_difference(runs, tmp_path: Path):
    a, b = runs
    out = tmp_path / "compare.html"
    data = json.loads(_report(a, b, "--out", out, "--json"))
    paired = data["paired"]
    # Tools right on 1 of 2 samples of sample-01 and -02, no-tools wrong everywhere.
    assert (paired["b_better"], paired["a_better"], paired["ties"]) == (0, 2, 1)
    assert paired["difference"] == pytest.approx(-100 / 3)
    assert paired["ci_low"] <= paired["difference"] <= paired["ci_high"]
    assert data["metrics"]["tokens_per_s"][0] > 0 and data["metrics"]["acceptance_length"]
    seen = open_report(out, tmp_path / "screenshots", "compare")
    assert seen.checks["ok"], seen.checks["failures"]
    assert seen.errors == [] and seen.blocked == []
    assert seen.checks["samples"] == len(_rows(a)) + len(_rows(b))
    (ax, ay), (bx, by) = seen.facts["columns"]
    assert ax < bx and ay == by  # A and B side by side
    page = out.read_text()
    assert f"data-losses='{paired['a_better']}'" in page and "B − A = <b>-33.3</b>" in page
    assert page.count("data-outcome='loss'") == 2 and page.count("data-outcome='tie'") == 1


def test_the_page_checks_catch_a_broken_page(runs, tmp_path: Path):
    a, _ = runs
    path = Path(_report(a).strip())
    page = path.read_text()
    first_sample = page.index("<details class='sample")
    end = page.index("</details>", first_sample) + len("</details>")
    page = page[:first_sample] + page[end:]  # a sample the problem still counts
    page = page.replace(
        "<span class='answer noans'>no answer</span>", "<span class=answer>None</span>"
    )
    page = page.replace("<p id=checks>", "<img src='http://example.invalid/x.png'><p id=checks>")
    broken = tmp_path / "broken.html"
    broken.write_text(page)
    seen = open_report(broken, tmp_path / "screenshots", "broken")
    assert not seen.checks["ok"]
    failures = " | ".join(seen.checks["failures"])
    assert "1 samples shown, 2 counted" in failures and 'an answer reads "None"' in failures
    assert any("report checks failed" in e for e in seen.errors)
    assert seen.blocked == ["http://example.invalid/x.png"]
