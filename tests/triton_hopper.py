"""Compile Triton kernels of the CUDA path for Hopper (sm_90a) on a host without a GPU.

The interpreter (:mod:`tests.triton_interpreter`) runs a kernel's Python, so it accepts code the
compiler refuses, and it says nothing of registers. Triton compiles ahead of time for a named
target without a device (its own ptxas included), so a kernel that would fail to build on the
device machine, lent a few minutes a session, fails here first. Run in its own process, since
the test process sets ``TRITON_INTERPRET`` before the kernels are defined:

    python -m tests.triton_hopper   # one JSON line per launch shape: registers, spill bytes
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from pathlib import Path

_TYPES = {"bf16": "*bf16", "f32": "*fp32", "e4m3": "*fp8e4nv", "i32": "i32", "float": "fp32",
          "i64p": "*i64", "i32p": "*i32", "i8p": "*i8"}  # fmt: skip


def compile_for_hopper(fn, args: dict[str, str], constexprs: dict, num_warps: int,
                       aligned: tuple[str, ...] = ()) -> dict:  # fmt: skip
    """Build ``fn`` (a ``triton.jit`` function) for sm_90a: its registers and spilled bytes.
    ``aligned``: arguments known to be multiples of 16 (bytes for pointers), as the JIT
    specialises them at a launch with such values (wider loads, fewer registers)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {name: _TYPES[kind] for name, kind in args.items()}
    signature.update({name: "constexpr" for name in constexprs})
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    src = ASTSource(fn=fn, signature=signature, attrs=attrs,
                    constexprs={(fn.arg_names.index(k),): v for k, v in constexprs.items()})  # fmt: skip
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(kernel.asm["ptx"])
        ptx.flush()
        info = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", ptx.name, "-o", "/dev/null"],
                              capture_output=True, text=True, check=True).stderr  # fmt: skip
    return {
        "registers": int(re.search(r"Used (\d+) registers", info).group(1)),
        "spill_bytes": int(re.search(r"(\d+) bytes spill stores", info).group(1)),
    }


def fp8_gemv_launches() -> list[dict]:
    """The FP8 one-row GEMV at every shipped launch shape, W8A8 (row kernel's codes) and A16."""
    from mathagent.serving.engine.cuda import fp8_gemv
    from mathagent.serving.engine.cuda.fp8_gemv_kernels import _fp8_gemv_kernel

    args = {"q_ptr": "e4m3", "s_ptr": "f32", "w_ptr": "e4m3", "ws_ptr": "f32", "y_ptr": "bf16",
            "r_ptr": "bf16", "g_ptr": "bf16", "os_ptr": "f32", "N": "i32", "K": "i32",
            "stride_wn": "i32", "eps": "float"}  # fmt: skip
    shapes = [(shape, cfg, False) for shape, cfg in fp8_gemv.FP8_GEMV_CONFIGS.items()]
    shapes += [(shape, cfg, True) for shape, cfg in fp8_gemv.GLU_CONFIGS.items()]
    for card in (fp8_gemv.CARD_FP8_GEMV_CONFIGS, fp8_gemv.CARD_GLU_CONFIGS):  # other cards' too
        glu = card is fp8_gemv.CARD_GLU_CONFIGS
        shapes += [(shape, cfg, glu) for table in card.values() for shape, cfg in table.items()]
    rows = []
    for (n, k), cfg, glu in shapes:
        pro = int(n > k)  # a Llama layer's widening products (qkv, w13) take a normed input
        for a16, codes in ((False, False), (True, False), (False, True)):
            if codes and not glu:  # codes out: the GLU form's (GLU_CODES)
                continue
            constexprs = {"RESID": not glu and pro == 0, "BLOCK_N": cfg.block_n,
                          "BLOCK_K": cfg.block_k, "EVICT": cfg.evict, "PDL": True, "GLU": glu,
                          "A16": a16, "PRO": pro if a16 else 0, "CODES": codes,
                          "SPLIT": 1}  # fmt: skip
            kinds = {
                **args,
                "q_ptr": "bf16" if a16 else "e4m3",
                "y_ptr": "e4m3" if codes else "bf16",
                "part_ptr": "bf16",  # unread at split 1: the launch passes y
                "cnt_ptr": "bf16",
            }
            built = compile_for_hopper(_fp8_gemv_kernel, kinds, constexprs, cfg.num_warps)
            rows.append({"kernel": "fp8_gemv", "shape": [n, k], "glu": glu, "a16": a16,
                         "codes": codes, "pro": pro if a16 else 0,
                         "launch": [cfg.block_n, cfg.block_k, cfg.num_warps], **built})  # fmt: skip
    # K in slices (Fp8GemvConfig.split; codes in, plain, a residual): the 8B shape's w2 and wo
    # among the launches `fp8_bench.py --sweep --sweep-split` tries
    for (n, k), launch in (
        ((4096, 14336), (16, 512, 8, 2)),
        ((4096, 14336), (16, 256, 8, 4)),
        ((4096, 14336), (8, 512, 4, 7)),
        ((4096, 4096), (8, 512, 4, 2)),
    ):
        block_n, block_k, warps, split = launch
        constexprs = {"RESID": True, "BLOCK_N": block_n, "BLOCK_K": block_k,
                      "EVICT": "evict_first", "PDL": True, "GLU": False, "A16": False, "PRO": 0,
                      "CODES": False, "SPLIT": split}  # fmt: skip
        kinds = {**args, "part_ptr": "f32", "cnt_ptr": "i32p"}
        # aligned as a launch's pointers and sizes are: a slice whose alignment the compiler
        # cannot prove loads its weights a byte at a time (the hint in the kernel)
        aligned = tuple(name for name in kinds if name not in ("eps",))
        built = compile_for_hopper(_fp8_gemv_kernel, kinds, constexprs, warps, aligned)
        rows.append({"kernel": "fp8_gemv", "shape": [n, k], "split": split,
                     "launch": list(launch), **built})  # fmt: skip
    return rows


def static_scale_launches() -> list[dict]:
    """The kernels that take a static FP8 input scale or write codes, each way, at the 8B
    decode shape: the row kernels (STATIC) and the split-KV attention (CODES: wo's codes)."""
    from mathagent.serving.engine.cuda.attention_kernels import _attn_kernel
    from mathagent.serving.engine.cuda.fp8 import _quant_rows_kernel
    from mathagent.serving.engine.cuda.fp8_gemv_kernels import _fp8_row_kernel

    rows = []
    for static in (False, True):
        args = {"x_ptr": "bf16", "g_ptr": "bf16", "is_ptr": "f32", "q_ptr": "e4m3",
                "s_ptr": "f32", "n_ptr": "bf16", "K": "i32", "stride_x": "i32",
                "eps": "float"}  # fmt: skip
        consts = {"PRO": 1, "BLOCK": 4096, "PDL": True, "STATIC": static, "NORMED": static}
        rows.append({"kernel": "fp8_row", "static": static,
                     **compile_for_hopper(_fp8_row_kernel, args, consts, 8)})  # fmt: skip
        args = {"x_ptr": "bf16", "is_ptr": "f32", "q_ptr": "e4m3", "s_ptr": "f32", "K": "i32",
                "stride_x": "i32"}  # fmt: skip
        consts = {"BLOCK_K": 1024, "STATIC": static}
        rows.append({"kernel": "fp8_quant_rows", "static": static,
                     **compile_for_hopper(_quant_rows_kernel, args, consts, 4)})  # fmt: skip
    ptrs = {"q_ptr": "bf16", "k_ptr": "bf16", "v_ptr": "bf16", "slots_ptr": "i64p",
            "start_ptr": "i64p", "tree_ptr": "i8p", "m_ptr": "f32", "l_ptr": "f32",
            "acc_ptr": "f32", "cnt_ptr": "i32p", "out_ptr": "bf16", "pos_ptr": "i64p",
            "cos_ptr": "bf16", "sin_ptr": "bf16", "os_ptr": "f32", "qk_scale": "float"}  # fmt: skip
    strides = ("stride_qb", "stride_qt", "stride_qh", "stride_ks", "stride_kh", "stride_kp",
               "stride_ob", "stride_ot", "stride_oh")  # fmt: skip
    # (codes, wait): the last as a one-token step launches it (8 warps)
    for codes, wait in ((False, False), (True, False), (True, True)):
        args = {**ptrs, **dict.fromkeys(strides, "i32"), "out_ptr": "e4m3" if codes else "bf16"}
        consts = {"HKV": 8, "T": 1, "G": 4, "D": 128, "QROWS": 16, "PART": 64, "BLOCK_S": 64,
                  "NSPLIT": 16, "MAX_SEQ": 1024, "IEEE": False, "PDL": True, "ROPE": True,
                  "TP": 1, "GS": 1, "CODES": codes, "WAIT": wait, "NEW_IN_REGS": True,
                  "RROWS": 4, "MERGE_LOADS": 4}  # fmt: skip
        # the 8B shape's tensors and strides are multiples of 16, as the engine launches it
        aligned = tuple(name for name in args if name != "qk_scale")
        warps = 8 if wait else 4
        rows.append({"kernel": "attention", "codes": codes, "wait": wait,
                     **compile_for_hopper(_attn_kernel, args, consts, warps, aligned)})  # fmt: skip
    return rows


def decode_advance_launches() -> list[dict]:
    """The decode step's last launch (tokens to the host, inputs one step on) at the batch
    buckets it serves, one program of one warp each."""
    from mathagent.serving.engine.cuda import decode_advance

    args = {"tok_ptr": "i64p", "packed_ptr": "i64p", "host_ptr": "i64p", "scratch": "i32"}
    rows = []
    for batch in (1, 16, 64, 256):
        consts = {"B": batch, "BP": decode_advance.block(batch)}
        built = compile_for_hopper(decode_advance._advance_kernel, args, consts, 1)
        rows.append({"kernel": "decode_advance", "batch": batch, **built})
    return rows


if __name__ == "__main__":
    for row in decode_advance_launches():
        print(json.dumps(row), flush=True)
    for row in static_scale_launches():
        print(json.dumps(row), flush=True)
    for row in fp8_gemv_launches():
        print(json.dumps(row), flush=True)
