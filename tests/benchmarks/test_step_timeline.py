"""``benchmarks/fp8_step_probe.py``'s timeline: each kernel's share of a chained step's time."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

fp8_step_probe = pytest.importorskip("fp8_step_probe")

# one layer: (name, grid, start offset, end offset) in us; PDL starts kernels before the one
# before them ends, so a kernel's duration is not its share of the step
LAYER = [("_fp8_row_kernel", [1, 1, 1], 0.0, 1.0), ("_fp8_gemv_kernel", [384, 1, 1], 0.5, 9.0),
         ("_attn_kernel", [8, 16, 1], 1.0, 15.0), ("_fp8_gemv_kernel", [512, 1, 1], 2.0, 22.0),
         ("_fp8_row_kernel", [1, 1, 1], 21.0, 23.0), ("_fp8_gemv_kernel", [7168, 1, 1], 22.0, 60.0),
         ("_fp8_gemv_kernel", [256, 1, 1], 23.0, 80.0)]  # fmt: skip


def trace(reps: int, layers: int) -> list[dict]:
    events, t0 = [{"cat": "cpu_op", "name": "graph replay", "ts": 0.0, "dur": 1e6}], 0.0
    for _ in range(reps):
        events.append({"cat": "kernel", "name": "embedding", "ts": t0, "dur": 1.5,
                       "args": {"grid": [32, 1, 1]}})  # fmt: skip
        base = t0 + 1.5
        for _ in range(layers):
            for name, grid, start, end in LAYER:
                events.append({"cat": "kernel", "name": name, "ts": base + start,
                               "dur": end - start, "args": {"grid": grid}})  # fmt: skip
            base += 80.0
        t0 = base + 100.0  # the host's gap between replays is no kernel's share
    return events


def test_each_kernel_is_charged_from_the_previous_kernels_end_to_its_own():
    res = fp8_step_probe.timeline(trace(reps=3, layers=4), reps=3)
    assert res["kernels_per_step"] == 1 + 4 * len(LAYER)
    assert res["span_us"] == pytest.approx(1.5 + 4 * 80.0)
    share = {row["kernel"]: row["segment_us_per_step"] for row in res["segments"]}
    assert share["_attn_kernel grid=[8, 16, 1]"] == pytest.approx(4 * 6.0)  # 15 - 9, not 14
    assert share["_fp8_gemv_kernel grid=[512, 1, 1]"] == pytest.approx(4 * 7.0)
    assert share["_fp8_row_kernel grid=[1, 1, 1]"] == pytest.approx(4 * (1.0 + 1.0))
    assert sum(share.values()) == pytest.approx(res["span_us"])
    layer = res["layer"]  # a middle layer in order, from its row kernel to its w2
    assert [row[0] for row in layer] == [name for name, *_ in LAYER]
    assert [row[2] for row in layer] == [1.0, 8.0, 6.0, 7.0, 1.0, 37.0, 20.0]


def test_a_variant_sets_its_knobs_for_the_block_and_restores_them():
    """``--variants`` entries (a row kernel's warps, a launch shape, an attention knob) hold
    inside the ``with`` only, so one probe times each against the shipped settings."""
    from mathagent.serving.engine.cuda import attention, fp8_gemv

    rows, shapes = dict(fp8_gemv.ROW_WARPS), dict(fp8_gemv.FP8_GEMV_CONFIGS)
    loads = attention.MERGE_LOADS
    spec = "row=4096,1:16;cfg=4096x4096:8,512,4;cfg=4096x14336:8,512,4,7;MERGE_LOADS=2"
    with fp8_step_probe.variant(spec):
        assert fp8_gemv.row_warps(4096, 1) == 16 and fp8_gemv.row_warps(4096, 0) == 8
        assert fp8_gemv.FP8_GEMV_CONFIGS[(4096, 4096)] == fp8_gemv.Fp8GemvConfig(8, 512, 4)
        split = fp8_gemv.Fp8GemvConfig(8, 512, 4, split=7)  # a fourth number: K slices
        assert fp8_gemv.FP8_GEMV_CONFIGS[(4096, 14336)] == split
        assert attention.MERGE_LOADS == 2
    assert rows == fp8_gemv.ROW_WARPS and shapes == fp8_gemv.FP8_GEMV_CONFIGS
    assert loads == attention.MERGE_LOADS


def test_winners_beat_the_shipped_graph_by_more_than_its_spread_one_a_setting():
    res = {"whole_ms": 2.300, "whole_mid_ms": 2.302, "whole_again_ms": 2.298,
           "variant glu=28672x4096:2,2048,4": 2.25, "variant glu=28672x4096:4,1024,4": 2.27,
           "variant cfg=4096x14336:16,256,8,2": 2.288, "variant cfg=4096x4096:4,512,4": 2.294,
           "variant attn=64,64,4": 2.26, "variant attn=32,32,8": 2.24,
           "variant cfg=6144x4096:8,512,4": "RuntimeError('no compile')"}  # fmt: skip
    won = fp8_step_probe.winners(res)
    # w2's 0.5% counts, wo's 0.26% is inside the 0.3% margin; two attention launches, one kept
    assert won == {"glu=28672x4096": ("glu=28672x4096:2,2048,4", 2.25),
                   "cfg=4096x14336": ("cfg=4096x14336:16,256,8,2", 2.288),
                   "attn": ("attn=32,32,8", 2.24)}  # fmt: skip
    # a shipped graph that drifted by more than a gain leaves that gain out
    assert "cfg=4096x14336" not in fp8_step_probe.winners({**res, "whole_mid_ms": 2.32})
