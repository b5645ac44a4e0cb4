#!/usr/bin/env bash
# After exp49-51: the lean snapshot copy takes device-pointer scalars (FP8 tensor scales), the
# exit handler waits for the batches it launches, batching off by default. Correctness, then
# the FP8 copy's time and the per-call costs again.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/main/* | cut -c1-12,34-
shim() { LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all "$@"; }
ab() {
  QUANTSHADOW_LOG=info timeout 150 python3 tests/gpu/ab_pause.py "$@" 2>$OUT/ab_err.txt | grep '^{' || tail -3 $OUT/ab_err.txt
  grep -hE "closing:|skipped:" $OUT/ab_err.txt | sed 's/^/   /'
}
step "selftest: detached (lean copy with device scalars; batched)"
timeout 200 quantshadow selftest --only helpers,detached 2>&1 | grep -E "detached|FAIL|passed|failed" | head -30
step "torch_ops under the shim (default: batch 1), then batch 5"
QUANTSHADOW_LOG=info timeout 200 bash tests/gpu/verify_detach.sh ops 2>&1 | tail -12
QUANTSHADOW_LOG=info QUANTSHADOW_SKETCH_BATCH=5 timeout 120 quantshadow run --mode sketch --label ops-batch5 --out $OUT/ops_batch5 -- \
  python3 tests/gpu/torch_ops.py $OUT/ops_batch5.json > $OUT/ops_batch5.log 2>&1
echo "ops batch 5: run exit $?; outputs $(same $OUT/ops_plain.json $OUT/ops_batch5.json)"
grep -E "^\*\*|Calls:" $OUT/ops_batch5/report.md | head -3
grep -hE "closing:|skipped:" $OUT/ops_batch5.log | head -3
step "the FP8 copy (eager_profile, default detached)"
shim timeout 100 python3 tests/gpu/eager_profile.py fp8:4096:4096:4096 --calls 10 2>&1 | grep -E "^==|/call" | head -12
QUANTSHADOW_SKETCH_BATCH=5 shim timeout 100 python3 tests/gpu/eager_profile.py fp8:4096:4096:4096 --calls 10 2>&1 | grep -E "^==|/call" | head -12
step "per call: FP8 4096^3 batch 5 / default / on the stream"
for g in fp8:4096:4096:4096; do
  QUANTSHADOW_SKETCH_BATCH=5 shim ab "batch5 $g" --gemm $g --trials 11 --passes 50
  shim ab "default $g" --gemm $g --trials 11 --passes 50
  QUANTSHADOW_SKETCH_DETACH=off shim ab "on-stream $g" --gemm $g --trials 11 --passes 50
done
step end
