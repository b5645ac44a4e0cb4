#!/usr/bin/env bash
# exp86 (session 21): the first checks of the session (prepared in session 20 as exp85_next.sh).
# .gpu/main = this tree; .gpu/base = 4db85de (before the session's host-harm fixes).
# 1. The set-up copies on the shim's own stream (commit 0215d4d, not run on a GPU): the whole
#    quick selftest, torch_ops, Llama tokens.
# 2. tests/gpu/capture_blocking_stream.cu: a capture on a blocking stream in one thread while
#    another thread's first checked GEMM sets the shim up (base expected to break it, main not).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 400 quantshadow selftest --quick > $OUT/selftest.txt 2>&1; grep -E "FAIL|passed|failed" $OUT/selftest.txt | head
QUANTSHADOW_LOG=info timeout 200 bash tests/gpu/verify_shim.sh ops 2>&1 | grep -E "outputs"
QUANTSHADOW_LOG=info timeout 300 bash tests/gpu/verify_shim.sh llama 2>&1 | tail -3
nvcc -O2 -arch=sm_90 tests/gpu/capture_blocking_stream.cu -o /tmp/cbs -lcublas -lpthread 2>&1 | grep -v Warn | head -5
echo "no shim: $(/tmp/cbs | tail -1)"
for b in base main; do
  echo "$b: $(LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_COMPILE=sync QUANTSHADOW_LOG=info timeout 120 /tmp/cbs 2>$OUT/cbs_$b.err | tr '\n' ' ')"
  # Must say 2 checked (the warm-up and the capture-time GEMM), or the run tested nothing.
  grep -hE "closing:|skipped:" $OUT/cbs_$b.err | head -3
done
