//! CUDA runtime: the driver API and NVRTC through cudarc's raw `sys` bindings, loaded at run
//! time (no link-time dependency: libquantshadow.so loads where CUDA is absent).
//!
//! cudarc's dynamic loading panics when a library or symbol is missing. Inside someone else's
//! process a panic is not acceptable, so [`CudaRuntime::load`] first checks that the library
//! is present and that every symbol this module calls exists; after that no call can hit
//! cudarc's panic path. NVRTC is checked the same way, lazily, at the first compile.

use super::host_pages::HostPages;
use super::{
    DeviceError, DeviceInfo, DevicePtr, Event, Function, GpuRuntime, GraphNode, LaunchOrder, MappedHost,
    Module, Stream, Vendor,
};
use cudarc::driver::sys as cu;
use cudarc::nvrtc::sys as nvrtc;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::{Mutex, OnceLock};

/// Driver symbols this module calls: all must exist before any is called.
const DRIVER_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuCtxGetCurrent",
    "cuCtxSetCurrent",
    "cuCtxGetDevice",
    "cuDeviceGet",
    "cuDevicePrimaryCtxRetain",
    "cuDeviceGetName",
    "cuDeviceGetAttribute",
    "cuDeviceTotalMem_v2",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemHostGetDevicePointer_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemsetD8Async",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuLaunchKernel",
    "cuStreamIsCapturing",
    "cuStreamSynchronize",
    "cuCtxGetStreamPriorityRange",
    "cuStreamCreateWithPriority",
    "cuEventCreate",
    "cuEventRecord",
    "cuStreamWaitEvent",
    "cuEventQuery",
    "cuThreadExchangeStreamCaptureMode",
];

const NVRTC_SYMBOLS: &[&str] = &[
    "nvrtcVersion",
    "nvrtcCreateProgram",
    "nvrtcCompileProgram",
    "nvrtcGetProgramLogSize",
    "nvrtcGetProgramLog",
    "nvrtcGetCUBINSize",
    "nvrtcGetCUBIN",
    "nvrtcDestroyProgram",
];

/// Options NVRTC gets besides `registry::COMPILE_OPTIONS`. `-default-device`: NVRTC 13.0 (the GPU
/// host's) takes the kernels' generic lambdas (`qs_for_kp(.., [&](auto k) {..})` in `__global__`
/// functions) for host code, which JIT mode refuses: every qs_sketch.cu program failed (exp42).
/// NVRTC 13.5 infers `__device__`. CI compiles with both (runtime/tests/kernels_compile.rs).
pub const NVRTC_OPTIONS: &[&str] = &["-default-device"];

/// CU_STREAM_NON_BLOCKING (cuda.h): no implicit synchronisation with the legacy stream.
const CU_STREAM_NON_BLOCKING: u32 = 0x1;
/// CU_EVENT_DEFAULT (cuda.h): timing enabled.
const CU_EVENT_DEFAULT: u32 = 0x0;
/// CU_EVENT_DISABLE_TIMING (cuda.h): ordering only.
const CU_EVENT_DISABLE_TIMING: u32 = 0x2;

/// Which library a symbol is looked up in.
#[derive(Clone, Copy)]
enum Lib {
    Driver,
    Nvrtc,
}

/// Whether `name` exists in `lib`, without calling it. Only after the library was found
/// present: cudarc's loader panics otherwise.
fn symbol_present(lib: Lib, name: &str) -> bool {
    let mut bytes = name.as_bytes().to_vec();
    bytes.push(0);
    // SAFETY: the library is present (checked by the caller); a lookup does not call the symbol.
    unsafe {
        match lib {
            Lib::Driver => cu::culib().get::<*const ()>(&bytes[..]).is_ok(),
            Lib::Nvrtc => nvrtc::culib().get::<*const ()>(&bytes[..]).is_ok(),
        }
    }
}

/// Whether libcuda has `name` (libcuda must have been found present: `CudaRuntime::load`).
pub(crate) fn driver_symbol_present(name: &str) -> bool {
    // SAFETY: only dlopen attempts; nothing is called.
    (unsafe { cu::is_culib_present() }) && symbol_present(Lib::Driver, name)
}

/// The CUDA driver, loaded and checked.
pub struct CudaRuntime {
    /// cuEventElapsedTime_v2 (CUDA >= 12.8; the only one in CUDA 13 headers) is present.
    /// Only timing (benchmarks) needs it, so its absence is an error there, not at load.
    elapsed_v2: bool,
    /// cuStreamGetCaptureInfo_v3 and cuGraphAddKernelNode_v2 (CUDA >= 12.3): detached checks
    /// inside graph captures. Without them captured checks stay on the captured stream.
    graph_branches: bool,
    /// cuStreamUpdateCaptureDependencies_v2, cuGraphNodeGetDependentNodes_v2 and
    /// cuGraphAddDependencies_v2 (CUDA >= 12.3): a snapshot copy beside the next captured GEMM,
    /// joined afterwards. Without them the copy stays on the captured stream.
    branch_joins: bool,
    /// cuLaunchKernelEx (CUDA >= 12.0): early starts (programmatic dependent launch). Without
    /// it every launch is an ordinary one.
    early_launch: bool,
    nvrtc: OnceLock<Result<(), DeviceError>>,
    /// cuCtxGetId (CUDA >= 12.0): host-to-device copies go through a stream of the shim's own
    /// per context ([`CudaRuntime::copy_stream`]). Without it they take the legacy stream.
    ctx_ids: bool,
    /// cuDevicePrimaryCtxGetState and cuDevicePrimaryCtxRelease_v2: whether a backend was made
    /// in a primary context, and whether that context still exists after the host releases it.
    primary_state: bool,
    /// The shim's copy stream of each context, by context id (ids are never reused, so a
    /// destroyed context's stream is never looked up again); at most [`COPY_STREAMS_MAX`].
    copy_streams: Mutex<Vec<(u64, u64)>>,
}

/// Contexts whose copy stream is kept; copies in more contexts take the legacy stream.
const COPY_STREAMS_MAX: usize = 16;

impl std::fmt::Debug for CudaRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaRuntime").finish_non_exhaustive()
    }
}

/// Result of a driver call as a `DeviceError` with the driver's own name and text.
fn check(call: &'static str, status: cu::CUresult) -> Result<(), DeviceError> {
    if status == cu::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const c_char = std::ptr::null();
    let mut text: *const c_char = std::ptr::null();
    // SAFETY: both symbols were verified at load; the out-pointers are valid locals and the
    // driver returns static strings (or leaves them null for unknown codes).
    unsafe {
        cu::cuGetErrorName(status, &mut name);
        cu::cuGetErrorString(status, &mut text);
    }
    let read = |p: *const c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: non-null strings from the driver are NUL-terminated statics.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    Err(DeviceError::Call { call, code: status as i32, message: format!("{} {}", read(name), read(text)) })
}

fn check_nvrtc(call: &'static str, status: nvrtc::nvrtcResult) -> Result<(), DeviceError> {
    if status == nvrtc::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        // The code as an integer: an NVRTC newer than cudarc's enum may return a value it lacks.
        Err(DeviceError::Call {
            call,
            code: status as i32,
            message: format!("nvrtcResult {}", status as i32),
        })
    }
}

impl CudaRuntime {
    /// The shim's non-blocking stream of the current context for its synchronous host-to-device
    /// copies, created at the first copy in that context; None without cuCtxGetId, without a
    /// current context, past [`COPY_STREAMS_MAX`] contexts or if the stream cannot be made (the
    /// copy then takes the legacy stream, as before).
    fn copy_stream(&self) -> Option<cu::CUstream> {
        if !self.ctx_ids {
            return None;
        }
        let mut ctx: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer is a valid local.
        check("cuCtxGetCurrent", unsafe { cu::cuCtxGetCurrent(&mut ctx) }).ok()?;
        if ctx.is_null() {
            return None;
        }
        let mut id: std::ffi::c_ulonglong = 0;
        // SAFETY: ctx_ids implies the symbol; ctx is the current context; out-pointer is a local.
        check("cuCtxGetId", unsafe { cu::cuCtxGetId(ctx, &mut id) }).ok()?;
        let mut streams = self.copy_streams.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(_, s)) = streams.iter().find(|(c, _)| *c == id as u64) {
            return Some(s as cu::CUstream);
        }
        if streams.len() >= COPY_STREAMS_MAX {
            return None;
        }
        let mut s: cu::CUstream = std::ptr::null_mut();
        // SAFETY: out-pointer is a valid local; priority 0 is the default, valid on every device.
        check("cuStreamCreateWithPriority", unsafe {
            cu::cuStreamCreateWithPriority(&mut s, CU_STREAM_NON_BLOCKING, 0)
        })
        .ok()?;
        streams.push((id as u64, s as u64));
        Some(s)
    }

    /// Finds libcuda and checks every symbol this module uses. Makes no driver call, so it is
    /// safe in any process, with or without a GPU.
    pub fn load() -> Result<CudaRuntime, DeviceError> {
        // SAFETY: only tries to dlopen candidate names; nothing is called.
        if !unsafe { cu::is_culib_present() } {
            return Err(DeviceError::LibraryMissing {
                lib: "libcuda",
                searched: cudarc::get_lib_name_candidates("cuda").join(", "),
            });
        }
        for name in DRIVER_SYMBOLS {
            if !symbol_present(Lib::Driver, name) {
                return Err(DeviceError::SymbolMissing { lib: "libcuda", name });
            }
        }
        let elapsed_v2 = symbol_present(Lib::Driver, "cuEventElapsedTime_v2");
        let graph_branches = symbol_present(Lib::Driver, "cuStreamGetCaptureInfo_v3")
            && symbol_present(Lib::Driver, "cuGraphAddKernelNode_v2");
        let branch_joins = graph_branches
            && [
                "cuStreamUpdateCaptureDependencies_v2",
                "cuGraphNodeGetDependentNodes_v2",
                "cuGraphAddDependencies_v2",
            ]
            .iter()
            .all(|name| symbol_present(Lib::Driver, name));
        let early_launch = symbol_present(Lib::Driver, "cuLaunchKernelEx");
        let ctx_ids = symbol_present(Lib::Driver, "cuCtxGetId");
        let primary_state = symbol_present(Lib::Driver, "cuDevicePrimaryCtxGetState")
            && symbol_present(Lib::Driver, "cuDevicePrimaryCtxRelease_v2");
        Ok(CudaRuntime {
            primary_state,
            elapsed_v2,
            graph_branches,
            branch_joins,
            early_launch,
            nvrtc: OnceLock::new(),
            ctx_ids,
            copy_streams: Mutex::new(Vec::new()),
        })
    }

    /// (capture id, graph, the stream's current dependencies) of an active capture on `s`.
    fn capture_info(
        &self,
        s: Stream,
    ) -> Result<Option<(u64, cu::CUgraph, Vec<cu::CUgraphNode>)>, DeviceError> {
        let mut status = cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let mut id: cu::cuuint64_t = 0;
        let mut graph: cu::CUgraph = std::ptr::null_mut();
        let mut deps: *const cu::CUgraphNode = std::ptr::null();
        let mut edges: *const cu::CUgraphEdgeData = std::ptr::null();
        let mut n: usize = 0;
        // SAFETY: graph_branches implies the symbol exists; out-pointers are valid locals.
        check("cuStreamGetCaptureInfo_v3", unsafe {
            cu::cuStreamGetCaptureInfo_v3(
                stream(s),
                &mut status,
                &mut id,
                &mut graph,
                &mut deps,
                &mut edges,
                &mut n,
            )
        })?;
        if status != cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
            return Ok(None);
        }
        let list = if deps.is_null() || n == 0 {
            vec![]
        } else {
            // SAFETY: the driver returns `n` nodes at `deps`, valid until the next call on `s`.
            unsafe { std::slice::from_raw_parts(deps, n) }.to_vec()
        };
        Ok(Some((id as u64, graph, list)))
    }

    /// For our own processes only (selftest, benchmarks): initialise the driver and make the
    /// primary context of device `ordinal` current. The shim never calls this: in someone
    /// else's process it uses the context the engine made current.
    pub fn activate_primary_context(&self, ordinal: i32) -> Result<(), DeviceError> {
        let mut device: cu::CUdevice = 0;
        let mut ctx: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: symbols verified at load; out-pointers are valid locals.
        unsafe {
            check("cuInit", cu::cuInit(0))?;
            check("cuDeviceGet", cu::cuDeviceGet(&mut device, ordinal))?;
            check("cuDevicePrimaryCtxRetain", cu::cuDevicePrimaryCtxRetain(&mut ctx, device))?;
            check("cuCtxSetCurrent", cu::cuCtxSetCurrent(ctx))
        }
    }

    fn ensure_nvrtc(&self) -> Result<(), DeviceError> {
        self.nvrtc
            .get_or_init(|| {
                // SAFETY: only tries to dlopen candidate names.
                if !unsafe { nvrtc::is_culib_present() } {
                    return Err(DeviceError::LibraryMissing {
                        lib: "libnvrtc",
                        searched: cudarc::get_lib_name_candidates("nvrtc").join(", "),
                    });
                }
                for name in NVRTC_SYMBOLS {
                    if !symbol_present(Lib::Nvrtc, name) {
                        return Err(DeviceError::SymbolMissing { lib: "libnvrtc", name });
                    }
                }
                Ok(())
            })
            .clone()
    }

    /// NVRTC's version (major, minor), part of the kernel cache key.
    pub fn nvrtc_version(&self) -> Result<(i32, i32), DeviceError> {
        self.ensure_nvrtc()?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: symbol verified; out-pointers are valid locals.
        check_nvrtc("nvrtcVersion", unsafe { nvrtc::nvrtcVersion(&mut major, &mut minor) })?;
        Ok((major, minor))
    }

    fn current_cu_device(&self) -> Result<cu::CUdevice, DeviceError> {
        let mut ctx: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: symbol verified; out-pointer is a valid local.
        let status = unsafe { cu::cuCtxGetCurrent(&mut ctx) };
        if status == cu::CUresult::CUDA_ERROR_NOT_INITIALIZED || status == cu::CUresult::CUDA_ERROR_NO_DEVICE
        {
            return Err(DeviceError::NoDevice { vendor: "NVIDIA", detail: format!("{status:?}") });
        }
        check("cuCtxGetCurrent", status)?;
        if ctx.is_null() {
            return Err(DeviceError::NoContext { vendor: "CUDA" });
        }
        let mut device: cu::CUdevice = 0;
        // SAFETY: a context is current; out-pointer is a valid local.
        check("cuCtxGetDevice", unsafe { cu::cuCtxGetDevice(&mut device) })?;
        Ok(device)
    }

    fn attribute(&self, device: cu::CUdevice, attribute: cu::CUdevice_attribute) -> Result<i32, DeviceError> {
        let mut value = 0;
        // SAFETY: symbol verified; out-pointer is a valid local.
        check("cuDeviceGetAttribute", unsafe { cu::cuDeviceGetAttribute(&mut value, attribute, device) })?;
        Ok(value)
    }
}

fn stream(s: Stream) -> cu::CUstream {
    s.0 as cu::CUstream
}

impl GpuRuntime for CudaRuntime {
    fn vendor(&self) -> Vendor {
        Vendor::Nvidia
    }

    fn current_context(&self) -> Option<u64> {
        let mut ctx: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer is a valid local.
        check("cuCtxGetCurrent", unsafe { cu::cuCtxGetCurrent(&mut ctx) }).ok()?;
        (!ctx.is_null()).then_some(ctx as u64)
    }

    fn primary_context_active(&self, device: i32) -> Option<bool> {
        if !self.primary_state {
            return None;
        }
        let (mut flags, mut active): (std::ffi::c_uint, std::ffi::c_int) = (0, 0);
        // SAFETY: primary_state implies the symbol; out-pointers are valid locals.
        check("cuDevicePrimaryCtxGetState", unsafe {
            cu::cuDevicePrimaryCtxGetState(device, &mut flags, &mut active)
        })
        .ok()?;
        Some(active != 0)
    }

    fn current_context_is_primary(&self) -> Option<bool> {
        let current = self.current_context()?;
        let device = self.current_cu_device().ok()?;
        // An inactive primary context cannot be the current one; retaining it would create it.
        if !self.primary_context_active(device)? {
            return Some(false);
        }
        let mut primary: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: primary_state implies both symbols; the primary context is active, so the
        // retain only counts a reference, which the release gives back at once.
        unsafe {
            check("cuDevicePrimaryCtxRetain", cu::cuDevicePrimaryCtxRetain(&mut primary, device)).ok()?;
            let _ = check("cuDevicePrimaryCtxRelease_v2", cu::cuDevicePrimaryCtxRelease_v2(device));
        }
        Some(primary as u64 == current)
    }

    fn current_ordinal(&self) -> Result<i32, DeviceError> {
        self.current_cu_device()
    }

    fn current_device(&self) -> Result<DeviceInfo, DeviceError> {
        use cu::CUdevice_attribute::*;
        let device = self.current_cu_device()?;
        let mut name = [0 as c_char; 256];
        // SAFETY: the buffer holds `len` bytes; the driver NUL-terminates within it.
        check("cuDeviceGetName", unsafe {
            cu::cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, device)
        })?;
        // SAFETY: NUL-terminated by the driver (the buffer was zeroed, so a NUL exists).
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy().into_owned();
        let major = self.attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
        let minor = self.attribute(device, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
        let multiprocessors = self.attribute(device, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let warp_size = self.attribute(device, CU_DEVICE_ATTRIBUTE_WARP_SIZE)?;
        let mut total = 0usize;
        // SAFETY: out-pointer is a valid local.
        check("cuDeviceTotalMem_v2", unsafe { cu::cuDeviceTotalMem_v2(&mut total, device) })?;
        let mut version = 0;
        // SAFETY: out-pointer is a valid local.
        check("cuDriverGetVersion", unsafe { cu::cuDriverGetVersion(&mut version) })?;
        Ok(DeviceInfo {
            vendor: Vendor::Nvidia,
            ordinal: device,
            name,
            arch: format!("sm_{major}{minor}"),
            total_memory: total as u64,
            multiprocessors: multiprocessors.max(0) as u32,
            warp_size: warp_size.max(0) as u32,
            runtime_version: version,
        })
    }

    fn malloc(&self, bytes: usize) -> Result<DevicePtr, DeviceError> {
        let mut ptr: cu::CUdeviceptr = 0;
        // SAFETY: out-pointer is a valid local; the current context owns the allocation.
        check("cuMemAlloc_v2", unsafe { cu::cuMemAlloc_v2(&mut ptr, bytes.max(1)) })?;
        Ok(ptr)
    }

    unsafe fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        // SAFETY: the caller guarantees ptr came from malloc and is no longer used.
        check("cuMemFree_v2", unsafe { cu::cuMemFree_v2(ptr) })
    }

    /// The pages are the shim's own (`mmap`), registered with the driver, not `cuMemHostAlloc`'s:
    /// a host that resets its device or destroys its context (`cudaDeviceReset` at the end of
    /// `main` is common) frees memory the driver allocated in that context, and the poller and
    /// the exit drain, which read the ring without a driver call, would then fault. Registered
    /// pages stay mapped on the host whatever the driver does; only the device mapping goes.
    fn alloc_mapped(&self, bytes: usize) -> Result<MappedHost, DeviceError> {
        let pages = HostPages::new(bytes.max(1))?;
        // SAFETY: `pages` is a private, page-aligned mapping of `pages.len()` bytes that lives
        // until free_mapped unregisters and unmaps it.
        check("cuMemHostRegister_v2", unsafe {
            cu::cuMemHostRegister_v2(pages.as_ptr(), pages.len(), cu::CU_MEMHOSTREGISTER_DEVICEMAP)
        })?;
        let mut device: cu::CUdeviceptr = 0;
        // SAFETY: the pages were registered with DEVICEMAP just above.
        if let Err(e) = check("cuMemHostGetDevicePointer_v2", unsafe {
            cu::cuMemHostGetDevicePointer_v2(&mut device, pages.as_ptr(), 0)
        }) {
            // SAFETY: registered above, not yet shared.
            unsafe { cu::cuMemHostUnregister(pages.as_ptr()) };
            return Err(e);
        }
        // Anonymous pages come zeroed, as the ring's readers need.
        Ok(MappedHost { host: pages.into_raw(), device, bytes })
    }

    unsafe fn free_mapped(&self, mapped: &MappedHost) -> Result<(), DeviceError> {
        // SAFETY: the caller guarantees the mapping came from alloc_mapped and is unused. A
        // context already destroyed has dropped the registration: the error is expected then,
        // and the pages are ours to unmap either way.
        let unregistered =
            check("cuMemHostUnregister", unsafe { cu::cuMemHostUnregister(mapped.host.cast()) });
        // SAFETY: alloc_mapped mapped exactly this range (HostPages rounds the same way).
        unsafe { HostPages::unmap(mapped.host, mapped.bytes.max(1)) };
        unregistered
    }

    fn copy_to_device_sync(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DeviceError> {
        // The shim's own stream where it has one: a copy on the legacy stream waits for all work
        // queued on it and on every blocking stream (a set-up would stall the host until the
        // GPU drains a default-stream queue), and if one of those streams is being captured it
        // joins, and so invalidates, that capture, even in relaxed mode.
        if let Some(s) = self.copy_stream() {
            // SAFETY: src is a valid slice that outlives the call: the stream is synchronised
            // before returning (pageable memory is staged by the driver before it returns anyway);
            // dst validity is the device's to check.
            check("cuMemcpyHtoDAsync_v2", unsafe {
                cu::cuMemcpyHtoDAsync_v2(dst, src.as_ptr() as *const c_void, src.len(), s)
            })?;
            // SAFETY: a stream this runtime created in the current context.
            return check("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(s) });
        }
        // SAFETY: src is a valid slice; dst validity is the device's to check (errors, not UB,
        // for a bad device address).
        check("cuMemcpyHtoD_v2", unsafe {
            cu::cuMemcpyHtoD_v2(dst, src.as_ptr() as *const c_void, src.len())
        })
    }

    fn copy_to_host_sync(&self, dst: &mut [u8], src: DevicePtr) -> Result<(), DeviceError> {
        // SAFETY: dst is a valid mutable slice of the given length.
        check("cuMemcpyDtoH_v2", unsafe {
            cu::cuMemcpyDtoH_v2(dst.as_mut_ptr() as *mut c_void, src, dst.len())
        })
    }

    fn copy_async(&self, dst: DevicePtr, src: DevicePtr, bytes: usize, s: Stream) -> Result<(), DeviceError> {
        // SAFETY: device addresses only; the driver reports invalid ones.
        check("cuMemcpyDtoDAsync_v2", unsafe { cu::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream(s)) })
    }

    fn memset_async(&self, dst: DevicePtr, value: u8, bytes: usize, s: Stream) -> Result<(), DeviceError> {
        // SAFETY: device address only; the driver reports invalid ones.
        check("cuMemsetD8Async", unsafe { cu::cuMemsetD8Async(dst, value, bytes, stream(s)) })
    }

    fn compiler_version(&self) -> Result<String, DeviceError> {
        let (major, minor) = self.nvrtc_version()?;
        // With the options only this backend adds: the string is part of the kernel cache key.
        Ok(format!("nvrtc {major}.{minor} {}", NVRTC_OPTIONS.join(" ")))
    }

    fn compile(
        &self,
        source: &str,
        name: &str,
        arch: &str,
        options: &[String],
        headers: &[(&str, &str)],
    ) -> Result<Vec<u8>, DeviceError> {
        self.ensure_nvrtc()?;
        let to_c =
            |s: &str| CString::new(s).map_err(|_| DeviceError::Unsupported(format!("NUL byte in {s:?}")));
        let c_source = to_c(source)?;
        let c_name = to_c(name)?;
        let mut all_options = vec![format!("--gpu-architecture={arch}")];
        all_options.extend(NVRTC_OPTIONS.iter().map(|o| o.to_string()));
        all_options.extend(options.iter().cloned());
        let c_options = all_options.iter().map(|o| to_c(o)).collect::<Result<Vec<_>, _>>()?;
        let option_ptrs: Vec<*const c_char> = c_options.iter().map(|o| o.as_ptr()).collect();
        let header_names = headers.iter().map(|(n, _)| to_c(n)).collect::<Result<Vec<_>, _>>()?;
        let header_texts = headers.iter().map(|(_, t)| to_c(t)).collect::<Result<Vec<_>, _>>()?;
        let name_ptrs: Vec<*const c_char> = header_names.iter().map(|h| h.as_ptr()).collect();
        let text_ptrs: Vec<*const c_char> = header_texts.iter().map(|h| h.as_ptr()).collect();
        let mut program: nvrtc::nvrtcProgram = std::ptr::null_mut();
        // SAFETY: NVRTC verified; all strings are NUL-terminated and outlive the program; the
        // header arrays have `headers.len()` entries each.
        check_nvrtc("nvrtcCreateProgram", unsafe {
            nvrtc::nvrtcCreateProgram(
                &mut program,
                c_source.as_ptr(),
                c_name.as_ptr(),
                headers.len() as i32,
                text_ptrs.as_ptr(),
                name_ptrs.as_ptr(),
            )
        })?;
        // SAFETY: program is valid until destroyed below; option pointers outlive the call.
        let compiled =
            unsafe { nvrtc::nvrtcCompileProgram(program, option_ptrs.len() as i32, option_ptrs.as_ptr()) };
        let result = if compiled != nvrtc::nvrtcResult::NVRTC_SUCCESS {
            Err(DeviceError::Compile {
                name: name.to_string(),
                arch: arch.to_string(),
                options: all_options.join(" "),
                log: program_log(program),
            })
        } else {
            let mut size = 0usize;
            // SAFETY: compiled program; out-pointer is a valid local.
            check_nvrtc("nvrtcGetCUBINSize", unsafe { nvrtc::nvrtcGetCUBINSize(program, &mut size) })
                .and_then(|_| {
                    let mut image = vec![0u8; size];
                    // SAFETY: image holds exactly `size` bytes as NVRTC asked.
                    check_nvrtc("nvrtcGetCUBIN", unsafe {
                        nvrtc::nvrtcGetCUBIN(program, image.as_mut_ptr() as *mut c_char)
                    })
                    .map(|_| image)
                })
        };
        // SAFETY: program was created above and is destroyed once.
        unsafe { nvrtc::nvrtcDestroyProgram(&mut program) };
        result
    }

    fn load_module(&self, image: &[u8]) -> Result<Module, DeviceError> {
        let mut module: cu::CUmodule = std::ptr::null_mut();
        // SAFETY: image is a complete CUBIN produced by NVRTC (or read back from our cache,
        // whose entries are checked before use); the driver validates it.
        check("cuModuleLoadData", unsafe {
            cu::cuModuleLoadData(&mut module, image.as_ptr() as *const c_void)
        })?;
        Ok(Module(module as u64))
    }

    fn get_function(&self, module: Module, name: &str) -> Result<Function, DeviceError> {
        let c_name =
            CString::new(name).map_err(|_| DeviceError::Unsupported(format!("NUL byte in {name:?}")))?;
        let mut function: cu::CUfunction = std::ptr::null_mut();
        // SAFETY: module came from load_module; the name is NUL-terminated.
        check("cuModuleGetFunction", unsafe {
            cu::cuModuleGetFunction(&mut function, module.0 as cu::CUmodule, c_name.as_ptr())
        })?;
        Ok(Function(function as u64))
    }

    unsafe fn launch(
        &self,
        function: Function,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        s: Stream,
        params: &mut [*mut c_void],
        order: LaunchOrder,
    ) -> Result<(), DeviceError> {
        if order == LaunchOrder::Early {
            // Programmatic stream serialization: the kernel may start before the grid ahead.
            if !self.early_launch {
                return Err(DeviceError::SymbolMissing { lib: "libcuda", name: "cuLaunchKernelEx" });
            }
            // SAFETY: plain data; every field the driver reads is set below.
            let mut attr: cu::CUlaunchAttribute = unsafe { std::mem::zeroed() };
            attr.id = cu::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            attr.value.programmaticStreamSerializationAllowed = 1;
            let config = cu::CUlaunchConfig {
                gridDimX: grid[0],
                gridDimY: grid[1],
                gridDimZ: grid[2],
                blockDimX: block[0],
                blockDimY: block[1],
                blockDimZ: block[2],
                sharedMemBytes: shared_bytes,
                hStream: stream(s),
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: early_launch implies the symbol; the caller guarantees params match the
            // kernel's signature and that the kernel waits for the prior grid before reading what
            // it writes (qs_wait_prior_grid).
            return check("cuLaunchKernelEx", unsafe {
                cu::cuLaunchKernelEx(
                    &config,
                    function.0 as cu::CUfunction,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            });
        }
        // SAFETY: the caller guarantees params match the kernel's signature.
        check("cuLaunchKernel", unsafe {
            cu::cuLaunchKernel(
                function.0 as cu::CUfunction,
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared_bytes,
                stream(s),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    fn early_launch(&self) -> bool {
        self.early_launch
    }

    fn exchange_capture_mode(&self, mode: u32) -> Result<u32, DeviceError> {
        use cu::CUstreamCaptureMode::*;
        let mut m = match mode {
            0 => CU_STREAM_CAPTURE_MODE_GLOBAL,
            1 => CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            _ => CU_STREAM_CAPTURE_MODE_RELAXED,
        };
        // SAFETY: in/out pointer to a valid local.
        check("cuThreadExchangeStreamCaptureMode", unsafe { cu::cuThreadExchangeStreamCaptureMode(&mut m) })?;
        Ok(m as u32)
    }

    fn is_capturing(&self, s: Stream) -> Result<bool, DeviceError> {
        let mut status = cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: out-pointer is a valid local.
        check("cuStreamIsCapturing", unsafe { cu::cuStreamIsCapturing(stream(s), &mut status) })?;
        Ok(status != cu::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    fn capture_id(&self, s: Stream) -> Result<Option<u64>, DeviceError> {
        if !self.graph_branches {
            return Ok(None);
        }
        Ok(self.capture_info(s)?.map(|(id, _, _)| id))
    }

    fn capture_graph(&self, s: Stream) -> Result<Option<(u64, u64)>, DeviceError> {
        if !self.graph_branches {
            return Ok(None);
        }
        Ok(self.capture_info(s)?.map(|(id, graph, _)| (id, graph as u64)))
    }

    fn last_captured_node(&self, s: Stream) -> Result<Option<(u64, u64, GraphNode)>, DeviceError> {
        if !self.graph_branches {
            return Ok(None);
        }
        Ok(match self.capture_info(s)? {
            // Work just enqueued on a capturing stream is its one capture dependency.
            Some((id, graph, deps)) if deps.len() == 1 => Some((id, graph as u64, GraphNode(deps[0] as u64))),
            _ => None,
        })
    }

    fn capture_frontier(&self, s: Stream) -> Result<Option<Vec<GraphNode>>, DeviceError> {
        if !self.branch_joins {
            return Ok(None);
        }
        Ok(self.capture_info(s)?.map(|(_, _, deps)| deps.into_iter().map(|n| GraphNode(n as u64)).collect()))
    }

    fn join_graph_branch(
        &self,
        s: Stream,
        node: GraphNode,
        from: &[GraphNode],
        into_stream: bool,
    ) -> Result<(), DeviceError> {
        let Some((_, graph, _)) = (if self.branch_joins { self.capture_info(s)? } else { None }) else {
            return Err(DeviceError::Unsupported("no capture in progress (or no graph edge calls)".into()));
        };
        let branch = node.0 as cu::CUgraphNode;
        let dependents_of = |f: GraphNode| -> Result<Vec<GraphNode>, DeviceError> {
            let f = f.0 as cu::CUgraphNode;
            let mut n = 0usize;
            // SAFETY (this block): branch_joins implies the symbols; the nodes belong to the
            // capture in progress (valid until it ends, which cannot happen during this call on
            // the capturing thread); out-pointers are valid locals or a vector of the driver's
            // own count.
            check("cuGraphNodeGetDependentNodes_v2", unsafe {
                cu::cuGraphNodeGetDependentNodes_v2(f, std::ptr::null_mut(), std::ptr::null_mut(), &mut n)
            })?;
            let mut dependents: Vec<cu::CUgraphNode> = vec![std::ptr::null_mut(); n];
            if n > 0 {
                check("cuGraphNodeGetDependentNodes_v2", unsafe {
                    cu::cuGraphNodeGetDependentNodes_v2(
                        f,
                        dependents.as_mut_ptr(),
                        std::ptr::null_mut(),
                        &mut n,
                    )
                })?;
                dependents.truncate(n);
            }
            Ok(dependents.into_iter().map(|d| GraphNode(d as u64)).collect())
        };
        for d in super::branch_join_edges(node, from, dependents_of)? {
            let d = d.0 as cu::CUgraphNode;
            // SAFETY: as above; adding edges is legal while capturing (only removal is not).
            check("cuGraphAddDependencies_v2", unsafe {
                cu::cuGraphAddDependencies_v2(graph, &branch, &d, std::ptr::null(), 1)
            })?;
        }
        if into_stream {
            let mut nodes = [branch];
            check("cuStreamUpdateCaptureDependencies_v2", unsafe {
                cu::cuStreamUpdateCaptureDependencies_v2(
                    stream(s),
                    nodes.as_mut_ptr(),
                    std::ptr::null(),
                    1,
                    cu::CUstreamUpdateCaptureDependencies_flags::CU_STREAM_ADD_CAPTURE_DEPENDENCIES as u32,
                )
            })?;
        }
        Ok(())
    }

    unsafe fn launch_graph_branch(
        &self,
        function: Function,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        s: Stream,
        params: &mut [*mut c_void],
        after: Option<GraphNode>,
    ) -> Result<GraphNode, DeviceError> {
        let Some((_, graph, mut deps)) = (if self.graph_branches { self.capture_info(s)? } else { None })
        else {
            return Err(DeviceError::Unsupported(
                "no capture in progress (or no cuGraphAddKernelNode_v2)".into(),
            ));
        };
        // A node listed twice is an invalid dependency set (the capture's frontier may already
        // hold `after`, e.g. a snapshot copy joined into the stream).
        if let Some(a) = after.map(|a| a.0 as cu::CUgraphNode).filter(|a| !deps.contains(a)) {
            deps.push(a);
        }
        // SAFETY: as this function's contract; graph and dependencies come from the capture.
        unsafe { add_kernel_node(graph, &deps, function, grid, block, shared_bytes, params) }
    }

    unsafe fn launch_graph_branch_from(
        &self,
        function: Function,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        s: Stream,
        params: &mut [*mut c_void],
        deps: &[GraphNode],
    ) -> Result<GraphNode, DeviceError> {
        let Some((_, graph, _)) = (if self.graph_branches { self.capture_info(s)? } else { None }) else {
            return Err(DeviceError::Unsupported(
                "no capture in progress (or no cuGraphAddKernelNode_v2)".into(),
            ));
        };
        let deps: Vec<cu::CUgraphNode> = deps.iter().map(|d| d.0 as cu::CUgraphNode).collect();
        // SAFETY: as this function's contract; the caller's nodes belong to this capture.
        unsafe { add_kernel_node(graph, &deps, function, grid, block, shared_bytes, params) }
    }

    fn synchronize(&self, s: Stream) -> Result<(), DeviceError> {
        // SAFETY: stream handle only; the driver validates it.
        check("cuStreamSynchronize", unsafe { cu::cuStreamSynchronize(stream(s)) })
    }

    fn create_side_stream(&self) -> Result<Stream, DeviceError> {
        let (mut least, mut greatest) = (0, 0);
        // SAFETY: out-pointers are valid locals.
        check("cuCtxGetStreamPriorityRange", unsafe {
            cu::cuCtxGetStreamPriorityRange(&mut least, &mut greatest)
        })?;
        let mut s: cu::CUstream = std::ptr::null_mut();
        // SAFETY: out-pointer is a valid local; `least` is the lowest priority.
        check("cuStreamCreateWithPriority", unsafe {
            cu::cuStreamCreateWithPriority(&mut s, CU_STREAM_NON_BLOCKING, least)
        })?;
        Ok(Stream(s as u64))
    }

    fn create_event(&self) -> Result<Event, DeviceError> {
        let mut e: cu::CUevent = std::ptr::null_mut();
        // SAFETY: out-pointer is a valid local.
        check("cuEventCreate", unsafe { cu::cuEventCreate(&mut e, CU_EVENT_DEFAULT) })?;
        Ok(Event(e as u64))
    }

    fn create_sync_event(&self) -> Result<Event, DeviceError> {
        let mut e: cu::CUevent = std::ptr::null_mut();
        // SAFETY: out-pointer is a valid local.
        check("cuEventCreate", unsafe { cu::cuEventCreate(&mut e, CU_EVENT_DISABLE_TIMING) })?;
        Ok(Event(e as u64))
    }

    fn record_event(&self, event: Event, s: Stream) -> Result<(), DeviceError> {
        // SAFETY: handles only; the driver validates them.
        check("cuEventRecord", unsafe { cu::cuEventRecord(event.0 as cu::CUevent, stream(s)) })
    }

    fn wait_event(&self, s: Stream, event: Event) -> Result<(), DeviceError> {
        // SAFETY: handles only; the driver validates them.
        check("cuStreamWaitEvent", unsafe { cu::cuStreamWaitEvent(stream(s), event.0 as cu::CUevent, 0) })
    }

    fn event_done(&self, event: Event) -> Result<bool, DeviceError> {
        // SAFETY: handle only; the driver validates it.
        let status = unsafe { cu::cuEventQuery(event.0 as cu::CUevent) };
        if status == cu::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check("cuEventQuery", status).map(|()| true)
    }

    fn elapsed_ms(&self, start: Event, end: Event) -> Result<f32, DeviceError> {
        let mut ms = 0f32;
        let (a, b) = (start.0 as cu::CUevent, end.0 as cu::CUevent);
        if !self.elapsed_v2 {
            return Err(DeviceError::SymbolMissing { lib: "libcuda", name: "cuEventElapsedTime_v2" });
        }
        // SAFETY: load() found the symbol present; out-pointer is a valid local.
        let status = unsafe { cu::cuEventElapsedTime_v2(&mut ms, a, b) };
        check("cuEventElapsedTime", status)?;
        Ok(ms)
    }
}

/// The compile log of an NVRTC program (empty if it cannot be read).
fn program_log(program: nvrtc::nvrtcProgram) -> String {
    let mut size = 0usize;
    // SAFETY: program is valid; out-pointer is a valid local.
    if unsafe { nvrtc::nvrtcGetProgramLogSize(program, &mut size) } != nvrtc::nvrtcResult::NVRTC_SUCCESS {
        return String::new();
    }
    let mut log = vec![0u8; size.max(1)];
    // SAFETY: log holds `size` bytes as NVRTC asked.
    if unsafe { nvrtc::nvrtcGetProgramLog(program, log.as_mut_ptr() as *mut c_char) }
        != nvrtc::nvrtcResult::NVRTC_SUCCESS
    {
        return String::new();
    }
    String::from_utf8_lossy(&log).trim_end_matches('\0').to_string()
}

/// Adds a kernel node after `deps` to the graph of a capture in progress.
///
/// # Safety
/// `graph` and `deps` belong to a capture in progress on the calling thread (valid until it
/// ends, which cannot happen during this call); `params` match the kernel (the driver copies
/// them).
#[allow(clippy::too_many_arguments)]
unsafe fn add_kernel_node(
    graph: cu::CUgraph,
    deps: &[cu::CUgraphNode],
    function: Function,
    grid: [u32; 3],
    block: [u32; 3],
    shared_bytes: u32,
    params: &mut [*mut c_void],
) -> Result<GraphNode, DeviceError> {
    let node_params = cu::CUDA_KERNEL_NODE_PARAMS {
        func: function.0 as cu::CUfunction,
        gridDimX: grid[0],
        gridDimY: grid[1],
        gridDimZ: grid[2],
        blockDimX: block[0],
        blockDimY: block[1],
        blockDimZ: block[2],
        sharedMemBytes: shared_bytes,
        kernelParams: params.as_mut_ptr(),
        extra: std::ptr::null_mut(),
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    };
    let mut node: cu::CUgraphNode = std::ptr::null_mut();
    // SAFETY: the symbol was found at load (graph_branches); see the function's contract.
    check("cuGraphAddKernelNode_v2", unsafe {
        cu::cuGraphAddKernelNode_v2(&mut node, graph, deps.as_ptr(), deps.len(), &node_params)
    })?;
    Ok(GraphNode(node as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_or_reports_a_clean_error() {
        // Without a driver (CI), a typed error naming what was searched; with one, a runtime
        // whose device query either works or says there is no context / device.
        match CudaRuntime::load() {
            Err(DeviceError::LibraryMissing { lib, searched }) => {
                assert_eq!(lib, "libcuda");
                assert!(searched.contains("libcuda.so"));
            }
            Err(other) => panic!("unexpected error: {other}"),
            Ok(runtime) => match runtime.current_device() {
                Ok(info) => assert!(info.arch.starts_with("sm_")),
                Err(DeviceError::NoContext { .. } | DeviceError::NoDevice { .. }) => {}
                Err(other) => panic!("unexpected error: {other}"),
            },
        }
    }

    #[test]
    fn driver_structs_the_shim_zero_initialises_may_be_zero() {
        // Zero-initialising a struct that holds an enum without a zero value panics, and that
        // panic cannot unwind: it aborts the host process (session 22 `exp95`, cudarc's
        // CUDA_MEMCPY3D). Every driver struct the shim zero-initialises is listed here, so that
        // such a struct fails on a CPU first.
        // SAFETY: the point of the test; the values are dropped unread.
        let _: cu::CUlaunchAttribute = unsafe { std::mem::zeroed() }; // launch, early start
        let _: cu::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() }; // cuda_graph clear_gate
    }
}
