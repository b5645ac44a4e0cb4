#!/usr/bin/env bash
# Per-phase host profile (QS_HOST_PROFILE=1; builds with engine/host_profile.rs: .gpu/pbase =
# 66dbd03 + profile, .gpu/pmain = ef86650 + profile), on the stream; then two more rounds of the
# Llama prefill in-process A/B (base on the stream against main's default).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/lib* | cut -c1-12,34-
step "host profile"
for round in 1 2; do
  for G in bf16:512:4096:4096 fp8:512:4096:4096; do
    for b in pbase pmain; do
      env LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_SKETCH_DETACH=off QS_HOST_PROFILE=1 \
        python3 tests/gpu/host_cost.py "$b" --gemm $G --trials 15 2>$OUT/err.txt | grep '^{'
      grep -h "host profile" $OUT/err.txt | sed 's/^/   /'
    done
  done
done
step "Llama prefill, in-process A/B"
ab() { local b=$1; shift; env LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info "${@:2}" \
  timeout 150 python3 tests/gpu/ab_pause.py "$1" $AB 2>$OUT/ab_err.txt | grep '^{' || tail -3 $OUT/ab_err.txt; grep -hE "skipped:" $OUT/ab_err.txt | sed 's/^/   /'; }
for round in 2 3; do
  AB="--llama small"
  ab base "base small on-stream r$round" QUANTSHADOW_SKETCH_DETACH=off
  ab main "main small default r$round"
  AB="--llama 8b-width"
  ab base "base 8b on-stream r$round" QUANTSHADOW_SKETCH_DETACH=off
  ab main "main 8b default r$round"
done
step end
