#!/usr/bin/env bash
# Session 14, run 2: lean kernel with 32 rows per block (8 clusters of 8, one wave), the warps'
# sums in a register tree, scalars read up front, ring ticket and weight samples during the loads.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
stamp() { echo "-- $(date -u +%T) $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
stamp selftest sketch
timeout 300 quantshadow selftest --only sketch 2>&1 | grep -v "| pass |" | tail -30
stamp bench
timeout 200 quantshadow bench gpu --only sketch --m 1,16,4096 --probes 32 2>&1 | grep "^| sketch\|rror\|anic"
stamp stage times
QUANTSHADOW_KERNEL_DEFINES="QS_SKETCH_TIMING=1" timeout 120 stdbuf -oL quantshadow bench gpu --only sketch --m 4096 --probes 32 > $OUT/timing.txt 2>&1
python3 tests/gpu/stage_times.py lean < $OUT/timing.txt | grep "M=4096"
grep QS_LEAN_STAGES $OUT/timing.txt | python3 -c "import sys,statistics as s; r=[l.split() for l in sys.stdin]; print(\"lean sync1 median\", s.median(int(x[2]) for x in r)/1e3, \"sync2\", s.median(int(x[4]) for x in r)/1e3, \"(all shapes)\")"
rm -f $OUT/timing.txt
stamp quick sections
timeout 200 quantshadow selftest --quick --only helpers,compare,logits,detached,ring 2>&1 | grep -v "| pass |" | tail -8
stamp end
