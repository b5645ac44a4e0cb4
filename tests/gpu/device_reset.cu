// A host that ends with cudaDeviceReset (a common C++ idiom), or keeps going after it: under the
// shim the results ring must outlive the context (session 27 review: the poller read pinned
// memory the reset had freed and the process died with SIGSEGV). Also the plain program that a
// tracer preloaded before the shim wraps (tests the real-symbol lookup order on real cuBLAS).
//
//   nvcc -o device_reset tests/gpu/device_reset.cu -lcublas
//   LD_PRELOAD=.../libquantshadow.so ./device_reset [reset|noreset] [gemms after the reset]
//
// Exit 0 and "device_reset: ok" when every call returned success (before the reset) and the
// process lived 300 ms past the reset (the shim's poller runs every few ms).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int sgemms(int count) {
    const int n = 256;
    float *a, *b, *c;
    if (cudaMalloc(&a, n * n * 4) || cudaMalloc(&b, n * n * 4) || cudaMalloc(&c, n * n * 4)) return 1;
    cudaMemset(a, 0x3c, n * n * 4);  // ~0.011 in every element: nonzero, finite
    cudaMemset(b, 0x3c, n * n * 4);
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 2;
    const float one = 1.0f, zero = 0.0f;
    for (int i = 0; i < count; ++i) {
        if (cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n) != CUBLAS_STATUS_SUCCESS)
            return 3;
    }
    if (cudaDeviceSynchronize() != cudaSuccess) return 4;
    cublasDestroy(h);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
    return 0;
}

int main(int argc, char** argv) {
    const int reset = argc < 2 || strcmp(argv[1], "noreset") != 0;
    const int after = argc > 2 ? atoi(argv[2]) : 0;
    int rc = sgemms(4);
    if (rc) {
        printf("device_reset: gemms failed (%d)\n", rc);
        return rc;
    }
    if (reset) {
        if (cudaDeviceReset() != cudaSuccess) return 5;
        usleep(300 * 1000);
        // A host may go on after a reset: a new primary context, new buffers, more GEMMs.
        if (after) {
            rc = sgemms(after);
            if (rc) {
                printf("device_reset: gemms after the reset failed (%d)\n", rc);
                return 10 + rc;
            }
            usleep(100 * 1000);
        }
    }
    printf("device_reset: ok\n");
    return 0;
}
