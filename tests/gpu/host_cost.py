"""Host time per GEMM call, with and without the shim: the time Python takes to enqueue `--calls`
calls while a spin kernel holds the GPU (nothing the calls enqueue can run, so the loop measures
the CPU only: PyTorch, cuBLAS, the shim and the driver), and the time per call of the same loop
running freely (events around it, so the slower of CPU and GPU sets it).

    [LD_PRELOAD=.../libquantshadow.so QUANTSHADOW_MODE=...] \\
        python3 tests/gpu/host_cost.py LABEL --gemm OP:M:N:K [--calls 100] [--trials 9]

OP bf16 = F.linear, fp8 = torch._scaled_mm tensor-wise (scales 1, bf16 out). Prints one JSON
line {"label", "workload", "held_us", "free_us"}: medians per call over the trials.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F


def gemm(spec):
    op, m, n, k = spec.split(":")
    m, n, k = int(m), int(n), int(k)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) / k**0.5
    if op == "bf16":
        return lambda: F.linear(x, w)
    if op == "fp8":
        xa, wa = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        return lambda: torch._scaled_mm(xa, wa.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    raise SystemExit(f"unknown op {op!r} (bf16 or fp8)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("label")
    ap.add_argument("--gemm", required=True)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--trials", type=int, default=9)
    args = ap.parse_args()
    call = gemm(args.gemm)
    for _ in range(30):
        call()
    torch.cuda.synchronize()
    held, free = [], []
    for _ in range(args.trials):
        # ~50 ms of spinning: longer than enqueueing the calls, so none of them starts.
        torch.cuda._sleep(100_000_000)
        t0 = time.perf_counter()
        for _ in range(args.calls):
            call()
        held.append((time.perf_counter() - t0) / args.calls * 1e6)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.calls):
            call()
        end.record()
        torch.cuda.synchronize()
        free.append(start.elapsed_time(end) * 1e3 / args.calls)
    print(json.dumps({
        "label": args.label,
        "workload": args.gemm,
        "held_us": round(statistics.median(held), 2),
        "free_us": round(statistics.median(free), 2),
    }))


if __name__ == "__main__":
    main()
