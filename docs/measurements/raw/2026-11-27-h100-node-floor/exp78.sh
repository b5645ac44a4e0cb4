#!/usr/bin/env bash
# Session 20, call 1: session 19's untested additions on a GPU (ring selftests incl. claims from
# 8 streams, torch_ops, Llama small tokens, which captured call is skipped), then the floor of
# one graph node per linear layer in the Llama model's graph decode (no shim), and one replay
# of Llama small under the shim on the profiler.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
step "selftest ring, detached, sketch"
timeout 300 quantshadow selftest --quick --only ring,detached,sketch > $OUT/selftest.txt 2>&1
grep -E "FAIL|passed|failed|8 streams|capacity" $OUT/selftest.txt | head -14
step "torch_ops, Llama small (tokens, report)"
QUANTSHADOW_LOG=info timeout 200 bash tests/gpu/verify_shim.sh ops 2>&1 | grep -E "outputs"
grep -hE "closing:|skipped:" $OUT/ops_sketch.log | head -3
QUANTSHADOW_LOG=debug timeout 300 bash tests/gpu/verify_shim.sh llama 2>&1 | tail -3
grep -h "not set up before the capture" $OUT/llama_sketch.log | sort | uniq -c | head -5
grep -hE "closing:|skipped:" $OUT/llama_sketch.log | head -3
step "node floor, Llama small, no shim"
timeout 400 python3 tests/gpu/llama_graph_floor.py floor --size small --rounds 2 2>&1 | grep -v Warning
step "node floor, Llama 8b-width, no shim"
timeout 400 python3 tests/gpu/llama_graph_floor.py floor --size 8b-width --rounds 2 --variants plain,empty,copy 2>&1 | grep -v Warning
step "Llama small under the shim: one replay on the profiler"
LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  timeout 300 python3 tests/gpu/llama_graph_floor.py shim --size small --variants plain --profile > $OUT/profile_small.txt 2>&1
grep -E "replay [0-9]|checks on|closing" $OUT/profile_small.txt
step end
