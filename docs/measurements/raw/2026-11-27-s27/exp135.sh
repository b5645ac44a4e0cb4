#!/usr/bin/env bash
# Session 27, call 3 (.gpu/main: 638aae2, the committed defaults): issue 3's benchmark set side by
# side in one call: `quantshadow bench gpu` (copy, full reference, sketch at every M of the issue,
# compare) and the production GEMMs (tests/gpu/bench_torch.py: cuBLAS SGEMM, bf16 linear, FP8
# _scaled_mm at the same shapes).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
step "quantshadow bench gpu"
timeout 400 quantshadow bench gpu > $OUT/bench_gpu.txt 2>&1; echo "rc $?"
step "bench_torch.py"
timeout 150 python3 tests/gpu/bench_torch.py > $OUT/bench_torch.txt 2>&1; echo "rc $?"
cat $OUT/bench_gpu.txt $OUT/bench_torch.txt
step end
