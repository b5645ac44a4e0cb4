#!/usr/bin/env bash
# Session 23, final build (split checks off by default; QsSketchParams is 784 bytes now): the
# whole quick selftest, and Llama small graph decode against plain (issue 4's <= 10%), one round.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "selftest --quick"
timeout 330 quantshadow selftest --quick > $OUT/selftest.txt 2>&1; echo "exit $?"
grep -E "FAIL|passed|failed" $OUT/selftest.txt | cut -c1-300 | head -12
step "Llama small graph decode"
tok() { python3 -c "import json;print(round(json.load(open('$1')).get('decode_graph_tok_s'),1))"; }
L="tests/gpu/torch_llama.py OUTFILE --graph --graph-only --timing --size small --trials 7"
timeout 150 python3 ${L/OUTFILE/$OUT/lp.json} >/dev/null 2>&1
LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info \
  timeout 150 python3 ${L/OUTFILE/$OUT/lm.json} >/dev/null 2>$OUT/lm.err
echo "plain $(tok $OUT/lp.json) main $(tok $OUT/lm.json) tokens $(same $OUT/lp.json $OUT/lm.json) $(grep -h 'closing:' $OUT/lm.err | sed 's/.*closing: //')"
step end
