"""report.html renders for an eval folder, and `mathagent report DIR` rebuilds it."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("scripted_run.py")
ROOT = Path(__file__).resolve().parents[2]


def test_report_command_rebuilds_a_self_contained_page(tmp_path: Path):
    run = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), "8", "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    (tmp_path / "report.html").unlink()
    done = subprocess.run(
        [sys.executable, "-m", "mathagent", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "report.html").read_text()
    assert "majority@4" in page and "pass@1[avg-of-4]" in page
    assert "src='http" not in page and "<link" not in page  # nothing loaded from elsewhere
    images = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)", page)
    assert len(images) == 3
    assert all(base64.b64decode(img).startswith(b"\x89PNG") for img in images)


def test_report_command_on_an_empty_folder_fails_clearly(tmp_path: Path):
    done = subprocess.run(
        [sys.executable, "-m", "mathagent", "report", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "summary.json" in done.stderr


FIXTURES = Path(__file__).with_name("fixtures") / "report_runs"


def _mathagent(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mathagent", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_rows_written_before_segments_still_show_code_and_output(tmp_path: Path):
    # The real rows of fixtures/report_runs/tools without the field older runs did not write.
    shutil.copy(FIXTURES / "tools" / "summary.json", tmp_path)
    rows = [json.loads(line) for line in (FIXTURES / "tools" / "results.jsonl").open()]
    with (tmp_path / "results.jsonl").open("w") as f:
        for row in rows:
            row.pop("segments")
            f.write(json.dumps(row) + "\n")
    assert _mathagent("report", tmp_path).returncode == 0
    page = (tmp_path / "report.html").read_text()
    calls = sum(len(r["tool_calls"]) for r in rows)
    assert page.count("<pre class='code hl' data-call=") == calls > 0
    assert page.count("<div class='out") == calls


def test_report_compare_refuses_three_folders_and_disjoint_runs(tmp_path: Path):
    three = _mathagent("report", tmp_path, tmp_path, tmp_path)
    assert three.returncode == 2 and "one folder or two" in three.stderr
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, keep in ((a, "sample-01"), (b, "sample-02")):
        folder.mkdir()
        (folder / "summary.json").write_text((FIXTURES / "no-tools" / "summary.json").read_text())
        lines = (FIXTURES / "no-tools" / "results.jsonl").read_text().splitlines()
        (folder / "results.jsonl").write_text("\n".join(x for x in lines if keep in x) + "\n")
    disjoint = _mathagent("report", a, b)
    assert disjoint.returncode == 1 and "share no problem" in disjoint.stderr
