#!/usr/bin/env bash
# ef86650 (entries resolved once, ring descriptor apart, eager checks on the stream by default)
# against base 66dbd03: correctness (selftest --quick, torch_ops default/on/off, Llama small),
# then host time per call (host_cost.py, interleaved) and Llama prefill A/B (ab_pause.py).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
step "selftest --quick (main)"
timeout 400 quantshadow selftest --quick 2>&1 | grep -E "FAIL|passed|failed" | head -10
step "torch_ops: default (graphs), detach on, off"
QUANTSHADOW_LOG=info timeout 200 bash tests/gpu/verify_shim.sh ops 2>&1 | grep -E "outputs"
grep -hE "closing:|skipped:" $OUT/ops_sketch.log | head -3
QUANTSHADOW_LOG=info timeout 200 bash tests/gpu/verify_detach.sh ops 2>&1 | grep -E "outputs|Verdict|Calls:"
step "Llama small (eager + graph decode)"
QUANTSHADOW_LOG=info timeout 300 bash tests/gpu/verify_shim.sh llama 2>&1 | tail -4
step "host time per call"
hc() { local b=$1 label=$2; shift 2; env LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all "$@" \
  python3 tests/gpu/host_cost.py "$label" --gemm $G --trials 15 2>$OUT/err.txt | grep '^{' || tail -3 $OUT/err.txt; }
for round in 1 2; do
  for G in bf16:512:4096:4096 fp8:512:4096:4096 bf16:4096:4096:4096; do
    python3 tests/gpu/host_cost.py plain --gemm $G --trials 15
    hc base "base on-stream" QUANTSHADOW_SKETCH_DETACH=off
    hc main "main default"
    hc base "base default (detached)"
    hc main "main detach on" QUANTSHADOW_SKETCH_DETACH=on
  done
done
step "Llama prefill, in-process A/B"
ab() { local b=$1; shift; env LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info "${@:2}" \
  timeout 150 python3 tests/gpu/ab_pause.py "$1" $AB 2>$OUT/ab_err.txt | grep '^{' || tail -3 $OUT/ab_err.txt; grep -hE "skipped:" $OUT/ab_err.txt | sed 's/^/   /'; }
AB="--llama small"
ab base "base small on-stream" QUANTSHADOW_SKETCH_DETACH=off
ab main "main small default"
ab base "base small default"
AB="--llama 8b-width"
ab base "base 8b on-stream" QUANTSHADOW_SKETCH_DETACH=off
ab main "main 8b default"
step end
