// GPU-side cost of the steps that end a sketch check, measured without the CPU in the way.
//
//     nvcc -O3 -arch=sm_90 tests/gpu/publish_latency.cu -o /tmp/publish_latency -lcuda
//     /tmp/publish_latency
//
// Each case is a kernel captured 200 times into one CUDA graph; the graph is replayed and timed
// with events (median of 15 replays), so the per-kernel figure is the GPU's time per launch
// (launch latency inside a graph included), not the CPU's launch rate. Cases mirror the
// finishing stages of qs_sketch_check: last-block-done counters, reads of mapped host memory,
// writing a result slot into mapped host memory with system fences.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

typedef unsigned long long u64;

#define CHECK(x)                                                                                 \
    do {                                                                                         \
        cudaError_t e = (x);                                                                     \
        if (e != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e));   \
            return 1;                                                                            \
        }                                                                                        \
    } while (0)

constexpr int SLOT_WORDS = 128;  // 1 KiB, about the size of a QsResultSlot
constexpr int SLOTS = 4096;

struct Ctx {
    u64* dev;        // device scratch (counters, head)
    u64* host;       // mapped host memory: [0] consumed, slots after
    u64* partials;   // device partials
};

__global__ void k_empty(Ctx) {}

__global__ void k_host_load(Ctx c) {
    if (threadIdx.x == 0) c.dev[8] = *(volatile u64*)&c.host[0];
}

__global__ void k_host_store_fence(Ctx c) {
    if (threadIdx.x == 0) {
        *(volatile u64*)&c.host[1] = 1;
        __threadfence_system();
    }
}

// A 1 KiB slot written by one warp, fence, ready flag: same slot every launch.
__global__ void k_slot_fixed(Ctx c) {
    if (threadIdx.x < 32) {
        u64* s = c.host + 8;
        for (int w = 1 + threadIdx.x; w < SLOT_WORDS; w += 32) s[w] = w;
        __threadfence_system();
        __syncwarp();
        if (threadIdx.x == 0) *(volatile u64*)&s[0] = 1;
    }
}

// The same through a rotating slot (a new ring slot per launch, as the real ring does).
__global__ void k_slot_rotating(Ctx c) {
    __shared__ u64 t;
    if (threadIdx.x == 0) t = atomicAdd(&c.dev[0], 1ull);
    __syncthreads();
    if (threadIdx.x < 32) {
        u64* s = c.host + 8 + (t % SLOTS) * SLOT_WORDS;
        for (int w = 1 + threadIdx.x; w < SLOT_WORDS; w += 32) s[w] = w;
        __threadfence_system();
        __syncwarp();
        if (threadIdx.x == 0) {
            __threadfence_system();
            *(volatile u64*)&s[0] = t + 1;
        }
    }
}

// The real claim: volatile head (device) + consumed (host) then CAS, then the rotating slot.
__global__ void k_claim_publish(Ctx c) {
    __shared__ u64 t;
    if (threadIdx.x == 0) {
        for (;;) {
            u64 head = *(volatile u64*)&c.dev[1];
            u64 consumed = *(volatile u64*)&c.host[0];
            (void)consumed;
            if (atomicCAS(&c.dev[1], head, head + 1) == head) {
                t = head;
                break;
            }
        }
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        u64* s = c.host + 8 + (t % SLOTS) * SLOT_WORDS;
        for (int w = 1 + threadIdx.x; w < SLOT_WORDS; w += 32) s[w] = w;
        __threadfence_system();
        __syncwarp();
        if (threadIdx.x == 0) {
            __threadfence_system();
            *(volatile u64*)&s[0] = t + 1;
        }
    }
}

// The ring since session 8: the claim reads the device's copy of `consumed` (the host's is
// read only when that copy says "full"), and the slot goes out with a hash word and no fence.
__device__ u64 mix64(u64 x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__global__ void k_cached_claim_unfenced(Ctx c) {
    __shared__ u64 t;
    if (threadIdx.x == 0) {
        for (;;) {
            u64 head = *(volatile u64*)&c.dev[1];
            u64 seen = *(volatile u64*)&c.dev[64];
            if (head - seen >= (u64)SLOTS) seen = *(volatile u64*)&c.host[0];  // never taken here
            if (atomicCAS(&c.dev[1], head, head + 1) == head) {
                t = head;
                break;
            }
        }
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        u64* s = c.host + 8 + (t % SLOTS) * SLOT_WORDS;
        u64 h = 0;
        for (int w = threadIdx.x; w < SLOT_WORDS - 1; w += 32) {
            const u64 v = w == 0 ? t + 1 : (u64)w;
            s[w] = v;
            h ^= mix64(mix64(0x51534C4F54434B31ull ^ mix64(w)) ^ v);
        }
        for (int m = 16; m > 0; m >>= 1) h ^= __shfl_xor_sync(0xffffffffu, h, m);
        if (threadIdx.x == 0) s[SLOT_WORDS - 1] = h;
    }
}

__device__ bool last_block(unsigned* counter, unsigned expected) {
    __shared__ int is_last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned prev = atomicAdd(counter, 1u);
        is_last = prev + 1 == expected;
        if (is_last) *(volatile unsigned*)counter = 0;
    }
    __syncthreads();
    if (is_last) __threadfence();
    return is_last;
}

// Every block writes 8 x 24 doubles of partials, one last-block-done, the last block reads all.
__global__ void k_one_merge(Ctx c) {
    double* p = (double*)c.partials + blockIdx.x * 192;
    if (threadIdx.x < 192) p[threadIdx.x] = threadIdx.x;
    if (!last_block((unsigned*)&c.dev[2], gridDim.x)) return;
    double s = 0;
    for (unsigned b = 0; b < gridDim.x; ++b) s += __ldcg((double*)c.partials + b * 192 + (threadIdx.x % 192));
    if (threadIdx.x == 0) c.dev[9] = (u64)s;
}

// Two chained last-block-done merges (groups of 8 blocks, then the groups).
__global__ void k_two_merges(Ctx c) {
    double* p = (double*)c.partials + blockIdx.x * 192;
    if (threadIdx.x < 192) p[threadIdx.x] = threadIdx.x;
    const unsigned group = blockIdx.x / 8, groups = gridDim.x / 8;
    if (!last_block((unsigned*)&c.dev[16] + group, 8)) return;
    double s = 0;
    for (unsigned b = 0; b < 8; ++b) s += __ldcg((double*)c.partials + (group * 8 + b) * 192 + (threadIdx.x % 192));
    ((double*)c.partials)[100000 + group * 256 + threadIdx.x] = s;
    if (!last_block((unsigned*)&c.dev[3], groups)) return;
    s = 0;
    for (unsigned g = 0; g < groups; ++g) s += __ldcg((double*)c.partials + 100000 + g * 256 + threadIdx.x);
    if (threadIdx.x == 0) c.dev[10] = (u64)s;
}

// One merge, then the rotating publish from the last block (the proposed shape).
__global__ void k_merge_publish(Ctx c) {
    double* p = (double*)c.partials + blockIdx.x * 192;
    if (threadIdx.x < 192) p[threadIdx.x] = threadIdx.x;
    if (!last_block((unsigned*)&c.dev[4], gridDim.x)) return;
    double s = 0;
    for (unsigned b = 0; b < gridDim.x; ++b) s += __ldcg((double*)c.partials + b * 192 + (threadIdx.x % 192));
    __shared__ u64 t;
    if (threadIdx.x == 0) t = atomicAdd(&c.dev[5], 1ull);
    __syncthreads();
    if (threadIdx.x < 32) {
        u64* sl = c.host + 8 + (t % SLOTS) * SLOT_WORDS;
        for (int w = 1 + threadIdx.x; w < SLOT_WORDS; w += 32) sl[w] = (u64)s + w;
        __threadfence_system();
        __syncwarp();
        if (threadIdx.x == 0) *(volatile u64*)&sl[0] = t + 1;
    }
}

typedef void (*Kernel)(Ctx);

static int time_case(const char* name, Kernel k, int grid, Ctx c, cudaStream_t s) {
    const int per_graph = 200;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < per_graph; ++i) k<<<grid, 256, 0, s>>>(c);
    CHECK(cudaStreamEndCapture(s, &g));
    CHECK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t a, b;
    CHECK(cudaEventCreate(&a));
    CHECK(cudaEventCreate(&b));
    for (int w = 0; w < 3; ++w) CHECK(cudaGraphLaunch(ge, s));
    std::vector<float> us;
    for (int r = 0; r < 15; ++r) {
        CHECK(cudaEventRecord(a, s));
        CHECK(cudaGraphLaunch(ge, s));
        CHECK(cudaEventRecord(b, s));
        CHECK(cudaEventSynchronize(b));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, a, b));
        us.push_back(ms * 1000.0f / per_graph);
    }
    std::sort(us.begin(), us.end());
    printf("| %s | %d | %.2f | %.2f |\n", name, grid, us[us.size() / 2], us.front());
    CHECK(cudaGraphExecDestroy(ge));
    CHECK(cudaGraphDestroy(g));
    return 0;
}

int main() {
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("GPU: %s\n\n", prop.name);
    Ctx c;
    CHECK(cudaMalloc(&c.dev, 4096));
    CHECK(cudaMemset(c.dev, 0, 4096));
    CHECK(cudaMalloc(&c.partials, 8 << 20));
    CHECK(cudaMemset(c.partials, 0, 8 << 20));
    CHECK(cudaHostAlloc(&c.host, 64 + (size_t)SLOTS * SLOT_WORDS * 8 + 4096, cudaHostAllocMapped));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    printf("| kernel (200 per graph, replayed) | blocks | median us per kernel | min |\n| --- | --- | --- | --- |\n");
    int rc = 0;
    rc |= time_case("empty", k_empty, 1, c, s);
    rc |= time_case("empty", k_empty, 64, c, s);
    rc |= time_case("empty", k_empty, 264, c, s);
    rc |= time_case("load 8 B of mapped host memory", k_host_load, 1, c, s);
    rc |= time_case("store 8 B to host + fence.sys", k_host_store_fence, 1, c, s);
    rc |= time_case("1 KiB slot, same slot, fence.sys", k_slot_fixed, 1, c, s);
    rc |= time_case("1 KiB slot, rotating, 2 fence.sys", k_slot_rotating, 1, c, s);
    rc |= time_case("claim (host read + CAS) + rotating slot", k_claim_publish, 1, c, s);
    rc |= time_case("cached claim (CAS) + rotating slot, hash, no fence", k_cached_claim_unfenced, 1, c, s);
    rc |= time_case("one last-block merge", k_one_merge, 32, c, s);
    rc |= time_case("one last-block merge", k_one_merge, 264, c, s);
    rc |= time_case("two chained merges", k_two_merges, 32, c, s);
    rc |= time_case("two chained merges", k_two_merges, 264, c, s);
    rc |= time_case("one merge + rotating slot", k_merge_publish, 32, c, s);
    rc |= time_case("one merge + rotating slot", k_merge_publish, 264, c, s);
    return rc;
}
