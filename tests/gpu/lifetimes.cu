// Handles the shim remembers, ended by the host (session 28 review fixes):
//  1. a stream destroyed after its GEMMs were checked; the site's weight then changes in place
//     (the device reports it, the site re-projects and retires the old projection: before the
//     fix, behind an event recorded on the destroyed stream's dead handle);
//  2. cuBLAS handles destroyed and created again (cuBLAS may unload and reload its kernels, and
//     a later module can reuse function handles the shim has named).
// Every GEMM is bf16 cublasGemmEx on random data; D's digest after each phase is printed so
// that runs with and without the shim can be compared.
//
//   nvcc -o lifetimes tests/gpu/lifetimes.cu -lcublas
//   LD_PRELOAD=.../libquantshadow.so ./lifetimes
//
// Exit 0 and "lifetimes: ok" when every call returned success.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const int M = 64, N = 512, K = 256;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static float next_value() {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    float v = 0.25f + 0.75f * (float)(rng >> 40) / (float)(1u << 24);
    return (rng & 1) ? -v : v;
}

static void fill_random(__nv_bfloat16* device, size_t n) {
    __nv_bfloat16* host = (__nv_bfloat16*)malloc(n * sizeof *host);
    for (size_t i = 0; i < n; ++i) host[i] = __float2bfloat16(next_value());
    cudaMemcpy(device, host, n * sizeof *host, cudaMemcpyHostToDevice);
    free(host);
}

static void digest(const char* phase, const __nv_bfloat16* d) {
    size_t bytes = (size_t)M * N * sizeof(__nv_bfloat16);
    unsigned char* host = (unsigned char*)malloc(bytes);
    cudaMemcpy(host, d, bytes, cudaMemcpyDeviceToHost);
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < bytes; ++i) h = (h ^ host[i]) * 0x100000001b3ull;
    printf("%s: %016llx\n", phase, (unsigned long long)h);
    free(host);
}

// D (M x N, row-major) = A (M x K) W^T (W: N x K), as PyTorch's F.linear calls cuBLAS.
static int gemms(cublasHandle_t h, cudaStream_t s, const __nv_bfloat16* a, const __nv_bfloat16* w,
                 __nv_bfloat16* d, int count) {
    const float one = 1.0f, zero = 0.0f;
    if (cublasSetStream(h, s) != CUBLAS_STATUS_SUCCESS) return 1;
    for (int i = 0; i < count; ++i) {
        if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, w, CUDA_R_16BF, K, a, CUDA_R_16BF, K, &zero, d,
                         CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
            return 2;
    }
    return cudaStreamSynchronize(s) == cudaSuccess ? 0 : 3;
}

int main() {
    __nv_bfloat16 *a, *w, *d;
    if (cudaMalloc(&a, (size_t)M * K * 2) || cudaMalloc(&w, (size_t)N * K * 2) || cudaMalloc(&d, (size_t)M * N * 2))
        return 10;
    fill_random(a, (size_t)M * K);
    fill_random(w, (size_t)N * K);
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 11;
    cudaStream_t first, second;
    int rc = 0;
    // 1. A stream destroyed after its checked GEMMs; the weight then changes in place.
    if (cudaStreamCreateWithFlags(&first, cudaStreamNonBlocking) != cudaSuccess) return 12;
    if ((rc = gemms(h, first, a, w, d, 3))) return 20 + rc;
    digest("stream 1", d);
    if (cudaStreamCreateWithFlags(&second, cudaStreamNonBlocking) != cudaSuccess) return 13;
    if ((rc = gemms(h, second, a, w, d, 2))) return 30 + rc;
    if (cudaStreamDestroy(first) != cudaSuccess) return 14;
    // More streams come and go: a new one may get the dead handle.
    for (int i = 0; i < 4; ++i) {
        cudaStream_t s;
        if (cudaStreamCreate(&s) != cudaSuccess || cudaStreamDestroy(s) != cudaSuccess) return 15;
    }
    fill_random(w, (size_t)N * K);  // same pointer, new content
    for (int round = 0; round < 4; ++round) {
        // The poller reads the "weight changed" result between rounds; the next call re-projects.
        if ((rc = gemms(h, second, a, w, d, 2))) return 40 + rc;
        usleep(50 * 1000);
    }
    digest("weight changed", d);
    // 2. cuBLAS handles destroyed and made again, twice.
    for (int round = 0; round < 2; ++round) {
        if (cublasDestroy(h) != CUBLAS_STATUS_SUCCESS) return 16;
        if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 17;
        if ((rc = gemms(h, second, a, w, d, 3))) return 50 + rc;
    }
    digest("handles again", d);
    cublasDestroy(h);
    cudaStreamDestroy(second);
    usleep(100 * 1000);
    printf("lifetimes: ok\n");
    return 0;
}
