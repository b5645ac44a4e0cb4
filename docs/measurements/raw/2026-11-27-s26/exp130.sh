#!/usr/bin/env bash
# Session 26, call 9 (.gpu/main: the final build after review: split projections in order
# again, the proj kernel's flag after its wait, eager_profile.py's shared profiling loop):
# selftest, torch_ops outputs, eager_profile.py for one GEMM and for a prefill.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "selftest helpers,sketch,detached,early"
timeout 200 quantshadow selftest --quick --only helpers,sketch,detached,early > $OUT/selftest.txt 2>&1
echo "rc $?"; grep -E "passed|failed|\| fail" $OUT/selftest.txt | head
step "verify_shim ops"
bash tests/gpu/verify_shim.sh ops 2>&1 | tail -3
step "eager_profile"
for args in "bf16:4096:4096:4096 --calls 24" "--llama small --calls 2"; do
  env LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
    timeout 150 python3 tests/gpu/eager_profile.py $args 2>$OUT/err.txt | grep -v "t+" || tail -5 $OUT/err.txt
done
step end
