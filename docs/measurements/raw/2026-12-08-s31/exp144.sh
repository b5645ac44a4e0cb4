#!/usr/bin/env bash
# Session 31 (run after s30's exp143, as a second call): captured batch sizes past the pool's
# room. .gpu/main: HEAD build (see md5); .gpu/s30: a3e09cd (session 30's HEAD, before the graph
# scratch). Expect with main: no "graph capture:" skips, observations = eager + every replay's
# (sample all) or about half the replays' (1/2), PASS, outputs identical to the plain run. With
# s30: the same run skips the captures of sizes set up after the pool's first three quarters.
source tests/gpu/common.sh
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
W=/tmp/w; mkdir -p $W
step "many_captured_sizes.py plain"
python3 tests/gpu/many_captured_sizes.py $W/mcs_plain.json; echo "plain rc $?"
for b in s30 main; do
  for s in all 1/2; do
    tag=$b-${s/\//of}
    step "many_captured_sizes.py $b, sample $s, pool 64 MiB"
    QUANTSHADOW_POOL_MB=64 $PWD/.gpu/$b/quantshadow run --mode sketch --sample $s --label mcs-$tag --out $W/mcs_$tag -- \
      python3 tests/gpu/many_captured_sizes.py $W/mcs_$tag.json > $W/mcs_$tag.txt 2>&1
    echo "rc $?; outputs $(same $W/mcs_plain.json $W/mcs_$tag.json)"
    grep -E "^sizes" $W/mcs_$tag.txt
    grep -E "^\*\*Verdict|^- Calls" $W/mcs_$tag/report.md | cut -c1-900
    cp $W/mcs_$tag/report.md $OUT/mcs_$tag.md 2>/dev/null
  done
done
step end
