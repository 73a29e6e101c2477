"""Golden tests: each preset's YAML and command lines as the source material writes them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mathagent.serving.launchers import releases, trtllm
from mathagent.serving.launchers.plan import NoEquivalent
from mathagent.serving.launchers.presets import PRESETS
from mathagent.serving.launchers.releases import RELEASES

OUT = Path("/srv/mathagent-serve")
YAML_FILE = str(OUT / "extra-llm-api-config.yml")

GPT_OSS_YAML = """\
enable_attention_dp: false
disable_overlap_scheduler: false
enable_autotuner: false
cuda_graph_config:
  max_batch_size: 1
speculative_config:
  decoding_type: Eagle
  max_draft_len: 5
  speculative_model_dir: /opt/gpt-oss-120b-Eagle3/
kv_cache_config:
  free_gpu_memory_fraction: 0.9
  enable_block_reuse: false
"""
LLAMA_YAML = """\
print_iter_log: false
disable_overlap_scheduler: true
speculative_config:
  decoding_type: DraftTarget
  max_draft_len: 4
  speculative_model_dir: /opt/Llama-3.1-8B-Instruct-FP4/
kv_cache_config:
  enable_block_reuse: false
"""
QWEN_YAML = """\
enable_attention_dp: false
disable_overlap_scheduler: false
enable_autotuner: false
enable_chunked_prefill: false
cuda_graph_config:
  max_batch_size: 1
speculative_config:
  decoding_type: Eagle
  max_draft_len: 3
  speculative_model_dir: /opt/Qwen3-235B-A22B-Eagle3/
kv_cache_config:
  free_gpu_memory_fraction: 0.9
  enable_block_reuse: false
"""
GOLDEN_YAML = {
    "gpt-oss-120b-eagle3": GPT_OSS_YAML,
    "llama3.3-70b-fp4-draft-target": LLAMA_YAML,
    "qwen3-235b-eagle3-tp2": QWEN_YAML,
}

SERVE = {
    "gpt-oss-120b-eagle3": "trtllm-serve openai/gpt-oss-120b --backend pytorch --tp_size 1 "
    f"--max_batch_size 1 --extra_llm_api_options {YAML_FILE}",
    "llama3.3-70b-fp4-draft-target": "trtllm-serve nvidia/Llama-3.3-70B-Instruct-FP4 "
    "--backend pytorch --tp_size 1 --max_batch_size 1 --kv_cache_free_gpu_memory_fraction 0.9 "
    f"--extra_llm_api_options {YAML_FILE}",
    "qwen3-235b-eagle3-tp2": "mpirun -x CPATH=/usr/local/cuda/include "
    "-x TRITON_PTXAS_PATH=/usr/local/cuda/bin/ptxas -x HF_TOKEN "
    "trtllm-llmapi-launch trtllm-serve nvidia/Qwen3-235B-A22B-FP4 --backend pytorch --tp_size 2 "
    f"--max_num_tokens 1024 --extra_llm_api_options {YAML_FILE} --port 8355 --host 0.0.0.0",
    "openmath-14b-fp8-redrafter": f"trtllm-serve serve {OUT}/OpenMath-Nemotron-14B-kaggle-fp8-redrafter-trtllm "
    f"--tokenizer {OUT}/OpenMath-Nemotron-14B-kaggle --backend trt --tp_size 2 "
    "--kv_cache_free_gpu_memory_fraction 0.92 --max_batch_size 12",
}


def _preset(name: str):
    preset = PRESETS[name]
    if preset.build is None:
        return preset
    build = preset.build.model_copy(update={"calib_dataset": "/data/omr-tir.jsonl"})
    return preset.model_copy(update={"build": build})


def _plan(name: str, line: str | None = None, **kwargs):
    release = RELEASES[line or PRESETS[name].trtllm_default]
    return trtllm.plan(_preset(name), release=release, out=OUT, **kwargs)


LINES = list(RELEASES)


@pytest.mark.parametrize("line", LINES)
@pytest.mark.parametrize("name", sorted(GOLDEN_YAML))
def test_yaml_text_and_dict_match_the_source(name, line):
    expected = GOLDEN_YAML[name]
    text = trtllm.render_yaml(PRESETS[name], RELEASES[line])
    assert text == expected
    assert yaml.safe_load(text) == yaml.safe_load(expected)
    assert _plan(name, line).files[OUT / "extra-llm-api-config.yml"] == expected


@pytest.mark.parametrize("line", LINES)
@pytest.mark.parametrize("name", sorted(SERVE))
def test_serve_command_matches_the_source(name, line):
    if PRESETS[name].trtllm_lines and line not in PRESETS[name].trtllm_lines:
        return  # refused at plan time (test_redrafter_is_pinned_to_the_engine_path_lines)
    assert _plan(name, line).server.shell().endswith(SERVE[name])


def test_redrafter_preset_needs_no_yaml():
    assert trtllm.llm_api_options(PRESETS["openmath-14b-fp8-redrafter"], RELEASES["1.1"]) == {}
    assert OUT / "extra-llm-api-config.yml" not in _plan("openmath-14b-fp8-redrafter").files


def test_gpt_oss_fetches_draft_and_tiktoken_encodings():
    plan = _plan("gpt-oss-120b-eagle3", "1.0")
    assert plan.server.env == {"TIKTOKEN_ENCODINGS_BASE": "/tmp/harmony-reqs"}
    assert [s.shell() for s in plan.steps] == [
        "hf download nvidia/gpt-oss-120b-Eagle3-long-context --local-dir /opt/gpt-oss-120b-Eagle3/",
        "wget -P /tmp/harmony-reqs https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "wget -P /tmp/harmony-reqs https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
    ]
    assert plan.steps[0].skip_if_exists == "/opt/gpt-oss-120b-Eagle3/"


def test_multi_node_env_hostfile_and_draft_download():
    plan = _plan("qwen3-235b-eagle3-tp2")
    ifaces = "enp1s0f1np1,enP2p1s0f1np1"
    assert plan.server.env == {
        "UCX_NET_DEVICES": ifaces,
        "NCCL_SOCKET_IFNAME": ifaces,
        "OMPI_MCA_btl_tcp_if_include": ifaces,
        "OMPI_MCA_orte_default_hostfile": str(OUT / "openmpi-hostfile"),
        "OMPI_MCA_rmaps_ppr_n_pernode": "1",
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "CPATH": "/usr/local/cuda/include",
        "TRITON_PTXAS_PATH": "/usr/local/cuda/bin/ptxas",
    }
    assert plan.files[OUT / "openmpi-hostfile"] == "192.168.200.12\n192.168.200.13\n"
    assert plan.steps[0].argv == [
        "mpirun", "-x", "HF_TOKEN", "-np", "2", "bash", "-c",
        "hf download nvidia/Qwen3-235B-A22B-Eagle3 --local-dir /opt/Qwen3-235B-A22B-Eagle3/",
    ]  # fmt: skip
    assert plan.health_url == "http://127.0.0.1:8355/health"


def test_multi_node_renders_from_a_node_list_and_interfaces():
    preset = PRESETS["qwen3-235b-eagle3-tp2"]
    cluster = preset.cluster.model_copy(
        update={"hosts": ["10.0.0.1", "10.0.0.2"], "interfaces": ["ib0"]}
    )
    plan = trtllm.plan(
        preset.model_copy(update={"cluster": cluster}), release=RELEASES["1.3"], out=OUT
    )
    assert plan.files[OUT / "openmpi-hostfile"] == "10.0.0.1\n10.0.0.2\n"
    assert plan.server.env["NCCL_SOCKET_IFNAME"] == "ib0"
    assert plan.server.env["UCX_NET_DEVICES"] == "ib0"
    assert plan.server.env["OMPI_MCA_btl_tcp_if_include"] == "ib0"


def test_redrafter_fp8_build_pipeline_is_the_recipes():
    plan = _plan("openmath-14b-fp8-redrafter")
    ex = trtllm.DEFAULT_EXAMPLES
    base = f"{OUT}/OpenMath-Nemotron-14B-kaggle"
    assert [s.shell() for s in plan.steps] == [
        f"hf download nvidia/OpenMath-Nemotron-14B-kaggle --local-dir {base}",
        f"python3 {OUT}/make_calibration_set.py --jsonl /data/omr-tir.jsonl --tokenizer {base} "
        f"--size 4096 --out {OUT}/calibration_dataset",
        f"python3 {ex}/quantization/quantize.py --model_dir {base} --dtype auto --qformat fp8 "
        f"--output_dir {base}-fp8-trtllm-tmp-ckpt --calib_size 4096 --calib_dataset "
        f"{OUT}/calibration_dataset --batch_size 4 --tp_size 2 --pp_size 1",
        f"python3 {ex}/redrafter/convert_checkpoint.py --base_model_checkpoint_dir "
        f"{base}-fp8-trtllm-tmp-ckpt --drafter_model_dir {OUT}/redrafter-OpenMath-Nemotron-14B-kaggle "
        f"--output_dir {base}-fp8-draft-ckpt --dtype bfloat16 --tp_size 2 --redrafter_num_beams 1 "
        "--redrafter_draft_len_per_beam 3",
        f"trtllm-build --checkpoint_dir {base}-fp8-draft-ckpt --output_dir "
        f"{base}-fp8-redrafter-trtllm --gemm_plugin fp8 --use_paged_context_fmha=enable "
        "--max_batch_size 32 --max_seq_len 32000 --max_input_len 32000 --max_num_tokens 32000 "
        "--speculative_decoding_mode explicit_draft_tokens --max_beam_width 1 --kv_cache_type paged",
    ]
    assert plan.steps[1].skip_if_exists == f"{OUT}/calibration_dataset/data.parquet"
    assert "apply_chat_template" in plan.files[OUT / "make_calibration_set.py"]
    assert plan.steps[-1].skip_if_exists == f"{base}-fp8-redrafter-trtllm/config.json"
    assert any("1.0, 1.1, 1.2" in note for note in plan.notes)


def test_calibration_folder_is_used_as_is():
    preset = PRESETS["openmath-14b-fp8-redrafter"]
    build = preset.build.model_copy(update={"calib_dataset": "/data/calibration_dataset"})
    plan = trtllm.plan(preset.model_copy(update={"build": build}), release=RELEASES["1.2"], out=OUT)
    assert "--calib_dataset /data/calibration_dataset" in plan.steps[1].shell()
    assert OUT / "make_calibration_set.py" not in plan.files


def test_docker_launcher_runs_the_script_in_the_ngc_image():
    plan = _plan("gpt-oss-120b-eagle3", launcher="docker")
    argv = plan.server.argv
    assert argv[:5] == ["docker", "run", "--rm", "--name", "mathagent-trtllm-8000"]
    assert argv[-3:] == [RELEASES["1.3"].image, "bash", f"{OUT}/launch.sh"]
    assert RELEASES["1.3"].image == "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12"
    for flag in ("--gpus=all", "--ipc=host", "memlock=-1", "stack=67108864", f"{OUT}:{OUT}"):
        assert flag in argv
    assert plan.steps == []
    assert plan.cleanup == ["docker", "rm", "-f", "mathagent-trtllm-8000"]
    script = plan.files[OUT / "launch.sh"]
    assert "[ -e /opt/gpt-oss-120b-Eagle3/ ] || hf download" in script
    assert script.rstrip().endswith("exec " + SERVE["gpt-oss-120b-eagle3"])


def test_docker_multi_node_is_print_only():
    plan = _plan("qwen3-235b-eagle3-tp2", "1.1", launcher="docker", image="my/trtllm:1.1.0")
    assert not plan.runnable
    assert (
        "-e" in plan.steps[0].argv
        and "NCCL_SOCKET_IFNAME=enp1s0f1np1,enP2p1s0f1np1" in plan.steps[0].argv
    )
    assert plan.server.argv[:2] == ["docker", "exec"]


@pytest.mark.parametrize(
    ("version", "line"),
    [("1.0.0", "1.0"), ("1.1.0rc2", "1.1"), ("1.2.0rc6", "1.2"), ("v1.3.0rc12", "1.3")],
)
def test_line_of(version, line):
    assert releases.line_of(version) == line


@pytest.mark.parametrize("bad", ["0.21.0rc0", "latest", "", "2.0"])
def test_line_of_refuses_lines_without_a_schema(bad):
    with pytest.raises(ValueError):
        releases.line_of(bad)


def test_resolve_precedence_and_defaults():
    gpt = PRESETS["gpt-oss-120b-eagle3"]
    assert releases.resolve(gpt, "1.1")[0].line == "1.1"
    assert releases.resolve(gpt, None, "nvcr.io/nvidia/tensorrt-llm/release:1.0.0")[0].line == "1.0"
    # Nothing named and tensorrt_llm not installed here: the source material's line.
    assert releases.installed_version() is None
    release, source = releases.resolve(gpt, None, None)
    assert (release.line, release.image) == ("1.3", "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12")
    assert "default" in source
    assert releases.resolve(PRESETS["openmath-14b-fp8-redrafter"], None)[0].tag == "1.1.0rc0"


def test_image_and_version_of_different_lines_are_refused():
    with pytest.raises(ValueError, match="name one line"):
        releases.resolve(
            PRESETS["gpt-oss-120b-eagle3"], "1.0", "nvcr.io/nvidia/tensorrt-llm/release:1.3.0rc12"
        )


@pytest.mark.parametrize("line", ["1.3"])
def test_redrafter_is_pinned_to_the_engine_path_lines(line):
    with pytest.raises(NoEquivalent, match="--preset openmath-14b-ngram"):
        releases.resolve(PRESETS["openmath-14b-fp8-redrafter"], line)
    assert releases.resolve(PRESETS["openmath-14b-ngram"], line)[0].line == line
