#!/usr/bin/env bash
# Session 25: the wide projection grid again (16 splits, 128 blocks at 256 rows), now with a
# finishing of 4 blocks (2 row groups each) so that both fit the H100's 132 SMs beside each
# other (.gpu/w16 = 0700558 + session 24's 62e6adc re-applied + the small finishing), against
# the 8-split build (.gpu/win = 8092642), one call.
source tests/gpu/common.sh
export PATH=$PWD/.gpu/w16:$PATH
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "selftest detached (w16)"
timeout 200 .gpu/w16/quantshadow selftest --quick --only detached --json $OUT/selftest.json > $OUT/selftest.txt 2>&1
echo "selftest rc $?"; grep -E "passed|failed|\| fail" $OUT/selftest.txt | head; grep -E "split = lean" $OUT/selftest.txt | cut -c1-230
step "kernel timeline"
for round in 1 2; do for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do for b in win w16; do
  echo "-- $b r$round"; env LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
    timeout 100 python3 tests/gpu/eager_profile.py $g --calls 24 2>$OUT/err.txt | grep -E "checking|paused|qs_" | grep -v "t+"
done; done; done
ab() { env $4 QUANTSHADOW_LOG=info LD_PRELOAD=$PWD/.gpu/$3/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  timeout 150 python3 tests/gpu/ab_pause.py "$1" $2 2>$OUT/ab_err.txt | grep '^{' | cut -c1-160 || tail -3 $OUT/ab_err.txt
  grep -hE "skipped:" $OUT/ab_err.txt | grep -v paused | sed 's/^/   /' | cut -c1-200 | head -3; }
step "ab_pause"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do
  ab "$g win" "--gemm $g --trials 11 --passes 50" win QUANTSHADOW_X=0
  ab "$g w16" "--gemm $g --trials 11 --passes 50" w16 QUANTSHADOW_X=0
done
step "Llama under quantshadow run (w16, every eager check of 64+ rows split)"
timeout 200 python3 tests/gpu/torch_llama.py $OUT/llama_plain.json > $OUT/llama_plain.log 2>&1
QUANTSHADOW_SKETCH_SPLIT=1 timeout 240 .gpu/w16/quantshadow run --mode sketch --sample all --label llama --out $OUT/llama_run -- python3 tests/gpu/torch_llama.py $OUT/llama_shim.json > $OUT/llama_run.log 2>&1
echo "llama: exit $?, tokens $(same $OUT/llama_plain.json $OUT/llama_shim.json)"; grep -E "^\*\*|Calls:" $OUT/llama_run/report.md | head -3
rm -rf $OUT/llama_run/*.svg $OUT/llama_run/*.qsr
step end
