"""Greedy argmax over the vocabulary on the CUDA path: many programs per row, one kernel.

``torch.argmax`` over a 49152-wide vocabulary reduces each row in one program (Inductor's
reduction) or one block (ATen's): 11.1 us for a 13-node verify step's rows and 10.8 us for a
decode step's row on the H200, against 17.7 us for the head's product that reads the whole
head (benchmarks/GPU_NOTES.md, run 82; split, both steps ran ~8 us faster). Here each row is cut into stretches, one
program each finds its stretch's maximum and first index, and the last program of a row to
finish (an ``acq_rel`` arrival counter, left at zero for the next launch) merges them, so the
launch is CUDA-graph safe and deterministic. Ties go to the lowest index, as ``torch.argmax``;
a row holding NaN is not given the NaN's index as torch does (logits are never NaN unless the
model is broken).
"""

from __future__ import annotations

import torch

from mathagent.serving.engine.cuda.kernels import arrival_counters

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs have no Triton; torch.argmax serves there
    triton = None

ENABLED = True  # off: torch.argmax everywhere (benchmarks/gpu_default_model.py --split-argmax)
_BLOCK, _CHUNK = 1024, 2048  # positions per load, per program (latency: two loads a program)
_FAR = 2**31 - 1  # an index past any vocabulary: loses every tie

if triton is not None:

    @triton.jit
    def _argmax_kernel(x_ptr, val_ptr, idx_ptr, cnt_ptr, out_ptr, n, stride_x,
                       CHUNK: tl.constexpr, BLOCK: tl.constexpr, SPLIT: tl.constexpr,
                       SP: tl.constexpr, FAR: tl.constexpr):  # fmt: skip
        """Program (row, s) scans positions ``s * CHUNK ..`` of its row; the row's last to
        arrive merges the SPLIT (padded to SP) stretches and writes ``out[row]``."""
        row, s = tl.program_id(0), tl.program_id(1)
        lanes = tl.arange(0, BLOCK)
        best = tl.full((BLOCK,), float("-inf"), tl.float32)
        where = tl.full((BLOCK,), FAR, tl.int32)
        for c0 in tl.static_range(0, CHUNK, BLOCK):
            i = s * CHUNK + c0 + lanes
            v = tl.load(x_ptr + row * stride_x + i, mask=i < n, other=float("-inf"))
            v = v.to(tl.float32)
            # strictly greater keeps a lane's earlier index; a lane's first valid position is
            # taken even at -inf, so a row of -inf still names a position (torch gives 0)
            take = (v > best) | ((where == FAR) & (i < n))
            best = tl.where(take, v, best)
            where = tl.where(take, i, where)
        top = tl.max(best, axis=0)
        first = tl.min(tl.where(best == top, where, FAR), axis=0)
        tl.store(val_ptr + row * SPLIT + s, top)
        tl.store(idx_ptr + row * SPLIT + s, first)
        tl.debug_barrier()  # the stores precede the count (released below)
        if tl.atomic_add(cnt_ptr + row, 1, sem="acq_rel") == SPLIT - 1:
            j = tl.arange(0, SP)
            vals = tl.load(val_ptr + row * SPLIT + j, mask=j < SPLIT, other=float("-inf"),
                           cache_modifier=".cg")  # fmt: skip
            idxs = tl.load(idx_ptr + row * SPLIT + j, mask=j < SPLIT, other=FAR,
                           cache_modifier=".cg")  # fmt: skip
            top = tl.max(vals, axis=0)
            tl.store(out_ptr + row, tl.min(tl.where(vals == top, idxs, FAR), axis=0).to(tl.int64))
            tl.store(cnt_ptr + row, 0)  # ready for the next launch


@torch.library.custom_op("mathagent::argmax_rows", mutates_args=())
def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(-1)`` (int64, shape ``x.shape[:-1]``) by the split kernel; ``x`` float32 or
    bfloat16 with a contiguous last dimension."""
    n = x.shape[-1]
    rows = x.reshape(-1, n)
    assert rows.stride(-1) == 1
    split = triton.cdiv(n, _CHUNK)
    vals = torch.empty(rows.shape[0] * split, dtype=torch.float32, device=x.device)
    idxs = torch.empty(rows.shape[0] * split, dtype=torch.int32, device=x.device)
    out = torch.empty(rows.shape[0], dtype=torch.long, device=x.device)
    _argmax_kernel[(rows.shape[0], split)](
        rows, vals, idxs, arrival_counters("argmax", rows.shape[0], x.device), out, n,
        rows.stride(0),
        CHUNK=_CHUNK, BLOCK=_BLOCK, SPLIT=split, SP=triton.next_power_of_2(split), FAR=_FAR,
        num_warps=4,
    )  # fmt: skip
    return out.view(x.shape[:-1])


@argmax_rows.register_fake
def _(x):
    return x.new_empty(x.shape[:-1], dtype=torch.long)


def argmax(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(-1)``: the split kernel for CUDA tensors of a vocabulary's width,
    ``torch.argmax`` elsewhere."""
    if not ENABLED or triton is None or not x.is_cuda or x.shape[-1] < 2 * _CHUNK or not x.numel():
        return x.argmax(-1)
    return argmax_rows(x.contiguous())
