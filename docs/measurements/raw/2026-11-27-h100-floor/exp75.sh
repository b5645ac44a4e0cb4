#!/usr/bin/env bash
# Where the 48-GEMM decode graph's end-of-replay checks spend their time: the last block's stage
# marks of each check as absolute times (QS_SKETCH_TIMING=2), one replay late in the run.
source tests/gpu/common.sh
export QUANTSHADOW_LOG=warn
md5sum .gpu/main/* | cut -c1-12,34-
QUANTSHADOW_KERNEL_DEFINES="QS_SKETCH_TIMING=2" QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
  LD_PRELOAD=$PWD/.gpu/main/libquantshadow.so timeout 300 python3 tests/gpu/overhead_mlp.py --repeat 8 > $OUT/abs.txt 2>&1
grep -c QS_TIMING_ABS $OUT/abs.txt
grep QS_TIMING_ABS $OUT/abs.txt | tail -480 | python3 -c '
import sys
rows = [dict(zip(l.split()[1::2], map(int, l.split()[2::2]))) for l in sys.stdin]
for r0 in range(0, len(rows), 96):
    rep = sorted(rows[r0:r0 + 48], key=lambda r: r["final"])
    if len(rep) < 48: break
    t0 = min(r["group"] for r in rep)
    print("replay: 48 checks, us from the first group merge: final / claim done / published")
    for r in rep[::4]:
        print(f"  n {r[\"n\"]:5d} k {r[\"k\"]:5d}: group {(r[\"group\"]-t0)/1e3:6.2f} final {(r[\"final\"]-t0)/1e3:6.2f} claim {(r[\"claim\"]-t0)/1e3:6.2f} publish {(r[\"publish\"]-t0)/1e3:6.2f}")
    d = sorted((r["claim"] - r["final"]) / 1e3 for r in rep)
    print(f"  finish_check (final -> claim): min {d[0]:.2f} median {d[24]:.2f} max {d[-1]:.2f} us")
    g = sorted((r["final"] - r["group"]) / 1e3 for r in rep)
    print(f"  group -> final: min {g[0]:.2f} median {g[24]:.2f} max {g[-1]:.2f} us")
'
