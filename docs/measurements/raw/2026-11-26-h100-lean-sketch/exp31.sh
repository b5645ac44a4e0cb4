#!/usr/bin/env bash
# Session 14, run 11 (final build): the finishing prologue behind the first loads.
# Correctness, stages, both kernels side by side with the production GEMMs, the shim end to
# end, issue 4's prefill (lean and general, two rounds after a warm-up).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
stamp() { echo "-- $(date -u +%T) $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
stamp selftest
timeout 300 quantshadow selftest --only sketch 2>&1 | grep -v "| pass |" | tail -8
timeout 200 quantshadow selftest --quick --only helpers,compare,logits,detached,ring 2>&1 | grep -v "| pass |" | tail -6
stamp stages
QUANTSHADOW_KERNEL_DEFINES="QS_SKETCH_TIMING=1" timeout 120 stdbuf -oL quantshadow bench gpu --only sketch --m 4096 --probes 32 > /tmp/timing.txt 2>&1
python3 tests/gpu/lean_stages.py lean < /tmp/timing.txt
stamp bench
for r in 1 2; do
  timeout 200 quantshadow bench gpu --only sketch --m 1,16,4096 --probes 32 2>&1 | grep "^| sketch\|rror\|anic" | sed "s/^/r$r /"
done
timeout 200 python3 tests/gpu/bench_torch.py 2>&1 | grep "| 4096 |\|| 1 |\|| 16 |"
stamp "shim end to end: verify_detach ops"
OUT=/tmp/vd timeout 300 bash tests/gpu/verify_detach.sh ops 2>&1 | grep "outputs\|Verdict"
stamp "issue 4: Llama 8b-width prefill (1024 tokens)"
pp() { timeout 150 python3 tests/gpu/graph_profile.py "$@" 2>&1 | grep -m1 "without the profiler"; }
shim() { LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all "$@"; }
shim pp warm-up --prefill --llama 8b-width >/dev/null
for r in 1 2; do
  pp "plain r$r" --prefill --llama 8b-width
  QUANTSHADOW_SKETCH_LEAN=1 shim pp "lean detached r$r" --prefill --llama 8b-width
  QUANTSHADOW_SKETCH_LEAN=0 shim pp "general detached r$r" --prefill --llama 8b-width
done
stamp end
