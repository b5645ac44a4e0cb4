"""Production GEMM times on this GPU, for the ratios in docs/measurements/.

cuBLAS SGEMM (fp32, TF32 off) at the full-reference shapes, and bf16 matmul / FP8 _scaled_mm at
the sketch shapes. Method: random data, warm-up, CUDA events around `reps` back-to-back calls,
median of 5 trials (the device tool's METHOD.md). Prints markdown tables.
"""
import statistics
import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda"


def time_ms(fn, reps=20, trials=5):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / reps)
    return statistics.median(samples)


print(f"GPU: {torch.cuda.get_device_name()} torch {torch.__version__} cuda {torch.version.cuda}\n")
print("| cuBLAS SGEMM (TF32 off) | M x N x K | ms | TFLOP/s |\n| --- | --- | --- | --- |")
for m, n, k in [(4096, 4096, 4096), (4096, 14336, 4096), (4096, 4096, 14336)]:
    a = torch.randn(m, k, device=dev)
    b = torch.randn(k, n, device=dev)
    ms = time_ms(lambda: a @ b, reps=5)
    print(f"| sgemm | {m}x{n}x{k} | {ms:.3f} | {2 * m * n * k / ms / 1e9:.1f} |")

print("\n| production | M | N x K | us per call |\n| --- | --- | --- | --- |")
for n, k in [(4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096)]:
    for m in [1, 16, 256, 4096]:
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        ms = time_ms(lambda: torch.nn.functional.linear(a, w))
        print(f"| bf16 linear | {m} | {n}x{k} | {ms * 1e3:.1f} |")
        a8 = a.to(torch.float8_e4m3fn)
        w8 = w.to(torch.float8_e4m3fn)
        one = torch.ones((), device=dev)
        ms8 = time_ms(lambda: torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        print(f"| fp8 _scaled_mm tensorwise | {m} | {n}x{k} | {ms8 * 1e3:.1f} |")
