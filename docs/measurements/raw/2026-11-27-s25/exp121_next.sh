#!/usr/bin/env bash
# Prepared in session 25 for the next session (not run): e4m3 A at 2 units per warp and
# iteration instead of 3 (QS_LEAN_UNITS_E4M3, a compile define: one build, A/B by
# QUANTSHADOW_KERNEL_DEFINES). At 4096 x 4096 a split's 512-element slice is 16 units: 3 per
# warp leave warps 6 and 7 idle and the others 1.5x the work, and the ncu samples put 24% of
# the projections at the tree's first barrier (exp114). Interleaving the units (exp115) was
# slower for a reason not found; this keeps contiguous units. One build (.gpu/main).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "selftest of the build (session 25's review fixes: a corrupt window refused, the selftests and bench of eager calls on windows; not run on a GPU in session 25)"
timeout 300 quantshadow selftest --quick --only helpers,sketch,detached,early > $OUT/selftest.txt 2>&1
echo "rc $?"; grep -E "passed|failed|\| fail|row windows" $OUT/selftest.txt | head
step "bench sketch (eager windows now)"
timeout 200 quantshadow bench gpu --only sketch --m 4096 > $OUT/bench.txt 2>&1
grep -E "^\| sketch \|" $OUT/bench.txt | cut -c1-220
step "selftest with 2 units"
QUANTSHADOW_KERNEL_DEFINES=QS_LEAN_UNITS_E4M3=2 timeout 250 quantshadow selftest --quick --only sketch,detached > $OUT/selftest_u2.txt 2>&1
echo "rc $?"; grep -E "passed|failed|\| fail" $OUT/selftest_u2.txt | head
step "kernel timelines, 3 against 2 units"
for round in 1 2; do for g in fp8:4096:4096:4096 fp8:4096:14336:4096 fp8:4096:4096:14336; do for u in 3 2; do
  echo "-- units $u r$round $g"; env QUANTSHADOW_KERNEL_DEFINES=QS_LEAN_UNITS_E4M3=$u LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so \
    QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all timeout 100 python3 tests/gpu/eager_profile.py $g --calls 24 2>$OUT/err.txt \
    | grep -E "checking|paused|qs_" | grep -v "t+"
done; done; done
step end
