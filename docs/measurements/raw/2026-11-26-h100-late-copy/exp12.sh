# Session 12, one device call: (1) the late-added snapshot copy (.gpu/main) against HEAD (.gpu/v1)
# in graph decode; (2) how eager prefill's sketch-all overhead scales with the rows copied.
source tests/gpu/common.sh
t0=$SECONDS
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
step ops
timeout 200 bash tests/gpu/verify_detach.sh ops 2>&1 | grep -E "outputs|Calls|PASS|FAIL" | head -8
grep -h "closing" $OUT/ops_*.log | head -2
tar czf $OUT/qscache.tgz -C /tmp qscache 2>/dev/null; ls -la $OUT/qscache.tgz
step run48
rm -rf $OUT/run48; timeout 90 quantshadow run --mode sketch --sample all --label late-48 --out $OUT/run48 -- python3 tests/gpu/overhead_mlp.py --repeat 8 > $OUT/run48.log 2>&1; echo "run48 exit $?"; grep -E "Verdict|Calls:|^\*\*" $OUT/run48/report.md | head -4
grep -h "closing" $OUT/run48.log | head -2
step mlp48
for r in 1 2; do
  echo "r$r plain: $(timeout 60 python3 tests/gpu/overhead_mlp.py --repeat 8 2>/dev/null | grep '^{')"
  for v in v1 main; do
    echo "r$r $v: $(QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all LD_PRELOAD=$PWD/.gpu/$v/libquantshadow.so timeout 60 python3 tests/gpu/overhead_mlp.py --repeat 8 2>/dev/null | grep '^{')"
  done
done
step profile48
QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so timeout 60 python3 tests/gpu/graph_profile.py late48 --repeat 8 --timeline > $OUT/profile48_late.txt 2>&1
grep -E "checks on|replay span|without the profiler" $OUT/profile48_late.txt
step llama
a=(--timing --graph --graph-only --trials 5 --size small)
echo "llama small plain: $(timeout 90 python3 tests/gpu/torch_llama.py $OUT/lp.json "${a[@]}" 2>/dev/null | tail -1)"
for v in v1 main; do
  echo "llama small $v: $(QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all LD_PRELOAD=$PWD/.gpu/$v/libquantshadow.so timeout 90 python3 tests/gpu/torch_llama.py $OUT/l_$v.json "${a[@]}" 2>/dev/null | tail -1) tokens $(same $OUT/lp.json $OUT/l_$v.json)"
done
step prefill
for r in 1 2; do
  echo "pre r$r plain: $(timeout 60 python3 tests/gpu/overhead_mlp.py 2>/dev/null | grep '^{')"
  for cfg in "on 256" "on 64" "on 16" "off 256" "off 64"; do
    set -- $cfg
    echo "pre r$r detach=$1 rows=$2: $(QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all QUANTSHADOW_SKETCH_DETACH=$1 QUANTSHADOW_SKETCH_ROWS=$2 LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so timeout 60 python3 tests/gpu/overhead_mlp.py 2>/dev/null | grep '^{')"
  done
done
step prefill-count
for rows in 256 64; do
  rm -rf $OUT/pre$rows; QUANTSHADOW_SKETCH_ROWS=$rows timeout 60 quantshadow run --mode sketch --sample all --label pre-$rows --out $OUT/pre$rows -- python3 tests/gpu/overhead_mlp.py > $OUT/pre$rows.log 2>&1
  echo "rows=$rows exit $?: $(grep -E "Calls:" $OUT/pre$rows/report.md | head -1)"; grep -h "closing" $OUT/pre$rows.log | head -1 | cut -c1-600
done
step profile-prefill
QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so timeout 60 python3 tests/gpu/graph_profile.py pre256 --prefill > $OUT/profile_prefill.txt 2>&1
grep -v "^STAGE\|Warning" $OUT/profile_prefill.txt | head -30
step done
