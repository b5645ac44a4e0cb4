"""Eager calls of one layer at many batch sizes, as a server's steps (session 30: past a site's
first 8 row counts, eager checks run in their stream's scratch instead of setting up ~1.5 MB of
their own per row count, which filled the pool).

    python3 tests/gpu/varied_batch.py OUT.json

Two bf16 linears (4096 -> 4096, 4096 -> 14336) and one with bias, called at M = 1 .. 300 in a
shuffled order (seeded), each M once, then again in another order. Run under `quantshadow run
--mode sketch --sample all`: every call checked (no "pool" skip), the report passes. Writes the
digest of every output, for comparison with a run without the shim.
"""
import hashlib
import json
import random
import sys

import torch
import torch.nn.functional as F


def main():
    torch.manual_seed(11)
    rng = random.Random(11)
    layers = [
        (torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) * 0.02, None),
        (torch.randn(14336, 4096, device="cuda", dtype=torch.bfloat16) * 0.02, None),
        (
            torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) * 0.02,
            torch.randn(4096, device="cuda", dtype=torch.bfloat16),
        ),
    ]
    digest = hashlib.sha256()
    for _ in range(2):
        sizes = list(range(1, 301))
        rng.shuffle(sizes)
        for m in sizes:
            x = torch.randn(m, 4096, device="cuda", dtype=torch.bfloat16)
            for w, b in layers:
                y = F.linear(x, w, b)
                digest.update(y.view(torch.uint8).cpu().numpy().tobytes())
    torch.cuda.synchronize()
    json.dump({"out": digest.hexdigest()}, open(sys.argv[1], "w"))
    print(f"calls {2 * 300 * len(layers)}, out {digest.hexdigest()[:16]}")


if __name__ == "__main__":
    main()
