#!/usr/bin/env bash
# GPU verification of fault injection (issue 6): every class planted at one site of the PyTorch
# program tests/gpu/torch_ops.py (sites by first appearance: 0 bf16 GemmEx M 1..4096, 2 f32
# Sgemm, 4 FP8 _scaled_mm tensor-wise, 5 FP8 row-wise, 7-9 a captured 1x1024x1024 decode
# step) and the block-scale classes at the Triton FP8 kernel (spec'd launch). Each run must
# fail exactly at the planted site; the honest runs must pass. Run from the repo root on the
# GPU host with the release artifacts in .gpu/main; logs and reports go to $OUT.
set -uo pipefail
export PATH=$PWD/.gpu/main:$PATH PYTHONUNBUFFERED=1
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/qscache} QUANTSHADOW_COMPILE=sync
OUT=${OUT:-/tmp/qsout}
mkdir -p "$OUT"
failing_sites() { grep -E "^\| [0-9]+ \| .*❌ FAIL" "$1" | awk -F'|' '{print $2}' | tr -d ' ' | sort -n | tr '\n' ' '; }
banner() { grep -m1 -iE "fault injection" "$1"; }
run_ops() {
  local tag=$1 inject=$2 mode=${3:-full}
  QUANTSHADOW_INJECT=$inject quantshadow run --mode "$mode" --label "inject-$tag" --out "$OUT/$tag" -- \
    python3 tests/gpu/torch_ops.py "$OUT/$tag.json" >"$OUT/$tag.log" 2>&1
  local rc=$?
  echo "$tag ($inject, $mode): run exit $rc; failing sites: $(failing_sites "$OUT/$tag/report.md")"
  banner "$OUT/$tag/report.md"
  grep -E "injected|not applied" "$OUT/$tag/report.md" | head -3
}
quantshadow run --mode full --label honest --out "$OUT/honest" -- python3 tests/gpu/torch_ops.py "$OUT/honest.json" \
  >"$OUT/honest.log" 2>&1
echo "honest: run exit $?; failing sites: $(failing_sites "$OUT/honest/report.md")"
run_ops garbage garbage@0
run_ops fnuz fn-as-fnuz@4
run_ops tile tile-rows@0
run_ops nan nan@2
run_ops zero zero-after-first
run_ops ignore scale-ignore@5
run_ops notrans no-transpose@7
run_ops garbage_sketch garbage@0 sketch
for class in scale-transpose scale-ignore; do
  QUANTSHADOW_INJECT=$class QUANTSHADOW_SPECS=$PWD/specs/triton_fp8_blockscale.toml \
    quantshadow run --mode full --label "inject-triton-$class" --out "$OUT/triton_$class" -- \
    python3 tests/gpu/triton_fp8_blockscale.py --quick >"$OUT/triton_$class.log" 2>&1
  echo "triton $class: run exit $?; failing sites: $(failing_sites "$OUT/triton_$class/report.md")"
  grep -E "qs_w8a8" "$OUT/triton_$class/report.md" | grep -E "FAIL|PASS" | head -2
done
