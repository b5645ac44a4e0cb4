#!/usr/bin/env bash
# Does a programmatic edge (GEMV -> copy) make a decode graph's per-GEMM copy node cheaper?
# Standalone (no shim): 48 bf16 GEMVs, no copies / copies with plain edges / programmatic edges.
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
nvcc -O3 -arch=sm_90 tests/gpu/graph_pdl_copy.cu -o /tmp/graph_pdl_copy -lcublas 2>&1 | grep -v "^$" | head -5
/tmp/graph_pdl_copy; echo "exit $?"
/tmp/graph_pdl_copy | tail -6; echo "exit $?"
