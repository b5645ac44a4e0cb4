#!/usr/bin/env bash
# Session 13, run 6 (review): the experiment chunk knobs removed and one reciprocal per permuted
# row. Same results expected; v1 (= 8cbb39d) vs new side by side.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
stamp() { echo "-- $(date -u +%T) $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
stamp selftest
quantshadow selftest --only sketch 2>&1 | tail -1
quantshadow selftest --quick --only helpers,compare,logits,detached,ring 2>&1 | grep -v "| pass |" | tail -2
stamp bench
for v in v1 main v1 main; do
  PATH=$PWD/.gpu/$v:$PATH quantshadow bench gpu --only sketch --m 1,4096 --probes 32 2>&1 | grep "^| sketch |.* 4096x4096 \|rror" | sed "s/^/$v /"
done
stamp verify_detach
OUT=/tmp/vd bash tests/gpu/verify_detach.sh ops 2>&1 | grep "outputs\|Verdict"
stamp end
