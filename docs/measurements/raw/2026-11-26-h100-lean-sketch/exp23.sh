#!/usr/bin/env bash
# Session 14, run 3 (final build): lean kernel with the W_R / sign loads of the first iteration
# issued before the rows are drawn, the second cluster barrier split (arrive / wait), and the
# selection rule (>= 16 rows, N <= 16384). Correctness, both kernels side by side with the
# production GEMMs, stage times, the shim end to end, and issue 4's prefill.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
stamp() { echo "-- $(date -u +%T) $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
stamp selftest
timeout 300 quantshadow selftest --only sketch 2>&1 | grep -v "| pass |" | tail -8
timeout 200 quantshadow selftest --quick --only helpers,compare,logits,detached,ring 2>&1 | grep -v "| pass |" | tail -6
stamp "bench (lean and general kernels side by side), two rounds"
for r in 1 2; do
  timeout 200 quantshadow bench gpu --only sketch --m 1,16,4096 --probes 32 2>&1 | grep "^| sketch\|rror\|anic" | sed "s/^/r$r /"
done
stamp "production GEMMs"
timeout 200 python3 tests/gpu/bench_torch.py 2>&1 | grep "| 4096 |\|| 1 |\|| 16 |"
stamp "stages"
QUANTSHADOW_KERNEL_DEFINES="QS_SKETCH_TIMING=1" timeout 120 stdbuf -oL quantshadow bench gpu --only sketch --m 4096 --probes 32 > /tmp/timing.txt 2>&1
python3 tests/gpu/stage_times.py final < /tmp/timing.txt | grep "M=4096 [0-9]*x[0-9]* \[lean in place\|M=4096 [0-9]*x[0-9]* \[in place"
grep QS_LEAN_STAGES /tmp/timing.txt | python3 -c "import sys,statistics as s; r=[l.split() for l in sys.stdin]; print('lean sync1 median', s.median(int(x[2]) for x in r)/1e3, 'arrive', s.median(int(x[4]) for x in r)/1e3, '(all shapes)')"
stamp "shim end to end: verify_detach ops"
OUT=/tmp/vd timeout 300 bash tests/gpu/verify_detach.sh ops 2>&1 | grep "outputs\|Verdict\|Calls:"
stamp "issue 4: Llama 8b-width prefill (1024 tokens), lean (default) and general (QUANTSHADOW_SKETCH_LEAN=0)"
pp() { timeout 150 python3 tests/gpu/graph_profile.py "$@" 2>&1 | grep -m1 "without the profiler"; }
pp plain --prefill --llama 8b-width
for lean in 1 0; do
  export LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_SKETCH_LEAN=$lean
  pp "lean=$lean-sketch-all" --prefill --llama 8b-width
  QUANTSHADOW_SKETCH_DETACH=off pp "lean=$lean-sketch-all-on-stream" --prefill --llama 8b-width
  unset LD_PRELOAD QUANTSHADOW_MODE QUANTSHADOW_SAMPLE QUANTSHADOW_SKETCH_LEAN
done
pp plain --prefill --llama 8b-width
stamp end
