#!/usr/bin/env bash
# In-process A/B (tests/gpu/ab_pause.py: trials alternate with checking paused through the new
# quantshadow_pause export and on), to read issue 4's prefill cost and issue 3's per-call cost
# without the process-to-process noise of exp43b/exp44. Build: HEAD with quantshadow_pause.
# Staging: bash ../shared/gpu/pack.sh && mkdir -p .gpu/main && mv .gpu/quantshadow .gpu/libquantshadow.so .gpu/main/ && strip .gpu/main/*
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/main/* | cut -c1-12,34-
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
shim() { LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all "$@"; }
# The JSON line, then the shim's closing counts (checked, skipped by reason) of that process.
ab() {
  QUANTSHADOW_LOG=info timeout 150 python3 tests/gpu/ab_pause.py "$@" 2>$OUT/ab_err.txt | grep '^{' || tail -3 $OUT/ab_err.txt
  grep -hE "closing:|skipped:" $OUT/ab_err.txt | sed 's/^/   /'
}
step "without the shim: exit 2 expected"
timeout 60 python3 tests/gpu/ab_pause.py none --gemm bf16:64:256:256 >/dev/null 2>&1; echo "exit $?"
step "torch_ops under the shim (this build): outputs identical, PASS"
timeout 200 bash tests/gpu/verify_shim.sh ops 2>&1 | tail -2
step "issue 4: Llama prefill A/B (default: detached), two processes each"
for p in 1 2; do
  shim ab "8b-width detached p$p" --llama 8b-width
  QUANTSHADOW_SKETCH_DETACH=off shim ab "8b-width on-stream p$p" --llama 8b-width
done
shim ab "small detached" --llama small
step "issue 3: one GEMM A/B, on the stream and detached"
for g in bf16:4096:4096:4096 fp8:4096:4096:4096 bf16:512:4096:4096 fp8:512:4096:4096 fp8:4096:14336:4096 fp8:4096:4096:14336; do
  QUANTSHADOW_SKETCH_DETACH=off shim ab "on-stream $g" --gemm $g --trials 11 --passes 50
  shim ab "detached $g" --gemm $g --trials 11 --passes 50
done
step end
