"""Stage marks of many sketch checks at once (QS_SKETCH_TIMING=2 lines, QS_TIMING_ABS) per
decode-graph replay: reads the lines on stdin, groups them into replays (gaps over 200 us),
prints every third check of two replays and the spread of each stage.

    grep QS_TIMING_ABS LOG | tail -480 | python3 abs_stages.py
"""
import sys
rows = [dict(zip(l.split()[1::2], map(int, l.split()[2::2]))) for l in sys.stdin]
rows.sort(key=lambda r: r["final"])
reps = [[rows[0]]]
for r in rows[1:]:
    if r["final"] - reps[-1][-1]["final"] > 200_000:
        reps.append([r])
    else:
        reps[-1].append(r)
print([len(x) for x in reps])
for rep in reps[1:3]:
    t0 = min(r["group"] for r in rep)
    for r in rep[::3]:
        n, k = r["n"], r["k"]
        f = lambda x: (r[x] - t0) / 1e3
        print(f"  n {n:5d} k {k:5d}: group {f('group'):6.2f} final {f('final'):6.2f} claim {f('claim'):6.2f} publish {f('publish'):6.2f}")
    for a, b in (("group", "final"), ("final", "claim"), ("claim", "publish")):
        d = sorted((r[b] - r[a]) / 1e3 for r in rep)
        print(f"  {a} -> {b}: min {d[0]:.2f} median {d[len(d)//2]:.2f} max {d[-1]:.2f} us")
