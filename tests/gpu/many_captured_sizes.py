"""A layer's projections captured in CUDA graphs at many batch sizes, as vLLM captures them
(session 31: once the shim's pool is three quarters full, a new batch size gets only its
gates, and its captured checks share their capturing stream's scratch instead of being
skipped for want of ~1.5 MB per site and size).

    python3 tests/gpu/many_captured_sizes.py OUT.json [--sizes N] [--replays R]

Seven bf16 linears of a Llama layer (hidden 4096, MLP 11008), run as vLLM does for each batch
size from the largest down: two eager warm-up passes, then a capture with `torch.cuda.graph`
(PyTorch captures on a stream of its own), then R replays with fresh inputs copied into the
static input. Run under `quantshadow run --mode sketch` with a small pool
(`QUANTSHADOW_POOL_MB=64`) and `--sample all` or `--sample 1/2`: no "graph capture:" skips for
sizes past the pool's room, every replay's checks reported (all, or about half), the report
passes. Writes the digest of every output, for comparison with a run without the shim.
"""
import argparse
import hashlib
import json

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--sizes", type=int, default=40)
    ap.add_argument("--replays", type=int, default=5)
    args = ap.parse_args()
    torch.manual_seed(5)
    hidden, mlp = 4096, 11008
    shapes = [(hidden, hidden)] * 4 + [(mlp, hidden)] * 2 + [(hidden, mlp)]
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for n, k in shapes]

    def layer(x):
        q, k, v = (F.linear(x, w) for w in weights[:3])
        o = F.linear(q + k + v, weights[3])
        h = F.silu(F.linear(o, weights[4])) * F.linear(o, weights[5])
        return F.linear(h, weights[6])

    # vLLM's sizes: 1, 2, 4, then multiples of 8; captured from the largest down.
    sizes = ([1, 2, 4] + [8 * i for i in range(1, args.sizes - 2)])[: args.sizes]
    digest = hashlib.sha256()
    graphs = {}
    pool = None
    for m in reversed(sizes):
        static = torch.randn(m, hidden, device="cuda", dtype=torch.bfloat16)
        for _ in range(2):
            layer(static)  # eager warm-up of this size
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            out = layer(static)
        pool = graph.pool()
        graphs[m] = (graph, static, out)
    replays = 0
    for r in range(args.replays):
        for m in sizes:
            graph, static, out = graphs[m]
            static.copy_(torch.randn(m, hidden, device="cuda", dtype=torch.bfloat16))
            graph.replay()
            digest.update(out.view(torch.uint8).cpu().numpy().tobytes())
            replays += 1
    torch.cuda.synchronize()
    json.dump({"out": digest.hexdigest()}, open(args.out, "w"))
    eager = 2 * len(sizes) * len(weights)
    print(
        f"sizes {len(sizes)} ({sizes[0]}..{sizes[-1]}), eager GEMMs {eager}, replays {replays}, "
        f"captured GEMMs replayed {replays * len(weights)}, out {digest.hexdigest()[:16]}"
    )


if __name__ == "__main__":
    main()
