"""How vLLM and SGLang spell a preset: one table per engine over the same preset limits.

Each engine names the same limits (tensor parallelism, batch size, token budget, GPU memory
fraction, prefix caching, chunked prefill, CUDA graph batch size) with its own flags. A table
maps each limit to a flag that takes the value, or to fixed arguments for one value (the off
switches); limits a table leaves out, or a preset leaves unset, give no flag.
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
        # TensorRT-LLM takes the fraction as a flag or in the YAML; these engines have one flag.
        "gpu_memory_fraction": kv.free_gpu_memory_fraction
        or preset.kv_cache_free_gpu_memory_fraction,
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


def bind_args(preset: ServePreset) -> list[str]:
    """``--host`` and ``--port``: loopback and 8000 unless the preset names its own."""
    return ["--host", preset.host or "127.0.0.1", "--port", str(preset.port or 8000)]


def socket_env(cluster: Cluster) -> dict[str, str]:
    """NCCL's and Gloo's traffic pinned to the cluster's network interfaces."""
    interfaces = ",".join(cluster.interfaces)
    return {"NCCL_SOCKET_IFNAME": interfaces, "GLOO_SOCKET_IFNAME": interfaces}
