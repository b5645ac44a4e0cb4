#!/usr/bin/env bash
# After the second review: projections retire with events on every stream their checks used,
# the exit tracks calls before their check is enqueued (stale ones let go), a launched check is
# never also a skip. torch_ops (detach on/off), weight_reload, Llama small; closing counts.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/main/* | cut -c1-12,34-
QUANTSHADOW_LOG=info timeout 200 bash tests/gpu/verify_detach.sh ops 2>&1 | grep -E "outputs|Verdict|Calls:"
grep -hE "closing:|skipped:" $OUT/ops_detach_on.log $OUT/ops_detach_off.log | head -4
timeout 120 python3 tests/gpu/weight_reload.py $OUT/reload_plain.json
QUANTSHADOW_LOG=info timeout 200 quantshadow run --mode sketch --sample all --label reload --out $OUT/reload -- \
  python3 tests/gpu/weight_reload.py $OUT/reload.json > $OUT/reload.log 2>&1
echo "weight_reload: run exit $?; outputs $(same $OUT/reload_plain.json $OUT/reload.json)"
grep -E "^\*\*Verdict|Calls:" $OUT/reload/report.md | head -2
QUANTSHADOW_LOG=info timeout 300 bash tests/gpu/verify_shim.sh llama 2>&1 | tail -3
step end
