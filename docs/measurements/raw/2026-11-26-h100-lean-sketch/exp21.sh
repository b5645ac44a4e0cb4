#!/usr/bin/env bash
# Session 14, run 1: the lean sketch kernel (clusters, fragment-order W_R) first on the GPU:
# selftest sketch (both kernels), bench with the general kernel side by side, stage times.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
stamp() { echo "-- $(date -u +%T) $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
stamp selftest sketch
timeout 300 quantshadow selftest --only sketch 2>&1 | grep -v "| pass |" | tail -40
stamp bench
timeout 200 quantshadow bench gpu --only sketch --m 1,16,4096 --probes 32 2>&1 | grep "^| sketch\|rror\|anic"
stamp stage times
QUANTSHADOW_KERNEL_DEFINES="QS_SKETCH_TIMING=1" timeout 120 stdbuf -oL quantshadow bench gpu --only sketch --m 4096 --probes 32 2>&1 | python3 tests/gpu/stage_times.py lean 2>&1 | tail -20
stamp quick sections
timeout 200 quantshadow selftest --quick --only helpers,compare,logits,detached,ring 2>&1 | grep -v "| pass |" | tail -8
stamp end
