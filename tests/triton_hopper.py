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

_TYPES = {"bf16": "*bf16", "f32": "*fp32", "e4m3": "*fp8e4nv", "i32": "i32", "float": "fp32"}


def compile_for_hopper(fn, args: dict[str, str], constexprs: dict, num_warps: int) -> dict:
    """Build ``fn`` (a ``triton.jit`` function) for sm_90a: its registers and spilled bytes."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {name: _TYPES[kind] for name, kind in args.items()}
    signature.update({name: "constexpr" for name in constexprs})
    src = ASTSource(fn=fn, signature=signature,
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
    rows = []
    for (n, k), cfg, glu in shapes:
        pro = int(n > k)  # a Llama layer's widening products (qkv, w13) take a normed input
        for a16, codes in ((False, False), (True, False), (False, True)):
            if codes and not glu:  # codes out: the GLU form's (GLU_CODES)
                continue
            constexprs = {"RESID": not glu and pro == 0, "BLOCK_N": cfg.block_n,
                          "BLOCK_K": cfg.block_k, "EVICT": cfg.evict, "PDL": True, "GLU": glu,
                          "A16": a16, "PRO": pro if a16 else 0, "CODES": codes}  # fmt: skip
            kinds = {
                **args,
                "q_ptr": "bf16" if a16 else "e4m3",
                "y_ptr": "e4m3" if codes else "bf16",
            }
            built = compile_for_hopper(_fp8_gemv_kernel, kinds, constexprs, cfg.num_warps)
            rows.append({"kernel": "fp8_gemv", "shape": [n, k], "glu": glu, "a16": a16,
                         "codes": codes, "pro": pro if a16 else 0, **built})  # fmt: skip
    return rows


if __name__ == "__main__":
    for row in fp8_gemv_launches():
        print(json.dumps(row), flush=True)
