#!/usr/bin/env bash
# Session 31, after the review fixes (.gpu/main = 6a0f449): captured batch sizes past the pool's
# room (40 sizes, pool 64 and 32 MiB, sample all and 1/2), eager batch sizes with a small pool, a
# second context, capture_event_order again, then the prefill A/B by sampled rows. (Trimmed to
# fit the session's last device time: 60 sizes and long_replay dropped.)
source tests/gpu/common.sh
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/main/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
W=/tmp/w; mkdir -p $W
for sizes in 40; do
  python3 tests/gpu/many_captured_sizes.py $W/mcs_plain_$sizes.json --sizes $sizes > /dev/null; echo "plain $sizes rc $?"
  for pool in 64 32; do
    for s in all 1/2; do
      tag=$sizes-$pool-${s/\//of}
      step "many_captured_sizes.py --sizes $sizes, pool $pool MiB, sample $s"
      QUANTSHADOW_POOL_MB=$pool quantshadow run --mode sketch --sample $s --label mcs-$tag --out $W/mcs_$tag -- \
        python3 tests/gpu/many_captured_sizes.py $W/mcs_$tag.json --sizes $sizes > $W/mcs_$tag.txt 2>&1
      echo "rc $?; outputs $(same $W/mcs_plain_$sizes.json $W/mcs_$tag.json)"
      grep -E "^sizes" $W/mcs_$tag.txt
      grep -E "^\*\*Verdict|^- Calls" $W/mcs_$tag/report.md | cut -c1-700
    done
  done
done
step "two_contexts.cu"
nvcc -o /tmp/two_contexts tests/gpu/two_contexts.cu -lcublas -lcuda 2>&1 | grep -v Warning | tail -3
/tmp/two_contexts > $W/tc_plain.txt
quantshadow run --label tc --out $W/tc -- /tmp/two_contexts > $W/tc.txt 2>/dev/null
echo "rc $?"; diff $W/tc_plain.txt <(grep -E '^(primary|own|two_)' $W/tc.txt) && echo "digests identical"
grep -E "^- Calls" $W/tc/report.md | cut -c1-500
# Where the eager prefill's +9-10% goes: the same checks with fewer sampled rows (same launches
# and host path, far less GPU work per check). Small Llama, sketch all, 300 x 2 trials each.
ab() { env LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_LOG=warn "$@" 2>$W/ab_err.txt | grep '^{' | cut -c1-260 || tail -3 $W/ab_err.txt; }
step "prefill A/B: sketch rows 256 (default), 16, 256"
ab timeout 120 python3 tests/gpu/ab_pause.py "rows256 r1" --llama small --trials 300 --passes 2
QUANTSHADOW_SKETCH_ROWS=16 ab timeout 120 python3 tests/gpu/ab_pause.py "rows16" --llama small --trials 300 --passes 2
ab timeout 120 python3 tests/gpu/ab_pause.py "rows256 r2" --llama small --trials 300 --passes 2
step "varied_batch.py with a 32 MiB pool (eager sizes past the pool's room: gates only)"
python3 tests/gpu/varied_batch.py $W/vb_plain.json > /dev/null; echo "plain rc $?"
QUANTSHADOW_POOL_MB=32 quantshadow run --mode sketch --sample all --label varied-batch-32 --out $W/vb32 -- python3 tests/gpu/varied_batch.py $W/vb32.json > $W/vb32.txt 2>&1
echo "rc $?; outputs $(same $W/vb_plain.json $W/vb32.json)"
grep -E "^\*\*Verdict|^- Calls" $W/vb32/report.md | cut -c1-700
step "capture_event_order.py"
python3 tests/gpu/capture_event_order.py $W/ceo_plain.json > /dev/null
quantshadow run --mode sketch --sample all --label ceo --out $W/ceo -- python3 tests/gpu/capture_event_order.py $W/ceo.json > $W/ceo.txt 2>&1
echo "ceo rc $?; outputs $(same $W/ceo_plain.json $W/ceo.json)"; grep -E "^- Calls" $W/ceo/report.md
step "eager_attention.py: activation-B GEMMs of a new shape at every decode step (site growth)"
python3 tests/gpu/eager_attention.py $W/ea_plain.json; echo "plain rc $?"
quantshadow run --mode sketch --sample all --label eager-attention --out $W/ea -- python3 tests/gpu/eager_attention.py $W/ea.json > $W/ea.txt 2>&1
echo "rc $?; tokens $(same $W/ea_plain.json $W/ea.json)"
grep -E "^\*\*Verdict|^- Calls|^\| \`eager-attention" $W/ea/report.md | cut -c1-700
grep -c "cublasGemmStridedBatchedEx" $W/ea/report.md
cp $W/ea/report.md $OUT/ea_report.md 2>/dev/null
cp $W/mcs_40-32-all/report.md $OUT/mcs_40-32-all.md 2>/dev/null
step end
