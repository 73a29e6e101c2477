"""vLLM launcher: the presets as ``vllm serve`` with a ``--speculative-config`` JSON.

vLLM spells EAGLE-3 ``eagle3``, a separate draft model ``draft_model`` and prompt lookup
``ngram``. ReDrafter has no vLLM equivalent (it exists only on TensorRT-LLM's engine path).
vLLM downloads drafts by itself, so the draft is given as a Hugging Face id unless a local
folder was named.
"""

from __future__ import annotations

import json

from mathagent.serving.launchers.plan import LaunchPlan, NoEquivalent, Step, health_url
from mathagent.serving.launchers.presets import Method, ServePreset

METHODS = {Method.eagle3: "eagle3", Method.draft_target: "draft_model", Method.ngram: "ngram"}


def speculative_config(preset: ServePreset) -> dict | None:
    """The ``--speculative-config`` mapping, or ``None`` for plain decoding."""
    spec = preset.speculation
    if spec is None:
        return None
    if spec.method not in METHODS:
        raise NoEquivalent(
            f"{preset.name}: vLLM has no {spec.method} speculative decoding "
            "(ReDrafter exists only on TensorRT-LLM's engine path); use --engine trtllm"
        )
    out: dict = {"method": METHODS[spec.method], "num_speculative_tokens": spec.max_draft_len}
    if spec.method is Method.ngram:
        out["prompt_lookup_max"] = spec.max_matching_ngram_size
        out["prompt_lookup_min"] = 1
    else:
        out["model"] = spec.hub_draft
    return out


def serve_argv(preset: ServePreset) -> list[str]:
    """``vllm serve MODEL ...`` carrying the preset's limits and speculation."""
    argv = ["vllm", "serve", preset.model, "--tensor-parallel-size", str(preset.tp_size)]
    if preset.max_batch_size is not None:
        argv += ["--max-num-seqs", str(preset.max_batch_size)]
    if preset.max_num_tokens is not None:
        argv += ["--max-num-batched-tokens", str(preset.max_num_tokens)]
    fraction = preset.kv_cache.free_gpu_memory_fraction or preset.kv_cache_free_gpu_memory_fraction
    if fraction is not None:
        argv += ["--gpu-memory-utilization", str(fraction)]
    if preset.kv_cache.enable_block_reuse is False:
        argv.append("--no-enable-prefix-caching")
    if preset.options.enable_chunked_prefill is False:
        argv.append("--no-enable-chunked-prefill")
    if preset.cluster is not None:
        argv += ["--distributed-executor-backend", "ray"]
    config = speculative_config(preset)
    if config is not None:
        argv += ["--speculative-config", json.dumps(config, separators=(",", ":"))]
    argv += ["--host", preset.host or "127.0.0.1", "--port", str(preset.port or 8000)]
    return argv


def plan(preset: ServePreset) -> LaunchPlan:
    """The vLLM launch plan (multi-node presets need a Ray cluster started first)."""
    env: dict[str, str] = {}
    result = LaunchPlan("vllm", preset.name, health_url=health_url(preset.host, preset.port))
    if preset.cluster is not None:
        ifaces = ",".join(preset.cluster.interfaces)
        env = {"NCCL_SOCKET_IFNAME": ifaces, "GLOO_SOCKET_IFNAME": ifaces}
        head = preset.cluster.hosts[0]
        result.notes.append(
            f"start a Ray cluster first: `ray start --head --port 6379` on {head}, "
            f"`ray start --address {head}:6379` on the others, with {ifaces} in the same "
            "NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME variables"
        )
    result.server = Step("serve", serve_argv(preset), env)
    return result
