#!/usr/bin/env bash
# Session 13, run 1: where the sketch check's projection time goes (stage timestamps per
# kernel variant, experiment defines), and the plain bench of the load-batching variants.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
stamp() { echo "-- $(date -u +%T) $*"; }
t() {  # label, defines...
  local label=$1; shift
  stamp "$label"
  QUANTSHADOW_KERNEL_DEFINES="QS_SKETCH_TIMING=1 $*" stdbuf -oL quantshadow bench gpu --only sketch --m 4096 "${BENCH_ARGS[@]}" >/tmp/t_$label.txt 2>&1
  python3 tests/gpu/stage_times.py "$label" </tmp/t_$label.txt
  grep -v QS_TIMING /tmp/t_$label.txt | grep "^| sketch |" | sed "s/^/$label /"
}
plain() {  # label round defines...
  local label=$1 r=$2; shift 2
  stamp "plain $label r$r"
  QUANTSHADOW_KERNEL_DEFINES="$*" quantshadow bench gpu --only sketch --m 1,4096 --probes 32 2>&1 | grep "^| sketch \|rror" | sed "s/^/$label r$r /"
}
BENCH_ARGS=(--probes 32)
echo "== stage timestamps, k = 32, M = 4096 (us from the first block's start)"
t base
t a2d4 QS_SKETCH_A_CHUNKS=2 QS_SKETCH_D_CHUNKS=4
t no_a QS_EXP_NO_A=1
t no_d QS_EXP_NO_D=1
echo "== plain bench, k = 32, M = 1 and 4096, alternating"
for r in 1 2; do
  plain base $r
  plain a2d4 $r QS_SKETCH_A_CHUNKS=2 QS_SKETCH_D_CHUNKS=4
done
t no_ad QS_EXP_NO_A=1 QS_EXP_NO_D=1
BENCH_ARGS=(--probes 8)
t base_k8
stamp "selftest sketch,detached with a2d4"
QUANTSHADOW_KERNEL_DEFINES="QS_SKETCH_A_CHUNKS=2 QS_SKETCH_D_CHUNKS=4" quantshadow selftest --quick --only sketch,detached 2>&1 | tail -8
stamp end
