#!/usr/bin/env bash
# Session 27, call 4 (.gpu/main: 638aae2 + proj_ablation2.patch, knobs default off): the split
# projections' skeleton (no A or D rows, 4.9 us in exp133) taken apart behind a real FP8 4096^3
# GEMM: without the W_R and sign loads, without the row draw and its barrier, returning right
# after the loop (no tree, no stores), all of them; and the full kernel returning after its loop.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
shim() { env LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all "$@"; }
prof() { echo "-- [$1] $2"; QUANTSHADOW_KERNEL_DEFINES="$1" shim timeout 100 python3 tests/gpu/eager_profile.py $2 --calls 24 2>$OUT/err.txt \
    | grep -E "checking|paused|qs_sketch_proj" | grep -v "t+" | sed 's/.*median GEMM-start/   GEMM-start/'; }
S="QS_EXP_NO_A=1 QS_EXP_NO_D=1"
step "skeleton parts, FP8 4096^3"
for d in "QS_X=0" "QS_EXP_PROJ_EMPTY=1" "$S" "$S QS_EXP_NO_W=1" "$S QS_EXP_NO_ROWBAR=1" "$S QS_EXP_RETURN_AFTER_LOOP=1" \
         "$S QS_EXP_NO_PROLOGUE=1" "$S QS_EXP_NO_W=1 QS_EXP_NO_ROWBAR=1 QS_EXP_RETURN_AFTER_LOOP=1 QS_EXP_NO_PROLOGUE=1" \
         "QS_EXP_RETURN_AFTER_LOOP=1" "QS_X=1"; do
  prof "$d" fp8:4096:4096:4096; done
step end
