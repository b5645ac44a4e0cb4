"""What one extra graph node per linear layer costs the Llama model's graph decode, without the
shim: the floor of any check that adds a node to the captured step for every checked GEMM.

    python3 tests/gpu/llama_graph_floor.py LABEL [--size small|8b-width] [--variants plain,empty,copy,copy2]
        [--rounds 2] [--profile]

torch_llama.py's model and graph decoder (static KV cache, the step captured once and replayed
per token). Every nn.Linear call of the captured step is followed by:
- plain: nothing;
- empty: `torch.cuda._sleep(0)`, a kernel that does nothing (the cost of a node as such);
- copy: the output's last row copied into a buffer of the layer's own (`Tensor.copy_`: one
  small copy node, where the shim's snapshot copy moves the input's and the output's rows in
  one kernel);
- copy2: the input's and the output's last rows, two copy nodes.
Each variant is captured into its own graph; the variants alternate over --rounds rounds, plain
first. Prints decode tokens/s per variant (torch_llama.py's timing: prefill, then 31 replays,
median of 9 trials, where torch_llama.py takes 11), the loss against plain in the same round,
and whether the tokens match plain's.
--profile (under the shim: LD_PRELOAD) profiles six replays of the first variant's graph
instead: per replay its span and the shim's nodes, then one replay's timeline and the tail of
checks after the last production kernel.
"""
import statistics
import sys
import os

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_llama import GraphDecoder, build_model, arg  # noqa: E402

STEPS = 32
TRIALS = 9
MODE = {"variant": "plain"}
BUFFERS = {}


def install_hook():
    linear = torch.nn.Linear.forward

    def forward(self, x):
        y = linear(self, x)
        v = MODE["variant"]
        if v == "empty":
            torch.cuda._sleep(0)
        elif v in ("copy", "copy2"):
            rows = [("y", y)] + ([("x", x)] if v == "copy2" else [])
            for name, t in rows:
                key = (v, id(self), name)
                last = t.reshape(-1, t.shape[-1])[-1]
                if key not in BUFFERS:  # the eager warm-up step allocates, before the capture
                    BUFFERS[key] = torch.empty_like(last)
                BUFFERS[key].copy_(last)
        return y

    torch.nn.Linear.forward = forward


def tokens_per_s(decoder):
    times = []
    tokens = None
    for _ in range(TRIALS):
        tokens, _, decode_s = decoder.run()
        times.append((STEPS - 1) / decode_s)
    return statistics.median(times), tokens


def profile(label, decoder):
    """Six replays under PyTorch's profiler, a spin kernel before each one (the replays' bounds):
    per replay its span, the shim's nodes and the checks' tail; the fourth replay's timeline."""
    from graph_profile import gpu_events, print_timeline

    with torch.no_grad():
        decoder.prefill()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(6):
                torch.cuda._sleep(100000)
                decoder.graph.replay()
            torch.cuda._sleep(100000)
            torch.cuda.synchronize()
    gpu = gpu_events(prof)
    # The bounds are the long spins (the `empty` variant's own zero-cycle spins are ~1 us).
    marks = [i for i, e in enumerate(gpu) if "spin" in e["name"].lower() and e["dur"] > 20]
    replays = [gpu[a + 1:b] for a, b in zip(marks, marks[1:])]
    for r, rp in enumerate(replays):
        span = rp[-1]["ts"] + rp[-1]["dur"] - rp[0]["ts"]
        kinds = {}
        for e in rp:
            if e["name"].startswith("qs_"):
                kinds.setdefault(e["name"].split("_bf16")[0].split("_e4m3")[0], []).append(e["dur"])
        shim = ", ".join(f"{k} {len(d)} x {statistics.mean(d):.2f} us" for k, d in sorted(kinds.items()))
        print(f"{label} replay {r}: {len(rp)} operations, span {span:.1f} us; {shim or 'no shim nodes'}")
    print_timeline(f"{label} (replay 3)", replays[3])


def main():
    valued = ("--size", "--variants", "--rounds")
    args = [a for i, a in enumerate(sys.argv[1:], 1) if not a.startswith("--") and sys.argv[i - 1] not in valued]
    label = args[0] if args else "floor"
    size = arg("--size", "small")
    variants = arg("--variants", "plain,empty,copy,copy2").split(",")
    if "plain" in variants and "--profile" not in sys.argv:
        variants = ["plain"] + [v for v in variants if v != "plain"]  # the round's reference first
    rounds = int(arg("--rounds", "2"))
    install_hook()
    model = build_model(size)
    prompt = torch.randint(0, model.config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(1)).cuda()
    decoders = {}
    for v in variants:
        MODE["variant"] = v
        decoders[v] = GraphDecoder(model, prompt, STEPS)
    MODE["variant"] = "plain"
    if "--profile" in sys.argv:
        return profile(label, decoders[variants[0]])
    base_tokens = None
    for r in range(1, rounds + 1):
        plain = None
        for v in variants:
            tps, tokens = tokens_per_s(decoders[v])
            if base_tokens is None:
                base_tokens = tokens
            same = "same tokens" if torch.equal(tokens, base_tokens) else "TOKENS DIFFER"
            plain = tps if v == "plain" else plain
            loss = f"{100.0 * (tps / plain - 1.0):+.1f}%" if plain else "-"
            print(f"{label} {size} round {r}: {v:6s} {tps:8.1f} tokens/s  vs plain {loss}  ({same})")


if __name__ == "__main__":
    main()
