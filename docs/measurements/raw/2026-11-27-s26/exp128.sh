#!/usr/bin/env bash
# Session 26, call 7 (.gpu/main: the session's final defaults: k = 16, e4m3 2 units, split from
# 2^35 flops): issue 3's shapes in the profiler and ab_pause, the 8b-width prefill (profile and
# ab_pause), and the selftest sections the session touched.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "selftest helpers,sketch,detached,early"
timeout 200 quantshadow selftest --quick --only helpers,sketch,detached,early > $OUT/selftest.txt 2>&1
echo "rc $?"; grep -E "passed|failed|\| fail" $OUT/selftest.txt | head
prof() { echo "-- $1"; env LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so \
    QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all timeout 100 python3 tests/gpu/eager_profile.py $1 --calls 24 2>$OUT/err.txt \
    | grep -E "checking|paused|qs_|nvjet" | grep -v "t+"; }
step "profiler, issue 3's M = 4096 shapes"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096 fp8:4096:14336:4096 bf16:4096:14336:4096 fp8:4096:4096:14336 bf16:4096:4096:14336 fp8:1024:4096:4096 bf16:1024:4096:4096; do prof $g; done
ab() { env QUANTSHADOW_LOG=info LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  timeout 150 python3 tests/gpu/ab_pause.py "$1" $2 2>$OUT/ab_err.txt | grep '^{' | cut -c1-160 || tail -3 $OUT/ab_err.txt
  grep -hE "skipped:" $OUT/ab_err.txt | grep -v paused | sed 's/^/   /' | cut -c1-200 | head -3; }
step "ab_pause"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096 fp8:4096:14336:4096 bf16:4096:14336:4096; do
  ab "$g" "--gemm $g --trials 11 --passes 50"; done
step "8b-width prefill"
env LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  timeout 150 python3 tests/gpu/eager_profile.py --llama 8b-width --calls 2 2>$OUT/err.txt || tail -5 $OUT/err.txt
for r in 1 2; do ab "8b-width r$r" "--llama 8b-width"; done
step end
