#!/usr/bin/env bash
# Session 25, final: the row-window build (.gpu/win = 8092642, the session's kernel and engine
# state) against the session's base (.gpu/base = 81935de) in one call: ab_pause on issue 3's
# M = 4096 shapes, Llama 8b-width prefill (issue 4), Llama small graph decode (issue 4).
source tests/gpu/common.sh
export PATH=$PWD/.gpu/win:$PATH
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
ab() { env $4 QUANTSHADOW_LOG=info LD_PRELOAD=$PWD/.gpu/$3/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  timeout 150 python3 tests/gpu/ab_pause.py "$1" $2 2>$OUT/ab_err.txt | grep '^{' | cut -c1-160 || tail -3 $OUT/ab_err.txt
  grep -hE "skipped:" $OUT/ab_err.txt | grep -v paused | sed 's/^/   /' | cut -c1-200 | head -3; }
step "one GEMM back to back, A/B"
for round in 1 2; do for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do
  ab "$g base r$round" "--gemm $g --trials 11 --passes 50" base QUANTSHADOW_X=0
  ab "$g win r$round" "--gemm $g --trials 11 --passes 50" win QUANTSHADOW_X=0
done; done
for g in fp8:4096:14336:4096 fp8:4096:4096:14336 bf16:4096:14336:4096 bf16:4096:4096:14336; do
  ab "$g base" "--gemm $g --trials 7 --passes 30" base QUANTSHADOW_X=0
  ab "$g win" "--gemm $g --trials 7 --passes 30" win QUANTSHADOW_X=0
done
step "Llama 8b-width prefill A/B"
for round in 1 2; do
  ab "8b-width base r$round" "--llama 8b-width" base QUANTSHADOW_X=0
  ab "8b-width win r$round" "--llama 8b-width" win QUANTSHADOW_X=0
done
step "Llama small graph decode (win)"
tok() { python3 -c "import json;print(round(json.load(open('$1')).get('decode_graph_tok_s'),1))"; }
L="tests/gpu/torch_llama.py OUTFILE --graph --graph-only --timing --size small --trials 7"
timeout 150 python3 ${L/OUTFILE/$OUT/lp.json} >/dev/null 2>&1
env LD_PRELOAD=$PWD/.gpu/win/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info timeout 150 python3 ${L/OUTFILE/$OUT/lm.json} >/dev/null 2>$OUT/lm.err
echo "plain $(tok $OUT/lp.json) win $(tok $OUT/lm.json) tokens $(same $OUT/lp.json $OUT/lm.json) $(grep -h 'closing:' $OUT/lm.err | sed 's/.*closing: //')"
step end
