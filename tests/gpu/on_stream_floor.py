"""What any on-stream snapshot costs behind one GEMM called back to back, without the shim:
the floor under issue 3's "check <= 5% of the GEMM" for a check that must read the sampled rows
of A and D before the caller's next kernel may overwrite them.

    python3 tests/gpu/on_stream_floor.py OP:M:N:K [--rows 256] [--trials 11] [--passes 50]

OP bf16 (F.linear) or fp8 (torch._scaled_mm tensor-wise, bf16 out), as in ab_pause.py. Each
trial times `passes` back-to-back calls with CUDA events; the variants alternate within a trial
round (in an order rotated each round), and each ratio is the median over trials of
(variant / GEMM alone) in that round. Nothing pre-fills the queue: the figures are the GPU's
only while the GEMM outlasts the host's launches (the 4096-row GEMMs measured so far); the
projection needs rows a multiple of 16, and K / 8 and N / 8 multiples of 64. Variants:
  empty       GEMM, then an empty Triton kernel (one launch: the node floor)
  index_sel   GEMM, then torch.index_select of the sampled rows of A and of D (two kernels)
  gather      GEMM, then one Triton kernel copying the sampled rows of A and D (3 MB at 4096^2)
  project     GEMM, then one Triton kernel projecting the sampled rows (A W_R and D R, 16
              probes, 8 K/N splits per 16-row group) into partial sums: the split check's
              on-stream half, written plainly
"""
import argparse
import statistics
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def empty_kernel(x):
    pass


@triton.jit
def gather_kernel(a, d, idx, a_out, d_out, A_WORDS: tl.constexpr, D_WORDS: tl.constexpr):
    t = tl.program_id(0)
    row = tl.load(idx + t).to(tl.int64)
    for c in range(0, A_WORDS, 1024):
        o = c + tl.arange(0, 1024)
        tl.store(a_out + t * A_WORDS + o, tl.load(a + row * A_WORDS + o, mask=o < A_WORDS), mask=o < A_WORDS)
    for c in range(0, D_WORDS, 1024):
        o = c + tl.arange(0, 1024)
        tl.store(d_out + t * D_WORDS + o, tl.load(d + row * D_WORDS + o, mask=o < D_WORDS), mask=o < D_WORDS)


@triton.jit
def project_kernel(a, d, idx, wr, r, out, K: tl.constexpr, N: tl.constexpr, KS: tl.constexpr, NS: tl.constexpr,
                   P: tl.constexpr, CH: tl.constexpr):
    g = tl.program_id(0)
    s = tl.program_id(1)
    rows = tl.load(idx + g * 16 + tl.arange(0, 16)).to(tl.int64)
    acc_a = tl.zeros((16, P), dtype=tl.float32)
    for c in range(s * KS, s * KS + KS, CH):
        kk = c + tl.arange(0, CH)
        av = tl.load(a + rows[:, None] * K + kk[None, :]).to(tl.bfloat16)
        wv = tl.load(wr + kk[:, None] * P + tl.arange(0, P)[None, :])
        acc_a += tl.dot(av, wv)
    acc_d = tl.zeros((16, P), dtype=tl.float32)
    for c in range(s * NS, s * NS + NS, CH):
        nn = c + tl.arange(0, CH)
        dv = tl.load(d + rows[:, None] * N + nn[None, :])
        rv = tl.load(r + nn[:, None] * P + tl.arange(0, P)[None, :])
        acc_d += tl.dot(dv, rv)
    base = out + (g * tl.num_programs(1) + s) * 2 * 16 * P
    o = tl.arange(0, 16)[:, None] * P + tl.arange(0, P)[None, :]
    tl.store(base + o, acc_a)
    tl.store(base + 16 * P + o, acc_d)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("gemm")
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--trials", type=int, default=11)
    p.add_argument("--passes", type=int, default=50)
    a = p.parse_args()
    op, m, n, k = a.gemm.split(":")
    m, n, k = int(m), int(n), int(k)
    torch.manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    if op == "fp8":
        x8, w8, one = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn), torch.ones((), device="cuda")
        xa = x8

        def gemm():
            return torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    else:
        xa = x

        def gemm():
            return torch.nn.functional.linear(x, w)
    rows = min(a.rows, m)
    splits, chunk = 8, 64
    if rows % 16 or (k // splits) % chunk or (n // splits) % chunk or k % splits or n % splits:
        sys.exit(f"on_stream_floor: {rows} rows, K {k}, N {n}: rows must be a multiple of 16 and K / 8, N / 8 of {chunk}")
    idx = torch.randperm(m, device="cuda")[:rows].sort().values.to(torch.int32)
    a_bytes, d_bytes = k * xa.element_size(), n * 2
    a_words, d_words = a_bytes // 4, d_bytes // 4
    a_out = torch.empty(rows * a_words, device="cuda", dtype=torch.int32)
    d_out = torch.empty(rows * d_words, device="cuda", dtype=torch.int32)
    probes = 16
    wr = torch.randn(k, probes, device="cuda", dtype=torch.bfloat16)
    rr = torch.randn(n, probes, device="cuda", dtype=torch.bfloat16)
    part = torch.empty((rows // 16) * splits * 2 * 16 * probes, device="cuda", dtype=torch.float32)
    xa_words = xa.view(torch.uint8).view(torch.int32) if op == "fp8" else xa.view(torch.int32)
    xa_bytes = xa.view(torch.uint8) if op == "fp8" else xa
    dummy = torch.empty(1, device="cuda")

    variants = {
        "gemm": lambda: gemm(),
        "empty": lambda: (gemm(), empty_kernel[(1,)](dummy)),
        "index_sel": lambda: (lambda out: (xa_bytes.index_select(0, idx), out.index_select(0, idx)))(gemm()),
        "gather": lambda: (lambda out: gather_kernel[(rows,)](xa_words, out.view(torch.int32), idx, a_out, d_out,
                                                              A_WORDS=a_words, D_WORDS=d_words))(gemm()),
        "project": lambda: (lambda out: project_kernel[(rows // 16, splits)](
            xa, out, idx, wr, rr, part, K=k, N=n, KS=k // splits, NS=n // splits,
            P=probes, CH=chunk))(gemm()),
    }
    # Correctness of the plain kernels (a floor for a wrong kernel means nothing).
    out = gemm()
    gather_kernel[(rows,)](xa_words, out.view(torch.int32), idx, a_out, d_out, A_WORDS=a_words, D_WORDS=d_words)
    assert torch.equal(a_out.view(torch.uint8).view(rows, a_bytes), xa.view(torch.uint8)[idx.long()].reshape(rows, a_bytes))
    assert torch.equal(d_out.view(torch.bfloat16).view(rows, n), out[idx.long()])
    project_kernel[(rows // 16, splits)](xa, out, idx, wr, rr, part, K=k, N=n, KS=k // splits, NS=n // splits, P=probes,
                                         CH=chunk)
    got = part.view(rows // 16, splits, 2, 16, probes).sum(1)
    # Rows gathered as bytes: fp8 indexing is not in every PyTorch build.
    a_rows = xa.view(torch.uint8)[idx.long()].view(xa.dtype) if op == "fp8" else xa[idx.long()]
    want_a = a_rows.to(torch.float32) @ wr.float()
    want_d = out[idx.long()].float() @ rr.float()
    for name, g_, w_ in (("A W_R", got[:, 0].reshape(rows, probes), want_a), ("D R", got[:, 1].reshape(rows, probes), want_d)):
        rel = ((g_ - w_).norm() / w_.norm()).item()
        assert rel < 1e-2, f"{name}: relative error {rel}"
    torch.cuda.synchronize()

    def trial(run):
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(a.passes):
            run()
        e.record()
        torch.cuda.synchronize()
        return s.elapsed_time(e) * 1000.0 / a.passes

    for run in variants.values():
        for _ in range(3):
            trial(run)
    times = {name: [] for name in variants}
    names = list(variants)
    for r in range(a.trials):
        # Rotated each round: a drift within a round does not favour the same variant each time.
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(trial(variants[name]))
    base = statistics.median(times["gemm"])
    print(f"== {op} {m}x{n}x{k}, {rows} sampled rows ({rows * (a_bytes + d_bytes) / 1e6:.2f} MB of A and D rows), "
          f"{a.trials} trials x {a.passes} calls; GEMM alone {base:.2f} us per call")
    for name in variants:
        if name == "gemm":
            continue
        ratios = [t / g - 1.0 for t, g in zip(times[name], times["gemm"])]
        print(f"   {name:10s} {statistics.median(times[name]):8.2f} us per call  "
              f"+{statistics.median(times[name]) - base:6.2f} us  ratio {100 * statistics.median(ratios):+6.2f}%")


if __name__ == "__main__":
    main()
