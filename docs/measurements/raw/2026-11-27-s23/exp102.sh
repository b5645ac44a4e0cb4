#!/usr/bin/env bash
# Session 23, last device minutes: Llama prefill with every call checked at other prompt lengths
# (issue 4 measures 1024): the check samples 256 rows whatever M, so its share should fall with
# the prompt. Default settings (split off), in-process A/B, one process each.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
for prompt in 256 4096; do for m in small 8b-width; do
  env LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info \
    timeout 60 python3 tests/gpu/ab_pause.py "$m prompt $prompt" --llama $m --prompt $prompt --trials 9 --passes 10 2>$OUT/ab_err.txt | grep '^{' | cut -c1-170 || tail -2 $OUT/ab_err.txt
  grep -hE "skipped:" $OUT/ab_err.txt | grep -v paused | head -2
done; done
