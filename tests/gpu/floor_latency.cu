// What any on-stream sketch check must cost at least, measured the way `quantshadow bench gpu
// --only sketch` times the real one (CUDA events around back-to-back eager launches, median of
// trials), so the two can be compared side by side on one GPU:
//
//     nvcc -O3 -arch=sm_90 tests/gpu/floor_latency.cu -o /tmp/floor_latency && /tmp/floor_latency [--graph]
//
// Cases, each with no arithmetic beyond keeping its loads alive:
//  - empty kernels of the lean check's launch shape (64 blocks; 8 clusters of 8 with its ~40 KiB
//    of shared memory): the launch and drain alone;
//  - "read": the bytes a 256-row check must read (256 sampled rows of A and D out of M = 4096,
//    all loads in flight at once), 128 blocks of 2 rows, one float per row written back;
//  - "read+publish": the same, then a last-block count and a 1 KiB result slot written by one warp
//    into mapped host memory without fences (as qs_ring_write does);
//  - "cluster read+publish": the lean check's decomposition (8 clusters of 32 rows, 8 K/N splits
//    per cluster), a cluster barrier, then the last-block count and the slot.
// The difference between the last case and the lean check is the check's own work (tensor-core
// projections, the block and split merges, row finishing, totals).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

typedef unsigned long long u64;
typedef unsigned int u32;

#define CHECK(x)                                                                               \
    do {                                                                                       \
        cudaError_t e = (x);                                                                   \
        if (e != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

constexpr int M = 4096, ROWS = 256, SLOT_WORDS = 128, SLOTS = 1024;

struct Args {
    const unsigned char* a;  // M x K, a_bytes per element
    const unsigned char* d;  // M x N, bf16
    u64 k, n, a_bytes;
    float* out;      // one float per row
    u32* counter;    // last-block count
    u64* host;       // mapped host memory: SLOTS slots of SLOT_WORDS words
    u64* ticket;     // device ring head
};

__device__ __forceinline__ u64 sampled_row(u32 r) { return (u64)r * (M / ROWS) + (r * 7u) % (M / ROWS); }

__device__ __forceinline__ float fold(uint4 v) { return __uint_as_float((v.x ^ v.y ^ v.z ^ v.w) & 0x3fffffffu); }

__device__ __forceinline__ float block_sum(float v) {
    __shared__ float s[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(~0u, v, o);
    if (threadIdx.x % 32 == 0) s[threadIdx.x / 32] = v;
    __syncthreads();
    float t = 0.f;
    if (threadIdx.x < 32) {
        t = threadIdx.x < blockDim.x / 32 ? s[threadIdx.x] : 0.f;
        for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(~0u, t, o);
    }
    return t;
}

// Last-block count, then one warp of the last block writes a slot (no fences; the real ring's
// poller checks a hash instead).
__device__ void publish(const Args& g, u32 blocks) {
    __shared__ int last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(g.counter, 1u) == blocks - 1;
    }
    __syncthreads();
    if (!last) return;
    __shared__ u64 t;
    if (threadIdx.x == 0) {
        *g.counter = 0;
        t = atomicAdd(g.ticket, 1ull);
    }
    float s = 0.f;
    for (int r = threadIdx.x; r < ROWS; r += blockDim.x) s += __ldcg(&g.out[r]);
    s = block_sum(s);
    if (threadIdx.x < 32) {
        u64* slot = g.host + (t % SLOTS) * SLOT_WORDS;
        for (int w = threadIdx.x; w < SLOT_WORDS; w += 32) slot[w] = (u64)__float_as_uint(s) + w + t;
    }
}

__global__ void k_empty_small() {}
__global__ void __launch_bounds__(256, 1) k_empty64() {}
__global__ void __launch_bounds__(256, 1) __cluster_dims__(1, 8, 1) k_empty_cluster() {
    __shared__ float s[10240];  // ~40 KiB like QsLeanSmem
    if (threadIdx.x == 1000) s[blockIdx.x] = 1.f;
    __syncthreads();
    if (s[0] == 12345.f) printf("x");
}

// 128 blocks x 256 threads: half a block per sampled row, every load of the row at once.
template <bool PUBLISH>
__global__ void __launch_bounds__(256) k_read(Args g) {
    const u32 r = blockIdx.x * 2 + threadIdx.x / 128, h = threadIdx.x % 128;
    const u64 row = sampled_row(r);
    const uint4* a = (const uint4*)(g.a + row * g.k * g.a_bytes);
    const uint4* d = (const uint4*)(g.d + row * g.n * 2);
    const u32 va = (u32)(g.k * g.a_bytes / 16), vd = (u32)(g.n * 2 / 16);
    uint4 buf[16];
    float acc = 0.f;
    for (u32 base = 0; base < va + vd; base += 16 * 128) {
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const u32 v = base + j * 128 + h;
            buf[j] = v < va ? __ldcs(a + v) : v < va + vd ? __ldcs(d + (v - va)) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int j = 0; j < 16; ++j) acc += fold(buf[j]);
    }
    const float s = block_sum(acc);  // both rows of the block together: the cost, not the value
    if (threadIdx.x == 0) g.out[blockIdx.x * 2] = s, g.out[blockIdx.x * 2 + 1] = s;
    if (PUBLISH) publish(g, gridDim.x);
}

// The lean check's decomposition: cluster x = 32 rows, rank y = the K/8 and N/8 slices.
__global__ void __launch_bounds__(256, 1) __cluster_dims__(1, 8, 1) k_cluster_read(Args g) {
    __shared__ float s[10240];
    const u32 split = blockIdx.y;
    const u64 ka = g.k * g.a_bytes / 8, kd = g.n * 2 / 8;  // bytes of a row slice
    const u32 va = (u32)(ka / 16), vd = (u32)(kd / 16), per_row = va + vd;
    uint4 buf[16];
    float acc = 0.f;
    for (u32 base = 0; base < 32 * per_row; base += 16 * 256) {
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const u32 v = base + j * 256 + threadIdx.x, lr = v / per_row, e = v % per_row;
            const u64 row = sampled_row(blockIdx.x * 32 + lr);
            buf[j] = v >= 32 * per_row ? make_uint4(0, 0, 0, 0)
                     : e < va         ? __ldcs((const uint4*)(g.a + row * g.k * g.a_bytes + split * ka) + e)
                                      : __ldcs((const uint4*)(g.d + row * g.n * 2 + split * kd) + (e - va));
        }
#pragma unroll
        for (int j = 0; j < 16; ++j) acc += fold(buf[j]);
    }
    const float t = block_sum(acc);
    if (threadIdx.x == 0) s[0] = t;
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
    if (threadIdx.x < 4) g.out[blockIdx.x * 32 + split * 4 + threadIdx.x] = s[0];
    publish(g, gridDim.x * gridDim.y);
}

// Eager: events around `reps` launches from the host (the host's launch rate bounds short kernels,
// ~4 us per launch on the H100 host of 2026-11-27). Graph: the same launches captured once and
// replayed (the GPU's own time per kernel, launch latency inside a graph included).
static bool g_graph = false;

template <class F>
float per_launch_us(F launch, int reps = 200, int trials = 7) {
    if (g_graph) {
        cudaStream_t s;
        CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        for (int i = 0; i < reps; ++i) launch(s);
        CHECK(cudaStreamEndCapture(s, &graph));
        CHECK(cudaGraphInstantiate(&exec, graph, 0));
        CHECK(cudaGraphLaunch(exec, s));
        CHECK(cudaStreamSynchronize(s));
        cudaEvent_t e0, e1;
        CHECK(cudaEventCreate(&e0));
        CHECK(cudaEventCreate(&e1));
        std::vector<float> v;
        for (int t = 0; t < trials; ++t) {
            CHECK(cudaEventRecord(e0, s));
            CHECK(cudaGraphLaunch(exec, s));
            CHECK(cudaEventRecord(e1, s));
            CHECK(cudaEventSynchronize(e1));
            float ms = 0;
            CHECK(cudaEventElapsedTime(&ms, e0, e1));
            v.push_back(ms * 1000.f / reps);
        }
        CHECK(cudaGraphExecDestroy(exec));
        CHECK(cudaGraphDestroy(graph));
        CHECK(cudaStreamDestroy(s));
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    }
    auto eager = [&] { launch((cudaStream_t)0); };
    for (int i = 0; i < 20; ++i) eager();
    CHECK(cudaDeviceSynchronize());
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    std::vector<float> v;
    for (int t = 0; t < trials; ++t) {
        CHECK(cudaEventRecord(e0));
        for (int i = 0; i < reps; ++i) eager();
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        v.push_back(ms * 1000.f / reps);
    }
    CHECK(cudaGetLastError());
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char** argv) {
    g_graph = argc > 1 && std::string(argv[1]) == "--graph";
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    printf("GPU: %s, %d SMs; %s\n\n", p.name, p.multiProcessorCount,
           g_graph ? "200 launches captured in a graph, replayed (GPU time per launch)"
                   : "200 eager launches back to back (as quantshadow bench times the check)");
    Args g{};
    const u64 maxk = 14336, maxn = 14336;
    unsigned char *a, *d;
    CHECK(cudaMalloc(&a, (u64)M * maxk * 2));
    CHECK(cudaMalloc(&d, (u64)M * maxn * 2));
    CHECK(cudaMemset(a, 0x3c, (u64)M * maxk * 2));  // any bytes: nothing checks the values
    CHECK(cudaMemset(d, 0x3c, (u64)M * maxn * 2));
    CHECK(cudaMalloc(&g.out, 4096 * sizeof(float)));
    CHECK(cudaMalloc(&g.counter, 64));
    CHECK(cudaMemset(g.counter, 0, 64));
    CHECK(cudaMalloc(&g.ticket, 64));
    CHECK(cudaMemset(g.ticket, 0, 64));
    CHECK(cudaHostAlloc(&g.host, (u64)SLOTS * SLOT_WORDS * 8, cudaHostAllocMapped));
    g.a = a;
    g.d = d;
    printf("| case | us per launch |\n| --- | --- |\n");
    printf("| empty, 1 block | %.2f |\n", per_launch_us([&](cudaStream_t s) { k_empty_small<<<1, 32, 0, s>>>(); }));
    printf("| empty, 64 blocks x 256 | %.2f |\n", per_launch_us([&](cudaStream_t s) { k_empty64<<<64, 256, 0, s>>>(); }));
    printf("| empty, 8 clusters of 8, 40 KiB shared | %.2f |\n",
           per_launch_us([&](cudaStream_t s) { k_empty_cluster<<<dim3(8, 8), 256, 0, s>>>(); }));
    printf("\n| A | N x K | bytes read (KiB) | read | read+publish | cluster read+publish |\n| --- | --- | --- | --- | --- | --- |\n");
    struct Shape { const char* a; u64 ab, n, k; };
    for (Shape s : {Shape{"bf16", 2, 4096, 4096}, Shape{"e4m3", 1, 4096, 4096}, Shape{"bf16", 2, 14336, 4096},
                    Shape{"bf16", 2, 4096, 14336}, Shape{"e4m3", 1, 14336, 4096}, Shape{"e4m3", 1, 4096, 14336}}) {
        g.a_bytes = s.ab;
        g.n = s.n;
        g.k = s.k;
        const float r = per_launch_us([&](cudaStream_t s) { k_read<false><<<ROWS / 2, 256, 0, s>>>(g); });
        const float rp = per_launch_us([&](cudaStream_t s) { k_read<true><<<ROWS / 2, 256, 0, s>>>(g); });
        const float cp = per_launch_us([&](cudaStream_t s) { k_cluster_read<<<dim3(ROWS / 32, 8), 256, 0, s>>>(g); });
        printf("| %s | %llux%llu | %llu | %.2f | %.2f | %.2f |\n", s.a, s.n, s.k, ROWS * (s.k * s.ab + s.n * 2) / 1024, r,
               rp, cp);
    }
    return 0;
}
