#!/usr/bin/env bash
# There (the device), from the repository root: issue 18's record commands on the code as it is
# (no variant): fp8_bench.py (FP8 static + head, per-token FP8, bf16: tok/s, x bf16, roofline),
# gpu_bench.py's speculation at acceptance 3 (x bf16 plain), then the speed table's 8B rows.
# gpu_bench.py writes $OUT/gpu_bench.json itself.
# Usage: CARD=H200 benchmarks/device/fp8_record.sh   (env as fp8_launch_ab.sh; STEPS
# "record spec table")
set -uo pipefail
. "$(dirname "$0")/fp8_env.sh"
STEPS=${STEPS:-record spec table}
if has record; then
  timeout 200 python3 benchmarks/fp8_bench.py --runs fp8-static-head fp8 none \
    --out "$OUT/record.json" > "$OUT/record.log" 2>&1
  echo "record rc=$? $(elapsed)s"; tail -c 400 "$OUT/record.log"
fi
if has spec && [ "$(left)" -gt 150 ]; then
  (cd benchmarks && timeout 150 python3 gpu_bench.py --only-spec --shapes llama-3-8b \
    --spec-dtype bfloat16 fp8-static-head --spec-batches 1 --acceptances 3 --skip-redrafter \
    > "$OUT/spec.log" 2>&1)
  echo "spec rc=$? $(elapsed)s"; tail -c 600 "$OUT/spec.log"
fi
if has table; then table_rows; fi
