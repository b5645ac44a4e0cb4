#!/usr/bin/env bash
# Floors of an on-stream check beside the lean check and the production GEMMs (one machine),
# and one 48-GEMM decode-graph replay's timeline under the default (where the end-of-capture
# checks' tail goes).
source tests/gpu/common.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
md5sum .gpu/main/* | cut -c1-12,34-
nvcc -O3 -arch=sm_90 tests/gpu/floor_latency.cu -o /tmp/floor_latency 2>&1 | tail -3
/tmp/floor_latency | tee $OUT/floor1.txt
timeout 300 quantshadow bench gpu --only sketch --m 4096 --probes 32 > $OUT/bench_sketch.txt 2>&1; grep -E "^\|" $OUT/bench_sketch.txt | head -30
timeout 200 python3 tests/gpu/bench_torch.py > $OUT/bench_torch.txt 2>&1; sed -n '/production/,$p' $OUT/bench_torch.txt | head -30
/tmp/floor_latency | tee $OUT/floor2.txt
QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so \
  timeout 300 python3 tests/gpu/graph_profile.py deferred48 --repeat 8 --timeline > $OUT/timeline48.txt 2>&1
grep -E "checks on|per replay|tail" $OUT/timeline48.txt | head
