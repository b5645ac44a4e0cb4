"""Per-shape GEMM time, for the shim's overhead: run it plain and under LD_PRELOAD=libquantshadow.so
(tests/gpu/verify_shim.sh gemm does both and tests/gpu/overhead_table.py compares the runs).

    python3 tests/gpu/overhead_gemm.py [--quick] [--only SUBSTR]

Cases: bf16 F.linear(a, w) and FP8 e4m3 torch._scaled_mm tensor-wise (scales 1, bf16 out), built
as in bench_torch.py, for N x K in 4096x4096, 14336x4096, 4096x14336, 128256x4096 and M in 1, 16,
256, 4096 (seeded random data). Method: 10 warm-up calls (the shim sets a site up during its
first calls), then CUDA events around `reps` back-to-back calls of the same GEMM (20; 5 for
4096x128256x4096), median of 5 trials. Prints one JSON line per case:
{"op": "bf16"|"fp8", "m": M, "n": N, "k": K, "us": microseconds per call}.
--only keeps the cases whose name "OP MxNxK" (e.g. "fp8 16x14336x4096") contains SUBSTR;
--quick keeps M in 1, 4096 and the first two shapes; --m 512,4096 and --shapes 3 pick M values
and the first N shapes.
"""
import argparse
import json
import statistics
import sys

import torch

SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096)]  # (N, K)
MS = [1, 16, 256, 4096]


def time_us(fn, reps, trials=5, warmup=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(samples)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", default="", help='keep cases whose name "OP MxNxK" contains this')
    p.add_argument("--quick", action="store_true", help="M in 1, 4096 and the first two shapes")
    p.add_argument("--m", default="", help="comma-separated M values instead of the default set")
    p.add_argument("--shapes", type=int, default=0, help="only the first N (N, K) shapes")
    args = p.parse_args()
    shapes, ms = (SHAPES[:2], [1, 4096]) if args.quick else (SHAPES, MS)
    if args.m:
        ms = [int(x) for x in args.m.split(",")]
    if args.shapes:
        shapes = SHAPES[: args.shapes]

    torch.manual_seed(0)
    dev = "cuda"
    one = torch.ones((), device=dev)
    print(f"GPU: {torch.cuda.get_device_name()} torch {torch.__version__} cuda {torch.version.cuda}", file=sys.stderr)
    # Weights stay allocated for the whole run, as a model's do: a weight freed and another
    # allocated at the same address would read to the shim as a weight changed in place (it
    # re-projects, and after a few changes checks that site in rows mode).
    weights = []
    for n, k in shapes:
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        w8 = w.to(torch.float8_e4m3fn)
        weights.append((w, w8))
        for m in ms:
            wanted = [op for op in ("bf16", "fp8") if args.only in f"{op} {m}x{n}x{k}"]
            if not wanted:
                continue
            reps = 5 if (m, n, k) == (4096, 128256, 4096) else 20
            a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            a8 = a.to(torch.float8_e4m3fn)
            fns = {
                "bf16": lambda: torch.nn.functional.linear(a, w),
                "fp8": lambda: torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16),
            }
            for op in wanted:
                us = time_us(fns[op], reps)
                print(json.dumps({"op": op, "m": m, "n": n, "k": k, "us": round(us, 2)}))
            del a, a8, fns

if __name__ == "__main__":
    main()
