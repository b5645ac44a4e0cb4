#!/usr/bin/env python3
"""Median per-stage times of the lean sketch kernel's last block, from a QS_SKETCH_TIMING=1 run
of `quantshadow bench gpu --only sketch` (its QS_LEAN_STAGES lines: us from the first block's
start to the end of the last block's projection loop, block tree, first cluster barrier, split
merge, row finishing, last-block count, slot assembled). Usage: ... | lean_stages.py [LABEL]"""
import statistics
import sys

label = sys.argv[1] if len(sys.argv) > 1 else ""
groups: dict[tuple, list[dict[str, int]]] = {}
for line in sys.stdin:
    if line.startswith("QS_LEAN_STAGES"):
        f = line.split()[1:]
        rec = {f[i]: int(f[i + 1]) for i in range(0, len(f) - 1, 2)}
        key = (rec.pop("af"), rec.pop("n"), rec.pop("k"))
        groups.setdefault(key, []).append(rec)
for (af, n, k), recs in sorted(groups.items()):
    stages = " ".join(f"{s} {statistics.median(r[s] for r in recs) / 1e3:.2f}" for s in recs[0])
    print(f"{label} af={af} {n}x{k} [{len(recs)}]: {stages}")
