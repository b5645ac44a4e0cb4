#!/usr/bin/env bash
# Session 13, run 5 (final build): the check with the tensor-wise A scale applied as a scalar of
# the projection (QsGemmDesc::sketch_view). Correctness (full sketch section incl. odd K, the
# rest quick), v1 (= 259cd5c) vs new side by side with the production GEMMs, stage times, the
# shim end to end, and what it does to issue 4's prefill and graph-decode numbers.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
stamp() { echo "-- $(date -u +%T) $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
stamp "selftest (new)"
quantshadow selftest --only sketch 2>&1 | grep -v "| pass |" | tail -6
quantshadow selftest --quick --only helpers,compare,logits,detached,ring 2>&1 | grep -v "| pass |" | tail -4
stamp "plain bench, alternating"
for r in 1 2; do
  for v in v1 main; do
    PATH=$PWD/.gpu/$v:$PATH quantshadow bench gpu --only sketch --m 1,16,4096 --probes 32 2>&1 | grep "^| sketch |\|rror" | sed "s/^/$v r$r /"
  done
done
stamp "production GEMMs"
python3 tests/gpu/bench_torch.py 2>&1 | grep "| 4096 |\|| 1 |\|| 16 |"
stamp "stages (new)"
QUANTSHADOW_KERNEL_DEFINES="QS_SKETCH_TIMING=1" stdbuf -oL quantshadow bench gpu --only sketch --m 4096 --probes 32 >/tmp/t_new.txt 2>&1
python3 tests/gpu/stage_times.py new </tmp/t_new.txt | grep "in place"
stamp "shim end to end (new): verify_detach ops"
OUT=/tmp/vd bash tests/gpu/verify_detach.sh ops 2>&1 | grep "outputs\|Verdict\|Calls:"
stamp "issue 4: Llama 8b-width prefill (1024 tokens), 48-GEMM graph decode"
pp() { timeout 150 python3 tests/gpu/graph_profile.py "$@" 2>&1 | grep -m1 "without the profiler"; }
pp plain --prefill --llama 8b-width
for v in v1 main; do
  export LD_PRELOAD=$PWD/.gpu/$v/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all
  pp "$v-sketch-all" --prefill --llama 8b-width
  QUANTSHADOW_SKETCH_DETACH=off pp "$v-sketch-all-on-stream" --prefill --llama 8b-width
  unset LD_PRELOAD QUANTSHADOW_MODE QUANTSHADOW_SAMPLE
done
pp plain --repeat 8
for v in v1 main; do
  LD_PRELOAD=$PWD/.gpu/$v/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all pp "$v-sketch-all" --repeat 8
done
stamp end
