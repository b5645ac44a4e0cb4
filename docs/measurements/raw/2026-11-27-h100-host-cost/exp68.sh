#!/usr/bin/env bash
# Why 4 captured copies of the Llama small decode step are dropped (exp67): the skip reason now
# carries the driver's failing call and status. Graph-only decode under sketch all.
source tests/gpu/common.sh
md5sum .gpu/main/* | cut -c1-12,34-
LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info \
  timeout 200 python3 tests/gpu/torch_llama.py $OUT/g.json --graph --graph-only --size small >/dev/null 2>$OUT/g.err
grep -hE "closing:|skipped:|warn" $OUT/g.err | head -8
