// Whether a snapshot copy node after each GEMV of a decode graph costs less when its edge from
// the GEMV is programmatic (the copy launches as the GEMV ends and waits with griddepcontrol.wait
// before reading), measured without the shim:
//
//     nvcc -O3 -arch=sm_90 tests/gpu/graph_pdl_copy.cu -o /tmp/graph_pdl_copy -lcublas && /tmp/graph_pdl_copy
//
// A chain of 48 bf16 GEMVs (y = W x, 4096x4096 and 14336-wide layers as in overhead_mlp.py, the
// activation ping-ponging between two buffers as PyTorch's allocator does), captured into a CUDA
// graph three ways: no copies; a 1-row copy kernel (A row and D row, like qs_sketch_snap_rows)
// after each GEMV, launched plainly; the same copy launched with programmatic stream
// serialization (captured as a programmatic edge). Events around 50 replays, median of 7 trials.
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

// One row of A (k elements) and of D (n elements), bf16, into a snapshot; grid (1, 2): two
// chunks, as the shim's lean copy launches for one row. `early`: the launch may start before the
// GEMV ahead finishes, so the reads wait for it (griddepcontrol.wait) after a tool-only prologue.
__global__ void __launch_bounds__(256) k_copy(const uint4* a, const uint4* d, uint4* out, unsigned va, unsigned vd,
                                              unsigned long long* counter) {
    __shared__ unsigned long long seen;
    if (threadIdx.x == 0) seen = atomicAdd(counter, 1ull);
    __syncthreads();
    asm volatile("griddepcontrol.wait;" ::: "memory");
    const unsigned ca = va / 2, cd = vd / 2, c = blockIdx.y;
    for (unsigned v = threadIdx.x; v < ca || v < cd; v += blockDim.x) {
        uint4 x, y;
        if (v < ca) x = a[c * ca + v];
        if (v < cd) y = d[c * cd + v];
        if (v < ca) out[c * ca + v] = x;
        if (v < cd) out[va + c * cd + v] = y;
    }
    if (threadIdx.x == 0 && blockIdx.y == 0) out[va + vd] = make_uint4((unsigned)seen, 0, 0, 0);
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
    auto forward = [&](int copies) {  // 0 none, 1 plain, 2 programmatic
        __nv_bfloat16 *in = xin, *out = x0;
        for (size_t i = 0; i < layers.size(); ++i) {
            const L l = layers[i];
            CHECK_BLAS(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, l.n, 1, l.k, &one, w[i], CUDA_R_16BF, l.k, in,
                                    CUDA_R_16BF, l.k, &zero, out, CUDA_R_16BF, l.n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
            if (copies) {
                cudaLaunchConfig_t cfg = {};
                cfg.gridDim = dim3(1, 2);
                cfg.blockDim = dim3(256);
                cfg.stream = s;
                cudaLaunchAttribute attr[1];
                attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
                attr[0].val.programmaticStreamSerializationAllowed = copies == 2;
                cfg.attrs = attr;
                cfg.numAttrs = 1;
                CHECK(cudaLaunchKernelEx(&cfg, k_copy, (const uint4*)in, (const uint4*)out, snaps + i * 4096,
                                         (unsigned)(l.k * 2 / 16), (unsigned)(l.n * 2 / 16), counter));
            }
            in = out;
            out = out == x0 ? x1 : x0;
        }
    };
    const char* names[3] = {"no copies", "copy per GEMV, plain edges", "copy per GEMV, programmatic edges"};
    float result[3][2];
    for (int round = 0; round < 2; ++round) {
        for (int v = 0; v < 3; ++v) {
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
            if (v == 2 && round == 1) {
                // One more replay over garbage activations (0xFF bytes: NaN) and empty snapshots:
                // a copy that read before its GEMV finished would keep garbage.
                CHECK(cudaMemsetAsync(x0, 0xFF, 14336 * 2, s));
                CHECK(cudaMemsetAsync(x1, 0xFF, 14336 * 2, s));
                CHECK(cudaMemsetAsync(snaps, 0, layers.size() * 64 * 1024, s));
                CHECK(cudaGraphLaunch(e, s));
                CHECK(cudaStreamSynchronize(s));
            }
            size_t nodes = 0;
            CHECK(cudaGraphGetNodes(g, nullptr, &nodes));
            if (round == 0) printf("%s: %zu nodes\n", names[v], nodes);
            CHECK(cudaGraphExecDestroy(e));
            CHECK(cudaGraphDestroy(g));
        }
    }
    // The programmatic graph's last replay (over garbage activations) against an eager run of the
    // chain with plain copies: the same snapshots, the counter word aside.
    std::vector<uint4> got(layers.size() * 4096);
    CHECK(cudaMemcpy(got.data(), snaps, got.size() * 16, cudaMemcpyDeviceToHost));
    forward(1);  // eager, plain copies, same inputs: same snapshots except the counter word
    CHECK(cudaStreamSynchronize(s));
    std::vector<uint4> want(got.size());
    CHECK(cudaMemcpy(want.data(), snaps, want.size() * 16, cudaMemcpyDeviceToHost));
    size_t differ = 0;
    for (size_t i = 0; i < layers.size(); ++i) {
        const L l = layers[i];
        const size_t words = (l.k * 2 + l.n * 2) / 16;
        for (size_t j = 0; j < words; ++j) {
            const uint4 a = got[i * 4096 + j], b = want[i * 4096 + j];
            differ += a.x != b.x || a.y != b.y || a.z != b.z || a.w != b.w;
        }
    }
    printf("\n| graph (48 bf16 GEMVs) | us per replay, round 1 | round 2 | vs no copies |\n| --- | --- | --- | --- |\n");
    for (int v = 0; v < 3; ++v)
        printf("| %s | %.1f | %.1f | %+.1f%% |\n", names[v], result[v][0], result[v][1],
               100.0 * ((result[v][0] + result[v][1]) / (result[0][0] + result[0][1]) - 1.0));
    printf("\nsnapshots of the programmatic graph against an eager plain run: %zu words differ\n", differ);
    return differ != 0;
}
