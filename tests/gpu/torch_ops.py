"""quantshadow GPU verification 1 and 2: real PyTorch GEMMs under the shim.

    python3 tests/gpu/torch_ops.py OUT.json [--graph-replays N] [--seed S] [--graph-rows R] [--graph-kernels]

Runs a@b in bf16/fp16/fp32, F.linear with bias (cuBLASLt BIAS epilogue), bmm, and
torch._scaled_mm FP8 e4m3 with tensor-wise and row-wise scales, for M in {1, 55, 56, 57, 4096},
on seeded random data; then a decode-like loop captured with torch.cuda.graph and replayed
(R tokens per step, default 1; 16 or more reach the lean sketch kernel where graphs may take it,
QUANTSHADOW_SKETCH_LEAN=graphs).
Writes the SHA-256 of every output to OUT.json, so that a run under the shim can be compared
bit for bit with a run without it.
"""
import hashlib
import json
import sys

import torch
import torch.nn.functional as F


def digest(t):
    return hashlib.sha256(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def main():
    out_path = sys.argv[1]
    replays = 20
    if "--graph-replays" in sys.argv:
        replays = int(sys.argv[sys.argv.index("--graph-replays") + 1])
    seed = 1234
    if "--seed" in sys.argv:
        seed = int(sys.argv[sys.argv.index("--seed") + 1])
    graph_rows = 1
    if "--graph-rows" in sys.argv:
        graph_rows = int(sys.argv[sys.argv.index("--graph-rows") + 1])
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(seed)
    results = {}
    N, K = 1536, 1024

    def rand(*shape, dtype=torch.bfloat16):
        return (torch.randn(*shape, device=dev, generator=g) * 0.5).to(dtype)

    weights = {dt: rand(N, K, dtype=dt) for dt in (torch.bfloat16, torch.float16, torch.float32)}
    bias = rand(N)
    w_fp8 = (torch.randn(N, K, device=dev, generator=g) * 0.5).to(torch.float8_e4m3fn)
    scale_w = torch.tensor(0.75, device=dev)
    scale_w_rows = (torch.rand(1, N, device=dev, generator=g) + 0.5).float()
    for m in (1, 55, 56, 57, 4096):
        for dt, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16"), (torch.float32, "fp32")):
            x = rand(m, K, dtype=dt)
            results[f"matmul_{name}_m{m}"] = digest(x @ weights[dt].t())
        x = rand(m, K)
        results[f"linear_bias_bf16_m{m}"] = digest(F.linear(x, weights[torch.bfloat16], bias))
        xq = (torch.randn(m, K, device=dev, generator=g) * 0.5).to(torch.float8_e4m3fn)
        scale_x = torch.tensor(1.25, device=dev)
        try:
            y = torch._scaled_mm(xq, w_fp8.t(), scale_a=scale_x, scale_b=scale_w, out_dtype=torch.bfloat16)
            results[f"scaled_mm_tensorwise_m{m}"] = digest(y)
        except RuntimeError as e:
            results[f"scaled_mm_tensorwise_m{m}"] = f"unsupported: {str(e).splitlines()[0]}"
        scale_x_rows = (torch.rand(m, 1, device=dev, generator=g) + 0.5).float()
        try:
            y = torch._scaled_mm(xq, w_fp8.t(), scale_a=scale_x_rows, scale_b=scale_w_rows, out_dtype=torch.bfloat16)
            results[f"scaled_mm_rowwise_m{m}"] = digest(y)
        except RuntimeError as e:
            results[f"scaled_mm_rowwise_m{m}"] = f"unsupported: {str(e).splitlines()[0]}"
    # Activation scales made fresh for every call and freed at once, as a quantizing layer's are:
    # a check that read the scale late (a rows/full reference on the side stream) would find the
    # decoy allocated into its memory right after.
    xq = (torch.randn(57, K, device=dev, generator=g) * 0.5).to(torch.float8_e4m3fn)
    for i in range(6):
        s = torch.tensor(1.0 + 0.25 * i, device=dev)
        try:
            y = torch._scaled_mm(xq, w_fp8.t(), scale_a=s, scale_b=scale_w, out_dtype=torch.bfloat16)
        except RuntimeError as e:
            results[f"scaled_mm_fresh_scale_{i}"] = f"unsupported: {str(e).splitlines()[0]}"
            break
        del s
        decoy = torch.full((1,), 100.0, device=dev)
        results[f"scaled_mm_fresh_scale_{i}"] = digest(y)
        del decoy
    a, b = rand(8, 57, 256), rand(8, 256, 129)
    results["bmm_bf16"] = digest(torch.bmm(a, b))

    # A decode-like step captured once, replayed many times.
    layers = [rand(K, K) for _ in range(3)]
    static_x = rand(graph_rows, K)

    def step(x):
        for w in layers:
            x = torch.relu(x @ w.t())
        return x

    s = torch.cuda.Stream()

    def captured_replays(step_fn, static_in):
        """Eager warm-up (the shim sets its sites up outside the capture), one capture, then
        `replays` replays on fresh inputs; returns the graph and the digest of every output."""
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step_fn(static_in)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = step_fn(static_in)
        outs = []
        for _ in range(replays):
            static_in.copy_(rand(graph_rows, K))
            g.replay()
            outs.append(static_out.clone())
        torch.cuda.synchronize()
        return g, digest(torch.stack(outs))

    graph, results["graph_replays"] = captured_replays(step, static_x)

    # Work between the GEMMs of a captured step that writes a GEMM's rows in place: the shim's
    # snapshot copy of that GEMM must come before it, else the check would see the rows changed.
    w_a, w_b, w_c = rand(K, K), rand(K, K), rand(K, K)
    static_h = rand(graph_rows, K)

    def inplace_step(h):
        y = h @ w_a.t()
        y.mul_(1.5)  # the output of the GEMM just before
        z = h @ w_b.t()
        h.add_(0.125)  # the input of the GEMMs before
        u = torch.relu(z) * 0.5  # out of place: writes neither z nor h
        return y + u @ w_c.t()

    _, results["graph_inplace_replays"] = captured_replays(inplace_step, static_h)
    if "--graph-kernels" in sys.argv:
        # Which kernels one replay runs (CUPTI sees inside graphs): e.g. that a check took the
        # lean kernel. Printed only, not hashed.
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            graph.replay()
            torch.cuda.synchronize()
        names = sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})
        print("graph kernels: " + ", ".join(n[:60] for n in names))
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1, sort_keys=True)
    print(f"torch_ops: {len(results)} outputs hashed, {replays} graph replays")


if __name__ == "__main__":
    main()
