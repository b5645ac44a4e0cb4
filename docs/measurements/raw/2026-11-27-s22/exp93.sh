#!/usr/bin/env bash
# Session 22: does the copy kernel's code cost the decode graph? Llama small graph decode under
# main with the snapshot copy as is, a slim every-row copy (32-bit slices, only that path in the
# kernel: QS_EXP_SNAP_SLIM) and an empty copy kernel (QS_EXP_SNAP_EMPTY; timing only: the checks
# then read stale snapshots). Variants through QUANTSHADOW_KERNEL_DEFINES, 2 rounds.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
tok() { python3 -c "import json;print(round(json.load(open('$1')).get('decode_graph_tok_s'),1))"; }
L="tests/gpu/torch_llama.py OUTFILE --graph --graph-only --timing --size small --trials 7"
run() { local name=$1 defs=$2
  QUANTSHADOW_KERNEL_DEFINES="$defs" LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info \
    timeout 200 python3 ${L/OUTFILE/$OUT/l_$name.json} >/dev/null 2>$OUT/l_$name.err
  echo "  $name $(tok $OUT/l_$name.json) tokens $(same $OUT/lp.json $OUT/l_$name.json) $(grep -h 'closing:' $OUT/l_$name.err | sed 's/.*closing: //')"
}
# warm the kernel cache for each define set (compiles on first use)
for round in 1 2; do
  timeout 200 python3 ${L/OUTFILE/$OUT/lp.json} >/dev/null 2>&1; echo "r$round plain $(tok $OUT/lp.json)"
  run asis ""
  run slim "QS_EXP_SNAP_SLIM=1"
  run empty "QS_EXP_SNAP_EMPTY=1"
done
LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_KERNEL_DEFINES="QS_EXP_SNAP_SLIM=1" \
  timeout 200 python3 tests/gpu/llama_graph_floor.py X --size small --variants plain --profile > $OUT/prof_slim.txt 2>&1
grep -E "replay|checks on" $OUT/prof_slim.txt | head -8
