#!/usr/bin/env bash
# There (the device), after calls that left .devrun/gg/g0, g1 and g2 in /tmp/gg and the wheels in
# /tmp/site: the default model's EAGLE-3 runs, one JSON each under $OUT, a line each to stdout.
# Usage: benchmarks/device/ab.sh NAME "gpu_default_model.py flags" [NAME "flags" ...]
# e.g.   benchmarks/device/ab.sh greedy_glue_off "--chain-glue off" greedy_glue_on "--chain-glue on"
# Each run: 20 agent prompts x 256 tokens, bf16, chains of 4 (the default), plain / EAGLE-3 fixed / auto;
# AB_TIMEOUT (default 170 s) bounds each one; the first run on a fresh machine also compiles the
# kernels (run 113: a 45 s run hit a 100 s bound).
set -uo pipefail
. "$(dirname "$0")/model.sh"  # $G, $R, $D, PYTHONPATH
while [ $# -gt 1 ]; do
  name=$1 flags=$2; shift 2
  start=$(date +%s)
  # shellcheck disable=SC2086  # the flags are words
  (cd benchmarks && timeout "${AB_TIMEOUT:-170}" python3 gpu_default_model.py --default-model $G \
    --drafter $D/SmolLM2-135M-Instruct --eagle3 $D/SmolLM2-135M-Instruct-eagle3 \
    --prompts $R/.devrun/bench20.jsonl --default-limit 20 --default-max-tokens 256 \
    --default-methods= --default-beams 1 --default-dtype bfloat16 --default-draft-len 4 \
    --model-dir /tmp/mc/conv $flags > "$OUT/$name.json" 2> "$OUT/$name.err")
  rc=$?
  echo "$name rc=$rc $(($(date +%s) - start)) s"
  # a call brings back 8 files at most: a run's .err only where it failed
  [ $rc -eq 0 ] && rm -f "$OUT/$name.err"
  python3 - "$OUT/$name.json" <<'P'
import json, sys
try:
    methods = json.load(open(sys.argv[1]))["methods"]
except Exception as e:  # the .err file says why
    sys.exit(f"  no JSON: {e}")
for name, m in methods.items():
    step = m.get("step_ms_by_place", {}).get("middle", {}).get("mean_ms")
    pos = [round(x, 2) for x in m.get("per_position_acceptance", [])]
    print(f"  {name:14s} {m['decode_tokens_per_s']:8.1f} tok/s {m['speedup']:.3f}x "
          f"AL {m.get('acceptance_length', 1):.2f} step {step} ms {pos}"
          f"{'' if m.get('identical_to_plain_greedy') else ' diverged: %s' % m.get('divergent')}")
P
done
