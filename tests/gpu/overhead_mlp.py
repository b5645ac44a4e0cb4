"""GPU-bound overhead probe: a stack of bf16 linear layers (Llama-8B-like 4096 x 4096 and
4096 x 14336 projections), timed with CUDA events.

    python3 tests/gpu/overhead_mlp.py [--repeat N] [--fp8]

--repeat N stacks N copies of the six layers, each with its own weights (a deeper decode graph:
per-replay costs such as the last check's latency are shared by more GEMMs, as in a real model's
step). Prints one JSON line: microseconds per forward pass for prefill (M=512, eager), decode (M=1,
eager) and decode replayed from a CUDA graph. Run it with and without the shim (and with its
modes) to get the overhead; the numbers are medians of 7 trials of 50 passes each.
--fp8: the same stack in e4m3fn, each layer a cast of its input and torch._scaled_mm with
tensor-wise scales held in device tensors (as FP8 serving passes them), bf16 out.
"""
import json
import statistics
import sys

import torch


def make_layers(repeat=1, fp8=False):
    """The layers, seeded; returns forward(x)."""
    torch.manual_seed(0)
    dev = "cuda"
    shapes = ([(4096, 4096)] * 4 + [(14336, 4096), (4096, 14336)]) * repeat  # (out, in), chained
    weights = [(torch.randn(n, k, device=dev) * 0.02).to(torch.bfloat16) for n, k in shapes]
    if fp8:
        # Unit gain per layer (std 1/sqrt(in)), so that 48 layers stay inside e4m3's range; x32 in
        # storage, undone by the weight's scale.
        f8 = torch.float8_e4m3fn
        weights = [(torch.randn(n, k, device=dev) * (32 / k**0.5)).to(f8) for n, k in shapes]
        scale_a, scale_b = torch.ones((), device=dev), torch.full((), 1 / 32, device=dev)

        def forward8(x):
            h = x
            for w in weights:
                h = torch._scaled_mm(h.to(f8), w.t(), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)
            return h

        return forward8

    def forward(x):
        h = x
        for w in weights:
            h = h @ w.t()
        return h

    return forward


def timed(fn, passes=50, trials=7):
    """Microseconds per call of fn: median of `trials` event-timed runs of `passes` calls."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(trials):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(passes):
            fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e3 / passes)
    return statistics.median(out)


def capture_decode(forward, xd):
    """The decode step captured as PyTorch does it: warm-up on a side stream, then the graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            forward(xd)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        forward(xd)
    return g


def main():
    dev = "cuda"
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 1
    forward = make_layers(repeat, fp8="--fp8" in sys.argv)
    xp = torch.randn(512, 4096, device=dev).to(torch.bfloat16)
    xd = torch.randn(1, 4096, device=dev).to(torch.bfloat16)
    result = {"prefill_us": timed(lambda: forward(xp)), "decode_eager_us": timed(lambda: forward(xd))}
    g = capture_decode(forward, xd)
    result["decode_graph_us"] = timed(g.replay)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
