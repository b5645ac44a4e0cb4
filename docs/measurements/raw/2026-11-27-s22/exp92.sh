#!/usr/bin/env bash
# Session 22: where the Llama small decode step's remaining shim time goes. One replay's timeline
# without the shim and under main (HEAD of session 21, 21f58a4), then 3 more rounds plain/main.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
tok() { python3 -c "import json;print(round(json.load(open('$1')).get('decode_graph_tok_s'),1))"; }
P="tests/gpu/llama_graph_floor.py X --size small --variants plain --profile"
timeout 200 python3 $P > $OUT/prof_plain.txt 2>&1; echo "plain profile rc=$?"
LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  timeout 200 python3 $P > $OUT/prof_main.txt 2>&1; echo "main profile rc=$?"
grep -E "replay|checks on" $OUT/prof_plain.txt $OUT/prof_main.txt | head -20
L="tests/gpu/torch_llama.py OUTFILE --graph --graph-only --timing --size small --trials 7"
for round in 1 2 3; do
  timeout 200 python3 ${L/OUTFILE/$OUT/lp.json} >/dev/null 2>&1
  LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info \
    timeout 200 python3 ${L/OUTFILE/$OUT/lm.json} >/dev/null 2>$OUT/lm.err
  echo "r$round plain $(tok $OUT/lp.json) main $(tok $OUT/lm.json) tokens $(same $OUT/lp.json $OUT/lm.json) $(grep -h 'closing:' $OUT/lm.err | sed 's/.*closing: //')"
done
