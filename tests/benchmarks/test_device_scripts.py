"""The device's shell scripts (``benchmarks/device/``) on a CPU host, with fakes for the card.

A device call that dies in its script costs a machine start, and the H200 is lent rarely. Here
``nvidia-smi`` names a card and ``python3`` records what the scripts ask of the benchmark
scripts (writing the JSON they would), so the control flow runs as it would there: the card
check, the probe's pick passed on verbatim, the A/B order, and every flag the benchmark scripts
are given being one their ``--help`` lists.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEVICE = ROOT / "benchmarks" / "device"
COMBINED = "glu=28672x4096:2,2048,4;attn=64,64,4"

FAKE_PYTHON = r"""#!/bin/bash
# records the benchmark scripts' arguments, writes what they would; anything else: python
case "$1" in
  benchmarks/fp8_step_probe.py|benchmarks/fp8_bench.py|gpu_bench.py|bench_table.py)
    printf '%s\0' "$@" >> "$LOG"; printf '\n' >> "$LOG"
    out=$(printf '%s\n' "$@" | grep -A1 -x -- --out | tail -1)
    case "$1" in
      *fp8_step_probe.py) echo "$PROBE_JSON" > "$out";;
      *fp8_bench.py) echo "$BENCH_JSON" > "$out";;
    esac
    exit 0;;
  -m) exit 0;;  # pip
esac
exec "$REAL_PYTHON" "$@"
"""


@pytest.mark.parametrize("script", sorted(p.name for p in DEVICE.glob("*.sh")))
def test_the_script_is_valid_bash(script: str) -> None:
    run = subprocess.run(["bash", "-n", str(DEVICE / script)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def fake_run(
    tmp_path: Path, script: str, card: str, **env: str
) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """Run ``script`` as the device would on ``card``: its output, and the benchmark calls."""
    bin_dir, out = tmp_path / "bin", tmp_path / "out"
    bin_dir.mkdir()
    out.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\necho '{card}, 1980 MHz, 3201 MHz'\n")
    (bin_dir / "python3").write_text(FAKE_PYTHON)
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    log = tmp_path / "calls"
    probe = {"fp8-static-head": {"whole_ms": 2.29, "whole_mid_ms": 2.291, "whole_again_ms": 2.29,
                                 "winners": {}, "combined": COMBINED}}  # fmt: skip
    bench = {"fp8-static-head": {"b1": {"steady_tok_s": 440.0}, "graph_ms": {"1x1": 2.27},
                                 "b1_fraction_of_roofline": 0.69},
             "fp8_static_head_over_bf16_b1": 1.77}  # fmt: skip
    run = subprocess.run(
        ["bash", str(DEVICE / script)], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "OUT": str(out),
             "LOG": str(log), "REAL_PYTHON": sys.executable, "PROBE_JSON": json.dumps(probe),
             "BENCH_JSON": json.dumps(bench), **env},
    )  # fmt: skip
    calls = [line.split("\0")[:-1] for line in log.read_text().splitlines()] if log.exists() else []
    return run, calls


def test_launch_ab_passes_the_probes_pick_to_the_engine_runs(tmp_path: Path) -> None:
    run, calls = fake_run(tmp_path, "fp8_launch_ab.sh", "NVIDIA H200", CARD="H200",
                          STEPS="probe ab", VARIANTS="benchmarks/device/fp8_launch_variants_h200.txt")  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    probe, *benches = calls
    variants = [line for line in (DEVICE / "fp8_launch_variants_h200.txt").read_text().splitlines()
                if not line.startswith("#")]  # fmt: skip
    assert probe[probe.index("--variants") + 1 : probe.index("--out")] == variants
    # shipped then combined, with bf16 beside each, then both again
    assert [(c[c.index("--variant") + 1], c[c.index("--runs") + 1 : c.index("--out")])
            for c in benches] == [("", ["fp8-static-head", "none"]),
                                  (COMBINED, ["fp8-static-head", "none"]),
                                  ("", ["fp8-static-head"]), (COMBINED, ["fp8-static-head"])]  # fmt: skip
    assert "combo1 rc=0" in run.stdout and "440.0 2.27 0.69 1.77" in run.stdout


def test_another_card_runs_nothing(tmp_path: Path) -> None:
    run, calls = fake_run(tmp_path, "fp8_record.sh", "NVIDIA H100 80GB HBM3", CARD="H200")
    assert run.returncode == 3 and calls == []


def test_every_flag_given_is_one_the_script_takes(tmp_path: Path) -> None:
    """The record script's and the table's commands, against each script's own ``--help``."""
    run, calls = fake_run(tmp_path, "fp8_record.sh", "NVIDIA H200", CARD="H200", BUDGET="900")
    assert run.returncode == 0, run.stdout + run.stderr
    assert {Path(c[0]).name for c in calls} == {"fp8_bench.py", "gpu_bench.py", "bench_table.py"}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")])}
    for call in calls:
        script = ROOT / "benchmarks" / Path(call[0]).name
        usage = subprocess.run([sys.executable, str(script), "--help"], env=env, cwd=ROOT,
                               capture_output=True, text=True, timeout=120).stdout  # fmt: skip
        for flag in (a for a in call[1:] if a.startswith("--")):
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", usage), (script.name, flag)


def test_every_variant_of_the_h200_list_applies_and_is_undone() -> None:
    """A variant the probe cannot parse is a probe that dies on the card; one equal to the
    shipped launch would spend the card's time on nothing."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    probe = pytest.importorskip("fp8_step_probe")
    from mathagent.serving.engine.cuda import attention, fp8_gemv

    def state() -> tuple:
        return (dict(fp8_gemv.FP8_GEMV_CONFIGS), dict(fp8_gemv.GLU_CONFIGS),
                dict(fp8_gemv.ROW_WARPS), attention._attention)  # fmt: skip

    before = state()
    lines = (DEVICE / "fp8_launch_variants_h200.txt").read_text().splitlines()
    for spec in (line for line in lines if line and not line.startswith("#")):
        with probe.variant(spec):
            assert state() != before, spec
        assert state() == before, spec
