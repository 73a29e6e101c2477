#!/usr/bin/env bash
# There (the device), from the repository root: which one-row launch settings make the FP8 8B
# decode step faster on this card, judged through the engine.
#   1. fp8_step_probe.py times the engine's own captured decode graph (fp8-static-head, CONTEXT
#      cached positions) with each variant of VARIANTS (a file, one --variants spec a line); its
#      `combined` is the winners, one a setting, that beat the shipped graph beyond its drift.
#   2. fp8_bench.py through LLMEngine, separate processes: shipped and `combined`, each with bf16
#      beside it, then both again without bf16, as the goals are stated (tok/s, x bf16, roofline).
#   3. The speed table's 8B rows (bench_table.py), if time is left.
# A winner goes into the card's launch tables (fp8_gemv.py) only if step 2 gains; then
# fp8_record.sh measures the shipped code.
# Usage: CARD=H200 VARIANTS=benchmarks/device/fp8_launch_variants_h200.txt \
#          benchmarks/device/fp8_launch_ab.sh
# Env: STEPS ("probe ab table"), BUDGET (s, 570), COMBO (skip the probe's pick), CONTEXT (160),
# CARD (exit 3 on another card); needs the wheels of prepare.sh in .devrun/wheels, and for the
# table .devrun/tok, .devrun/c1.jsonl and .devrun/c16.jsonl (all carried).
set -uo pipefail
. "$(dirname "$0")/fp8_env.sh"  # the card check, the wheels, PYTHONPATH, left / has
STEPS=${STEPS:-probe ab table}
if has probe; then
  mapfile -t V < <(grep -v '^#' "${VARIANTS:?a file of variants}")
  timeout 300 python3 benchmarks/fp8_step_probe.py --quantizations fp8-static-head \
    --context "${CONTEXT:-160}" --variants "${V[@]}" --out "$OUT/probe.json" > "$OUT/probe.log" 2>&1
  echo "probe rc=$? $(elapsed)s"; grep -v "^{" "$OUT/probe.log" | tail -25
fi
COMBO=${COMBO:-$(python3 - "$OUT/probe.json" 2> "$OUT/pick.txt" <<'P'
import json, sys
r = json.load(open(sys.argv[1]))["fp8-static-head"]
print({k: r.get(k) for k in ("whole_ms", "whole_mid_ms", "whole_again_ms", "winners")}, file=sys.stderr)
print(r["combined"])
P
)}
cat "$OUT/pick.txt" 2>/dev/null; echo "combo: $COMBO"
ab() {  # NAME VARIANT RUNS...: one fp8_bench.py process
  local name=$1 var=$2; shift 2
  [ "$(left)" -lt 80 ] && { echo "no time for $name"; return 1; }
  timeout "$(left)" python3 benchmarks/fp8_bench.py --variant "$var" --runs "$@" \
    --out "$OUT/ab_$name.json" > "$OUT/ab_$name.log" 2>&1
  echo "$name rc=$? $(elapsed)s $(python3 - "$OUT/ab_$name.json" 2>&1 <<'P' | tail -1
import json, sys
d = json.load(open(sys.argv[1])); r = d["fp8-static-head"]
print(round(r["b1"]["steady_tok_s"], 1), round(r["graph_ms"]["1x1"], 4),
      round(r["b1_fraction_of_roofline"], 4), d.get("fp8_static_head_over_bf16_b1"))
P
)"
}
if has ab && [ -n "$COMBO" ]; then
  ab shipped1 "" fp8-static-head none && ab combo1 "$COMBO" fp8-static-head none \
    && ab shipped2 "" fp8-static-head && ab combo2 "$COMBO" fp8-static-head
fi
if has table; then table_rows; fi
