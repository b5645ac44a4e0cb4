#!/usr/bin/env bash
# Session 30 (copy of s29 exp141; first GPU call of the session) (.gpu/main: HEAD build, see md5; .gpu/base: a695b87,
# before the event-record hooks). exp140's steps, most needed first, to fit ~5 minutes:
# capture_event_order (base may fail, main must pass), torch_ops (sketch, rows), lifetimes.cu,
# launch_host_cost.cu, the small Llama prefill A/B (main, base, main: 300 x 2 trials), then the
# device reset's skip reasons and weight_reload.py.
source tests/gpu/common.sh
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
W=/tmp/w; mkdir -p $W
step "capture_event_order.py: plain, base (a695b87), main"
python3 tests/gpu/capture_event_order.py $W/ceo_plain.json; echo "plain rc $?"
for b in base main; do
  $PWD/.gpu/$b/quantshadow run --mode sketch --sample all --label ceo-$b --out $W/ceo_$b -- python3 tests/gpu/capture_event_order.py $W/ceo_$b.json > $W/ceo_$b.txt 2>&1
  echo "$b: rc $?; outputs $(same $W/ceo_plain.json $W/ceo_$b.json)"
  grep -E "^\*\*Verdict|^- Calls" $W/ceo_$b/report.md | cut -c1-300
  grep -E "^\| ceo-" -m1 $W/ceo_$b/report.md | cut -c1-300
done
step "varied_batch.py: one site at 300 batch sizes, eager (expect 1800 checked, PASS, no pool skips)"
python3 tests/gpu/varied_batch.py $W/vb_plain.json; echo "plain rc $?"
quantshadow run --mode sketch --sample all --label varied-batch --out $W/vb -- python3 tests/gpu/varied_batch.py $W/vb_shim.json > $W/vb.txt 2>&1
echo "shim rc $?; outputs $(same $W/vb_plain.json $W/vb_shim.json)"
grep -E "^\*\*Verdict|^- Calls" $W/vb/report.md | cut -c1-400
step "long_replay.py: a graph's replays keep reporting after 9000 eager checks (expect 12 + 9000 + 100 observations, no 'no longer remembered')"
python3 tests/gpu/long_replay.py $W/lr_plain.json; echo "plain rc $?"
quantshadow run --mode sketch --sample all --label long-replay --out $W/lr -- python3 tests/gpu/long_replay.py $W/lr_shim.json > $W/lr.txt 2>&1
echo "shim rc $?; outputs $(same $W/lr_plain.json $W/lr_shim.json)"
grep -E "^\*\*Verdict|^- Calls" $W/lr/report.md; grep -c "no longer remembered" $W/lr/report.md
step "verify_shim ops (torch_ops sketch, rows)"
OUT=$W timeout 150 bash tests/gpu/verify_shim.sh ops 2>&1 | grep -E "identical|DIFFERENT|exit"
step "lifetimes.cu"
nvcc -o /tmp/lifetimes tests/gpu/lifetimes.cu -lcublas 2>&1 | tail -3
/tmp/lifetimes > $W/lifetimes_plain.txt; echo "plain rc $?"
QUANTSHADOW_LOG=info quantshadow run --label lifetimes --out $W/lifetimes -- /tmp/lifetimes > $W/lifetimes_shim.txt 2>$W/lifetimes_err.txt
echo "shim rc $?"; diff $W/lifetimes_plain.txt <(grep -E '^(stream|weight|handles|lifetimes)' $W/lifetimes_shim.txt) && echo "digests identical"
grep -E "^\*\*Verdict|^- Calls" $W/lifetimes/report.md
step "launch_host_cost.cu (M = 1024)"
nvcc -O3 -arch=sm_90 tests/gpu/launch_host_cost.cu -o /tmp/lhc -lcublas -lcuda 2>&1 | grep -v Warning | tail -3
/tmp/lhc 1024
shim() { local b=$1; shift; env LD_PRELOAD=$PWD/.gpu/$b/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=warn "$@"; }
ab() { local b=$1; shift; shim $b timeout 120 "$@" 2>$W/ab_err.txt | grep '^{' | python3 -c "import json,sys
for l in sys.stdin:
    d=json.loads(l); r=d.pop('ratios'); print(json.dumps(d), 'pairs p10/p90', sorted(r)[len(r)//10], sorted(r)[9*len(r)//10])" || tail -3 $W/ab_err.txt; }
step "small prefill, 300 x 2: main, base (a695b87), main"
ab main python3 tests/gpu/ab_pause.py "small main r1" --llama small --trials 300 --passes 2
ab base python3 tests/gpu/ab_pause.py "small base r1" --llama small --trials 300 --passes 2
ab main python3 tests/gpu/ab_pause.py "small main r2" --llama small --trials 300 --passes 2
step "device_reset.cu: 4 GEMMs, reset, 4 more"
nvcc -o /tmp/device_reset tests/gpu/device_reset.cu -lcublas 2>&1 | tail -3
QUANTSHADOW_LOG=debug quantshadow run --label reset --out $W/reset -- /tmp/device_reset reset 4 > $W/reset.txt 2>&1
echo "rc $?"; grep -iE "device_reset|retired|closing|skipped|started|skip:|error" $W/reset.txt | cut -c1-260 | head -20
grep -E "^- Calls" $W/reset/report.md
step "weight_reload.py"
python3 tests/gpu/weight_reload.py $W/wr_plain.json > /dev/null 2>&1; echo "plain rc $?"
quantshadow run --mode sketch --sample all --label reload --out $W/wr -- python3 tests/gpu/weight_reload.py $W/wr_shim.json > $W/wr.txt 2>&1
echo "shim rc $?; outputs $(same $W/wr_plain.json $W/wr_shim.json)"
grep -E "^\*\*Verdict|^- Calls" $W/wr/report.md
cp $W/reset.txt $W/lifetimes_err.txt $OUT/ 2>/dev/null
step end
