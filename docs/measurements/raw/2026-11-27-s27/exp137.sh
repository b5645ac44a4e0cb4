#!/usr/bin/env bash
# Session 27, call 5 (.gpu/main: the review fixes): the two host crashes the review reproduced
# (cudaDeviceReset under the shim; a tracer preloaded before the shim), then the selftest
# sections, torch_ops under sketch and rows (outputs identical, reports PASS; now with FP8 calls
# whose activation scales are freed at once), the Llama run, and the FP8 4096^3 period.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
SHIM=$PWD/.gpu/main/libquantshadow.so
step "cudaDeviceReset under the shim"
nvcc -o /tmp/device_reset tests/gpu/device_reset.cu -lcublas 2>&1 | tail -3
/tmp/device_reset; echo "plain rc $?"
env LD_PRELOAD=$SHIM QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all /tmp/device_reset; echo "shim, reset at the end: rc $?"
env LD_PRELOAD=$SHIM QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info /tmp/device_reset reset 4 2>$OUT/reset_after.txt; echo "shim, 4 GEMMs after the reset: rc $?"
grep -iE "skip|error|closing" $OUT/reset_after.txt | cut -c1-240 | head -8
step "a tracer preloaded before the shim (real cuBLAS)"
sed 's/#include "fixture_vendor.h"/#include <cublas_v2.h>/' tests/fixtures/fixture_tracer.c > /tmp/tracer.c
cc -shared -fPIC -I/usr/local/cuda/include -o /tmp/tracer.so /tmp/tracer.c -ldl 2>&1 | tail -3
for pre in "/tmp/tracer.so:$SHIM" "$SHIM:/tmp/tracer.so"; do
  env LD_PRELOAD=$pre QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info /tmp/device_reset noreset 2>$OUT/tracer.txt
  echo "LD_PRELOAD=${pre//$PWD\//}: rc $?"; grep -E "fixture_tracer|calls" $OUT/tracer.txt | cut -c1-200 | head -3
done
step "selftest helpers,sketch,detached,early"
timeout 200 quantshadow selftest --quick --only helpers,sketch,detached,early > $OUT/selftest.txt 2>&1
echo "rc $?"; grep -E "passed|failed|\| fail" $OUT/selftest.txt | head
step "verify_shim ops llama"
timeout 400 bash tests/gpu/verify_shim.sh ops llama > $OUT/verify.txt 2>&1; echo "rc $?"
grep -E "identical|DIFFERENT|PASS|FAIL|rc|exit" $OUT/verify.txt | head -30
step "FP8 4096^3 period (ring in registered pages)"
env LD_PRELOAD=$SHIM QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all timeout 100 python3 tests/gpu/eager_profile.py fp8:4096:4096:4096 --calls 24 2>$OUT/err.txt \
  | grep -E "checking|paused|qs_|nvjet" | grep -v "t+"
step end
