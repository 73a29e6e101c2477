#!/usr/bin/env bash
# Here (the CPU host), before a device session: everything a default-model run on the device
# needs that the tracked tree does not carry, under .devrun/ (ignored; `carry` it):
#   .devrun/gg/g0 .. g3  the default model's GGUF in four parts (one call carries 64 MiB at
#                        most, the tree itself ~31 MB): g0 with the wheels, g1 and g2 alone,
#                        g3 with the run
#   .devrun/wheels/      the pure-Python packages the device's image lacks (pydantic, gguf, ...)
#   .devrun/bench20.jsonl  the agent's rendered prompts for GSM8K test 1-20 (the device has no
#                        openai package for mathagent.agent)
#   .devrun/tok, c1.jsonl, c16.jsonl  the default model's tokenizer and the speed table's bench
#                        sets at concurrency 1 and 16 (GSM8K test 101-108, 109-140), for
#                        fp8_launch_ab.sh / fp8_record.sh's 8B rows
# Usage: benchmarks/device/prepare.sh   (from the repository root, after `make setup`)
set -euo pipefail
G=${GGUF:-$HOME/.cache/mathagent/models/SmolLM2-135M-Instruct.Q4_1.gguf}
mkdir -p .git/info && touch .git/info/exclude
grep -qx '/.devrun/' .git/info/exclude || echo '/.devrun/' >> .git/info/exclude
mkdir -p .devrun/gg .devrun/wheels
part() { dd if="$G" of=".devrun/gg/$1" bs=1M iflag=skip_bytes,count_bytes skip="$2" ${3:+count=$3} status=none; }
# a call carries 64 MiB with the tree (~31 MB since three heads are tracked): the wheels and
# g0 in the first call, g1 and g2 alone, g3 with the run itself
rm -f .devrun/gg/g*
part g0 0 22000000
part g1 22000000 32000000
part g2 54000000 32000000
part g3 86000000
[ "$(cat .devrun/gg/g* | md5sum | cut -c1-32)" = "$(md5sum < "$G" | cut -c1-32)" ]
# the versions this checkout's .venv runs, for CPython 3.12 on x86-64 (the device's python3)
pkgs="pydantic pydantic_core pydantic-settings annotated-types typing-inspection python-dotenv
gguf pytest-asyncio typing_extensions openai httpx2 httpcore2 httpx httpcore h11 truststore jiter sniffio
anyio fastapi starlette annotated-doc uvicorn opentelemetry-api importlib_metadata zipp docker
math-verify latex2sympy2_extended antlr4-python3-runtime openai-harmony prometheus_client"
for p in $pkgs; do
  v=$(.venv/bin/pip show "$p" 2>/dev/null | sed -n 's/^Version: //p' || true)
  [ -n "$v" ] || continue  # not a dependency here: not one there either
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .devrun/wheels "$p==$v" 2>/dev/null || echo "no wheel: $p"
done
head -20 ../shared/datasets/gsm8k_test.jsonl > .devrun/gsm8k20.jsonl
sed -n 101,108p ../shared/datasets/gsm8k_test.jsonl > .devrun/c1.jsonl
sed -n 109,140p ../shared/datasets/gsm8k_test.jsonl > .devrun/c16.jsonl
.venv/bin/python -c "import sys; from transformers import AutoTokenizer
AutoTokenizer.from_pretrained(sys.argv[1], gguf_file=sys.argv[2]).save_pretrained('.devrun/tok')" \
  "$(dirname "$G")" "$(basename "$G")" 2>/dev/null
(cd benchmarks && PYTHONPATH=..:. ../.venv/bin/python gpu_default_model.py --default-model "$G" \
  --drafter ../mathagent/serving/drafters/SmolLM2-135M-Instruct --prompts ../.devrun/gsm8k20.jsonl \
  --default-limit 20 --render-prompts ../.devrun/bench20.jsonl 2>/dev/null)
du -sh .devrun/gg/* .devrun/wheels .devrun/bench20.jsonl .devrun/tok
