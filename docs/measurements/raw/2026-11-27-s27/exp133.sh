#!/usr/bin/env bash
# Session 27, call 1 (.gpu/main: d32f86f + ablation knobs, proj_ablation.patch): where the split
# projections' ~7 us go behind a real FP8 4096^3 GEMM (k = 16): stage marks (QS_SKETCH_TIMING=1),
# then the projections' duration with one part taken out at a time (QS_EXP_* kernel defines;
# the results are wrong by design, only the timings count).
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
prof() { echo "-- [$1] $2"; QUANTSHADOW_KERNEL_DEFINES="$1" shim timeout 100 python3 tests/gpu/eager_profile.py $2 --calls 24 2>$OUT/err.txt \
    | grep -E "checking|qs_sketch_proj" | grep -v "t+" | sed 's/.*median GEMM-start/   GEMM-start/'; }
step "ablations, FP8 4096^3"
for d in "QS_X=0" "QS_EXP_PROJ_EMPTY=1" "QS_EXP_NO_DRAW=1" "QS_EXP_NO_PROLOGUE=1" "QS_EXP_RAW_E4M3=1" "QS_EXP_NO_MMA=1" \
         "QS_EXP_NO_TREE=1" "QS_EXP_NO_A=1" "QS_EXP_NO_D=1" "QS_EXP_NO_A=1 QS_EXP_NO_D=1" \
         "QS_EXP_NO_MMA=1 QS_EXP_NO_TREE=1 QS_EXP_NO_PROLOGUE=1" "QS_X=1"; do
  prof "$d" fp8:4096:4096:4096; done
step "ablations, bf16 4096^3"
for d in "QS_X=0" "QS_EXP_PROJ_EMPTY=1" "QS_EXP_NO_MMA=1" "QS_EXP_NO_TREE=1" "QS_EXP_NO_A=1 QS_EXP_NO_D=1"; do
  prof "$d" bf16:4096:4096:4096; done
step end
