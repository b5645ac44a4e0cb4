#!/usr/bin/env bash
# Session 14, run 7: ncu source counters of one lean check (bf16 4096x4096, M = 4096).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
quantshadow bench gpu --only sketch --m 4096 --probes 32 >/dev/null 2>&1   # compile into the cache
timeout 400 /usr/local/cuda/bin/ncu --kernel-name regex:qs_sketch_lean --launch-skip 20 --launch-count 1 \
  --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
  quantshadow bench gpu --only sketch --m 4096 --probes 32 > /tmp/ncu_src.csv 2>/tmp/ncu.err
tail -3 /tmp/ncu.err
python3 docs/measurements/raw/2026-11-26-h100-sketch-kernel/ncu_hot.py /tmp/ncu_src.csv 2>&1 | head -120
gzip -c /tmp/ncu_src.csv > $OUT/ncu_lean_src.csv.gz
