#!/usr/bin/env bash
# Written in session 15 with no device time left; to run in the next session, in one call with
# carry [".gpu"]: .gpu/main = the session-15 tree, .gpu/base = be8e40c (before the deferred-check
# split plan; early start and lean-in-graphs are off there by default, as in main). Staging:
#   bash ../shared/gpu/pack.sh && mkdir -p .gpu/main && mv .gpu/quantshadow .gpu/libquantshadow.so .gpu/main/
#   git worktree add /tmp/qsbase be8e40c && (cd /tmp/qsbase && CARGO_TARGET_DIR=/tmp/qsbase-target \
#     cargo build --release --workspace) && mkdir -p .gpu/base && cp /tmp/qsbase-target/release/{quantshadow,libquantshadow.so} .gpu/base/
#   strip .gpu/*/*
#   1. correctness of the three new paths: early start (QUANTSHADOW_EARLY_START=1) in the
#      selftest and torch_ops; the lean kernel inside graphs (QUANTSHADOW_SKETCH_LEAN=graphs,
#      64-row decode graph, kernel names from the profiler); the split plan (48-GEMM run PASS).
#   2. cost: per call behind cuBLAS at M 512 / 4096 (early on / off, on the stream and detached),
#      48-GEMM graph decode base vs main (split plan), Llama 8b-width prefill.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
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
step "per call behind cuBLAS (us): M 512 and 4096, 3 shapes"
shim() { LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all "$@"; }
g() {
  local err="$OUT/g_${1// /_}.err"
  QUANTSHADOW_LOG=info timeout 200 python3 tests/gpu/overhead_gemm.py --m 512,4096 --shapes 3 2>"$err" | sed "s/^/$1 /" | tee -a $OUT/gemm.log
  grep -h "early start\|closing" "$err" | sed "s/^/$1: /"  # did early starts happen, how many checks
}
for r in 1 2; do
  g "r$r plain"
  QUANTSHADOW_SKETCH_DETACH=off QUANTSHADOW_EARLY_START=1 shim g "r$r stream_early"
  QUANTSHADOW_SKETCH_DETACH=off QUANTSHADOW_EARLY_START=0 shim g "r$r stream_order"
  QUANTSHADOW_SKETCH_DETACH=on QUANTSHADOW_EARLY_START=1 shim g "r$r detach_early"
  QUANTSHADOW_SKETCH_DETACH=on QUANTSHADOW_EARLY_START=0 shim g "r$r detach_order"
done
python3 tests/gpu/early_table.py $OUT/gemm.log
step "issue 4: Llama 8b-width prefill (1024 tokens)"
pp() { timeout 150 python3 tests/gpu/graph_profile.py "$@" 2>&1 | grep -m1 "without the profiler"; }
shim pp warm-up --prefill --llama 8b-width >/dev/null
for r in 1 2; do
  pp "plain r$r" --prefill --llama 8b-width
  QUANTSHADOW_EARLY_START=1 shim pp "detached early r$r" --prefill --llama 8b-width
  QUANTSHADOW_EARLY_START=0 shim pp "detached in order r$r" --prefill --llama 8b-width
  QUANTSHADOW_SKETCH_DETACH=off QUANTSHADOW_EARLY_START=1 shim pp "stream early r$r" --prefill --llama 8b-width
done
step end
