#!/usr/bin/env bash
# Session 23, after the review (one store loop for the lean check's sums, fused and split): the
# selftest sections that run the lean check, the split check and their copies.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 quantshadow selftest --quick --only detached,sketch,early > $OUT/selftest.txt 2>&1; echo "exit $?"
grep -E "FAIL|passed|failed|split|lean kernel ran" $OUT/selftest.txt | cut -c1-250 | head -12
