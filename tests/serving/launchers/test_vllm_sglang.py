"""The presets on vLLM and SGLang, and the clear refusal where a method has no equivalent."""

from __future__ import annotations

import json

import pytest

from mathagent.serving.launchers import sglang, vllm
from mathagent.serving.launchers.plan import NoEquivalent
from mathagent.serving.launchers.presets import PRESETS, ServePreset


def _spec_json(argv: list[str]) -> dict:
    return json.loads(argv[argv.index("--speculative-config") + 1])


def test_vllm_gpt_oss_eagle3():
    argv = vllm.plan(PRESETS["gpt-oss-120b-eagle3"]).server.argv
    assert argv == [
        "vllm", "serve", "openai/gpt-oss-120b", "--tensor-parallel-size", "1",
        "--max-num-seqs", "1", "--disable-prefix-caching",
        "--speculative-config",
        '{"method":"eagle3","num_speculative_tokens":5,"model":"nvidia/gpt-oss-120b-Eagle3-long-context"}',
        "--host", "127.0.0.1", "--port", "8000",
    ]  # fmt: skip


def test_vllm_draft_model_and_ngram():
    llama = vllm.plan(PRESETS["llama3.3-70b-fp4-draft-target"]).server.argv
    assert _spec_json(llama) == {
        "method": "draft_model",
        "num_speculative_tokens": 4,
        "model": "nvidia/Llama-3.1-8B-Instruct-FP4",
    }
    # TensorRT-LLM's KV-cache share is not vLLM's share of the whole GPU: left to vLLM.
    assert "--gpu-memory-utilization" not in llama
    plan = vllm.plan(PRESETS["llama3.3-70b-fp4-draft-target"])
    assert any("share of the whole GPU" in note for note in plan.notes)
    own = PRESETS["llama3.3-70b-fp4-draft-target"].model_copy(
        update={"gpu_memory_utilization": 0.8}
    )
    assert vllm.serve_argv(own)[vllm.serve_argv(own).index("--gpu-memory-utilization") + 1] == "0.8"
    ngram = ServePreset(
        name="n", summary="n", model="m",
        speculation={"method": "ngram", "max_draft_len": 4, "max_matching_ngram_size": 3},
    )  # fmt: skip
    assert _spec_json(vllm.serve_argv(ngram)) == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    }


def test_vllm_multi_node_uses_ray_and_the_interfaces():
    plan = vllm.plan(PRESETS["qwen3-235b-eagle3-tp2"])
    argv = plan.server.argv
    assert argv[argv.index("--distributed-executor-backend") + 1] == "ray"
    assert "--disable-chunked-prefill" in argv
    assert argv[-4:] == ["--host", "0.0.0.0", "--port", "8355"]
    assert plan.server.env["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1,enP2p1s0f1np1"
    assert any("ray start --head" in note for note in plan.notes)


def test_sglang_eagle3_and_standalone():
    argv = sglang.plan(PRESETS["gpt-oss-120b-eagle3"]).server.argv
    assert argv == [
        "python3", "-m", "sglang.launch_server", "--model-path", "openai/gpt-oss-120b",
        "--tp-size", "1", "--max-running-requests", "1",
        "--disable-radix-cache", "--cuda-graph-max-bs-decode", "1",
        "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", "nvidia/gpt-oss-120b-Eagle3-long-context",
        "--speculative-num-steps", "5", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "6", "--host", "127.0.0.1", "--port", "8000",
    ]  # fmt: skip
    llama = sglang.serve_argv(PRESETS["llama3.3-70b-fp4-draft-target"])
    assert llama[llama.index("--speculative-algorithm") + 1] == "STANDALONE"
    assert llama[llama.index("--speculative-num-steps") + 1] == "4"


def test_sglang_ngram():
    ngram = ServePreset(
        name="n", summary="n", model="m",
        speculation={"method": "ngram", "max_draft_len": 4, "max_matching_ngram_size": 3},
    )  # fmt: skip
    assert sglang.speculative_args(ngram) == [
        "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4",
    ]  # fmt: skip


def test_sglang_multi_node_prints_one_command_per_node():
    plan = sglang.plan(PRESETS["qwen3-235b-eagle3-tp2"])
    assert not plan.runnable
    ranks = [s.argv[s.argv.index("--node-rank") + 1] for s in [*plan.steps, plan.server]]
    assert ranks == ["1", "0"]
    assert "192.168.200.12:5000" in plan.server.argv


@pytest.mark.parametrize("module", [vllm, sglang])
def test_redrafter_has_no_equivalent(module):
    with pytest.raises(NoEquivalent, match="only on TensorRT-LLM's engine path"):
        module.plan(PRESETS["openmath-14b-fp8-redrafter"])


def test_user_draft_folder_is_passed_as_is():
    spec = PRESETS["gpt-oss-120b-eagle3"].speculation.model_copy(
        update={"draft_repo": None, "draft_dir": "/models/head"}
    )
    preset = PRESETS["gpt-oss-120b-eagle3"].model_copy(update={"speculation": spec})
    assert _spec_json(vllm.serve_argv(preset))["model"] == "/models/head"
