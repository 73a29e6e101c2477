"""vLLM launcher: the presets as ``vllm serve`` with a ``--speculative-config`` JSON.

vLLM spells EAGLE-3 ``eagle3``, a separate draft model ``draft_model`` and prompt lookup
``ngram``. ReDrafter has no vLLM equivalent (it exists only on TensorRT-LLM's engine path).
vLLM downloads drafts by itself, so the draft is given as a Hugging Face id unless a local
folder was named.
"""

from __future__ import annotations

import json

from mathagent.serving.launchers import spelling
from mathagent.serving.launchers.plan import LaunchPlan, Step, health_url
from mathagent.serving.launchers.presets import Method, ServePreset

METHODS = {Method.eagle3: "eagle3", Method.draft_target: "draft_model", Method.ngram: "ngram"}
FLAGS: dict[str, spelling.Spelling] = {
    "tp_size": "--tensor-parallel-size",
    "max_batch_size": "--max-num-seqs",
    "max_num_tokens": "--max-num-batched-tokens",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "prefix_caching": {False: ["--disable-prefix-caching"]},
    "chunked_prefill": {False: ["--disable-chunked-prefill"]},
}


def speculative_config(preset: ServePreset) -> dict | None:
    """The ``--speculative-config`` mapping, or ``None`` for plain decoding."""
    method = spelling.method_name(preset, METHODS, "vLLM")
    spec = preset.speculation
    if method is None or spec is None:
        return None
    out: dict = {"method": method, "num_speculative_tokens": spec.max_draft_len}
    if spec.method is Method.ngram:
        out["prompt_lookup_max"] = spec.max_matching_ngram_size
        out["prompt_lookup_min"] = 1
    else:
        out["model"] = spec.hub_draft
    return out


def serve_argv(preset: ServePreset) -> list[str]:
    """``vllm serve MODEL ...`` carrying the preset's limits and speculation."""
    argv = ["vllm", "serve", preset.model, *spelling.limit_flags(preset, FLAGS)]
    if preset.cluster is not None:
        argv += ["--distributed-executor-backend", "ray"]
    config = speculative_config(preset)
    if config is not None:
        argv += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    return [*argv, *spelling.bind_args(preset)]


def plan(preset: ServePreset) -> LaunchPlan:
    """The vLLM launch plan (multi-node presets need a Ray cluster started first)."""
    env: dict[str, str] = {}
    result = LaunchPlan("vllm", preset.name, health_url=health_url(preset.host, preset.port))
    result.notes += spelling.memory_note(preset, "vLLM")
    if preset.cluster is not None:
        env = spelling.socket_env(preset.cluster)
        ifaces, head = env["NCCL_SOCKET_IFNAME"], preset.cluster.hosts[0]
        result.notes.append(
            f"start a Ray cluster first: `ray start --head --port 6379` on {head}, "
            f"`ray start --address {head}:6379` on the others, with {ifaces} in the same "
            "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME variables"
        )
    result.server = Step("serve", serve_argv(preset), env)
    return result
