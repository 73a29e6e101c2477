"""The FP8 model's one-row product (batch-1 decode): quantise the input row once, then stream;
and the same fused product for 2..16 verify rows (:func:`gemv` there too).

Two kernels per product (:mod:`.fp8_gemv_kernels`), chained with programmatic dependent
launch (PDL): a one-program row kernel computes the product's input ``f(x)``, its scale and its
e4m3 codes with the rule of :func:`~mathagent.serving.engine.fp8_format.quantize_rows`; the
GEMV then streams the e4m3 weights against those codes with no pre-pass of its own. The row
kernel's latency sits between two products (0.23 ms of a 2.48 ms 8B step on the H200); doing its
work in every GEMV program instead measured slower (benchmarks/GPU_NOTES.md, runs 86-87), as
did the first single kernel, which repeated the row's statistics and re-quantised every input
chunk in every program ("FP8"). One-row w13 runs in the GLU form (:data:`GLU`).

The GEMV runs on the CUDA cores (float32 products of converted codes): ``tl.dot`` tiles on
the tensor cores (wgmma at 64+ rows) and L2 prefetches of more tiles before the wait were
measured and lost (GPU_NOTES.md, "FP8 v2"). Each program loads its first two weight tiles
before waiting on the row kernel, so the stream overlaps it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from mathagent.serving.engine.cuda import fp8, kernels

triton = kernels.triton
if triton is not None:
    from mathagent.serving.engine.cuda.fp8_gemv_kernels import _fp8_gemv_kernel, _fp8_row_kernel


# Verify rows of the FP8 model through gemv (norm / SiLU / residual fused, as at one row): on
# the H200, 8B shape, batch 1, AL 3, the step ran at 990.8 tok/s against 872.4 unfused (4.08x
# BF16 plain; GPU_NOTES.md run 35). False routes verify rows back to fp8.linear.
FUSED_ROWS = True


@dataclass(frozen=True)
class Fp8GemvConfig:
    """Launch shape of the fp8 one-row GEMV for one weight shape (GLU: rows of each half)."""

    block_n: int
    block_k: int  # 2 * block_k * split must divide K
    num_warps: int
    evict: str = "evict_first"
    pdl: bool = True
    split: int = 1  # programs a row block, each over K / split (not GLU or A16; H100: no gain)

    @classmethod
    def of(cls, launch: list[int]) -> Fp8GemvConfig:
        """The launch ``[block_n, block_k, warps(, split)]``, as sweeps and probes name one."""
        return cls(*launch[:3], split=launch[3] if len(launch) > 3 else 1)


# The fastest launch shapes on one H200 (benchmarks/fp8_bench.py --sweep, run F4 call 1;
# GPU_NOTES.md, "FP8 v2"), weights cold in L2, one CUDA graph per product over 32 distinct
# matrices, row kernel included. Llama-3-8B shapes: qkv, wo, w13, w2 (the head stays bf16).
FP8_GEMV_CONFIGS: dict[tuple[int, int], Fp8GemvConfig] = {
    (6144, 4096): Fp8GemvConfig(16, 512, 8),
    (4096, 4096): Fp8GemvConfig(16, 1024, 8),
    (28672, 4096): Fp8GemvConfig(16, 512, 8),
    (4096, 14336): Fp8GemvConfig(16, 1024, 8),
    (128256, 4096): Fp8GemvConfig(16, 512, 8),  # the FP8 head (fp8_head): w13's, not swept
}
# w13 in the GLU form (:data:`GLU`), per full weight shape; else the plain shape's with half
# its rows from each half (the same weight bytes a program).
# The 8B shape's w13 (fp8_step_probe.py, the decode graph: 8 x 512 with 4 warps 2.530 ms a step,
# 8 x 512 with 8 warps 2.548, 16 x 512 2.553, 8 x 1024 2.548, 4 x 1024 2.639).
GLU_CONFIGS: dict[tuple[int, int], Fp8GemvConfig] = {(28672, 4096): Fp8GemvConfig(8, 512, 4)}
# Launch shapes of another card where the H200's above lost there, by the card's name as torch
# reports it (the first key it contains; vLLM keeps its Triton kernels' configs per device name
# the same way). H100 80GB HBM3, in the captured decode graph with static scales and the FP8
# head (fp8_step_probe.py, runs 128-131): 2.928 -> 2.852 ms; through LLMEngine 329.6 -> 333.6
# tok/s (fp8_bench.py; GPU_NOTES.md). On the H200, w13's 4 x 1024 had lost to 8 x 512 by 4%.
# wo then went from 8 x 512 x 8 to 4 x 512 x 4 once the attention before it had shortened:
# the graph at 288 cached positions 2.882 -> 2.854 and 2.862 -> 2.821 ms, at 160 unchanged
# (runs 143-144); through LLMEngine 354.8 -> 355.3 tok/s.
CARD_FP8_GEMV_CONFIGS: dict[str, dict[tuple[int, int], Fp8GemvConfig]] = {
    "H100 80GB HBM3": {
        (4096, 4096): Fp8GemvConfig(4, 512, 4),
        (128256, 4096): Fp8GemvConfig(4, 1024, 4),
    },
}
CARD_GLU_CONFIGS: dict[str, dict[tuple[int, int], Fp8GemvConfig]] = {
    "H100 80GB HBM3": {(28672, 4096): Fp8GemvConfig(2, 2048, 4)},
}
# Warps of the row kernel per (K, prologue: 0 plain, 1 norm, 2 SiLU product); else row_warps.
ROW_WARPS: dict[tuple[int, int], int] = {}
# One-row w13 writes silu(gate) * up itself (products.glu_form), so w2's input is plain: the
# SiLU product once per element in w13's epilogue, not in a one-program row kernel before w2.
GLU = True
# One-row products read the plain bf16 row and make f(x) per tile (W8A16: the weights' e4m3
# codes against unquantised activations, as vLLM's FP8 Marlin on GPUs without FP8 products),
# so no row kernel sits between two products. Off: the FP8 model's W8A8 rule (row kernel).
# Measured slower: the 8B decode graph 3.772 ms (3.633 with GLU off) against W8A8's 3.234 on an
# H100 (run 120, benchmarks/fp8_step_probe_h100_run120_a16.json): the per-element input work
# costs more than the row kernels it removes.
A16 = False
# With static input scales (a checkpoint's, or fp8_activation_scales=calibrate), one-row w13 in
# the GLU form writes w2's e4m3 codes itself (``out_scale``), so no row kernel runs before w2.
GLU_CODES = True
# The same for the output projection: the one-row attention writes wo's codes.
ATTENTION_CODES = True


def card_key() -> str | None:
    """The key of this process's GPU in the ``CARD_*`` tables (None: the H200's tables)."""
    if not torch.cuda.is_available():
        return None
    name = _device_name(torch.cuda.current_device())
    return next((key for key in {**CARD_FP8_GEMV_CONFIGS, **CARD_GLU_CONFIGS} if key in name), None)


@functools.cache
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def fp8_gemv_config(n: int, k: int, glu: bool = False,
                    launch: list[int] | None = None) -> Fp8GemvConfig:  # fmt: skip
    """The launch shape for ``[n, k]`` e4m3 weights: ``launch`` ``[block_n, block_k, warps(,
    split)]`` if given, else the measured one (this card's, else the H200's), else a heuristic."""
    card, shape = card_key(), (n, k)
    cfg = None
    if glu:
        cfg = CARD_GLU_CONFIGS.get(card, {}).get(shape) or GLU_CONFIGS.get(shape)
    if cfg is None:
        cfg = CARD_FP8_GEMV_CONFIGS.get(card, {}).get(shape) or FP8_GEMV_CONFIGS.get(shape)
        if cfg is not None and glu:
            cfg = replace(cfg, block_n=max(1, cfg.block_n // 2))
    if cfg is None:
        block_k = next(b for b in (1024, 512, 256, 128) if k % (2 * b) == 0)
        cfg = Fp8GemvConfig(8 if n >= 8192 else 4, block_k, 4)
    if launch is not None:
        cfg = Fp8GemvConfig.of(launch)
    elif glu and cfg.split > 1:
        cfg = replace(cfg, split=1)
    if cfg.pdl and not kernels.pdl_supported():
        cfg = replace(cfg, pdl=False)
    return cfg


def row_warps(k: int, pro: int) -> int:
    """Warps of the row kernel (a sweep may measure them per shape into ``ROW_WARPS``)."""
    return ROW_WARPS.get((k, pro), 16 if k > 8192 else 8)


def gemv_fits(weight: torch.Tensor) -> bool:
    """Whether :func:`gemv` takes this e4m3 weight (contiguous, K a multiple of 256)."""
    return weight.is_contiguous() and weight.shape[1] % 256 == 0


def quantize_row(
    x: torch.Tensor, k: int, norm: torch.Tensor | None, eps: float, pro: int, pdl: bool,
    input_scale: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """e4m3 codes ``[k]`` and scale ``[1]`` of the product input ``f(x)`` (one row)."""
    q, s = quantize_input_rows(x.view(1, -1), k, norm, eps, pro, pdl, input_scale)
    return q.view(k), s


def quantize_input_rows(
    x2: torch.Tensor, k: int, norm: torch.Tensor | None, eps: float, pro: int, pdl: bool,
    input_scale: torch.Tensor | None = None, normed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """e4m3 codes ``[M, k]`` and scales ``[M]`` of the product input ``f(x)`` of each row of
    ``x2 [M, k or 2k]`` (last stride 1): the one-row kernel, one program per row; each row's
    own scale, or the static ``input_scale [1]``. ``normed [M, k]``: f(x) is stored there too."""
    m = x2.shape[0]
    q = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x2.device)
    s = torch.empty(m, dtype=torch.float32, device=x2.device)
    static = input_scale is not None
    _fp8_row_kernel[(m,)](
        x2, x2 if norm is None else norm, input_scale if static else s, q, s,
        x2 if normed is None else normed, k, x2.stride(0), eps, PRO=pro,
        BLOCK=triton.next_power_of_2(k), PDL=pdl, STATIC=static, NORMED=normed is not None,
        num_warps=row_warps(k, pro), launch_pdl=pdl,
    )  # fmt: skip
    return q, s


def rows_fit(weight: torch.Tensor, rows: int) -> bool:
    """Whether a ``rows``-row product with this e4m3 weight takes :func:`gemv` (the fused
    verify path is on, the rows fit one tile, the shape has a measured launch shape)."""
    return FUSED_ROWS and 2 <= rows <= fp8.MAX_ROWS and tuple(weight.shape) in fp8.ROWS_CONFIGS


# One-row products that run on the tensor-core rows kernel (K split across programs) instead of
# the CUDA-core GEMV, per weight shape: filled by a sweep where it measured faster
# (benchmarks/fp8_split_sweep.py); empty, every one-row product takes the GEMV.
ONE_ROW_CONFIGS: dict[tuple[int, int], fp8.RowsConfig] = {}


def _rows_gemv(x, weight, weight_scale, norm, residual, eps, silu_mul, cfg,
               input_scale) -> torch.Tensor:  # fmt: skip
    # Each row's f(x) quantised by the row kernel, then the tensor-core rows kernel
    # (fp8.rows_launch) with the residual add in its epilogue
    n, k = weight.shape
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    pro = 1 if norm is not None else 2 if silu_mul else 0
    pdl = kernels.pdl_supported()
    q, s = quantize_input_rows(x2, k, norm, eps, pro, pdl, input_scale)
    y = torch.empty(x2.shape[0], n, dtype=x.dtype, device=x.device)
    r = None if residual is None else residual.reshape(-1, n).contiguous()
    fp8.rows_launch(q, s, weight, weight_scale, y, cfg, r, pdl)
    return y.view(*x.shape[:-1], n)


def _glu_after(y: torch.Tensor) -> torch.Tensor:
    # GLU off the one-row kernel: silu(gate) * up in the eager model's roundings
    gate, up = y.chunk(2, dim=-1)
    return F.silu(gate) * up


def _split_buffers(cfg: Fp8GemvConfig, blocks: int, k: int, unsplittable: bool,
                   y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    if cfg.split == 1:  # the slices' sums and the row blocks' counters (y: unread ones)
        return y, y
    if unsplittable or k % (2 * cfg.block_k * cfg.split):
        raise ValueError(f"fp8 gemv: split {cfg.split} needs codes (not GLU or A16) and K {k} "
                         f"a multiple of 2 * block_k {cfg.block_k} * split")  # fmt: skip
    part = torch.empty(cfg.split, y.numel(), dtype=torch.float32, device=y.device)
    return part, kernels.arrival_counters("fp8_gemv", blocks, y.device)


@torch.library.custom_op("mathagent::fp8_gemv", mutates_args=())
def gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    norm: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    eps: float = 1e-6,
    silu_mul: bool = False,
    config: list[int] | None = None,
    glu: bool = False,
    input_scale: torch.Tensor | None = None,
    out_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """``f(x) @ (weight[N, K] * weight_scale[N]).T (+ residual)`` for one row, FP8 model; for
    2..16 rows (verify, where :func:`rows_fit`) the same through the tensor-core rows kernel.

    ``f`` as in :func:`kernels.gemv`. ``glu``: ``weight`` holds gate rows then up rows and the
    result is ``silu(gate) * up`` ``[N / 2]``. ``config`` (the sweep's knob) overrides the one-row
    launch shape: ``[block_n, block_k, warps(, split)]``. ``input_scale``: the product's static
    activation scale ``[1]`` (a checkpoint's), else each row's own; one row of ``x`` may then be
    those codes already (e4m3, with a residual: the w2 after a ``CODES`` w13). ``out_scale``
    (one row, GLU): the result as e4m3 codes with the next product's static scale
    (:data:`GLU_CODES`).
    """
    n, k = weight.shape
    codes_in = x.dtype == torch.float8_e4m3fn
    if codes_in and (input_scale is None or residual is None or x.numel() != k):
        raise ValueError("fp8 gemv: codes in need one row, their static scale and a residual")
    if out_scale is not None and not (glu and x.numel() == x.shape[-1]):
        raise ValueError("fp8 gemv: codes out are the one-row GLU form's")
    if x.numel() != x.shape[-1] or (config is None and not codes_in and (n, k) in ONE_ROW_CONFIGS):
        rows = x.numel() // x.shape[-1]
        cfg = ONE_ROW_CONFIGS[(n, k)] if rows == 1 else fp8.rows_config(n, k, rows)
        y = _rows_gemv(x, weight, weight_scale, norm, None if glu else residual, eps, silu_mul,
                       cfg, input_scale)  # fmt: skip
        return _glu_after(y) if glu else y
    x1 = x.reshape(-1).contiguous()
    pro = 1 if norm is not None else 2 if silu_mul else 0
    cfg = fp8_gemv_config(n, k, glu, config)
    n_out = n // 2 if glu else n
    a16 = A16 and input_scale is None and not codes_in  # a static scale names W8A8 codes
    if codes_in:
        q, s, kernel_pro = x1, input_scale, 0
    elif a16:
        q, s, kernel_pro = x1, weight_scale, pro
    else:
        (q, s), kernel_pro = quantize_row(x1, k, norm, eps, pro, cfg.pdl, input_scale), 0
    dtype = torch.float8_e4m3fn if out_scale is not None else (residual if codes_in else x).dtype
    y = torch.empty(n_out, dtype=dtype, device=x.device)
    blocks = triton.cdiv(n_out, cfg.block_n)
    part, counts = _split_buffers(cfg, blocks, k, glu or a16, y)
    _fp8_gemv_kernel[(blocks, cfg.split)](
        q, s, weight, weight_scale, y, x1 if residual is None else residual.reshape(n_out),
        x1 if norm is None else norm, s if out_scale is None else out_scale, n_out, k,
        weight.stride(0), eps, RESID=residual is not None, BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k, EVICT=cfg.evict, PDL=cfg.pdl, GLU=glu, A16=a16, PRO=kernel_pro,
        CODES=out_scale is not None, SPLIT=cfg.split, part_ptr=part, cnt_ptr=counts,
        num_warps=cfg.num_warps, launch_pdl=cfg.pdl,
    )  # fmt: skip
    return y.view(*x.shape[:-1], n_out)


@gemv.register_fake
def _(x, weight, weight_scale, norm=None, residual=None, eps=1e-6, silu_mul=False, config=None,
      glu=False, input_scale=None, out_scale=None):  # fmt: skip
    dtype = torch.float8_e4m3fn if out_scale is not None else x.dtype
    if x.dtype == torch.float8_e4m3fn and residual is not None:
        dtype = residual.dtype
    n = weight.shape[0] // 2 if glu else weight.shape[0]
    return x.new_empty(*x.shape[:-1], n, dtype=dtype)
