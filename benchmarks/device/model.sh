# Sourced by the device scripts (ab.sh, eagle3_train.sh), from the repository root: the default
# model's GGUF put together from its carried parts (g0, g1 and g2 left in /tmp/gg by earlier
# calls, g3 carried in this one; benchmarks/device/prepare.sh) as $G, the tree's paths $R and $D,
# and the environment every run shares.
G=/tmp/gg/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f $G ] || cat /tmp/gg/g0 /tmp/gg/g1 /tmp/gg/g2 .devrun/gg/g3 > $G
[ "$(md5sum < $G | cut -c1-32)" = a1231443440b107ff29f02bdb38c9d0a ] || { echo "no GGUF"; exit 3; }
R=$PWD D=$PWD/mathagent/serving/drafters
export PYTHONPATH=$R:$R/benchmarks:/tmp/site MATHAGENT_CACHE_DIR=/tmp/mc PYTHONUNBUFFERED=1
