#!/usr/bin/env bash
# Session 25: kernel parameters' cache lines requested at once at the start of the lean and
# projection kernels (qs_prefetch_params, __grid_constant__; .gpu/gc = 8092642 + that change)
# against the row-window build (.gpu/win = 8092642) and the base (.gpu/base = 81935de).
# (The interleaved units of exp115 were slower for FP8 and are not in this build.)
source tests/gpu/common.sh
export PATH=$PWD/.gpu/gc:$PATH
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "selftest (gc)"
timeout 250 .gpu/gc/quantshadow selftest --quick --only sketch,detached --json $OUT/selftest.json > $OUT/selftest.txt 2>&1
echo "selftest rc $?"; grep -E "passed|failed|\| fail" $OUT/selftest.txt | head
step "kernel timeline"
for round in 1 2; do for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do for b in base win gc; do
  echo "-- $b r$round"; env LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
    timeout 100 python3 tests/gpu/eager_profile.py $g --calls 24 2>$OUT/err.txt | grep -E "checking|paused|qs_" | grep -v "t+"
done; done; done
step "fused lean check (SPLIT=0) timeline"
for b in win gc; do
  echo "-- $b"; env QUANTSHADOW_SKETCH_SPLIT=0 LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
    timeout 100 python3 tests/gpu/eager_profile.py fp8:4096:4096:4096 --calls 24 2>$OUT/err.txt | grep -E "checking|qs_" | grep -v "t+"
done
step end
