"""Float32 linears that also keep MKL's packed GEMM layout, for CPU steps of a few rows.

A batched decode step (8 sequences) or a speculative verify (a draft chain of 4 tokens) puts
4-8 rows through every linear. MKL's plain ``sgemm`` repacks the weight on each such call and
costs about twice a one-row step on 2 cores; with the weight packed once at load time the same
8-row step costs ~1.4x (measured on the default model's shapes: 73 -> 47 ms for all linears).
One-row steps keep the plain path, whose GEMV is as fast and matches transformers bit for bit.
The packed copy costs as much memory as the weight itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PACK_ROWS = 8  # rows the packed GEMM is built for; steps of PACK_ROWS // 2 or more pad up to it


def available() -> bool:
    """True when torch was built with MKL and its packed-linear ops."""
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


class PackedLinear(nn.Module):
    """``nn.Linear`` semantics; steps of ``rows // 2 .. rows`` rows use the packed weight."""

    def __init__(self, linear: nn.Linear, rows: int = PACK_ROWS) -> None:
        super().__init__()
        self.weight = linear.weight  # shared, e.g. with tied embeddings
        self.bias = linear.bias
        self.rows = rows
        self.in_features, self.out_features = linear.in_features, linear.out_features
        packed = torch.ops.mkl._mkl_reorder_linear_weight(linear.weight.detach(), rows)
        self.register_buffer("packed", packed, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        m = flat.shape[0]
        if not self.rows // 2 <= m <= self.rows:
            return F.linear(x, self.weight, self.bias)
        if m < self.rows:  # zero rows: each output row depends on its own input row only
            flat = F.pad(flat, (0, 0, 0, self.rows - m))
        out = torch.ops.mkl._mkl_linear(flat, self.packed, self.weight, self.bias, self.rows)
        return out[:m].view(*x.shape[:-1], self.out_features)


def pack_linears(model: nn.Module) -> int:
    """Swap every float32 ``nn.Linear`` of ``model`` (blocks and head) for a packed one, in
    place; return how many were swapped."""
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear and child.weight.dtype == torch.float32:
                setattr(parent, name, PackedLinear(child))
                swapped += 1
    return swapped
