#!/usr/bin/env bash
# What sets the 48-GEMM decode graph's end-of-replay tail (48 one-row checks at once): W_R bytes
# (k = 32, 16, 8 probes: W_R is K x k f32) or latency. Current build (.gpu/main = base 54fdfe3).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
md5sum .gpu/main/* | cut -c1-12,34-
echo "plain $(timeout 150 python3 tests/gpu/overhead_mlp.py --repeat 8)"
for k in 32 16 8; do
  QUANTSHADOW_PROBES=$k QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so \
    timeout 300 python3 tests/gpu/graph_profile.py probes$k --repeat 8 --timeline > $OUT/timeline_k$k.txt 2>&1
  grep -E "checks on|per replay without" $OUT/timeline_k$k.txt | head -3
  echo "k=$k $(QUANTSHADOW_PROBES=$k QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so timeout 150 python3 tests/gpu/overhead_mlp.py --repeat 8 2>/dev/null)"
done
