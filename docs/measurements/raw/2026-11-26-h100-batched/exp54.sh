#!/usr/bin/env bash
# The tree after removing the batched checks (kernels = 8e16803 + the lean copy's device
# scalars): selftest sketch/detached, torch_ops under the shim (detach on/off), FP8 decode graph.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/main/* | cut -c1-12,34-
step "selftest helpers, sketch (quick), detached"
timeout 300 quantshadow selftest --quick --only helpers,sketch,detached 2>&1 | grep -E "FAIL|passed|failed|device alpha|covered"
step "torch_ops under the shim: outputs identical, PASS"
QUANTSHADOW_LOG=info timeout 200 bash tests/gpu/verify_detach.sh ops 2>&1 | grep -E "outputs|Verdict|Calls:"
step "FP8 48-layer decode graph, sketch all"
echo "plain $(timeout 120 python3 tests/gpu/overhead_mlp.py --fp8 --repeat 8)"
echo "main $(LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all timeout 150 python3 tests/gpu/overhead_mlp.py --fp8 --repeat 8)"
step end
