#!/usr/bin/env bash
# There (the device), after calls that left .devrun/gg/g0, g1 and g2 in /tmp/gg and the wheels in
# /tmp/site: self-distil, train and measure an EAGLE-3 head for the default model in one call
# (scripts/eagle3_device_job.py), beside the shipped head on the same held-out transcripts.
# The head lands in $OUT/job/head and in /tmp/newhead (for ab.sh in the next call).
# Usage: benchmarks/device/eagle3_train.sh "eagle3_device_job.py flags"
#   DISTILL_DTYPE (default float32): the base's dtype for the transcripts, labels and features
#   needs .devrun/gg/g3 and .devrun/prompts_on.jsonl (scripts/drafter_prompts.py) carried
set -uo pipefail
. "$(dirname "$0")/model.sh"  # $G, $R, $D, PYTHONPATH
export MATHAGENT_MODEL=$G MATHAGENT_ENGINE__DEVICE=cuda MATHAGENT_ENGINE__DTYPE="${DISTILL_DTYPE:-float32}" \
  MATHAGENT_ENGINE__MAX_BATCH_SIZE=512 MATHAGENT_ENGINE__MAX_SEQ_LEN=1664
# shellcheck disable=SC2086  # the flags are words
timeout "${JOB_TIMEOUT:-570}" python3 scripts/eagle3_device_job.py --prompts .devrun/prompts_on.jsonl \
  --bench-prompts .devrun/bench20.jsonl --drafter $D/SmolLM2-135M-Instruct \
  --compare $D/SmolLM2-135M-Instruct-eagle3 --out "$OUT/job" --deadline-s 0 $1 > "$OUT/job.out" 2>&1
echo "job rc=$?"
grep -v '"event": "\(distill\|step\)' "$OUT/job.out" | tail -c 3000
rm -rf /tmp/newhead && cp -r "$OUT/job/head" /tmp/newhead 2>/dev/null && echo "head in /tmp/newhead"
