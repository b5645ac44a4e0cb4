#!/usr/bin/env bash
# The 48-GEMM bf16 stack (overhead_mlp.py --repeat 8: prefill M=512 eager, decode eager, decode
# graph): plain, base 66dbd03 (default: eager checks detached),
# main (graphs default with the eager set-up for captures; ef86650 lacked it); two rounds.
# Then torch_ops and Llama small under main's default.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
for round in 1 2; do
  step "round $round"
  echo "plain $(timeout 150 python3 tests/gpu/overhead_mlp.py --repeat 8)"
  for b in base main; do
    echo "$b $(LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info \
      timeout 150 python3 tests/gpu/overhead_mlp.py --repeat 8 2>$OUT/mlp_$b.err)"
    grep -hE "closing:|skipped:" $OUT/mlp_$b.err | head -2 | sed 's/^/   /'
  done
done
step "torch_ops (default), Llama small"
QUANTSHADOW_LOG=info timeout 200 bash tests/gpu/verify_shim.sh ops 2>&1 | grep -E "outputs"
grep -hE "closing:|skipped:" $OUT/ops_sketch.log | head -3
QUANTSHADOW_LOG=info timeout 300 bash tests/gpu/verify_shim.sh llama 2>&1 | tail -4
step end
