"""The benchmarks' run names map to engine settings in one table, in-process and for servers."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import engine_runs
from bench_fleet import Row

from mathagent.config import EngineSettings, Settings


@pytest.mark.parametrize("run", list(engine_runs.RUNS))
def test_each_run_is_a_valid_engine_setting_both_ways(
    run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in [k for k in os.environ if k.startswith("MATHAGENT_")]:
        monkeypatch.delenv(key)
    direct = EngineSettings(**engine_runs.settings(run))
    for key, value in engine_runs.env(run).items():
        monkeypatch.setenv(key, value)
    assert Settings().engine == direct  # what a server reads from the row's environment


def test_fp8_static_head_row_sets_static_scales_and_the_fp8_head() -> None:
    env = Row.parse("fp8-static-head+replay3", 8100, "cuda", {}).env
    assert env["MATHAGENT_ENGINE__QUANTIZATION"] == "fp8"
    assert env["MATHAGENT_ENGINE__FP8_ACTIVATION_SCALES"] == "calibrate"
    assert env["MATHAGENT_ENGINE__FP8_HEAD"] == "true"
    assert env["MATHAGENT_ENGINE__SPECULATIVE"] == "none"


def test_unknown_run_names_the_known_ones() -> None:
    with pytest.raises(SystemExit, match="fp8-static-head"):
        engine_runs.settings("fp9")
    with pytest.raises(SystemExit, match="base must be one of"):
        Row.parse("fp9+ngram", 8100, "cuda", {})
