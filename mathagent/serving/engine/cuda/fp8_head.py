"""The FP8 vocabulary head at one row (``fp8_head``): the step's last two kernels.

Unfused, the head is four kernels: Inductor's final RMSNorm (which also gives the hidden state
the drafters read), the row kernel quantising that row, the GEMV, and Inductor's float copy of
the logits. Here the row kernel normalises the residual stream itself (the layers' rule,
:func:`fp8_gemv.quantize_input_rows` with the final norm) and stores the normed row beside its
codes, and the GEMV stores its bf16-rounded logits as float32, so the same values come out of
two kernels, each chained to the one before with PDL (benchmarks/GPU_NOTES.md, run 152).
"""

from __future__ import annotations

import torch

from mathagent.serving.engine.cuda import fp8_gemv, kernels

triton = kernels.triton
if triton is not None:
    from mathagent.serving.engine.cuda.fp8_gemv_kernels import _fp8_gemv_kernel

# Off: the head runs as the layers' products do (norm and float copy by Inductor around it).
FUSED = True


def fused_ok(weight: object, rows: int) -> bool:
    """Whether :func:`head` takes this head weight at ``rows`` rows: an FP8 one-row GEMV head
    (W8A8: the row kernel's codes)."""
    return (FUSED and rows == 1 and isinstance(weight, tuple) and not fp8_gemv.A16
            and fp8_gemv.gemv_fits(weight[0]))  # fmt: skip


@torch.library.custom_op("mathagent::fp8_head", mutates_args=())
def head(
    h: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    input_scale: torch.Tensor | None,
    norm: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits, hidden)`` of one row ``h [..., K]``: ``hidden = RMSNorm(h) * norm`` in h's
    dtype and ``logits = float(hidden @ (weight * weight_scale).T)`` (rounded to h's dtype
    first, as the unfused head's float copy of its output), float32 ``[..., N]``."""
    n, k = weight.shape
    cfg = fp8_gemv.fp8_gemv_config(n, k)
    x = h.reshape(1, k).contiguous()
    hidden = torch.empty_like(x)
    q, s = fp8_gemv.quantize_input_rows(x, k, norm, eps, 1, cfg.pdl, input_scale, hidden)
    logits = torch.empty(n, dtype=torch.float32, device=h.device)
    _fp8_gemv_kernel[(triton.cdiv(n, cfg.block_n),)](
        q, s, weight, weight_scale, logits, hidden, hidden, s, n, k, weight.stride(0), eps,
        RESID=False, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, EVICT=cfg.evict, PDL=cfg.pdl,
        GLU=False, num_warps=cfg.num_warps, launch_pdl=cfg.pdl,
    )  # fmt: skip
    return logits.view(*h.shape[:-1], n), hidden.view(h.shape)


@head.register_fake
def _(h, weight, weight_scale, input_scale, norm, eps):
    return h.new_empty(*h.shape[:-1], weight.shape[0], dtype=torch.float32), torch.empty_like(h)
