#!/usr/bin/env python3
"""Hot SASS instructions of one kernel from `ncu --page source --print-source sass --csv`.

Prints the CSV header (the column names vary across ncu versions), the totals of every stall
column, and the top instructions by the all-samples column with their non-zero stall columns
and a few neighbours, plus samples summed per 64-instruction window (where the time goes)."""
import csv
import sys

rows = list(csv.reader(open(sys.argv[1], newline="")))
start = next((i for i, r in enumerate(rows) if any("Address" in c for c in r)), None)
if start is None:
    print("no source table found; first lines:")
    for r in rows[:20]:
        print(r)
    sys.exit(0)
head = rows[start]
body = [r for r in rows[start + 1:] if len(r) == len(head)]
print("columns:", head)
addr = next(i for i, c in enumerate(head) if "Address" in c)
src = next((i for i, c in enumerate(head) if c.strip() == "Source"), addr + 1)
def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0
samp = next((i for i, c in enumerate(head) if "Sampling (All" in c), None)
if samp is None:
    samp = next(i for i, c in enumerate(head) if "Sampl" in c)
stall_cols = [i for i, c in enumerate(head) if c.startswith("stall") or "Stall" in c and i != samp]
total = sum(num(r[samp]) for r in body)
print(f"instructions {len(body)}, samples {total:.0f}")
tot = sorted(((sum(num(r[i]) for r in body), head[i]) for i in stall_cols), reverse=True)
print("stall columns (sum):", ", ".join(f"{n} {v:.0f}" for v, n in tot if v > 0))
print("\n64-instruction windows by samples:")
win = {}
for k, r in enumerate(body):
    win[k // 64] = win.get(k // 64, 0) + num(r[samp])
for w, v in sorted(win.items(), key=lambda x: -x[1])[:15]:
    b = body[w * 64]
    print(f"  window {w:4d} ({b[addr]}..) {v:7.0f} ({100 * v / max(total, 1):.1f}%)  first: {b[src][:60]}")
print("\ntop instructions:")
order = sorted(range(len(body)), key=lambda k: -num(body[k][samp]))[:40]
for k in sorted(order):
    r = body[k]
    st = ", ".join(f"{head[i]}={num(r[i]):.0f}" for i in stall_cols if num(r[i]) > 0)
    print(f"  [{k:5d}] {r[addr]} {num(r[samp]):6.0f}  {r[src][:70]:70s} {st[:200]}")
