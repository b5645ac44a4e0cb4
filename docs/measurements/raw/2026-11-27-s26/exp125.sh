#!/usr/bin/env bash
# Session 26, call 4 (.gpu/main = exp124's build): what k = 16 probes (QUANTSHADOW_PROBES=16;
# 16 and 8 take one 16-probe tile in the lean kernels, 32 take two) costs against the default 32,
# in the profiler (4096^3 and the 14336 shapes), ab_pause and Llama 8b-width prefill.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
prof() { echo "-- k=$1 $2"; env QUANTSHADOW_PROBES=$1 LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so \
    QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all timeout 100 python3 tests/gpu/eager_profile.py $2 --calls 24 2>$OUT/err.txt \
    | grep -E "checking|paused|qs_" | grep -v "t+"; }
step "profiler, k = 32 against 16 (and 8 at 4096^3)"
for round in 1 2; do
  for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do prof 32 $g; prof 16 $g; prof 8 $g; done
done
for g in fp8:4096:14336:4096 bf16:4096:14336:4096 fp8:4096:4096:14336 bf16:4096:4096:14336; do prof 32 $g; prof 16 $g; done
ab() { env QUANTSHADOW_PROBES=$3 QUANTSHADOW_LOG=info LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  timeout 150 python3 tests/gpu/ab_pause.py "$1" $2 2>$OUT/ab_err.txt | grep '^{' | cut -c1-160 || tail -3 $OUT/ab_err.txt
  grep -hE "skipped:" $OUT/ab_err.txt | grep -v paused | sed 's/^/   /' | cut -c1-200 | head -3; }
step "ab_pause, k = 32 against 16"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do for r in 1 2; do
  ab "$g k32 r$r" "--gemm $g --trials 11 --passes 50" 32
  ab "$g k16 r$r" "--gemm $g --trials 11 --passes 50" 16
done; done
step "Llama 8b-width prefill, k = 32 against 16"
ab "8b-width k32" "--llama 8b-width" 32
ab "8b-width k16" "--llama 8b-width" 16
step end
