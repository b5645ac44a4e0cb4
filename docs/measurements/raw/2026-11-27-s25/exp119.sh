#!/usr/bin/env bash
# Session 25: what the split check's finishing (side stream) costs the GEMMs beside it: the same
# build (.gpu/fe = 8092642 + fin_empty.patch) with and without QS_EXP_FIN_EMPTY (the finishing
# launched, event and wait included, but returning at once; results are lost, timing only).
source tests/gpu/common.sh
export PATH=$PWD/.gpu/fe:$PATH
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
for round in 1 2; do for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do
  for d in "QS_X=0" "QS_EXP_FIN_EMPTY=1"; do
    echo "-- $d r$round"; env QUANTSHADOW_KERNEL_DEFINES=$d LD_PRELOAD=$PWD/.gpu/fe/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
      timeout 100 python3 tests/gpu/eager_profile.py $g --calls 24 2>$OUT/err.txt | grep -E "checking|paused|qs_" | grep -v "t+"
  done
done; done
step end
