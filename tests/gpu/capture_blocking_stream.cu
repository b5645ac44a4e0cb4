// Whether the shim's first-call set-up in one thread breaks a CUDA graph capture that another
// thread is recording on a *blocking* stream (created with default flags, as plain C++ engines
// do; PyTorch's streams are non-blocking). A synchronous copy on the legacy stream depends on
// every blocking stream, so one made while such a stream captures invalidates that capture.
//
//     nvcc -O2 -arch=sm_90 tests/gpu/capture_blocking_stream.cu -o /tmp/cbs -lcublas -lpthread
//     /tmp/cbs                                                        # no shim: "capture intact"
//     LD_PRELOAD=.gpu/main/libquantshadow.so QUANTSHADOW_MODE=sketch QUANTSHADOW_SAMPLE=all \
//       QUANTSHADOW_COMPILE=sync /tmp/cbs                              # must also say "capture intact"
//
// Thread B first runs a bf16 GEMM of another shape, so that the shim has started and compiled
// its kernels before any capture. Thread A then begins a thread-local capture on its blocking
// stream and records a kernel. B makes its first GEMM of a new shape on a stream of its own,
// which the shim checks: a new site's set-up (pool buffers zeroed, W_R projected), nothing else.
// A then records a second kernel and ends the capture. Exit status 0 when the capture ended,
// instantiated and replayed; 1 otherwise. Under the shim, its closing line must count the
// capture-time GEMM as checked (QUANTSHADOW_LOG=info), or the run tested nothing.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <thread>
#include <vector>

__global__ void bump(int* x) { atomicAdd(x, 1); }

int main() {
    int* counter = nullptr;
    if (cudaMalloc(&counter, sizeof(int)) != cudaSuccess) return 2;
    cudaMemset(counter, 0, sizeof(int));
    // B's GEMM inputs and cuBLAS handle are made before any capture (allocations during a
    // capture are the user's problem, not the one under test).
    const int n = 1024;
    __nv_bfloat16 *a = nullptr, *b = nullptr, *d = nullptr;
    cudaMalloc(&a, (size_t)n * n * 2);
    cudaMalloc(&b, (size_t)n * n * 2);
    cudaMalloc(&d, (size_t)n * n * 2);
    std::vector<__nv_bfloat16> host((size_t)n * n);
    for (size_t i = 0; i < host.size(); ++i) host[i] = __float2bfloat16(((float)(i * 2654435761u % 1000) / 500.0f - 1.0f) * 0.03f);
    cudaMemcpy(a, host.data(), host.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(b, host.data(), host.size() * 2, cudaMemcpyHostToDevice);
    cublasHandle_t h;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 2;
    cudaStream_t sb;
    cudaStreamCreate(&sb);  // blocking too
    cublasSetStream(h, sb);
    void* workspace = nullptr;
    cudaMalloc(&workspace, 32 << 20);
    cublasSetWorkspace(h, workspace, 32 << 20);
    const float one = 1.0f, zero = 0.0f;
    // The warm-up GEMM: 512 x 512 x 512, same formats (the shim starts and compiles here).
    cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 512, 512, 512, &one, a, CUDA_R_16BF, 512, b, CUDA_R_16BF, 512, &zero,
                 d, CUDA_R_16BF, 512, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    cudaDeviceSynchronize();

    std::atomic<int> stage{0};
    cudaError_t end_status = cudaSuccess, gemm_status = cudaSuccess;
    cudaGraph_t graph = nullptr;
    std::thread capture([&] {
        cudaStream_t sa;
        cudaStreamCreate(&sa);  // a blocking stream, as a plain C++ engine makes
        cudaStreamBeginCapture(sa, cudaStreamCaptureModeThreadLocal);
        bump<<<1, 1, 0, sa>>>(counter);
        stage = 1;
        while (stage.load() < 2) std::this_thread::yield();
        bump<<<1, 1, 0, sa>>>(counter);
        end_status = cudaStreamEndCapture(sa, &graph);
        cudaStreamDestroy(sa);
    });
    while (stage.load() < 1) std::this_thread::yield();
    const cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b,
                                           CUDA_R_16BF, n, &zero, d, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                           CUBLAS_GEMM_DEFAULT);
    gemm_status = cudaStreamSynchronize(sb);
    stage = 2;
    capture.join();
    printf("B's GEMM: cublas status %d, stream sync %s\n", (int)st, cudaGetErrorString(gemm_status));
    printf("A's capture end: %s\n", cudaGetErrorString(end_status));
    bool ok = end_status == cudaSuccess && graph != nullptr;
    if (ok) {
        cudaGraphExec_t exec;
        ok = cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess && cudaGraphLaunch(exec, 0) == cudaSuccess &&
             cudaDeviceSynchronize() == cudaSuccess;
        int seen = 0;
        cudaMemcpy(&seen, counter, sizeof(int), cudaMemcpyDeviceToHost);
        printf("replayed: %s, counter %d (want 2)\n", ok ? "yes" : "no", seen);
        ok = ok && seen == 2;
    }
    printf("%s\n", ok ? "capture intact" : "CAPTURE BROKEN");
    return ok ? 0 : 1;
}
