#!/usr/bin/env bash
# The branch-join fix: Llama small graph decode under sketch all (closing counts: the 4 dropped
# copies of exp68 should be checked now), then torch_ops and Llama small (outputs identical).
source tests/gpu/common.sh
md5sum .gpu/main/* | cut -c1-12,34-
for size in small 8b-width; do
  LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info \
    timeout 200 python3 tests/gpu/torch_llama.py $OUT/g.json --graph --graph-only --size $size >/dev/null 2>$OUT/g.err
  echo "$size: $(grep -hE "closing:" $OUT/g.err)"; grep -hE "skipped:|warn" $OUT/g.err | grep -v COLLECTOR | head -4
done
QUANTSHADOW_LOG=info timeout 200 bash tests/gpu/verify_shim.sh ops 2>&1 | grep -E "outputs"
grep -hE "closing:|skipped:" $OUT/ops_sketch.log | head -3
QUANTSHADOW_LOG=info timeout 300 bash tests/gpu/verify_shim.sh llama 2>&1 | tail -3
