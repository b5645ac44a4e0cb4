#!/usr/bin/env bash
# Session 14, run 8: FP8-A lean checks with W_R's bf16 hi part only and 3 units per warp
# iteration; the publish step's status / epoch round trips off thread 0 (both kernels).
# Correctness, stages, both kernels side by side with the production GEMMs, shim end to end.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
stamp() { echo "-- $(date -u +%T) $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
stamp selftest
timeout 300 quantshadow selftest --only sketch 2>&1 | grep -v "| pass |" | tail -8
timeout 300 quantshadow selftest --only sketch --json /tmp/st.json >/dev/null 2>&1; python3 -c "
import json; d=json.load(open('/tmp/st.json'))
rows=d['outcomes'] if isinstance(d,dict) and 'outcomes' in d else d
for r in rows:
    s=json.dumps(r)
    if 'lean' in s and 'device=host' in s: print(s[:400])" 2>&1 | head -8
timeout 200 quantshadow selftest --quick --only helpers,compare,logits,detached,ring 2>&1 | grep -v "| pass |" | tail -6
stamp stages
QUANTSHADOW_KERNEL_DEFINES="QS_SKETCH_TIMING=1" timeout 120 stdbuf -oL quantshadow bench gpu --only sketch --m 4096 --probes 32 > /tmp/timing.txt 2>&1
python3 tests/gpu/lean_stages.py lean < /tmp/timing.txt
stamp bench
for r in 1 2; do
  timeout 200 quantshadow bench gpu --only sketch --m 1,16,4096 --probes 32 2>&1 | grep "^| sketch\|rror\|anic" | sed "s/^/r$r /"
done
timeout 200 python3 tests/gpu/bench_torch.py 2>&1 | grep "| 4096 |\|| 1 |\|| 16 |"
stamp "shim end to end: verify_detach ops"
OUT=/tmp/vd timeout 300 bash tests/gpu/verify_detach.sh ops 2>&1 | grep "outputs\|Verdict"
stamp end
