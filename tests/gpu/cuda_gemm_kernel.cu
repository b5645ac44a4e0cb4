// A CUDA C++ tiled bf16 GEMM launched with cudaLaunchKernel, checked against a host reference.
// Its kernel spec is specs/cuda_gemm_example.toml. Build and run (sm_90):
//   nvcc -O2 -arch=sm_90 -o /tmp/cuda_gemm tests/gpu/cuda_gemm_kernel.cu && /tmp/cuda_gemm
//   QUANTSHADOW_SPECS=specs/cuda_gemm_example.toml quantshadow run --mode full -- /tmp/cuda_gemm
// Exit code: 0 when every shape matches the reference, 1 otherwise, 2 on a CUDA error.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define TILE 16

// D (m x n, ldd) = alpha * A (m x k, lda) * W^T, W (n x k, ldw); all row-major, fp32 accumulation.
// Parameter sizes: 8, 8, 8, 4, 4, 4, 4, 4, 4, 4.
extern "C" __global__ void qs_cuda_gemm_bf16_tiled(const __nv_bfloat16* a, const __nv_bfloat16* w,
                                                   __nv_bfloat16* d, int m, int n, int k, int lda,
                                                   int ldw, int ldd, float alpha) {
    __shared__ float as[TILE][TILE + 1];
    __shared__ float ws[TILE][TILE + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int row = blockIdx.y * TILE + ty;  // index into M
    const int col = blockIdx.x * TILE + tx;  // index into N
    const int wrow = blockIdx.x * TILE + ty; // row of W this thread loads
    float acc = 0.f;
    for (int k0 = 0; k0 < k; k0 += TILE) {
        const int kk = k0 + tx;
        as[ty][tx] = (row < m && kk < k) ? __bfloat162float(a[(size_t)row * lda + kk]) : 0.f;
        ws[ty][tx] = (wrow < n && kk < k) ? __bfloat162float(w[(size_t)wrow * ldw + kk]) : 0.f;
        __syncthreads();
#pragma unroll
        for (int t = 0; t < TILE; ++t) acc += as[ty][t] * ws[tx][t];
        __syncthreads();
    }
    if (row < m && col < n) d[(size_t)row * ldd + col] = __float2bfloat16(alpha * acc);
}

#define CHECK(x)                                                                         \
    do {                                                                                 \
        cudaError_t e_ = (x);                                                            \
        if (e_ != cudaSuccess) {                                                         \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(2);                                                                \
        }                                                                                \
    } while (0)

struct Case {
    int m, n, k, pad;  // pad: extra elements per row of A, W and D (exercises the ld parameters)
    float alpha;
};

// FNV-1a over every output byte of every case: runs with and without the shim must print the
// same digest (the shim never changes results).
static unsigned long long g_digest = 0xcbf29ce484222325ull;

static bool run_case(const Case& c, unsigned seed) {
    const int lda = c.k + c.pad, ldw = c.k + c.pad, ldd = c.n + c.pad;
    std::vector<__nv_bfloat16> ha((size_t)c.m * lda), hw((size_t)c.n * ldw), hd((size_t)c.m * ldd);
    srand(seed);
    auto rnd = [] { return (float)rand() / RAND_MAX * 2.f - 1.f; };
    for (auto& v : ha) v = __float2bfloat16(rnd());
    for (auto& v : hw) v = __float2bfloat16(rnd());
    __nv_bfloat16 *da, *dw, *dd;
    CHECK(cudaMalloc(&da, ha.size() * 2));
    CHECK(cudaMalloc(&dw, hw.size() * 2));
    CHECK(cudaMalloc(&dd, hd.size() * 2));
    CHECK(cudaMemcpy(da, ha.data(), ha.size() * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dw, hw.data(), hw.size() * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(dd, 0, hd.size() * 2));

    int m = c.m, n = c.n, k = c.k, lda_ = lda, ldw_ = ldw, ldd_ = ldd;
    float alpha = c.alpha;
    const __nv_bfloat16* a_arg = da;
    const __nv_bfloat16* w_arg = dw;
    __nv_bfloat16* d_arg = dd;
    void* args[] = {&a_arg, &w_arg, &d_arg, &m, &n, &k, &lda_, &ldw_, &ldd_, &alpha};
    dim3 block(TILE, TILE, 1), grid((n + TILE - 1) / TILE, (m + TILE - 1) / TILE, 1);
    CHECK(cudaLaunchKernel((const void*)qs_cuda_gemm_bf16_tiled, grid, block, args, 0, 0));
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(hd.data(), dd, hd.size() * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < hd.size() * 2; ++i) {
        g_digest ^= ((const unsigned char*)hd.data())[i];
        g_digest *= 0x100000001b3ull;
    }

    double max_err = 0, max_ref = 0, dot = 0, nr = 0, np = 0;
    for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
            double ref = 0;
            for (int t = 0; t < k; ++t)
                ref += (double)__bfloat162float(ha[(size_t)i * lda + t]) *
                       (double)__bfloat162float(hw[(size_t)j * ldw + t]);
            ref *= alpha;
            const double got = __bfloat162float(hd[(size_t)i * ldd + j]);
            max_err = std::fmax(max_err, std::fabs(got - ref));
            max_ref = std::fmax(max_ref, std::fabs(ref));
            dot += got * ref, nr += ref * ref, np += got * got;
        }
    const double rel = max_err / (max_ref > 0 ? max_ref : 1);
    const double cos = dot / std::sqrt(nr * np + 1e-300);
    const bool ok = rel <= 1e-2 && cos >= 0.99999;
    std::printf("%5d %5d %5d %4d %6.2f  %11.4g  %9.3g  %9.6f  %s\n", c.m, c.n, c.k, c.pad, c.alpha,
                max_err, rel, cos, ok ? "ok" : "WRONG");
    CHECK(cudaFree(da));
    CHECK(cudaFree(dw));
    CHECK(cudaFree(dd));
    return ok;
}

int main() {
    const Case cases[] = {
        {1, 256, 512, 0, 1.f}, {16, 512, 512, 0, 1.f}, {57, 1024, 768, 8, 0.5f},
        {128, 512, 1024, 0, 1.f}, {200, 384, 1000, 24, 2.f},
    };
    std::printf("CUDA tiled bf16 GEMM (qs_cuda_gemm_bf16_tiled via cudaLaunchKernel) vs host reference\n");
    std::printf("%5s %5s %5s %4s %6s  %11s  %9s  %9s  result\n", "M", "N", "K", "pad", "alpha",
                "max abs err", "rel err", "cosine");
    int good = 0, total = 0;
    for (const Case& c : cases) good += run_case(c, 1234u + total++) ? 1 : 0;
    std::printf("summary: %d/%d shapes match the reference\n", good, total);
    std::printf("digest: %016llx\n", g_digest);
    return good == total ? 0 : 1;
}
