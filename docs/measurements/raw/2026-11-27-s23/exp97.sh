#!/usr/bin/env bash
# Prepared in session 22, run as the first call of session 23 (log: exp97/exp97.log).
# Builds: .gpu/base = 8e19099 (kernels and runtime as measured in exp94/exp96, plus the selftest's
# new cases and every_row_params' two extra refusals); .gpu/main = the end of session 22, which
# adds one unmeasured change: eager sketch checks on the caller's stream take their row epoch from
# a per-site host count instead of loading a device counter before drawing their rows.
# 1. The selftest cases added after the last GPU run must pass (main): "bf16 device alpha, 100
#    rows, every row copied" (detached) and "snapshot copy of every row, then its check" (early).
# 2. The check per call, host-counted epoch beside device-counted (bench columns 5 and 6), and the
#    production GEMMs (issue 3's ratio).
# 3. Llama prefill, sketch all, in-process A/B (ab_pause.py; issue 4's <= 5%), last measured in
#    session 18 (+5.6% at 1024 wide, +11.5% at 8b widths): base and main, two rounds per width.
# 4. Llama small graph decode, 2 rounds against plain (issue 4's <= 10%; session 22: -8.8 to -9.6%).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "selftest detached, early, sketch, ring"
timeout 200 quantshadow selftest --quick --only detached,early,sketch,ring > $OUT/selftest.txt 2>&1
grep -E "FAIL|passed|failed|every row|every snapshot" $OUT/selftest.txt | head -12
step "check per call (main), production GEMMs"
timeout 300 quantshadow bench gpu --only sketch --m 512,4096 --probes 32 > $OUT/bench_sketch.txt 2>&1; grep -E "^\|" $OUT/bench_sketch.txt | head -30
timeout 200 python3 tests/gpu/bench_torch.py > $OUT/bench_torch.txt 2>&1; sed -n '/production/,$p' $OUT/bench_torch.txt | head -30
step "Llama prefill A/B"
ab() { env LD_PRELOAD=$PWD/.gpu/$3/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info \
  timeout 150 python3 tests/gpu/ab_pause.py "$1" --llama "$2" 2>$OUT/ab_err.txt | grep '^{' || tail -3 $OUT/ab_err.txt; grep -hE "skipped:" $OUT/ab_err.txt | sed 's/^/   /'; }
for round in 1 2; do
  for m in small 8b-width; do for b in base main; do ab "$b $m r$round" $m $b; done; done
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
