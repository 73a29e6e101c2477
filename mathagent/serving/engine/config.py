"""Engine configuration: built once from the settings, validated, passed explicitly."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from mathagent.config import EngineSettings
from mathagent.serving.engine.spec_config import SpecMethodError, embedded_method

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class EngineConfigError(ValueError):
    """The engine settings cannot be honoured (bad device, dtype or method)."""


@dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs to start; validated once, passed explicitly."""

    model: str | None  # a folder, .gguf or random:SHAPE; None only with a loaded model given
    device: torch.device
    dtype: torch.dtype
    max_batch_size: int
    max_seq_len: int
    speculative: str
    draft_len: int
    draft_beams: int
    eager: bool
    threads: int | None
    quantization: str = "none"
    prefix_caching: bool = True
    pack_weights: bool = True
    prefill_chunk: int = 512
    adaptive_draft: bool = True
    tokenizer: str | None = None  # a tokenizer used instead of the model's own
    lookup_branch: bool = True  # EAGLE-3 chains verify a prompt-lookup chain beside them
    lookup_len: int = 0  # that chain's drafts (at least the chain's); 0: auto (lookup_depth)
    compiled_prefill: bool = False  # CUDA graphs on: compiled blocks for the steps they skip
    fp8_activation_scales: str = "auto"  # "calibrate": static input scales at load
    fp8_head: bool = False  # the vocabulary head in FP8 too

    @classmethod
    def from_settings(cls, settings: EngineSettings, model: str | None = None) -> EngineConfig:
        """Resolve 'auto' device/dtype and check the speculative method."""
        device, dtype = resolve_device_dtype(settings.device, settings.dtype)
        fp8_options = {
            "fp8_head": settings.fp8_head,
            "fp8_activation_scales calibrate": settings.fp8_activation_scales == "calibrate",
        }
        if any(fp8_options.values()) and settings.quantization != "fp8":
            named = " and ".join(name for name, on in fp8_options.items() if on)
            raise EngineConfigError(
                f"{named} set with quantization {settings.quantization!r}; they apply to "
                "quantization fp8 only"
            )
        if settings.quantization != "none":
            dtype = _quantized_dtype(settings, device)
        try:
            method = embedded_method(settings.speculative)
        except SpecMethodError as exc:
            raise EngineConfigError(str(exc)) from exc
        draft_len, draft_beams = default_draft(settings, device, method.kind)
        return cls(
            model=model,
            device=device,
            dtype=dtype,
            max_batch_size=settings.max_batch_size,
            max_seq_len=settings.max_seq_len,
            speculative=settings.speculative,
            draft_len=draft_len,
            draft_beams=draft_beams,
            eager=resolve_eager(settings.eager, device),
            threads=settings.threads,
            quantization=settings.quantization,
            prefix_caching=settings.prefix_caching,
            pack_weights=settings.pack_weights,
            adaptive_draft=settings.adaptive_draft,
            tokenizer=settings.tokenizer,
            lookup_branch=resolve_lookup_branch(settings.lookup_branch, device),
            lookup_len=0 if settings.lookup_len == "auto" else settings.lookup_len,
            compiled_prefill=settings.compiled_prefill,
            fp8_activation_scales=settings.fp8_activation_scales,
            fp8_head=settings.fp8_head,
        )


def resolve_eager(eager: bool | str, device: torch.device) -> bool:
    """'auto': CUDA graphs on CUDA (a batch-1 step is launch-bound without them, 10x slower),
    eager on a CPU. A CPU stays eager even when told otherwise, with a warning: compiled, the
    default model's int4 step took ~0.3-1 s a token against 10 ms eager, and the float32 one
    had not compiled after 4 minutes (2-core host, 2026-12-04)."""
    if eager == "auto":
        return device.type != "cuda"
    if not eager and device.type == "cpu":
        log.warning("MATHAGENT_ENGINE__EAGER=false is for CUDA; the CPU engine stays eager "
                    "(compiled, its steps ran 30-100x slower)")  # fmt: skip
        return True
    return bool(eager)


def resolve_lookup_branch(lookup: bool | str, device: torch.device) -> bool:
    """'auto': on CUDA, where a verify of ``1 + 2k`` nodes costs about what ``1 + k`` do (the
    default model, bf16: 1.52 against 1.31 ms, for 3.61 tokens a step against 2.66; GPU_NOTES
    run 48); off on a CPU, where the int4 products cost in proportion to the rows (CPU int4,
    8 agent prompts x 256: EAGLE-3 chains of 3 ran 114.2 tok/s with the branch, 135.4 without;
    benchmarks/engine_bench_cpu_lookup.json)."""
    if lookup == "auto":
        return device.type == "cuda"
    return bool(lookup)


def default_draft(settings: EngineSettings, device: torch.device, kind: str) -> tuple[int, int]:
    """Draft length and beams, the user's where chosen. EAGLE-3 on CUDA defaults to greedy
    chains with one beam: the shape whose whole step (draft, verify, accept) runs as one CUDA
    graph launched ahead. With the prompt-lookup branch beside each chain, filling the verify
    to 16 rows (``Eagle3Proposer.lookup_depth``), chains of 4 ran fastest on the H200 in both
    dtypes (the default model, bf16, 64 GSM8K agent prompts x 256: 2.600x plain against 2.409x
    for chains of 6 beside lookups of 6; float32 earlier: 4 against 6, 1.565x / 1.521x;
    benchmarks/GPU_NOTES.md runs 50, 110); without the branch, chains of 5 (1.82x, run 29). A
    tree of beams drafts and verifies on the host path."""
    chosen = settings.model_fields_set
    chains = kind == "eagle3" and device.type == "cuda"
    lookup = resolve_lookup_branch(settings.lookup_branch, device)
    length = (4 if lookup else 5) if chains and "draft_len" not in chosen else settings.draft_len
    beams = settings.draft_beams or (1 if chains else default_beams(device, settings.quantization))
    return length, beams


def default_beams(device: torch.device, quantization: str = "none") -> int:
    """ReDrafter beams when unset: a tree of 4 beams, whose 13 tokens a verify scores for
    about what 4 cost on CUDA, and on a CPU for ~1.2x as much with bf16 AMX or packed float32
    products, against a 2.3 -> 2.7 longer acceptance. The int4 CPU kernels cost in proportion
    to the rows, so there one argmax chain is faster (1.6x plain vs 1.1x with 4 beams)."""
    return 1 if device.type == "cpu" and quantization != "none" else 4


def _quantized_dtype(settings: EngineSettings, device: torch.device) -> torch.dtype:
    """Quantised weights run bfloat16 activations: int4 on a CPU (the fast kernels' input),
    fp8 on a Hopper GPU (row-wise scaled FP8 products write bfloat16)."""
    method = settings.quantization
    if method == "fp8":
        why = "the device is a CPU" if device.type != "cuda" else _fp8_unsupported()
        if why:
            raise EngineConfigError(
                f"quantization 'fp8' runs on CUDA GPUs of compute capability 9.0+ only ({why}); "
                "use quantization int4 on a CPU, or none"
            )
    elif device.type != "cpu":
        raise EngineConfigError(
            f"quantization {method!r} is for device cpu; on CUDA use none (bf16) or fp8"
        )
    if settings.dtype not in ("auto", "bfloat16"):
        raise EngineConfigError(
            f"quantization {method!r} runs bfloat16 activations; "
            f"set dtype auto or bfloat16, not {settings.dtype!r}"
        )
    return torch.bfloat16


def _fp8_unsupported() -> str | None:
    """Why this CUDA machine cannot run fp8 (asked only when fp8 is requested on CUDA)."""
    from mathagent.serving.engine.cuda import fp8

    return fp8.supported()


def resolve_device_dtype(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """'auto' means CUDA + bf16 when a GPU exists, else CPU + fp32."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise EngineConfigError(f"unknown device {device!r}: use auto, cpu or cuda[:N]") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise EngineConfigError("device 'cuda' requested but no CUDA device is available")
    if dev.type not in ("cpu", "cuda"):
        raise EngineConfigError(f"unsupported device {device!r}: use auto, cpu or cuda[:N]")
    if dtype == "auto":
        return dev, torch.bfloat16 if dev.type == "cuda" else torch.float32
    return dev, _DTYPES[dtype]
