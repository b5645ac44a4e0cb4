#!/usr/bin/env bash
# Session 24: split buffers taken in turn (the caller's stream waits for the oldest buffer's
# finishing instead of falling back to the fused check when the host runs ahead). One build
# (.gpu/main); A/B by QUANTSHADOW_SKETCH_SPLIT.
# 1. eager profile, split on: no fused (lean) kernels left among the calls.
# 2. ab_pause, one GEMM back to back, split on / off, two rounds.
# 3. Llama prefill, 8b widths and small, split on / off, two rounds.
# 4. Correctness with the waits in play: ab_pause's fp8 GEMM and the Llama model under
#    quantshadow run with split on (report, tokens identical).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
shim() { env LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all "$@"; }
step "eager profile, split on"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do
  echo "-- $g"; QUANTSHADOW_SKETCH_SPLIT=1 shim timeout 100 python3 tests/gpu/eager_profile.py $g --calls 24 2>$OUT/prof_err.txt | grep -E "^==|/call" | grep -vE "Memset"; tail -1 $OUT/prof_err.txt | grep -v Warn
done
ab() { QUANTSHADOW_SKETCH_SPLIT=$3 QUANTSHADOW_LOG=info shim timeout 150 python3 tests/gpu/ab_pause.py "$1" $2 2>$OUT/ab_err.txt | grep '^{' | cut -c1-160 || tail -3 $OUT/ab_err.txt
  grep -hE "skipped:" $OUT/ab_err.txt | grep -v paused | sed 's/^/   /' | cut -c1-200 | head -3; }
step "one GEMM back to back, A/B"
for round in 1 2; do for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do for sp in 1 0; do
  ab "$g split=$sp r$round" "--gemm $g --trials 11 --passes 50" $sp
done; done; done
step "Llama prefill A/B"
for round in 1 2; do for m in 8b-width small; do for sp in 1 0; do
  ab "$m split=$sp r$round" "--llama $m" $sp
done; done; done
step "under quantshadow run, split on"
QUANTSHADOW_SKETCH_SPLIT=1 timeout 150 quantshadow run --mode sketch --sample all --label gemm-split --out $OUT/gemm_run -- python3 tests/gpu/ab_pause.py gemm --gemm fp8:4096:4096:4096 --trials 5 --passes 50 > $OUT/gemm_run.log 2>&1
echo "gemm run: exit $?"; grep -E "^\*\*|Calls:|skipped" $OUT/gemm_run/report.md | head -5
timeout 200 python3 tests/gpu/torch_llama.py $OUT/llama_plain.json > $OUT/llama_plain.log 2>&1
QUANTSHADOW_SKETCH_SPLIT=1 timeout 240 quantshadow run --mode sketch --sample all --label llama-split --out $OUT/llama_run -- python3 tests/gpu/torch_llama.py $OUT/llama_shim.json > $OUT/llama_run.log 2>&1
echo "llama: exit $?, tokens $(same $OUT/llama_plain.json $OUT/llama_shim.json)"; grep -E "^\*\*|Calls:" $OUT/llama_run/report.md | head -3
rm -rf $OUT/*_run/*.svg $OUT/*_run/*.qsr
step end
