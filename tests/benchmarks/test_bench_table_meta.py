"""``bench_table.py`` records what shaped its rows, the settings its servers inherit included."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_table
from bench_fleet import Row


def test_meta_records_the_servers_inherited_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # runs 150-151 gave every server MATHAGENT_ENGINE__MAX_SEQ_LEN through the environment
    for key in [k for k in os.environ if k.startswith("MATHAGENT_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("MATHAGENT_ENGINE__MAX_SEQ_LEN", "1024")
    monkeypatch.setenv("MATHAGENT_MODEL", "shadowed-by-common")
    monkeypatch.setenv("UNRELATED", "x")
    args = argparse.Namespace(model="random:llama-3-8b", max_tokens=256, limits="8,32",
                              bench_set=["c1.jsonl"], warm_set="sample")  # fmt: skip
    common = {"MATHAGENT_MODEL": "random:llama-3-8b", "MATHAGENT_ENGINE__MAX_BATCH_SIZE": "16"}
    meta = bench_table._meta(args, "cpu", [Row.parse("bf16", 8100, "cpu", {})], common)
    assert meta["inherited_env"] == {"MATHAGENT_ENGINE__MAX_SEQ_LEN": "1024"}
    assert meta["env"] == common
