#!/usr/bin/env bash
# Session 26, call 6 (.gpu/main = exp126's build, k = 16): where Llama 8b-width prefill's added
# time goes (eager_profile.py --llama), and every eager lean check split
# (QUANTSHADOW_SKETCH_SPLIT=1) against auto (GEMMs of 2^36 flops or more) there.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
for split in auto 1; do
  step "profile, split $split"
  env QUANTSHADOW_SKETCH_SPLIT=$split LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
    timeout 150 python3 tests/gpu/eager_profile.py --llama 8b-width --calls 2 2>$OUT/err.txt || tail -5 $OUT/err.txt
done
ab() { env QUANTSHADOW_SKETCH_SPLIT=$3 QUANTSHADOW_LOG=info LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  timeout 150 python3 tests/gpu/ab_pause.py "$1" $2 2>$OUT/ab_err.txt | grep '^{' | cut -c1-160 || tail -3 $OUT/ab_err.txt
  grep -hE "skipped:" $OUT/ab_err.txt | grep -v paused | sed 's/^/   /' | cut -c1-200 | head -3; }
step "ab_pause 8b-width prefill, split auto against 1"
for r in 1 2; do
  ab "8b-width auto r$r" "--llama 8b-width" auto
  ab "8b-width split r$r" "--llama 8b-width" 1
done
step end
