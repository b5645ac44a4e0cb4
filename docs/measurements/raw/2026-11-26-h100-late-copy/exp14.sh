# Session 12, third call: where the Llama 8b-width prefill (prompt 1024) loses time under sketch all.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
shim() { LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so "$@"; }
echo "== plain"; timeout 120 python3 tests/gpu/graph_profile.py plain --prefill --llama 8b-width 2>&1 | grep -v "Warning\|warn"
echo "== sketch all (t=$((SECONDS - t0))s)"; QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all shim timeout 150 python3 tests/gpu/graph_profile.py sketch-all --prefill --llama 8b-width 2>&1 | grep -v "Warning\|warn"
echo "== sketch all, detach off (t=$((SECONDS - t0))s)"; QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_SKETCH_DETACH=off shim timeout 120 python3 tests/gpu/graph_profile.py sketch-all-ondev --prefill --llama 8b-width 2>&1 | grep -v "Warning\|warn" | head -30
echo "== done (t=$((SECONDS - t0))s)"
