// What a large kernel parameter struct costs a tiny copy kernel inside a CUDA graph (the
// snapshot copy of a detached sketch check takes a 672-byte QsSnapParams and runs ~3.1 us per
// decode GEMM, against ~1.7 us for cuBLASLt's own small splitKreduce kernel).
//
//   nvcc -O3 -arch=sm_90 tests/gpu/param_latency.cu -o /tmp/pl && /tmp/pl
//
// Graphs of 50 x [filler kernel, copy kernel] (the filler stands for the GEMM before each
// copy), replayed back to back and timed with events; the per-copy cost is the difference to a
// graph of the 50 fillers alone, divided by 50. Copy variants, each moving one 8 KB row of A and
// one of D into a snapshot (2 blocks of 256 threads, as the shim's copy at M = 1):
//   small    4 pointers as parameters
//   big      the same pointers inside a 672-byte struct, read where the shim's kernel reads
//            them (fields spread over the struct, some reads depending on earlier ones)
//   staged   the big struct, first copied into shared memory by the block's threads in one
//            parallel step, then read from there
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
#include <vector>
#include <algorithm>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

struct Big {
    uint64_t words[84];  // 672 bytes
};
// Field offsets (in words) spread like QsSnapParams: the row mode near the end, A and D
// descriptors at the start and the middle, the output pointer after them.
enum { W_A = 0, W_A_EXTENT = 9, W_D = 40, W_D_EXTENT = 47, W_MODE = 70, W_OUT = 66, W_COUNT = 72, W_N = 20 };

__global__ void filler(float* x) {
    if (threadIdx.x == 0 && blockIdx.x == 0) x[0] += 1.0f;
}

__device__ void copy_rows(const uint4* a, const uint4* d, uint4* out, uint64_t vecs) {
    const uint64_t half = vecs / 2, lo = blockIdx.x * half;
    for (uint64_t v = lo + threadIdx.x; v < lo + half; v += blockDim.x) {
        out[v] = a[v];
        out[vecs + v] = d[v];
    }
}

__global__ void __launch_bounds__(256) copy_small(const uint4* a, const uint4* d, uint4* out, uint64_t vecs) {
    copy_rows(a, d, out, vecs);
}

__device__ void copy_from(const uint64_t* w) {
    // Dependent reads as in the shim's kernel: the mode decides, then the count, then pointers.
    if (w[W_MODE] != 0 && blockIdx.x >= w[W_COUNT]) return;
    if (w[W_A_EXTENT] < w[W_N]) return;
    if (w[W_D_EXTENT] < w[W_N]) return;
    copy_rows((const uint4*)w[W_A], (const uint4*)w[W_D], (uint4*)w[W_OUT], w[W_N] * 2 / 16);
}

__global__ void __launch_bounds__(256) copy_big(Big P) { copy_from(P.words); }

__global__ void __launch_bounds__(256) copy_staged(Big P) {
    __shared__ uint64_t s[84];
    if (threadIdx.x < 84) s[threadIdx.x] = P.words[threadIdx.x];
    __syncthreads();
    copy_from(s);
}

int main() {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("GPU: %s\n", prop.name);
    const uint64_t n = 4096;  // bf16 elements per row
    const uint64_t vecs = n * 2 / 16;
    const int nodes = 50;
    float* x;
    uint4 *a, *d, *out;
    CK(cudaMalloc(&x, 4));
    CK(cudaMalloc(&a, n * 2));
    CK(cudaMalloc(&d, n * 2));
    CK(cudaMalloc(&out, nodes * n * 4));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    auto big_for = [&](int i) {
        Big P{};
        for (int k = 0; k < 84; ++k) P.words[k] = 1000 + k;
        P.words[W_A] = (uint64_t)a;
        P.words[W_D] = (uint64_t)d;
        P.words[W_OUT] = (uint64_t)(out + (uint64_t)i * vecs * 2);
        P.words[W_MODE] = 0;
        P.words[W_COUNT] = 2;
        P.words[W_N] = n;
        P.words[W_A_EXTENT] = n;
        P.words[W_D_EXTENT] = n;
        return P;
    };
    const char* names[4] = {"fillers only", "small", "big", "staged"};
    cudaGraphExec_t execs[4];
    for (int variant = 0; variant < 4; ++variant) {
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < nodes; ++i) {
            filler<<<1, 32, 0, st>>>(x);
            if (variant == 1) copy_small<<<2, 256, 0, st>>>(a, d, out + (uint64_t)i * vecs * 2, vecs);
            if (variant == 2) copy_big<<<2, 256, 0, st>>>(big_for(i));
            if (variant == 3) copy_staged<<<2, 256, 0, st>>>(big_for(i));
        }
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&execs[variant], g, 0));
        CK(cudaGraphUpload(execs[variant], st));
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    const int replays = 200, trials = 9;
    std::vector<std::vector<float>> us(4);
    for (int t = 0; t < trials; ++t) {
        for (int variant = 0; variant < 4; ++variant) {
            for (int w = 0; w < 5; ++w) CK(cudaGraphLaunch(execs[variant], st));
            CK(cudaEventRecord(e0, st));
            for (int r = 0; r < replays; ++r) CK(cudaGraphLaunch(execs[variant], st));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            us[variant].push_back(ms * 1000.0f / replays);
        }
    }
    float base = 0;
    printf("| graph | us per replay (median of %d) | per copy node (us) |\n| --- | --- | --- |\n", trials);
    for (int variant = 0; variant < 4; ++variant) {
        std::sort(us[variant].begin(), us[variant].end());
        const float med = us[variant][trials / 2];
        if (variant == 0) base = med;
        if (variant == 0) {
            printf("| %s | %.2f | |\n", names[variant], med);
        } else {
            printf("| %s | %.2f | %.3f |\n", names[variant], med, (med - base) / nodes);
        }
    }
    return 0;
}
