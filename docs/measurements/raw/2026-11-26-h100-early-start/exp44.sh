#!/usr/bin/env bash
# The committed build (HEAD after 1b531cb) on the GPU host: which NVRTC it loads (selftest header),
# the shim end to end (verify_shim.sh ops llama: outputs and tokens identical, PASS), then Llama
# 8b-width prefill (1024 tokens) plain against the default shim (detached, sketch all) in four
# interleaved rounds, to see whether issue 4's prefill number can be read at all on this host.
# Staging: bash ../shared/gpu/pack.sh && mkdir -p .gpu/main && mv .gpu/quantshadow .gpu/libquantshadow.so .gpu/main/ && strip .gpu/main/*
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/main/* | cut -c1-12,34-
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader
step "selftest header and the early/helpers sections"
timeout 120 quantshadow selftest --only helpers,early 2>&1 | grep -E "selftest on|passed|FAIL"
step "verify_shim ops llama"
timeout 300 bash tests/gpu/verify_shim.sh ops llama 2>&1 | tail -8
step "Llama 8b-width prefill, plain vs default shim, 4 interleaved rounds"
pp() { timeout 120 python3 tests/gpu/graph_profile.py "$@" 2>&1 | grep -m1 "without the profiler"; }
LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all pp warm-up --prefill --llama 8b-width >/dev/null
for r in 1 2 3 4; do
  pp "plain r$r" --prefill --llama 8b-width
  LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all pp "shim r$r" --prefill --llama 8b-width
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
done
step end
