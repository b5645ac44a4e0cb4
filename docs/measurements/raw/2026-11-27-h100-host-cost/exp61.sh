#!/usr/bin/env bash
# Host time per checked call, per phase, one-time work (>100 us) counted apart.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
shim() { env LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_SAMPLE=all QS_HOST_PROFILE=1 "$@"; }
one() { local label=$1; shift; "$@" python3 tests/gpu/host_cost.py "$label" --gemm $G --trials 15 2>$OUT/err.txt | grep '^{' || tail -3 $OUT/err.txt; grep -h "host profile" $OUT/err.txt | sed 's/^/   /'; }
for G in bf16:512:4096:4096 fp8:512:4096:4096; do
  echo "== $G (t=$((SECONDS - t0))s)"
  one plain env
  one observe shim QUANTSHADOW_MODE=observe
  one on-stream shim QUANTSHADOW_MODE=sketch QUANTSHADOW_SKETCH_DETACH=off
  one detached shim QUANTSHADOW_MODE=sketch
done
echo "== llama small prefill, on the stream (t=$((SECONDS - t0))s)"
shim QUANTSHADOW_MODE=sketch QUANTSHADOW_SKETCH_DETACH=off python3 tests/gpu/ab_pause.py "small on-stream" --llama small --trials 7 2>$OUT/err.txt | grep '^{'; grep -h "host profile" $OUT/err.txt | sed 's/^/   /'
echo "== end (t=$((SECONDS - t0))s)"
