#!/usr/bin/env bash
# Session 14, run 5: the lean kernel's last block, stage by stage (QS_LEAN_STAGES).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
QUANTSHADOW_KERNEL_DEFINES="QS_SKETCH_TIMING=1" timeout 120 stdbuf -oL quantshadow bench gpu --only sketch --m 256,4096 --probes 32 > /tmp/timing.txt 2>&1
python3 tests/gpu/lean_stages.py lean < /tmp/timing.txt
python3 tests/gpu/stage_times.py all < /tmp/timing.txt | grep "lean in place"
