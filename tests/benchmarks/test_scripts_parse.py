"""Every benchmark script imports and parses its arguments on a CPU host (``--help``).

Most benchmarks run only on the device, where a script that dies in argparse costs a machine
start: ``gpu_bench.py`` once defined ``--fused-table`` twice (its own and the one
``gpu_default_model.add_arguments`` brings) and refused to start on the H200.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if "argparse" in p.read_text())


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_script_parses_its_arguments(script: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(BENCH.parent), str(BENCH)])}
    run = subprocess.run([sys.executable, script, "--help"], cwd=BENCH, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "usage:" in run.stdout
