#!/usr/bin/env bash
# Session 24: where the split check's projections spend their ~8-10 us behind a real GEMM, for
# the next session's kernel work. One build (.gpu/main, the session's final tree + the proj
# kernel's QS_SKETCH_TIMING marks). Stage marks (ns from the grid's first block start) of the
# projections (split) and of the fused lean check, behind fp8 / bf16 4096^3 GEMMs; then the
# opt-in early start with split checks (ab_pause, against the default in the same call).
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
t0=$SECONDS
step() { echo "== $1 (t=$((SECONDS - t0))s)"; }
md5sum .gpu/*/* | cut -c1-12,34-
nvidia-smi --query-gpu=name --format=csv,noheader
shim() { env LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all "$@"; }
summ() { python3 - "$1" <<'PY'
import re, statistics, sys, collections
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    m = re.match(r"(QS_PROJ_STAGES|QS_LEAN_STAGES|QS_TIMING) (.*)", line)
    if not m: continue
    body = m.group(2).replace("own:", "own_")
    pairs = re.findall(r"(\w+) (\d+)", body)
    key = m.group(1) + " " + " ".join(f"{k}={v}" for k, v in pairs if k in ("af", "n", "k"))
    for k, v in pairs:
        if k not in ("af", "n", "k", "m", "det"): rows[key][k].append(int(v) / 1000)
for key, f in rows.items():
    n = len(next(iter(f.values())))
    print(f"   {key} ({n} launches, median us): " + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in f.items()))
PY
}
step "stage marks behind the GEMM"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do for sp in 1 0; do
  echo "-- $g split=$sp"
  QUANTSHADOW_KERNEL_DEFINES=QS_SKETCH_TIMING=1 QUANTSHADOW_SKETCH_SPLIT=$sp shim timeout 120 python3 tests/gpu/eager_profile.py $g --calls 24 > $OUT/tm_$sp.txt 2>$OUT/prof_err.txt
  grep -E "^==.*checking|/call" $OUT/tm_$sp.txt | grep -vE "Memset" | tail -4; summ $OUT/tm_$sp.txt; tail -1 $OUT/prof_err.txt | grep -v Warn
done; done
step "early start with split checks, A/B"
for g in fp8:4096:4096:4096 bf16:4096:4096:4096; do for e in 1 0; do
  QUANTSHADOW_EARLY_START=$e QUANTSHADOW_LOG=info shim timeout 100 python3 tests/gpu/ab_pause.py "$g early=$e" --gemm $g --trials 11 --passes 50 2>$OUT/ab_err.txt | grep '^{' | cut -c1-160 || tail -3 $OUT/ab_err.txt
done; done
step end
