"""Kernel-level timeline of a CUDA-graph decode step (the overhead_mlp.py layers), through
PyTorch's profiler (CUPTI sees the kernels inside graph replays).

    python3 tests/gpu/graph_profile.py [label] [--repeat N] [--eager-first] [--side-work | --side-wait] [--after] [--timeline] [--prefill]

Replays the captured step 40 times under the profiler and prints, per kernel position in a
replay: the kernel's name, its mean duration and the mean gap since the previous kernel of the
replay ended; then the mean replay span (first start to last end) and the mean gap between
replays. --eager-first runs overhead_mlp.py's eager prefill and decode passes before the capture,
as that script does. --side-work adds, after each eager pass, a small kernel on a third stream;
--side-wait makes that stream wait for the pass first (an event), as the shim's detached checks
do: without the shim they show whether such work alone changes later replays. --after runs
those passes after the capture instead of before it. Run with and without the shim: a per-replay cost that is not in the kernels' durations
is in the gaps, and a kernel that differs shows by name.
--timeline also prints one replay's operations in start order with their stream, start offset
and duration (graph branches overlap, so positions alone do not say what ran beside what), and
a summary of the replay's checks: how many ran at once at most, on how many streams, and the
tail from the last production kernel's end to the last check's end.
--repeat N stacks N copies of the six layers, as overhead_mlp.py does (--fp8: its FP8 stack).
--prefill profiles eager prefill passes (M=512) instead: per stream, the kernels' summed time
and the pass span. --prefill --llama SIZE profiles the prefill of torch_llama.py's model instead
(SIZE small or 8b-width, prompt of --prompt tokens, default 1024, no KV cache kept).
"""
import json
import os
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from overhead_mlp import capture_decode, make_layers, timed  # noqa: E402

REPLAYS = 40


def main():
    repeat = int(sys.argv[sys.argv.index("--repeat") + 1]) if "--repeat" in sys.argv else 1
    valued = ("--repeat", "--llama", "--prompt")
    args = [a for i, a in enumerate(sys.argv[1:], 1) if not a.startswith("--") and sys.argv[i - 1] not in valued]
    label = args[0] if args else "run"
    forward = make_layers(repeat, fp8="--fp8" in sys.argv)
    xp = torch.randn(512, 4096, device="cuda").to(torch.bfloat16)
    xd = torch.randn(1, 4096, device="cuda").to(torch.bfloat16)
    side = torch.cuda.Stream()
    side_work = "--side-work" in sys.argv or "--side-wait" in sys.argv

    def eager_passes():
        for x in (xp, xd):
            for _ in range(5 + 7 * 50):
                y = forward(x)
                if side_work:
                    if "--side-wait" in sys.argv:
                        ev = torch.cuda.Event()
                        ev.record()
                        side.wait_event(ev)
                    with torch.cuda.stream(side):
                        y[:1].sum()
        torch.cuda.synchronize()

    if "--prefill" in sys.argv and "--llama" in sys.argv:
        return profile_llama_prefill(label)
    if "--prefill" in sys.argv:
        return profile_prefill(label, forward, xp)
    after = "--after" in sys.argv
    if ("--eager-first" in sys.argv or side_work) and not after:
        eager_passes()
    g = capture_decode(forward, xd)
    if after:
        eager_passes()
    # First without the profiler, as overhead_mlp.py times it (its warm-up replays included).
    print(f"{label}: {timed(g.replay):.2f} us per replay without the profiler (median of 7 x 50)")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(REPLAYS):
            g.replay()
        torch.cuda.synchronize()
    gpu = gpu_events(prof)
    if not gpu or len(gpu) % REPLAYS:
        print(f"{label}: {len(gpu)} GPU events for {REPLAYS} replays; names: {sorted({e['name'][:40] for e in gpu})[:12]}")
        if not gpu:
            return
    per = len(gpu) // REPLAYS
    replays = [gpu[r * per:(r + 1) * per] for r in range(REPLAYS)]
    print(f"{label}: {per} GPU operations per replay")
    print("| pos | kernel | mean dur (us) | mean gap before (us) |")
    print("| --- | --- | --- | --- |")
    for p in range(per):
        durs = [rp[p]["dur"] for rp in replays]
        gaps = [rp[p]["ts"] - (rp[p - 1]["ts"] + rp[p - 1]["dur"]) for rp in replays] if p else []
        name = replays[0][p]["name"]
        print(f"| {p} | {name[:70]} | {statistics.mean(durs):.2f} | {statistics.mean(gaps):.2f} |" if gaps
              else f"| {p} | {name[:70]} | {statistics.mean(durs):.2f} | - |")
    if "--timeline" in sys.argv:
        print_timeline(label, replays[REPLAYS // 2])
    spans = [rp[-1]["ts"] + rp[-1]["dur"] - rp[0]["ts"] for rp in replays]
    between = [replays[r][0]["ts"] - (replays[r - 1][-1]["ts"] + replays[r - 1][-1]["dur"]) for r in range(1, REPLAYS)]
    kernel_sum = statistics.mean(sum(e["dur"] for e in rp) for rp in replays)
    print(f"{label}: replay span {statistics.median(spans):.2f} us (median), kernels {kernel_sum:.2f} us, "
          f"gap between replays {statistics.median(between):.2f} us (median)")


def gpu_events(prof):
    """The profiler's GPU operations (kernels, memsets, copies), in start order."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        trace = json.load(open(path))
    gpu = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    gpu.sort(key=lambda e: e["ts"])
    return gpu


def print_timeline(label, events):
    """One replay or pass: each operation's stream, start offset from the first, and duration."""
    t0 = events[0]["ts"]
    print(f"{label}: timeline")
    print("| start (us) | end (us) | stream | kernel |")
    print("| --- | --- | --- | --- |")
    for e in events:
        print(f"| {e['ts'] - t0:.2f} | {e['ts'] + e['dur'] - t0:.2f} | {e.get('tid')} | {e['name'][:60]} |")
    checks = [e for e in events if e["name"].startswith(("qs_sketch_check", "qs_sketch_lean"))]
    if checks:
        edges = sorted([(e["ts"], 1) for e in checks] + [(e["ts"] + e["dur"], -1) for e in checks])
        running = most = 0
        for _, step in edges:
            running += step
            most = max(most, running)
        production_end = max((e["ts"] + e["dur"] for e in events if not e["name"].startswith("qs_")), default=t0)
        checks_end = max(e["ts"] + e["dur"] for e in checks)
        durs = sorted(e["dur"] for e in checks)
        print(f"{label}: {len(checks)} checks on {len({e.get('tid') for e in checks})} streams, at most {most} at once; "
              f"each {durs[0]:.1f}-{durs[-1]:.1f} us (median {statistics.median(durs):.1f}); "
              f"tail after the last production kernel {checks_end - production_end:.1f} us")


def profile_prefill(label, forward, xp, passes=20):
    """Eager prefill passes under the profiler: per stream the summed kernel time per pass, and
    the mean pass time from events."""
    print(f"{label}: {timed(lambda: forward(xp)):.2f} us per prefill pass without the profiler (median of 7 x 50)")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(passes):
            forward(xp)
        torch.cuda.synchronize()
    gpu = gpu_events(prof)
    by_stream = {}
    for e in gpu:
        by_stream.setdefault(e.get("tid"), []).append(e)
    for tid, evs in sorted(by_stream.items(), key=lambda kv: str(kv[0])):
        names = {}
        for e in evs:
            names.setdefault(e["name"][:50], []).append(e["dur"])
        print(f"{label}: stream {tid}: {len(evs)} operations, {sum(e['dur'] for e in evs) / passes:.2f} us per pass")
        for n, d in sorted(names.items(), key=lambda kv: -sum(kv[1])):
            print(f"    {len(d):4d} x {statistics.mean(d):8.2f} us  {n}")
    span = (gpu[-1]["ts"] + gpu[-1]["dur"] - gpu[0]["ts"]) / passes
    print(f"{label}: {span:.2f} us per pass under the profiler (first start to last end / {passes})")
    mid = len(gpu) // 2
    print_timeline(label + " (middle of the run)", gpu[mid:mid + 40])


def profile_llama_prefill(label):
    """profile_prefill over the Llama model's prefill (torch_llama.py's model, seeded)."""
    from torch_llama import build_model

    model = build_model(sys.argv[sys.argv.index("--llama") + 1])
    tokens = int(sys.argv[sys.argv.index("--prompt") + 1]) if "--prompt" in sys.argv else 1024
    prompt = torch.randint(0, model.config.vocab_size, (1, tokens), generator=torch.Generator().manual_seed(1)).cuda()

    def forward(ids):
        with torch.no_grad():
            return model(input_ids=ids, use_cache=False).logits

    profile_prefill(label, forward, prompt, passes=5)


if __name__ == "__main__":
    main()
