"""A graph captured early keeps reporting after many eager checked calls (session 30: results of
replays were looked up among the eager calls' entries, capped at 8192, and after that many later
eager checks every replay's result was dropped as "result of a call no longer remembered").

    python3 tests/gpu/long_replay.py OUT.json [--eager N]

A step of four linears is captured and replayed 5 times; then N eager GEMMs of another shape
(default 9000) run; then the graph is replayed 20 times more. Run under `quantshadow run --mode
sketch --sample all`: the report must count no "no longer remembered" skip, and the captured
sites must have 4 x 25 = 100 checks between them. Writes the digest of the last output, for
comparison with a run without the shim.
"""
import hashlib
import json
import sys

import torch
import torch.nn.functional as F


def main():
    eager = int(sys.argv[sys.argv.index("--eager") + 1]) if "--eager" in sys.argv else 9000
    torch.manual_seed(5)
    m, n, k = 8, 1024, 1024
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.03 for _ in range(4)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)

    def step():
        h = x
        for w in ws:
            h = F.linear(h, w)
        return h

    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(5):
        graph.replay()
    a = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(256, 192, device="cuda", dtype=torch.bfloat16)
    acc = torch.zeros(64, 192, device="cuda", dtype=torch.float32)
    for i in range(eager):
        acc += (a @ b).float()
        if i % 1000 == 999:
            torch.cuda.synchronize()
    for _ in range(20):
        graph.replay()
    torch.cuda.synchronize()
    digest = hashlib.sha256(out.view(torch.uint8).cpu().numpy().tobytes()).hexdigest()
    acc_digest = hashlib.sha256(acc.cpu().numpy().tobytes()).hexdigest()
    json.dump({"out": digest, "acc": acc_digest}, open(sys.argv[1], "w"))
    print(f"eager {eager}, out {digest[:16]}, acc {acc_digest[:16]}")


if __name__ == "__main__":
    main()
