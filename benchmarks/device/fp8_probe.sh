#!/usr/bin/env bash
# There (the device), from the repository root, after the wheels were installed in /tmp/site:
# the FP8 8B-shape step's anatomy and settings (fp8_step_probe.py: ablations, then each
# variant, fp8 only), then the engine figures (fp8_bench.py) under the
# fastest fp8 variant the probe found (none where nothing beat the default).
# Usage: benchmarks/device/fp8_probe.sh VARIANT...   (fp8_step_probe.py --variants syntax)
set -uo pipefail
export PYTHONPATH=$PWD:$PWD/benchmarks:/tmp/site PYTHONUNBUFFERED=1
timeout "${PROBE_TIMEOUT:-220}" python3 benchmarks/fp8_step_probe.py --ablate --out "$OUT/probe.json" \
  --quantizations fp8 none --variants "$@" > "$OUT/probe.log" 2>&1
echo "probe rc=$?"
grep -v "^{" "$OUT/probe.log" | tail -40 | cut -c1-200
best=$(python3 - "$OUT/probe.json" <<'P'
import json, sys
d = json.load(open(sys.argv[1]))["fp8"]
timed = [(v, k[8:]) for k, v in d.items() if k.startswith("variant ") and isinstance(v, float)]
ms, spec = min(timed) if timed else (float("inf"), "")
print(spec if ms < d["whole_ms"] else "")
P
)
echo "best=$best"
timeout "${BENCH_TIMEOUT:-150}" python3 benchmarks/fp8_bench.py --runs fp8 none --variant "$best" \
  --out "$OUT/bench.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
tail -c 1500 "$OUT/bench.log"
