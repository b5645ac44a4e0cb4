#!/usr/bin/env bash
# Session 13, run 4: W_R in mma fragment order (fewer register moves in A W_R) and FP8 A rows
# decoded through the hardware f16 conversion. Correctness of the new build (full sketch section,
# with an odd-K case), then v1 (= 259cd5c) vs new side by side, production GEMMs, stages.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
stamp() { echo "-- $(date -u +%T) $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
stamp "selftest sketch (full) + detached, helpers, compare, logits, ring (new)"
quantshadow selftest --only sketch 2>&1 | grep -v "| pass |" | tail -12
quantshadow selftest --quick --only helpers,compare,logits,detached,ring 2>&1 | grep -v "| pass |" | tail -8
stamp "plain bench, alternating"
for r in 1 2; do
  for v in v1 main; do
    PATH=$PWD/.gpu/$v:$PATH quantshadow bench gpu --only sketch --m 1,4096 --probes 32 2>&1 | grep "^| sketch |\|rror" | sed "s/^/$v r$r /"
  done
done
PATH=$PWD/.gpu/main:$PATH quantshadow bench gpu --only sketch --m 4096 --probes 8,16 2>&1 | grep "^| sketch |\|rror" | sed "s/^/main kp8,16 /"
stamp "production GEMMs"
python3 tests/gpu/bench_torch.py 2>&1 | grep "| 4096 |\|| 1 |"
stamp "stages (new)"
QUANTSHADOW_KERNEL_DEFINES="QS_SKETCH_TIMING=1" stdbuf -oL quantshadow bench gpu --only sketch --m 4096 --probes 32 >/tmp/t_new.txt 2>&1
python3 tests/gpu/stage_times.py new </tmp/t_new.txt | grep "in place"
stamp "shim end to end (new): verify_detach ops"
OUT=/tmp/vd bash tests/gpu/verify_detach.sh ops 2>&1 | grep "outputs\|Verdict\|Calls:"
stamp end
