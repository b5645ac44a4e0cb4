"""Kernel timeline of one GEMM called back to back (eager), paused and checking in one process:
what the shim adds on the caller's stream per call, kernel by kernel.

    LD_PRELOAD=.../libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \\
        python3 tests/gpu/eager_profile.py OP:M:N:K [--calls 12]
    python3 tests/gpu/eager_profile.py --llama SIZE [--prompt 1024] [--calls 2]

OP bf16 (F.linear) or fp8 (torch._scaled_mm tensor-wise, scales 1, bf16 out). Warms up both
sides, then profiles `calls` calls paused and `calls` checking (PyTorch's profiler, CUPTI) and
prints, per side, the mean duration of each kernel name per call, the mean gap between
consecutive kernels, and the mean time from one GEMM kernel's start to the next one's.
--llama profiles `calls` prefills of torch_llama.py's model instead (ab_pause.py's workload) and
prints, per side and per prefill: the span from the first GPU operation to the last, the busy
time and idle time of the caller's stream, and the shim's kernels per stream.
"""
import argparse
import collections
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("QUANTSHADOW_COMPILE", "sync")
from ab_pause import shim_pause, workload  # noqa: E402
from graph_profile import gpu_events  # noqa: E402


def busy_us(events):
    """Time covered by at least one of `events` (overlaps counted once)."""
    total, end = 0.0, None
    for e in sorted(events, key=lambda e: e["ts"]):
        s, f = e["ts"], e["ts"] + e["dur"]
        if end is None or s > end:
            total += f - s
            end = f
        elif f > end:
            total += f - end
            end = f
    return total


def profiled_sides(fn, pause, calls, warm):
    """Warms both sides up (`warm` runs each, twice), then yields (side, GPU operations) for
    `calls` runs of `fn` paused and `calls` checking, each under PyTorch's profiler."""
    for on in (1, 0, 1, 0):
        pause(on)
        for _ in range(warm):
            fn()
    torch.cuda.synchronize()
    for side, on in (("paused", 1), ("checking", 0)):
        pause(on)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        yield side, gpu_events(prof)


def llama_profile(a, pause):
    _, fn = workload(argparse.Namespace(llama=a.llama, gemm=None, prompt=a.prompt))
    for side, ev in profiled_sides(fn, pause, a.calls, 1):
        span = ev[-1]["ts"] + ev[-1]["dur"] - ev[0]["ts"]
        # The caller's stream: the one with the most non-shim operations.
        streams = collections.Counter(e.get("tid") for e in ev if not e["name"].startswith("qs_"))
        main_tid = streams.most_common(1)[0][0]
        on_main = [e for e in ev if e.get("tid") == main_tid]
        busy = busy_us(on_main)
        print(f"== llama {a.llama} prefill {a.prompt} {side}: per prefill span {span / a.calls:.1f} us, caller's stream "
              f"busy {busy / a.calls:.1f} us, idle {(span - busy) / a.calls:.1f} us, {len(on_main) / a.calls:.0f} operations")
        prod = [e for e in on_main if not e["name"].startswith("qs_")]
        print(f"   production kernels {sum(e['dur'] for e in prod) / a.calls:.1f} us per prefill")
        by = collections.defaultdict(list)
        for e in ev:
            if e["name"].startswith("qs_"):
                by[(e["name"][:48], "caller" if e.get("tid") == main_tid else "side")].append(e["dur"])
        for (name, where), d in sorted(by.items(), key=lambda kv: -sum(kv[1])):
            print(f"   {len(d) / a.calls:5.1f}/prefill  {sum(d) / a.calls:8.1f} us  mean {statistics.mean(d):6.2f}  {where:6s} {name}")
    pause(0)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("gemm", nargs="?")
    p.add_argument("--calls", type=int, default=None, help="GEMM calls (12) or prefills (2) per side")
    p.add_argument("--llama", help="profile torch_llama.py's prefill (small, 8b-width) instead of one GEMM")
    p.add_argument("--prompt", type=int, default=1024)
    a = p.parse_args()
    if bool(a.llama) == bool(a.gemm):
        sys.exit("eager_profile: give exactly one of OP:M:N:K and --llama")
    pause = shim_pause()
    if pause is None:
        sys.exit("eager_profile: run under the shim")
    if a.llama:
        a.calls = a.calls or 2
        return llama_profile(a, pause)
    a.calls = a.calls or 12
    _, fn = workload(argparse.Namespace(llama=None, gemm=a.gemm))  # ab_pause.py's GEMM, same seed
    for side, ev in profiled_sides(fn, pause, a.calls, 10):
        by = collections.defaultdict(list)
        for e in ev:
            by[e["name"][:70]].append(e["dur"])
        gaps = [ev[i]["ts"] - (ev[i - 1]["ts"] + ev[i - 1]["dur"]) for i in range(1, len(ev))]
        # The production GEMM's kernel: the longest one that is not the shim's.
        prod = max((e for e in ev if not e["name"].startswith("qs_")), key=lambda e: e["dur"])["name"]
        gemm_starts = [e["ts"] for e in ev if e["name"] == prod]
        period = statistics.median([b - a_ for a_, b in zip(gemm_starts, gemm_starts[1:])]) if len(gemm_starts) > 1 else 0
        print(f"== {a.gemm} {side}: {len(ev)} GPU operations for {a.calls} calls; median GEMM-start period {period:.2f} us; "
              f"median gap between operations {statistics.median(gaps) if gaps else 0:.2f} us")
        for name, d in sorted(by.items(), key=lambda kv: -sum(kv[1])):
            print(f"   {len(d) / a.calls:.2f}/call  mean {statistics.mean(d):7.2f} us  {name}")
        if side == "checking":
            t0 = ev[len(ev) // 2]["ts"]
            for e in ev[len(ev) // 2: len(ev) // 2 + 8]:
                print(f"   t+{e['ts'] - t0:8.2f} dur {e['dur']:7.2f} stream {e.get('tid')} {e['name'][:60]}")
    pause(0)


if __name__ == "__main__":
    main()
