"""report.html renders for an eval folder, and `mathagent report DIR` rebuilds it."""

from __future__ import annotations

import base64
import re
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
