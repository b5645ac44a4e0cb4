#!/usr/bin/env bash
# Session 25: units interleaved over the warps in the lean body (.gpu/int = 8092642 + that
# change) against the row-window build (.gpu/win = 8092642) and the session's base
# (.gpu/base = 81935de), one call. Selftest of the new build (sketch claims, detached and split
# against in place), kernel timelines, stage marks, ab_pause, the bench's sketch table.
source tests/gpu/common.sh
export PATH=$PWD/.gpu/int:$PATH
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "selftest (int)"
timeout 250 .gpu/int/quantshadow selftest --quick --only sketch,detached --json $OUT/selftest.json > $OUT/selftest.txt 2>&1
echo "selftest rc $?"; grep -E "passed|failed|\| fail" $OUT/selftest.txt | head; grep -E "split = lean" $OUT/selftest.txt | cut -c1-220
step "kernel timeline"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do for b in base win int; do
  echo "-- $b"; env LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
    timeout 100 python3 tests/gpu/eager_profile.py $g --calls 24 2>$OUT/err.txt | grep -E "checking|paused|qs_" | grep -v "t+"
done; done
eval "$(sed -n '/^summ()/,/^}/p' docs/measurements/raw/2026-11-27-s24/exp107.sh)"
step "stage marks (int)"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do
  QUANTSHADOW_KERNEL_DEFINES=QS_SKETCH_TIMING=1 QUANTSHADOW_SKETCH_SPLIT=1 env LD_PRELOAD=$PWD/.gpu/int/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
    timeout 100 python3 tests/gpu/eager_profile.py $g --calls 24 > $OUT/tm.txt 2>$OUT/err.txt; summ $OUT/tm.txt
done
ab() { env $4 QUANTSHADOW_LOG=info LD_PRELOAD=$PWD/.gpu/$3/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  timeout 150 python3 tests/gpu/ab_pause.py "$1" $2 2>$OUT/ab_err.txt | grep '^{' | cut -c1-160 || tail -3 $OUT/ab_err.txt
  grep -hE "skipped:" $OUT/ab_err.txt | grep -v paused | sed 's/^/   /' | cut -c1-200 | head -3; }
step "ab_pause A/B"
for round in 1 2; do for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do
  ab "$g base r$round" "--gemm $g --trials 11 --passes 50" base QUANTSHADOW_X=0
  ab "$g int r$round" "--gemm $g --trials 11 --passes 50" int QUANTSHADOW_X=0
done; done
for g in fp8:4096:14336:4096 fp8:4096:4096:14336 bf16:4096:14336:4096; do
  ab "$g base" "--gemm $g --trials 7 --passes 30" base QUANTSHADOW_X=0
  ab "$g int" "--gemm $g --trials 7 --passes 30" int QUANTSHADOW_X=0
done
step "bench sketch (int)"
timeout 200 .gpu/int/quantshadow bench gpu --only sketch --m 4096 > $OUT/bench.txt 2>&1
grep -E "^\| sketch check|^\| sketch \|" $OUT/bench.txt | cut -c1-250
step end
