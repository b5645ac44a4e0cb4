#!/usr/bin/env bash
# exp42 again, in two parts (exp43a: correctness and the 48-GEMM graph; exp43b: costs), after
# exp42 found every qs_sketch.cu program refused by the GPU host's NVRTC (generic lambdas in
# __global__ functions counted as host code; fixed by -default-device, cuda.rs NVRTC_OPTIONS) and
# the synchronous compile retried on every call (fixed). .gpu/base = be8e40c with the same
# -default-device fix only. Staging as in exp42.sh. Sub-results go to $OUT (a tarball at the end).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
step "per call behind cuBLAS (us): M 512 and 4096, 3 shapes"
shim() { LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all "$@"; }
g() {
  local err="$OUT/g_${1// /_}.err"
  QUANTSHADOW_LOG=info timeout 200 python3 tests/gpu/overhead_gemm.py --m 512,4096 --shapes 3 2>"$err" | sed "s/^/$1 /" | tee -a $OUT/gemm.log
  grep -h "early start\|closing" "$err" | sed "s/^/$1: /"  # did early starts happen, how many checks
}
for r in 1 2; do
  g "r$r plain"
  QUANTSHADOW_SKETCH_DETACH=off QUANTSHADOW_EARLY_START=1 shim g "r$r stream_early"
  QUANTSHADOW_SKETCH_DETACH=off QUANTSHADOW_EARLY_START=0 shim g "r$r stream_order"
  QUANTSHADOW_SKETCH_DETACH=on QUANTSHADOW_EARLY_START=1 shim g "r$r detach_early"
  QUANTSHADOW_SKETCH_DETACH=on QUANTSHADOW_EARLY_START=0 shim g "r$r detach_order"
done
python3 tests/gpu/early_table.py $OUT/gemm.log
step "issue 4: Llama 8b-width prefill (1024 tokens)"
pp() { timeout 150 python3 tests/gpu/graph_profile.py "$@" 2>&1 | grep -m1 "without the profiler"; }
shim pp warm-up --prefill --llama 8b-width >/dev/null
for r in 1 2; do
  pp "plain r$r" --prefill --llama 8b-width
  QUANTSHADOW_EARLY_START=1 shim pp "detached early r$r" --prefill --llama 8b-width
  QUANTSHADOW_EARLY_START=0 shim pp "detached in order r$r" --prefill --llama 8b-width
  QUANTSHADOW_SKETCH_DETACH=off QUANTSHADOW_EARLY_START=1 shim pp "stream early r$r" --prefill --llama 8b-width
done
step end
