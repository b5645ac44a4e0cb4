#!/usr/bin/env bash
# Session 29, last try with ~4 minutes of device time left: the event-record hooks'
# capture-order test (base a695b87 may fail, main must pass), lifetimes.cu, torch_ops.
source tests/gpu/common.sh
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/libquantshadow.so | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
W=/tmp/w; mkdir -p $W
step "capture_event_order.py: plain, base (a695b87), main"
python3 tests/gpu/capture_event_order.py $W/ceo_plain.json; echo "plain rc $?"
for b in main base; do
  $PWD/.gpu/$b/quantshadow run --mode sketch --sample all --label ceo-$b --out $W/ceo_$b -- python3 tests/gpu/capture_event_order.py $W/ceo_$b.json > $W/ceo_$b.txt 2>&1
  echo "$b: rc $?; outputs $(same $W/ceo_plain.json $W/ceo_$b.json)"
  grep -E "^\*\*Verdict|^- Calls" $W/ceo_$b/report.md | cut -c1-300
done
step "lifetimes.cu"
nvcc -o /tmp/lifetimes tests/gpu/lifetimes.cu -lcublas 2>&1 | tail -3
/tmp/lifetimes > $W/lifetimes_plain.txt; echo "plain rc $?"
QUANTSHADOW_LOG=info quantshadow run --label lifetimes --out $W/lifetimes -- /tmp/lifetimes > $W/lifetimes_shim.txt 2>$W/lifetimes_err.txt
echo "shim rc $?"; diff $W/lifetimes_plain.txt <(grep -E '^(stream|weight|handles|lifetimes)' $W/lifetimes_shim.txt) && echo "digests identical"
grep -E "^\*\*Verdict|^- Calls" $W/lifetimes/report.md
step "verify_shim ops (torch_ops sketch, rows)"
OUT=$W timeout 100 bash tests/gpu/verify_shim.sh ops 2>&1 | grep -E "identical|DIFFERENT|exit"
step end
