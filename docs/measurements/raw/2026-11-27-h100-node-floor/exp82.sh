#!/usr/bin/env bash
# Session 20, call 5: graph decode overhead split into the snapshot copies and the checks
# (experiment knob QS_EXP_NO_DEFERRED_CHECKS: copies only), and what a minimal copy kernel
# would save (QUANTSHADOW_KERNEL_DEFINES=QS_EXP_SNAP_MINIMAL=1: rows only; timing only).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
shim() { LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info "$@"; }
tok() { python3 -c "import json;print(round(json.load(open('$OUT/g.json')).get('decode_graph_tok_s'),1))"; }
step "Llama small graph decode"
L="tests/gpu/torch_llama.py $OUT/g.json --graph --graph-only --timing --size small"
timeout 200 python3 $L >/dev/null 2>&1; echo "plain $(tok)"
shim timeout 200 python3 $L >/dev/null 2>$OUT/e1; echo "default $(tok)"
QS_EXP_NO_DEFERRED_CHECKS=1 shim timeout 200 python3 $L >/dev/null 2>$OUT/e2; echo "copies only $(tok)"
QUANTSHADOW_KERNEL_DEFINES=QS_EXP_SNAP_MINIMAL=1 QS_EXP_NO_DEFERRED_CHECKS=1 shim timeout 200 python3 $L >/dev/null 2>$OUT/e3; echo "minimal copies only $(tok)"
grep -h "closing:" $OUT/e1 $OUT/e2 $OUT/e3 | sed 's/^/   /'
step "48-GEMM stack"
M="tests/gpu/overhead_mlp.py --repeat 8"
g() { python3 -c "import json,sys;print(round(json.loads(sys.stdin.read().strip().splitlines()[-1])['decode_graph_us'],1))"; }
echo "plain $(timeout 150 python3 $M | g)"
echo "default $(shim timeout 150 python3 $M 2>/dev/null | g)"
echo "copies only $(QS_EXP_NO_DEFERRED_CHECKS=1 shim timeout 150 python3 $M 2>/dev/null | g)"
echo "minimal copies only $(QUANTSHADOW_KERNEL_DEFINES=QS_EXP_SNAP_MINIMAL=1 QS_EXP_NO_DEFERRED_CHECKS=1 shim timeout 150 python3 $M 2>/dev/null | g)"
step end
