#!/usr/bin/env bash
# Session 28, call 1 (.gpu/main: the lifetime and start review fixes): a destroyed stream, a
# weight changed in place and cuBLAS handles made again (tests/gpu/lifetimes.cu); work after a
# cudaDeviceReset (the backend is started again in the new context); then the regression set:
# selftest sections, torch_ops (sketch, rows), the small Llama, Triton through its spec, and the
# FP8 4096^3 period.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/main/* | cut -c1-12,34-
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
SHIM=$PWD/.gpu/main/libquantshadow.so
step "lifetimes.cu: plain, then under the shim (sketch, every call)"
nvcc -o /tmp/lifetimes tests/gpu/lifetimes.cu -lcublas 2>&1 | tail -3
/tmp/lifetimes > $OUT/lifetimes_plain.txt; echo "plain rc $?"
QUANTSHADOW_LOG=info quantshadow run --label lifetimes --out $OUT/lifetimes -- /tmp/lifetimes > $OUT/lifetimes_shim.txt 2>$OUT/lifetimes_err.txt
echo "shim rc $?"; diff <(grep -v '^\[' $OUT/lifetimes_plain.txt) <(grep -v '^\[' $OUT/lifetimes_shim.txt | grep -E '^(stream|weight|handles|lifetimes)') && echo "digests identical"
grep -iE "closing|retired|weight \(B\)|changed|error|panic" $OUT/lifetimes_err.txt | cut -c1-220 | head -8
grep -E "^\*\*Verdict|Calls|Checks" $OUT/lifetimes/report.md | head -4
step "device_reset.cu: 4 GEMMs, reset, 4 more (expect 8 checked)"
nvcc -o /tmp/device_reset tests/gpu/device_reset.cu -lcublas 2>&1 | tail -3
QUANTSHADOW_LOG=info quantshadow run --label reset --out $OUT/reset -- /tmp/device_reset reset 4 > $OUT/reset.txt 2>&1
echo "rc $?"; grep -iE "device_reset|retired|closing|started" $OUT/reset.txt | cut -c1-220 | head -8
step "selftest helpers,sketch,detached,early"
timeout 200 quantshadow selftest --quick --only helpers,sketch,detached,early > $OUT/selftest.txt 2>&1
echo "rc $?"; grep -E "passed|failed|\| fail" $OUT/selftest.txt | head
step "verify_shim ops llama"
timeout 330 bash tests/gpu/verify_shim.sh ops llama > $OUT/verify.txt 2>&1; echo "rc $?"
grep -E "identical|DIFFERENT|PASS|FAIL|rc|exit" $OUT/verify.txt | head -20
step "verify_launch triton"
timeout 120 bash tests/gpu/verify_launch.sh triton > $OUT/launch.txt 2>&1; echo "rc $?"
grep -E "identical|DIFFERENT|Verdict|exit" $OUT/launch.txt | head -10
step "FP8 4096^3 period"
env LD_PRELOAD=$SHIM QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all timeout 100 python3 tests/gpu/eager_profile.py fp8:4096:4096:4096 --calls 24 2>$OUT/err.txt \
  | grep -E "checking|paused|qs_|nvjet" | grep -v "t+"
step end
