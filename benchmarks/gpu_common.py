"""Shared pieces of the GPU benchmarks: shared random weights, ceilings, timing.

The weights are built once on the GPU as a transformers ``LlamaForCausalLM`` from a config (no
download); the engine is handed the same tensors, so both decode the same model.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from mathagent.serving.engine.random_model import RANDOM_SHAPES  # the model shapes, one list
from mathagent.serving.engine.sampling_params import SamplingParams

# HBM bandwidth of each card by its datasheet (the first name contained in the device's wins):
# a run's roofline is the card's it ran on. Issue 18 states its goals at the H200's.
CARD_HBM_BYTES_PER_S = {"H200": 4.8e12, "H100 NVL": 3.9e12, "H100 PCIe": 2.0e12, "H100": 3.35e12}
DATASHEET_HBM_BYTES_PER_S = CARD_HBM_BYTES_PER_S["H200"]
# The shape issue 18's FP8 goals are stated for: every FP8 benchmark and sweep measures it.
FP8_SHAPE = "llama-3-8b"


def card_bytes_per_s(name: str | None = None) -> float:
    """The datasheet HBM bandwidth of the card ``name`` (default: this process's GPU); the
    H200's for a card not listed."""
    name = name or torch.cuda.get_device_name()
    return next((bw for card, bw in CARD_HBM_BYTES_PER_S.items() if card in name),
                DATASHEET_HBM_BYTES_PER_S)  # fmt: skip


def build_hf_model(shape: str, seed: int = 0) -> torch.nn.Module:
    """A random-weight transformers Llama of a named shape, bf16, built directly on the GPU."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**RANDOM_SHAPES[shape])
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.eval()


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the distinct parameter tensors (a tied embedding counts once)."""
    seen = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}
    return sum(seen.values())


def roofline(model: torch.nn.Module, copy_bytes_per_s: float) -> dict:
    """Batch-1 decode ceiling: every weight byte is read once per token."""
    nbytes = weight_bytes(model)
    return {
        "weight_bytes": nbytes,
        "roofline_tok_s_datasheet": card_bytes_per_s() / nbytes,
        "roofline_tok_s_h200_datasheet": DATASHEET_HBM_BYTES_PER_S / nbytes,
        "roofline_tok_s_measured_copy": copy_bytes_per_s / nbytes,
    }


def copy_bandwidth(gib: int = 4, reps: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    src = torch.empty(gib << 30, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    ms = cuda_time_ms(lambda: dst.copy_(src), reps)
    return 2 * (gib << 30) / (ms / 1e3)


def cuda_time_ms(fn: Callable[[], object], reps: int) -> float:
    """Median milliseconds of ``fn`` over ``reps`` runs, timed with CUDA events."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def replay_ms(graph: torch.cuda.CUDAGraph, reps: int = 20) -> float:
    """Milliseconds per replay of a captured step (no host work around it)."""
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


@torch.inference_mode()
def hf_generate_tok_s(model: torch.nn.Module, prompt_len: int, new_tokens: int) -> float:
    """Batch-1 greedy decode tokens/s of transformers ``generate`` (prefill excluded)."""
    ids = torch.randint(0, model.config.vocab_size, (1, prompt_len), device="cuda")
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)

    def run(n: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    run(2)  # warm-up
    prefill = run(1)
    return (new_tokens - 1) / max(run(new_tokens) - prefill, 1e-9)


def steady_tok_s(engine: object, prompts: list[list[int]], max_tokens: int) -> dict:
    """Aggregate tokens/s of concurrent greedy requests through ``LLMEngine.step``.

    ``steady_tok_s`` counts only steps while all requests decode together (after the last
    prefill, before the first finish); ``wall_tok_s`` is the whole run, prefills included.
    """
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for p in prompts:
        engine.add_request(p, params)
    n, t_start = len(prompts), time.perf_counter()
    started, tokens, steady_tokens, steady_s = set(), 0, 0, 0.0
    while engine.has_unfinished():
        all_in = len(started) == n
        t0 = time.perf_counter()
        outs = engine.step()
        dt = time.perf_counter() - t0
        step_tokens = sum(len(o.delta_token_ids) for o in outs)
        if all_in and not any(o.finished for o in outs):
            steady_tokens, steady_s = steady_tokens + step_tokens, steady_s + dt
        tokens += step_tokens
        started.update(o.request_id for o in outs)
    wall = time.perf_counter() - t_start
    return {"requests": n, "tokens": tokens, "wall_tok_s": tokens / wall,
            "steady_tok_s": steady_tokens / max(steady_s, 1e-9), "steady_steps_s": steady_s}  # fmt: skip


def trace_events(prof: torch.profiler.profile) -> list[dict]:
    """The Chrome-trace events of a finished profiler run (written to a temporary file, which
    is the profiler's one export of per-kernel timestamps)."""
    import json
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        return json.loads(trace.read_text())["traceEvents"]


def load_fused_table(path: str) -> None:
    """Replace ``cuda/skinny.py``'s ``FUSED_CONFIGS`` with the table ``fused_rows_sweep.py
    --table-out`` wrote (``[]``: no layer takes the fused form)."""
    import json

    from mathagent.serving.engine.cuda import skinny

    with open(path) as f:
        entries = json.load(f)
    skinny.FUSED_CONFIGS.clear()
    for n, k, size, rows, block_n, block_k, warps, dot, *more in entries:
        glu = bool(more[0]) if more else False  # since run 63
        split = int(more[1]) if len(more) > 1 else 1  # since run 64
        skinny.FUSED_CONFIGS[n, k, size, rows] = skinny.SkinnyConfig(
            block_n, block_k, warps, dot, glu=glu, split=split
        )
