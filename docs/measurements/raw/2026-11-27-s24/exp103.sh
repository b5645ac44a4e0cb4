#!/usr/bin/env bash
# Session 24: the split check's wide projection grid (16 splits per group: 128 blocks for 256
# rows, against 64). One build (.gpu/main); A/B by QUANTSHADOW_SKETCH_SPLIT / _EARLY_START.
# 1. selftest detached: split (16 and 8 projection splits) against the lean check in place.
# 2. bench: projections on the caller's stream, 16 against 8 splits, side by side.
# 3. eager_profile: the kernels on the caller's stream per call, fp8 and bf16 4096^3.
# 4. ab_pause, one GEMM back to back (issue 3 end to end): fused, split, split + early start,
#    fused + early start.
# 5. Llama prefill (issue 4), 8b widths and small, split on / off.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "selftest detached"
timeout 200 quantshadow selftest --quick --only detached > $OUT/selftest.txt 2>&1
grep -E "FAIL|passed|failed|split" $OUT/selftest.txt | cut -c1-420 | head -14
step "check per call"
timeout 150 quantshadow bench gpu --only sketch --m 4096 --probes 32 > $OUT/bench_sketch.txt 2>&1; grep -E "^\|" $OUT/bench_sketch.txt | head -12
shim() { env LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all "$@"; }
step "eager profile"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do for cfg in "1 0" "1 1"; do set -- $cfg
  echo "-- $g split=$1 early=$2"; QUANTSHADOW_SKETCH_SPLIT=$1 QUANTSHADOW_EARLY_START=$2 shim timeout 100 python3 tests/gpu/eager_profile.py $g 2>$OUT/prof_err.txt | tail -9; tail -2 $OUT/prof_err.txt
done; done
step "one GEMM back to back, A/B"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096 fp8:4096:14336:4096 bf16:4096:4096:14336; do for cfg in "0 0" "1 0" "1 1" "0 1"; do set -- $cfg
  QUANTSHADOW_SKETCH_SPLIT=$1 QUANTSHADOW_EARLY_START=$2 QUANTSHADOW_LOG=info shim timeout 100 python3 tests/gpu/ab_pause.py "$g split=$1 early=$2" --gemm $g --trials 11 --passes 50 2>$OUT/ab_err.txt | grep '^{' | cut -c1-170 || tail -3 $OUT/ab_err.txt
  grep -hE "skipped:" $OUT/ab_err.txt | grep -v paused | sed 's/^/   /' | head -3
done; done
step "Llama prefill A/B"
for m in 8b-width small; do for cfg in "0 0" "1 0" "1 1"; do set -- $cfg
  QUANTSHADOW_SKETCH_SPLIT=$1 QUANTSHADOW_EARLY_START=$2 QUANTSHADOW_LOG=info shim timeout 150 python3 tests/gpu/ab_pause.py "$m split=$1 early=$2" --llama $m 2>$OUT/ab_err.txt | grep '^{' | cut -c1-170 || tail -3 $OUT/ab_err.txt
  grep -hE "skipped:" $OUT/ab_err.txt | grep -v paused | sed 's/^/   /' | head -3
done; done
step end
