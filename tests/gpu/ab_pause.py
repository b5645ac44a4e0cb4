"""In-process A/B timing of the shim: alternates trials with checking paused and on, through the
shim's `quantshadow_pause` export, so both sides share one process, one cuBLAS heuristic, one
allocator state and the same moment of the machine (separate processes of one configuration
differed by up to 25% in Llama prefill, docs/measurements/2026-11-26-h100-early-start.md).

    LD_PRELOAD=.../libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \\
        python3 tests/gpu/ab_pause.py LABEL (--llama SIZE [--prompt N] | --gemm OP:M:N:K) [--trials 15] [--passes 20]

Workloads: the prefill of torch_llama.py's model (seeded random weights, prompt of N tokens,
default 1024, no KV cache), or one GEMM repeated (OP bf16 = F.linear, fp8 = torch._scaled_mm
tensor-wise, scales 1, bf16 out). A trial is `passes` back-to-back passes from a CUDA event to
one recorded after a device-wide sync (so the detached checks still running on the shim's side
stream count in their trial); paused and checking trials alternate, paused first. Prints one JSON line:
{"label", "workload", "paused_us", "checking_us", "ratio", "ci95", "pair_median", "ratios"}:
medians per pass of each side, their ratio, a 95% bootstrap interval of that ratio (pairs
resampled, 2000 draws, seeded), the median of the pairs' ratios, and the ratio of each adjacent
(paused, checking) pair (its spread says how far to trust the median). The host's speed drifts
within a process (pairs of one process ranged 0.4-1.9 at 20 passes a trial): many short trials
(`--trials 200 --passes 2`) resolve a few percent where a few long ones cannot. Paused, the shim still intercepts every call and forwards it at once:
"paused" is the plain process plus the interposer's per-call cost (<= 100 ns, issue 4).
Exit status 2 without the shim (nothing to pause).
"""
import argparse
import ctypes
import json
import os
import random
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Kernels compiled in the warm-up's first checked call, not skipped while a background compile
# runs (the shim reads its environment at the first intercepted call, after this line).
os.environ.setdefault("QUANTSHADOW_COMPILE", "sync")


def shim_pause():
    """The shim's quantshadow_pause(int) -> int, or None when the shim is not loaded."""
    try:
        fn = ctypes.CDLL(None).quantshadow_pause
    except AttributeError:
        return None
    fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
    return fn


def workload(args):
    if args.llama:
        from torch_llama import build_model

        model = build_model(args.llama)
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, model.config.vocab_size, (1, args.prompt), generator=g).cuda()

        def run():
            with torch.no_grad():
                model(input_ids=ids, use_cache=False)

        return f"llama {args.llama} prefill {args.prompt}", run
    op, m, n, k = args.gemm.split(":")
    m, n, k = int(m), int(n), int(k)
    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    if op == "bf16":
        return f"bf16 {m}x{n}x{k}", lambda: torch.nn.functional.linear(a, w)
    if op == "fp8":
        a8, w8, one = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn), torch.ones((), device="cuda")
        return f"fp8 {m}x{n}x{k}", lambda: torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    sys.exit(f"ab_pause: unknown op {op!r} in --gemm (bf16 or fp8)")


def trial_us(run, passes):
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(passes):
        run()
    # The end after a device-wide sync: detached checks still running on the shim's side stream
    # belong to this trial (both sides pay the same sync).
    torch.cuda.synchronize()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / passes


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("label")
    p.add_argument("--llama", help="torch_llama.py model size (small, 8b-width)")
    p.add_argument("--prompt", type=int, default=1024)
    p.add_argument("--gemm", help="OP:M:N:K, OP bf16 or fp8")
    p.add_argument("--trials", type=int, default=15, help="trials per side")
    p.add_argument("--passes", type=int, default=20, help="passes per trial")
    args = p.parse_args()
    if bool(args.llama) == bool(args.gemm):
        sys.exit("ab_pause: give exactly one of --llama and --gemm")
    pause = shim_pause()
    if pause is None:
        print("ab_pause: quantshadow_pause not found: run under LD_PRELOAD=libquantshadow.so", file=sys.stderr)
        sys.exit(2)
    name, run = workload(args)
    for on in (1, 0):  # warm-up on both sides: kernels compiled, sites set up, W_R projected
        pause(on)
        trial_us(run, max(2, args.passes // 4))
    paused, checking = [], []
    for _ in range(args.trials):
        pause(1)
        paused.append(trial_us(run, args.passes))
        pause(0)
        checking.append(trial_us(run, args.passes))
    pause(0)
    pm, cm = statistics.median(paused), statistics.median(checking)
    ratios = [c / q for q, c in zip(paused, checking)]
    print(json.dumps({
        "label": args.label, "workload": name, "paused_us": round(pm, 2), "checking_us": round(cm, 2),
        "ratio": round(cm / pm, 4), "ci95": [round(x, 4) for x in bootstrap_ratio(paused, checking)],
        "pair_median": round(statistics.median(ratios), 4), "trials": args.trials, "passes": args.passes,
        "ratios": [round(r, 3) for r in ratios],
    }))


def bootstrap_ratio(paused, checking, draws=2000):
    """95% interval of median(checking) / median(paused) over pairs drawn with replacement."""
    rng = random.Random(12345)
    n = len(paused)
    out = []
    for _ in range(draws):
        idx = [rng.randrange(n) for _ in range(n)]
        out.append(statistics.median(checking[i] for i in idx) / statistics.median(paused[i] for i in idx))
    out.sort()
    return out[int(0.025 * draws)], out[int(0.975 * draws) - 1]


if __name__ == "__main__":
    main()
