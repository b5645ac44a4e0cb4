//! The one declarative list of interposed entry points.
//!
//! `for_each_hook!(callback)` hands the whole list to `callback`. The runtime expands it into
//! one module per symbol (argument struct, real-pointer slot, guarded entry), the shim expands
//! it into its `#[no_mangle]` exports, and the name table (`HOOK_NAMES`, checked against
//! `nm -D` of the built library, and reused by the dlsym hook) comes from the same list.
//!
//! Each line: `symbol: handler, missing = status, (parameters)`. `handler` is a function
//! `fn(&Args, Option<Real>) -> i32` under `crate::intercept`; `missing` is the vendor's error
//! status returned when the real symbol cannot be found (the shim never calls a null pointer).
//! Every hooked function returns a 32-bit status enum. Types may name `$crate::...` (resolved
//! to the runtime in both expansions).

/// Calls `$callback! { ... }` with every hook of the interposer.
#[macro_export]
macro_rules! for_each_hook {
    ($callback:ident) => {
        $callback! {
            // ---- NVIDIA cuBLASLt ------------------------------------------------------------
            cublasLtMatmul: cublaslt::matmul, missing = 1, (handle: *mut c_void, desc: *mut c_void,
                alpha: *const c_void, a: *const c_void, a_desc: *mut c_void, b: *const c_void,
                b_desc: *mut c_void, beta: *const c_void, c: *const c_void, c_desc: *mut c_void,
                d: *mut c_void, d_desc: *mut c_void, algo: *const c_void, workspace: *mut c_void,
                workspace_bytes: usize, stream: *mut c_void);
            // ---- NVIDIA cuBLAS --------------------------------------------------------------
            cublasSetWorkspace_v2: cublas::set_workspace, missing = 1, (handle: *mut c_void,
                workspace: *mut c_void, bytes: usize);
            cublasGemmEx: cublas::gemm_ex, missing = 1, (handle: *mut c_void, trans_a: i32, trans_b: i32,
                m: i32, n: i32, k: i32, alpha: *const c_void, a: *const c_void, a_type: i32, lda: i32,
                b: *const c_void, b_type: i32, ldb: i32, beta: *const c_void, c: *mut c_void, c_type: i32,
                ldc: i32, compute: i32, algo: i32);
            cublasGemmEx_64: cublas::gemm_ex_64, missing = 1, (handle: *mut c_void, trans_a: i32, trans_b: i32,
                m: i64, n: i64, k: i64, alpha: *const c_void, a: *const c_void, a_type: i32, lda: i64,
                b: *const c_void, b_type: i32, ldb: i64, beta: *const c_void, c: *mut c_void, c_type: i32,
                ldc: i64, compute: i32, algo: i32);
            cublasGemmStridedBatchedEx: cublas::gemm_strided_batched_ex, missing = 1, (handle: *mut c_void,
                trans_a: i32, trans_b: i32, m: i32, n: i32, k: i32, alpha: *const c_void, a: *const c_void,
                a_type: i32, lda: i32, stride_a: i64, b: *const c_void, b_type: i32, ldb: i32, stride_b: i64,
                beta: *const c_void, c: *mut c_void, c_type: i32, ldc: i32, stride_c: i64, batch: i32,
                compute: i32, algo: i32);
            cublasGemmStridedBatchedEx_64: cublas::gemm_strided_batched_ex_64, missing = 1, (handle: *mut c_void,
                trans_a: i32, trans_b: i32, m: i64, n: i64, k: i64, alpha: *const c_void, a: *const c_void,
                a_type: i32, lda: i64, stride_a: i64, b: *const c_void, b_type: i32, ldb: i64, stride_b: i64,
                beta: *const c_void, c: *mut c_void, c_type: i32, ldc: i64, stride_c: i64, batch: i64,
                compute: i32, algo: i32);
            cublasGemmBatchedEx: cublas::gemm_batched_ex, missing = 1, (handle: *mut c_void, trans_a: i32,
                trans_b: i32, m: i32, n: i32, k: i32, alpha: *const c_void, a_array: *const *const c_void,
                a_type: i32, lda: i32, b_array: *const *const c_void, b_type: i32, ldb: i32, beta: *const c_void,
                c_array: *const *mut c_void, c_type: i32, ldc: i32, batch: i32, compute: i32, algo: i32);
            cublasGemmBatchedEx_64: cublas::gemm_batched_ex_64, missing = 1, (handle: *mut c_void, trans_a: i32,
                trans_b: i32, m: i64, n: i64, k: i64, alpha: *const c_void, a_array: *const *const c_void,
                a_type: i32, lda: i64, b_array: *const *const c_void, b_type: i32, ldb: i64, beta: *const c_void,
                c_array: *const *mut c_void, c_type: i32, ldc: i64, batch: i64, compute: i32, algo: i32);
            cublasSgemm_v2: cublas::sgemm, missing = 1, (handle: *mut c_void, trans_a: i32, trans_b: i32,
                m: i32, n: i32, k: i32, alpha: *const f32, a: *const f32, lda: i32, b: *const f32, ldb: i32,
                beta: *const f32, c: *mut f32, ldc: i32);
            cublasSgemm_v2_64: cublas::sgemm_64, missing = 1, (handle: *mut c_void, trans_a: i32, trans_b: i32,
                m: i64, n: i64, k: i64, alpha: *const f32, a: *const f32, lda: i64, b: *const f32, ldb: i64,
                beta: *const f32, c: *mut f32, ldc: i64);
            cublasHgemm: cublas::hgemm, missing = 1, (handle: *mut c_void, trans_a: i32, trans_b: i32,
                m: i32, n: i32, k: i32, alpha: *const u16, a: *const u16, lda: i32, b: *const u16, ldb: i32,
                beta: *const u16, c: *mut u16, ldc: i32);
            cublasHgemm_64: cublas::hgemm_64, missing = 1, (handle: *mut c_void, trans_a: i32, trans_b: i32,
                m: i64, n: i64, k: i64, alpha: *const u16, a: *const u16, lda: i64, b: *const u16, ldb: i64,
                beta: *const u16, c: *mut u16, ldc: i64);
            cublasSgemmStridedBatched: cublas::sgemm_strided_batched, missing = 1, (handle: *mut c_void,
                trans_a: i32, trans_b: i32, m: i32, n: i32, k: i32, alpha: *const f32, a: *const f32, lda: i32,
                stride_a: i64, b: *const f32, ldb: i32, stride_b: i64, beta: *const f32, c: *mut f32, ldc: i32,
                stride_c: i64, batch: i32);
            cublasSgemmStridedBatched_64: cublas::sgemm_strided_batched_64, missing = 1, (handle: *mut c_void,
                trans_a: i32, trans_b: i32, m: i64, n: i64, k: i64, alpha: *const f32, a: *const f32, lda: i64,
                stride_a: i64, b: *const f32, ldb: i64, stride_b: i64, beta: *const f32, c: *mut f32, ldc: i64,
                stride_c: i64, batch: i64);
            cublasHgemmStridedBatched: cublas::hgemm_strided_batched, missing = 1, (handle: *mut c_void,
                trans_a: i32, trans_b: i32, m: i32, n: i32, k: i32, alpha: *const u16, a: *const u16, lda: i32,
                stride_a: i64, b: *const u16, ldb: i32, stride_b: i64, beta: *const u16, c: *mut u16, ldc: i32,
                stride_c: i64, batch: i32);
            cublasHgemmStridedBatched_64: cublas::hgemm_strided_batched_64, missing = 1, (handle: *mut c_void,
                trans_a: i32, trans_b: i32, m: i64, n: i64, k: i64, alpha: *const u16, a: *const u16, lda: i64,
                stride_a: i64, b: *const u16, ldb: i64, stride_b: i64, beta: *const u16, c: *mut u16, ldc: i64,
                stride_c: i64, batch: i64);
            // ---- AMD hipBLASLt --------------------------------------------------------------
            hipblasLtMatmul: hipblaslt::matmul, missing = 1, (handle: *mut c_void, desc: *mut c_void,
                alpha: *const c_void, a: *const c_void, a_desc: *mut c_void, b: *const c_void,
                b_desc: *mut c_void, beta: *const c_void, c: *const c_void, c_desc: *mut c_void,
                d: *mut c_void, d_desc: *mut c_void, algo: *const c_void, workspace: *mut c_void,
                workspace_bytes: usize, stream: *mut c_void);
            // hipBLASLt has no compute/scale type attribute: learn them where the desc is made.
            hipblasLtMatmulDescCreate: hipblaslt::desc_create, missing = 1, (desc_out: *mut *mut c_void,
                compute: i32, scale_type: i32);
            hipblasLtMatmulDescDestroy: hipblaslt::desc_destroy, missing = 1, (desc: *mut c_void);
            // ---- AMD hipBLAS (the _v2 symbols take hipDataType / hipblasComputeType_t) ---------
            hipblasSetWorkspace: hipblas::set_workspace, missing = 1, (handle: *mut c_void,
                workspace: *mut c_void, bytes: usize);
            hipblasGemmEx: hipblas::gemm_ex, missing = 1, (handle: *mut c_void, trans_a: i32, trans_b: i32,
                m: i32, n: i32, k: i32, alpha: *const c_void, a: *const c_void, a_type: i32, lda: i32,
                b: *const c_void, b_type: i32, ldb: i32, beta: *const c_void, c: *mut c_void, c_type: i32,
                ldc: i32, compute: i32, algo: i32);
            hipblasGemmEx_v2: hipblas::gemm_ex_v2, missing = 1, (handle: *mut c_void, trans_a: i32, trans_b: i32,
                m: i32, n: i32, k: i32, alpha: *const c_void, a: *const c_void, a_type: i32, lda: i32,
                b: *const c_void, b_type: i32, ldb: i32, beta: *const c_void, c: *mut c_void, c_type: i32,
                ldc: i32, compute: i32, algo: i32);
            hipblasGemmStridedBatchedEx: hipblas::gemm_strided_batched_ex, missing = 1, (handle: *mut c_void,
                trans_a: i32, trans_b: i32, m: i32, n: i32, k: i32, alpha: *const c_void, a: *const c_void,
                a_type: i32, lda: i32, stride_a: i64, b: *const c_void, b_type: i32, ldb: i32, stride_b: i64,
                beta: *const c_void, c: *mut c_void, c_type: i32, ldc: i32, stride_c: i64, batch: i32,
                compute: i32, algo: i32);
            hipblasGemmStridedBatchedEx_v2: hipblas::gemm_strided_batched_ex_v2, missing = 1, (handle: *mut c_void,
                trans_a: i32, trans_b: i32, m: i32, n: i32, k: i32, alpha: *const c_void, a: *const c_void,
                a_type: i32, lda: i32, stride_a: i64, b: *const c_void, b_type: i32, ldb: i32, stride_b: i64,
                beta: *const c_void, c: *mut c_void, c_type: i32, ldc: i32, stride_c: i64, batch: i32,
                compute: i32, algo: i32);
            // ---- AMD rocBLAS (separate C and D) ---------------------------------------------
            rocblas_set_workspace: rocblas::set_workspace, missing = 6, (handle: *mut c_void,
                workspace: *mut c_void, bytes: usize);
            rocblas_gemm_ex: rocblas::gemm_ex, missing = 6, (handle: *mut c_void, trans_a: i32, trans_b: i32,
                m: i32, n: i32, k: i32, alpha: *const c_void, a: *const c_void, a_type: i32, lda: i32,
                b: *const c_void, b_type: i32, ldb: i32, beta: *const c_void, c: *const c_void, c_type: i32,
                ldc: i32, d: *mut c_void, d_type: i32, ldd: i32, compute: i32, algo: i32, solution_index: i32,
                flags: u32);
            rocblas_gemm_strided_batched_ex: rocblas::gemm_strided_batched_ex, missing = 6, (handle: *mut c_void,
                trans_a: i32, trans_b: i32, m: i32, n: i32, k: i32, alpha: *const c_void, a: *const c_void,
                a_type: i32, lda: i32, stride_a: i64, b: *const c_void, b_type: i32, ldb: i32, stride_b: i64,
                beta: *const c_void, c: *const c_void, c_type: i32, ldc: i32, stride_c: i64, d: *mut c_void,
                d_type: i32, ldd: i32, stride_d: i64, batch: i32, compute: i32, algo: i32, solution_index: i32,
                flags: u32);
            rocblas_gemm_ex3: rocblas::gemm_ex3, missing = 6, (handle: *mut c_void, trans_a: i32, trans_b: i32,
                m: i32, n: i32, k: i32, alpha: *const c_void, a: *const c_void, a_type: i32, lda: i32,
                b: *const c_void, b_type: i32, ldb: i32, beta: *const c_void, c: *const c_void, c_type: i32,
                ldc: i32, d: *mut c_void, d_type: i32, ldd: i32, compute: i32, algo: i32, solution_index: i32,
                flags: u32);
            // ---- Driver entry-point lookup (the CUDA runtime reaches the driver through it) --
            // A lookup of a hooked name returns our export; see `intercept::dlsym`.
            cuGetProcAddress: launch::get_proc_address, missing = 500, (symbol: *const std::ffi::c_char,
                pfn: *mut *mut c_void, cuda_version: i32, flags: u64);
            cuGetProcAddress_v2: launch::get_proc_address_v2, missing = 500, (symbol: *const std::ffi::c_char,
                pfn: *mut *mut c_void, cuda_version: i32, flags: u64, symbol_status: *mut i32);
            // ---- CUDA graphs (`intercept::graph`): per-replay sampling chosen at launch ------
            // The runtime's cudaGraphInstantiate asks the driver for "cuGraphInstantiate", which
            // answers with cuGraphInstantiateWithFlags (see `launch::LOOKUP_ALIASES`).
            cuGraphInstantiateWithFlags: graph::instantiate_with_flags, missing = 500, (exec_out: *mut *mut c_void,
                graph: *mut c_void, flags: u64);
            cuGraphInstantiateWithParams: graph::instantiate_with_params, missing = 500, (
                exec_out: *mut *mut c_void, graph: *mut c_void, params: *mut c_void);
            cuGraphInstantiateWithParams_ptsz: graph::instantiate_with_params_ptsz, missing = 500, (
                exec_out: *mut *mut c_void, graph: *mut c_void, params: *mut c_void);
            cuGraphLaunch: graph::launch, missing = 500, (exec: *mut c_void, stream: *mut c_void);
            cuGraphLaunch_ptsz: graph::launch_ptsz, missing = 500, (exec: *mut c_void, stream: *mut c_void);
            // The end of a capture: checks deferred to it are added after its last work.
            cuStreamEndCapture: graph::end_capture, missing = 500, (stream: *mut c_void,
                graph_out: *mut *mut c_void);
            cuStreamEndCapture_ptsz: graph::end_capture_ptsz, missing = 500, (stream: *mut c_void,
                graph_out: *mut *mut c_void);
            cuGraphExecDestroy: graph::exec_destroy, missing = 500, (exec: *mut c_void);
            cuGraphDestroy: graph::graph_destroy, missing = 500, (graph: *mut c_void);
            // Changes to an executable after instantiation: the selection is dropped first.
            cuGraphExecUpdate: graph::exec_update_v1, missing = 500, (exec: *mut c_void, graph: *mut c_void,
                error_node: *mut *mut c_void, result: *mut i32);
            cuGraphExecUpdate_v2: graph::exec_update, missing = 500, (exec: *mut c_void, graph: *mut c_void,
                info: *mut c_void);
            cuGraphExecKernelNodeSetParams: graph::exec_kernel_params_v1, missing = 500, (exec: *mut c_void,
                node: *mut c_void, params: *const c_void);
            cuGraphExecKernelNodeSetParams_v2: graph::exec_kernel_params, missing = 500, (exec: *mut c_void,
                node: *mut c_void, params: *const c_void);
            cuGraphExecMemcpyNodeSetParams: graph::exec_memcpy_params, missing = 500, (exec: *mut c_void,
                node: *mut c_void, params: *const c_void, ctx: *mut c_void);
            cuGraphExecMemsetNodeSetParams: graph::exec_memset_params, missing = 500, (exec: *mut c_void,
                node: *mut c_void, params: *const c_void, ctx: *mut c_void);
            cuGraphExecHostNodeSetParams: graph::exec_host_params, missing = 500, (exec: *mut c_void,
                node: *mut c_void, params: *const c_void);
            cuGraphExecChildGraphNodeSetParams: graph::exec_child_params, missing = 500, (exec: *mut c_void,
                node: *mut c_void, child: *mut c_void);
            cuGraphExecEventRecordNodeSetEvent: graph::exec_record_event, missing = 500, (exec: *mut c_void,
                node: *mut c_void, event: *mut c_void);
            cuGraphExecEventWaitNodeSetEvent: graph::exec_wait_event, missing = 500, (exec: *mut c_void,
                node: *mut c_void, event: *mut c_void);
            cuGraphExecExternalSemaphoresSignalNodeSetParams: graph::exec_sema_signal, missing = 500, (
                exec: *mut c_void, node: *mut c_void, params: *const c_void);
            cuGraphExecExternalSemaphoresWaitNodeSetParams: graph::exec_sema_wait, missing = 500, (
                exec: *mut c_void, node: *mut c_void, params: *const c_void);
            cuGraphExecBatchMemOpNodeSetParams: graph::exec_batch_mem_op, missing = 500, (exec: *mut c_void,
                node: *mut c_void, params: *const c_void);
            cuGraphExecNodeSetParams: graph::exec_node_params, missing = 500, (exec: *mut c_void,
                node: *mut c_void, params: *mut c_void);
            cuGraphNodeSetEnabled: graph::exec_node_enabled, missing = 500, (exec: *mut c_void,
                node: *mut c_void, enabled: u32);
            // ---- Object lifetimes (`intercept::lifetime`): handles the shim remembers --------
            // A destroyed stream's handle must never reach the driver again; an unloaded
            // module's function handles may be reused by other kernels.
            cuStreamDestroy: lifetime::cu_stream_destroy, missing = 500, (stream: *mut c_void);
            cuStreamDestroy_v2: lifetime::cu_stream_destroy_v2, missing = 500, (stream: *mut c_void);
            cuModuleUnload: lifetime::cu_module_unload, missing = 500, (module: *mut c_void);
            cuLibraryUnload: lifetime::cu_library_unload, missing = 500, (library: *mut c_void);
            hipStreamDestroy: lifetime::hip_stream_destroy, missing = 500, (stream: *mut c_void);
            hipModuleUnload: lifetime::hip_module_unload, missing = 500, (module: *mut c_void);
            // A device reset (cudaDeviceReset reaches the driver's primary-context reset)
            // destroys the context the shim's backend for that device was made in.
            cuDevicePrimaryCtxReset: lifetime::primary_ctx_reset, missing = 500, (device: i32);
            cuDevicePrimaryCtxReset_v2: lifetime::primary_ctx_reset_v2, missing = 500, (device: i32);
            hipDeviceReset: lifetime::hip_device_reset, missing = 500, ();
            // A context the host made itself (driver API) and destroys.
            cuCtxDestroy: lifetime::cu_ctx_destroy, missing = 500, (ctx: *mut c_void);
            cuCtxDestroy_v2: lifetime::cu_ctx_destroy_v2, missing = 500, (ctx: *mut c_void);
            // The last release of a primary context destroys it (a driver-API host, or the CUDA
            // runtime's own teardown at exit).
            cuDevicePrimaryCtxRelease: lifetime::primary_ctx_release, missing = 500, (device: i32);
            cuDevicePrimaryCtxRelease_v2: lifetime::primary_ctx_release_v2, missing = 500, (device: i32);
            // Another stream may wait for an event recorded on a capturing stream: a snapshot
            // copy pending there is captured before the event (`engine::copy_beside`).
            cuEventRecord: graph::event_record, missing = 500, (event: *mut c_void, stream: *mut c_void);
            cuEventRecord_ptsz: graph::event_record_ptsz, missing = 500, (event: *mut c_void,
                stream: *mut c_void);
            cuEventRecordWithFlags: graph::event_record_with_flags, missing = 500, (event: *mut c_void,
                stream: *mut c_void, flags: u32);
            cuEventRecordWithFlags_ptsz: graph::event_record_with_flags_ptsz, missing = 500, (
                event: *mut c_void, stream: *mut c_void, flags: u32);
            // ---- Kernel launches (`intercept::launch`); `_ptsz`: per-thread default stream ------
            cuLaunchKernel: launch::cu_launch_kernel, missing = 500, (f: *mut c_void, grid_x: u32,
                grid_y: u32, grid_z: u32, block_x: u32, block_y: u32, block_z: u32, shared_bytes: u32,
                stream: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void);
            cuLaunchKernel_ptsz: launch::cu_launch_kernel_ptsz, missing = 500, (f: *mut c_void, grid_x: u32,
                grid_y: u32, grid_z: u32, block_x: u32, block_y: u32, block_z: u32, shared_bytes: u32,
                stream: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void);
            cuLaunchKernelEx: launch::cu_launch_kernel_ex, missing = 500, (
                config: *const $crate::intercept::launch::CuLaunchConfig, f: *mut c_void,
                params: *mut *mut c_void, extra: *mut *mut c_void);
            cuLaunchKernelEx_ptsz: launch::cu_launch_kernel_ex_ptsz, missing = 500, (
                config: *const $crate::intercept::launch::CuLaunchConfig, f: *mut c_void,
                params: *mut *mut c_void, extra: *mut *mut c_void);
            cudaLaunchKernel: launch::cuda_launch_kernel, missing = 500, (func: *const c_void,
                grid: $crate::intercept::launch::Dim3, block: $crate::intercept::launch::Dim3,
                args: *mut *mut c_void, shared_bytes: usize, stream: *mut c_void);
            cudaLaunchKernel_ptsz: launch::cuda_launch_kernel_ptsz, missing = 500, (func: *const c_void,
                grid: $crate::intercept::launch::Dim3, block: $crate::intercept::launch::Dim3,
                args: *mut *mut c_void, shared_bytes: usize, stream: *mut c_void);
            cudaLaunchKernelExC: launch::cuda_launch_kernel_ex_c, missing = 500, (
                config: *const $crate::intercept::launch::CudaLaunchConfig, func: *const c_void,
                args: *mut *mut c_void);
            cudaLaunchKernelExC_ptsz: launch::cuda_launch_kernel_ex_c_ptsz, missing = 500, (
                config: *const $crate::intercept::launch::CudaLaunchConfig, func: *const c_void,
                args: *mut *mut c_void);
            hipModuleLaunchKernel: launch::hip_module_launch_kernel, missing = 500, (f: *mut c_void,
                grid_x: u32, grid_y: u32, grid_z: u32, block_x: u32, block_y: u32, block_z: u32,
                shared_bytes: u32, stream: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void);
            // Sizes in work-items (threads), not blocks.
            hipExtModuleLaunchKernel: launch::hip_ext_module_launch_kernel, missing = 500, (f: *mut c_void,
                global_x: u32, global_y: u32, global_z: u32, local_x: u32, local_y: u32, local_z: u32,
                shared_bytes: usize, stream: *mut c_void, params: *mut *mut c_void, extra: *mut *mut c_void,
                start_event: *mut c_void, stop_event: *mut c_void, flags: u32);
            hipDrvLaunchKernelEx: launch::hip_drv_launch_kernel_ex, missing = 500, (
                config: *const $crate::intercept::launch::CuLaunchConfig, f: *mut c_void,
                params: *mut *mut c_void, extra: *mut *mut c_void);
            hipLaunchKernel: launch::hip_launch_kernel, missing = 500, (func: *const c_void,
                grid: $crate::intercept::launch::Dim3, block: $crate::intercept::launch::Dim3,
                args: *mut *mut c_void, shared_bytes: usize, stream: *mut c_void);
        }
    };
}
