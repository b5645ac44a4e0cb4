#!/usr/bin/env bash
# exp87 (session 21, prepared in session 20 as exp84_next.sh): which part of the lean snapshot copy
# costs the ~0.6-0.8 us per copy that a rows-only copy saves in graph decode (exp82). Build with
# copy_cost_knobs.patch applied (kernel #ifdefs QS_EXP_SNAP_NO_COUNT / _NO_WAIT / _NO_HEADER and
# the engine knob QS_EXP_NO_DEFERRED_CHECKS: copies only), staged as .gpu/exp.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
nvidia-smi --query-gpu=name --format=csv,noheader
shim() { LD_PRELOAD=$PWD/.gpu/exp/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QS_EXP_NO_DEFERRED_CHECKS=1 "$@"; }
tok() { python3 -c "import json;print(round(json.load(open('$OUT/g.json')).get('decode_graph_tok_s'),1))"; }
L="tests/gpu/torch_llama.py $OUT/g.json --graph --graph-only --timing --size small --trials 7"
for round in 1 2; do
  timeout 200 python3 $L >/dev/null 2>&1; echo "round $round plain $(tok)"
  for d in "" QS_EXP_SNAP_NO_COUNT=1 QS_EXP_SNAP_NO_WAIT=1 QS_EXP_SNAP_NO_HEADER=1 \
           "QS_EXP_SNAP_NO_COUNT=1 QS_EXP_SNAP_NO_WAIT=1 QS_EXP_SNAP_NO_HEADER=1"; do
    QUANTSHADOW_KERNEL_DEFINES="$d" shim timeout 200 python3 $L >/dev/null 2>&1
    echo "round $round copies only [${d:-lean copy as is}] $(tok)"
  done
done
