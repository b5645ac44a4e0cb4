#!/usr/bin/env bash
# Session 26, call 8 (.gpu/main = exp128's build): GEMMs of 2^35 flops (1024 x 4096 x 4096),
# now split under auto, against the fused check (QUANTSHADOW_SKETCH_SPLIT=0), FP8 and bf16:
# ab_pause (no profiler) and the profiler.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
ab() { env QUANTSHADOW_SKETCH_SPLIT=$3 QUANTSHADOW_LOG=info LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  timeout 150 python3 tests/gpu/ab_pause.py "$1" $2 2>$OUT/ab_err.txt | grep '^{' | cut -c1-160 || tail -3 $OUT/ab_err.txt; }
prof() { echo "-- split $2 $1"; env QUANTSHADOW_SKETCH_SPLIT=$2 LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so \
    QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all timeout 100 python3 tests/gpu/eager_profile.py $1 --calls 24 2>$OUT/err.txt \
    | grep -E "checking|paused|qs_" | grep -v "t+"; }
for g in fp8:1024:4096:4096 bf16:1024:4096:4096; do
  step "$g"
  for r in 1 2; do for s in auto 0; do ab "$g split $s r$r" "--gemm $g --trials 11 --passes 50" $s; done; done
  for s in auto 0; do prof $g $s; done
done
step end
