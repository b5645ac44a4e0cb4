#!/usr/bin/env python3
"""Median stage times of sketch checks from a QS_SKETCH_TIMING=1 run of `quantshadow bench gpu`.

The kernel's last block prints one line per launch:
  QS_TIMING af A m M n N k K det D last_start us... a .. proj .. group .. final .. claim .. publish ..
(A: the A format id, D = 1 for a detached check over a snapshot, + 2 for the lean kernel; stage values in ns from the
first block's start). Device printf and the bench's table go through different buffers, so lines
are grouped by their (format, M, N, K, kind), not by position. Prints the median of each stage in
us per group. Usage: quantshadow bench gpu ... | python3 tests/gpu/stage_times.py [LABEL]
"""
import statistics
import sys

KEYS = ("af", "m", "n", "k", "det")


def main() -> None:
    label = sys.argv[1] if len(sys.argv) > 1 else ""
    groups: dict[tuple, list[dict[str, float]]] = {}
    for line in sys.stdin:
        if not line.startswith("QS_TIMING"):
            continue
        f = line.split()[1:]
        rec = {f[i]: int(f[i + 1]) for i in range(0, len(f) - 1, 2)}
        key = tuple(rec.pop(k) for k in KEYS)
        groups.setdefault(key, []).append(rec)
    for (af, m, n, k, det), recs in sorted(groups.items()):
        kind = ("lean " if det >= 2 else "") + ("detached" if det % 2 else "in place")
        stages = " ".join(f"{s} {statistics.median(r[s] for r in recs) / 1e3:.2f}" for s in recs[0])
        print(f"{label} af={af} M={m} {n}x{k} [{kind}, {len(recs)}]: {stages}")


if __name__ == "__main__":
    main()
