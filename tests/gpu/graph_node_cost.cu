// What one node after each GEMV of a decode graph costs, by the node's shape, without the shim:
//
//     nvcc -O3 -arch=sm_90 tests/gpu/graph_node_cost.cu -o /tmp/graph_node_cost -lcublas && /tmp/graph_node_cost
//
// The chain of 48 bf16 GEMVs of graph_pdl_copy.cu (overhead_mlp.py's layers, activations
// ping-ponging between two buffers), captured into a CUDA graph with, after each GEMV:
//   none; an empty kernel; the snapshot copy as the shim's lean copy is shaped (a 672-byte
//   parameter block, an atomic launch count whose result the header waits for, grid (1, chunks)
//   of 256 threads, one row of A and of D; without the shim's griddepcontrol.wait); the same
//   without the count; the same without the count in one block; another copy kernel with
//   32 bytes of parameters, one block and no count; cudaMemcpyAsync nodes
//   (D row; A and D rows); the shim-shaped copy on a forked stream that the next GEMV waits for
//   (the topology of the shim's joined copies: edges GEMV -> copy -> next and GEMV -> next).
//   Removing the shortcut edge GEMV -> next from the captured graph afterwards was tried:
//   cudaGraphRemoveDependencies answered "operation not supported" (driver 580, CUDA 13).
// Events around 50 replays, median of 7 trials, two rounds. In round 2 each copying variant
// replays once more into cleared snapshots, and the last GEMV's snapshot must hold its D row
// (a smoke test of the copies, not of their ordering).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <cstdlib>
#include <vector>

#define CHECK(x)                                                                               \
    do {                                                                                       \
        cudaError_t err_ = (x);                                                                \
        if (err_ != cudaSuccess) {                                                             \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_)); \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)
#define CHECK_BLAS(x)                                                    \
    do {                                                                 \
        cublasStatus_t st_ = (x);                                        \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                              \
            fprintf(stderr, "%s:%d %s: %d\n", __FILE__, __LINE__, #x, (int)st_); \
            exit(1);                                                     \
        }                                                                \
    } while (0)


struct Big {  // the size of QsSnapParams: what a graph kernel node carries per launch
    const uint4* a;
    const uint4* d;
    uint4* out;
    unsigned va, vd;
    unsigned long long* counter;
    unsigned char pad[672 - 40];
};
static_assert(sizeof(Big) == 672, "QsSnapParams size");

__global__ void k_empty() {}

// count: the launch count as the shim's graph copies take it (the header's epoch waits for it).
template <bool COUNT>
__global__ void __launch_bounds__(256) k_copy_big(const Big P) {
    __shared__ unsigned long long seen;
    if (COUNT && threadIdx.x == 0) seen = atomicAdd(P.counter, 1ull);
    const unsigned C = gridDim.y, c = blockIdx.y;
    const unsigned a0 = P.va * c / C, a1 = P.va * (c + 1) / C, d0 = P.vd * c / C, d1 = P.vd * (c + 1) / C;
    for (unsigned v = threadIdx.x; a0 + v < a1 || d0 + v < d1; v += blockDim.x) {
        uint4 x, y;
        if (a0 + v < a1) x = P.a[a0 + v];
        if (d0 + v < d1) y = P.d[d0 + v];
        if (a0 + v < a1) P.out[1 + a0 + v] = x;
        if (d0 + v < d1) P.out[1 + P.va + d0 + v] = y;
    }
    __syncthreads();
    if (threadIdx.x == 0 && c == 0) P.out[0] = make_uint4(COUNT ? (unsigned)seen : 1u, 0, 0, 0);
}

__global__ void __launch_bounds__(256) k_copy_small(const uint4* a, const uint4* d, uint4* out, unsigned va, unsigned vd) {
    for (unsigned v = threadIdx.x; v < va || v < vd; v += blockDim.x) {
        uint4 x, y;
        if (v < va) x = a[v];
        if (v < vd) y = d[v];
        if (v < va) out[1 + v] = x;
        if (v < vd) out[1 + va + v] = y;
    }
    if (threadIdx.x == 0) out[0] = make_uint4(1u, 0, 0, 0);
}

int main() {
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    printf("GPU: %s\n", p.name);
    cublasHandle_t h;
    CHECK_BLAS(cublasCreate(&h));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CHECK_BLAS(cublasSetStream(h, s));
    // overhead_mlp.py's layers: (out, in) = 4 x (4096, 4096), (14336, 4096), (4096, 14336), x 8.
    struct L { int n, k; };
    std::vector<L> layers;
    for (int r = 0; r < 8; ++r) {
        for (int i = 0; i < 4; ++i) layers.push_back({4096, 4096});
        layers.push_back({14336, 4096});
        layers.push_back({4096, 14336});
    }
    std::vector<__nv_bfloat16*> w;
    for (auto l : layers) {
        __nv_bfloat16* p_;
        CHECK(cudaMalloc(&p_, (size_t)l.n * l.k * 2));
        std::vector<__nv_bfloat16> host((size_t)l.n * l.k);
        const float a = 1.7f / sqrtf((float)l.k);  // about unit gain per layer: values neither vanish nor blow up
        for (size_t i = 0; i < host.size(); ++i) host[i] = __float2bfloat16(a * ((float)((i * 2654435761u) % 1000) / 500.0f - 1.0f));
        CHECK(cudaMemcpy(p_, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
        w.push_back(p_);
    }
    __nv_bfloat16 *xin, *x0, *x1;  // the input, then two buffers the layers' outputs alternate between
    CHECK(cudaMalloc(&xin, 14336 * 2));
    CHECK(cudaMalloc(&x0, 14336 * 2));
    CHECK(cudaMalloc(&x1, 14336 * 2));
    {
        std::vector<__nv_bfloat16> host(14336);
        for (int i = 0; i < 14336; ++i) host[i] = __float2bfloat16(0.1f * (float)(i % 13) - 0.6f);
        CHECK(cudaMemcpy(xin, host.data(), 14336 * 2, cudaMemcpyHostToDevice));
    }
    uint4* snaps;
    CHECK(cudaMalloc(&snaps, layers.size() * 64 * 1024));
    unsigned long long* counter;
    CHECK(cudaMalloc(&counter, 8));
    CHECK(cudaMemset(counter, 0, 8));
    const float one = 1.0f, zero = 0.0f;
    enum { NONE, EMPTY, SHAPED, NO_COUNT, ONE_BLOCK, SMALL, MEMCPY_D, MEMCPY_AD, BRANCH, VARIANTS };
    const char* names[VARIANTS] = {"none", "empty kernel", "copy as the shim's (672 B params, count, grid (1, chunks))",
                                   "the same without the count", "the same without the count, in one block",
                                   "another copy kernel, 32-byte params, one block, no count",
                                   "cudaMemcpyAsync of the D row", "cudaMemcpyAsync of the A and D rows",
                                   "shim's copy as a branch joined before the next GEMV (GEMV -> copy -> next, GEMV -> next)"};
    cudaStream_t side;
    CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    std::vector<cudaEvent_t> forks(layers.size()), joins(layers.size());
    for (size_t i = 0; i < layers.size(); ++i) {
        CHECK(cudaEventCreateWithFlags(&forks[i], cudaEventDisableTiming));
        CHECK(cudaEventCreateWithFlags(&joins[i], cudaEventDisableTiming));
    }
    auto forward = [&](int v) {
        __nv_bfloat16 *in = xin, *out = x0;
        for (size_t i = 0; i < layers.size(); ++i) {
            const L l = layers[i];
            CHECK_BLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, l.n, 1, l.k, &one, w[i], CUDA_R_16BF, l.k, in,
                                    CUDA_R_16BF, l.k, &zero, out, CUDA_R_16BF, l.n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
            uint4* snap = snaps + i * 4096;
            const unsigned va = l.k * 2 / 16, vd = l.n * 2 / 16;
            Big P = {};
            P.a = (const uint4*)in;
            P.d = (const uint4*)out;
            P.out = snap;
            P.va = va;
            P.vd = vd;
            P.counter = counter;
            const unsigned chunks = (std::max(l.k, l.n) + 2047) / 2048;  // snapshot.rs: slices of >= 2048 elements
            switch (v) {
                case EMPTY: k_empty<<<1, 32, 0, s>>>(); break;
                case SHAPED: k_copy_big<true><<<dim3(1, chunks), 256, 0, s>>>(P); break;
                case NO_COUNT: k_copy_big<false><<<dim3(1, chunks), 256, 0, s>>>(P); break;
                case ONE_BLOCK: k_copy_big<false><<<dim3(1, 1), 256, 0, s>>>(P); break;
                case SMALL: k_copy_small<<<1, 256, 0, s>>>((const uint4*)in, (const uint4*)out, snap, va, vd); break;
                case BRANCH:
                    // The copy on a forked stream that the next GEMV waits for: the topology the
                    // shim's joined copies have (an edge from the copy and one from the GEMV).
                    CHECK(cudaEventRecord(forks[i], s));
                    CHECK(cudaStreamWaitEvent(side, forks[i], 0));
                    k_copy_big<true><<<dim3(1, chunks), 256, 0, side>>>(P);
                    CHECK(cudaEventRecord(joins[i], side));
                    CHECK(cudaStreamWaitEvent(s, joins[i], 0));
                    break;
                case MEMCPY_D: CHECK(cudaMemcpyAsync(snap + 1 + va, out, l.n * 2, cudaMemcpyDeviceToDevice, s)); break;
                case MEMCPY_AD:
                    CHECK(cudaMemcpyAsync(snap + 1, in, l.k * 2, cudaMemcpyDeviceToDevice, s));
                    CHECK(cudaMemcpyAsync(snap + 1 + va, out, l.n * 2, cudaMemcpyDeviceToDevice, s));
                    break;
                default: break;
            }
            in = out;
            out = out == x0 ? x1 : x0;
        }
    };
    float result[VARIANTS][2];
    int bad = 0;
    for (int round = 0; round < 2; ++round) {
        for (int v = 0; v < VARIANTS; ++v) {
            cudaGraph_t g;
            cudaGraphExec_t e;
            CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
            forward(v);
            CHECK(cudaStreamEndCapture(s, &g));
            CHECK(cudaGraphInstantiate(&e, g, 0));
            for (int i = 0; i < 10; ++i) CHECK(cudaGraphLaunch(e, s));
            cudaEvent_t e0, e1;
            CHECK(cudaEventCreate(&e0));
            CHECK(cudaEventCreate(&e1));
            std::vector<float> t;
            for (int trial = 0; trial < 7; ++trial) {
                CHECK(cudaEventRecord(e0, s));
                for (int i = 0; i < 50; ++i) CHECK(cudaGraphLaunch(e, s));
                CHECK(cudaEventRecord(e1, s));
                CHECK(cudaEventSynchronize(e1));
                float ms;
                CHECK(cudaEventElapsedTime(&ms, e0, e1));
                t.push_back(ms * 1000.f / 50);
            }
            std::sort(t.begin(), t.end());
            result[v][round] = t[3];
            CHECK(cudaEventDestroy(e0));
            CHECK(cudaEventDestroy(e1));
            if (round == 1 && v != NONE && v != EMPTY) {
                // One more replay into cleared snapshots; then the last GEMV's D row against its snapshot.
                CHECK(cudaMemsetAsync(snaps, 0, layers.size() * 64 * 1024, s));
                CHECK(cudaGraphLaunch(e, s));
                CHECK(cudaStreamSynchronize(s));
                std::vector<uint4> got(layers.size() * 4096);
                CHECK(cudaMemcpy(got.data(), snaps, got.size() * 16, cudaMemcpyDeviceToHost));
                // The chain's last output is the second-to-last input's buffer: compare the last GEMV's D row.
                const L l = layers.back();
                const unsigned va = l.k * 2 / 16, vd = l.n * 2 / 16;
                std::vector<uint4> d(vd);
                CHECK(cudaMemcpy(d.data(), layers.size() % 2 ? x0 : x1, vd * 16, cudaMemcpyDeviceToHost));
                size_t differ = 0;
                for (unsigned j = 0; j < vd; ++j) {
                    const uint4 a = got[(layers.size() - 1) * 4096 + 1 + va + j], b = d[j];
                    differ += a.x != b.x || a.y != b.y || a.z != b.z || a.w != b.w;
                }
                if (differ) {
                    printf("%s: the last snapshot's D row differs in %zu of %u words\n", names[v], differ, vd);
                    bad = 1;
                }
            }
            CHECK(cudaGraphExecDestroy(e));
            CHECK(cudaGraphDestroy(g));
        }
    }
    printf("\n| after each of 48 bf16 GEMVs | us per replay, round 1 | round 2 | per GEMV vs none (us) |\n| --- | --- | --- | --- |\n");
    for (int v = 0; v < VARIANTS; ++v)
        printf("| %s | %.1f | %.1f | %+.2f |\n", names[v], result[v][0], result[v][1],
               ((result[v][0] + result[v][1]) - (result[NONE][0] + result[NONE][1])) / 2.0 / layers.size());
    return bad;
}
