"""``benchmarks/fp8_pair_probe.py``: wo -> RMSNorm -> w13 in one persistent kernel gives what
the shipped one-row FP8 products give (Triton's interpreter here; one program, so the grid-wide
wait passes at once: only the device shows it under real concurrency)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests import triton_interpreter

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

if not triton_interpreter.interpreting():
    pytest.skip(
        "needs Triton's interpreter (on a GPU the probe runs itself)", allow_module_level=True
    )
fp8_pair_probe = pytest.importorskip("fp8_pair_probe")


def test_the_persistent_pair_is_bit_equal_to_the_shipped_products() -> None:
    got = fp8_pair_probe.check()
    for name in ("persistent", "two_launches"):
        assert got[name]["h_max_abs"] == 0.0 and got[name]["codes_unequal"] == 0, got
        assert got[name]["codes_nonzero"] > 256  # most of w13's 512 codes are not zero
        assert got[name]["counters"] == [0, 0, 0]  # back at zero, no wait timed out
