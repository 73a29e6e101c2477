"""The job's engine settings: the default model runs int4 on a CPU, and speculates with its
shipped EAGLE-3 head on a CPU and on CUDA by default; the user's own choice (flag or environment)
always wins."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from mathagent.cli import app
from mathagent.cli.common import with_overrides
from mathagent.config import EngineSettings, Settings
from mathagent.model_store import SHIPPED_DRAFTER, SHIPPED_EAGLE3
from mathagent.runtime import engine_settings_for
from mathagent.serving.engine.config import EngineConfig, default_draft

SHIPPED = f"eagle3:{SHIPPED_EAGLE3}"


def test_the_shipped_drafter_is_in_the_package():
    config = json.loads((SHIPPED_DRAFTER / "config.json").read_text())
    assert (SHIPPED_DRAFTER / "model.safetensors").is_file() and config


def test_default_model_on_a_cpu_speculates_with_its_shipped_eagle3_head(clean_env):
    # CPU int4, batch 1, 16 agent prompts x 128: 2.05x plain against ReDrafter's 1.68x
    # (benchmarks/spec_bench_cpu_int4_len3_run13_limit16_a.json)
    engine = engine_settings_for(Settings().engine, 1)
    cpu = engine_settings_for(EngineSettings(device="cpu"), 1)
    assert (cpu.speculative, cpu.quantization) == (SHIPPED, "int4")
    assert cpu.pack_weights  # speculation runs multi-row verify steps: packed weights pay

    if not torch.cuda.is_available():  # device auto resolves to the CPU here
        assert engine.speculative == SHIPPED


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_default_model_on_cuda_speculates_with_its_shipped_eagle3_head(device):
    # H200, bf16, batch 1: 2.60x plain, chains of 4 beside lookups of 11 (GPU_NOTES run 110); the
    # shipped ReDrafter ran at 0.20x there (run 15)
    engine = engine_settings_for(EngineSettings(device=device), 1)
    assert (engine.speculative, engine.quantization) == (SHIPPED, "none")
    cuda = torch.device("cuda")
    assert default_draft(engine, cuda, "eagle3") == (4, 1)  # chains: the one-graph step
    assert (SHIPPED_EAGLE3 / "config.json").is_file()
    assert (SHIPPED_EAGLE3 / "model.safetensors").is_file()
    mine = engine_settings_for(EngineSettings(device=device, draft_len=3, draft_beams=2), 1)
    assert default_draft(mine, cuda, "eagle3") == (3, 2)
    for chosen in ({"speculative": "none"}, {"quantization": "fp8"}):
        other = engine_settings_for(EngineSettings(device=device, **chosen), 1)
        assert other.speculative == "none"


def test_eagle3_on_cuda_drafts_chains_measured_fastest_unless_chosen(monkeypatch):
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    head = EngineSettings(speculative="eagle3:/heads/llama-3.1-8b")
    assert default_draft(head, cuda, "eagle3") == (4, 1)  # with the lookup branch, any dtype
    alone = EngineSettings(speculative="eagle3:/h", lookup_branch=False)
    assert default_draft(alone, cuda, "eagle3") == (5, 1)
    assert default_draft(head, cpu, "eagle3") == (3, 4)  # the CPU keeps the settings' default
    forced = EngineSettings(speculative="eagle3:/h", lookup_branch=True)
    assert EngineConfig.from_settings(forced).lookup_branch  # chosen: on wherever it runs
    assert not EngineConfig.from_settings(EngineSettings(device="cpu")).lookup_branch
    assert default_draft(EngineSettings(), cuda, "redrafter") == (3, 4)  # ReDrafter's tree
    monkeypatch.setenv("MATHAGENT_ENGINE__DRAFT_LEN", "2")  # chosen in the environment: wins
    monkeypatch.setenv("MATHAGENT_ENGINE__SPECULATIVE", "eagle3:/h")
    assert default_draft(Settings().engine, cuda, "eagle3") == (2, 1)


def test_other_models_keep_plain_decoding():
    engine = engine_settings_for(EngineSettings(device="cpu"), 1, model="/models/my-llama")
    assert engine.speculative == "none" and engine.quantization == "none"
    assert not engine.pack_weights


def test_a_chosen_dtype_or_quantization_keeps_the_drafter_but_not_int4():
    for chosen in ({"dtype": "float32"}, {"quantization": "none"}):
        engine = engine_settings_for(EngineSettings(device="cpu", **chosen), 1)
        assert (engine.quantization, engine.speculative) == ("none", SHIPPED)


def test_the_users_choice_wins(clean_env):
    for given in ("none", "ngram"):
        clean_env.setenv("MATHAGENT_ENGINE__SPECULATIVE", given)
        assert engine_settings_for(Settings().engine, 1).speculative == given
    clean_env.delenv("MATHAGENT_ENGINE__SPECULATIVE")
    flag = with_overrides(Settings(), engine={"speculative": "none"})
    assert engine_settings_for(flag.engine, 1).speculative == "none"


def test_overrides_leave_unset_fields_to_the_job(clean_env):
    # a flag for one engine field must not pin the others to their static defaults
    settings = with_overrides(Settings(), engine={"threads": 2})
    assert settings.engine.model_fields_set == {"threads"}
    engine = engine_settings_for(settings.engine.model_copy(update={"device": "cpu"}), 1)
    assert engine.speculative == SHIPPED and engine.threads == 2
    unchanged = with_overrides(Settings(), engine={"speculative": None})
    assert "speculative" not in unchanged.engine.model_fields_set


@pytest.mark.parametrize("command", [["solve", "p"], ["eval", "--dataset", "x", "--out", "/tmp/x"]])
def test_solve_and_eval_take_speculative(command):
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0 and "--speculative" in result.output
