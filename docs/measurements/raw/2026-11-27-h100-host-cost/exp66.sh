#!/usr/bin/env bash
# Llama prefill in-process A/B (ab_pause.py), main only: the default (eager checks on the stream)
# against QUANTSHADOW_SKETCH_DETACH=on (eager checks detached, with this session's host-time fix
# too); two rounds, skip counts shown.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/main/* | cut -c1-12,34-
ab() { env LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info "${@:2}" \
  timeout 150 python3 tests/gpu/ab_pause.py "$1" $AB 2>$OUT/ab_err.txt | grep '^{' || tail -3 $OUT/ab_err.txt; grep -hE "skipped:" $OUT/ab_err.txt | sed 's/^/   /'; }
for round in 1 2; do
  step "round $round"
  for m in small 8b-width; do
    AB="--llama $m"
    ab "main $m default r$round"
    ab "main $m detach=on r$round" QUANTSHADOW_SKETCH_DETACH=on
  done
done
step end
