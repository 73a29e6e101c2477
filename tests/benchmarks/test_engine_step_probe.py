"""``benchmarks/engine_step_probe.py``: the GPU operations an engine step runs outside its
decode graph, found in a profiler trace."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

engine_step_probe = pytest.importorskip("engine_step_probe")


def trace(steps: int) -> list[dict]:
    """``steps`` steps: a graph of three kernels (a copy inside it), then the argmax and two
    copies outside it; each step 100 us after the one before."""
    ops = []
    for i in range(steps):
        t = 100.0 * i
        ops += [{"cat": "kernel", "name": "embedding", "ts": t, "dur": 2.0},
                {"cat": "gpu_memcpy", "name": "inside", "ts": t + 3, "dur": 1.0},
                {"cat": "kernel", "name": "layer", "ts": t + 5, "dur": 60.0},
                {"cat": "kernel", "name": "head", "ts": t + 66, "dur": 20.0},
                {"cat": "kernel", "name": "argmax", "ts": t + 88, "dur": 3.0},
                {"cat": "gpu_memcpy", "name": "DtoH", "ts": t + 93, "dur": 1.5},
                {"cat": "gpu_memcpy", "name": "HtoD", "ts": t + 96, "dur": 1.0}]  # fmt: skip
    return ops


def test_each_step_is_found_and_what_runs_between_is_listed() -> None:
    res = engine_step_probe.between(trace(5), "embedding", 3)
    assert res["steps_found"] == 5
    assert res["period_us_median"] == 100.0
    assert res["outside_graph_us_median"] == 14.0  # the head ends at 86, the next step at 100
    first = res["examples"][0]
    assert [op[0] for op in first] == ["argmax", "DtoH", "HtoD", "embedding"]
    assert first[0][2:] == [2.0, 3.0]  # 2 us after the head's end, 3 us long


def test_a_trace_cut_inside_a_step_counts_no_partial_graph_as_a_step() -> None:
    ops = trace(3)[2:]  # begins inside the first step's graph
    res = engine_step_probe.between(ops, "embedding", 3)
    assert res["steps_found"] == 2
