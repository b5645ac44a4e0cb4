#!/usr/bin/env bash
# Session 20, call 2: the lean check for decode-graph checks of one row (experiment knob
# QS_EXP_LEAN_MIN_ROWS=1 with QUANTSHADOW_SKETCH_LEAN=graphs): correctness (selftest sketch,
# torch_ops), then Llama small / 8b-width graph decode and the 48-GEMM stack, plain / default /
# lean-1, and one Llama small replay on the profiler with lean-1.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
shim() { LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info "$@"; }
lean1() { QS_EXP_LEAN_MIN_ROWS=1 QUANTSHADOW_SKETCH_LEAN=graphs "$@"; }
step "selftest sketch with lean from 1 row"
QS_EXP_LEAN_MIN_ROWS=1 timeout 300 quantshadow selftest --quick --only sketch > $OUT/selftest.txt 2>&1
grep -E "FAIL|passed|failed" $OUT/selftest.txt | head -8
step "torch_ops, lean-1 in graphs"
QS_EXP_LEAN_MIN_ROWS=1 QUANTSHADOW_SKETCH_LEAN=graphs QUANTSHADOW_LOG=info timeout 200 bash tests/gpu/verify_shim.sh ops 2>&1 | grep -E "outputs"
grep -hE "closing:|skipped:" $OUT/ops_sketch.log | head -3
llama() {
  for round in $(seq 1 $2); do
    step "Llama $1 graph decode, round $round"
    timeout 200 python3 tests/gpu/torch_llama.py $OUT/g.json --graph --graph-only --timing --size $1 >/dev/null 2>&1
    echo "plain $(python3 -c "import json;print(json.load(open('$OUT/g.json')).get('decode_graph_tok_s'))")"
    shim timeout 200 python3 tests/gpu/torch_llama.py $OUT/g.json --graph --graph-only --timing --size $1 >/dev/null 2>$OUT/g_d.err
    echo "default $(python3 -c "import json;print(json.load(open('$OUT/g.json')).get('decode_graph_tok_s'))")"
    grep -hE "closing:" $OUT/g_d.err | head -1 | sed 's/^/   /'
    lean1 shim timeout 200 python3 tests/gpu/torch_llama.py $OUT/g.json --graph --graph-only --timing --size $1 >/dev/null 2>$OUT/g_l.err
    echo "lean1 $(python3 -c "import json;print(json.load(open('$OUT/g.json')).get('decode_graph_tok_s'))")"
    grep -hE "closing:|skipped:" $OUT/g_l.err | head -3 | sed 's/^/   /'
  done
}
llama small 2
step "Llama small lean-1: one replay on the profiler"
lean1 shim timeout 300 python3 tests/gpu/llama_graph_floor.py lean1 --size small --variants plain --profile > $OUT/profile_lean1.txt 2>&1
grep -E "replay [0-9]|checks on|closing" $OUT/profile_lean1.txt
grep -E "qs_sketch" $OUT/profile_lean1.txt | tail -32 | head -32
llama 8b-width 1
step "48-GEMM stack"
echo "plain $(timeout 150 python3 tests/gpu/overhead_mlp.py --repeat 8)"
echo "default $(shim timeout 150 python3 tests/gpu/overhead_mlp.py --repeat 8 2>$OUT/m_d.err)"
echo "lean1 $(lean1 shim timeout 150 python3 tests/gpu/overhead_mlp.py --repeat 8 2>$OUT/m_l.err)"
grep -hE "closing:|skipped:" $OUT/m_l.err | head -3
step end
