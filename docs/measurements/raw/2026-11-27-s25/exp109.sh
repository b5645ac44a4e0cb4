#!/usr/bin/env bash
# Session 25 (prepared in session 24 as exp109_next.sh, extended): what the split projections' first
# 2.3 us before any load of A or D are made of (exp107/exp108). The timing build's marks now
# include, for the last block to end: body entered, W_R and sign loads issued, its rows drawn
# (before the barrier) and the barrier passed. Behind a real GEMM (eager_profile) against back to
# back (bench), which tells cold code and parameter fetches after a GEMM from the stage's own
# latency. One build (.gpu/main).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
shim() { env LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all "$@"; }
eval "$(sed -n '/^summ()/,/^}/p' docs/measurements/raw/2026-11-27-s24/exp107.sh)"
export QUANTSHADOW_KERNEL_DEFINES=QS_SKETCH_TIMING=1
step "behind the GEMM"
# 512 and 1024 rows: the same projections (256 sampled rows, 4096 x 4096) behind GEMMs whose
# footprint leaves the L2 (50 MB) warm, against 4096 rows (64 MB for FP8).
for g in fp8:4096:4096:4096 bf16:4096:4096:4096 fp8:512:4096:4096 fp8:1024:4096:4096 bf16:1024:4096:4096; do
  echo "-- $g"; QUANTSHADOW_SKETCH_SPLIT=1 shim timeout 100 python3 tests/gpu/eager_profile.py $g --calls 24 > $OUT/tm_gemm.txt 2>$OUT/err.txt
  grep -E "/call" $OUT/tm_gemm.txt | grep proj; summ $OUT/tm_gemm.txt
done
step "back to back (bench)"
timeout 200 quantshadow bench gpu --only sketch --m 4096 --probes 32 > $OUT/tm_bench.txt 2>&1
grep -E "^\| sketch \| .* 4096 \| 4096x4096" $OUT/tm_bench.txt | cut -c1-200
grep -E "QS_PROJ_STAGES af [0-9]+ n 4096 k 4096" $OUT/tm_bench.txt > $OUT/tm_bench_4096.txt; summ $OUT/tm_bench_4096.txt
step end
