#!/usr/bin/env bash
# Session 20, call 6: the lean snapshot copy with its rare steps out of line (main) against
# HEAD (base): graph decode plain / base / main with tokens compared, then torch_ops under
# sketch and the detached selftest (main), then the FP8 stack.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
shim() { local b=$1; shift; LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info "$@"; }
tok() { python3 -c "import json;print(round(json.load(open('$1')).get('decode_graph_tok_s'),1))"; }
g() { python3 -c "import json,sys;print(round(json.loads(sys.stdin.read().strip().splitlines()[-1])['decode_graph_us'],1))"; }
step "Llama small graph decode: plain / base / main"
L="tests/gpu/torch_llama.py OUTFILE --graph --graph-only --timing --size small --trials 7"
timeout 200 python3 ${L/OUTFILE/$OUT/lp.json} >/dev/null 2>&1; echo "plain $(tok $OUT/lp.json)"
for b in base main; do
  shim $b timeout 200 python3 ${L/OUTFILE/$OUT/l_$b.json} >/dev/null 2>$OUT/l_$b.err
  echo "$b $(tok $OUT/l_$b.json) tokens $(same $OUT/lp.json $OUT/l_$b.json)"
  grep -h "closing:" $OUT/l_$b.err | sed 's/^/   /'
done
step "48-layer bf16 stack: plain / base / main"
M="tests/gpu/overhead_mlp.py --repeat 8"
echo "plain $(timeout 150 python3 $M | g)"
for b in base main; do echo "$b $(shim $b timeout 150 python3 $M 2>/dev/null | g)"; done
step "torch_ops sketch (main)"
python3 tests/gpu/torch_ops.py $OUT/ops_plain.json > $OUT/ops_plain.log 2>&1
quantshadow run --mode sketch --label ops --out $OUT/ops_sketch -- python3 tests/gpu/torch_ops.py $OUT/ops_sketch.json > $OUT/ops_sketch.log 2>&1
echo "ops sketch: run exit $?; outputs $(same $OUT/ops_plain.json $OUT/ops_sketch.json)"
grep -hE "closing:|skipped:" $OUT/ops_sketch.log | head -3
step "selftest detached (main)"
timeout 200 quantshadow selftest --quick --only detached > $OUT/selftest.txt 2>&1
grep -E "FAIL|passed|failed" $OUT/selftest.txt | head -8
step "48-layer FP8 stack: plain / base / main"
M="tests/gpu/overhead_mlp.py --repeat 8 --fp8"
echo "plain $(timeout 150 python3 $M | g)"
for b in base main; do echo "$b $(shim $b timeout 150 python3 $M 2>/dev/null | g)"; done
step end
