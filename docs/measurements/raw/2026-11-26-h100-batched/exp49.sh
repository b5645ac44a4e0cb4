#!/usr/bin/env bash
# Batched eager checks (QUANTSHADOW_SKETCH_BATCH, engine/eager_batch.rs): correctness first
# (selftest: batched = one by one; torch_ops under the shim), then issue 4's Llama prefill A/B
# in-process (ab_pause.py), batch 5 (default) against 1 (one by one on the side stream, the old
# default) and against the check on the stream.
# Staging: bash ../shared/gpu/pack.sh && mkdir -p .gpu/main && mv .gpu/quantshadow .gpu/libquantshadow.so .gpu/main/ && strip .gpu/main/*
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/main/* | cut -c1-12,34-
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
shim() { LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all "$@"; }
ab() {
  QUANTSHADOW_LOG=info timeout 150 python3 tests/gpu/ab_pause.py "$@" 2>$OUT/ab_err.txt | grep '^{' || tail -3 $OUT/ab_err.txt
  grep -hE "closing:|skipped:" $OUT/ab_err.txt | sed 's/^/   /'
}
step "selftest: detached (batched = one by one) and the lean sketch cases"
timeout 200 quantshadow selftest --only detached --json $OUT/selftest_detached.json 2>&1 | grep -E "batched|FAIL|passed|failed|header|H100|H200" | head -20
timeout 150 quantshadow selftest --quick --only sketch 2>&1 | grep -E "FAIL|passed|failed" | head -10
step "torch_ops under the shim, batched (default): outputs identical, PASS"
QUANTSHADOW_LOG=info timeout 200 bash tests/gpu/verify_detach.sh ops 2>&1 | tail -12
grep -hE "closing:|skipped:" $OUT/ops_detach_on.log | head -3
step "issue 4: Llama 8b-width prefill A/B, batch 5 / batch 1 / on the stream"
for p in 1 2; do
  shim ab "8b-width batch5 p$p" --llama 8b-width
  QUANTSHADOW_SKETCH_BATCH=1 shim ab "8b-width batch1 p$p" --llama 8b-width
  QUANTSHADOW_SKETCH_DETACH=off shim ab "8b-width on-stream p$p" --llama 8b-width
done
step end
