#!/usr/bin/env bash
# Session 27, call 2 (.gpu/main: d32f86f, the committed defaults): the prefill of issue 4's model
# (3), torch_llama.py's small Llama (hidden 1024, 4 layers), under sketch all: where the caller's
# stream is busy and idle (profiler), then paired paused/checking trials in three processes with
# more trials than before; the 8b-width prefill once in the same call for comparison.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
shim() { env LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all "$@"; }
step "small prefill under the profiler"
shim timeout 150 python3 tests/gpu/eager_profile.py --llama small --calls 2 2>$OUT/err.txt || tail -5 $OUT/err.txt
ab() { shim env QUANTSHADOW_LOG=info timeout 200 python3 tests/gpu/ab_pause.py "$1" $2 2>$OUT/ab_err.txt | grep '^{' || tail -3 $OUT/ab_err.txt
  grep -hE "skipped:" $OUT/ab_err.txt | grep -v paused | sed 's/^/   /' | cut -c1-200 | head -3; }
step "small prefill, ab_pause, three processes"
for r in 1 2 3; do ab "small r$r" "--llama small --trials 31 --passes 20"; done
step "8b-width prefill, ab_pause"
ab "8b-width" "--llama 8b-width"
step end
