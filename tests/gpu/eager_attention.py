"""The small Llama with `transformers`' eager attention: Q K^T and P V are cuBLAS batched GEMMs
whose B operand is an activation, and whose N (Q K^T) or K (P V) is the KV length, new at every
decode step (session 31, for the steering side: how many sites and how much device state such
GEMMs make under the shim; not yet run on a GPU).

    python3 tests/gpu/eager_attention.py OUT.json [--steps 64] [--prompt 100]

Greedy decode with the KV cache. Writes the generated tokens (compare with a run without the
shim). Run under `quantshadow run --mode sketch`: the report's site count and skip reasons show
what the attention GEMMs cost (expected: two new sites per layer and step, until the pool fills).
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_llama import build_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=100)
    args = ap.parse_args()
    model = build_model("small")
    model.config._attn_implementation = "eager"
    for layer in model.model.layers:
        layer.self_attn.config._attn_implementation = "eager"
    torch.manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (1, args.prompt), device="cuda")
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=args.steps, do_sample=False, min_new_tokens=args.steps)
    tokens = out[0, args.prompt :].tolist()
    json.dump({"tokens": tokens}, open(args.out, "w"))
    print(f"steps {len(tokens)}, first tokens {tokens[:8]}")


if __name__ == "__main__":
    main()
