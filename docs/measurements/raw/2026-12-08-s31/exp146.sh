#!/usr/bin/env bash
# Session 31: issue 4's overhead table with the HEAD build (.gpu/main), small Llama, two
# interleaved rounds of plain / off / observe / sketch all / sketch 1/100 (verify_shim overhead).
source tests/gpu/common.sh
md5sum .gpu/main/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
W=/tmp/w; mkdir -p $W
OUT=$W timeout 540 bash tests/gpu/verify_shim.sh overhead 2>&1 | cut -c1-600
cp $W/t_*.json $OUT/ 2>/dev/null
echo end
