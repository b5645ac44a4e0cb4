#!/usr/bin/env bash
# Session 28, call 2, prepared and not run (.gpu/main: the build to test; .gpu/base: a695b87, before the event-record hooks):
# one weight change counted once, the transport keeping unsent records, the capture order test: why the GEMMs after
# a cudaDeviceReset were skipped (exp138: backend restarted, 4 of 4 skipped); lifetimes.cu
# again; weight_reload.py (16 weights rewritten in place once, checks queued behind them).
source tests/gpu/common.sh
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/main/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
W=/tmp/w; mkdir -p $W
step "device_reset.cu: 4 GEMMs, reset, 4 more"
nvcc -o /tmp/device_reset tests/gpu/device_reset.cu -lcublas 2>&1 | tail -3
QUANTSHADOW_LOG=debug quantshadow run --label reset --out $W/reset -- /tmp/device_reset reset 4 > $W/reset.txt 2>&1
echo "rc $?"; grep -iE "device_reset|retired|closing|skipped|started|skip:|error" $W/reset.txt | cut -c1-260 | head -20
grep -E "^- Calls" $W/reset/report.md
step "lifetimes.cu"
nvcc -o /tmp/lifetimes tests/gpu/lifetimes.cu -lcublas 2>&1 | tail -3
/tmp/lifetimes > $W/lifetimes_plain.txt; echo "plain rc $?"
QUANTSHADOW_LOG=info quantshadow run --label lifetimes --out $W/lifetimes -- /tmp/lifetimes > $W/lifetimes_shim.txt 2>$W/lifetimes_err.txt
echo "shim rc $?"; diff $W/lifetimes_plain.txt <(grep -E '^(stream|weight|handles|lifetimes)' $W/lifetimes_shim.txt) && echo "digests identical"
grep -E "^\*\*Verdict|^- Calls" $W/lifetimes/report.md
step "weight_reload.py"
python3 tests/gpu/weight_reload.py $W/wr_plain.json > /dev/null 2>&1; echo "plain rc $?"
quantshadow run --mode sketch --sample all --label reload --out $W/wr -- python3 tests/gpu/weight_reload.py $W/wr_shim.json > $W/wr.txt 2>&1
echo "shim rc $?; outputs $(same $W/wr_plain.json $W/wr_shim.json)"
grep -E "^\*\*Verdict|^- Calls" $W/wr/report.md
step "capture_event_order.py: plain, base (a695b87), main"
python3 tests/gpu/capture_event_order.py $W/ceo_plain.json; echo "plain rc $?"
for b in base main; do
  $PWD/.gpu/$b/quantshadow run --mode sketch --sample all --label ceo-$b --out $W/ceo_$b -- python3 tests/gpu/capture_event_order.py $W/ceo_$b.json > $W/ceo_$b.txt 2>&1
  echo "$b: rc $?; outputs $(same $W/ceo_plain.json $W/ceo_$b.json)"
  grep -E "^\*\*Verdict|^- Calls" $W/ceo_$b/report.md | cut -c1-300
  grep -E "^\| ceo-" -m1 $W/ceo_$b/report.md | cut -c1-300
done
step "verify_shim ops (torch_ops sketch, rows)"
OUT=$W timeout 150 bash tests/gpu/verify_shim.sh ops 2>&1 | grep -E "identical|DIFFERENT|exit"
cp $W/reset.txt $W/lifetimes_err.txt $OUT/ 2>/dev/null
step end
