#!/usr/bin/env bash
# Why main's FP8 512-row calls cost less than base's on the stream (exp62): closing counts.
source tests/gpu/common.sh
for G in fp8:512:4096:4096 fp8:4096:4096:4096 bf16:512:4096:4096; do
  for cfg in "base QUANTSHADOW_SKETCH_DETACH=off" "main QUANTSHADOW_SKETCH_DETACH=graphs" "base QUANTSHADOW_SKETCH_DETACH=off" "main QUANTSHADOW_SKETCH_DETACH=graphs"; do
    set -- $cfg
    env LD_PRELOAD=$PWD/.gpu/$1/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info $2 \
      python3 tests/gpu/host_cost.py "$1 $2" --gemm $G --trials 15 2>$OUT/err.txt | grep '^{'
    grep -hE "closing:|skipped:|warn|error" $OUT/err.txt | head -4 | sed 's/^/   /'
  done
done
