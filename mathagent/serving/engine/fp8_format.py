"""The FP8 model's arithmetic, in plain torch: e4m3 codes, per-row scales, the reference product.

Weights: e4m3 codes with one float32 scale per output row, ``scale = max|w_row| / 448``.
Activations: the same rule per row (token), applied on the fly ("dynamic"), or one static scale
per product for every row (a checkpoint's calibrated ``input_scale``, as vLLM and TensorRT-LLM
apply it: codes ``x * (1 / scale)``, clamped, the reciprocal formed once). A product accumulates
codes times codes in float32 and multiplies by both scales. The CUDA kernels
(:mod:`mathagent.serving.engine.cuda.fp8`) follow these roundings exactly (a correctly rounded
reciprocal per row, then products, round to nearest even into e4m3); :func:`reference_linear` is their oracle.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3 value
FP8_MIN_SCALE = 1.0 / (448.0 * 512.0)  # floor of a scale, so an all-zero row stays finite


def row_scales(amax: torch.Tensor) -> torch.Tensor:
    """Float32 scales from float32 row maxima (the kernels' ``_row_scale``)."""
    return (amax.float() * (1.0 / FP8_MAX)).clamp(min=FP8_MIN_SCALE)


def quantize_rows(
    x: torch.Tensor, input_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3 codes ``[..., K]`` and float32 scales ``[..., 1]``, one scale per row of ``x``: its
    own, or the static ``input_scale`` (``[1]`` float32) on every row."""
    xf = x.float()
    if input_scale is None:
        scale = row_scales(xf.abs().amax(dim=-1, keepdim=True))
    else:
        scale = input_scale.float().reshape(1).expand(*xf.shape[:-1], 1).contiguous()
    # one reciprocal per row, then a product per value: what the kernels can afford per element
    codes = (xf * scale.reciprocal()).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return codes, scale


def scaled_product(
    codes: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:  # fmt: skip
    """``torch._scaled_mm`` of row codes ``[M, K]`` / scales ``[M, 1]`` with the weight: ``[M, N]``
    (the FP8 tensor cores on CUDA)."""
    return torch._scaled_mm(
        codes, weight.t(), scale_a=scale, scale_b=weight_scale.view(1, -1), out_dtype=dtype
    )


def scaled_linear(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
    input_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """``x @ W.T`` in torch ops: :func:`quantize_rows`, then :func:`scaled_product`. Compiled,
    Inductor fuses the quantisation into the op before it."""
    codes, scale = quantize_rows(x.reshape(-1, x.shape[-1]), input_scale)
    out = scaled_product(codes, scale, weight, weight_scale, x.dtype)
    return out.view(*x.shape[:-1], weight.shape[0])


def reference_linear(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
    input_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """The FP8 model's ``x @ W.T`` in float32 ops (CPU reference), returned in ``x.dtype``."""
    codes, scale = quantize_rows(x, input_scale)
    acc = codes.float() @ weight.float().t()
    return (acc * scale * weight_scale.float()).to(x.dtype)
