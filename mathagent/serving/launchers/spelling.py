"""How vLLM and SGLang spell a preset: one table per engine over the same preset limits.

Each engine names the same limits (tensor parallelism, batch size, token budget, prefix
caching, chunked prefill, CUDA graph batch size) with its own flags. A table maps each limit to
a flag that takes the value, or to fixed arguments for one value (the off switches); limits a
table leaves out, or a preset leaves unset, give no flag.

GPU memory is not one limit. TensorRT-LLM's ``free_gpu_memory_fraction`` is the share of the
memory still free after the weights and buffers that goes to the KV cache; vLLM's
``--gpu-memory-utilization`` is the share of the whole GPU the instance may use (weights,
activations and KV cache); SGLang's ``--mem-fraction-static`` is the share of the whole GPU for
the weights and the KV-cache pool. One cannot be computed from another without the model's
size, so each engine gets only its own field of the preset (``gpu_memory_utilization``,
``mem_fraction_static``), and its default when that is unset.
"""

from __future__ import annotations

from mathagent.serving.launchers.plan import NoEquivalent
from mathagent.serving.launchers.presets import Cluster, Method, ServePreset

# A flag followed by the limit's value, or the arguments that particular values stand for.
Spelling = str | dict[object, list[str]]


def limits(preset: ServePreset) -> dict[str, object]:
    """The preset's limits in engine-neutral names, in the order flags are written."""
    kv, options = preset.kv_cache, preset.options
    return {
        "tp_size": preset.tp_size,
        "max_batch_size": preset.max_batch_size,
        "max_num_tokens": preset.max_num_tokens,
        "gpu_memory_utilization": preset.gpu_memory_utilization,
        "mem_fraction_static": preset.mem_fraction_static,
        "prefix_caching": kv.enable_block_reuse,
        "chunked_prefill": options.enable_chunked_prefill,
        "cuda_graph_max_batch_size": options.cuda_graph_max_batch_size,
    }


def limit_flags(preset: ServePreset, table: dict[str, Spelling]) -> list[str]:
    """The preset's limits as the flags ``table`` spells them."""
    argv: list[str] = []
    for name, value in limits(preset).items():
        spelling = table.get(name)
        if spelling is None or value is None:
            continue
        argv += [spelling, str(value)] if isinstance(spelling, str) else spelling.get(value, [])
    return argv


def method_name(preset: ServePreset, names: dict[Method, str], engine: str) -> str | None:
    """The engine's name for the preset's speculative method (``None``: plain decoding)."""
    spec = preset.speculation
    if spec is None:
        return None
    if spec.method not in names:
        raise NoEquivalent(
            f"{preset.name}: {engine} has no {spec.method} speculative decoding "
            "(ReDrafter exists only on TensorRT-LLM's engine path); use --engine trtllm"
        )
    return names[spec.method]


def memory_note(preset: ServePreset, engine: str) -> list[str]:
    """Why TensorRT-LLM's KV-cache share is not passed on (empty when the preset has none)."""
    fraction = preset.kv_cache.free_gpu_memory_fraction or preset.kv_cache_free_gpu_memory_fraction
    if fraction is None:
        return []
    return [
        f"the preset gives TensorRT-LLM {fraction} of the memory left after the weights for "
        f"the KV cache; {engine}'s memory flag means a share of the whole GPU, so it is left "
        "at the engine's default (see mathagent/serving/launchers/spelling.py)"
    ]


def bind_args(preset: ServePreset) -> list[str]:
    """``--host`` and ``--port``: loopback and 8000 unless the preset names its own."""
    return ["--host", preset.host or "127.0.0.1", "--port", str(preset.port or 8000)]


def socket_env(cluster: Cluster) -> dict[str, str]:
    """NCCL's and Gloo's traffic pinned to the cluster's network interfaces."""
    interfaces = ",".join(cluster.interfaces)
    return {"NCCL_SOCKET_IFNAME": interfaces, "GLOO_SOCKET_IFNAME": interfaces}
