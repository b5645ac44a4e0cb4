"""A check captured into a CUDA graph reads a snapshot that a copy node takes after its GEMM; the
shim leaves that copy pending so that the next GEMM can run beside it. Another stream may wait
for an event recorded right after the first GEMM and then rewrite that GEMM's output: the copy
must be ordered before that work (session 28: the event record settles the pending copy).

    python3 tests/gpu/capture_event_order.py OUT.json [--replays N]

One step: y = x W1^T (checked), an event recorded, z = x W2^T (the next GEMM, which the copy may
run beside), a side stream waits for the event and triples y in place, the main stream waits
for the side stream, out = y + z. The step is captured once and replayed N times (default 50).
Run under `quantshadow run --mode sketch --sample all`: a snapshot taken after the side stream's
write would judge y three times too large (norm ratio 3, a failing report). Writes the digest
of the last output, for comparison with a run without the shim.
"""
import hashlib
import json
import sys

import torch
import torch.nn.functional as F


def main():
    replays = int(sys.argv[sys.argv.index("--replays") + 1]) if "--replays" in sys.argv else 50
    torch.manual_seed(3)
    m, n, k = 32, 4096, 4096
    w1 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    w2 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()

    def step():
        y = F.linear(x, w1)
        e = torch.cuda.Event()
        e.record()
        z = F.linear(x, w2)
        side.wait_event(e)
        with torch.cuda.stream(side):
            y.mul_(3.0)
        torch.cuda.current_stream().wait_stream(side)
        return y + z

    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    digest = hashlib.sha256(out.view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
    json.dump({"out": digest}, open(sys.argv[1], "w"))
    print(f"replays {replays}, out {digest[:16]}")


if __name__ == "__main__":
    main()
