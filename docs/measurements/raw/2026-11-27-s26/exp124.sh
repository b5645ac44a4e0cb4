#!/usr/bin/env bash
# Session 26, call 3 (.gpu/main: e4m3 units per warp now 2 by default, QS_LEAN_UNITS_16 added):
# the selftest at the new default and at 1 unit for both, the profiler's split projections for
# 16-bit A at 2 (default) against 1 unit and e4m3 at 2 against 1, then ab_pause of the new
# default against session 25's (QS_LEAN_UNITS_E4M3=3) on issue 3's 4096^3 GEMMs and Llama prefill.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "selftest sketch,detached (default: 2 units)"
timeout 150 quantshadow selftest --quick --only sketch,detached > $OUT/selftest.txt 2>&1
echo "rc $?"; grep -E "passed|failed|\| fail" $OUT/selftest.txt | head
step "selftest sketch,detached at 1 unit (both)"
QUANTSHADOW_KERNEL_DEFINES="QS_LEAN_UNITS_E4M3=1 QS_LEAN_UNITS_16=1" timeout 150 quantshadow selftest --quick --only sketch,detached > $OUT/selftest_u1.txt 2>&1
echo "rc $?"; grep -E "passed|failed|\| fail" $OUT/selftest_u1.txt | head
prof() { echo "-- $1 $2"; env QUANTSHADOW_KERNEL_DEFINES="$1" LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so \
    QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all timeout 100 python3 tests/gpu/eager_profile.py $2 --calls 24 2>$OUT/err.txt \
    | grep -E "checking|paused|qs_" | grep -v "t+"; }
step "profiler: 16-bit A 2 against 1 unit; e4m3 2 against 1"
for round in 1 2; do
  for g in bf16:4096:4096:4096 bf16:4096:14336:4096 bf16:4096:4096:14336; do
    prof "QS_LEAN_UNITS_16=2" $g; prof "QS_LEAN_UNITS_16=1" $g; done
  prof "QS_LEAN_UNITS_E4M3=2" fp8:4096:4096:4096; prof "QS_LEAN_UNITS_E4M3=1" fp8:4096:4096:4096
done
ab() { env QUANTSHADOW_KERNEL_DEFINES="$3" QUANTSHADOW_LOG=info LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  timeout 150 python3 tests/gpu/ab_pause.py "$1" $2 2>$OUT/ab_err.txt | grep '^{' | cut -c1-160 || tail -3 $OUT/ab_err.txt
  grep -hE "skipped:" $OUT/ab_err.txt | grep -v paused | sed 's/^/   /' | cut -c1-200 | head -3; }
step "ab_pause: e4m3 3 units (session 25) against 2 (default now)"
for r in 1 2; do
  ab "fp8:4096:4096:4096 u3 r$r" "--gemm fp8:4096:4096:4096 --trials 11 --passes 50" "QS_LEAN_UNITS_E4M3=3"
  ab "fp8:4096:4096:4096 u2 r$r" "--gemm fp8:4096:4096:4096 --trials 11 --passes 50" "QS_X=0"
done
ab "bf16:4096:4096:4096 default" "--gemm bf16:4096:4096:4096 --trials 11 --passes 50" "QS_X=0"
ab "8b-width prefill default" "--llama 8b-width" "QS_X=0"
step end
