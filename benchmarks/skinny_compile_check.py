"""Compile, without a GPU, every skinny kernel that ``skinny_sweep.py`` would time, for sm_90a.

Triton compiles ahead of time for a named target, and its bundled ``ptxas -v`` reports registers
and spills per kernel, so launch shapes that cannot compile, spill, or compile slowly are found
before any device time is spent (benchmarks/GPU_NOTES.md, "Skinny product"). Needs Triton
installed where torch is (a CPU machine will do: e.g. ``pip install --target /tmp/tri
triton==3.6.0``, the device's version, then ``PYTHONPATH=.:/tmp/tri``). One JSON line per kernel.

    PYTHONPATH=.:/tmp/tri python benchmarks/skinny_compile_check.py > compile.jsonl
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.dirname(__file__))

import skinny_sweep as sweep

from mathagent.serving.engine.cuda import skinny as sk

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
TYPES = {"float32": "fp32", "bfloat16": "bf16"}
SPECS = (("smollm2-135m:float32", sweep.ROWS), ("smollm2-135m:bfloat16", sweep.ROWS),
         ("llama-3-8b:bfloat16", sweep.BIG_ROWS))  # fmt: skip


def compile_one(
    dtype: str, k: int, mp: int, cfg: sk.SkinnyConfig, pro: int = 0, resid: bool = False,
    glu: bool = False,
) -> dict:  # fmt: skip
    """Registers, spilled bytes and seconds of one kernel compiled for sm_90a (``pro`` /
    ``resid`` / ``glu``: the fused form's prologue and epilogues)."""
    ty = TYPES[dtype]
    sig = {"x_ptr": f"*{ty}", "w_ptr": f"*{ty}", "y_ptr": f"*{ty}", "g_ptr": f"*{ty}",
           "r_ptr": f"*{ty}", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32",
           "stride_xm": "i32", "stride_wn": "i32", "eps": "fp32"}  # fmt: skip
    const = dict(K=k, MP=mp, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, DOT=cfg.dot,
                 IEEE=ty == "fp32", UNROLL=sk.unrolled(k, mp, cfg) or glu, EVICT=cfg.evict, PDL=True,
                 PRO=pro, RESID=resid, GLU=glu, SPLIT=cfg.split)  # fmt: skip
    sig.update(dict.fromkeys(const, "constexpr"))
    start = time.time()
    src = ASTSource(sk._skinny_kernel, sig, const)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": cfg.num_warps}).asm["ptx"]  # fmt: skip
    seconds = time.time() - start
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        log = subprocess.run([PTXAS, "-arch=sm_90a", "-v", f.name, "-o", os.devnull],
                             capture_output=True, text=True).stderr  # fmt: skip
    regs, spill = (
        re.search(r"Used (\d+) registers", log),
        re.search(r"(\d+) bytes spill stores", log),
    )
    return {"regs": int(regs[1]) if regs else None, "spill_bytes": int(spill[1]) if spill else None,
            "compile_s": round(seconds, 2), "ptx_has_pdl": "griddepcontrol" in ptx}  # fmt: skip


def main() -> None:
    kernels = {}
    for spec, rows in SPECS:
        model, dtype = spec.split(":")
        for (name, r), cfgs in sweep.plan(model, dtype, rows, False).items():
            k = sweep.uses(model)[name][1]
            for cfg in cfgs:
                kernels[dtype, k, sk.MAX_ROWS if cfg.dot else sk.bucket(r), cfg] = None
    for dtype, k, mp, cfg in kernels:
        row = {"dtype": dtype, "k": k, "mp": mp, **cfg.__dict__}
        try:
            row.update(compile_one(dtype, k, mp, cfg))
        except Exception as e:  # a kernel that does not compile: say why, go on
            row["error"] = str(e)[-300:]
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
