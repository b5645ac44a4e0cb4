#!/usr/bin/env bash
# Session 26, call 1 (one build, .gpu/main): session 25's review fixes on the GPU (selftest with
# the corrupt-window case and the eager-window mirrors; the bench on eager windows), the new
# early-start selftest case of the split check, and the split projections started early
# (QUANTSHADOW_EARLY_START=1, now applied to qs_sketch_proj) against in order, in the profiler.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "selftest helpers,sketch,detached,early"
timeout 300 quantshadow selftest --quick --only helpers,sketch,detached,early > $OUT/selftest.txt 2>&1
echo "rc $?"; grep -E "passed|failed|\| fail|row windows|early|split" $OUT/selftest.txt | cut -c1-260 | head -30
step "bench sketch"
timeout 150 quantshadow bench gpu --only sketch --m 4096 > $OUT/bench.txt 2>&1
grep -E "^\| sketch" $OUT/bench.txt | cut -c1-240
step "split projections in order (0) against started early (1), profiler"
for round in 1 2; do for g in fp8:4096:4096:4096 bf16:4096:4096:4096 fp8:4096:14336:4096; do for e in 0 1; do
  echo "-- early $e r$round $g"; env QUANTSHADOW_EARLY_START=$e LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so \
    QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all timeout 100 python3 tests/gpu/eager_profile.py $g --calls 24 2>$OUT/err.txt \
    | grep -E "checking|paused|qs_|nvjet" | grep -v "t+"
done; done; done
step end
