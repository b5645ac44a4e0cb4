#!/usr/bin/env bash
# qs_mma_a software-pipelined (the next chunk's W_R and A loads before this chunk's mma's):
# selftest sketch + detached (general kernel against the host mirror), the general kernel's
# time in `bench gpu` (M = 1 and 4096), the 48-GEMM stack and Llama small graph decode against
# base = 5f740d7 (ring claim), plain / base / main.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
shim() { local b=$1; shift; LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info "$@"; }
step "selftest sketch, detached (main)"
timeout 200 quantshadow selftest --quick --only sketch,detached > $OUT/selftest.txt 2>&1
grep -E "FAIL|passed|failed" $OUT/selftest.txt | head -8
step "bench: general kernel, base then main"
for b in base main; do
  timeout 150 .gpu/$b/quantshadow bench gpu --only sketch --m 1,4096 --probes 32 2>/dev/null | grep -E "^\| sketch \|" | cut -d'|' -f3-8 | sed "s/^/$b /"
done
step "48-layer stack"
echo "plain $(timeout 150 python3 tests/gpu/overhead_mlp.py --repeat 8)"
for b in base main; do
  echo "$b $(shim $b timeout 150 python3 tests/gpu/overhead_mlp.py --repeat 8 2>$OUT/mlp_$b.err)"
  grep -hE "closing:|skipped:" $OUT/mlp_$b.err | head -2 | sed 's/^/   /'
done
step "Llama small graph decode"
timeout 200 python3 tests/gpu/torch_llama.py $OUT/g.json --graph --graph-only --timing --size small >/dev/null 2>&1
echo "plain $(python3 -c "import json;print(json.load(open('$OUT/g.json')).get('decode_graph_tok_s'))")"
for b in base main; do
  shim $b timeout 200 python3 tests/gpu/torch_llama.py $OUT/g.json --graph --graph-only --timing --size small >/dev/null 2>$OUT/g_$b.err
  echo "$b $(python3 -c "import json;print(json.load(open('$OUT/g.json')).get('decode_graph_tok_s'))")"
  grep -hE "closing:" $OUT/g_$b.err | head -1 | sed 's/^/   /'
done
step end
