#!/usr/bin/env bash
# Session 13, run 2: why the A W_R phase costs ~7 us at 256 rows. Stage timestamps of variants
# that drop one input of the phase (experiment defines), and ncu stall sampling of the check.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
R=docs/measurements/raw/2026-11-26-h100-sketch-kernel
stamp() { echo "-- $(date -u +%T) $*"; }
t() {  # label, defines...
  local label=$1; shift
  stamp "$label"
  QUANTSHADOW_KERNEL_DEFINES="QS_SKETCH_TIMING=1 $*" stdbuf -oL quantshadow bench gpu --only sketch --m 4096 --probes 32 >/tmp/t_$label.txt 2>&1
  python3 tests/gpu/stage_times.py "$label" </tmp/t_$label.txt | grep "in place" | grep "4096x4096\|4096x14336"
}
t base
t wr_const QS_EXP_WR_CONST=1
t a_const QS_EXP_A_CONST=1
t both_const QS_EXP_WR_CONST=1 QS_EXP_A_CONST=1
t no_perm QS_EXP_NO_PERM=1
which ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null
NCU=$(which ncu 2>/dev/null || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
stamp ncu metrics
timeout 240 $NCU --kernel-name regex:qs_sketch_check --launch-skip 20 --launch-count 1 \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,sm__cycles_active.avg,gpu__time_duration.sum" \
  quantshadow bench gpu --only sketch --m 4096 --probes 32 2>&1 | grep -v "^| sketch\|^==PROF==" | grep -v " 0$\| 0\.0[0-9]*$" | tail -40
stamp ncu source
timeout 300 $NCU --kernel-name regex:qs_sketch_check --launch-skip 20 --launch-count 1 --section SourceCounters \
  --section WarpStateStats --page source --print-source sass --csv \
  quantshadow bench gpu --only sketch --m 4096 --probes 32 >/tmp/ncu_src.csv 2>/tmp/ncu_src.err
echo "rc $? $(wc -l </tmp/ncu_src.csv) lines"; tail -3 /tmp/ncu_src.err
python3 $R/ncu_hot.py /tmp/ncu_src.csv 2>&1 | cut -c1-400 | head -120
gzip -c /tmp/ncu_src.csv > $OUT/ncu_src.csv.gz
stamp end
