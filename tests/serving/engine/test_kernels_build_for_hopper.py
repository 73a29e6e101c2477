"""The FP8 one-row GEMV builds for Hopper at every shipped launch shape, W8A8, A16 and the GLU
form writing codes (and K in slices at four launches), with
no more spilled registers than the measured W8A8 build: compiled ahead of time here, with
Triton's own ptxas (:mod:`tests.triton_hopper`), before the device machine sees it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[3]


def test_fp8_gemv_builds_for_sm90_without_new_spills():
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    run = subprocess.run([sys.executable, "-m", "tests.triton_hopper"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    every = [json.loads(line) for line in run.stdout.splitlines()]
    # the static-scale kernels (row kernels, attention writing codes) build both ways; the
    # decode step's advance at four batch buckets
    others = [r for r in every if r["kernel"] != "fp8_gemv"]
    assert len(others) == 7 + 4 and all(r["registers"] <= 255 for r in others), others
    assert all(r["spill_bytes"] == 0 for r in others if r["kernel"] == "decode_advance"), others
    assert all(r["spill_bytes"] == 0 for r in others if r["kernel"] == "attention"), others
    # K in slices, aligned as launched: no spills, and the 16-byte weight loads (as few
    # registers as the same tile unsplit: 48-76 for these, 127+ had the loads gone byte-wide)
    split = [r for r in every if r["kernel"] == "fp8_gemv" and "split" in r]
    assert len(split) == 4 and all(r["spill_bytes"] == 0 for r in split), split
    assert all(r["registers"] <= 96 for r in split), split
    rows = [r for r in every if r["kernel"] == "fp8_gemv" and "split" not in r]
    # W8A8 and A16 at each launch shape (the FP8 head's and other cards' too), GLU codes
    launches = {(tuple(r["shape"]), r["glu"], tuple(r["launch"])) for r in rows}
    assert len(launches) == 6 + 3 and len(rows) == 2 * 9 + 2
    w8a8 = {
        (tuple(r["shape"]), r["glu"], tuple(r["launch"])): r
        for r in rows
        if not r["a16"] and not r["codes"]
    }
    for row in rows:
        base = w8a8[(tuple(row["shape"]), row["glu"], tuple(row["launch"]))]
        assert row["registers"] <= 255 and row["spill_bytes"] <= base["spill_bytes"], row
