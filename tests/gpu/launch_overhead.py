"""Launch-interception overhead: a PyTorch workload dominated by many small non-GEMM kernels
(elementwise, norms, softmax on small tensors: thousands of cudaLaunchKernel calls per second,
where a per-launch cost would show), eager and replayed from a CUDA graph.

    python3 tests/gpu/launch_overhead.py [--shim PATH] [--rounds 3]

The parent runs itself as a child in each configuration, interleaved over rounds (machines
drift), and prints a markdown table of median iterations/s and the overhead against "plain":
- plain:            no LD_PRELOAD;
- observe:          LD_PRELOAD=libquantshadow.so, QUANTSHADOW_MODE=observe, no specs (every
                    launch goes through the interposer and is forwarded at once);
- observe+listing:  the same with QUANTSHADOW_KERNELS_OUT (a per-kernel table lookup and
                    counters on every launch).
Target: observe within 1% of plain. Each child also prints a checksum of its outputs, which
must be identical in every configuration. When Triton is importable, each child also launches a
small Triton kernel a few times outside the timed loops: Triton resolves cuLaunchKernelEx with
dlopen + dlsym(handle), so the listing must show it under that entry (the dlsym hook on a real
driver), with the parameter sizes cuFuncGetParamInfo reports; the PyTorch kernels appear under
cudaLaunchKernel (named through cudaGetFuncBySymbol + cuFuncGetName). The shim is found with --shim, $QUANTSHADOW_SHIM,
.gpu/main/libquantshadow.so or target/release/libquantshadow.so.
"""
import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def child():
    import torch

    torch.manual_seed(0)
    dev = "cuda"
    x0 = torch.randn(64, 1024, device=dev)
    w = torch.randn(1024, device=dev)
    b = torch.randn(1024, device=dev)

    def step(x):
        # ~20 small kernels, no GEMM.
        h = torch.nn.functional.layer_norm(x, (1024,), w, b)
        h = torch.nn.functional.gelu(h)
        h = h * 0.5 + x
        r = h.pow(2).mean(-1, keepdim=True).add(1e-6).rsqrt()
        h = h * r * w
        s = torch.softmax(h, dim=-1)
        h = h + s * 0.1
        h = torch.nn.functional.silu(h) * torch.sigmoid(h)
        return torch.tanh(h).clamp(-0.9, 0.9)

    def run_eager(iters):
        x = x0
        for _ in range(iters):
            x = step(x)
        return x

    def timed(fn, iters, trials=7):
        fn(20)
        torch.cuda.synchronize()
        rates = []
        for _ in range(trials):
            t0 = time.perf_counter()
            fn(iters)
            torch.cuda.synchronize()
            rates.append(iters / (time.perf_counter() - t0))
        return statistics.median(rates)

    triton_sum = "-"
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def qs_triton_axpy(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
                     mask=mask)

        tx, ty = x0.flatten(), torch.ones_like(x0).flatten()
        tout = torch.empty_like(tx)
        for _ in range(5):
            qs_triton_axpy[(triton.cdiv(tx.numel(), 1024),)](tx, ty, tout, tx.numel(), BLOCK=1024)
        torch.cuda.synchronize()
        triton_sum = hashlib.sha256(tout.cpu().numpy().tobytes()).hexdigest()[:16]
    except ImportError:
        pass

    eager = timed(run_eager, 300)
    checksum = hashlib.sha256(run_eager(50).cpu().numpy().tobytes()).hexdigest()[:16]

    static_x = x0.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            step(static_x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = static_x
        for _ in range(10):
            static_out = step(static_out)

    def run_graph(iters):
        for _ in range(iters // 10):
            g.replay()

    graph = timed(run_graph, 300)
    g.replay()
    torch.cuda.synchronize()
    graph_sum = hashlib.sha256(static_out.cpu().numpy().tobytes()).hexdigest()[:16]
    print(json.dumps({"eager_it_s": eager, "graph_it_s": graph, "checksum": checksum + "/" + triton_sum,
                      "graph_checksum": graph_sum}))


def find_shim(explicit):
    for p in [explicit, os.environ.get("QUANTSHADOW_SHIM"), ".gpu/main/libquantshadow.so",
              "target/release/libquantshadow.so"]:
        if p and os.path.isfile(p):
            return os.path.abspath(p)
    sys.exit("libquantshadow.so not found: pass --shim PATH")


def parent(args):
    shim = find_shim(args.shim)
    tmp = tempfile.mkdtemp(prefix="qs-launch-")
    base = {k: v for k, v in os.environ.items() if not k.startswith("QUANTSHADOW_") and k != "LD_PRELOAD"}
    configs = {
        "plain": {},
        "observe": {"LD_PRELOAD": shim, "QUANTSHADOW_MODE": "observe"},
        "observe+listing": {"LD_PRELOAD": shim, "QUANTSHADOW_MODE": "observe",
                            "QUANTSHADOW_KERNELS_OUT": os.path.join(tmp, "kernels-{pid}.json")},
    }
    results = {name: [] for name in configs}
    for _ in range(args.rounds):
        for name, extra in configs.items():
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child"], env={**base, **extra},
                                 capture_output=True, text=True)
            if out.returncode != 0:
                sys.exit(f"{name} failed ({out.returncode}):\n{out.stdout}\n{out.stderr}")
            results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    plain = {k: statistics.median(r[k] for r in results["plain"]) for k in ("eager_it_s", "graph_it_s")}
    sums = {r["checksum"] + "/" + r["graph_checksum"] for rs in results.values() for r in rs}
    print(f"| configuration | eager it/s | overhead | graph it/s | overhead |")
    print(f"|---|---:|---:|---:|---:|")
    for name, rs in results.items():
        e = statistics.median(r["eager_it_s"] for r in rs)
        g = statistics.median(r["graph_it_s"] for r in rs)
        oe = (plain["eager_it_s"] / e - 1) * 100
        og = (plain["graph_it_s"] / g - 1) * 100
        print(f"| {name} | {e:,.0f} | {oe:+.2f}% | {g:,.0f} | {og:+.2f}% |")
    print()
    print(f"outputs identical in every configuration: {'yes' if len(sums) == 1 else 'NO ' + str(sums)}")
    listings = [f for f in os.listdir(tmp) if f.endswith(".json")]
    if listings:
        with open(os.path.join(tmp, listings[0])) as fh:
            kernels = json.load(fh)["kernels"]
        print(f"kernel listing: {len(kernels)} kernels, {sum(k['calls'] for k in kernels)} launches")
        print()
        print("| entry | kernels | launches | named | with parameter sizes |")
        print("|---|---:|---:|---:|---:|")
        for entry in sorted({k["entry"] for k in kernels}):
            ks = [k for k in kernels if k["entry"] == entry]
            print(f"| {entry} | {len(ks)} | {sum(k['calls'] for k in ks)} | "
                  f"{sum(not k['name'].startswith('(') for k in ks)} | {sum(k['param_sizes'] is not None for k in ks)} |")
        print()
        for k in kernels[:5] + [k for k in kernels if "qs_triton" in k["name"]]:
            print(f"- `{k['name'][:90]}` via {k['entry']}: {k['calls']} calls, grid {k['grid']}, block {k['block']}, "
                  f"params {k['param_sizes']}")
    else:
        print("kernel listing: NOT WRITTEN")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--shim")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    child() if args.child else parent(args)


if __name__ == "__main__":
    main()
