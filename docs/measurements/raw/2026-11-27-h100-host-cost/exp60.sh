#!/usr/bin/env bash
# Host time per checked call: enqueue time with the GPU held (host_cost.py), by shim configuration,
# with the temporary per-phase profile (QS_HOST_PROFILE=1, build with engine/host_profile.rs).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
shim() { env LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_SAMPLE=all QS_HOST_PROFILE=1 "$@"; }
one() { local label=$1; shift; "$@" python3 tests/gpu/host_cost.py "$label" --gemm $G 2>$OUT/err.txt | grep '^{' || tail -3 $OUT/err.txt; grep -h "host profile" $OUT/err.txt | sed 's/^/   /'; }
for G in bf16:512:4096:4096 fp8:512:4096:4096 bf16:4096:4096:4096; do
  echo "== $G (t=$((SECONDS - t0))s)"
  one plain env
  one off shim QUANTSHADOW_MODE=off
  one observe shim QUANTSHADOW_MODE=observe
  one on-stream shim QUANTSHADOW_MODE=sketch QUANTSHADOW_SKETCH_DETACH=off
  one on-stream-general shim QUANTSHADOW_MODE=sketch QUANTSHADOW_SKETCH_DETACH=off QUANTSHADOW_SKETCH_LEAN=0
  one on-stream-early shim QUANTSHADOW_MODE=sketch QUANTSHADOW_SKETCH_DETACH=off QUANTSHADOW_EARLY_START=1
  one detached shim QUANTSHADOW_MODE=sketch
  one plain-again env
done
echo "== end (t=$((SECONDS - t0))s)"
