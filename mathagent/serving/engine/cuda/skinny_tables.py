"""The skinny product's launch shapes, measured per weight shape and row bucket on the H200.

The tables are also the dispatch rule: a shape and row bucket listed here takes the kernel of
``skinny.py``; measured once by the sweeps (``benchmarks/skinny_sweep.py``,
``benchmarks/fused_rows_sweep.py``) rather than timed at every engine start, so start-up
compiles nothing extra and a float32 model's products take the same kernels (the same
rounding) on every run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SkinnyConfig:
    """Launch shape of :func:`skinny` for one weight shape and row bucket."""

    block_n: int  # output columns per program
    block_k: int  # reduction columns per unrolled step
    num_warps: int
    dot: bool  # tl.dot over rows padded to 16, else broadcast FMAs over a power of two
    evict: str = "evict_first"  # weights are read once per step: keep L2 for activations
    pdl: bool = True  # programmatic dependent launch: overlap the previous kernel's tail
    # Fused table, w13's entry only: the layer takes the GLU form at this bucket (w13 writes
    # silu(gate) * up, w2 reads a plain row), where the sweep measured it faster than w2's SiLU
    # prologue.
    glu: bool = False
    # K in this many slices, one program each per column block, summed in slice order by the
    # last to finish (skinny._skinny_kernel): more programs for products with few columns.
    split: int = 1


# From benchmarks/skinny_sweep.py on one H200 (weights cold in L2, one graph per shape): per
# (N, K, bytes per weight value, row bucket) the fastest launch shape, listed only where it beat
# cuBLAS. The table is also the dispatch rule (skinny_buckets): measured once by the sweep
# rather than timed at every engine start, so start-up compiles nothing extra and a float32
# model's products take the same kernels (the same rounding) on every run. Measured in run 24
# (`skinny_sweep.py --models smollm2-135m:float32 smollm2-135m:bfloat16`,
# benchmarks/skinny_sweep_h200.json): the default model's shapes, microseconds against cuBLAS.
SKINNY_CONFIGS: dict[tuple[int, int, int, int], SkinnyConfig] = {
    (960, 576, 4, 2): SkinnyConfig(2, 512, 4, False),  # 3.7 vs 5.0 us
    (960, 576, 4, 4): SkinnyConfig(4, 512, 4, False),  # 4.2 vs 6.5 us
    (960, 576, 4, 8): SkinnyConfig(2, 512, 4, False),  # 4.2 vs 6.9 us
    (960, 576, 4, 16): SkinnyConfig(2, 256, 4, False),  # 6.2 vs 11.3 us
    (576, 576, 4, 2): SkinnyConfig(8, 256, 4, False),  # 2.9 vs 10.0 us
    (576, 576, 4, 4): SkinnyConfig(4, 512, 4, False),  # 4.0 vs 10.0 us
    (576, 576, 4, 8): SkinnyConfig(2, 512, 4, False),  # 4.1 vs 9.1 us
    (576, 576, 4, 16): SkinnyConfig(2, 256, 4, False),  # 6.1 vs 10.1 us
    (3072, 576, 4, 2): SkinnyConfig(8, 512, 4, False),  # 4.6 vs 6.0 us
    (3072, 576, 4, 4): SkinnyConfig(8, 256, 4, False),  # 5.9 vs 7.4 us
    (3072, 576, 4, 8): SkinnyConfig(16, 64, 4, False),  # 6.5 vs 7.8 us
    (3072, 576, 4, 16): SkinnyConfig(8, 64, 4, False),  # 10.1 vs 12.4 us
    (576, 1536, 4, 2): SkinnyConfig(4, 512, 4, False),  # 3.8 vs 15.0 us
    (576, 1536, 4, 4): SkinnyConfig(4, 512, 4, False),  # 4.1 vs 12.5 us
    (576, 1536, 4, 8): SkinnyConfig(2, 512, 4, False),  # 4.4 vs 14.2 us
    (576, 1536, 4, 16): SkinnyConfig(2, 128, 4, False),  # 9.5 vs 13.6 us
    (49152, 576, 4, 2): SkinnyConfig(16, 64, 4, False),  # 35.3 vs 38.4 us
    (49152, 576, 4, 4): SkinnyConfig(16, 64, 4, False),  # 42.4 vs 53.2 us
    (49152, 576, 4, 8): SkinnyConfig(16, 32, 4, False),  # 52.3 vs 56.1 us
    (960, 576, 2, 2): SkinnyConfig(4, 256, 4, False),  # 2.7 vs 4.1 us
    (960, 576, 2, 4): SkinnyConfig(4, 256, 4, False),  # 3.7 vs 3.9 us
    (576, 576, 2, 2): SkinnyConfig(4, 512, 4, False),  # 2.3 vs 3.5 us
    (576, 576, 2, 4): SkinnyConfig(8, 256, 4, False),  # 3.1 vs 3.6 us
    (3072, 576, 2, 2): SkinnyConfig(2, 512, 4, False),  # 3.7 vs 4.1 us
    (576, 1536, 2, 2): SkinnyConfig(8, 512, 4, False),  # 3.1 vs 5.2 us
    (576, 1536, 2, 4): SkinnyConfig(2, 512, 4, False),  # 3.6 vs 5.2 us
    (576, 1536, 2, 8): SkinnyConfig(2, 512, 4, False),  # 4.7 vs 5.1 us
}  # fmt: skip

# Launch shapes of the fused form (norm / SiLU prologue, residual epilogue) per (N, K, bytes per
# weight value, fused_bucket), listed where a layer's four fused products measured faster than
# the unfused layer (cuBLAS or skinny products with Inductor's norm, SiLU and add kernels
# around them): benchmarks/fused_rows_sweep.py. A layer takes the fused form only when all four
# of its products are listed for the step's row bucket (forward.layer_step). us per layer of
# the default model's shape, attention left out, unfused -> fused:
#   buckets 1 and 2 (benchmarks/fused_rows_sweep_h200_run59_*.json, w2 with the SiLU prologue):
#   bf16 1 row 23.8 -> 12.9, 2 rows 17.0 -> 13.4; float32 1 row 24.1 -> 16.0, 2 rows 19.1 -> 16.3.
#   buckets 4, 8, 16 (run64_*_split.json: w13 in the GLU form, ``glu=True`` on its entry, and
#   launches that split K, ``split``): bf16 13 rows 23.9 -> 21.4 (4 and 7 rows lose, 0.95x:
#   not listed); float32 4 rows 20.9 -> 19.4, 7 rows 25.7 -> 22.2, 13 rows 35.0 -> 30.4.
FUSED_CONFIGS: dict[tuple[int, int, int, int], SkinnyConfig] = {
    (960, 576, 2, 1): SkinnyConfig(4, 512, 4, False),
    (576, 576, 2, 1): SkinnyConfig(4, 512, 4, False),
    (3072, 576, 2, 1): SkinnyConfig(2, 512, 4, False),
    (576, 1536, 2, 1): SkinnyConfig(8, 512, 4, False),
    (960, 576, 2, 2): SkinnyConfig(4, 512, 4, False),
    (576, 576, 2, 2): SkinnyConfig(4, 512, 4, False),
    (3072, 576, 2, 2): SkinnyConfig(2, 512, 4, False),
    (576, 1536, 2, 2): SkinnyConfig(8, 512, 4, False),
    (960, 576, 2, 16): SkinnyConfig(32, 32, 4, True, split=6),
    (576, 576, 2, 16): SkinnyConfig(32, 64, 4, True),
    (3072, 576, 2, 16): SkinnyConfig(16, 64, 4, True, glu=True, split=3),
    (576, 1536, 2, 16): SkinnyConfig(32, 128, 4, True, split=6),
    (960, 576, 4, 1): SkinnyConfig(4, 256, 4, False),
    (576, 576, 4, 1): SkinnyConfig(4, 256, 4, False),
    (3072, 576, 4, 1): SkinnyConfig(8, 512, 4, False),
    (576, 1536, 4, 1): SkinnyConfig(8, 512, 4, False),
    (960, 576, 4, 2): SkinnyConfig(4, 256, 4, False),
    (576, 576, 4, 2): SkinnyConfig(4, 256, 4, False),
    (3072, 576, 4, 2): SkinnyConfig(8, 512, 4, False),
    (576, 1536, 4, 2): SkinnyConfig(8, 512, 4, False),
    (960, 576, 4, 4): SkinnyConfig(4, 128, 4, False),
    (576, 576, 4, 4): SkinnyConfig(8, 128, 4, False),
    (3072, 576, 4, 4): SkinnyConfig(4, 256, 4, False, glu=True),
    (576, 1536, 4, 4): SkinnyConfig(2, 512, 8, False),
    (960, 576, 4, 8): SkinnyConfig(4, 512, 8, False),
    (576, 576, 4, 8): SkinnyConfig(2, 512, 4, False),
    (3072, 576, 4, 8): SkinnyConfig(4, 128, 4, False, glu=True),
    (576, 1536, 4, 8): SkinnyConfig(2, 512, 4, False),
    (960, 576, 4, 16): SkinnyConfig(8, 128, 8, False),
    (576, 576, 4, 16): SkinnyConfig(8, 128, 8, False),
    (3072, 576, 4, 16): SkinnyConfig(4, 64, 8, False, glu=True),
    (576, 1536, 4, 16): SkinnyConfig(8, 64, 4, False, split=4),
}  # fmt: skip
