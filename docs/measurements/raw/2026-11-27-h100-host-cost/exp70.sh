#!/usr/bin/env bash
# The before-stop clean-up build (entries looked up once per path, prepare_sketch_check_with):
# selftest sketch/detached/ring, torch_ops (default) and Llama small graph decode counts.
source tests/gpu/common.sh
md5sum .gpu/main/* | cut -c1-12,34-
timeout 300 quantshadow selftest --quick --only ring,detached,sketch 2>&1 | grep -E "FAIL|passed|failed" | head -10
QUANTSHADOW_LOG=info timeout 200 bash tests/gpu/verify_shim.sh ops 2>&1 | grep -E "outputs"
grep -hE "closing:|skipped:" $OUT/ops_sketch.log | head -3
LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info \
  timeout 200 python3 tests/gpu/torch_llama.py $OUT/g.json --graph --size small >/dev/null 2>$OUT/g.err
grep -hE "closing:|skipped:" $OUT/g.err
