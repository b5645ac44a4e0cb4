#!/usr/bin/env bash
# Replaced projections kept until the checks that may read them have run (engine/retired.rs).
# tests/gpu/weight_reload.py: 16 bf16 4096x4096 weights called with 1024 rows (detached checks
# on the side stream, host running ahead), all rewritten in place after round 2. base = b98e7f8
# (old projection dropped at once), main = + retired.rs. Twice each, interleaved.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
timeout 120 python3 tests/gpu/weight_reload.py $OUT/reload_plain.json
for round in 1 2; do
  for b in base main; do
    step "$b round $round"
    QUANTSHADOW_LOG=info timeout 200 .gpu/$b/quantshadow run --mode sketch --sample all --label reload-$b --out $OUT/reload_${b}_$round -- \
      python3 tests/gpu/weight_reload.py $OUT/reload_${b}_$round.json > $OUT/reload_${b}_$round.log 2>&1
    echo "run exit $?; outputs $(same $OUT/reload_plain.json $OUT/reload_${b}_$round.json)"
    grep -E "^\*\*Verdict|Calls:|Failing" $OUT/reload_${b}_$round/report.md | head -4
    grep -hE "closing:|skipped:" $OUT/reload_${b}_$round.log | head -2
  done
done
step "main: torch_ops under the shim"
QUANTSHADOW_LOG=info timeout 200 bash tests/gpu/verify_detach.sh ops 2>&1 | grep -E "outputs|Verdict|Calls:"
step end
