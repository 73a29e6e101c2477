# Sourced by fp8_launch_ab.sh and fp8_record.sh (there, the repository root): the card check,
# the wheels, the environment, the time left, and the speed table's 8B rows.
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader > "$OUT/gpu.txt"
cat "$OUT/gpu.txt"
# a card other than CARD (the goals' card) is not this run's: no device time spent on it
case "$(cat "$OUT/gpu.txt")" in *"${CARD:-}"*) ;; *) exit 3;; esac
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .devrun/wheels/*.whl 2>&1 | tail -2
export MATHAGENT_CACHE_DIR=/tmp/mc PYTHONPATH=$PWD:$PWD/benchmarks:/tmp/site PYTHONUNBUFFERED=1
R=$PWD
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( ${BUDGET:-570} - $(elapsed) )); }
has() { case " $STEPS " in *" $1 "*) true;; *) false;; esac; }
table_rows() {  # bf16, FP8 static + head, and with the replay at acceptance 3: c1 and c16
  [ "$(left)" -gt 240 ] || { echo "no time for the table"; return 1; }
  (cd benchmarks && MATHAGENT_ENGINE__MAX_SEQ_LEN=1024 timeout "$(left)" python3 bench_table.py \
    --model random:llama-3-8b:stable --tokenizer "$R/.devrun/tok" \
    --bench-set "$R/.devrun/c1.jsonl" --bench-set "$R/.devrun/c16.jsonl" \
    --rows bf16,fp8-static-head,fp8-static-head+replay3 --work /tmp/btw \
    --out "$OUT/table8b.json" > "$OUT/table.log" 2>&1)
  echo "table rc=$? $(elapsed)s"; tail -c 1500 "$OUT/table.log"
}
