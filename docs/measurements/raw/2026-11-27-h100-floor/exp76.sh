#!/usr/bin/env bash
# One-add ring claims (qs_ring_claim far from full): the ring selftests (small ring: CAS only;
# 2048 slots: adds then CAS up to full), torch_ops and Llama identical, the 48-GEMM tail stage
# marks, then graph decode against base 54fdfe3 (bf16 and FP8 48-layer stacks, Llama small and
# 8b widths), plain / base / main, sketch all.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
part=${1:-a}
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
shim() { local b=$1; shift; LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info "$@"; }
stack() {
  for round in 1 2; do
    step "48-layer stack $1, round $round"
    echo "plain $(timeout 150 python3 tests/gpu/overhead_mlp.py $1 --repeat 8)"
    for b in base main; do
      echo "$b $(shim $b timeout 150 python3 tests/gpu/overhead_mlp.py $1 --repeat 8 2>$OUT/mlp_$b.err)"
      grep -hE "closing:|skipped:" $OUT/mlp_$b.err | head -3 | sed 's/^/   /'
    done
  done
}
llama() {
  for round in 1 2; do
    step "Llama $1 graph decode, round $round"
    timeout 200 python3 tests/gpu/torch_llama.py $OUT/g.json --graph --graph-only --timing --size $1 >/dev/null 2>&1
    echo "plain $(python3 -c "import json;print(json.load(open('$OUT/g.json')).get('decode_graph_tok_s'))")"
    for b in base main; do
      shim $b timeout 200 python3 tests/gpu/torch_llama.py $OUT/g.json --graph --graph-only --timing --size $1 >/dev/null 2>$OUT/g_$b.err
      echo "$b $(python3 -c "import json;print(json.load(open('$OUT/g.json')).get('decode_graph_tok_s'))")"
      grep -hE "closing:|skipped:" $OUT/g_$b.err | head -3 | sed 's/^/   /'
    done
  done
}
if [ "$part" = a ]; then
  step "floors: eager and in a graph"
  nvcc -O3 -arch=sm_90 tests/gpu/floor_latency.cu -o /tmp/floor_latency 2>&1 | head -5
  /tmp/floor_latency; /tmp/floor_latency --graph
  step "selftest ring, detached, sketch"
  timeout 300 quantshadow selftest --quick --only ring,detached,sketch > $OUT/selftest.txt 2>&1
  grep -E "FAIL|passed|failed|capacity" $OUT/selftest.txt | head -12
  step "torch_ops (default), Llama small eager + graph"
  QUANTSHADOW_LOG=info timeout 200 bash tests/gpu/verify_shim.sh ops 2>&1 | grep -E "outputs"
  grep -hE "closing:|skipped:" $OUT/ops_sketch.log | head -3
  QUANTSHADOW_LOG=info timeout 300 bash tests/gpu/verify_shim.sh llama 2>&1 | tail -3
  step "48-GEMM tail stage marks (main)"
  QUANTSHADOW_KERNEL_DEFINES="QS_SKETCH_TIMING=2" QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
    LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so timeout 300 python3 tests/gpu/overhead_mlp.py --repeat 8 > $OUT/abs.txt 2>&1
  grep QS_TIMING_ABS $OUT/abs.txt | tail -480 > $OUT/abs_tail.txt; rm -f $OUT/abs.txt
  stack ""
else
  stack --fp8
  llama small
  # llama 8b-width: already within the goal (session 18); left out to keep device time
fi
step end
