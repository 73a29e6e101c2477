"""Triton attention of the CUDA decode path: split-KV ("flash-decoding") over the slot cache.

Each program covers one slot, one KV head and one stretch of positions, reads only positions
below the slot's length (read on the device, so the launch is CUDA-graph safe), and the last
stretch of each (row, KV head) to finish merges them. New tokens (a decode token, a verify
window or a flattened draft tree) sit at ``start .. start+T-1`` and see each other through
``tree [B, T, T]``; everything before ``start`` is visible. :func:`rope_attention` also does
the rotary of q and k and writes the new k and v into the cache (benchmarks/GPU_NOTES.md). The
kernel is in ``attention_kernels.py``; here are its launch rules, measured per shape.

Each kernel is a ``torch.library`` custom op, so ``torch.compile`` treats it as one opaque call.
"""

from __future__ import annotations

import functools
import math

import torch

from mathagent.serving.engine.cuda.kernels import arrival_counters, pdl_supported

try:
    import triton
except ImportError:  # CPU-only installs have no Triton; the CUDA path is then unavailable
    triton = None

if triton is not None:
    from mathagent.serving.engine.cuda.attention_kernels import _attn_kernel


def attention_partition(batch: int, groups: int = 1) -> int:
    """Positions per split-KV program (fewest; more once a row needs more than
    :func:`attention_splits` stretches): short for one row (parallelism), long for many;
    :data:`WIDE_PARTITION` for one or two rows whose KV heads' queries are in ``groups > 1``
    programs (a wide verify)."""
    if batch <= 2:
        return WIDE_PARTITION if groups > 1 else 64
    return 256 if batch <= 16 else 512


def attention_splits(max_seq: int, part: int, programs: int, device: torch.device,
                     most: int | None = None) -> int:  # fmt: skip
    """Stretches of a (row, KV head, group), the launch's second grid dimension: as many as
    ``max_seq`` needs at ``part`` positions each, at most ``most`` or else one wave of the
    card's SMs over the ``programs`` (flash-decoding's rule: longer rows take longer stretches,
    not more of them, so the last stretch's merge reads a bounded number of parts); unbounded
    when :data:`SPLITS_PER_WAVE` is off."""
    need = triton.cdiv(max_seq, part)
    if most is None and not SPLITS_PER_WAVE:
        return need
    if most is None:
        sms = _sm_count(device) if device.type == "cuda" else 132  # the interpreter: an H100's
        most = max(1, sms // programs)
    return min(need, most)


SPLITS_PER_WAVE = True


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


# Alone, 128 positions a program ran the default model's 13-node verify faster (640 cached
# positions: 8.1 -> 6.5 us; benchmarks/attention_sweep_h200_2026-12-04.json), but in the engine
# the step took 1.113 ms against 1.095 at 64 (runs 82-83).
WIDE_PARTITION = 64


@torch.library.custom_op("mathagent::decode_attention", mutates_args=())
def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    start: torch.Tensor,
    tree: torch.Tensor,
) -> torch.Tensor:
    """Attention of ``q [B, T, H, D]`` over the slot cache ``[S, Hkv, max_seq, D]``.

    Row ``b``'s new tokens are cached at ``start[b] .. start[b]+T-1`` of slot ``slots[b]``;
    query ``t`` sees all positions before ``start[b]`` and new token ``j`` where
    ``tree[b, t, j]`` is non-zero. Returns ``[B, T, H, D]``.
    """
    return _attention(q, k_cache, v_cache, slots, start, tree, q.shape[2], None)


@decode_attention.register_fake
def _(q, k_cache, v_cache, slots, start, tree):
    return torch.empty_like(q)


@torch.library.custom_op("mathagent::rope_attention", mutates_args=("k_cache", "v_cache"))
def rope_attention(
    qkv: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    start: torch.Tensor,
    tree: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    n_heads: int,
    out_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`decode_attention` fed by the QKV projection ``[B, T, (H + 2 Hkv) * D]``.

    Rotates q and the new k by ``positions [B, T]`` (half-split tables ``cos/sin [*, D]``),
    writes the new k and v into the cache at ``start[b] + t`` of slot ``slots[b]`` (positions
    past the cache are dropped) and attends as :func:`decode_attention`; one kernel instead of
    rotary, scatter and attention. Returns ``[B, T, H, D]``: in the model dtype, or with
    ``out_scale`` (the output projection's static FP8 input scale ``[1]``) its e4m3 codes.
    """
    bsz, t = qkv.shape[:2]
    d = k_cache.shape[3]
    view = qkv.view(bsz, t, -1, d)  # [B, T, H + 2 Hkv, D]
    return _attention(view, k_cache, v_cache, slots, start, tree, n_heads, (positions, cos, sin),
                      out_scale=out_scale)  # fmt: skip


@rope_attention.register_fake
def _(qkv, k_cache, v_cache, slots, start, tree, positions, cos, sin, n_heads, out_scale=None):
    dtype = qkv.dtype if out_scale is None else torch.float8_e4m3fn
    return qkv.new_empty(qkv.shape[0], qkv.shape[1], n_heads, k_cache.shape[3], dtype=dtype)


def head_groups(width: int, g: int) -> int:
    """Programs per KV head (GS, dividing its ``g`` query heads): the fewest that keep a
    program's rows (``width`` tokens x its heads) within 16, the smallest tile of the dots, or
    one per query head past that; 1 when :data:`SPLIT_HEADS` is off."""
    if not SPLIT_HEADS:
        return 1
    return next((n for n in range(1, g + 1) if g % n == 0 and width * g // n <= 16), g)


# One-token steps of one row with 128-wide heads and the rotary inside (the Llama layout; q/k
# norm models rotate before the kernel) launch it with PDL and 8 warps: it reads its step
# inputs, rotary tables and first block of cached rows while the QKV product finishes. The 8B
# decode graph on an H100 (run 136, 160 / 288 cached positions): 3.015 ->
# 2.953 / 3.051 -> 2.986 ms (PDL with 4 warps, or 8 warps alone: within 0.015), greedy tokens
# unchanged (run 138). Not for verify steps (FP8 4-token graph 3.208 -> 3.336 ms) nor 16 rows
# (+1.2%): there the early programs hold SMs the products use. Not for the default model's
# 64-wide heads: unmeasured there, and 8 warps sum its softmax in another order (its greedy
# tokens moved in run 138; with this rule they are run 133's code's again, run 139).
LAUNCH_PDL = True

# One-token steps with the rotary inside take the new k / v of the first block from registers
# instead of reading back what they stored (same values; one memory round trip fewer on the
# step's critical path: the 8B graph 2.861 -> 2.853 ms, run 142). Off: read back, as verify
# steps do.
NEW_IN_REGISTERS = True

# The last stretch to finish requests this many stretches' parts at once to merge them (3 a
# row at 160 cached positions, 64 a stretch; the 8B graph 2.844 -> 2.834 ms, run 143). One
# longer stretch a row instead (no merge; its 2-3 blocks all read before the PDL wait) lost:
# 2.842 -> 2.919 ms at 160 (GPU_NOTES.md run 154-155).
MERGE_LOADS = 4

# A 13-node verify of the default model (3 query heads a KV head) ran 39 rows padded to 64 in
# each program at 9.3 us a layer, where a one-token decode step's 3 rows took 6.1 us (H200,
# benchmarks/GPU_NOTES.md, session of 2026-12-04): one program per query head instead.
SPLIT_HEADS = True


def _attention(q, k_cache, v_cache, slots, start, tree, h, rope, launch=None,
               out_scale=None) -> torch.Tensor:  # fmt: skip
    """Launch the split-KV kernel over ``q [B, T, >=H, D]`` (the first ``h`` heads are queries);
    ``launch`` = (positions per split, positions per block, warps[, programs per KV head[,
    most splits]]) overrides the default (benchmarks/attention_sweep.py)."""
    bsz, t, _, d = q.shape
    hkv, max_seq = k_cache.shape[1], k_cache.shape[2]
    g = h // hkv
    gs = launch[3] if launch is not None and len(launch) > 3 else head_groups(t, g)
    assert g % gs == 0, (g, gs)
    qrows = max(16, triton.next_power_of_2(t * g // gs))
    part = attention_partition(bsz, gs) if launch is None else launch[0]
    # float32 (IEEE dots) at 64+ query rows spills with 4 warps: the default model's 11-node
    # verify took 231 us a launch, 19 us with 8 (GPU_NOTES run 50)
    wide = q.dtype == torch.float32 and qrows >= 64
    pdl = q.is_cuda and pdl_supported()
    wait = pdl and LAUNCH_PDL and t == 1 and bsz == 1 and d == 128 and rope is not None
    block_s, warps = (min(part, 64), 8 if wide or wait else 4) if launch is None else launch[1:3]
    programs = bsz * hkv * gs
    most = launch[4] if launch is not None and len(launch) > 4 else None
    nsplit = attention_splits(max_seq, part, programs, q.device, most)
    ws_rows = programs * nsplit * qrows
    m = torch.empty(ws_rows, dtype=torch.float32, device=q.device)
    lsum = torch.empty(ws_rows, dtype=torch.float32, device=q.device)
    acc = torch.empty(ws_rows, d, dtype=torch.float32, device=q.device)
    out = q.new_empty(bsz, t, h, d, dtype=q.dtype if out_scale is None else torch.float8_e4m3fn)
    positions, cos, sin = rope if rope is not None else (start, start, start)
    assert positions.is_contiguous() and cos.is_contiguous() and sin.is_contiguous()
    _attn_kernel[(programs, nsplit)](
        q, k_cache, v_cache, slots, start, tree, m, lsum, acc,
        arrival_counters("attention", programs, q.device), out, positions, cos, sin,
        m if out_scale is None else out_scale, math.log2(math.e) / math.sqrt(d),
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), out.stride(0), out.stride(1), out.stride(2),
        HKV=hkv, T=t, G=g, D=d, QROWS=qrows, PART=part, BLOCK_S=block_s, NSPLIT=nsplit,
        MAX_SEQ=max_seq, IEEE=q.dtype == torch.float32, PDL=pdl, ROPE=rope is not None,
        TP=triton.next_power_of_2(t), GS=gs, CODES=out_scale is not None,
        WAIT=wait, NEW_IN_REGS=NEW_IN_REGISTERS, RROWS=triton.next_power_of_2(t * g // gs),
        MERGE_LOADS=MERGE_LOADS, num_warps=warps, launch_pdl=wait,
    )  # fmt: skip
    return out
