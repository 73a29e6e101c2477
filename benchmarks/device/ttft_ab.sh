#!/usr/bin/env bash
# There (the device), with the wheels installed in /tmp/site (benchmarks/device/prepare.sh's
# .devrun/wheels, carried): eager against compiled blocks for the steps the CUDA graphs do not
# take (MATHAGENT_ENGINE__COMPILED_PREFILL), through benchmarks/ttft_probe.py: bf16 and fp8 on
# random weights of the default model's shape (with the embedded server), bf16 on the 8B shape.
# Needs no GGUF. One JSON each under $OUT (a .err beside it only where a run failed), a line
# each to stdout. TTFT_TIMEOUT (default 150 s) bounds each run; the compiled ones compile first.
# Usage: benchmarks/device/ttft_ab.sh [NAME...]   (NAME: one of the runs below; none: all)
set -uo pipefail
export PYTHONPATH=$PWD:$PWD/benchmarks:/tmp/site PYTHONUNBUFFERED=1 MATHAGENT_CACHE_DIR=/tmp/mc
wanted=" $* "
run() {  # NAME ttft_probe.py flags...
  local name=$1 start rc
  shift
  [ "$wanted" = "  " ] || [[ "$wanted" == *" $name "* ]] || return 0
  start=$(date +%s)
  (cd benchmarks && timeout "${TTFT_TIMEOUT:-150}" python3 ttft_probe.py "$@" \
    --out "$OUT/$name.json" > /dev/null 2> "$OUT/$name.err")
  rc=$?
  echo "$name rc=$rc $(($(date +%s) - start)) s"
  [ $rc -eq 0 ] && rm -f "$OUT/$name.err"
  python3 - "$OUT/$name.json" <<'P'
import json, sys
try:
    res = json.load(open(sys.argv[1]))
except Exception as e:  # the .err file says why
    sys.exit(f"  no JSON: {e}")
for row in res["rows"]:
    print(f"  {row['prompt_tokens']:4d} tokens: TTFT {row['ttft_ms']:6.1f} ms, prefill host "
          f"{row['prefill_host_ms']:6.1f} / done {row['prefill_done_ms']:6.1f} ms")
for row in res.get("server", []):
    print(f"  server {row['prompt_tokens']:4d}: client {row['client_ms']:6.1f} ms, "
          f"engine TTFT {row['engine_ttft_ms']:6.1f} ms")
P
}
run ttft_bf16_eager --server
run ttft_bf16_compiled --server --compiled-prefill
run ttft_fp8_eager --quantization fp8
run ttft_fp8_compiled --quantization fp8 --profile-length 0 --compiled-prefill
run ttft_8b_eager --model random:llama-3-8b --lengths 128 512 --reps 2 --profile-length 0
run ttft_8b_compiled --model random:llama-3-8b --lengths 128 512 --reps 2 --profile-length 0 \
  --compiled-prefill
