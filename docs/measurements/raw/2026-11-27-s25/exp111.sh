#!/usr/bin/env bash
# Session 25: eager checks detached with their snapshot buffers taken in turn (.gpu/dit =
# 81935de + detach_in_turn.patch, QUANTSHADOW_SKETCH_DETACH=on: a row copy on the caller's
# stream, the whole check on the side stream; never skipped, the caller's stream may wait for
# the oldest buffer's check) against the default split check (.gpu/main = 81935de), one call.
# Also the plain-gather floor for the 14336-wide shape (tests/gpu/on_stream_floor.py).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
ab() { env $4 QUANTSHADOW_LOG=info LD_PRELOAD=$PWD/.gpu/$3/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  timeout 150 python3 tests/gpu/ab_pause.py "$1" $2 2>$OUT/ab_err.txt | grep '^{' | cut -c1-160 || tail -3 $OUT/ab_err.txt
  grep -hE "skipped:" $OUT/ab_err.txt | grep -v paused | sed 's/^/   /' | cut -c1-200 | head -3; }
step "kernel timeline, detached in turn"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do
  env LD_PRELOAD=$PWD/.gpu/dit/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_SKETCH_DETACH=on \
    timeout 100 python3 tests/gpu/eager_profile.py $g --calls 24 2>$OUT/err.txt | grep -vE "^\s+[0-9.]+/call.*(Memcpy|Memset)" | head -12
done
step "one GEMM back to back, A/B"
for round in 1 2; do for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do
  ab "$g split(main) r$round" "--gemm $g --trials 11 --passes 50" main QUANTSHADOW_X=0
  ab "$g detach-in-turn r$round" "--gemm $g --trials 11 --passes 50" dit QUANTSHADOW_SKETCH_DETACH=on
done; done
for g in fp8:4096:14336:4096 fp8:4096:4096:14336; do
  ab "$g split(main)" "--gemm $g --trials 7 --passes 30" main QUANTSHADOW_X=0
  ab "$g detach-in-turn" "--gemm $g --trials 7 --passes 30" dit QUANTSHADOW_SKETCH_DETACH=on
done
step "Llama 8b-width prefill A/B"
ab "8b-width split(main)" "--llama 8b-width" main QUANTSHADOW_X=0
ab "8b-width detach-in-turn" "--llama 8b-width" dit QUANTSHADOW_SKETCH_DETACH=on
step "floor, 14336 wide"
timeout 150 python3 tests/gpu/on_stream_floor.py fp8:4096:14336:4096 2>&1 | tail -5
step end
