#!/usr/bin/env bash
# Batched eager checks: issue 3's per-call cost, one GEMM back to back (ab_pause.py, in-process),
# batch 5 / 3 / 1 / on the stream; then the small Llama prefill.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
shim() { LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all "$@"; }
ab() {
  QUANTSHADOW_LOG=info timeout 120 python3 tests/gpu/ab_pause.py "$@" 2>$OUT/ab_err.txt | grep '^{' || tail -3 $OUT/ab_err.txt
  grep -hE "closing:|skipped:" $OUT/ab_err.txt | sed 's/^/   /'
}
step "issue 3: one GEMM A/B"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096 fp8:512:4096:4096 bf16:512:4096:4096 fp8:4096:14336:4096 fp8:4096:4096:14336; do
  shim ab "batch5 $g" --gemm $g --trials 11 --passes 50
  [ "${g%%:*}" = fp8 ] && [ "$g" = fp8:4096:4096:4096 ] && QUANTSHADOW_SKETCH_BATCH=3 shim ab "batch3 $g" --gemm $g --trials 11 --passes 50
  QUANTSHADOW_SKETCH_BATCH=1 shim ab "batch1 $g" --gemm $g --trials 11 --passes 50
  QUANTSHADOW_SKETCH_DETACH=off shim ab "on-stream $g" --gemm $g --trials 11 --passes 50
done
step "small Llama prefill"
shim ab "small batch5" --llama small
QUANTSHADOW_SKETCH_DETACH=off shim ab "small on-stream" --llama small
step end
