"""SGLang launcher: the presets as ``python -m sglang.launch_server`` flags.

SGLang spells EAGLE-3 ``EAGLE3``, a separate draft model ``STANDALONE`` and prompt lookup
``NGRAM``, each tuned by ``--speculative-num-steps``, ``--speculative-eagle-topk`` and
``--speculative-num-draft-tokens``. With top-k 1 the draft is a chain, so the verified tokens
per step are the steps plus one. ReDrafter has no SGLang equivalent.
"""

from __future__ import annotations

from mathagent.serving.launchers import spelling
from mathagent.serving.launchers.plan import LaunchPlan, Step, health_url
from mathagent.serving.launchers.presets import Method, ServePreset

ALGORITHMS = {Method.eagle3: "EAGLE3", Method.draft_target: "STANDALONE", Method.ngram: "NGRAM"}
FLAGS: dict[str, spelling.Spelling] = {
    "tp_size": "--tp-size",
    "max_batch_size": "--max-running-requests",
    "max_num_tokens": "--max-prefill-tokens",
    "mem_fraction_static": "--mem-fraction-static",
    "prefix_caching": {False: ["--disable-radix-cache"]},
    "chunked_prefill": {False: ["--chunked-prefill-size", "-1"]},
    # --cuda-graph-max-bs is gone (0.5.20); the decode graphs are the ones batch size bounds.
    "cuda_graph_max_batch_size": "--cuda-graph-max-bs-decode",
}
DIST_PORT = 5000


def speculative_args(preset: ServePreset) -> list[str]:
    """The ``--speculative-*`` flags, or none for plain decoding."""
    algorithm = spelling.method_name(preset, ALGORITHMS, "SGLang")
    spec = preset.speculation
    if algorithm is None or spec is None:
        return []
    args = ["--speculative-algorithm", algorithm]
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
    argv += [*spelling.limit_flags(preset, FLAGS), *speculative_args(preset)]
    if preset.cluster is not None and node_rank is not None:
        head = preset.cluster.hosts[0]
        argv += ["--nnodes", str(len(preset.cluster.hosts)), "--node-rank", str(node_rank)]
        argv += ["--dist-init-addr", f"{head}:{DIST_PORT}"]
    return [*argv, *spelling.bind_args(preset)]


def plan(preset: ServePreset) -> LaunchPlan:
    """The SGLang launch plan; a multi-node preset prints one command per node."""
    result = LaunchPlan("sglang", preset.name, health_url=health_url(preset.host, preset.port))
    result.notes += spelling.memory_note(preset, "SGLang")
    if preset.cluster is None:
        result.server = Step("serve", serve_argv(preset))
        return result
    env = spelling.socket_env(preset.cluster)
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
