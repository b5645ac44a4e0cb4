"""Markdown table of the per-call cost of sketch checks behind real GEMMs, from a log of
`docs/measurements/raw/2026-11-26-h100-early-start/exp42.sh` (or any log with its line format).

    python3 tests/gpu/early_table.py LOG

Reads lines "r<round> <config> {json}" where the JSON is a line of tests/gpu/overhead_gemm.py
({"op", "m", "n", "k", "us"}) and <config> is plain, stream_early, stream_order, detach_early or
detach_order. Prints, per case, the median over rounds of the plain time per call and, for each
configuration, the time it adds per call (us) and that as % of plain: issue 3's ratio measured
behind cuBLAS in one process. Detached configurations skip the calls whose snapshot buffers are
still in use (counted by the shim), so at M = 4096 they check only a share of the calls. Lines that do not parse are skipped; a missing case prints "-".
Exit status 2 when the log holds no plain result (nothing to compare against).
"""
import json
import re
import statistics
import sys

CFGS = ["plain", "stream_order", "stream_early", "detach_order", "detach_early"]
LINE = re.compile(r"^r(\d+) (\w+) (\{.*\})\s*$")


def load(lines):
    """{cfg: {(op, m, n, k): [us per round]}}."""
    times = {c: {} for c in CFGS}
    for line in lines:
        match = LINE.match(line)
        if not match or match[2] not in times:
            continue
        try:
            r = json.loads(match[3])
            key, us = (str(r["op"]), int(r["m"]), int(r["n"]), int(r["k"])), float(r["us"])
            times[match[2]].setdefault(key, []).append(us)
        except (ValueError, KeyError, TypeError):
            continue
    return times


def table(times):
    out = ["| op | M | N x K | plain, us | " + " | ".join(f"{c}: +us (%)" for c in CFGS[1:]) + " |",
           "| --- | --- | --- | --- | " + " | ".join("---" for _ in CFGS[1:]) + " |"]
    for key in sorted(times["plain"], key=lambda k: (k[0], k[1], k[2], k[3])):
        op, m, n, k = key
        plain = statistics.median(times["plain"][key])
        cells = []
        for c in CFGS[1:]:
            if key in times[c]:
                added = statistics.median(times[c][key]) - plain
                cells.append(f"{added:+.1f} ({100 * added / plain:+.1f}%)")
            else:
                cells.append("-")
        out.append(f"| {op} | {m} | {n}x{k} | {plain:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1], errors="replace") as f:
        times = load(f)
    if not times["plain"]:
        print("early_table: no plain results in the log", file=sys.stderr)
        sys.exit(2)
    print(table(times))


if __name__ == "__main__":
    main()
