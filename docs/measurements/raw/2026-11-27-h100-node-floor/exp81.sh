#!/usr/bin/env bash
# Session 20, call 4: graph_node_cost with the branch-and-join topology of the shim's joined
# copies, with and without the shortcut edge.
source tests/gpu/common.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvcc -O3 -arch=sm_90 tests/gpu/graph_node_cost.cu -o /tmp/graph_node_cost -lcublas 2>&1 | grep -v Warn | head -5
/tmp/graph_node_cost; echo "rc $?"
