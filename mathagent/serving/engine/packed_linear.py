"""Float32 linears that also keep MKL's packed GEMM layout, for CPU steps of a few rows.

A batched decode step (8 sequences) or a speculative verify (a draft chain of 4 tokens, a tree
of 13) puts 4-16 rows through every linear. MKL's plain ``sgemm`` repacks the weight on each
such call: on 2 cores all the default model's linears take 30 ms for 1 row, 59 for 4, 75 for 8
and 99 for 13. With the weight packed once at load time for 8 rows (used by steps of 4-8 rows,
padded) and for 16 (9-16 rows) they take 52, 51 and 59 ms. One-row steps keep the plain path,
whose GEMV is as fast and matches transformers bit for bit. Each packed copy costs as much
memory as the weight itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PACK_ROWS = (8, 16)  # packed GEMMs built for these rows; a step of n rows uses the smallest
# pack p with p // 2 <= n <= p, padded up to p, and the plain path otherwise


def available() -> bool:
    """True when torch was built with MKL and its packed-linear ops."""
    return torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear")


class PackedLinear(nn.Module):
    """``nn.Linear`` semantics; steps of a few rows use a packed copy of the weight."""

    def __init__(self, linear: nn.Linear, rows: tuple[int, ...] = PACK_ROWS) -> None:
        super().__init__()
        self.weight = linear.weight  # shared, e.g. with tied embeddings
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        self.packs = {p: torch.ops.mkl._mkl_reorder_linear_weight(weight, p) for p in rows}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        m = flat.shape[0]
        rows = next((p for p in self.packs if p // 2 <= m <= p), None)
        if rows is None:
            return F.linear(x, self.weight, self.bias)
        if m < rows:  # zero rows: each output row depends on its own input row only
            flat = F.pad(flat, (0, 0, 0, rows - m))
        out = torch.ops.mkl._mkl_linear(flat, self.packs[rows], self.weight, self.bias, rows)
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
