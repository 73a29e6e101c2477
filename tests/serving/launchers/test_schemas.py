"""The goal: 0 refused keys or flags and 0 differences from the source material, across every
preset x engine x version; plus proof that the check catches what the engines refuse, and a
replay of the command lines through vLLM's and SGLang's real parsers where they are installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mathagent.serving.launchers import sglang, vllm
from mathagent.serving.launchers.presets import PRESETS

sys.path.insert(0, str(Path(__file__).parent))
import schema_check

REPO = Path(__file__).resolve().parents[3]


def test_every_rendering_is_accepted_and_reproduces_the_source():
    figures = schema_check.figures()
    assert figures["refused"] == {}
    assert figures["differences"] == []
    assert figures["renderings_checked"] >= 40
    # Only ReDrafter is refused, where its engine path does not exist: nothing else.
    assert {k.split(" @ ")[0] for k in figures["refused_at_plan_time"]} == {
        "openmath-14b-fp8-redrafter"
    }


def test_the_snapshots_name_their_origin():
    for path in sorted((Path(__file__).parent / "schemas").glob("*.json")):
        snap = json.loads(path.read_text())
        assert snap["origin"] and snap["extracted"] and snap["version"], path.name


def test_the_check_refuses_what_the_engines_refuse():
    old = schema_check.snapshot("trtllm-1.2")
    eagle3 = {"speculative_config": {"decoding_type": "Eagle3", "speculative_model": "/d"}}
    assert schema_check.check_trtllm_yaml(eagle3, old) == [
        "decoding_type 'Eagle3' not in "
        "['MTP', 'Medusa', 'Eagle', 'Lookahead', 'NGram', 'DraftTarget', 'SaveState', "
        "'UserProvided', 'AUTO']",
        "unknown speculative_config key speculative_model",
    ]
    assert schema_check.check_trtllm_yaml({"cuda_graph_config": {"batch": 1}}, old) == [
        "unknown key cuda_graph_config.batch"
    ]
    sgl = schema_check.snapshot("sglang-0.5.23")
    argv = ["python3", "-m", "sglang.launch_server", "--cuda-graph-max-bs", "1"]
    assert schema_check.check_argv_engine(argv, sgl, "sglang") == [
        "unknown flag --cuda-graph-max-bs"
    ]
    argv = ["python3", "-m", "sglang.launch_server", "--speculative-algorithm", "REDRAFTER"]
    assert "not in" in schema_check.check_argv_engine(argv, sgl, "sglang")[0]
    vl = schema_check.snapshot("vllm-0.33.0")
    spec = json.dumps({"method": "redrafter", "speculative_model": "x"})
    assert schema_check.check_argv_engine(
        ["vllm", "serve", "m", "--speculative-config", spec], vl, "vllm"
    ) == [
        "unknown speculative-config key speculative_model",
        "speculative method 'redrafter' not accepted",
    ]


def test_a_changed_value_is_a_difference_from_the_source(monkeypatch):
    preset = PRESETS["llama3.3-70b-fp4-draft-target"]
    spec = preset.speculation.model_copy(update={"max_draft_len": 3})
    monkeypatch.setitem(PRESETS, preset.name, preset.model_copy(update={"speculation": spec}))
    assert schema_check.source_differences() == [
        "llama3.3-70b-fp4-draft-target: YAML differs from the source"
    ]


def _engine_python(engine: str) -> str:
    """The interpreter that has the engine's wheel (MATHAGENT_ENGINE_PYTHON), else skip."""
    python = os.environ.get("MATHAGENT_ENGINE_PYTHON")
    if not python:
        pytest.skip(
            "replay through the real parsers is opt-in: set MATHAGENT_ENGINE_PYTHON to an "
            f"interpreter with `pip install --no-deps {engine}` (see scripts/engine_parsers.py); "
            "the vLLM wheel is ~340 MB, too big to download in every CI run"
        )
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({engine!r}) is None)"
    found = subprocess.run([python, "-c", probe], capture_output=True)
    if found.returncode != 0:
        pytest.skip(f"{engine} is not installed for {python}")
    return python


@pytest.mark.parametrize(("engine", "module"), [("vllm", vllm), ("sglang", sglang)])
def test_command_lines_replay_through_the_real_parser(engine, module):
    python = _engine_python(engine)
    argvs = [
        step.argv
        for preset in PRESETS.values()
        if preset.build is None
        for plan in [module.plan(preset)]
        for step in [*plan.steps, plan.server]
    ]
    done = subprocess.run(
        [python, str(REPO / "scripts" / "engine_parsers.py"), "replay", engine],
        input=json.dumps(argvs), capture_output=True, text=True, timeout=600, cwd="/tmp",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    errors = json.loads(done.stdout.splitlines()[-1])
    assert dict(zip(map(" ".join, argvs), errors, strict=True)) == {
        " ".join(a): None for a in argvs
    }
