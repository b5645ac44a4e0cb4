#!/usr/bin/env bash
# Session 24: do the projections' stages follow W_R's bytes? Stage marks of qs_sketch_proj behind
# fp8 / bf16 4096^3 GEMMs at probes k = 8 and 16 (exp107 has k = 32), same build as exp107.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
shim() { env LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all "$@"; }
eval "$(sed -n '/^summ()/,/^}/p' docs/measurements/raw/2026-11-27-s24/exp107.sh)"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do for kp in 8 16; do
  echo "-- $g k=$kp"
  QUANTSHADOW_PROBES=$kp QUANTSHADOW_KERNEL_DEFINES=QS_SKETCH_TIMING=1 QUANTSHADOW_SKETCH_SPLIT=1 shim timeout 100 python3 tests/gpu/eager_profile.py $g --calls 24 > $OUT/tm.txt 2>$OUT/prof_err.txt
  grep -E "/call" $OUT/tm.txt | grep -E "proj|fin" | tail -2; summ $OUT/tm.txt
done; done
step end
