#!/usr/bin/env bash
# exp42 again, in two parts (exp43a: correctness and the 48-GEMM graph; exp43b: costs), after
# exp42 found every qs_sketch.cu program refused by the GPU host's NVRTC (generic lambdas in
# __global__ functions counted as host code; fixed by -default-device, cuda.rs NVRTC_OPTIONS) and
# the synchronous compile retried on every call (fixed). .gpu/base = be8e40c with the same
# -default-device fix only. Staging as in exp42.sh. Sub-results go to $OUT (a tarball at the end).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
quantshadow selftest --only helpers 2>&1 | grep -i "nvrtc\|compiler\|passed" | head -3
step "selftest: default settings, quick"
timeout 200 quantshadow selftest --quick 2>&1 | grep -v "| pass |" | tail -12
step "selftest: early start behind a late writer, then the sketch and detached sections with it on"
timeout 300 quantshadow selftest --only early 2>&1 | grep "| early\|passed"
QUANTSHADOW_EARLY_START=1 timeout 300 quantshadow selftest --only sketch 2>&1 | grep -v "| pass |" | tail -8
QUANTSHADOW_EARLY_START=1 timeout 200 quantshadow selftest --quick --only helpers,compare,logits,detached,ring 2>&1 | grep -v "| pass |" | tail -6
step "torch_ops, early start on (eager checks and copies)"
QUANTSHADOW_EARLY_START=1 OUT=/tmp/vd timeout 300 bash tests/gpu/verify_detach.sh ops 2>&1 | grep -E "outputs|Verdict|Calls:"
step "lean kernel inside graphs: 64-row decode graph"
timeout 120 python3 tests/gpu/torch_ops.py $OUT/g64_plain.json --graph-rows 64 > /dev/null 2>&1
for det in on off; do
  for lean in 1 graphs; do
    d=$OUT/g64_${det}_$lean; rm -rf $d
    QUANTSHADOW_SKETCH_LEAN=$lean QUANTSHADOW_SKETCH_DETACH=$det timeout 200 quantshadow run --mode sketch --label g64-$det-$lean --out $d -- \
      python3 tests/gpu/torch_ops.py $d.json --graph-rows 64 --graph-kernels > $d.log 2>&1
    echo "detach=$det lean=$lean: exit $?, outputs $(same $OUT/g64_plain.json $d.json)"
    grep -E "^\*\*|Calls:" $d/report.md | head -2; grep "graph kernels" $d.log | tr ',' '\n' | grep -c "qs_sketch_lean" | sed 's/^/  lean kernels in one replay: /'
  done
done
step "48-GEMM graph decode: base vs main (split plan)"
rm -rf $OUT/run48; timeout 120 quantshadow run --mode sketch --sample all --label split-48 --out $OUT/run48 -- python3 tests/gpu/overhead_mlp.py --repeat 8 > $OUT/run48.log 2>&1
echo "run48 exit $?"; grep -E "^\*\*|Calls:" $OUT/run48/report.md | head -2
for r in 1 2; do
  echo "r$r plain: $(timeout 60 python3 tests/gpu/overhead_mlp.py --repeat 8 2>/dev/null | grep '^{')"
  for v in base main; do
    echo "r$r $v: $(QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all LD_PRELOAD=$PWD/.gpu/$v/libquantshadow.so timeout 60 python3 tests/gpu/overhead_mlp.py --repeat 8 2>/dev/null | grep '^{')"
  done
done
for v in base main; do
  QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all LD_PRELOAD=$PWD/.gpu/$v/libquantshadow.so timeout 60 python3 tests/gpu/graph_profile.py $v --repeat 8 --timeline > $OUT/profile48_$v.txt 2>&1
  grep -E "checks on|replay span|without the profiler" $OUT/profile48_$v.txt
done
step end
