#!/usr/bin/env bash
# Session 31, last device minutes: exp147's first steps only (build 6a0f449 in .gpu/main):
# many_captured_sizes at 40 sizes with a 32 MiB pool (sample all, 1/2), then two_contexts.
source tests/gpu/common.sh
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/main/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
W=/tmp/w; mkdir -p $W
python3 tests/gpu/many_captured_sizes.py $W/mcs_plain.json > /dev/null; echo "plain rc $?"
for s in all 1/2; do
  tag=32-${s/\//of}
  step "many_captured_sizes.py, pool 32 MiB, sample $s"
  QUANTSHADOW_POOL_MB=32 quantshadow run --mode sketch --sample $s --label mcs-$tag --out $W/mcs_$tag -- \
    python3 tests/gpu/many_captured_sizes.py $W/mcs_$tag.json > $W/mcs_$tag.txt 2>&1
  echo "rc $?; outputs $(same $W/mcs_plain.json $W/mcs_$tag.json)"
  grep -E "^\*\*Verdict|^- Calls" $W/mcs_$tag/report.md | cut -c1-700
done
step "two_contexts.cu"
nvcc -o /tmp/two_contexts tests/gpu/two_contexts.cu -lcublas -lcuda 2>&1 | grep -v Warning | tail -3
/tmp/two_contexts > $W/tc_plain.txt
quantshadow run --label tc --out $W/tc -- /tmp/two_contexts > $W/tc.txt 2>/dev/null
echo "rc $?"; diff $W/tc_plain.txt <(grep -E '^(primary|own|two_)' $W/tc.txt) && echo "digests identical"
grep -E "^- Calls" $W/tc/report.md | cut -c1-500
step end
