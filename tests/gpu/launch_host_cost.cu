// What one extra kernel launch after each cuBLAS GEMM costs the host thread, by parameter size:
// the floor of any check launched on the caller's stream (an eager sketch check is one
// cuLaunchKernel of a 784-byte QsSketchParams). Host-bound callers (Llama prefill at 1024 wide)
// pay this time directly.
//
//   nvcc -O3 -arch=sm_90 tests/gpu/launch_host_cost.cu -o /tmp/lhc -lcublas -lcuda && /tmp/lhc
//
// Each round: `iters` x [cublasGemmEx bf16 M x 1024 x 1024 on a stream, then optionally one
// cuLaunchKernel of an 8x8-block trivial kernel on the same stream], the host time of the GEMM
// call and of the launch timed apart with CLOCK_MONOTONIC; the stream is synchronised every 32
// iterations so that the queue never fills (a full queue makes launches block, which is GPU
// time, not host cost). Variants alternate round by round; medians over rounds of the per-call
// means are printed.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <vector>

#define CK(x) do { auto e = (x); if (e != 0) { printf("%s: error %d\n", #x, (int)e); return 1; } } while (0)

template <int BYTES> struct Blob { uint64_t w[BYTES / 8]; };

// The kernel reads one word of its parameters so they cannot be dropped.
template <int BYTES> __global__ void touch(Blob<BYTES> p, unsigned long long* sink) {
    if (threadIdx.x == 0 && blockIdx.x == 0 && p.w[BYTES / 8 - 1] == 0x1234567ull) *sink = 1;
}

static double now_us() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec * 1e-3;
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

template <int BYTES> static CUfunction function_of() {
    cudaFunction_t f;
    cudaGetFuncBySymbol(&f, (const void*)touch<BYTES>);
    return (CUfunction)f;
}

int main(int argc, char** argv) {
    const int m = argc > 1 ? atoi(argv[1]) : 1024, rounds = 41, iters = 256;
    CK(cudaSetDevice(0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cublasHandle_t h;
    CK(cublasCreate(&h));
    CK(cublasSetStream(h, s));
    const int n = 1024, k = 1024;
    __nv_bfloat16 *a, *b, *d;
    CK(cudaMalloc(&a, size_t(m) * k * 2));
    CK(cudaMalloc(&b, size_t(n) * k * 2));
    CK(cudaMalloc(&d, size_t(m) * n * 2));
    CK(cudaMemset(a, 0x3c, size_t(m) * k * 2));
    CK(cudaMemset(b, 0x3c, size_t(n) * k * 2));
    unsigned long long* sink;
    CK(cudaMalloc(&sink, 8));
    const float one = 1.0f, zero = 0.0f;
    auto gemm = [&] {
        return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, b, CUDA_R_16BF, k, a, CUDA_R_16BF, k,
                            &zero, d, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };
    Blob<8> p8{};
    Blob<64> p64{};
    Blob<784> p784{};
    Blob<4096> p4096{};
    struct Variant { const char* name; CUfunction f; void* blob; };
    Variant variants[] = {
        {"gemm only", nullptr, nullptr},
        {"+ launch, 8-byte params", function_of<8>(), &p8},
        {"+ launch, 64-byte params", function_of<64>(), &p64},
        {"+ launch, 784-byte params (QsSketchParams)", function_of<784>(), &p784},
        {"+ launch, 4096-byte params", function_of<4096>(), &p4096},
    };
    const int nv = sizeof(variants) / sizeof(variants[0]);
    std::vector<std::vector<double>> gemm_us(nv), launch_us(nv), iter_us(nv);
    for (int r = -2; r < rounds; r++) {  // two warm-up rounds
        for (int v = 0; v < nv; v++) {
            double g = 0, l = 0;
            CK(cudaStreamSynchronize(s));
            double t_start = now_us(), synced = 0;
            for (int i = 0; i < iters; i++) {
                double t0 = now_us();
                CK(gemm());
                double t1 = now_us();
                if (variants[v].f) {
                    void* params[] = {variants[v].blob, &sink};
                    CK(cuLaunchKernel(variants[v].f, 8, 8, 1, 256, 1, 1, 0, (CUstream)s, params, nullptr));
                }
                double t2 = now_us();
                g += t1 - t0;
                l += t2 - t1;
                if (i % 32 == 31) {
                    double t3 = now_us();
                    CK(cudaStreamSynchronize(s));
                    synced += now_us() - t3;
                }
            }
            double total = now_us() - t_start - synced;
            if (r >= 0) {
                gemm_us[v].push_back(g / iters);
                launch_us[v].push_back(l / iters);
                iter_us[v].push_back(total / iters);
            }
        }
    }
    printf("%s, bf16 GEMM %dx%dx%d per iteration, %d rounds x %d iterations (medians of round means)\n",
           prop.name, m, n, k, rounds, iters);
    printf("| variant | GEMM call, host us | extra launch, host us | iteration w/o syncs, host us |\n");
    printf("| --- | --- | --- | --- |\n");
    for (int v = 0; v < nv; v++)
        printf("| %s | %.2f | %.2f | %.2f |\n", variants[v].name, median(gemm_us[v]), median(launch_us[v]),
               median(iter_us[v]));
    return 0;
}
