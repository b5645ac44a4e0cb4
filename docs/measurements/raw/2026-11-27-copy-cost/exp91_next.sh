#!/usr/bin/env bash
# NOT RUN (prepared in session 21, no device time left): where Llama small's remaining graph
# decode overhead (-11.4% / -11.8% tokens/s in exp90) goes now that the decoder checks run
# beside the vocabulary projection: the vocabulary projection's own duration beside 28 checks
# (against plain), the tail after the last production kernel, and the last check's stages.
# .gpu/main = this tree. Run exp90.sh first with .gpu/main = this tree and .gpu/base = 4f2d481:
# the review fixes of 0d4218b (the checks-beside conditions, HIP copy stream) have not run on a GPU.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/main/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "plain: one replay's timeline"
timeout 300 python3 tests/gpu/llama_graph_floor.py plain --size small --variants plain --profile 2>&1 \
  | grep -E "^\||replay|checks on" | tail -60
step "shim: one replay's timeline"
LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  timeout 300 python3 tests/gpu/llama_graph_floor.py shim --size small --variants plain --profile 2>&1 \
  | grep -E "^\||replay|checks on" | tail -90
step "shim: stage marks of the checks (QS_SKETCH_TIMING=2), last replays"
QUANTSHADOW_KERNEL_DEFINES="QS_SKETCH_TIMING=2" QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so timeout 300 python3 tests/gpu/torch_llama.py $OUT/t.json \
  --graph --graph-only --timing --size small --trials 3 > $OUT/abs.txt 2>&1
grep QS_TIMING_ABS $OUT/abs.txt | tail -29 | awk '{print}' | sort -k2 | head -40
step end
