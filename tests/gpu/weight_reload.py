"""Weights rewritten in place while checks of them may still be running (a reload, an optimizer
step): the shim must re-project, never judge a call against the wrong projection.

    python3 tests/gpu/weight_reload.py OUT.json [--sites N] [--rounds R]

N bf16 4096 x 4096 weights (default 16), each called back to back with 1024 rows (the shim's
detached path: the check runs later on its side stream), R rounds (default 6); after round 2
every weight is rewritten in place with new random values, so each site finds its weight
changed once and re-projects while detached checks of the old weight may be queued. Run under
`quantshadow run --mode sketch --sample all`: the report must pass (a check judged against the
other projection fails), and the output digests must equal a run without the shim.
"""
import hashlib
import json
import sys

import torch
import torch.nn.functional as F


def arg(name, default):
    return int(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


def main():
    sites, rounds = arg("--sites", 16), arg("--rounds", 6)
    torch.manual_seed(7)
    ws = [torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(sites)]
    x = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)
    outputs = {}
    # No host sync inside the loop: the host runs ahead, so checks queue up behind the calls.
    for r in range(rounds):
        for i, w in enumerate(ws):
            outputs[f"round{r}_site{i}"] = F.linear(x, w)
        if r == 2:
            g = torch.Generator(device="cuda").manual_seed(8)
            for w in ws:
                w.copy_(torch.randn(w.shape, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02)
    torch.cuda.synchronize()
    digests = {k: hashlib.sha256(y.view(torch.uint8).cpu().numpy().tobytes()).hexdigest() for k, y in outputs.items()}
    json.dump(digests, open(sys.argv[1], "w"))


if __name__ == "__main__":
    main()
