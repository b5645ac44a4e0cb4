#!/usr/bin/env bash
# Grouped snapshot copies in decode graphs (qs_sketch_snap_group): correctness (selftest
# detached incl. the grouped = one-by-one case, torch_ops identical, Llama tokens identical),
# one 48-GEMM replay's timeline, then graph decode against base 54fdfe3: the bf16 and FP8
# 48-layer stacks and Llama small, plain / base / main, sketch all, two rounds.
# Two device calls (10 minutes each at most): exp72.sh a (correctness, timeline, bf16 stack),
# exp72.sh b (FP8 stack, Llama small).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
part=${1:-a}
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
shim() { local b=$1; shift; LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info "$@"; }
stack() {
  for round in 1 2; do
    step "48-layer stack $1, round $round"
    echo "plain $(timeout 150 python3 tests/gpu/overhead_mlp.py $1 --repeat 8)"
    for b in base main; do
      echo "$b $(shim $b timeout 150 python3 tests/gpu/overhead_mlp.py $1 --repeat 8 2>$OUT/mlp_$b.err)"
      grep -hE "closing:|skipped:" $OUT/mlp_$b.err | head -3 | sed 's/^/   /'
    done
  done
}
if [ "$part" = a ]; then
step "selftest detached, ring, sketch"
timeout 300 quantshadow selftest --quick --only detached,ring,sketch > $OUT/selftest.txt 2>&1
grep -E "FAIL|passed|failed|grouped" $OUT/selftest.txt | head -12
step "torch_ops (default), Llama small eager + graph"
QUANTSHADOW_LOG=info timeout 200 bash tests/gpu/verify_shim.sh ops 2>&1 | grep -E "outputs"
grep -hE "closing:|skipped:" $OUT/ops_sketch.log | head -3
QUANTSHADOW_LOG=info timeout 300 bash tests/gpu/verify_shim.sh llama 2>&1 | tail -3
step "48-GEMM replay timeline (main)"
QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so \
  timeout 300 python3 tests/gpu/graph_profile.py grouped48 --repeat 8 --timeline > $OUT/timeline48.txt 2>&1
grep -E "checks on|per replay|closing|skipped:" $OUT/timeline48.txt | head
echo "copy kernels per replay: $(grep -c 'qs_sketch_snap' $OUT/timeline48.txt) lines (timeline + table)"
stack ""
else
stack --fp8
for round in 1 2; do
  step "Llama small graph decode, round $round"
  timeout 200 python3 tests/gpu/torch_llama.py $OUT/g.json --graph --graph-only --timing --size small >/dev/null 2>&1
  echo "plain $(python3 -c "import json;print(json.load(open('$OUT/g.json')).get('decode_graph_tok_s'))")"
  for b in base main; do
    shim $b timeout 200 python3 tests/gpu/torch_llama.py $OUT/g.json --graph --graph-only --timing --size small >/dev/null 2>$OUT/g_$b.err
    echo "$b $(python3 -c "import json;print(json.load(open('$OUT/g.json')).get('decode_graph_tok_s'))")"
    grep -hE "closing:|skipped:" $OUT/g_$b.err | head -3 | sed 's/^/   /'
  done
done
fi
step end
