"""Several GPUs in one process, one thread per GPU (as tensor-parallel engines drive them).

    python3 tests/gpu/torch_multi_gpu.py OUT.json

Each device runs its own layers (device d: bf16 linear with N = 768 + 256 d, an FP8 _scaled_mm
with N = 640 + 128 d, so the report's shapes tell the devices apart), eagerly at M in {1, 57,
300} and as a decode step captured in a CUDA graph and replayed 8 times. Both threads run at
once. Writes a SHA-256 of every output per device: the same file with and without the shim
means the shim changed no result.
"""
import hashlib
import json
import sys
import threading

import torch


def device_work(dev, digests, errors):
    try:
        torch.cuda.set_device(dev)
        cuda = f"cuda:{dev}"
        g = torch.Generator(device=cuda).manual_seed(100 + dev)
        k = 512
        n_lin, n_fp8 = 768 + 256 * dev, 640 + 128 * dev
        w = torch.randn(n_lin, k, device=cuda, dtype=torch.bfloat16, generator=g) * 0.05
        w8 = (torch.randn(n_fp8, k, device=cuda, generator=g) * 0.05).to(torch.float8_e4m3fn)
        one = torch.ones((), device=cuda)
        h = hashlib.sha256()
        for step in range(6):
            for m in (1, 57, 300):
                x = torch.randn(m, k, device=cuda, dtype=torch.bfloat16, generator=g)
                h.update(torch.nn.functional.linear(x, w).cpu().view(torch.int16).numpy().tobytes())
                y = torch._scaled_mm(x.to(torch.float8_e4m3fn), w8.t(), scale_a=one, scale_b=one,
                                     out_dtype=torch.bfloat16)
                h.update(y.cpu().view(torch.int16).numpy().tobytes())
        # A decode step in a CUDA graph, replayed.
        static_x = torch.randn(1, k, device=cuda, dtype=torch.bfloat16, generator=g)
        stream = torch.cuda.Stream(device=cuda)
        stream.wait_stream(torch.cuda.current_stream(cuda))
        with torch.cuda.stream(stream):
            for _ in range(3):
                torch.nn.functional.linear(static_x, w)  # warm-up outside the capture
        torch.cuda.current_stream(cuda).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the other device's thread keeps running (and copying) meanwhile, which
        # the default global mode forbids. An explicit stream of this device: torch.cuda.graph's
        # default capture stream is created once, on whichever device asked first.
        with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
            static_y = torch.nn.functional.linear(static_x, w)
        for _ in range(8):
            static_x.copy_(torch.randn(1, k, device=cuda, dtype=torch.bfloat16, generator=g))
            graph.replay()
            h.update(static_y.cpu().view(torch.int16).numpy().tobytes())
        torch.cuda.synchronize(cuda)
        digests[dev] = h.hexdigest()
    except Exception as e:  # reported at once (a failed capture can abort the process later)
        import traceback
        traceback.print_exc()
        sys.stdout.flush()
        errors.append(f"device {dev}: {e!r}")


def main():
    n = torch.cuda.device_count()
    if n < 2:
        print(f"needs 2 GPUs, found {n}")
        return 2
    digests, errors = {}, []
    threads = [threading.Thread(target=device_work, args=(d, digests, errors)) for d in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        print("\n".join(errors))
        return 1
    json.dump({f"device{d}": digests[d] for d in sorted(digests)}, open(sys.argv[1], "w"), indent=1)
    print(json.dumps(digests))
    return 0


if __name__ == "__main__":
    sys.exit(main())
