"""Quantised linears: int4 blocks (group 32) + an int8 head on CPU, FP8 (e4m3) on CUDA.

``fp8`` (:class:`Fp8Linear`, Hopper GPUs) holds each block linear as e4m3 codes with one scale
per output row and quantises activations per token, or with one static scale per product: a
checkpoint's, or :mod:`~mathagent.serving.engine.fp8_calibration`'s
(:mod:`~mathagent.serving.engine.fp8_format` is the arithmetic). The head stays in the model
dtype, as published FP8 checkpoints keep it, unless :func:`quantize_fp8_head` is asked for.
The rest of this note is about the CPU path.

Decode at batch 1 on a CPU is bound by reading the weights once per token, so fewer weight
bytes is the speed-up. ``int4`` keeps each linear as 4-bit codes with a scale and a minimum per
block of 32 inputs, the llama.cpp Q4_1 recipe: min/max per block, 15 steps between them. A
model dequantised from a Q4_1 GGUF (the default model) has exactly 16 levels per block with the
block's min and max among them, so quantising it again recovers the GGUF's own codes; only the
scales round to bfloat16, as torch's int4 kernel wants them. The vocabulary head stays at
8 bits per weight (one scale per row): it is the most sensitive matrix and the default
model's GGUF holds it as Q8_0. Activations are bfloat16: torch's packed int4/int8 CPU kernels
are fast only for bf16 inputs.
"""

from __future__ import annotations

import torch
from torch import nn

from mathagent.serving.engine import fp8_format

QUANTIZATIONS = ("none", "int4", "fp8")
GROUP_SIZE = 32


class QuantizationError(ValueError):
    """The model or device cannot run with the requested weight quantisation."""


class Int4Linear(nn.Module):
    """``y = x W^T + b`` with ``W`` as packed 4-bit codes, group-wise scale and zero."""

    def __init__(self, linear: nn.Linear, group_size: int = GROUP_SIZE) -> None:
        super().__init__()
        weight = linear.weight.detach().float()
        out_features, in_features = weight.shape
        if in_features % group_size:
            raise QuantizationError(
                f"int4 needs input features divisible by {group_size}, got {in_features}"
            )
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        codes, scales, zeros = quantize_int4(weight, group_size)
        self.register_buffer(
            "packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1), persistent=False
        )
        # torch's kernel dequantises (code - 8) * scale + zero: shift the block minimum to match
        zero_point = zeros + 8 * scales
        scale_zero = torch.stack([scales, zero_point], dim=-1)  # [N, K/g, 2]
        self.register_buffer(
            "scale_zero", scale_zero.transpose(0, 1).contiguous().bfloat16(), persistent=False
        )
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach().bfloat16(), False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.reshape(-1, self.in_features).to(torch.bfloat16),
            self.packed,
            self.group_size,
            self.scale_zero,
        )
        if self.bias is not None:
            out = out + self.bias
        return out.view(*shape[:-1], self.out_features)


class Int8Linear(nn.Module):
    """``y = x W^T`` with ``W`` as int8 codes and one bfloat16 scale per output row."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        weight = weight.detach().float()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        scales = weight.abs().amax(dim=1).clamp(min=1e-12) / 127
        codes = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
        self.register_buffer("codes", codes, persistent=False)
        self.register_buffer("scales", scales.bfloat16(), persistent=False)

    def rows(self, index: torch.Tensor) -> Int8Linear:
        """A head over the output rows ``index`` only (a draft vocabulary), same codes."""
        sub = Int8Linear.__new__(Int8Linear)
        nn.Module.__init__(sub)
        sub.in_features, sub.out_features = self.in_features, int(index.numel())
        index = index.to(self.codes.device)
        sub.register_buffer("codes", self.codes[index].contiguous(), persistent=False)
        sub.register_buffer("scales", self.scales[index].contiguous(), persistent=False)
        return sub

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = torch.ops.aten._weight_int8pack_mm(
            x.reshape(-1, self.in_features).to(torch.bfloat16), self.codes, self.scales
        )
        return out.view(*shape[:-1], self.out_features)


class Fp8Linear(nn.Module):
    """``y = x W^T + b`` of the FP8 model: ``weight`` e4m3 ``[N, K]``, ``weight_scale`` ``[N]``;
    ``input_scale`` ``[1]``: a static activation scale (a checkpoint's, for every row), else
    None: each row's own scale on the fly.

    On CUDA the product runs on the FP8 tensor cores (:func:`cuda.fp8.linear`); elsewhere the
    float32 reference (for tests: the engine refuses fp8 off Hopper GPUs). ``module.to(dtype)``
    moves but never casts the codes and scales.
    """

    def __init__(
        self, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None = None,
        input_scale: torch.Tensor | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        if weight.dtype != fp8_format.FP8_DTYPE or weight_scale.shape != weight.shape[:1]:
            raise QuantizationError(
                f"fp8 linear needs e4m3 weights [N, K] and float32 scales [N]; got "
                f"{weight.dtype} {tuple(weight.shape)} and {tuple(weight_scale.shape)}"
            )
        if input_scale is not None and input_scale.numel() != 1:
            raise QuantizationError(
                f"fp8 linear needs one static input scale; got {tuple(input_scale.shape)}"
            )
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight.contiguous())
        self.register_buffer("weight_scale", weight_scale.float().contiguous())
        self.register_buffer(
            "input_scale", None if input_scale is None else input_scale.float().reshape(1)
        )
        self.bias = None if bias is None else nn.Parameter(bias.detach(), False)

    @classmethod
    def quantize(cls, linear: nn.Linear) -> Fp8Linear:
        """Per-output-row e4m3 quantisation of a float linear (the fp8_format rule)."""
        codes, scale = fp8_format.quantize_rows(linear.weight.detach())
        return cls(codes, scale.squeeze(-1), linear.bias)

    def dequantized(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """The weight ``[N, K]`` the codes stand for (codes times their row's scale)."""
        return (self.weight.float() * self.weight_scale[:, None]).to(dtype)

    def _apply(self, fn, recurse=True):
        for name in ("weight", "weight_scale", "input_scale"):
            buf = self._buffers[name]
            if buf is None:
                continue
            moved = fn(buf)
            self._buffers[name] = moved if moved.dtype == buf.dtype else buf.to(moved.device)
        if self.bias is not None:
            self.bias = nn.Parameter(fn(self.bias.data), False)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cuda:
            out = fp8_format.reference_linear(x, self.weight, self.weight_scale, self.input_scale)
        else:
            from mathagent.serving.engine.cuda import fp8 as cuda_fp8

            if torch.compiler.is_compiling() and x.numel() > cuda_fp8.MAX_ROWS * x.shape[-1]:
                # compiled blocks (MATHAGENT_ENGINE__COMPILED_PREFILL), rows that take
                # _scaled_mm anyway: quantise in torch ops, which Inductor fuses into the norm
                # before, not one opaque kernel per product. The CUDA graphs' regions call
                # cuda.fp8.linear themselves, so their rounding does not move.
                out = fp8_format.scaled_linear(x, self.weight, self.weight_scale, self.input_scale)
            else:
                out = cuda_fp8.linear(x, self.weight, self.weight_scale, self.input_scale)
        return out if self.bias is None else out + self.bias


def quantize_int4(
    weight: torch.Tensor, group_size: int = GROUP_SIZE
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes ``[N, K]`` int32 in 0..15, scales and minimums ``[N, K/g]`` float32 (Q4_1 rule)."""
    n, k = weight.shape
    blocks = weight.float().reshape(n, k // group_size, group_size)
    low, high = blocks.amin(dim=-1), blocks.amax(dim=-1)
    scales = (high - low) / 15
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round((blocks - low[..., None]) / safe[..., None]).clamp(0, 15)
    return codes.reshape(n, k).to(torch.int32), scales, low


def quantize_model(model: nn.Module, method: str) -> nn.Module:
    """Swap the transformer's linears for quantised ones in place (``method`` in QUANTIZATIONS).

    Every linear inside the blocks becomes :class:`Int4Linear`; the vocabulary head becomes
    :class:`Int8Linear` (built from the embedding when the two are tied, which stays a plain
    bfloat16 table for lookups). Norms and embeddings move to bfloat16. ``fp8``: see
    :func:`quantize_fp8`.
    """
    if method == "none":
        return model
    if method not in QUANTIZATIONS:
        raise QuantizationError(f"unknown quantization {method!r}; use one of {QUANTIZATIONS}")
    if method == "fp8":
        return quantize_fp8(model)
    if next(model.parameters()).device.type != "cpu":
        raise QuantizationError(
            "int4 weights are a CPU path; on CUDA the engine runs bf16 weights (quantization none)"
        )
    head_weight = model.output.weight.detach()
    for block in model.layers:
        for parent in (block.attention, block.feed_forward):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, Int4Linear(child))
    model.output = Int8Linear(head_weight)
    return model.to(torch.bfloat16)


def quantize_fp8(model: nn.Module, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """Swap every float linear inside the blocks for :class:`Fp8Linear` (quantised from its
    weights as they are, float32 or bfloat16), in place; the rest moves to ``dtype``."""
    for block in model.layers:
        for parent in (block.attention, block.feed_forward):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    setattr(parent, name, Fp8Linear.quantize(child))
    return model.to(dtype)


def quantize_fp8_head(model: nn.Module) -> nn.Module:
    """The vocabulary head as an :class:`Fp8Linear` too (opt-in: published FP8 checkpoints keep
    it in the model dtype; SGLang's ``SGLANG_QUANTIZE_LM_HEAD_FP8`` and TensorRT-LLM with
    ``lm_head`` not excluded quantise it). A head tied to the embedding gets its own codes; the
    embedding table stays as it is for lookups."""
    if not isinstance(model.output, Fp8Linear):
        model.output = Fp8Linear.quantize(model.output)  # codes on the head's device
    return model
