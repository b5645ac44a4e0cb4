#!/usr/bin/env bash
# Prepared in session 26 for the next session (not run): where the split projections' ~7 us go
# at the new defaults (k = 16, e4m3 at 2 units), stage marks behind a real GEMM (timing build:
# QUANTSHADOW_KERNEL_DEFINES=QS_SKETCH_TIMING=1; marks are directional only, session 25), and
# the finishing's cost to the next FP8 GEMM (the GEMM ran 1.3-1.8 us longer while checking in
# exp122/exp128; QS_EXP_FIN_EMPTY is gone since session 25, so this compares the GEMM kernel's
# own duration paused and checking over more calls). One build (.gpu/main).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
shim() { env LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all "$@"; }
eval "$(sed -n '/^summ()/,/^}/p' docs/measurements/raw/2026-11-27-s24/exp107.sh)"
step "stage marks behind the GEMM (k = 16)"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do
  echo "-- $g"; QUANTSHADOW_KERNEL_DEFINES=QS_SKETCH_TIMING=1 shim timeout 100 python3 tests/gpu/eager_profile.py $g --calls 24 > $OUT/tm_gemm.txt 2>$OUT/err.txt
  grep -E "/call" $OUT/tm_gemm.txt | grep proj; summ $OUT/tm_gemm.txt
done
step "the GEMM's own duration, paused against checking (96 calls, three rounds)"
for r in 1 2 3; do for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do
  echo "-- r$r $g"; shim timeout 100 python3 tests/gpu/eager_profile.py $g --calls 96 2>$OUT/err.txt | grep -E "checking|paused|nvjet|qs_" | grep -v "t+"
done; done
step end
