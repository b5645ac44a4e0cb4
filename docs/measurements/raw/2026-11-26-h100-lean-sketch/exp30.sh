#!/usr/bin/env bash
# Session 14, run 10: relaxed early cluster arrival (a release one waited for the W_R loads),
# the epoch read before the W_R burst, a two-level warp tree whose last level spreads the
# cross-block stores over every thread. Correctness, stages, both kernels and the GEMMs.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
stamp() { echo "-- $(date -u +%T) $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
stamp selftest
timeout 300 quantshadow selftest --only sketch 2>&1 | grep -v "| pass |" | tail -8
timeout 200 quantshadow selftest --quick --only helpers,compare,logits,detached,ring 2>&1 | grep -v "| pass |" | tail -6
stamp stages
QUANTSHADOW_KERNEL_DEFINES="QS_SKETCH_TIMING=1" timeout 120 stdbuf -oL quantshadow bench gpu --only sketch --m 4096 --probes 32 > /tmp/timing.txt 2>&1
python3 tests/gpu/lean_stages.py lean < /tmp/timing.txt
stamp bench
for r in 1 2; do
  timeout 200 quantshadow bench gpu --only sketch --m 1,16,4096 --probes 32 2>&1 | grep "^| sketch\|rror\|anic" | sed "s/^/r$r /"
done
timeout 200 python3 tests/gpu/bench_torch.py 2>&1 | grep "| 4096 |\|| 1 |\|| 16 |"
stamp end
