#!/usr/bin/env bash
# Session 23: Llama prefill with every call checked (issue 4's <= 5%), split checks on / off in
# one build (.gpu/main = exp98's), in-process A/B (ab_pause.py), two rounds per width; then the
# Llama model under quantshadow run with split checks (tokens identical, report).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
ab() { env QUANTSHADOW_SKETCH_SPLIT=$3 LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=info \
  timeout 150 python3 tests/gpu/ab_pause.py "$1" --llama "$2" 2>$OUT/ab_err.txt | grep '^{' | cut -c1-150 || tail -3 $OUT/ab_err.txt; grep -hE "skipped:" $OUT/ab_err.txt | grep -v paused | sed 's/^/   /' | head -3; }
step "Llama prefill A/B"
for round in 1 2; do
  for m in small 8b-width; do for sp in 1 0; do ab "split=$sp $m r$round" $m $sp; done; done
done
step "Llama under quantshadow run, split on"
timeout 200 python3 tests/gpu/torch_llama.py $OUT/llama_plain.json > $OUT/llama_plain.log 2>&1
timeout 240 quantshadow run --mode sketch --sample all --label llama-split --out $OUT/llama_run -- python3 tests/gpu/torch_llama.py $OUT/llama_shim.json > $OUT/llama_run.log 2>&1
echo "llama: exit $?, tokens $(same $OUT/llama_plain.json $OUT/llama_shim.json)"; grep -E "^\*\*|Calls:" $OUT/llama_run/report.md | head -3
rm -rf $OUT/llama_run/*.svg
step end
