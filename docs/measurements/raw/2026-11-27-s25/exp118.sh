#!/usr/bin/env bash
# Session 25: with the row windows (8092642) in both builds, eager checks detached with their
# snapshot buffers taken in turn (.gpu/dit = 8092642 + detach_in_turn.patch, run with
# QUANTSHADOW_SKETCH_DETACH=on: the lean row copy on the caller's stream, the whole check on the
# side stream) against the default split check (.gpu/win = 8092642), one call.
source tests/gpu/common.sh
export PATH=$PWD/.gpu/win:$PATH
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "kernel timeline"
for round in 1 2; do for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do
  echo "-- split (win) r$round"; env LD_PRELOAD=$PWD/.gpu/win/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
    timeout 100 python3 tests/gpu/eager_profile.py $g --calls 24 2>$OUT/err.txt | grep -E "checking|paused|qs_" | grep -v "t+"
  echo "-- detach in turn (dit) r$round"; env QUANTSHADOW_SKETCH_DETACH=on LD_PRELOAD=$PWD/.gpu/dit/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
    timeout 100 python3 tests/gpu/eager_profile.py $g --calls 24 2>$OUT/err.txt | grep -E "checking|paused|qs_|nvjet" | grep -v "t+"
done; done
ab() { env $4 QUANTSHADOW_LOG=info LD_PRELOAD=$PWD/.gpu/$3/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  timeout 150 python3 tests/gpu/ab_pause.py "$1" $2 2>$OUT/ab_err.txt | grep '^{' | cut -c1-160 || tail -3 $OUT/ab_err.txt
  grep -hE "skipped:" $OUT/ab_err.txt | grep -v paused | sed 's/^/   /' | cut -c1-200 | head -3; }
step "ab_pause"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096 fp8:4096:14336:4096; do
  ab "$g split" "--gemm $g --trials 11 --passes 50" win QUANTSHADOW_X=0
  ab "$g detach-in-turn" "--gemm $g --trials 11 --passes 50" dit QUANTSHADOW_SKETCH_DETACH=on
done
step "Llama 8b-width prefill"
ab "8b-width split" "--llama 8b-width" win QUANTSHADOW_X=0
ab "8b-width detach-in-turn" "--llama 8b-width" dit QUANTSHADOW_SKETCH_DETACH=on
step end
