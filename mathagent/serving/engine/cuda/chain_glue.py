"""The small tensor work around a chain step's verify forward, as three Triton kernels.

A captured chain step (:class:`~mathagent.serving.engine.spec_decode.chain_step.ChainStep`)
writes the verify forward's inputs before it and, after acceptance, moves the accepted path's
K/V into place and turns its own inputs into the next step's. Written in PyTorch that is ~40
kernels of 1-4 us each, ~0.12 ms of a 1.29 ms step on the H200 (benchmarks/GPU_NOTES.md, run
77); Inductor failed on it (run 76) and then compiled it wrongly (run 78). Here it is three
launches: :func:`feed`, :func:`move_path` and :func:`advance`, each equal to the PyTorch form
in ``chain_step`` (checked on the CPU under Triton's interpreter, and inside the captured step
on the H200). Run 79 (default model, bf16, greedy chains of 6): the step 1.279 -> 1.226 ms,
EAGLE-3 1.867x -> 1.946x plain.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs have no Triton; the PyTorch forms run instead
    triton = None

ENABLED = True  # False: the PyTorch glue (the reference the kernels are tested against)

if triton is not None:

    @triton.jit
    def _feed_kernel(beams_ptr, depths_ptr, gather_ptr, slots_ptr, start_ptr, packed_ptr, c_ptr,
                     B, W: tl.constexpr, K: tl.constexpr, NODES: tl.constexpr,
                     NP: tl.constexpr):  # fmt: skip
        # One row: its tree's nodes (the root, then each beam's drafts, gather naming each
        # node's column in the row's [W, K + 1] beams) into the packed StepInputs layout
        # [tokens, positions, write, write_slot] x [B, NODES], slots, start.
        b = tl.program_id(0)
        n = tl.arange(0, NP)
        ok = n < NODES
        c = tl.load(start_ptr + b) + (K + 1)  # the root's position
        slot = tl.load(slots_ptr + b)
        col = tl.load(gather_ptr + n, mask=ok, other=0)
        tok = tl.load(beams_ptr + b * W * (K + 1) + col, mask=ok, other=0)
        tok = tl.maximum(tok, 0)  # padding (-1) fed as token 0
        pos = c + tl.load(depths_ptr + n, mask=ok, other=0)
        row = b * NODES + n
        grid = B * NODES
        tl.store(packed_ptr + row, tok, mask=ok)
        tl.store(packed_ptr + grid + row, pos, mask=ok)
        tl.store(packed_ptr + 2 * grid + row, c + n, mask=ok)
        tl.store(packed_ptr + 3 * grid + row, tl.zeros_like(tok) + slot, mask=ok)
        tl.store(packed_ptr + 4 * grid + b, slot)
        tl.store(packed_ptr + 4 * grid + B + b, c)
        tl.store(c_ptr + b, c)

    @triton.jit
    def _move_kernel(k_ptr, v_ptr, slots_ptr, base_ptr, path_ptr, P: tl.constexpr,
                     HKV: tl.constexpr, s_l, s_s, s_h, s_p, D: tl.constexpr,
                     DP: tl.constexpr):  # fmt: skip
        # Program (b * P + j, l * HKV + h): position base + path[j] -> base + j of layer l,
        # head h, K and V. No program writes what another reads: path[j] is j, or a node of a
        # later beam (past every written position), or the last accepted node, which its own
        # program leaves in place.
        pid, lh = tl.program_id(0), tl.program_id(1)
        b, j = pid // P, pid % P
        src = tl.load(path_ptr + b * P + j)
        if src != j:
            base = tl.load(base_ptr + b)
            slot = tl.load(slots_ptr + b).to(tl.int64)
            off = (lh // HKV) * s_l + slot * s_s + (lh % HKV) * s_h
            d = tl.arange(0, DP)
            from_ = off + (base + src).to(tl.int64) * s_p + d
            to = off + (base + j).to(tl.int64) * s_p + d
            tl.store(k_ptr + to, tl.load(k_ptr + from_, mask=d < D), mask=d < D)
            tl.store(v_ptr + to, tl.load(v_ptr + from_, mask=d < D), mask=d < D)

    @triton.jit
    def _advance_kernel(slots_ptr, start_ptr, window_ptr, accepted_ptr, tokens_ptr, path_ptr,
                        hidden_ptr, outcome_ptr, last_ptr, scratch, T: tl.constexpr,
                        TP: tl.constexpr, NODES: tl.constexpr, H: tl.constexpr,
                        HP: tl.constexpr):  # fmt: skip
        # One row: the outcome [accepted, tokens...], the hidden state at its last accepted
        # node, and its inputs advanced to the next step's (padded rows stay where they are).
        b = tl.program_id(0)
        t = tl.arange(0, TP)
        ok = t < T
        a = tl.load(accepted_ptr + b)
        toks = tl.load(tokens_ptr + b * T + t, mask=ok, other=0)
        tl.store(outcome_ptr + b * (T + 1), a)
        tl.store(outcome_ptr + b * (T + 1) + 1 + t, toks, mask=ok)
        node = tl.load(path_ptr + b * T + a)
        h = tl.arange(0, HP)
        hv = tl.load(hidden_ptr + (b * NODES + node) * H + h, mask=h < H)
        tl.store(last_ptr + b * H + h, hv, mask=h < H)
        real = (tl.load(slots_ptr + b) != scratch).to(tl.int64)
        shift = (a + 1) * real
        col = shift + t  # in [window, tokens]: the window's last T of the T + a + 1 tokens
        old = tl.load(window_ptr + b * T + col, mask=ok & (col < T), other=0)
        new = tl.load(tokens_ptr + b * T + col - T, mask=ok & (col >= T), other=0)
        win = tl.where(col < T, old, tl.maximum(new, 0))
        tl.debug_barrier()  # every lane has read the window before any writes it
        tl.store(window_ptr + b * T + t, win, mask=ok)
        tl.store(start_ptr + b, tl.load(start_ptr + b) + shift)


def usable(device: torch.device) -> bool:
    """Whether the step takes these kernels: on, Triton present, a CUDA device."""
    return ENABLED and triton is not None and device.type == "cuda"


def feed(beams: torch.Tensor, depths: torch.Tensor, gather: torch.Tensor, slots: torch.Tensor,
         start: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """:meth:`ChainStep.feed` in one launch: ``beams [B, W, 1 + K]`` (contiguous int64), the
    tree's ``depths [nodes]`` and ``gather [nodes]`` (:class:`~.tree_batch.Layout`); writes
    ``packed`` (the verify StepInputs' buffer); returns ``c [B]``."""
    b, w, k1 = beams.shape
    nodes = gather.shape[0]
    c = torch.empty_like(start)
    _feed_kernel[(b,)](beams.contiguous(), depths, gather, slots, start, packed, c, b, W=w,
                       K=k1 - 1, NODES=nodes, NP=triton.next_power_of_2(nodes))  # fmt: skip
    return c


def move_path(cache: tuple[torch.Tensor, torch.Tensor], slots: torch.Tensor, base: torch.Tensor,
              path: torch.Tensor) -> None:  # fmt: skip
    """:func:`~mathagent.serving.engine.spec_decode.tree_batch.move_path` in one launch (K and V
    of every layer): cache ``[L, S, Hkv, max_seq, D]`` contiguous, ``path [B, P]`` int64."""
    k, v = cache
    layers, _, hkv, _, d = k.shape
    b, p = path.shape
    path = path.contiguous()
    _move_kernel[(b * p, layers * hkv)](k, v, slots, base, path, P=p, HKV=hkv, s_l=k.stride(0),
                                        s_s=k.stride(1), s_h=k.stride(2), s_p=k.stride(3), D=d,
                                        DP=triton.next_power_of_2(d))  # fmt: skip


def advance(slots: torch.Tensor, start: torch.Tensor, window: torch.Tensor,
            accepted: torch.Tensor, tokens: torch.Tensor, path: torch.Tensor,
            hidden: torch.Tensor, scratch: int) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The outcome ``[B, 2 + k]``, the hidden state ``[B, H]`` at each row's last accepted node,
    and ``start`` / ``window`` advanced in place (:meth:`ChainStep.advance`)."""
    bsz, t = window.shape
    nodes, hid = hidden.shape[1], hidden.shape[2]
    outcome = torch.empty(bsz, t + 1, dtype=tokens.dtype, device=tokens.device)
    last = torch.empty(bsz, hid, dtype=hidden.dtype, device=hidden.device)
    _advance_kernel[(bsz,)](slots, start, window, accepted, tokens.contiguous(),
                            path.contiguous(), hidden.contiguous(), outcome, last, scratch, T=t,
                            TP=triton.next_power_of_2(t), NODES=nodes, H=hid,
                            HP=triton.next_power_of_2(hid))  # fmt: skip
    return outcome, last
