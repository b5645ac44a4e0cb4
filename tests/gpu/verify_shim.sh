#!/usr/bin/env bash
# GPU verification of the shim (issue 4): run from the repo root on the GPU host with the
# release artifacts in .gpu/main (quantshadow + libquantshadow.so). Logs and reports go to $OUT.
#   tests/gpu/verify_shim.sh [ops] [llama] [overhead]
# llama and overhead run torch_llama.py with --graph (eager decode and CUDA-graph decode) at
# LLAMA_SIZE (small, the default, or 8b-width); overhead passes LLAMA_ARGS on (e.g. --trials 5 --prompt 1024).
source tests/gpu/common.sh
steps=${*:-ops llama overhead}
for step in $steps; do
  case $step in
  ops)
    python3 tests/gpu/torch_ops.py "$OUT/ops_plain.json" >"$OUT/ops_plain.log" 2>&1
    for mode in sketch rows; do
      quantshadow run --mode "$mode" --label "torch-ops-$mode" --out "$OUT/ops_$mode" -- \
        python3 tests/gpu/torch_ops.py "$OUT/ops_$mode.json" >"$OUT/ops_$mode.log" 2>&1
      echo "ops $mode: run exit $?; outputs $(same "$OUT/ops_plain.json" "$OUT/ops_$mode.json")"
    done
    ;;
  llama)
    llama=(tests/gpu/torch_llama.py --graph --size "${LLAMA_SIZE:-small}")
    python3 "${llama[0]}" "$OUT/llama_plain.json" "${llama[@]:1}" >"$OUT/llama_plain.log" 2>&1
    quantshadow run --label llama-bf16 --names "$OUT/names.json" --out "$OUT/llama_sketch" -- \
      python3 "${llama[0]}" "$OUT/llama_sketch.json" "${llama[@]:1}" >"$OUT/llama_sketch.log" 2>&1
    echo "llama sketch: run exit $?; tokens (eager and graph) $(same "$OUT/llama_plain.json" "$OUT/llama_sketch.json")"
    grep -E "^(Calls|Checks|Result)|^\*\*" "$OUT/llama_sketch/report.md" | head -5
    ;;
  overhead)
    # Two interleaved rounds of every configuration (the machine drifts; medians per run).
    for round in 1 2; do
      for cfg in "plain -" "off all" "observe all" "sketch all" "sketch 1/100"; do
        set -- $cfg
        tag="${1}_${2//\//_}_r$round"
        if [ "$1" = plain ]; then
          python3 tests/gpu/torch_llama.py "$OUT/t_$tag.json" --timing --graph --size "${LLAMA_SIZE:-small}" ${LLAMA_ARGS:-} >"$OUT/t_$tag.log" 2>&1
        else
          QUANTSHADOW_MODE=$1 QUANTSHADOW_SAMPLE=$2 LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so \
            python3 tests/gpu/torch_llama.py "$OUT/t_$tag.json" --timing --graph --size "${LLAMA_SIZE:-small}" ${LLAMA_ARGS:-} >"$OUT/t_$tag.log" 2>&1
        fi
        echo "round $round $1 $2: $(grep prefill_tok_s "$OUT/t_$tag.log")"
      done
    done
    ;;
  mlp)
    # GPU-bound probe, two interleaved rounds of every configuration.
    for round in 1 2; do
      for cfg in "plain -" "off all" "observe all" "sketch all" "sketch 1/100"; do
        set -- $cfg
        if [ "$1" = plain ]; then
          r=$(python3 tests/gpu/overhead_mlp.py 2>/dev/null | grep "^{" | tail -1)
        else
          r=$(QUANTSHADOW_MODE=$1 QUANTSHADOW_SAMPLE=$2 LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so \
            python3 tests/gpu/overhead_mlp.py 2>/dev/null | grep "^{" | tail -1)
        fi
        echo "mlp round $round $1 $2: $r"
      done
    done
    ;;
  gemm)
    # Per-shape GEMM time (tests/gpu/overhead_gemm.py; GEMM_ARGS, e.g. --quick, goes to it),
    # two interleaved rounds: plain, sketch check on the production stream (DETACH=off), and
    # only a snapshot there with the check off it (DETACH=on). Then one recorded run of each shim
    # configuration (records counted in summary.txt) and the table (gemm_table.md).
    for round in 1 2; do
      for cfg in plain detach_off detach_on; do
        f="$OUT/gemm_${cfg}_r$round"
        if [ $cfg = plain ]; then
          python3 tests/gpu/overhead_gemm.py ${GEMM_ARGS:-} >"$f.out" 2>"$f.log"
        else
          QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_SKETCH_DETACH=${cfg#detach_} \
            LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so \
            python3 tests/gpu/overhead_gemm.py ${GEMM_ARGS:-} >"$f.out" 2>"$f.log"
        fi
        rc=$?
        grep "^{" "$f.out" >"$f.jsonl"
        echo "gemm round $round $cfg: exit $rc, $(wc -l <"$f.jsonl") cases"
      done
    done
    for cfg in detach_off detach_on; do
      d="$OUT/gemm_run_$cfg"
      rm -rf "$d" && mkdir -p "$d" # quantshadow run never overwrites a run.qsr
      QUANTSHADOW_SAMPLE=all QUANTSHADOW_SKETCH_DETACH=${cfg#detach_} \
        quantshadow run --mode sketch --label "gemm-$cfg" --out "$d" -- \
        python3 tests/gpu/overhead_gemm.py ${GEMM_ARGS:-} >"$d/run.log" 2>&1
      echo "gemm run $cfg: run exit $?"
      quantshadow dump --summary "$d/run.qsr" >"$d/summary.txt" 2>&1 || true
      cat "$d/summary.txt"
    done
    python3 tests/gpu/overhead_table.py "$OUT" | tee "$OUT/gemm_table.md"
    ;;
  gate)
    # Sampling first:1,1/5 inside a CUDA graph: decided on the device at every replay. The
    # 3 captured layers (1x1024x1024) get 2 eager checks (calls 0, 1) + replays 0, 1, 6, 11, 16.
    [ -f "$OUT/ops_plain.json" ] || python3 tests/gpu/torch_ops.py "$OUT/ops_plain.json" >"$OUT/ops_plain.log" 2>&1
    QUANTSHADOW_SAMPLE="first:1,1/5" quantshadow run --mode sketch --label torch-ops-gated --out "$OUT/ops_gate" -- \
      python3 tests/gpu/torch_ops.py "$OUT/ops_gate.json" >"$OUT/ops_gate.log" 2>&1
    echo "ops gate: run exit $?; outputs $(same "$OUT/ops_plain.json" "$OUT/ops_gate.json")"
    grep "Calls:" "$OUT/ops_gate/report.md"
    grep "1x1024x1024" "$OUT/ops_gate/report.md" | grep -v "^| [0-9]* | \`cublas[A-Za-z_]* #" | head -6
    ;;
  full)
    quantshadow run --mode full --label torch-ops-full --out "$OUT/ops_full" -- \
      python3 tests/gpu/torch_ops.py "$OUT/ops_full.json" >"$OUT/ops_full.log" 2>&1
    echo "ops full: run exit $?; outputs $(same "$OUT/ops_plain.json" "$OUT/ops_full.json")"
    ;;
  esac
done
