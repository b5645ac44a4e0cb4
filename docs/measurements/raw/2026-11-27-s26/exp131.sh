#!/usr/bin/env bash
# Session 26, call 10 (.gpu/main = exp130's build, the session's final defaults): issue 4's
# overhead table refreshed, tokens/s of prefill, eager decode and graph decode for plain, off,
# observe, sketch all and sketch 1/100, two interleaved rounds (verify_shim.sh overhead).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
for size in small 8b-width; do
  step "overhead $size"
  LLAMA_SIZE=$size LLAMA_ARGS="--trials 5" bash tests/gpu/verify_shim.sh overhead 2>&1 | tail -12
done
step end
