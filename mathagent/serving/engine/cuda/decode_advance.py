"""The last launch of a captured decode step: its tokens to the host, its inputs one step on.

A decode step launched ahead (``cuda/lookahead.py``) used to cost five small operations
between two graphs: a copy of the tokens out of the tail's buffer, their copy to the host, the
next inputs from the host and the tokens into them, with switching between copy engine and
compute: 21.5 us of a 2.8 ms FP8 step on the H100 (benchmarks/GPU_NOTES.md, run 157). Here one
program ends the step's graph: it stores the tokens into pinned host memory (with unified
addressing a kernel may write memory ``cudaHostAlloc`` returned, so no copy is enqueued) and
writes them, one position further on, into the graph's own inputs, so the next step is a bare
replay. Rows of the scratch slot are padding and stay as they are.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs have no Triton (and no CUDA graphs to advance)
    triton = None

# Whether the tokens go straight into pinned memory; set at the first launch. Where Triton
# refuses the pointer (False), the kernel writes a device buffer and a copy follows it.
ZERO_COPY: list[bool | None] = [None]

if triton is not None:

    @triton.jit
    def _advance_kernel(tok_ptr, packed_ptr, host_ptr, scratch, B: tl.constexpr,
                        BP: tl.constexpr):  # fmt: skip
        # packed: StepInputs of a one-token step, [tokens, positions, write, write_slot,
        # slots, start] of B rows each. The three stores are written out: the compiler
        # refuses a loop over a tuple, which the interpreter runs (GPU_NOTES run 158).
        r = tl.arange(0, BP)
        ok = r < B
        tok = tl.load(tok_ptr + r, mask=ok, other=0)
        tl.store(host_ptr + r, tok, mask=ok)
        live = ok & (tl.load(packed_ptr + 4 * B + r, mask=ok, other=scratch) != scratch)
        tl.store(packed_ptr + r, tok, mask=live)
        pos = tl.load(packed_ptr + B + r, mask=live, other=0)
        tl.store(packed_ptr + B + r, pos + 1, mask=live)
        write = tl.load(packed_ptr + 2 * B + r, mask=live, other=0)
        tl.store(packed_ptr + 2 * B + r, write + 1, mask=live)
        start = tl.load(packed_ptr + 5 * B + r, mask=live, other=0)
        tl.store(packed_ptr + 5 * B + r, start + 1, mask=live)


def block(batch: int) -> int:
    """Lanes of the one program (a power of two, at least 16)."""
    return max(16, 1 << (batch - 1).bit_length())


def advance(tokens: torch.Tensor, packed: torch.Tensor, scratch_slot: int, host: torch.Tensor,
            staging: torch.Tensor) -> None:  # fmt: skip
    """``tokens [B]`` into ``host [B]`` (pinned) and, for rows not in ``scratch_slot``, into
    ``packed`` (a one-token step's inputs) with positions, write positions and starts one on.
    ``staging [B]`` (device) is the tokens' way to the host where a kernel may not store
    there. Graph-safe: no host sync, the same launches every time."""
    batch = tokens.shape[0]
    args = (tokens, packed)
    meta = {"B": batch, "BP": block(batch), "num_warps": 1}
    if ZERO_COPY[0] is not False:
        try:
            _advance_kernel[(1,)](*args, host, scratch_slot, **meta)
            ZERO_COPY[0] = True
            return
        except (ValueError, RuntimeError):  # "cannot be accessed from Triton (cpu tensor?)"
            if ZERO_COPY[0]:
                raise
            ZERO_COPY[0] = False
    _advance_kernel[(1,)](*args, staging, scratch_slot, **meta)
    host.copy_(staging, non_blocking=True)


def reference(tokens: torch.Tensor, packed: torch.Tensor, scratch_slot: int,
              host: torch.Tensor) -> None:  # fmt: skip
    """:func:`advance` in PyTorch (what the kernel is tested against)."""
    batch = tokens.shape[0]
    host.copy_(tokens)
    live = packed[4 * batch : 5 * batch] != scratch_slot
    packed[:batch] = torch.where(live, tokens, packed[:batch])
    for column in (1, 2, 5):  # positions, write, start
        packed[column * batch : (column + 1) * batch] += live.long()
