"""Golden tests: each preset's YAML and command lines, for both TensorRT-LLM version families."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mathagent.serving.launchers import ngc, trtllm
from mathagent.serving.launchers.presets import PRESETS
from mathagent.serving.launchers.trtllm import Family

OUT = Path("/srv/mathagent-serve")
YAML_FILE = str(OUT / "extra-llm-api-config.yml")

GPT_OSS_YAML = """\
enable_attention_dp: false
disable_overlap_scheduler: false
enable_autotuner: false
cuda_graph_config:
  max_batch_size: 1
speculative_config:
  decoding_type: {eagle}
  max_draft_len: 5
  {model_key}: /opt/gpt-oss-120b-Eagle3/
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
  {model_key}: /opt/Llama-3.1-8B-Instruct-FP4/
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
  decoding_type: {eagle}
  max_draft_len: 3
  {model_key}: /opt/Qwen3-235B-A22B-Eagle3/
kv_cache_config:
  free_gpu_memory_fraction: 0.9
  enable_block_reuse: false
"""
SPELLING = {
    Family.v1_0: {"eagle": "Eagle", "model_key": "speculative_model_dir"},
    Family.v1_2: {"eagle": "Eagle3", "model_key": "speculative_model"},
}
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
    "qwen3-235b-eagle3-tp2": "mpirun -x CPATH -x TRITON_PTXAS_PATH -x HF_TOKEN "
    "trtllm-llmapi-launch trtllm-serve nvidia/Qwen3-235B-A22B-FP4 --backend pytorch --tp_size 2 "
    f"--max_num_tokens 1024 --extra_llm_api_options {YAML_FILE} --port 8355 --host 0.0.0.0",
    "openmath-14b-fp8-redrafter": f"trtllm-serve {OUT}/OpenMath-Nemotron-14B-kaggle-fp8-redrafter-engine "
    f"--backend tensorrt --tokenizer {OUT}/OpenMath-Nemotron-14B-kaggle --tp_size 2 "
    "--max_batch_size 12 --kv_cache_free_gpu_memory_fraction 0.92",
}


def _plan(name: str, family: Family, **kwargs):
    return trtllm.plan(PRESETS[name], family=family, out=OUT, **kwargs)


@pytest.mark.parametrize("family", list(Family))
@pytest.mark.parametrize("name", sorted(GOLDEN_YAML))
def test_yaml_text_and_dict_match_the_source(name, family):
    expected = GOLDEN_YAML[name].format(**SPELLING[family])
    text = trtllm.render_yaml(PRESETS[name], family)
    assert text == expected
    assert yaml.safe_load(text) == yaml.safe_load(expected)
    assert _plan(name, family).files[OUT / "extra-llm-api-config.yml"] == expected


@pytest.mark.parametrize("family", list(Family))
def test_yaml_dict_spelling_per_family(family):
    spec = trtllm.llm_api_options(PRESETS["gpt-oss-120b-eagle3"], family)["speculative_config"]
    if family is Family.v1_0:
        assert spec == {
            "decoding_type": "Eagle",
            "max_draft_len": 5,
            "speculative_model_dir": "/opt/gpt-oss-120b-Eagle3/",
        }
    else:
        assert spec == {
            "decoding_type": "Eagle3",
            "max_draft_len": 5,
            "speculative_model": "/opt/gpt-oss-120b-Eagle3/",
        }


@pytest.mark.parametrize("family", list(Family))
@pytest.mark.parametrize("name", sorted(SERVE))
def test_serve_command_matches_the_source(name, family):
    assert _plan(name, family).server.shell().endswith(SERVE[name])


def test_redrafter_preset_needs_no_yaml():
    assert trtllm.llm_api_options(PRESETS["openmath-14b-fp8-redrafter"], Family.v1_2) == {}
    assert (
        OUT / "extra-llm-api-config.yml"
        not in _plan("openmath-14b-fp8-redrafter", Family.v1_2).files
    )


def test_gpt_oss_fetches_draft_and_tiktoken_encodings():
    plan = _plan("gpt-oss-120b-eagle3", Family.v1_0)
    assert plan.server.env == {"TIKTOKEN_ENCODINGS_BASE": "/tmp/harmony-reqs"}
    assert [s.shell() for s in plan.steps] == [
        "hf download nvidia/gpt-oss-120b-Eagle3-long-context --local-dir /opt/gpt-oss-120b-Eagle3/",
        "wget -P /tmp/harmony-reqs https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
        "wget -P /tmp/harmony-reqs https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
    ]
    assert plan.steps[0].skip_if_exists == "/opt/gpt-oss-120b-Eagle3/"


def test_multi_node_env_hostfile_and_draft_download():
    plan = _plan("qwen3-235b-eagle3-tp2", Family.v1_2)
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
    plan = trtllm.plan(preset.model_copy(update={"cluster": cluster}), family=Family.v1_2, out=OUT)
    assert plan.files[OUT / "openmpi-hostfile"] == "10.0.0.1\n10.0.0.2\n"
    assert plan.server.env["NCCL_SOCKET_IFNAME"] == "ib0"
    assert plan.server.env["UCX_NET_DEVICES"] == "ib0"
    assert plan.server.env["OMPI_MCA_btl_tcp_if_include"] == "ib0"


def test_redrafter_fp8_build_pipeline():
    plan = _plan("openmath-14b-fp8-redrafter", Family.v1_0)
    ex = trtllm.DEFAULT_EXAMPLES
    base = f"{OUT}/OpenMath-Nemotron-14B-kaggle"
    assert [s.shell() for s in plan.steps] == [
        f"hf download nvidia/OpenMath-Nemotron-14B-kaggle --local-dir {base}",
        f"python3 {ex}/quantization/quantize.py --model_dir {base} --dtype bfloat16 --qformat fp8 "
        f"--kv_cache_dtype fp8 --output_dir {base}-fp8-ckpt --calib_dataset "
        f"{OUT}/calibrate_openmathreasoning --calib_size 4096 --tp_size 2",
        f"python3 {ex}/redrafter/convert_checkpoint.py --base_model_checkpoint_dir {base}-fp8-ckpt "
        f"--drafter_model_dir {OUT}/redrafter-OpenMath-Nemotron-14B-kaggle --output_dir "
        f"{base}-fp8-redrafter-ckpt --dtype bfloat16 --tp_size 2 --redrafter_num_beams 1 "
        "--redrafter_draft_len_per_beam 3",
        f"trtllm-build --checkpoint_dir {base}-fp8-redrafter-ckpt --output_dir "
        f"{base}-fp8-redrafter-engine --speculative_decoding_mode explicit_draft_tokens "
        "--gemm_plugin fp8 --use_paged_context_fmha enable --max_batch_size 32 --max_seq_len 32000 "
        "--max_input_len 32000 --max_num_tokens 32000 --max_beam_width 1 --kv_cache_type paged",
    ]
    assert plan.steps[-1].skip_if_exists == f"{base}-fp8-redrafter-engine/config.json"
    assert any("engine path" in note for note in plan.notes)


def test_docker_launcher_runs_the_script_in_the_ngc_image():
    plan = _plan("gpt-oss-120b-eagle3", Family.v1_2, launcher="docker")
    argv = plan.server.argv
    assert argv[:5] == ["docker", "run", "--rm", "--name", "mathagent-trtllm-8000"]
    assert argv[-3:] == [ngc.IMAGES["1.2"], "bash", f"{OUT}/launch.sh"]
    for flag in ("--gpus=all", "--ipc=host", "memlock=-1", "stack=67108864", f"{OUT}:{OUT}"):
        assert flag in argv
    assert plan.steps == []
    assert plan.cleanup == ["docker", "rm", "-f", "mathagent-trtllm-8000"]
    script = plan.files[OUT / "launch.sh"]
    assert "[ -e /opt/gpt-oss-120b-Eagle3/ ] || hf download" in script
    assert script.rstrip().endswith("exec " + SERVE["gpt-oss-120b-eagle3"])


def test_docker_multi_node_is_print_only():
    plan = _plan("qwen3-235b-eagle3-tp2", Family.v1_2, launcher="docker", image="my/trtllm:1.1.0")
    assert not plan.runnable
    assert (
        "-e" in plan.steps[0].argv
        and "NCCL_SOCKET_IFNAME=enp1s0f1np1,enP2p1s0f1np1" in plan.steps[0].argv
    )
    assert plan.server.argv[:2] == ["docker", "exec"]


@pytest.mark.parametrize(
    ("version", "family"),
    [
        ("1.0.0", Family.v1_0),
        ("1.1.0rc2", Family.v1_0),
        ("1.2.0rc6", Family.v1_2),
        ("2.0", Family.v1_2),
    ],
)
def test_family_of(version, family):
    assert trtllm.family_of(version) is family


@pytest.mark.parametrize("bad", ["0.21.0rc0", "latest", ""])
def test_family_of_rejects_old_or_garbage(bad):
    with pytest.raises(ValueError):
        trtllm.family_of(bad)


def test_resolve_family_precedence():
    assert (
        trtllm.resolve_family("1.1", "nvcr.io/nvidia/tensorrt-llm/release:1.2.0rc6")[0]
        is Family.v1_0
    )
    assert (
        trtllm.resolve_family(None, "nvcr.io/nvidia/tensorrt-llm/release:1.0.0rc3")[0]
        is Family.v1_0
    )
    # Nothing named and tensorrt_llm not installed here: the newest spelling.
    assert trtllm.installed_version() is None
    family, source = trtllm.resolve_family(None, None)
    assert family is Family.v1_2 and "not installed" in source
