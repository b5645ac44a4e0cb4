# Session 12, second call: eager prefill under sketch all with the side-stream check narrowed
# (QUANTSHADOW_SIDE_SPLITS): does a check using fewer SMs slow the production GEMMs less?
source tests/gpu/common.sh
L=/tmp/l; mkdir -p $L; t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
shim() { LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so "$@"; }
step ops
python3 tests/gpu/torch_ops.py $L/ops_plain.json > $L/ops_plain.log 2>&1
for sp in 0 1; do
  QUANTSHADOW_SIDE_SPLITS=$sp timeout 120 quantshadow run --mode sketch --label ops-sp$sp --out $L/ops$sp -- python3 tests/gpu/torch_ops.py $L/ops$sp.json > $L/ops$sp.log 2>&1
  echo "ops splits=$sp: exit $? outputs $(same $L/ops_plain.json $L/ops$sp.json); $(grep -E 'Calls:' $L/ops$sp/report.md)"; grep -E "^\*\*Verdict" $L/ops$sp/report.md
done
step prefill
for r in 1 2 3; do
  echo "pre r$r plain: $(timeout 60 python3 tests/gpu/overhead_mlp.py 2>/dev/null | grep '^{')"
  for sp in 0 4 2 1; do
    echo "pre r$r splits=$sp: $(QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_SIDE_SPLITS=$sp shim timeout 60 python3 tests/gpu/overhead_mlp.py 2>/dev/null | grep '^{')"
  done
done
step counts
for sp in 0 2 1; do
  QUANTSHADOW_SIDE_SPLITS=$sp timeout 60 quantshadow run --mode sketch --sample all --label pre-sp$sp --out $L/pre$sp -- python3 tests/gpu/overhead_mlp.py > $L/pre$sp.log 2>&1
  echo "splits=$sp exit $?: $(grep -E 'Calls:' $L/pre$sp/report.md | head -1)"
done
step profile
for sp in 0 1; do
  QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_SIDE_SPLITS=$sp shim timeout 60 python3 tests/gpu/graph_profile.py pre-sp$sp --prefill 2>&1 | grep -v "^STAGE\|Warning\|warn\|quantshadow" | head -24
done
step llama-prefill
a=(--timing --trials 7 --size 8b-width --prompt 1024 --decode-steps 2)
echo "llama plain: $(timeout 120 python3 tests/gpu/torch_llama.py $L/lp.json "${a[@]}" 2>/dev/null | tail -1)"
for sp in 0 1; do
  echo "llama splits=$sp: $(QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_SIDE_SPLITS=$sp shim timeout 120 python3 tests/gpu/torch_llama.py $L/l$sp.json "${a[@]}" 2>/dev/null | tail -1)"
done
step done
