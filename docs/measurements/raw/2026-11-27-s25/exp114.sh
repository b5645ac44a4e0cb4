#!/usr/bin/env bash
# Session 25: the row-window build (.gpu/main = 8092642) end to end (torch_ops in sketch and
# rows mode, Llama small eager and graph decode under quantshadow run), and where the split
# projections' instructions stall (ncu, SASS source page, one bench launch).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "verify_shim ops llama"
bash tests/gpu/verify_shim.sh ops llama 2>&1 | tail -8
rm -rf $OUT/*/*.svg $OUT/*/*.qsr
step "ncu source page"
timeout 240 ncu --kernel-name regex:qs_sketch_proj_e4m3fn --launch-skip 20 --launch-count 1 \
  --section SourceCounters --page source --print-source sass \
  quantshadow bench gpu --only sketch --m 4096 --probes 32 > $OUT/ncu_sass.txt 2>&1
echo "ncu rc $?"; wc -l $OUT/ncu_sass.txt
step end
