#!/usr/bin/env bash
# NOT RUN (prepared in session 21, no device time left): the first call of the next session.
# Builds: .gpu/base = 4f2d481 (end of session 20), .gpu/mid = ffe2c3c (exp90's main: the lean
# copy of every row without a count, checks beside the vocabulary projection), .gpu/main = this
# tree. What main adds over mid has not run on a GPU:
# - 0d4218b: the beside rule needs 8 movable checks, notes weights only, keeps its sizes apart;
# - a call that overwrites C in place never runs beside a pending copy;
# - the check of a stream's last checked GEMM starts right after its copy at the capture's end
#   (beside the argmax and token kernels after the vocabulary projection);
# - kernels/qs_sketch.cu: the check's finish zeroes its slot before the claim and sample loads and
#   loads the totals first (every sketch check; the selftest below must pass before any timing),
#   and a check of one row group (decode) skips the second last-block count.
# Expected: selftests pass, tokens identical, 8452 checked and 1 skipped per Llama run; main at
# least as fast as mid on Llama small (the last item is the one that may gain).
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
step "Llama small graph decode: plain / base / mid / main"
L="tests/gpu/torch_llama.py OUTFILE --graph --graph-only --timing --size small --trials 7"
for round in 1 2; do
  timeout 200 python3 ${L/OUTFILE/$OUT/lp.json} >/dev/null 2>&1; echo "r$round plain $(tok $OUT/lp.json)"
  for b in base mid main; do
    shim $b timeout 200 python3 ${L/OUTFILE/$OUT/l_$b.json} >/dev/null 2>$OUT/l_$b.err
    echo "r$round $b $(tok $OUT/l_$b.json) tokens $(same $OUT/lp.json $OUT/l_$b.json) $(grep -h 'closing:' $OUT/l_$b.err | sed 's/.*closing: //')"
  done
done
step "48-GEMM bf16 stack"
M="tests/gpu/overhead_mlp.py --repeat 8"
echo "plain $(timeout 150 python3 $M | g)"
for b in base mid main; do echo "$b $(shim $b timeout 150 python3 $M 2>/dev/null | g)"; done
step "48-layer FP8 stack"
M="tests/gpu/overhead_mlp.py --repeat 8 --fp8"
echo "plain $(timeout 150 python3 $M | g)"
for b in mid main; do echo "$b $(shim $b timeout 150 python3 $M 2>/dev/null | g)"; done
step "main: one Llama small replay's timeline (the tail after the vocabulary projection)"
LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  timeout 200 python3 tests/gpu/llama_graph_floor.py shim --size small --variants plain --profile 2>&1 \
  | grep -E "^\||replay|checks on" | tail -70
step end
