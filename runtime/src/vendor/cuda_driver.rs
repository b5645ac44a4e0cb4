//! CUDA driver API (`cuda.h`) enums, flags and sizes the CUDA runtime layer (`device::cuda`)
//! and the shim's `cuGetProcAddress` wrapper use.
//!
//! Source: CUDA 13.0.88 `include/cuda.h` (H200 host, `CUDA_VERSION 13000`). All of these predate
//! CUDA 12.0, the oldest toolkit the tables describe.

use super::abi_table;

abi_table! {
    /// `CUresult` codes the runtime layer tests for or returns.
    pub const CU_RESULT: [i32 => ()] = {
        enum: "CUresult", library: CudaToolkit, header: "cuda.h";
        CUDA_SUCCESS = 0,
        CUDA_ERROR_INVALID_VALUE = 1,
        CUDA_ERROR_OUT_OF_MEMORY = 2,
        CUDA_ERROR_NOT_INITIALIZED = 3,
        CUDA_ERROR_DEINITIALIZED = 4,
        CUDA_ERROR_NO_DEVICE = 100,
        CUDA_ERROR_INVALID_CONTEXT = 201,
        CUDA_ERROR_INVALID_HANDLE = 400,
        CUDA_ERROR_NOT_FOUND = 500,
        /// `cuEventQuery`/`cuStreamQuery`: work still pending (not an error).
        CUDA_ERROR_NOT_READY = 600,
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
    };
}

abi_table! {
    /// `CUstreamCaptureStatus` (`cuStreamIsCapturing`, `cuStreamGetCaptureInfo`).
    pub const CU_STREAM_CAPTURE_STATUS: [i32 => ()] = {
        enum: "CUstreamCaptureStatus", library: CudaToolkit, header: "cuda.h";
        CU_STREAM_CAPTURE_STATUS_NONE = 0,
        CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
        CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2,
    };
}

abi_table! {
    /// `CUstreamCaptureMode` (`cuThreadExchangeStreamCaptureMode`).
    pub const CU_STREAM_CAPTURE_MODE: [i32 => ()] = {
        enum: "CUstreamCaptureMode", library: CudaToolkit, header: "cuda.h";
        CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
        CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
        CU_STREAM_CAPTURE_MODE_RELAXED = 2,
    };
}

abi_table! {
    /// `CUstream_flags` (`cuStreamCreateWithPriority`).
    pub const CU_STREAM_FLAGS: [u32 => ()] = {
        enum: "CUstream_flags", library: CudaToolkit, header: "cuda.h";
        CU_STREAM_DEFAULT = 0x0,
        CU_STREAM_NON_BLOCKING = 0x1,
    };
}

abi_table! {
    /// `CUevent_flags` (`cuEventCreate`).
    pub const CU_EVENT_FLAGS: [u32 => ()] = {
        enum: "CUevent_flags", library: CudaToolkit, header: "cuda.h";
        CU_EVENT_DEFAULT = 0x0,
        CU_EVENT_BLOCKING_SYNC = 0x1,
        CU_EVENT_DISABLE_TIMING = 0x2,
    };
}

abi_table! {
    /// `cuMemHostAlloc` flags (macros, not an enum).
    pub const CU_MEMHOSTALLOC: [u32 => ()] = {
        enum: "CU_MEMHOSTALLOC_*", library: CudaToolkit, header: "cuda.h";
        CU_MEMHOSTALLOC_PORTABLE = 0x01,
        CU_MEMHOSTALLOC_DEVICEMAP = 0x02,
        CU_MEMHOSTALLOC_WRITECOMBINED = 0x04,
    };
}

abi_table! {
    /// `CUjit_option` keys passed to `cuModuleLoadDataEx`.
    pub const CU_JIT_OPTION: [i32 => ()] = {
        enum: "CUjit_option", library: CudaToolkit, header: "cuda.h";
        CU_JIT_MAX_REGISTERS = 0,
        CU_JIT_THREADS_PER_BLOCK = 1,
        CU_JIT_WALL_TIME = 2,
        CU_JIT_INFO_LOG_BUFFER = 3,
        CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES = 4,
        CU_JIT_ERROR_LOG_BUFFER = 5,
        CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
        CU_JIT_OPTIMIZATION_LEVEL = 7,
        CU_JIT_TARGET = 9,
        CU_JIT_LOG_VERBOSE = 12,
        CU_JIT_GENERATE_LINE_INFO = 13,
    };
}

abi_table! {
    /// `CUdevice_attribute` values read by `current_device`.
    pub const CU_DEVICE_ATTRIBUTE: [i32 => ()] = {
        enum: "CUdevice_attribute", library: CudaToolkit, header: "cuda.h";
        CU_DEVICE_ATTRIBUTE_WARP_SIZE = 10,
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
        CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY = 19,
        CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING = 41,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    };
}

abi_table! {
    /// `CUpointer_attribute` (`cuPointerGetAttribute`: is alpha a host or a device pointer?).
    pub const CU_POINTER_ATTRIBUTE: [i32 => ()] = {
        enum: "CUpointer_attribute", library: CudaToolkit, header: "cuda.h";
        CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
    };
}

abi_table! {
    /// `CUmemorytype` (value of `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`).
    pub const CU_MEMORYTYPE: [u32 => ()] = {
        enum: "CUmemorytype", library: CudaToolkit, header: "cuda.h";
        CU_MEMORYTYPE_HOST = 0x01,
        CU_MEMORYTYPE_DEVICE = 0x02,
        CU_MEMORYTYPE_ARRAY = 0x03,
        CU_MEMORYTYPE_UNIFIED = 0x04,
    };
}

abi_table! {
    /// `CUdriverProcAddress_flags` (`cuGetProcAddress` flags argument).
    pub const CU_GET_PROC_ADDRESS_FLAGS: [u64 => ()] = {
        enum: "CUdriverProcAddress_flags", library: CudaToolkit, header: "cuda.h";
        CU_GET_PROC_ADDRESS_DEFAULT = 0,
        CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0,
        CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1 << 1,
    };
}

abi_table! {
    /// `CUdriverProcAddressQueryResult` (`cuGetProcAddress_v2`'s `symbolStatus`).
    pub const CU_GET_PROC_ADDRESS_RESULT: [i32 => ()] = {
        enum: "CUdriverProcAddressQueryResult", library: CudaToolkit, header: "cuda.h";
        CU_GET_PROC_ADDRESS_SUCCESS = 0,
        CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
        CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
    };
}

abi_table! {
    /// Sizes of the driver's scalar handle types on a 64-bit host.
    pub const CUDA_DRIVER_SIZES: [usize => ()] = {
        enum: "sizeof", library: CudaToolkit, header: "cuda.h";
        /// `typedef unsigned long long CUdeviceptr_v2` on 64-bit hosts.
        SIZEOF_CUDEVICEPTR as "sizeof(CUdeviceptr)" = 8,
        /// `typedef int CUdevice_v1`.
        SIZEOF_CUDEVICE as "sizeof(CUdevice)" = 4,
        /// C enums are `int`-sized: the width `cuStreamIsCapturing` writes.
        SIZEOF_CUSTREAMCAPTURESTATUS as "sizeof(CUstreamCaptureStatus)" = 4,
    };
}

/// `CUdeviceptr` as the runtime layer passes it.
pub type CuDevicePtr = u64;

const _: () = {
    assert!(std::mem::size_of::<CuDevicePtr>() == SIZEOF_CUDEVICEPTR);
    assert!(std::mem::size_of::<crate::device::DevicePtr>() == SIZEOF_CUDEVICEPTR);
    assert!(std::mem::size_of::<i32>() == SIZEOF_CUDEVICE);
    // cuda.h writes the flags as shifts.
    assert!(CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM == 2);
};

/// Name of a `CUresult` value (for errors; unknown codes are named by their number elsewhere).
pub fn cu_result_name(value: i32) -> &'static str {
    super::lookup_any(CU_RESULT, value as i64).map_or("<unlisted CUresult>", |e| e.abi.name)
}
