#!/usr/bin/env bash
# Session 26, call 5 (.gpu/main: default k = 16 probes): the shim end to end at the new default
# (torch_ops outputs, Llama small tokens and report), the bench's sketch table (issue 3's M and
# shapes, default k), and Llama small graph decode at k = 16 and k = 32 against plain (issue 4).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "verify_shim ops llama (k = 16)"
bash tests/gpu/verify_shim.sh ops llama 2>&1 | tail -8
grep -E "probes|Checks" $OUT/llama_sketch/report.md | head -4
step "bench sketch (default k, M 1, 16, 256, 4096)"
timeout 200 quantshadow bench gpu --only sketch > $OUT/bench.txt 2>&1
grep -E "^\| sketch" $OUT/bench.txt | cut -c1-200
step "Llama small graph decode: plain, k = 16, k = 32"
tok() { python3 -c "import json;print(round(json.load(open('$1')).get('decode_graph_tok_s'),1))"; }
L="tests/gpu/torch_llama.py OUTFILE --graph --graph-only --timing --size small --trials 7"
for r in 1 2; do
  timeout 150 python3 ${L/OUTFILE/$OUT/lp.json} >/dev/null 2>&1
  for k in 16 32; do
    env QUANTSHADOW_PROBES=$k LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info timeout 150 python3 ${L/OUTFILE/$OUT/lm$k.json} >/dev/null 2>$OUT/lm.err
    echo "r$r plain $(tok $OUT/lp.json) k=$k $(tok $OUT/lm$k.json) tokens $(same $OUT/lp.json $OUT/lm$k.json) $(grep -h 'closing:' $OUT/lm.err | sed 's/.*closing: //' | cut -c1-80)"
  done
done
step end
