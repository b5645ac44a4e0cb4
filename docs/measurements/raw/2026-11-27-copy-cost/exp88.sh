#!/usr/bin/env bash
# exp88 (session 21): base = 4f2d481 (end of session 20); main = the lean copy of every row
# without launch count or header barrier (5b4be43) + the experiment knob QS_EXP_CHECKS_BESIDE_BYTES
# (a capture's deferred checks go beside the next GEMM whose B has at least that many bytes).
# Correctness first (detached and sketch selftests, tokens), then graph decode A/B in one call.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
shim() { local b=$1; shift; LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info "$@"; }
tok() { python3 -c "import json;print(round(json.load(open('$1')).get('decode_graph_tok_s'),1))"; }
g() { python3 -c "import json,sys;print(round(json.loads(sys.stdin.read().strip().splitlines()[-1])['decode_graph_us'],1))"; }
step "selftest detached, sketch, ring (main)"
timeout 150 quantshadow selftest --quick --only detached,sketch,ring > $OUT/selftest.txt 2>&1
grep -E "FAIL|passed|failed" $OUT/selftest.txt | head -8
step "Llama small graph decode: plain / base / main / main + checks beside the LM head"
L="tests/gpu/torch_llama.py OUTFILE --graph --graph-only --timing --size small --trials 7"
for round in 1 2; do
  timeout 200 python3 ${L/OUTFILE/$OUT/lp.json} >/dev/null 2>&1; echo "r$round plain $(tok $OUT/lp.json)"
  for v in base main beside; do
    b=$v; env=(); [[ $v == beside ]] && { b=main; env=(QS_EXP_CHECKS_BESIDE_BYTES=16000000); }
    env "${env[@]}" LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info \
      timeout 200 python3 ${L/OUTFILE/$OUT/l_$v.json} >/dev/null 2>$OUT/l_$v.err
    echo "r$round $v $(tok $OUT/l_$v.json) tokens $(same $OUT/lp.json $OUT/l_$v.json)"
    grep -h "closing:" $OUT/l_$v.err | sed 's/^/   /'
  done
done
step "48-GEMM bf16 stack: plain / base / main / beside 100 MB (MLP) / beside 30 MB (every GEMM)"
M="tests/gpu/overhead_mlp.py --repeat 8"
echo "plain $(timeout 150 python3 $M | g)"
for b in base main; do echo "$b $(shim $b timeout 150 python3 $M 2>/dev/null | g)"; done
echo "beside100M $(QS_EXP_CHECKS_BESIDE_BYTES=100000000 shim main timeout 150 python3 $M 2>/dev/null | g)"
echo "beside30M $(QS_EXP_CHECKS_BESIDE_BYTES=30000000 shim main timeout 150 python3 $M 2>/dev/null | g)"
step "48-layer FP8 stack: plain / base / main"
M="tests/gpu/overhead_mlp.py --repeat 8 --fp8"
echo "plain $(timeout 150 python3 $M | g)"
for b in base main; do echo "$b $(shim $b timeout 150 python3 $M 2>/dev/null | g)"; done
step end
