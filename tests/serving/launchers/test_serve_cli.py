"""`mathagent serve` for external engines, in real subprocesses with no engine installed."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mathagent.serving.launchers import trtllm
from mathagent.serving.launchers.presets import PRESETS
from mathagent.serving.launchers.releases import RELEASES

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def bare_env(tmp_path) -> dict[str, str]:
    """PATH without any engine binary, no GPU, and a tensorrt_llm that explodes on import."""
    poison = tmp_path / "poison" / "tensorrt_llm"
    poison.mkdir(parents=True)
    (poison / "__init__.py").write_text(
        "raise ImportError('dry-run must not import tensorrt_llm')\n"
    )
    path = os.pathsep.join(
        d for d in ("/usr/bin", "/bin") if shutil.which("trtllm-serve", path=d) is None
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATHAGENT_")}
    env.update(
        PATH=path,
        CUDA_VISIBLE_DEVICES="",
        PYTHONPATH=os.pathsep.join([str(REPO), str(tmp_path / "poison")]),
        MATHAGENT_CACHE_DIR=str(tmp_path / "cache"),
    )
    for binary in ("trtllm-serve", "trtllm-build", "mpirun", "vllm"):
        assert shutil.which(binary, path=path) is None
    return env


def _serve(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mathagent", "serve", *args],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("line", [None, "1.0", "1.2", "1.3"])
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_dry_run_needs_no_gpu_and_no_tensorrt_llm(bare_env, tmp_path, preset, line):
    out = tmp_path / "cfg"
    args = ["--engine", "trtllm", "--preset", preset, "--calib-dataset", "/data/omr.jsonl"]
    args += ["--trtllm-version", line] if line else []
    done = _serve(bare_env, *args, "--dry-run", "--out", str(out))
    lines = PRESETS[preset].trtllm_lines
    if line and lines and line not in lines:  # refused at plan time, with the alternative
        assert done.returncode == 1 and "--preset openmath-14b-ngram" in done.stderr
        assert not out.exists() and "Traceback" not in done.stderr
        return
    assert done.returncode == 0, done.stderr
    assert f"# config folder: {out}" in done.stdout
    release = RELEASES[line or PRESETS[preset].trtllm_default]
    assert f"image {release.image}" in done.stdout
    data = PRESETS[preset].model_dump()
    if data["build"]:
        data["build"]["calib_dataset"] = "/data/omr.jsonl"
    expected_preset = type(PRESETS[preset]).model_validate(data)
    expected = trtllm.llm_api_options(expected_preset, release)
    if expected:
        written = yaml.safe_load((out / "extra-llm-api-config.yml").read_text())
        assert written == expected
    plan = trtllm.plan(expected_preset, release=release, out=out)
    for step in [*plan.steps, plan.server]:  # every command line, exactly
        assert shlex.join(step.argv) in done.stdout.splitlines()
    assert (out / "launch.sh").read_text() == plan.files[out / "launch.sh"]


def test_dry_run_default_is_the_source_material(bare_env, tmp_path):
    done = _serve(bare_env, "--engine", "trtllm", "--preset", "gpt-oss-120b-eagle3", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "TensorRT-LLM 1.3 (the preset's default line)" in done.stdout
    folder = Path(done.stdout.split("# config folder: ")[1].splitlines()[0])
    assert folder.is_relative_to(tmp_path / "cache")
    text = (folder / "extra-llm-api-config.yml").read_text()
    assert "decoding_type: Eagle\n" in text and "speculative_model_dir:" in text


def test_impossible_combinations_are_refused_before_anything_runs(bare_env, tmp_path):
    out = tmp_path / "never"
    for args, message in (
        (["--trtllm-version", "1.0", "--launcher", "docker", "--image",
          "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12"], "name one line"),
        (["--trtllm-version", "1.9"], "no schema here"),
    ):  # fmt: skip
        done = _serve(bare_env, "--engine", "trtllm", "--preset", "gpt-oss-120b-eagle3",
                      "--dry-run", "--out", str(out), *args)  # fmt: skip
        assert done.returncode == 1 and message in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert not out.exists()


def test_dry_run_vllm_and_sglang(bare_env, tmp_path):
    for engine, marker in (("vllm", "--speculative-config"), ("sglang", "EAGLE3")):
        done = _serve(bare_env, "--engine", engine, "--preset", "gpt-oss-120b-eagle3", "--dry-run",
                      "--out", str(tmp_path / engine))  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert marker in done.stdout


def test_no_equivalent_is_one_clear_error(bare_env):
    done = _serve(
        bare_env, "--engine", "sglang", "--preset", "openmath-14b-fp8-redrafter", "--dry-run",
        "--calib-dataset", "/c",
    )  # fmt: skip
    assert done.returncode == 1
    assert "SGLang has no redrafter" in done.stderr
    assert "Traceback" not in done.stderr


def test_unknown_preset_lists_the_known_ones(bare_env):
    done = _serve(bare_env, "--engine", "trtllm", "--preset", "nope", "--dry-run")
    assert done.returncode == 1
    assert "known presets: gpt-oss-120b-eagle3" in done.stderr


def test_running_without_trtllm_serve_fails_fast_and_clearly(bare_env, tmp_path):
    done = _serve(bare_env, "--engine", "trtllm", "--preset", "llama3.3-70b-fp4-draft-target",
                  "--out", str(tmp_path / "run"))  # fmt: skip
    assert done.returncode == 1
    assert "trtllm-serve not found on PATH" in done.stderr
    assert "--launcher docker" in done.stderr
    assert "Traceback" not in done.stderr


def test_overrides_reach_the_yaml_and_command(bare_env, tmp_path):
    out = tmp_path / "o"
    done = _serve(
        bare_env, "--engine", "trtllm", "--preset", "qwen3-235b-eagle3-tp2", "--dry-run",
        "--out", str(out), "--nodes", "10.1.0.1,10.1.0.2", "--interfaces", "ib0,ib1",
        "--max-draft-len", "2", "--tp-size", "4", "--iter-stats", "--port", "9001",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load((out / "extra-llm-api-config.yml").read_text())
    assert config["speculative_config"]["max_draft_len"] == 2
    assert config["enable_iter_perf_stats"] is True
    assert (out / "openmpi-hostfile").read_text() == "10.1.0.1\n10.1.0.2\n"
    assert "export NCCL_SOCKET_IFNAME=ib0,ib1" in done.stdout
    assert "--tp_size 4" in done.stdout and "--port 9001" in done.stdout
