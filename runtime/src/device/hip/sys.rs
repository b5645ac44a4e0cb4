//! Raw HIP, hipRTC and comgr symbols: exactly the ones `HipRuntime` calls, resolved once by
//! `dlopen` + `dlsym`, plus the ABI constants they take.
//!
//! Nothing here is ever `dlclose`d: the host process may have loaded the same library (it is
//! the engine's HIP runtime) and function pointers handed out must stay valid for the process
//! lifetime. A symbol that an older ROCm lacks is `None` in the table and becomes
//! `DeviceError::SymbolMissing` at the call that needs it, never a failure to load.
//!
//! Every constant below was read from the headers named next to it; the values have not moved
//! between ROCm 5.2 and 7.x (checked against ROCm 5.2.3 `hip_runtime_api.h` / `driver_types.h`
//! / `hiprtc.h` from Debian's libamdhip64-dev 5.2.3 compiled with gcc, and against the ROCm 6.x
//! and 7.x `hip_runtime_api.h` in ROCm/HIP and ROCm/rocm-systems).

#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_uchar, c_uint, c_void, CStr, CString};
use std::path::Path;
use std::ptr::NonNull;

use crate::device::DeviceError;

/// `hipError_t`: a C enum, passed and returned as `int`.
pub type HipStatus = c_int;
/// `hiprtcResult`: a C enum, returned as `int`.
pub type RtcStatus = c_int;
/// `amd_comgr_status_t`: a C enum, returned as `int`.
pub type ComgrStatus = c_int;

/// Library names used in errors (`DeviceError::{LibraryMissing, SymbolMissing}::lib`).
pub const HIP_LIB: &str = "libamdhip64";
pub const HIPRTC_LIB: &str = "libhiprtc";
pub const COMGR_LIB: &str = "libamd_comgr";

/// Overrides the HIP runtime library: a path (or soname) opened instead of searching.
pub const HIP_LIB_ENV: &str = "QUANTSHADOW_HIP_LIB";
/// Overrides the hipRTC library the same way.
pub const HIPRTC_LIB_ENV: &str = "QUANTSHADOW_HIPRTC_LIB";

// hipError_t, ROCm 5.2.3 hip_runtime_api.h (same values in ROCm 6.x and 7.x).
pub const HIP_SUCCESS: HipStatus = 0;
/// hipErrorInsufficientDriver: no usable kernel driver (no /dev/kfd, or too old).
pub const HIP_ERROR_INSUFFICIENT_DRIVER: HipStatus = 35;
/// hipErrorNoDevice: what ROCm 5.2 `hipGetDeviceCount` returns on a machine without a GPU.
pub const HIP_ERROR_NO_DEVICE: HipStatus = 100;

// hipDeviceAttribute_t, ROCm 5.2.3 hip_runtime_api.h (enumerators are implicit; values computed
// by gcc from that header). ROCm 6.x/7.x renamed entries 64 and 86 to Unused1/Unused2 and
// appended new ones after 88 but kept every value below, so these hold for 5.x to 7.x.
pub const HIP_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 63;
pub const HIP_DEVICE_ATTRIBUTE_WARP_SIZE: c_int = 87;

// hipStreamCaptureStatus, ROCm 5.2.3 hip_runtime_api.h (also ROCm 6.x/7.x).
pub const HIP_STREAM_CAPTURE_STATUS_NONE: c_int = 0;
pub const HIP_STREAM_CAPTURE_STATUS_ACTIVE: c_int = 1;
pub const HIP_STREAM_CAPTURE_STATUS_INVALIDATED: c_int = 2;

/// hipMemcpyKind::hipMemcpyHostToDevice, ROCm 5.2.3 driver_types.h (also ROCm 6.x/7.x).
pub const HIP_MEMCPY_HOST_TO_DEVICE: c_int = 1;
/// hipMemcpyKind::hipMemcpyDeviceToDevice, ROCm 5.2.3 driver_types.h (also ROCm 6.x/7.x).
pub const HIP_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;

/// `hipHostRegister` flags (`#define`s in hip_runtime_api.h): values printed by gcc from ROCm
/// 5.2.3 `hip_runtime_api.h` (Debian libamdhip64-dev 5.2.3-8) and read in the ROCm 7.x header
/// (ROCm/rocm-systems `projects/hip/include/hip/hip_runtime_api.h`, commit 003a5d1); the same in
/// both. `hipHostRegisterReadOnly` is absent from 5.2.3 and present in 7.x, with the value of
/// `hipExtHostRegisterCoarseGrained` (8): one bit, two meanings, and clr's `hipHostRegister`
/// accepts it as coarse-grained. Only [`HIP_RING_REGISTER_FLAGS`] is ever passed; the others are
/// pinned so that the assertions below (and `runtime/tests/hip.rs`, against an installed header)
/// check that choice.
pub const HIP_HOST_REGISTER_DEFAULT: c_uint = 0x0;
/// `hipHostRegisterPortable`: registered for all contexts. HIP has one context per device, and
/// clr registers the pages in its host context and maps them for every device whatever this
/// flag says; the shim makes one ring per device anyway, so it is not passed.
pub const HIP_HOST_REGISTER_PORTABLE: c_uint = 0x1;
/// `hipHostRegisterMapped`: map into the device address space (`hipHostGetDevicePointer`).
pub const HIP_HOST_REGISTER_MAPPED: c_uint = 0x2;
/// `hipHostRegisterIoMemory`: MMIO space ("Not supported" in 5.2.3).
pub const HIP_HOST_REGISTER_IO_MEMORY: c_uint = 0x4;
/// `hipHostRegisterReadOnly` (ROCm 7.x header; "ignored on AMD devices", but see above).
pub const HIP_HOST_REGISTER_READ_ONLY: c_uint = 0x8;
/// `hipExtHostRegisterCoarseGrained`: coarse-grained lock. Device writes to coarse-grained
/// memory are only guaranteed visible to the host after a synchronisation, which a poller
/// reading the ring while kernels run never makes.
pub const HIP_EXT_HOST_REGISTER_COARSE_GRAINED: c_uint = 0x8;

/// What the results ring is registered with: mapped, and no bit that could mean coarse-grained.
///
/// Coherence (why the ring used `hipHostMalloc(Mapped | Coherent)` before): in each ROCclr-based
/// HIP read, `hipHostRegister` creates its buffer with `CL_MEM_USE_HOST_PTR |
/// CL_MEM_SVM_ATOMICS` whatever the flags (ROCm/HIP `rocclr/hip_memory.cpp`, before hipamd split
/// off; ROCm/hipamd `src/hip_memory.cpp`, ROCm 5.x; clr `hipamd/src/hip_memory.cpp` of the
/// `hipExtHostRegisterUncached` era, ROCm 6.x/7.x, which also rejects flags outside Portable,
/// Mapped, CoarseGrained and Uncached). ROCclr's `device/rocm/rocmemory.cpp` locks a
/// `CL_MEM_SVM_ATOMICS` host buffer with `hsa_amd_memory_lock_to_pool` to `SystemSegment()`,
/// the CPU pool whose flags include `HSA_REGION_GLOBAL_FLAG_FINE_GRAINED` (`rocdevice.cpp`): the
/// pool `hipHostMalloc` allocates coherent memory from. Fine-grained memory is "coherent even
/// while being modified" (HIP docs, "Coherence control"). `HIP_HOST_COHERENT` is read by
/// `hipHostMalloc` only, never by `hipHostRegister`. So the registered ring has the coherence
/// the allocated one had, on every version read.
///
/// Fallback decision: none. If registration fails, `alloc_mapped` fails and the backend does not
/// start; falling back to `hipHostMalloc` would bring back a ring whose pages HIP, not the shim,
/// decides the life of (see `alloc_mapped`). `hipExtHostRegisterUncached` (0x80000000,
/// newer 6.x and 7.x: the extended fine-grained pool, MTYPE_UC) is not used: libraries from
/// before it may reject it, and plain fine-grained is what `hipHostMalloc(Coherent)` gave.
pub const HIP_RING_REGISTER_FLAGS: c_uint = HIP_HOST_REGISTER_MAPPED;
const _: () = assert!(HIP_RING_REGISTER_FLAGS & HIP_EXT_HOST_REGISTER_COARSE_GRAINED == 0);
const _: () = assert!(HIP_RING_REGISTER_FLAGS & HIP_HOST_REGISTER_READ_ONLY == 0);
const _: () = assert!(HIP_RING_REGISTER_FLAGS & HIP_HOST_REGISTER_IO_MEMORY == 0);
const _: () = assert!(HIP_RING_REGISTER_FLAGS & HIP_HOST_REGISTER_MAPPED != 0);

/// Every `hipHostRegister` flag pinned above, by its C name, for comparison with a header.
pub const HOST_REGISTER_FLAGS: &[(&str, c_uint)] = &[
    ("hipHostRegisterDefault", HIP_HOST_REGISTER_DEFAULT),
    ("hipHostRegisterPortable", HIP_HOST_REGISTER_PORTABLE),
    ("hipHostRegisterMapped", HIP_HOST_REGISTER_MAPPED),
    ("hipHostRegisterIoMemory", HIP_HOST_REGISTER_IO_MEMORY),
    ("hipHostRegisterReadOnly", HIP_HOST_REGISTER_READ_ONLY),
    ("hipExtHostRegisterCoarseGrained", HIP_EXT_HOST_REGISTER_COARSE_GRAINED),
];

/// `#define hipStreamNonBlocking 0x01`, ROCm 5.2.3 hip_runtime_api.h (also ROCm 6.x/7.x).
pub const HIP_STREAM_NON_BLOCKING: c_uint = 0x1;
/// `#define hipEventDefault 0x0`, ROCm 5.2.3 hip_runtime_api.h: timing stays enabled, which
/// `hipEventElapsedTime` needs (hipEventDisableTiming would make it fail).
pub const HIP_EVENT_DEFAULT: c_uint = 0x0;
/// hipEventDisableTiming (hip_runtime_api.h): ordering only.
pub const HIP_EVENT_DISABLE_TIMING: c_uint = 0x2;

// hiprtcResult, ROCm 5.2.3 hiprtc.h (also ROCm 6.x/7.x).
pub const HIPRTC_SUCCESS: RtcStatus = 0;

/// AMD_COMGR_STATUS_SUCCESS, amd_comgr.h (comgr 2.x and 3.x).
pub const COMGR_SUCCESS: ComgrStatus = 0;

/// Device properties: HIP has no usable attribute for the gfx target name (ROCm 5.x declares
/// `hipDeviceAttributeGcnArchName` = 10004, but `hipDeviceGetAttribute` returns one `int`, and
/// ROCm 6.0 renamed the enumerator `hipDeviceAttributeUnused5`). The name is only in
/// `hipDeviceProp_t::gcnArchName`, whose struct changed in ROCm 6.0. Both layouts are mirrored
/// here up to and including that field, and the call writes into a buffer far larger than
/// either struct, so a library whose struct grew cannot write out of bounds.
pub mod props {
    use std::ffi::{c_char, c_int, c_uint};

    /// Bytes handed to `hipGetDeviceProperties*`: sizeof is 792 (R0000, ROCm 5.2) and 1472
    /// (R0600, ROCm 6.x/7.x).
    pub const BUFFER_BYTES: usize = 4096;
    pub const R0000_SIZE: usize = 792;
    pub const R0600_SIZE: usize = 1472;
    /// offsetof(hipDeviceProp_t, gcnArchName) for ROCm 5.x's `hipDeviceProp_t` (exported as
    /// `hipGetDeviceProperties`, kept under that name as the R0000 layout in ROCm 6.x/7.x):
    /// computed by gcc from ROCm 5.2.3 hip_runtime_api.h.
    pub const R0000_GCN_ARCH_NAME_OFFSET: usize = 396;
    /// offsetof(hipDeviceProp_tR0600, gcnArchName) (exported as `hipGetDevicePropertiesR0600`
    /// since ROCm 6.0): computed by gcc from the field list of ROCm 6.x/7.x hip_runtime_api.h.
    pub const R0600_GCN_ARCH_NAME_OFFSET: usize = 1160;
    pub const GCN_ARCH_NAME_BYTES: usize = 256;

    #[repr(C, align(16))]
    pub struct Buffer(pub [u8; BUFFER_BYTES]);

    /// `hipDeviceProp_t` of ROCm 5.2 up to gcnArchName (R0000).
    #[repr(C)]
    pub struct R0000Prefix {
        pub name: [c_char; 256],
        pub total_global_mem: usize,
        pub shared_mem_per_block: usize,
        pub regs_per_block: c_int,
        pub warp_size: c_int,
        pub max_threads_per_block: c_int,
        pub max_threads_dim: [c_int; 3],
        pub max_grid_size: [c_int; 3],
        pub clock_rate: c_int,
        pub memory_clock_rate: c_int,
        pub memory_bus_width: c_int,
        pub total_const_mem: usize,
        pub major: c_int,
        pub minor: c_int,
        pub multi_processor_count: c_int,
        pub l2_cache_size: c_int,
        pub max_threads_per_multi_processor: c_int,
        pub compute_mode: c_int,
        pub clock_instruction_rate: c_int,
        /// hipDeviceArch_t: 17 one-bit `unsigned` fields, one 4-byte unit.
        pub arch: c_uint,
        pub concurrent_kernels: c_int,
        pub pci_domain_id: c_int,
        pub pci_bus_id: c_int,
        pub pci_device_id: c_int,
        pub max_shared_memory_per_multi_processor: usize,
        pub is_multi_gpu_board: c_int,
        pub can_map_host_memory: c_int,
        pub gcn_arch: c_int,
        pub gcn_arch_name: [c_char; 256],
    }

    /// `hipDeviceProp_tR0600` of ROCm 6.x/7.x up to gcnArchName.
    #[repr(C)]
    pub struct R0600Prefix {
        pub name: [c_char; 256],
        pub uuid: [c_char; 16],
        pub luid: [c_char; 8],
        pub luid_device_node_mask: c_uint,
        pub total_global_mem: usize,
        pub shared_mem_per_block: usize,
        pub regs_per_block: c_int,
        pub warp_size: c_int,
        pub mem_pitch: usize,
        pub max_threads_per_block: c_int,
        pub max_threads_dim: [c_int; 3],
        pub max_grid_size: [c_int; 3],
        pub clock_rate: c_int,
        pub total_const_mem: usize,
        pub major: c_int,
        pub minor: c_int,
        pub texture_alignment: usize,
        pub texture_pitch_alignment: usize,
        pub device_overlap: c_int,
        pub multi_processor_count: c_int,
        pub kernel_exec_timeout_enabled: c_int,
        pub integrated: c_int,
        pub can_map_host_memory: c_int,
        pub compute_mode: c_int,
        pub max_texture_1d: c_int,
        pub max_texture_1d_mipmap: c_int,
        pub max_texture_1d_linear: c_int,
        pub max_texture_2d: [c_int; 2],
        pub max_texture_2d_mipmap: [c_int; 2],
        pub max_texture_2d_linear: [c_int; 3],
        pub max_texture_2d_gather: [c_int; 2],
        pub max_texture_3d: [c_int; 3],
        pub max_texture_3d_alt: [c_int; 3],
        pub max_texture_cubemap: c_int,
        pub max_texture_1d_layered: [c_int; 2],
        pub max_texture_2d_layered: [c_int; 3],
        pub max_texture_cubemap_layered: [c_int; 2],
        pub max_surface_1d: c_int,
        pub max_surface_2d: [c_int; 2],
        pub max_surface_3d: [c_int; 3],
        pub max_surface_1d_layered: [c_int; 2],
        pub max_surface_2d_layered: [c_int; 3],
        pub max_surface_cubemap: c_int,
        pub max_surface_cubemap_layered: [c_int; 2],
        pub surface_alignment: usize,
        pub concurrent_kernels: c_int,
        pub ecc_enabled: c_int,
        pub pci_bus_id: c_int,
        pub pci_device_id: c_int,
        pub pci_domain_id: c_int,
        pub tcc_driver: c_int,
        pub async_engine_count: c_int,
        pub unified_addressing: c_int,
        pub memory_clock_rate: c_int,
        pub memory_bus_width: c_int,
        pub l2_cache_size: c_int,
        pub persisting_l2_cache_max_size: c_int,
        pub max_threads_per_multi_processor: c_int,
        pub stream_priorities_supported: c_int,
        pub global_l1_cache_supported: c_int,
        pub local_l1_cache_supported: c_int,
        pub shared_mem_per_multiprocessor: usize,
        pub regs_per_multiprocessor: c_int,
        pub managed_memory: c_int,
        pub is_multi_gpu_board: c_int,
        pub multi_gpu_board_group_id: c_int,
        pub host_native_atomic_supported: c_int,
        pub single_to_double_precision_perf_ratio: c_int,
        pub pageable_memory_access: c_int,
        pub concurrent_managed_access: c_int,
        pub compute_preemption_supported: c_int,
        pub can_use_host_pointer_for_registered_mem: c_int,
        pub cooperative_launch: c_int,
        pub cooperative_multi_device_launch: c_int,
        pub shared_mem_per_block_optin: usize,
        pub pageable_memory_access_uses_host_page_tables: c_int,
        pub direct_managed_mem_access_from_host: c_int,
        pub max_blocks_per_multi_processor: c_int,
        pub access_policy_max_window_size: c_int,
        pub reserved_shared_mem_per_block: usize,
        pub host_register_supported: c_int,
        pub sparse_hip_array_supported: c_int,
        pub host_register_read_only_supported: c_int,
        pub timeline_semaphore_interop_supported: c_int,
        pub memory_pools_supported: c_int,
        pub gpu_direct_rdma_supported: c_int,
        pub gpu_direct_rdma_flush_writes_options: c_uint,
        pub gpu_direct_rdma_writes_ordering: c_int,
        pub memory_pool_supported_handle_types: c_uint,
        pub deferred_mapping_hip_array_supported: c_int,
        pub ipc_event_supported: c_int,
        pub cluster_launch: c_int,
        pub unified_function_pointers: c_int,
        pub reserved: [c_int; 63],
        pub hip_reserved: [c_int; 32],
        pub gcn_arch_name: [c_char; 256],
    }

    // The transcriptions above must agree with the offsets gcc computed from the headers.
    const _: () = assert!(std::mem::offset_of!(R0000Prefix, gcn_arch_name) == R0000_GCN_ARCH_NAME_OFFSET);
    const _: () = assert!(std::mem::offset_of!(R0600Prefix, gcn_arch_name) == R0600_GCN_ARCH_NAME_OFFSET);
    const _: () = assert!(std::mem::offset_of!(R0000Prefix, name) == 0);
    const _: () = assert!(std::mem::offset_of!(R0600Prefix, name) == 0);
    const _: () = assert!(R0000_GCN_ARCH_NAME_OFFSET + GCN_ARCH_NAME_BYTES <= R0000_SIZE);
    const _: () = assert!(R0600_GCN_ARCH_NAME_OFFSET + GCN_ARCH_NAME_BYTES <= R0600_SIZE);
    const _: () = assert!(R0000_SIZE * 2 <= BUFFER_BYTES && R0600_SIZE * 2 <= BUFFER_BYTES);
}

/// Declares a symbol table: one `Option<fn>` per symbol, a resolver and the list of names.
macro_rules! symbol_table {
    (
        $(#[$meta:meta])*
        pub struct $table:ident {
            $( $name:ident: fn($($arg:ty),* $(,)?) -> $ret:ty; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy)]
        pub struct $table {
            $( pub $name: Option<unsafe extern "C" fn($($arg),*) -> $ret>, )*
        }

        impl $table {
            /// Every symbol of the table, in declaration order.
            #[allow(dead_code)]
            pub const NAMES: &'static [&'static str] = &[$(stringify!($name)),*];

            /// # Safety
            /// `handle` is a live `dlopen` handle that is never closed, and each exported symbol
            /// of these names has the C signature declared for it.
            unsafe fn resolve(handle: NonNull<c_void>) -> Self {
                Self {
                    $( $name: {
                        let ptr = libc::dlsym(
                            handle.as_ptr(),
                            concat!(stringify!($name), "\0").as_ptr().cast(),
                        );
                        if ptr.is_null() {
                            None
                        } else {
                            Some(std::mem::transmute::<
                                *mut c_void,
                                unsafe extern "C" fn($($arg),*) -> $ret,
                            >(ptr))
                        }
                    }, )*
                }
            }

            /// Names of the symbols this library does not export.
            #[allow(dead_code)]
            pub fn missing(&self) -> Vec<&'static str> {
                let mut missing = Vec::new();
                $( if self.$name.is_none() { missing.push(stringify!($name)); } )*
                missing
            }

            /// Any one resolved symbol, to ask the loader which file it came from.
            fn any(&self) -> Option<*const c_void> {
                $( if let Some(f) = self.$name { return Some(f as *const c_void); } )*
                None
            }
        }
    };
}

symbol_table! {
    /// The HIP runtime symbols `HipRuntime` uses. Signatures from ROCm 5.2.3
    /// hip_runtime_api.h; ROCm 6 added `const` to some pointer parameters, which does not
    /// change the ABI. Handles (`hipStream_t`, `hipEvent_t`, `hipModule_t`, `hipFunction_t`)
    /// and `hipDeviceptr_t` are pointers; `hipDevice_t` is `int`; enums are `int`.
    pub struct HipFns {
        hipGetErrorName: fn(HipStatus) -> *const c_char;
        hipGetErrorString: fn(HipStatus) -> *const c_char;
        hipRuntimeGetVersion: fn(*mut c_int) -> HipStatus;
        hipGetDeviceCount: fn(*mut c_int) -> HipStatus;
        hipGetDevice: fn(*mut c_int) -> HipStatus;
        hipDeviceGetName: fn(*mut c_char, c_int, c_int) -> HipStatus;
        hipDeviceTotalMem: fn(*mut usize, c_int) -> HipStatus;
        hipDeviceGetAttribute: fn(*mut c_int, c_int, c_int) -> HipStatus;
        hipGetDevicePropertiesR0600: fn(*mut c_void, c_int) -> HipStatus;
        hipGetDeviceProperties: fn(*mut c_void, c_int) -> HipStatus;
        hipMalloc: fn(*mut *mut c_void, usize) -> HipStatus;
        hipFree: fn(*mut c_void) -> HipStatus;
        hipHostRegister: fn(*mut c_void, usize, c_uint) -> HipStatus;
        hipHostGetDevicePointer: fn(*mut *mut c_void, *mut c_void, c_uint) -> HipStatus;
        hipHostUnregister: fn(*mut c_void) -> HipStatus;
        hipMemcpyHtoD: fn(*mut c_void, *const c_void, usize) -> HipStatus;
        hipMemcpyDtoH: fn(*mut c_void, *mut c_void, usize) -> HipStatus;
        hipMemcpyAsync: fn(*mut c_void, *const c_void, usize, c_int, *mut c_void) -> HipStatus;
        hipMemsetD8Async: fn(*mut c_void, c_uchar, usize, *mut c_void) -> HipStatus;
        hipModuleLoadData: fn(*mut *mut c_void, *const c_void) -> HipStatus;
        hipModuleGetFunction: fn(*mut *mut c_void, *mut c_void, *const c_char) -> HipStatus;
        hipModuleLaunchKernel: fn(
            *mut c_void,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            *mut c_void,
            *mut *mut c_void,
            *mut *mut c_void,
        ) -> HipStatus;
        hipStreamIsCapturing: fn(*mut c_void, *mut c_int) -> HipStatus;
        hipStreamSynchronize: fn(*mut c_void) -> HipStatus;
        hipDeviceGetStreamPriorityRange: fn(*mut c_int, *mut c_int) -> HipStatus;
        hipStreamCreateWithPriority: fn(*mut *mut c_void, c_uint, c_int) -> HipStatus;
        hipEventCreateWithFlags: fn(*mut *mut c_void, c_uint) -> HipStatus;
        hipEventRecord: fn(*mut c_void, *mut c_void) -> HipStatus;
        hipStreamWaitEvent: fn(*mut c_void, *mut c_void, c_uint) -> HipStatus;
        hipEventQuery: fn(*mut c_void) -> HipStatus;
        hipEventElapsedTime: fn(*mut f32, *mut c_void, *mut c_void) -> HipStatus;
    }
}

symbol_table! {
    /// hipRTC, from ROCm 5.2.3 hiprtc.h (`hiprtcProgram` is a pointer).
    pub struct RtcFns {
        hiprtcGetErrorString: fn(RtcStatus) -> *const c_char;
        hiprtcCreateProgram: fn(
            *mut *mut c_void,
            *const c_char,
            *const c_char,
            c_int,
            *const *const c_char,
            *const *const c_char,
        ) -> RtcStatus;
        hiprtcCompileProgram: fn(*mut c_void, c_int, *const *const c_char) -> RtcStatus;
        hiprtcGetProgramLogSize: fn(*mut c_void, *mut usize) -> RtcStatus;
        hiprtcGetProgramLog: fn(*mut c_void, *mut c_char) -> RtcStatus;
        hiprtcGetCodeSize: fn(*mut c_void, *mut usize) -> RtcStatus;
        hiprtcGetCode: fn(*mut c_void, *mut c_char) -> RtcStatus;
        hiprtcDestroyProgram: fn(*mut *mut c_void) -> RtcStatus;
    }
}

symbol_table! {
    /// The two comgr calls that list the targets the installed compiler knows (amd_comgr.h).
    /// Only ever taken from a comgr that hipRTC itself has already loaded.
    pub struct ComgrFns {
        amd_comgr_get_isa_count: fn(*mut usize) -> ComgrStatus;
        amd_comgr_get_isa_name: fn(usize, *mut *const c_char) -> ComgrStatus;
    }
}

/// A library opened for the rest of the process, with its resolved symbols.
#[derive(Clone)]
pub struct Loaded<T> {
    /// Name used in errors: [`HIP_LIB`], [`HIPRTC_LIB`] or [`COMGR_LIB`].
    pub lib: &'static str,
    /// The file the symbols came from (as the loader reports it).
    pub path: String,
    /// The dlopen handle as an address (a handle is only an opaque token for `dlsym`).
    handle: usize,
    pub fns: T,
}

pub type HipLib = Loaded<HipFns>;
pub type RtcLib = Loaded<RtcFns>;
pub type ComgrLib = Loaded<ComgrFns>;

/// Soname prefixes, for finding a copy the process has already loaded.
const HIP_PREFIX: &str = "libamdhip64.so";
const HIPRTC_PREFIX: &str = "libhiprtc.so";
const COMGR_PREFIX: &str = "libamd_comgr.so";

/// Sonames in search order: the unversioned development link first (it names whatever ROCm
/// is installed), then the newest major version.
const HIP_NAMES: [&str; 4] = ["libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5"];
const HIPRTC_NAMES: [&str; 4] = ["libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so.5"];

impl HipLib {
    /// Opens the HIP runtime: `override_path` if given, else a copy already loaded in the
    /// process (the engine's: two HIP runtimes in one process would not share anything), else
    /// the first of [`HIP_NAMES`] and `$ROCM_PATH/lib/libamdhip64.so` (`/opt/rocm` when unset)
    /// that loads.
    pub fn open(override_path: Option<&Path>) -> Result<Self, DeviceError> {
        let mut tried = Vec::new();
        if let Some(path) = override_path {
            let shown = format!("{} (from {HIP_LIB_ENV} or HipLoadOptions)", path.display());
            return match open_file(path.as_os_str().as_encoded_bytes(), &mut tried) {
                // SAFETY: the handle stays open forever; the user named this file as a HIP runtime.
                Some(handle) => Ok(unsafe { Self::from_handle(HIP_LIB, handle, HipFns::resolve(handle)) }),
                None => {
                    Err(DeviceError::LibraryMissing { lib: HIP_LIB, searched: with_reasons(shown, &tried) })
                }
            };
        }
        let mut candidates: Vec<String> = HIP_NAMES.iter().map(|s| s.to_string()).collect();
        candidates.push(format!("{}/lib/libamdhip64.so", rocm_root()));
        match open_first(HIP_PREFIX, &candidates, &mut tried) {
            // SAFETY: as above; the file is a HIP runtime by name.
            Some(handle) => Ok(unsafe { Self::from_handle(HIP_LIB, handle, HipFns::resolve(handle)) }),
            None => Err(DeviceError::LibraryMissing {
                lib: HIP_LIB,
                searched: with_reasons(format!("already loaded, then {}", candidates.join(", ")), &tried),
            }),
        }
    }
}

impl RtcLib {
    /// Opens hipRTC, in order: `override_path`; the HIP library itself when it exports hipRTC
    /// (ROCm up to 5.2 shipped hipRTC inside libamdhip64, and it is then the matching
    /// version); a libhiprtc already loaded; libhiprtc beside the HIP library; the sonames in
    /// [`HIPRTC_NAMES`]; `$ROCM_PATH/lib/libhiprtc.so`.
    pub fn open(hip: &HipLib, override_path: Option<&Path>) -> Result<Self, DeviceError> {
        let mut tried = Vec::new();
        if let Some(path) = override_path {
            let shown = format!("{} (from {HIPRTC_LIB_ENV} or HipLoadOptions)", path.display());
            return match open_file(path.as_os_str().as_encoded_bytes(), &mut tried) {
                // SAFETY: the handle stays open forever; the user named this file as hipRTC.
                Some(handle) => Ok(unsafe { Self::from_handle(HIPRTC_LIB, handle, RtcFns::resolve(handle)) }),
                None => Err(DeviceError::LibraryMissing {
                    lib: HIPRTC_LIB,
                    searched: with_reasons(shown, &tried),
                }),
            };
        }
        if let Some(handle) = NonNull::new(hip.handle as *mut c_void) {
            // SAFETY: the HIP handle is open forever; hiprtc* symbols it exports are hipRTC's.
            let fns = unsafe { RtcFns::resolve(handle) };
            if fns.hiprtcCreateProgram.is_some() {
                return Ok(Loaded { lib: HIPRTC_LIB, path: hip.path.clone(), handle: hip.handle, fns });
            }
        }
        let mut candidates = Vec::new();
        if let Some(dir) = Path::new(&hip.path).parent().filter(|d| !d.as_os_str().is_empty()) {
            candidates.extend(HIPRTC_NAMES.iter().map(|n| dir.join(n).display().to_string()));
        }
        candidates.extend(HIPRTC_NAMES.iter().map(|s| s.to_string()));
        candidates.push(format!("{}/lib/libhiprtc.so", rocm_root()));
        candidates.dedup();
        match open_first(HIPRTC_PREFIX, &candidates, &mut tried) {
            // SAFETY: the handle stays open forever; the file is hipRTC by name.
            Some(handle) => Ok(unsafe { Self::from_handle(HIPRTC_LIB, handle, RtcFns::resolve(handle)) }),
            None => Err(DeviceError::LibraryMissing {
                lib: HIPRTC_LIB,
                searched: with_reasons(
                    format!(
                        "{} (no hiprtcCreateProgram), already loaded, then {}",
                        hip.path,
                        candidates.join(", ")
                    ),
                    &tried,
                ),
            }),
        }
    }
}

impl ComgrLib {
    /// The comgr that hipRTC has loaded into this process, if any. Never loads one: a second,
    /// different comgr picked by us could be the one hipRTC then binds to by soname.
    pub fn find_loaded() -> Option<Self> {
        let path = loaded_objects(COMGR_PREFIX).into_iter().next()?;
        // SAFETY: RTLD_NOLOAD only returns a handle to an object already mapped; never closed.
        let handle =
            unsafe { NonNull::new(libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD))? };
        // SAFETY: the handle stays open forever; the file is comgr by name.
        let lib = unsafe { Self::from_handle(COMGR_LIB, handle, ComgrFns::resolve(handle)) };
        (lib.fns.amd_comgr_get_isa_count.is_some() && lib.fns.amd_comgr_get_isa_name.is_some()).then_some(lib)
    }
}

impl<T> Loaded<T> {
    /// # Safety
    /// `handle` is never closed and `fns` was resolved from it.
    unsafe fn from_handle(lib: &'static str, handle: NonNull<c_void>, fns: T) -> Self
    where
        T: SymbolTable,
    {
        let path = fns.any_symbol().and_then(object_path).unwrap_or_else(|| "(unknown path)".into());
        Loaded { lib, path, handle: handle.as_ptr() as usize, fns }
    }
}

/// Lets [`Loaded::from_handle`] ask any table for one of its symbols.
pub trait SymbolTable {
    fn any_symbol(&self) -> Option<*const c_void>;
}
impl SymbolTable for HipFns {
    fn any_symbol(&self) -> Option<*const c_void> {
        self.any()
    }
}
impl SymbolTable for RtcFns {
    fn any_symbol(&self) -> Option<*const c_void> {
        self.any()
    }
}
impl SymbolTable for ComgrFns {
    fn any_symbol(&self) -> Option<*const c_void> {
        self.any()
    }
}

/// Root of the ROCm installation for the last-resort path.
fn rocm_root() -> String {
    match std::env::var("ROCM_PATH") {
        Ok(root) if !root.is_empty() => root.trim_end_matches('/').to_string(),
        _ => "/opt/rocm".to_string(),
    }
}

/// A copy of the library already in the process if there is one, else the first candidate
/// that opens. `tried` collects load failures other than "file not found".
fn open_first(prefix: &str, candidates: &[String], tried: &mut Vec<String>) -> Option<NonNull<c_void>> {
    for path in loaded_objects(prefix) {
        // SAFETY: RTLD_NOLOAD returns a new reference to an object already mapped, or null.
        if let Some(handle) =
            NonNull::new(unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) })
        {
            return Some(handle);
        }
    }
    candidates.iter().find_map(|name| open_file(name.as_bytes(), tried))
}

/// `dlopen(name, RTLD_NOW | RTLD_LOCAL)`; on failure records dlerror's reason unless the file
/// simply does not exist (the common, uninteresting case).
fn open_file(name: &[u8], tried: &mut Vec<String>) -> Option<NonNull<c_void>> {
    let Ok(cname) = CString::new(name) else {
        tried.push(format!("{}: contains a NUL byte", String::from_utf8_lossy(name)));
        return None;
    };
    // SAFETY: `cname` is a NUL-terminated path; running the library's initialisers is what
    // loading it means, and the handle is never closed.
    let handle = unsafe { libc::dlopen(cname.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if let Some(handle) = NonNull::new(handle) {
        return Some(handle);
    }
    // SAFETY: dlerror returns null or a NUL-terminated, thread-local message, copied at once.
    let reason = unsafe { c_string(libc::dlerror()) }.unwrap_or_default();
    if !reason.contains("No such file or directory") {
        tried.push(reason);
    }
    None
}

/// `searched` text: what was tried, plus the reasons for files that exist but did not load.
fn with_reasons(searched: String, tried: &[String]) -> String {
    if tried.is_empty() {
        searched
    } else {
        format!("{searched}; load errors: {}", tried.join("; "))
    }
}

/// Full paths of loaded objects whose file name starts with `prefix`.
fn loaded_objects(prefix: &str) -> Vec<CString> {
    struct Scan<'a> {
        prefix: &'a [u8],
        found: Vec<CString>,
    }
    unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
        // SAFETY: `data` is the `Scan` passed below, alive for the whole dl_iterate_phdr call;
        // `info` is valid during the callback and `dlpi_name` is null or NUL-terminated.
        let (scan, name) = unsafe { (&mut *data.cast::<Scan>(), (*info).dlpi_name) };
        if name.is_null() {
            return 0;
        }
        // SAFETY: checked non-null above; the loader keeps the string alive during the callback.
        let path = unsafe { CStr::from_ptr(name) };
        let bytes = path.to_bytes();
        let file = bytes.rsplit(|&b| b == b'/').next().unwrap_or(bytes);
        if file.starts_with(scan.prefix) {
            scan.found.push(path.to_owned());
        }
        0
    }
    let mut scan = Scan { prefix: prefix.as_bytes(), found: Vec::new() };
    // SAFETY: `visit` only reads the loader's data and writes into `scan`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut scan as *mut Scan).cast()) };
    scan.found
}

/// The file a symbol was loaded from.
fn object_path(symbol: *const c_void) -> Option<String> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr only inspects the address and fills `info`; on success `dli_fname` is a
    // NUL-terminated string owned by the loader, copied at once.
    unsafe {
        if libc::dladdr(symbol, &mut info) == 0 {
            return None;
        }
        c_string(info.dli_fname)
    }
}

/// Copies a C string the library owns.
///
/// # Safety
/// `ptr` is null or points to a NUL-terminated string valid for the duration of the call.
pub unsafe fn c_string(ptr: *const c_char) -> Option<String> {
    if ptr.is_null() {
        None
    } else {
        // SAFETY: non-null and NUL-terminated per this function's contract.
        Some(unsafe { CStr::from_ptr(ptr) }.to_string_lossy().into_owned())
    }
}
