#!/usr/bin/env bash
# NOT RUN (prepared in session 22, no device time left): the first call of the next session.
# .gpu/main = the tree at the end of session 22 (same runtime and kernels as exp94's main
# 8784c2b, plus the selftest's new cases and every_row_params' two extra refusals).
# 1. The selftest cases added after the last GPU run must pass: "bf16 device alpha, 100 rows,
#    every row copied" (detached) and "snapshot copy of every row, then its check" (early).
# 2. Llama prefill, sketch all, in-process A/B (ab_pause.py; issue 4's <= 5%), last measured in
#    session 18 (+5.6% at 1024 wide, +11.5% at 8b widths): two rounds per width.
# 3. Llama small graph decode, 2 rounds against plain (issue 4's <= 10%; session 22: -8.8 to -9.6%).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "selftest detached, early, sketch, ring"
timeout 200 quantshadow selftest --quick --only detached,early,sketch,ring > $OUT/selftest.txt 2>&1
grep -E "FAIL|passed|failed|every row|every snapshot" $OUT/selftest.txt | head -12
step "Llama prefill A/B"
ab() { env LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info \
  timeout 150 python3 tests/gpu/ab_pause.py "$1" --llama "$2" 2>$OUT/ab_err.txt | grep '^{' || tail -3 $OUT/ab_err.txt; grep -hE "skipped:" $OUT/ab_err.txt | sed 's/^/   /'; }
for round in 1 2; do
  for m in small 8b-width; do ab "main $m r$round" $m; done
done
step "Llama small graph decode"
tok() { python3 -c "import json;print(round(json.load(open('$1')).get('decode_graph_tok_s'),1))"; }
L="tests/gpu/torch_llama.py OUTFILE --graph --graph-only --timing --size small --trials 7"
for round in 1 2; do
  timeout 200 python3 ${L/OUTFILE/$OUT/lp.json} >/dev/null 2>&1
  LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info \
    timeout 200 python3 ${L/OUTFILE/$OUT/lm.json} >/dev/null 2>$OUT/lm.err
  echo "r$round plain $(tok $OUT/lp.json) main $(tok $OUT/lm.json) tokens $(same $OUT/lp.json $OUT/lm.json) $(grep -h 'closing:' $OUT/lm.err | sed 's/.*closing: //')"
done
step end
