#!/usr/bin/env bash
# Session 23, first run of the split sketch check (bb685dc): qs_sketch_proj on the caller's
# stream, qs_sketch_fin on the side stream. One build (.gpu/main); A/B by QUANTSHADOW_SKETCH_SPLIT.
# 1. selftest detached + sketch: the split cases must equal the lean check in place.
# 2. bench: projections and finishing per call beside the fused lean check; production GEMMs.
# 3. eager_profile: what the caller's stream runs per call, fp8 and bf16 4096^3, split on / off.
# 4. ab_pause, one GEMM back to back (issue 3 end to end), split on / off.
# 5. torch_ops under quantshadow run (M = 4096 calls split): outputs identical, PASS.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
step "selftest detached, sketch"
timeout 240 quantshadow selftest --quick --only detached,sketch > $OUT/selftest.txt 2>&1
grep -E "FAIL|passed|failed|split" $OUT/selftest.txt | cut -c1-400 | head -14
step "check per call, production GEMMs"
timeout 200 quantshadow bench gpu --only sketch --m 512,4096 --probes 32 > $OUT/bench_sketch.txt 2>&1; grep -E "^\|" $OUT/bench_sketch.txt | head -20
timeout 120 python3 tests/gpu/bench_torch.py > $OUT/bench_torch.txt 2>&1; sed -n '/production/,$p' $OUT/bench_torch.txt | grep -E "production|---| 4096 \|" | head -12
shim() { env LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all "$@"; }
step "eager profile"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do for sp in 1 0; do
  echo "-- $g split=$sp"; QUANTSHADOW_SKETCH_SPLIT=$sp shim timeout 100 python3 tests/gpu/eager_profile.py $g 2>$OUT/prof_err.txt | tail -14; tail -2 $OUT/prof_err.txt
done; done
step "one GEMM back to back, A/B"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096 fp8:4096:14336:4096; do for sp in 1 0; do
  QUANTSHADOW_SKETCH_SPLIT=$sp QUANTSHADOW_LOG=info shim timeout 100 python3 tests/gpu/ab_pause.py "$g split=$sp" --gemm $g --trials 11 --passes 50 2>$OUT/ab_err.txt | grep '^{' | cut -c1-200 || tail -3 $OUT/ab_err.txt
  grep -hE "skipped:" $OUT/ab_err.txt | grep -v paused | sed 's/^/   /' | head -3
done; done
step "torch_ops under quantshadow run"
python3 tests/gpu/torch_ops.py $OUT/ops_plain.json > $OUT/ops_plain.log 2>&1
for sp in 1 0; do
  QUANTSHADOW_SKETCH_SPLIT=$sp timeout 200 quantshadow run --mode sketch --sample all --label ops-split-$sp --out $OUT/ops_$sp -- python3 tests/gpu/torch_ops.py $OUT/ops_$sp.json > $OUT/ops_$sp.log 2>&1
  echo "ops split=$sp: exit $?, outputs $(same $OUT/ops_plain.json $OUT/ops_$sp.json)"; grep -E "^\*\*|checked|skipped" $OUT/ops_$sp/report.md | head -4
done
step end
