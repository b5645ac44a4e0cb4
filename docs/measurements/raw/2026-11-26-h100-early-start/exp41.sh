#!/usr/bin/env bash
# Session 15, run 1: early start (programmatic dependent launch) of on-stream sketch checks and
# eager snapshot copies. Correctness first, then the cost per call behind real cuBLAS GEMMs
# (overhead_gemm.py under the shim, early on / off interleaved), then Llama 8b-width prefill.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
stamp() { echo "-- $(date -u +%T) $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
md5sum .gpu/main/*
stamp selftest
export QUANTSHADOW_EARLY_START=1  # off by default until this run
timeout 300 quantshadow selftest --only sketch 2>&1 | grep -v "| pass |" | tail -8
timeout 200 quantshadow selftest --quick --only helpers,compare,logits,detached,ring 2>&1 | grep -v "| pass |" | tail -6
stamp "shim end to end: verify_detach ops"
OUT=/tmp/vd timeout 300 bash tests/gpu/verify_detach.sh ops 2>&1 | grep "outputs\|Verdict"
unset QUANTSHADOW_EARLY_START
stamp "per call behind cuBLAS (us), M 512 and 4096, 3 shapes"
shim() { LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all "$@"; }
g() { timeout 200 python3 tests/gpu/overhead_gemm.py --m 512,4096 --shapes 3 2>/dev/null | sed "s/^/$1 /"; }
for r in 1 2 3; do
  g "r$r plain"
  QUANTSHADOW_SKETCH_DETACH=off QUANTSHADOW_EARLY_START=1 shim g "r$r stream_early"
  QUANTSHADOW_SKETCH_DETACH=off QUANTSHADOW_EARLY_START=0 shim g "r$r stream_order"
  QUANTSHADOW_SKETCH_DETACH=on QUANTSHADOW_EARLY_START=1 shim g "r$r detach_early"
  QUANTSHADOW_SKETCH_DETACH=on QUANTSHADOW_EARLY_START=0 shim g "r$r detach_order"
done
stamp "issue 4: Llama 8b-width prefill (1024 tokens)"
pp() { timeout 150 python3 tests/gpu/graph_profile.py "$@" 2>&1 | grep -m1 "without the profiler"; }
shim pp warm-up --prefill --llama 8b-width >/dev/null
for r in 1 2; do
  pp "plain r$r" --prefill --llama 8b-width
  QUANTSHADOW_EARLY_START=1 shim pp "detached early r$r" --prefill --llama 8b-width
  QUANTSHADOW_EARLY_START=0 shim pp "detached in order r$r" --prefill --llama 8b-width
done
stamp end
