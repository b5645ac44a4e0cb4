#!/usr/bin/env bash
# Session 22: the every-row copy (qs_sketch_snap_all, 2ee...: main) against 21f58a4 (base, end of
# session 21). Selftest first (must pass before any timing), torch_ops and Llama under the shim
# (outputs, report), then Llama small 3 rounds, 8b-width, the stacks, one replay's profile.
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
grep -E "FAIL|passed|failed|every snapshot|every row copied|1 row" $OUT/selftest.txt | head -12
step "verify_shim ops llama (main)"
bash tests/gpu/verify_shim.sh ops llama 2>&1 | tail -8
step "Llama small graph decode: plain / base / main"
L="tests/gpu/torch_llama.py OUTFILE --graph --graph-only --timing --size small --trials 7"
for round in 1 2 3; do
  timeout 200 python3 ${L/OUTFILE/$OUT/lp.json} >/dev/null 2>&1; echo "r$round plain $(tok $OUT/lp.json)"
  for b in base main; do
    shim $b timeout 200 python3 ${L/OUTFILE/$OUT/l_$b.json} >/dev/null 2>$OUT/l_$b.err
    echo "r$round $b $(tok $OUT/l_$b.json) tokens $(same $OUT/lp.json $OUT/l_$b.json) $(grep -h 'closing:' $OUT/l_$b.err | sed 's/.*closing: //')"
  done
done
step "Llama 8b-width graph decode"
L8="tests/gpu/torch_llama.py OUTFILE --graph --graph-only --timing --size 8b-width --trials 5"
timeout 200 python3 ${L8/OUTFILE/$OUT/l8p.json} >/dev/null 2>&1; echo "plain $(tok $OUT/l8p.json)"
for b in base main; do shim $b timeout 200 python3 ${L8/OUTFILE/$OUT/l8_$b.json} >/dev/null 2>&1; echo "$b $(tok $OUT/l8_$b.json) tokens $(same $OUT/l8p.json $OUT/l8_$b.json)"; done
step "48-GEMM bf16 stack"
M="tests/gpu/overhead_mlp.py --repeat 8"
echo "plain $(timeout 150 python3 $M | g)"
for b in base main; do echo "$b $(shim $b timeout 150 python3 $M 2>/dev/null | g)"; done
step "48-layer FP8 stack"
M="tests/gpu/overhead_mlp.py --repeat 8 --fp8"
echo "plain $(timeout 150 python3 $M | g)"
for b in base main; do echo "$b $(shim $b timeout 150 python3 $M 2>/dev/null | g)"; done
step "main: one Llama small replay"
shim main timeout 200 python3 tests/gpu/llama_graph_floor.py X --size small --variants plain --profile > $OUT/prof_main.txt 2>&1
grep -E "replay|checks on" $OUT/prof_main.txt | head -8
step end
