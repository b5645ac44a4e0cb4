#!/usr/bin/env bash
# Session 13, run 3: fewer instructions in the sketch check (shared-W_R fast path, cheap row
# permutation, one fence per block in the last-block protocol). Correctness of the new build,
# then v1 (HEAD) vs new side by side, the production GEMMs, stage timestamps.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
stamp() { echo "-- $(date -u +%T) $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
stamp "selftest (new)"
quantshadow selftest --quick --only helpers,compare,logits,sketch,detached,ring --json /tmp/st.json 2>&1 | grep -v "| pass |" | tail -25
stamp "plain bench, alternating"
for r in 1 2; do
  for v in v1 main; do
    PATH=$PWD/.gpu/$v:$PATH quantshadow bench gpu --only sketch --m 1,4096 --probes 32 2>&1 | grep "^| sketch \|rror" | sed "s/^/$v r$r /"
  done
done
stamp "production GEMMs"
python3 tests/gpu/bench_torch.py 2>&1 | tail -40
stamp "stages (new)"
QUANTSHADOW_KERNEL_DEFINES="QS_SKETCH_TIMING=1" stdbuf -oL quantshadow bench gpu --only sketch --m 4096 --probes 32 >/tmp/t_new.txt 2>&1
python3 tests/gpu/stage_times.py new </tmp/t_new.txt
stamp "shim end to end (new): verify_detach ops"
OUT=/tmp/vd bash tests/gpu/verify_detach.sh ops 2>&1 | tail -12
stamp end
