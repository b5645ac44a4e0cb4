#!/usr/bin/env bash
# Issue 6 GPU verification: zero false positives across honest runs. 20 runs of
# tests/gpu/torch_ops.py (seeds 1..20, modes cycling sketch / rows / full) and 20 of the Triton
# FP8 block-scale program (seeds 1..20, sketch / full), every run on different random data,
# $PAR runs at a time. Prints one line per run and a total; exit 1 on any failing site.
# Run from the repo root on the GPU host with the release artifacts in .gpu/main.
set -uo pipefail
export PATH=$PWD/.gpu/main:$PATH PYTHONUNBUFFERED=1
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/qscache} QUANTSHADOW_COMPILE=sync
OUT=${OUT:-/tmp/qsout}/honest
PAR=${PAR:-4}
RUNS=${RUNS:-20}
mkdir -p "$OUT"
one() {  # one <program> <seed> <mode>
  local prog=$1 seed=$2 mode=$3 tag="$1_s$2_$3" rc
  if [ "$prog" = ops ]; then
    quantshadow run --mode "$mode" --label "$tag" --out "$OUT/$tag" -- \
      python3 tests/gpu/torch_ops.py "$OUT/$tag.json" --seed "$seed" >"$OUT/$tag.log" 2>&1
  else
    QUANTSHADOW_SPECS=$PWD/specs/triton_fp8_blockscale.toml quantshadow run --mode "$mode" --label "$tag" \
      --out "$OUT/$tag" -- python3 tests/gpu/triton_fp8_blockscale.py --quick --seed "$seed" >"$OUT/$tag.log" 2>&1
  fi
  rc=$?
  echo "$tag exit $rc $(quantshadow dump --summary "$OUT/$tag/run.qsr" 2>&1 | tail -1)"
}
export -f one
export OUT
jobs=()
ops_modes=(sketch rows full)
tri_modes=(sketch full)
for s in $(seq 1 "$RUNS"); do
  jobs+=("ops $s ${ops_modes[$(( (s - 1) % 3 ))]}")
  jobs+=("triton $s ${tri_modes[$(( (s - 1) % 2 ))]}")
done
printf '%s\n' "${jobs[@]}" | xargs -P "$PAR" -L 1 bash -c 'one $0 $1 $2' | sort | tee "$OUT/summary.txt"
fails=$(grep -c " exit [^0]" "$OUT/summary.txt")
checked=$(awk '{for (i = 1; i <= NF; i++) if ($i == "checked") s += $(i + 1)} END {print s + 0}' "$OUT/summary.txt")
echo "honest runs: $(wc -l <"$OUT/summary.txt"), runs with a failing exit: $fails, checks: $checked"
exit $(( fails > 0 ))
