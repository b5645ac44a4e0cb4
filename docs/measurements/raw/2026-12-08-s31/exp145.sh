#!/usr/bin/env bash
# Session 31: a second context on the device (tests/gpu/two_contexts.cu). .gpu/main: HEAD build;
# .gpu/s30: a3e09cd (before the context guard). Expect with main: digests identical to the plain
# run, 2 checked, 2 skipped "call in another context ...". s30 for contrast.
source tests/gpu/common.sh
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
W=/tmp/w; mkdir -p $W
step "two_contexts.cu"
nvcc -o /tmp/two_contexts tests/gpu/two_contexts.cu -lcublas -lcuda 2>&1 | grep -v Warning | tail -5
/tmp/two_contexts > $W/tc_plain.txt; echo "plain rc $?"; cat $W/tc_plain.txt
for b in s30 main; do
  QUANTSHADOW_LOG=info $PWD/.gpu/$b/quantshadow run --label tc-$b --out $W/tc_$b -- /tmp/two_contexts > $W/tc_$b.txt 2>$W/tc_${b}_err.txt
  echo "$b: rc $?"; diff $W/tc_plain.txt <(grep -E '^(primary|own|two_)' $W/tc_$b.txt) && echo "$b: digests identical"
  grep -E "^\*\*Verdict|^- Calls" $W/tc_$b/report.md | cut -c1-600
  grep -iE "error|warn|skip|closing" $W/tc_${b}_err.txt | cut -c1-300 | head -8
done
step "two_contexts done"
step "verify_shim llama + gate (HEAD build)"
OUT=$W timeout 300 bash tests/gpu/verify_shim.sh llama gate 2>&1 | cut -c1-400
step end2
