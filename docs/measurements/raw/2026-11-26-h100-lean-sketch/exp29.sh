#!/usr/bin/env bash
# Session 14, run 9: when the lean kernel's last block has its rows drawn, and when warp 0's
# load-then-mma iterations start (QS_LEAN_ITERS); row index without 64-bit division.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
QUANTSHADOW_KERNEL_DEFINES="QS_SKETCH_TIMING=1" timeout 120 stdbuf -oL quantshadow bench gpu --only sketch --m 4096 --probes 32 > /tmp/timing.txt 2>&1
python3 tests/gpu/lean_stages.py lean < /tmp/timing.txt
timeout 200 quantshadow bench gpu --only sketch --m 4096 --probes 32 2>&1 | grep "^| sketch |.*| lean |\|rror\|anic"
