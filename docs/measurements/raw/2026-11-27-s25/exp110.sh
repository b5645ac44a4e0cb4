#!/usr/bin/env bash
# Session 25: the floor under issue 3's 5% for any on-stream snapshot, without the shim
# (tests/gpu/on_stream_floor.py: an empty kernel, torch.index_select, a plain Triton gather and a
# plain Triton projection behind one GEMM called back to back), beside the shim's own cost
# (ab_pause, default build) in the same call.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "floor without the shim"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096 fp8:4096:14336:4096; do
  timeout 150 python3 tests/gpu/on_stream_floor.py $g 2>&1 | tail -8
done
step "the shim (default) on the same GEMMs"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do
  env LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
    timeout 150 python3 tests/gpu/ab_pause.py --gemm $g --trials 11 --passes 50 2>&1 | tail -3
done
step end
