#!/usr/bin/env bash
# The final build: torch_ops and Llama small (default), then graph decode under the default
# against base 66dbd03: the FP8 48-layer stack (overhead_mlp.py --fp8 --repeat 8) and the Llama
# models' graph decode (torch_llama.py --graph-only --timing), plain / base / main, sketch all.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
step "selftest ring, detached, sketch (final build)"
timeout 300 quantshadow selftest --quick --only ring,detached,sketch 2>&1 | grep -E "FAIL|passed|failed" | head -10
step "torch_ops, Llama small (final build)"
QUANTSHADOW_LOG=info timeout 200 bash tests/gpu/verify_shim.sh ops 2>&1 | grep -E "outputs"
grep -hE "closing:|skipped:" $OUT/ops_sketch.log | head -3
QUANTSHADOW_LOG=info timeout 300 bash tests/gpu/verify_shim.sh llama 2>&1 | tail -3
shim() { local b=$1; shift; LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info "$@"; }
for round in 1 2; do
  step "FP8 48-layer stack, round $round"
  echo "plain $(timeout 150 python3 tests/gpu/overhead_mlp.py --fp8 --repeat 8)"
  for b in base main; do
    echo "$b $(shim $b timeout 150 python3 tests/gpu/overhead_mlp.py --fp8 --repeat 8 2>$OUT/mlp_$b.err)"
    grep -hE "skipped:" $OUT/mlp_$b.err | head -1 | sed 's/^/   /'
  done
done
for size in small 8b-width; do
  for round in 1 2; do
    step "Llama $size graph decode, round $round"
    timeout 200 python3 tests/gpu/torch_llama.py $OUT/g.json --graph --graph-only --timing --size $size >/dev/null 2>&1
    echo "plain $(python3 -c "import json;print(json.load(open('$OUT/g.json')).get('decode_graph_tok_s'))")"
    for b in base main; do
      shim $b timeout 200 python3 tests/gpu/torch_llama.py $OUT/g.json --graph --graph-only --timing --size $size >/dev/null 2>$OUT/g_$b.err
      echo "$b $(python3 -c "import json;print(json.load(open('$OUT/g.json')).get('decode_graph_tok_s'))")"
      grep -hE "skipped:" $OUT/g_$b.err | head -1 | sed 's/^/   /'
    done
  done
done
step end
