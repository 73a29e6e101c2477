"""The results disk fills mid-eval (a real 64 KiB tmpfs; a row of ``benchmarks/soak.py``'s
``faults``): a clear error, only whole lines on disk, and the same run resumes to exactly one
record per sample once there is space."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.faults import disk_full_during_eval


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_full_results_disk_is_a_clear_error_and_resume_finishes_exactly_once(tmp_path: Path):
    row = disk_full_during_eval(tmp_path)
    assert len(row["errors"]) == 2, row
    assert "No space left on device" in row["errors"][0] and "re-run" in row["errors"][0]
    assert row["no_torn_line"] and 0 < row["records_when_full"] < row["samples_expected"]
    assert row["complete_after_space"] and row["lost"] == 0 and row["duplicated"] == 0
