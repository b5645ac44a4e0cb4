#!/usr/bin/env bash
# The lean snapshot copy for device-pointer scalars (FP8 tensor scales) in an FP8 decode graph:
# overhead_mlp.py --fp8 --repeat 8 (48 _scaled_mm layers, decode replayed from a CUDA graph),
# plain / base (.gpu/base = 8e16803: FP8 copies take the general kernel) / main, sketch all,
# two interleaved rounds. Then the selftest's new lean-copy device-alpha case.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
step "FP8 48-layer stack: plain, base, main (sketch all), 2 rounds"
for round in 1 2; do
  echo "plain $(timeout 120 python3 tests/gpu/overhead_mlp.py --fp8 --repeat 8)"
  for b in base main; do
    echo "$b $(LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info \
      timeout 150 python3 tests/gpu/overhead_mlp.py --fp8 --repeat 8 2>$OUT/mlp_$b.err)"
    grep -hE "closing:|skipped:" $OUT/mlp_$b.err | head -2 | sed 's/^/   /'
  done
done
step "the copies in one replay (graph_profile), base and main"
for b in base main; do
  LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
    timeout 120 python3 tests/gpu/graph_profile.py fp8-$b --repeat 8 --fp8 2>&1 | grep -iE "snap|replay|per " | head -6
done
step "selftest detached (lean copy with a device alpha)"
timeout 200 quantshadow selftest --only detached 2>&1 | grep -E "device alpha|covered|passed|failed"
step end
