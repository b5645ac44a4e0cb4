#!/usr/bin/env python3
"""Median per-stage times of the lean sketch kernel's last block, from a QS_SKETCH_TIMING=1 run
of `quantshadow bench gpu --only sketch` (its QS_LEAN_STAGES lines: us from the first block's
start to the last block's rows drawn, projection loop end, block tree, first cluster barrier,
split merge, row finishing, last-block count, slot assembled; QS_LEAN_ITERS: when its warp 0's
first four load-then-mma iterations started). Usage: ... | lean_stages.py [LABEL]"""
import statistics
import sys

label = sys.argv[1] if len(sys.argv) > 1 else ""
groups: dict[tuple, list[dict[str, int]]] = {}
for line in sys.stdin:
    if line.startswith("QS_LEAN_STAGES") or line.startswith("QS_LEAN_ITERS"):
        f = line.split()[1:]
        rec = {f[i]: int(f[i + 1]) for i in range(0, len(f) - 1, 2)}
        key = (line.split()[0][8:], rec.pop("af"), rec.pop("n"), rec.pop("k"))
        groups.setdefault(key, []).append(rec)
for (kind, af, n, k), recs in sorted(groups.items()):
    stages = " ".join(f"{s} {statistics.median(r[s] for r in recs) / 1e3:.2f}" for s in recs[0])
    print(f"{label} {kind} af={af} {n}x{k} [{len(recs)}]: {stages}")
