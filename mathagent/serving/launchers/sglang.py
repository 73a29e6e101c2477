"""SGLang launcher: the presets as ``python -m sglang.launch_server`` flags.

SGLang spells EAGLE-3 ``EAGLE3``, a separate draft model ``STANDALONE`` and prompt lookup
``NGRAM``, each tuned by ``--speculative-num-steps``, ``--speculative-eagle-topk`` and
``--speculative-num-draft-tokens``. With top-k 1 the draft is a chain, so the verified tokens
per step are the steps plus one. ReDrafter has no SGLang equivalent.
"""

from __future__ import annotations

from mathagent.serving.launchers.plan import LaunchPlan, NoEquivalent, Step, health_url
from mathagent.serving.launchers.presets import Method, ServePreset

ALGORITHMS = {Method.eagle3: "EAGLE3", Method.draft_target: "STANDALONE", Method.ngram: "NGRAM"}
DIST_PORT = 5000


def speculative_args(preset: ServePreset) -> list[str]:
    """The ``--speculative-*`` flags, or none for plain decoding."""
    spec = preset.speculation
    if spec is None:
        return []
    if spec.method not in ALGORITHMS:
        raise NoEquivalent(
            f"{preset.name}: SGLang has no {spec.method} speculative decoding "
            "(ReDrafter exists only on TensorRT-LLM's engine path); use --engine trtllm"
        )
    args = ["--speculative-algorithm", ALGORITHMS[spec.method]]
    if spec.method is Method.ngram:
        return [*args, "--speculative-num-draft-tokens", str(spec.max_draft_len)]
    return [
        *args,
        "--speculative-draft-model-path", str(spec.hub_draft),
        "--speculative-num-steps", str(spec.max_draft_len),
        "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", str(spec.max_draft_len + 1),
    ]  # fmt: skip


def serve_argv(preset: ServePreset, node_rank: int | None = None) -> list[str]:
    """``python -m sglang.launch_server ...``; ``node_rank`` for one node of a multi-node run."""
    argv = ["python3", "-m", "sglang.launch_server", "--model-path", preset.model]
    argv += ["--tp-size", str(preset.tp_size)]
    if preset.max_batch_size is not None:
        argv += ["--max-running-requests", str(preset.max_batch_size)]
    if preset.max_num_tokens is not None:
        argv += ["--max-prefill-tokens", str(preset.max_num_tokens)]
    fraction = preset.kv_cache.free_gpu_memory_fraction or preset.kv_cache_free_gpu_memory_fraction
    if fraction is not None:
        argv += ["--mem-fraction-static", str(fraction)]
    if preset.kv_cache.enable_block_reuse is False:
        argv.append("--disable-radix-cache")
    if preset.options.enable_chunked_prefill is False:
        argv += ["--chunked-prefill-size", "-1"]
    if preset.options.cuda_graph_max_batch_size is not None:
        argv += ["--cuda-graph-max-bs", str(preset.options.cuda_graph_max_batch_size)]
    argv += speculative_args(preset)
    if preset.cluster is not None and node_rank is not None:
        head = preset.cluster.hosts[0]
        argv += ["--nnodes", str(len(preset.cluster.hosts)), "--node-rank", str(node_rank)]
        argv += ["--dist-init-addr", f"{head}:{DIST_PORT}"]
    argv += ["--host", preset.host or "127.0.0.1", "--port", str(preset.port or 8000)]
    return argv


def plan(preset: ServePreset) -> LaunchPlan:
    """The SGLang launch plan; a multi-node preset prints one command per node."""
    result = LaunchPlan("sglang", preset.name, health_url=health_url(preset.host, preset.port))
    if preset.cluster is None:
        result.server = Step("serve", serve_argv(preset))
        return result
    ifaces = ",".join(preset.cluster.interfaces)
    env = {"NCCL_SOCKET_IFNAME": ifaces, "GLOO_SOCKET_IFNAME": ifaces}
    hosts = preset.cluster.hosts
    result.steps = [
        Step(f"on {host}: serve (node rank {rank})", serve_argv(preset, rank), env)
        for rank, host in enumerate(hosts[1:], 1)
    ]
    result.server = Step(f"on {hosts[0]}: serve (node rank 0)", serve_argv(preset, 0), env)
    result.notes.append(
        "multi-node SGLang is print-only here: run each node's command on that node"
    )
    result.runnable = False
    return result
