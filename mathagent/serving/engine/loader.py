"""Model loading: Hugging Face folders, GGUF files (converted once and cached), random shapes.

A model spec is one of: a folder holding ``config.json``, ``*.safetensors`` and a tokenizer, a
``.gguf`` file, or ``random:<shape>[:stable]`` (:mod:`~mathagent.serving.engine.random_model`).
The default model is the caller's to resolve (the model store fetches its GGUF), so loading
never downloads anything.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from mathagent.serving.engine import fp8_calibration, fp8_checkpoint, random_model
from mathagent.serving.engine.model import (
    SUPPORTED_ARCHITECTURES,
    ModelArgs,
    Transformer,
)
from mathagent.serving.engine.quant import quantize_fp8_head, quantize_model
from mathagent.serving.engine.random_model import RANDOM_SHAPES

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


class ModelLoadError(ValueError):
    """The model spec names nothing this engine can load."""


@dataclass
class LoadedModel:
    """A ready model plus what the engine needs around it."""

    model: Transformer
    tokenizer: Any | None  # a transformers tokenizer; None: prompts must be token ids
    name: str  # the served model name
    path: Path | None  # the Hugging Face folder the weights came from
    eos_token_ids: tuple[int, ...]


def _supported() -> str:
    return (
        "supported models: a Hugging Face folder (config.json + *.safetensors + tokenizer), a .gguf file, or "
        f"random:<{'|'.join(RANDOM_SHAPES)}>[:stable]; supported architectures: {', '.join(SUPPORTED_ARCHITECTURES)}"
    )


def load_model(
    spec: str,
    model_dir: Path,
    device: torch.device,
    dtype: torch.dtype,
    quantization: str = "none",
    fp8_activation_scales: str = "auto",
    fp8_head: bool = False,
) -> LoadedModel:
    """Load the model named by ``spec`` onto ``device`` in ``dtype``, quantised if asked.

    Quantisation starts from float32 weights, so a model dequantised from a GGUF gets its
    original 4-bit codes back (see :mod:`mathagent.serving.engine.quant`). An FP8 checkpoint
    (:mod:`~mathagent.serving.engine.fp8_checkpoint`) loads its own codes, with ``fp8`` only.
    ``fp8_activation_scales`` "calibrate": weights quantised here to fp8 get one static input
    scale per product from a calibration forward (:mod:`.fp8_calibration`); "auto": per token.
    ``fp8_head``: the vocabulary head in FP8 too (:func:`quant.quantize_fp8_head`).
    """
    if fp8_head and quantization != "fp8":
        raise ModelLoadError("fp8_head needs quantization fp8")
    if fp8_activation_scales not in ("auto", "calibrate"):
        raise ModelLoadError(f"fp8_activation_scales {fp8_activation_scales!r}: auto or calibrate")
    if fp8_activation_scales == "calibrate" and quantization != "fp8":
        raise ModelLoadError("fp8_activation_scales 'calibrate' needs quantization fp8")
    load_dtype = torch.float32 if quantization != "none" else dtype
    scheme = None
    if spec.startswith("random:"):
        loaded = _load_random(spec.removeprefix("random:"), device, load_dtype)
    else:
        folder, name = resolve_folder(spec, model_dir)
        scheme = fp8_checkpoint.read_scheme(
            folder, json.loads((folder / "config.json").read_text())
        )
        if scheme is not None and quantization != "fp8":
            raise ModelLoadError(
                f"{folder} is an FP8 checkpoint ({scheme.producer}, per-{scheme.weight_strategy} "
                f"weight scales); load it with quantization fp8, not {quantization!r}"
            )
        if scheme is not None and fp8_activation_scales == "calibrate":
            raise ModelLoadError(
                f"{folder} is an FP8 checkpoint: its activation scales are its own (static "
                "input scales where it has them); fp8_activation_scales 'calibrate' is for "
                "weights quantised at load"
            )
        loaded = load_hf_folder(folder, device, dtype if scheme else load_dtype, name, scheme)
    if scheme is None and quantization != "none":  # an FP8 checkpoint holds its own codes
        loaded.model = quantize_model(loaded.model, quantization).to(dtype)
    if fp8_head:
        quantize_fp8_head(loaded.model)
    if fp8_activation_scales == "calibrate":
        fp8_calibration.calibrate(loaded.model, loaded.tokenizer, dtype)
    return loaded


def resolve_folder(spec: str, model_dir: Path) -> tuple[Path, str]:
    """The Hugging Face folder for ``spec`` (converting a GGUF on first use) and a model name."""
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path, path.name
    if path.is_file() and path.suffix == ".gguf":
        return convert_gguf(path, model_dir), gguf_model_name(path)
    raise ModelLoadError(f"cannot load model {spec!r}; {_supported()}")


def gguf_model_name(path: Path) -> str:
    """``Foo-1B.Q4_K_M.gguf`` -> ``Foo-1B`` (the quantisation suffix is not the model's name)."""
    return re.sub(r"\.(Q\d\w*|F16|F32|BF16|IQ\w+)$", "", path.stem, flags=re.IGNORECASE)


def convert_gguf(gguf: Path, model_dir: Path) -> Path:
    """Dequantise ``gguf`` once into ``model_dir/<stem>/`` (safetensors, config, tokenizer).

    The folder appears by atomic rename, so a killed or concurrent conversion never leaves a
    half-written model behind.
    """
    target = model_dir / gguf.stem
    if (target / "config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{gguf.stem}.", dir=model_dir))
    try:
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        hf = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
        _save_dequantized(hf, tmp)
        tok.save_pretrained(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _save_dequantized(hf: Any, folder: Path) -> None:
    """Write a GGUF-loaded transformers model as a plain float32 HF folder.

    transformers refuses ``save_pretrained`` on GGUF-quantised models, though the loaded
    weights are already dequantised; so the tensors and config are written directly.
    """
    from safetensors.torch import save_file

    cfg = hf.config.to_dict()
    cfg.pop("quantization_config", None)  # the saved weights are plain float32
    cfg["architectures"] = [type(hf).__name__]
    state = {k: v.detach().contiguous() for k, v in hf.state_dict().items()}
    if cfg.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
    hf.generation_config.save_pretrained(folder)


def _hf_to_engine(name: str) -> tuple[str, int] | None:
    """Map an HF tensor name to (engine name, part index within a fused tensor)."""
    fixed = {"model.embed_tokens.weight": "tok_embeddings.weight",
             "model.norm.weight": "norm.weight", "lm_head.weight": "output.weight"}  # fmt: skip
    if name in fixed:
        return fixed[name], 0
    m = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias|weight_scale|input_scale)", name)
    if m is None:
        return None
    i, mod, kind = m.groups()
    parts = {"input_layernorm": ("attention_norm", 0), "post_attention_layernorm": ("ffn_norm", 0),
             "self_attn.q_proj": ("attention.wqkv", 0), "self_attn.k_proj": ("attention.wqkv", 1),
             "self_attn.v_proj": ("attention.wqkv", 2), "self_attn.o_proj": ("attention.wo", 0),
             "self_attn.q_norm": ("attention.q_norm", 0),
             "self_attn.k_norm": ("attention.k_norm", 0), "mlp.gate_proj": ("feed_forward.w13", 0),
             "mlp.up_proj": ("feed_forward.w13", 1), "mlp.down_proj": ("feed_forward.w2", 0)}  # fmt: skip
    if mod not in parts:
        return None
    target, part = parts[mod]
    return f"layers.{i}.{target}.{kind}", part


# Engine tensors fused from several HF tensors: q/k/v projections, gate/up projections.
_FUSED_PARTS = {"wqkv": 3, "w13": 2}


def _read_state_dict(folder: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Read every safetensors shard, fusing q/k/v and gate/up into the engine's tensors."""
    pieces: dict[str, dict[int, torch.Tensor]] = {}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{folder} holds no *.safetensors weights; {_supported()}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                mapped = _hf_to_engine(key)
                if mapped is None:
                    continue
                name, part = mapped
                parts = pieces.setdefault(name, {})
                parts[part] = _as_loaded(name, f.get_tensor(key), dtype)
                # Fuse as soon as a tensor is whole, so its parts never outlive it (load peak).
                if len(parts) == _FUSED_PARTS.get(name.split(".")[-2], 1):
                    state[name] = _fuse(folder, name, [parts[i] for i in sorted(parts)])
                    del pieces[name]
    if pieces:
        raise ModelLoadError(f"{folder}: incomplete fused weights {sorted(pieces)[:5]}")
    return state


def _fuse(folder: Path, name: str, parts: list[torch.Tensor]) -> torch.Tensor:
    """One engine tensor from its HF parts, which must share one storage (FP8 or not)."""
    if len({part.dtype for part in parts}) > 1:
        dtypes = ", ".join(str(part.dtype).removeprefix("torch.") for part in parts)
        raise fp8_checkpoint.Fp8CheckpointError(
            f"{folder}: the parts of {name} (q/k/v or gate/up, fused into one product) are "
            f"stored as {dtypes}; quantise all of them or none (vLLM refuses such a checkpoint too)"
        )
    return torch.cat(parts, dim=0)


def _as_loaded(name: str, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A checkpoint tensor as the engine holds it: FP8 codes as they are, their scales as 1-D
    float32 (so the parts of a fused tensor concatenate), everything else in ``dtype``."""
    if name.endswith("_scale"):
        return tensor.float().reshape(-1)
    if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        return tensor
    return tensor.to(dtype)


def load_hf_folder(
    folder: Path,
    device: torch.device,
    dtype: torch.dtype,
    name: str | None = None,
    fp8: fp8_checkpoint.Fp8Scheme | None = None,
) -> LoadedModel:
    """Load a Hugging Face folder (config.json, safetensors, tokenizer); ``fp8``: the folder's
    FP8 scheme, whose quantised linears become :class:`~mathagent.serving.engine.quant.Fp8Linear`."""
    from transformers import AutoTokenizer

    cfg = json.loads((folder / "config.json").read_text())
    args = ModelArgs.from_hf_config(cfg)
    with torch.device("meta"):
        model = Transformer(args)
    state = _read_state_dict(folder, dtype)
    fp8_checkpoint.install_fp8_linears(model, state, fp8, folder)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if args.tie_word_embeddings:
        model.output.weight = model.tok_embeddings.weight
        missing = [k for k in missing if k != "output.weight"]
    if missing or unexpected:
        raise ModelLoadError(
            f"{folder}: missing weights {missing[:5]}, unexpected {unexpected[:5]}"
        )
    model = model.to(device).eval()
    tokenizer = None
    if any((folder / f).is_file() for f in TOKENIZER_FILES):
        tokenizer = AutoTokenizer.from_pretrained(folder)
    eos = set(args.eos_token_ids)
    gen_cfg = folder / "generation_config.json"
    if gen_cfg.is_file():
        extra = json.loads(gen_cfg.read_text()).get("eos_token_id")
        eos.update(extra if isinstance(extra, list) else [] if extra is None else [extra])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    return LoadedModel(model, tokenizer, name or folder.name, folder, tuple(sorted(eos)))


def _load_random(spec: str, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    try:
        model = random_model.build(spec, device, dtype)
    except random_model.RandomShapeError as exc:
        raise ModelLoadError(f"{exc}; {_supported()}") from exc
    return LoadedModel(model, None, f"random:{spec}", None, ())
