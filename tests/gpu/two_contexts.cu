// A host with a context of its own beside the primary one, on one device (session 31): the
// shim's backend starts in the primary context at the first GEMM; a GEMM made in the other
// context must pass through untouched (skipped, with the reason "call in another context"),
// never launch the backend's kernels there, and later GEMMs in the primary context are checked.
//
//   nvcc -o /tmp/two_contexts tests/gpu/two_contexts.cu -lcublas -lcuda && /tmp/two_contexts
//
// Prints one digest line per GEMM (identical with and without the shim) and "two_contexts: ok".
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                   \
  do {                                                                          \
    int e_ = (int)(x);                                                          \
    if (e_) {                                                                   \
      fprintf(stderr, "%s:%d: %s failed: %d\n", __FILE__, __LINE__, #x, e_);    \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

static const int N = 256;

// One SGEMM of N x N x N on random inputs (seeded) in the current context; prints the digest.
static void gemm(const char *what, unsigned seed) {
  size_t bytes = sizeof(float) * N * N;
  float *h = (float *)malloc(bytes);
  float *a, *b, *d;
  CK(cudaMalloc(&a, bytes));
  CK(cudaMalloc(&b, bytes));
  CK(cudaMalloc(&d, bytes));
  srand(seed);
  for (int i = 0; i < N * N; i++) h[i] = (float)rand() / RAND_MAX - 0.5f;
  CK(cudaMemcpy(a, h, bytes, cudaMemcpyHostToDevice));
  for (int i = 0; i < N * N; i++) h[i] = (float)rand() / RAND_MAX - 0.5f;
  CK(cudaMemcpy(b, h, bytes, cudaMemcpyHostToDevice));
  cublasHandle_t handle;
  CK(cublasCreate(&handle));
  float one = 1.0f, zero = 0.0f;
  CK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, N, N, N, &one, a, N, b, N, &zero, d, N));
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
  uint64_t digest = 1469598103934665603ull;
  const unsigned char *p = (const unsigned char *)h;
  for (size_t i = 0; i < bytes; i++) digest = (digest ^ p[i]) * 1099511628211ull;
  printf("%s: %016llx\n", what, (unsigned long long)digest);
  CK(cublasDestroy(handle));
  CK(cudaFree(a));
  CK(cudaFree(b));
  CK(cudaFree(d));
  free(h);
}

int main(void) {
  CK(cudaSetDevice(0));
  gemm("primary 1", 1);
  CUdevice dev;
  CUcontext own, popped;
  CK(cuDeviceGet(&dev, 0));
#if CUDA_VERSION >= 13000
  CK(cuCtxCreate(&own, NULL, 0, dev));
#else
  CK(cuCtxCreate(&own, 0, dev));
#endif
  // cuCtxCreate makes it current: the runtime API and cuBLAS now work in it.
  gemm("own context 1", 2);
  gemm("own context 2", 3);
  CK(cuCtxPopCurrent(&popped));
  CK(cuCtxDestroy(own));
  CK(cudaSetDevice(0));
  gemm("primary 2", 4);
  printf("two_contexts: ok\n");
  return 0;
}
