#!/usr/bin/env bash
# Session 24: is the wide projection grid (16 splits) slower behind a real GEMM than the 8-split
# one, as exp103's profile suggests (16.2-16.8 us fp8, 11.2-12.0 us bf16 against session 23's
# 9.8 / 8.2 us)? Two builds of one tree: .gpu/main (16 splits where they fit) and .gpu/s8
# (force_8_splits.patch). Split checks on; the fused check (main) as the reference.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
shim() { b=$1; shift; env LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all "$@"; }
step "eager profile, split on"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do for b in main s8 main s8; do
  echo "-- $g build=$b"; QUANTSHADOW_SKETCH_SPLIT=1 shim $b timeout 100 python3 tests/gpu/eager_profile.py $g 2>$OUT/prof_err.txt | grep -E "^==|/call" | grep -vE "Memset|paused" ; tail -1 $OUT/prof_err.txt | grep -v Warn
done; done
step "one GEMM back to back, A/B"
for round in 1 2; do for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do for cfg in "main 1" "s8 1" "main 0"; do set -- $cfg
  QUANTSHADOW_SKETCH_SPLIT=$2 QUANTSHADOW_LOG=info shim $1 timeout 100 python3 tests/gpu/ab_pause.py "$g build=$1 split=$2 r$round" --gemm $g --trials 11 --passes 50 2>$OUT/ab_err.txt | grep '^{' | cut -c1-150 || tail -3 $OUT/ab_err.txt
  grep -hE "skipped:|checked" $OUT/ab_err.txt | grep -v paused | sed 's/^/   /' | cut -c1-200 | head -3
done; done; done
step end
