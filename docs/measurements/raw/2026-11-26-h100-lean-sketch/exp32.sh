#!/usr/bin/env bash
# Session 14, run 12 (review fixes): the lean check compares all 64 weight samples, takes its
# split from the cluster rank, and W_R fragments exist only while the lean check is on.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
stamp() { echo "-- $(date -u +%T) $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
stamp selftest
timeout 300 quantshadow selftest --only sketch 2>&1 | grep -v "| pass |" | tail -8
timeout 200 quantshadow selftest --quick --only detached,ring 2>&1 | grep -v "| pass |" | tail -6
stamp bench
timeout 200 quantshadow bench gpu --only sketch --m 4096 --probes 32 2>&1 | grep "^| sketch |.*| lean |\|rror\|anic"
stamp "verify_detach ops"
OUT=/tmp/vd timeout 300 bash tests/gpu/verify_detach.sh ops 2>&1 | grep "outputs\|Verdict"
stamp end
