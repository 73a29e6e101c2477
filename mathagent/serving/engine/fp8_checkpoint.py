"""FP8 checkpoints as published: the ModelOpt and compressed-tensors layouts of ``*-FP8`` models.

Both store each quantised linear as ``<name>.weight`` (e4m3 codes, ``[N, K]``),
``<name>.weight_scale`` (float32: one value per tensor, or ``[N, 1]`` per output channel) and,
with static activation scales, ``<name>.input_scale`` (one float32). The format is named by
``hf_quant_config.json`` (ModelOpt: ``quantization.quant_algo`` "FP8" = per-tensor weights +
static input scale, "FP8_PER_CHANNEL_PER_TOKEN") or by ``config.json``'s
``quantization_config`` (``quant_method`` "modelopt" with the same fields, or
"compressed-tensors": ``config_groups.*.weights`` 8-bit float, strategy "tensor" or "channel").
Field names follow vLLM's ``modelopt.py`` and ``compressed_tensors`` loaders.

The codes load as they are (no round trip through bfloat16): a per-tensor scale becomes the
same value on each of the tensor's rows, which is exact. Fused q/k/v and gate/up tensors
concatenate their parts' rows and scales. Activations follow the checkpoint: with static
scales (ModelOpt "FP8", compressed-tensors ``input_activations.dynamic: false``) every row of a
product's input is quantised with its ``input_scale`` (a fused product takes its parts' largest,
as vLLM does); otherwise per token on the fly (:mod:`~mathagent.serving.engine.fp8_format`).
The KV cache stays in the model dtype, as vLLM's
``kv_cache_dtype="auto"`` keeps it: ``kv_cache_quant_algo`` and ``k_scale`` / ``v_scale`` are
not read. Checked against checkpoints the producers wrote themselves (ModelOpt 0.47.0,
llm-compressor 0.14.0.1: ``tests/serving/engine/fixtures/fp8``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mathagent.serving.engine.fp8_format import FP8_DTYPE
from mathagent.serving.engine.model import ModelArgs, Transformer
from mathagent.serving.engine.quant import Fp8Linear

_MODELOPT_ALGOS = {"FP8": "tensor", "FP8_PER_CHANNEL_PER_TOKEN": "channel"}


class Fp8CheckpointError(ValueError):
    """The folder's quantisation is not an FP8 layout this engine loads, or does not match."""


@dataclass(frozen=True)
class Fp8Scheme:
    """What a checkpoint says about its FP8 tensors."""

    producer: str  # "modelopt" or "compressed-tensors"
    weight_strategy: str  # "tensor" or "channel"
    ignored: tuple[str, ...]  # modules left unquantised (e.g. lm_head)
    static_inputs: bool = False  # activations quantised with each product's input_scale


def read_scheme(folder: Path, config: dict[str, Any]) -> Fp8Scheme | None:
    """The folder's FP8 scheme; None for an unquantised checkpoint; refuses other formats."""
    hf_quant = folder / "hf_quant_config.json"
    if hf_quant.is_file():
        return _modelopt(json.loads(hf_quant.read_text()), hf_quant.name)
    qc = config.get("quantization_config")
    if qc is None:
        return None
    method = qc.get("quant_method")
    if method == "modelopt":
        return _modelopt(qc, "config.json quantization_config")
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    raise Fp8CheckpointError(
        f"{folder}: quantization_config quant_method {method!r} is not loaded here; FP8 "
        "checkpoints in the modelopt or compressed-tensors layout are"
    )


def _modelopt(doc: dict[str, Any], where: str) -> Fp8Scheme:
    quant = doc.get("quantization", doc)
    algo = quant.get("quant_algo")
    if algo not in _MODELOPT_ALGOS:
        raise Fp8CheckpointError(
            f"{where}: ModelOpt quant_algo {algo!r} is not supported; use one of "
            f"{sorted(_MODELOPT_ALGOS)}"
        )
    ignored = tuple(quant.get("exclude_modules") or quant.get("ignore") or ())
    # "FP8" calibrates one input scale per product; FP8_PER_CHANNEL_PER_TOKEN scales per token
    return Fp8Scheme("modelopt", _MODELOPT_ALGOS[algo], ignored, static_inputs=algo == "FP8")


def _compressed_tensors(qc: dict[str, Any]) -> Fp8Scheme:
    where = "compressed-tensors quantization_config"
    if qc.get("format") != "float-quantized":
        raise Fp8CheckpointError(f"{where}: format {qc.get('format')!r}, not 'float-quantized'")
    strategies, dynamic = set(), set()
    for name, group in (qc.get("config_groups") or {}).items():
        weights = group.get("weights") or {}
        if (weights.get("type"), weights.get("num_bits")) != ("float", 8):
            raise Fp8CheckpointError(f"{where}: group {name!r} weights are not 8-bit float")
        if weights.get("strategy") not in ("tensor", "channel") or not weights.get(
            "symmetric", True
        ):
            raise Fp8CheckpointError(
                f"{where}: group {name!r} weight strategy {weights.get('strategy')!r}; "
                "supported: symmetric 'tensor' or 'channel'"
            )
        acts = group.get("input_activations")
        if acts is not None and (acts.get("type"), acts.get("num_bits")) != ("float", 8):
            raise Fp8CheckpointError(f"{where}: group {name!r} activations are not 8-bit float")
        strategies.add(weights["strategy"])
        # no input_activations (weights only): the engine's W8A8 with per-token scales
        dynamic.add(True if acts is None else bool(acts.get("dynamic", False)))
    if len(strategies) != 1 or len(dynamic) != 1:
        raise Fp8CheckpointError(
            f"{where}: needs one weight strategy and one activation scheme, found "
            f"{sorted(strategies)} and dynamic {sorted(dynamic)}"
        )
    return Fp8Scheme("compressed-tensors", strategies.pop(), tuple(qc.get("ignore") or ()),
                     static_inputs=not dynamic.pop())  # fmt: skip


def _part_rows(args: ModelArgs, name: str) -> list[int]:
    """Rows of each HF tensor fused into engine tensor ``name`` (q/k/v, gate/up, or one)."""
    if name.endswith("wqkv"):
        kv = args.num_kv_heads * args.head_dim
        return [args.num_heads * args.head_dim, kv, kv]
    if name.endswith("w13"):
        return [args.intermediate_size] * 2
    return []


def install_fp8_linears(
    model: Transformer, state: dict[str, torch.Tensor], scheme: Fp8Scheme | None, where: Path
) -> int:
    """Swap each linear of ``model`` whose weight in ``state`` is e4m3 for an :class:`Fp8Linear`
    holding those codes; ``state`` keeps them with one scale per row (for ``load_state_dict``)
    and loses the input scales. Returns how many were swapped. With no scheme (an unquantised
    checkpoint) FP8 tensors are refused: their scales' meaning is undeclared."""
    if scheme is None:
        fp8 = [k for k, v in state.items() if v.dtype in (FP8_DTYPE, torch.float8_e5m2)]
        if fp8:
            raise Fp8CheckpointError(
                f"{where}: {fp8[0]} is FP8 but neither hf_quant_config.json nor config.json's "
                "quantization_config declares the checkpoint's quantization"
            )
        return 0
    swapped = 0
    for key in [k for k, v in state.items() if v.dtype == torch.float8_e5m2]:
        raise Fp8CheckpointError(f"{where}: {key} is float8_e5m2; only e4m3 weights load")
    for key in [k for k, v in state.items() if v.dtype == FP8_DTYPE]:
        module = key.removesuffix(".weight")
        if not module.startswith("layers."):
            raise Fp8CheckpointError(
                f"{where}: {key} is FP8 but only the blocks' linears may be (head and "
                "embedding stay in the model dtype)"
            )
        weight = state[key]
        scale = _row_scales(model.args, module, state.get(f"{module}.weight_scale"),
                            weight.shape[0], scheme, where)  # fmt: skip
        state[f"{module}.weight_scale"] = scale
        input_scale = _input_scale(state.pop(f"{module}.input_scale", None), module, scheme,
                                   where)  # fmt: skip
        if input_scale is not None:
            state[f"{module}.input_scale"] = input_scale
        parent_name, _, child = module.rpartition(".")
        bias = state.get(f"{module}.bias")
        setattr(model.get_submodule(parent_name), child,
                Fp8Linear(weight, scale, bias, input_scale))  # fmt: skip
        swapped += 1
    left = [k for k in state if k.endswith("_scale")
            and getattr(state.get(k.rsplit(".", 1)[0] + ".weight"), "dtype", None) != FP8_DTYPE]  # fmt: skip
    if left:
        raise Fp8CheckpointError(f"{where}: scales without FP8 weights: {left[:3]}")
    if not swapped:
        raise Fp8CheckpointError(
            f"{where}: declares {scheme.producer} FP8 but holds no e4m3 weight"
        )
    return swapped


def _input_scale(
    scale: torch.Tensor | None, module: str, scheme: Fp8Scheme, where: Path
) -> torch.Tensor | None:
    """The static activation scale ``[1]`` of ``module`` (its fused parts' largest, as vLLM
    takes it), or None where activations scale per token (a dynamic scheme's stray scale is
    checked and dropped)."""
    if scale is not None and not bool((scale > 0).all() & scale.isfinite().all()):
        raise Fp8CheckpointError(f"{where}: {module}.input_scale is not finite and positive")
    if not scheme.static_inputs:
        return None
    if scale is None:
        raise Fp8CheckpointError(
            f"{where}: {scheme.producer} declares static activation scales but "
            f"{module} has no input_scale"
        )
    return scale.float().max().reshape(1)


def _row_scales(
    args: ModelArgs, module: str, scale: torch.Tensor | None, rows: int, scheme: Fp8Scheme,
    where: Path,
) -> torch.Tensor:  # fmt: skip
    """The float32 scale of each of ``rows`` output rows, from the checkpoint's scales."""
    if scale is None:
        raise Fp8CheckpointError(f"{where}: {module}.weight has no weight_scale")
    scale = scale.float().reshape(-1)
    parts = _part_rows(args, module) or [rows]
    if scheme.weight_strategy == "tensor" and scale.numel() == len(parts):
        scale = scale.repeat_interleave(torch.tensor(parts))
    elif scheme.weight_strategy != "channel" or scale.numel() != rows:
        raise Fp8CheckpointError(
            f"{where}: {module}.weight_scale has {scale.numel()} values; a "
            f"{scheme.weight_strategy} scale for {rows} rows in {len(parts)} part(s) needs "
            f"{len(parts) if scheme.weight_strategy == 'tensor' else rows}"
        )
    if not bool((scale > 0).all() & scale.isfinite().all()):
        raise Fp8CheckpointError(f"{where}: {module}.weight_scale is not finite and positive")
    return scale
