"""Markdown table of the shim's per-shape GEMM overhead from `verify_shim.sh gemm`.

    python3 tests/gpu/overhead_table.py DIR

Reads DIR/gemm_{plain,detach_off,detach_on}_r<round>.jsonl (lines of tests/gpu/overhead_gemm.py)
and prints, per case, the median over the rounds of the time per call of the plain run and of the
sketch check with QUANTSHADOW_SKETCH_DETACH=off (check on the production stream) and =on
(snapshot on the production stream, check off it), with the overhead in % of plain, and the
goal for that M (<= 5% for M >= 512, <= 100% for M <= 16). A missing case prints "-".
"""
import json
import re
import statistics
import sys
from pathlib import Path

CFGS = ["plain", "detach_off", "detach_on"]


def load(d):
    """{cfg: {(op, m, n, k): [us per round]}}, and the rounds found per cfg."""
    times = {c: {} for c in CFGS}
    rounds = {c: 0 for c in CFGS}
    for f in sorted(Path(d).glob("gemm_*_r*.jsonl")):
        match = re.fullmatch(r"gemm_(\w+?)_r(\d+)\.jsonl", f.name)
        if not match or match[1] not in times:
            continue
        rounds[match[1]] += 1
        for line in f.read_text().splitlines():
            try:
                r = json.loads(line)
                times[match[1]].setdefault((r["op"], r["m"], r["n"], r["k"]), []).append(float(r["us"]))
            except (ValueError, KeyError, TypeError):
                continue  # not a result line
    return times, rounds


def goal(m):
    return "<= 5%" if m >= 512 else "<= 100%" if m <= 16 else "-"


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    times, rounds = load(sys.argv[1])
    med = {c: {case: statistics.median(v) for case, v in t.items()} for c, t in times.items()}
    cases = sorted(set().union(*med.values()))
    print("| op | M | N x K | plain us | detach=off us | off % | detach=on us | on % | goal |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for case in cases:
        op, m, n, k = case
        plain = med["plain"].get(case)
        cells = ["-" if plain is None else f"{plain:.1f}"]
        for c in CFGS[1:]:
            t = med[c].get(case)
            cells.append("-" if t is None else f"{t:.1f}")
            cells.append("-" if t is None or not plain else f"{(t - plain) / plain * 100:+.1f}%")
        print(f"| {op} | {m} | {n}x{k} | " + " | ".join(cells) + f" | {goal(m)} |")
    print("\nRounds: " + ", ".join(f"{c} {rounds[c]}" for c in CFGS) + " (median over the rounds).")


if __name__ == "__main__":
    main()
