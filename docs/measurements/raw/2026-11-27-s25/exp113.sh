#!/usr/bin/env bash
# Session 25: eager rows drawn from a window whose start the host computes (QS_ROWS_WINDOW,
# .gpu/win = the working tree after 81935de) against the base (.gpu/main = 81935de), one call.
# 1. selftest (helpers incl. "eager row windows", sketch, detached, split) on the new build;
# 2. stage marks of the split projections behind the GEMM (timing build), both builds;
# 3. kernel timeline (eager_profile), both builds; 4. ab_pause A/B, two rounds;
# 5. ncu stall details of the new projections (bench, one launch).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "selftest (win)"
timeout 200 .gpu/win/quantshadow selftest --quick --only helpers,sketch,detached --json $OUT/selftest.json > $OUT/selftest.txt 2>&1
echo "selftest rc $?"; grep -E "row windows|row permutation|passed|failed|FAIL" $OUT/selftest.txt | grep -v "| pass" | head; grep -E "row windows" $OUT/selftest.txt | cut -c1-200
eval "$(sed -n '/^summ()/,/^}/p' docs/measurements/raw/2026-11-27-s24/exp107.sh)"
step "stage marks behind the GEMM"
for b in main win; do for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do
  echo "-- $b $g"; QUANTSHADOW_KERNEL_DEFINES=QS_SKETCH_TIMING=1 QUANTSHADOW_SKETCH_SPLIT=1 env LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
    timeout 100 python3 tests/gpu/eager_profile.py $g --calls 24 > $OUT/tm.txt 2>$OUT/err.txt; summ $OUT/tm.txt
done; done
step "kernel timeline"
for b in main win; do for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do
  echo "-- $b"; env LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
    timeout 100 python3 tests/gpu/eager_profile.py $g --calls 24 2>$OUT/err.txt | grep -E "checking|paused|qs_" | grep -v "t+" 
done; done
ab() { env $4 QUANTSHADOW_LOG=info LD_PRELOAD=$PWD/.gpu/$3/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  timeout 150 python3 tests/gpu/ab_pause.py "$1" $2 2>$OUT/ab_err.txt | grep '^{' | cut -c1-160 || tail -3 $OUT/ab_err.txt
  grep -hE "skipped:" $OUT/ab_err.txt | grep -v paused | sed 's/^/   /' | cut -c1-200 | head -3; }
step "ab_pause A/B"
for round in 1 2; do for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do
  ab "$g main r$round" "--gemm $g --trials 11 --passes 50" main QUANTSHADOW_X=0
  ab "$g win r$round" "--gemm $g --trials 11 --passes 50" win QUANTSHADOW_X=0
done; done
step "ncu (win)"
timeout 200 ncu --kernel-name regex:qs_sketch_proj_e4m3fn --launch-skip 20 --launch-count 1 \
  --section WarpStateStats --section SourceCounters --section SpeedOfLight --print-details all \
  .gpu/win/quantshadow bench gpu --only sketch --m 4096 --probes 32 > $OUT/ncu_win.txt 2>&1
echo "ncu rc $?"; grep -E "Duration|Stall|stall" $OUT/ncu_win.txt | head -40
step end
