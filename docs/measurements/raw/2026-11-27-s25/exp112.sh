#!/usr/bin/env bash
# Session 25: (1) is Nsight Compute on the GPU host, and what stalls the split projections
# (bench, one launch of qs_sketch_proj_e4m3fn_bf16 at 4096 x 4096, k = 32, default kernel);
# (2) 128 sampled rows against 256: the plain-gather floor and the shim (default build).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "ncu"
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"
if [ -n "$NCU" ]; then
  timeout 240 $NCU --kernel-name regex:qs_sketch_proj_e4m3fn --launch-skip 20 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis --section SchedulerStats \
    quantshadow bench gpu --only sketch --m 4096 --probes 32 > $OUT/ncu_proj.txt 2>&1
  echo "ncu rc $?"; grep -vE "^\| sketch|^==PROF==" $OUT/ncu_proj.txt | grep -E "Duration|Stall|Warp Cycles|Issued|Throughput|Elapsed|Registers|Achieved|Theoretical|L1|L2|DRAM|Block|Grid|Waves|ERR|rror|cycles" | head -60
fi
step "128 against 256 sampled rows"
timeout 150 python3 tests/gpu/on_stream_floor.py fp8:4096:4096:4096 --rows 128 2>&1 | tail -5
ab() { env $3 QUANTSHADOW_LOG=info LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  timeout 150 python3 tests/gpu/ab_pause.py "$1" $2 2>$OUT/ab_err.txt | grep '^{' | cut -c1-160 || tail -3 $OUT/ab_err.txt; }
for g in fp8:4096:4096:4096; do
  ab "$g 256 rows" "--gemm $g --trials 11 --passes 50" QUANTSHADOW_X=0
  ab "$g 128 rows" "--gemm $g --trials 11 --passes 50" QUANTSHADOW_SKETCH_ROWS=128
  ab "$g 256 rows r2" "--gemm $g --trials 11 --passes 50" QUANTSHADOW_X=0
  ab "$g 128 rows r2" "--gemm $g --trials 11 --passes 50" QUANTSHADOW_SKETCH_ROWS=128
done
step end
