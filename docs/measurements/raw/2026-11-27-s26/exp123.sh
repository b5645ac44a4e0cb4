#!/usr/bin/env bash
# Session 26, call 2 (.gpu/main, the build of exp122): the shim end to end after session 25's
# review fixes (torch_ops outputs, Llama small tokens and report), then session 25's prepared
# A/B of e4m3 units per warp (QS_LEAN_UNITS_E4M3=3, the default, against 2).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "verify_shim ops llama"
bash tests/gpu/verify_shim.sh ops llama 2>&1 | tail -8
step "selftest with 2 units"
QUANTSHADOW_KERNEL_DEFINES=QS_LEAN_UNITS_E4M3=2 timeout 200 quantshadow selftest --quick --only sketch,detached > $OUT/selftest_u2.txt 2>&1
echo "rc $?"; grep -E "passed|failed|\| fail" $OUT/selftest_u2.txt | head
step "kernel timelines, 3 against 2 units"
for round in 1 2; do for g in fp8:4096:4096:4096 fp8:4096:14336:4096 fp8:4096:4096:14336; do for u in 3 2; do
  echo "-- units $u r$round $g"; env QUANTSHADOW_KERNEL_DEFINES=QS_LEAN_UNITS_E4M3=$u LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so \
    QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all timeout 100 python3 tests/gpu/eager_profile.py $g --calls 24 2>$OUT/err.txt \
    | grep -E "checking|paused|qs_" | grep -v "t+"
done; done; done
step end
