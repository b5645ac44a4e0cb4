#!/usr/bin/env bash
# exp90 (session 21): the session's final build (main: the lean copy of every row without a
# count, and deferred checks beside a capture's far larger GEMM) against base = 4f2d481 (end
# of session 20): Llama small graph decode (tokens compared), the 48-GEMM bf16 and FP8 stacks,
# Llama 8b-width, and torch_ops under sketch and rows.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
shim() { local b=$1; shift; LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info "$@"; }
tok() { python3 -c "import json;print(round(json.load(open('$1')).get('decode_graph_tok_s'),1))"; }
g() { python3 -c "import json,sys;print(round(json.loads(sys.stdin.read().strip().splitlines()[-1])['decode_graph_us'],1))"; }
llama() {
  local size=$1 rounds=$2
  L="tests/gpu/torch_llama.py OUTFILE --graph --graph-only --timing --size $size --trials 7"
  for round in $(seq $rounds); do
    timeout 200 python3 ${L/OUTFILE/$OUT/lp.json} >/dev/null 2>&1; echo "$size r$round plain $(tok $OUT/lp.json)"
    for b in base main; do
      shim $b timeout 200 python3 ${L/OUTFILE/$OUT/l_$b.json} >/dev/null 2>$OUT/l_$b.err
      echo "$size r$round $b $(tok $OUT/l_$b.json) tokens $(same $OUT/lp.json $OUT/l_$b.json) $(grep -h 'closing:' $OUT/l_$b.err | sed 's/.*closing: //')"
    done
  done
}
step "Llama small graph decode"
llama small 2
step "48-GEMM bf16 stack"
M="tests/gpu/overhead_mlp.py --repeat 8"
echo "plain $(timeout 150 python3 $M | g)"
for b in base main; do echo "$b $(shim $b timeout 150 python3 $M 2>/dev/null | g)"; done
step "48-layer FP8 stack"
M="tests/gpu/overhead_mlp.py --repeat 8 --fp8"
echo "plain $(timeout 150 python3 $M | g)"
for b in base main; do echo "$b $(shim $b timeout 150 python3 $M 2>/dev/null | g)"; done
step "torch_ops under sketch and rows (main)"
QUANTSHADOW_LOG=info timeout 200 bash tests/gpu/verify_shim.sh ops 2>&1 | grep -E "outputs|closing|skipped:" | head -6
step "Llama 8b-width graph decode"
llama 8b-width 1
step end
