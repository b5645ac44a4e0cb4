#!/usr/bin/env bash
# Session 20, call 3: what a node after each GEMV costs by its shape (standalone, no shim), and
# the full timeline of one Llama small graph replay under the shim (which copies sit on the chain).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
step "graph_node_cost"
nvcc -O3 -arch=sm_90 tests/gpu/graph_node_cost.cu -o /tmp/graph_node_cost -lcublas 2>&1 | grep -v Warn | head -5
/tmp/graph_node_cost; echo "rc $?"
step "Llama small under the shim: one replay's timeline"
LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  timeout 300 python3 tests/gpu/llama_graph_floor.py shim --size small --variants plain --profile 2>&1 | grep -E "^\||replay|checks on"
step end
