#!/usr/bin/env bash
# Session 24: the final build, QUANTSHADOW_SKETCH_SPLIT=auto by default (GEMMs of 2^36 flops or
# more split, buffers in turn). One build (.gpu/main); A/B: default against SPLIT=0 (fused).
# 1. ab_pause, one GEMM back to back (issue 3's M = 4096 shapes).
# 2. Llama prefill at 8b widths (its MLP GEMMs are split, its attention projections not).
# 3. Llama under quantshadow run (tokens identical, report), and its graph decode (issue 4).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
shim() { env LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all "$@"; }
ab() { env $3 QUANTSHADOW_LOG=info LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  timeout 150 python3 tests/gpu/ab_pause.py "$1" $2 2>$OUT/ab_err.txt | grep '^{' | cut -c1-160 || tail -3 $OUT/ab_err.txt
  grep -hE "skipped:" $OUT/ab_err.txt | grep -v paused | sed 's/^/   /' | cut -c1-200 | head -3; }
step "one GEMM back to back, A/B"
for round in 1 2; do for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do
  ab "$g default r$round" "--gemm $g --trials 11 --passes 50" QUANTSHADOW_X=0
  ab "$g split=0 r$round" "--gemm $g --trials 11 --passes 50" QUANTSHADOW_SKETCH_SPLIT=0
done; done
for g in fp8:4096:14336:4096 fp8:4096:4096:14336 bf16:4096:14336:4096; do
  ab "$g default" "--gemm $g --trials 7 --passes 30" QUANTSHADOW_X=0
  ab "$g split=0" "--gemm $g --trials 7 --passes 30" QUANTSHADOW_SKETCH_SPLIT=0
done
step "Llama 8b-width prefill A/B"
for round in 1 2; do
  ab "8b-width default r$round" "--llama 8b-width" QUANTSHADOW_X=0
  ab "8b-width split=0 r$round" "--llama 8b-width" QUANTSHADOW_SKETCH_SPLIT=0
done
step "Llama under quantshadow run (default)"
timeout 200 python3 tests/gpu/torch_llama.py $OUT/llama_plain.json > $OUT/llama_plain.log 2>&1
timeout 240 quantshadow run --mode sketch --sample all --label llama --out $OUT/llama_run -- python3 tests/gpu/torch_llama.py $OUT/llama_shim.json > $OUT/llama_run.log 2>&1
echo "llama: exit $?, tokens $(same $OUT/llama_plain.json $OUT/llama_shim.json)"; grep -E "^\*\*|Calls:" $OUT/llama_run/report.md | head -3
grep -o "sketch.split[^,;|]*" $OUT/llama_run/report.md | head -1
rm -rf $OUT/llama_run/*.svg $OUT/llama_run/*.qsr
step "Llama small graph decode"
tok() { python3 -c "import json;print(round(json.load(open('$1')).get('decode_graph_tok_s'),1))"; }
L="tests/gpu/torch_llama.py OUTFILE --graph --graph-only --timing --size small --trials 7"
timeout 150 python3 ${L/OUTFILE/$OUT/lp.json} >/dev/null 2>&1
shim QUANTSHADOW_LOG=info timeout 150 python3 ${L/OUTFILE/$OUT/lm.json} >/dev/null 2>$OUT/lm.err
echo "plain $(tok $OUT/lp.json) main $(tok $OUT/lm.json) tokens $(same $OUT/lp.json $OUT/lm.json) $(grep -h 'closing:' $OUT/lm.err | sed 's/.*closing: //')"
step end
