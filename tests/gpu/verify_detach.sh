#!/usr/bin/env bash
# GPU verification of detached sketch checks (QUANTSHADOW_SKETCH_DETACH, issue 3/4 speed goals):
# run from the repo root on the GPU host with the release artifacts in .gpu/main. Logs to $OUT.
#   tests/gpu/verify_detach.sh [ops] [gate] [mlp] [llama]
#   ops    torch_ops.py (eager + a captured decode loop) under detach on: outputs bit-identical,
#          every site checked and passing, the graph's checks as branches
#   gate   first:1,1/5 inside a CUDA graph: sketch (gated on the stream) and rows (reference and
#          compare gated on the device): each captured layer checked at replays 0, 1, 6, 11, 16
#   mlp    overhead_mlp.py: plain, off, sketch all (detach off / on), sketch 1/100 with graph
#          launch selection off / on, two interleaved rounds; MLP_CONFIGS picks others, each
#          "mode,sample,detach,select[,side]" (side: QUANTSHADOW_SIDE_STREAM, default auto)
#   llama  torch_llama.py --timing (prefill / eager decode tokens/s): plain, sketch all and 1/100
#   profile graph_profile.py: kernel timeline of one decode-graph replay (profiler), plain and
#          under the shim (configs in PROFILE_CONFIGS, fields as in MLP_CONFIGS)
#   multi  torch_multi_gpu.py (2 GPUs, a thread each, eager and graph): sketch and rows, outputs
#          bit-identical, the sites of both devices checked
source tests/gpu/common.sh
steps=${*:-ops gate mlp}
shim() { LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so "$@"; }
for step in $steps; do
  case $step in
  ops)
    [ -f "$OUT/ops_plain.json" ] || python3 tests/gpu/torch_ops.py "$OUT/ops_plain.json" >"$OUT/ops_plain.log" 2>&1
    for det in on off; do
      QUANTSHADOW_SKETCH_DETACH=$det quantshadow run --mode sketch --label "ops-detach-$det" --out "$OUT/ops_detach_$det" -- \
        python3 tests/gpu/torch_ops.py "$OUT/ops_detach_$det.json" >"$OUT/ops_detach_$det.log" 2>&1
      echo "ops detach=$det: run exit $?; outputs $(same "$OUT/ops_plain.json" "$OUT/ops_detach_$det.json")"
      grep -E "^\*\*|Calls:|checked" "$OUT/ops_detach_$det/report.md" | head -5
      quantshadow dump --summary "$OUT/ops_detach_$det/run.qsr" >"$OUT/ops_detach_$det/summary.txt" 2>&1
      grep -iE "skip" "$OUT/ops_detach_$det/summary.txt" | head -8
    done
    ;;
  gate)
    [ -f "$OUT/ops_plain.json" ] || python3 tests/gpu/torch_ops.py "$OUT/ops_plain.json" >"$OUT/ops_plain.log" 2>&1
    # The same runs decided on the device (graph launch selection off) first, for comparison.
    for mode in sketch rows; do
      QUANTSHADOW_GRAPH_SELECT=off QUANTSHADOW_SAMPLE="first:1,1/5" quantshadow run --mode $mode \
        --label ops-gated-$mode-device --out "$OUT/ops_gate_${mode}_device" -- \
        python3 tests/gpu/torch_ops.py "$OUT/ops_gate_${mode}_device.json" >"$OUT/ops_gate_${mode}_device.log" 2>&1
      echo "ops gate ($mode, device-decided): run exit $?; outputs $(same "$OUT/ops_plain.json" "$OUT/ops_gate_${mode}_device.json")"
      grep "1x1024x1024" "$OUT/ops_gate_${mode}_device/report.md" | grep -v "^| [0-9]* | \`cublas[A-Za-z_]* #" | head -6
    done
    QUANTSHADOW_SAMPLE="first:1,1/5" quantshadow run --mode sketch --label ops-gated-detached --out "$OUT/ops_gate" -- \
      python3 tests/gpu/torch_ops.py "$OUT/ops_gate.json" >"$OUT/ops_gate.log" 2>&1
    echo "ops gate (detached): run exit $?; outputs $(same "$OUT/ops_plain.json" "$OUT/ops_gate.json")"
    grep "Calls:" "$OUT/ops_gate/report.md"
    grep "1x1024x1024" "$OUT/ops_gate/report.md" | grep -v "^| [0-9]* | \`cublas[A-Za-z_]* #" | head -6
    # Rows mode inside the graph: the reference and the compare gated on the device as well.
    QUANTSHADOW_SAMPLE="first:1,1/5" quantshadow run --mode rows --label ops-gated-rows --out "$OUT/ops_gate_rows" -- \
      python3 tests/gpu/torch_ops.py "$OUT/ops_gate_rows.json" >"$OUT/ops_gate_rows.log" 2>&1
    echo "ops gate (rows): run exit $?; outputs $(same "$OUT/ops_plain.json" "$OUT/ops_gate_rows.json")"
    grep "Calls:" "$OUT/ops_gate_rows/report.md"
    grep "1x1024x1024" "$OUT/ops_gate_rows/report.md" | grep -v "^| [0-9]* | \`cublas[A-Za-z_]* #" | head -6
    grep -h "graph launch selection" "$OUT/ops_gate.log" "$OUT/ops_gate_rows.log"
    ;;
  mlp)
    for round in 1 2; do
      for cfg in ${MLP_CONFIGS:-"plain - - -" "off all on on" "sketch all off on" "sketch all on on" \
          "sketch 1/100 on off" "sketch 1/100 on on"}; do
        set -- ${cfg//,/ }
        if [ "$1" = plain ]; then
          r=$(python3 tests/gpu/overhead_mlp.py 2>/dev/null | grep "^{" | tail -1)
        else
          r=$(QUANTSHADOW_MODE=$1 QUANTSHADOW_SAMPLE=$2 QUANTSHADOW_SKETCH_DETACH=$3 QUANTSHADOW_GRAPH_SELECT=$4 \
            QUANTSHADOW_SIDE_STREAM=${5:-auto} shim python3 tests/gpu/overhead_mlp.py 2>/dev/null | grep "^{" | tail -1)
        fi
        echo "mlp round $round $1 $2 detach=$3 select=$4 side=${5:-auto}: $r"
      done
    done
    ;;
  profile)
    for cfg in ${PROFILE_CONFIGS:-"plain - - -" "observe 1/1000000 on on" "sketch 1/1000000 on on" \
        "sketch 1/1000000 on off"}; do
      set -- ${cfg//,/ }
      tag="$1_${2//\//_}_$3_$4"
      if [ "$1" = plain ]; then
        python3 tests/gpu/graph_profile.py "$tag" ${PROFILE_ARGS:-} 2>&1 | grep -v "^STAGE\|Warning" | tee "$OUT/profile_$tag.txt"
      else
        QUANTSHADOW_MODE=$1 QUANTSHADOW_SAMPLE=$2 QUANTSHADOW_SKETCH_DETACH=$3 QUANTSHADOW_GRAPH_SELECT=$4 \
          QUANTSHADOW_SIDE_STREAM=${5:-auto} shim python3 tests/gpu/graph_profile.py "$tag" ${PROFILE_ARGS:-} 2>&1 | grep -v "^STAGE\|Warning" | tee "$OUT/profile_$tag.txt"
      fi
    done
    ;;
  llama)
    for cfg in ${LLAMA_CONFIGS:-"plain - - -" "sketch all on on" "sketch 1/100 on on"}; do
      set -- ${cfg//,/ }
      tag="${1}_${2//\//_}_$3_$4"
      if [ "$1" = plain ]; then
        python3 tests/gpu/torch_llama.py "$OUT/t_$tag.json" --timing >"$OUT/t_$tag.log" 2>&1
      else
        QUANTSHADOW_MODE=$1 QUANTSHADOW_SAMPLE=$2 QUANTSHADOW_SKETCH_DETACH=$3 QUANTSHADOW_GRAPH_SELECT=$4 shim \
          python3 tests/gpu/torch_llama.py "$OUT/t_$tag.json" --timing >"$OUT/t_$tag.log" 2>&1
      fi
      echo "llama $1 $2 detach=$3 select=$4: $(grep -E "tok_s" "$OUT/t_$tag.log" | tail -2 | tr '\n' ' ')"
    done
    ;;
  multi)
    python3 tests/gpu/torch_multi_gpu.py "$OUT/multi_plain.json" >"$OUT/multi_plain.log" 2>&1
    echo "multi plain: exit $? $(tail -1 "$OUT/multi_plain.log")"
    for mode in sketch rows; do
      quantshadow run --mode "$mode" --label "multi-gpu-$mode" --out "$OUT/multi_$mode" -- \
        python3 tests/gpu/torch_multi_gpu.py "$OUT/multi_$mode.json" >"$OUT/multi_$mode.log" 2>&1
      echo "multi $mode: run exit $?; outputs $(same "$OUT/multi_plain.json" "$OUT/multi_$mode.json")"
      grep -E "backend started|closing|no .* backend" "$OUT/multi_$mode.log" | head -6
      grep -E "^\*\*Verdict|Calls:" "$OUT/multi_$mode/report.md"
      grep -oE "\| [0-9]+x(768|1024|640|768)x512 \|" "$OUT/multi_$mode/report.md" | sort | uniq -c
    done
    ;;
  *) echo "unknown step $step" ;;
  esac
done
