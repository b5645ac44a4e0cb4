#!/usr/bin/env bash
# exp89 (session 21): .gpu/exp = main (5b4be43, lean copy of every row without count) + the
# experiment knobs QS_EXP_CHECKS_BESIDE_BYTES (deferred checks beside the next GEMM whose B has
# at least that many bytes) and QS_EXP_BESIDE_WAVE_DIV (those checks share 1/div of the usual
# wave of blocks, to leave the GEMM room). Without knobs exp = main.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/exp/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
run() { env "$@" LD_PRELOAD=$PWD/.gpu/exp/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info; }
tok() { python3 -c "import json;print(round(json.load(open('$1')).get('decode_graph_tok_s'),1))"; }
g() { python3 -c "import json,sys;print(round(json.loads(sys.stdin.read().strip().splitlines()[-1])['decode_graph_us'],1))"; }
step "Llama small graph decode"
L="tests/gpu/torch_llama.py OUTFILE --graph --graph-only --timing --size small --trials 7"
for round in 1 2; do
  timeout 200 python3 ${L/OUTFILE/$OUT/lp.json} >/dev/null 2>&1; echo "r$round plain $(tok $OUT/lp.json)"
  i=0
  for knobs in "X=0" "QS_EXP_CHECKS_BESIDE_BYTES=16000000" "QS_EXP_CHECKS_BESIDE_BYTES=16000000 QS_EXP_BESIDE_WAVE_DIV=4"; do
    i=$((i+1))
    env $knobs LD_PRELOAD=$PWD/.gpu/exp/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info \
      timeout 200 python3 ${L/OUTFILE/$OUT/l_$i.json} >/dev/null 2>$OUT/l_$i.err
    echo "r$round [$knobs] $(tok $OUT/l_$i.json) tokens $(same $OUT/lp.json $OUT/l_$i.json) $(grep -h 'closing:' $OUT/l_$i.err | sed 's/.*closing: //')"
  done
done
step "48-GEMM bf16 stack"
M="tests/gpu/overhead_mlp.py --repeat 8"
echo "plain $(timeout 150 python3 $M | g)"
for knobs in "X=0" "QS_EXP_CHECKS_BESIDE_BYTES=100000000 QS_EXP_BESIDE_WAVE_DIV=4" \
             "QS_EXP_CHECKS_BESIDE_BYTES=100000000 QS_EXP_BESIDE_WAVE_DIV=16" "QS_EXP_CHECKS_BESIDE_BYTES=30000000 QS_EXP_BESIDE_WAVE_DIV=8"; do
  echo "[$knobs] $(env $knobs LD_PRELOAD=$PWD/.gpu/exp/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all timeout 150 python3 $M 2>/dev/null | g)"
done
echo "plain $(timeout 150 python3 $M | g)"
step end
