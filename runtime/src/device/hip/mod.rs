//! HIP runtime (AMD): [`GpuRuntime`] over libamdhip64 and hipRTC, both loaded at run time.
//!
//! Three layers, as in `STYLE.md`: `sys` holds the raw symbol tables and ABI constants,
//! `result` turns every call into a `Result`, and this module is the safe runtime.
//!
//! Loading ([`HipRuntime::load`]) only opens the library and resolves symbols; it makes no HIP
//! call. Every method works on the caller's current device (`hipGetDevice`): the runtime
//! never calls `hipSetDevice` or creates a context.
//!
//! Library selection, in order:
//! - `QUANTSHADOW_HIP_LIB` (or [`HipLoadOptions::hip_library`]): that file and nothing else;
//! - a `libamdhip64.so*` the process has already loaded (the engine's own runtime);
//! - `libamdhip64.so`, `.so.7`, `.so.6`, `.so.5`, then `$ROCM_PATH/lib/libamdhip64.so`
//!   (`/opt/rocm` when `ROCM_PATH` is unset).
//!
//! hipRTC is opened at the first [`GpuRuntime::compile`]: `QUANTSHADOW_HIPRTC_LIB`, else the
//! HIP library itself when it exports hipRTC (ROCm up to 5.2), else a loaded `libhiprtc.so*`,
//! else `libhiprtc.so*` beside the HIP library, else the sonames and `$ROCM_PATH/lib`.

use super::host_pages::HostPages;
use std::ffi::{c_int, c_void, CString};
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use super::{
    DeviceError, DeviceInfo, DevicePtr, Event, Function, GpuRuntime, LaunchOrder, MappedHost, Module, Stream,
    Vendor,
};

mod result;
mod sys;

use result::PropsLayout;
use sys::props;

/// Vendor name in `DeviceError::NoDevice`.
const VENDOR: &str = "AMD";

/// `hipRuntimeGetVersion` encodes `major * 10_000_000 + minor * 100_000 + patch`
/// (ROCm 5.2.3 hip_version.h `HIP_VERSION`).
const HIP_VERSION_6_0: c_int = 60_000_000;

/// Where to find the libraries; [`HipLoadOptions::from_env`] is what [`HipRuntime::load`] uses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HipLoadOptions {
    /// Open exactly this HIP runtime (a path or a soname) instead of searching.
    pub hip_library: Option<PathBuf>,
    /// Open exactly this hipRTC library instead of searching.
    pub hiprtc_library: Option<PathBuf>,
}

impl HipLoadOptions {
    /// `QUANTSHADOW_HIP_LIB` and `QUANTSHADOW_HIPRTC_LIB`; unset or empty means "search".
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        HipLoadOptions { hip_library: var(sys::HIP_LIB_ENV), hiprtc_library: var(sys::HIPRTC_LIB_ENV) }
    }
}

/// The HIP runtime of this process, loaded at run time.
pub struct HipRuntime {
    hip: sys::HipLib,
    hiprtc_override: Option<PathBuf>,
    /// Opened at the first compile; the outcome (library or error) is kept for the process.
    rtc: OnceLock<Result<sys::RtcLib, DeviceError>>,
    /// The comgr hipRTC loaded, found after the first program is created.
    comgr: OnceLock<sys::ComgrLib>,
    /// The shim's non-blocking stream of each device for its synchronous host-to-device copies
    /// (device ordinal, stream), at most [`COPY_STREAMS_MAX`] ([`HipRuntime::copy_stream`]).
    copy_streams: Mutex<Vec<(c_int, usize)>>,
}

/// Devices whose copy stream is kept; copies on more devices take the null stream.
const COPY_STREAMS_MAX: usize = 16;

impl std::fmt::Debug for HipRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HipRuntime").field("library", &self.hip.path).finish_non_exhaustive()
    }
}

impl HipRuntime {
    /// Opens the HIP runtime as [`HipLoadOptions::from_env`] says. Cheap: no HIP call is made.
    pub fn load() -> Result<Self, DeviceError> {
        Self::load_with(&HipLoadOptions::from_env())
    }

    /// Opens the HIP runtime from explicit locations (tests, tools).
    pub fn load_with(options: &HipLoadOptions) -> Result<Self, DeviceError> {
        let hip = sys::HipLib::open(options.hip_library.as_deref())?;
        Ok(HipRuntime {
            hip,
            hiprtc_override: options.hiprtc_library.clone(),
            rtc: OnceLock::new(),
            comgr: OnceLock::new(),
            copy_streams: Mutex::new(Vec::new()),
        })
    }

    /// The shim's non-blocking stream of the current device for its synchronous host-to-device
    /// copies, made at the first copy on that device; None past [`COPY_STREAMS_MAX`] devices or
    /// if the stream cannot be made (the copy then takes the null stream, as before). HIP has
    /// one context per device, so the device ordinal keys it (a `hipDeviceReset` by the host
    /// would leave a dead handle: the copies then fail, which the engine counts as skips).
    fn copy_stream(&self) -> Option<*mut c_void> {
        let device = result::get_device(&self.hip).ok()?;
        let mut streams = self.copy_streams.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&(_, s)) = streams.iter().find(|(d, _)| *d == device) {
            return Some(s as *mut c_void);
        }
        if streams.len() >= COPY_STREAMS_MAX {
            return None;
        }
        // Priority 0 is the default, valid on every device.
        let s = result::stream_create_with_priority(&self.hip, sys::HIP_STREAM_NON_BLOCKING, 0).ok()?;
        streams.push((device, s as usize));
        Some(s)
    }

    /// The file the HIP symbols were taken from.
    pub fn library_path(&self) -> &str {
        &self.hip.path
    }

    /// HIP symbols this runtime uses that the loaded library does not export (older ROCm
    /// versions lack some; each becomes `SymbolMissing` at the call that needs it).
    pub fn missing_symbols(&self) -> Vec<&'static str> {
        self.hip.fns.missing()
    }

    /// Every HIP symbol this runtime may call (the symbol table, in declaration order).
    pub fn hip_symbols() -> &'static [&'static str] {
        sys::HipFns::NAMES
    }

    /// The `hipHostRegister` flags this runtime pins, as (C name, value), for comparison with a
    /// header's; [`HipRuntime::ring_register_flags`] is the one combination it passes.
    pub fn host_register_flags() -> &'static [(&'static str, u32)] {
        sys::HOST_REGISTER_FLAGS
    }

    /// The flags [`GpuRuntime::alloc_mapped`] registers its pages with (`hipHostRegisterMapped`).
    pub fn ring_register_flags() -> u32 {
        sys::HIP_RING_REGISTER_FLAGS
    }

    /// The file hipRTC symbols come from, opening hipRTC if that has not happened yet.
    pub fn hiprtc_path(&self) -> Result<String, DeviceError> {
        Ok(self.rtc()?.path.clone())
    }

    /// The full gfx target of a device as the runtime reports it, e.g.
    /// `gfx942:sramecc+:xnack-` (features included; [`DeviceInfo::arch`] has only `gfx942`).
    pub fn device_target(&self, ordinal: i32) -> Result<String, DeviceError> {
        let version = result::runtime_get_version(&self.hip)?;
        self.read_target(ordinal, version)
    }

    fn rtc(&self) -> Result<&sys::RtcLib, DeviceError> {
        self.rtc
            .get_or_init(|| sys::RtcLib::open(&self.hip, self.hiprtc_override.as_deref()))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// gcnArchName from the device properties, in the layout this runtime version fills.
    fn read_target(&self, ordinal: c_int, version: c_int) -> Result<String, DeviceError> {
        let layout = if self.hip.fns.hipGetDevicePropertiesR0600.is_some() {
            PropsLayout::R0600
        } else if version < HIP_VERSION_6_0 {
            PropsLayout::R0000
        } else {
            // A 6.x library whose plain hipGetDeviceProperties could be either layout: reading
            // a string at a guessed offset is worse than not knowing the target.
            return Err(DeviceError::Unsupported(format!(
                "HIP runtime version {version} ({}) exports no hipGetDevicePropertiesR0600; \
                 cannot read the device's gfx target",
                self.hip.path
            )));
        };
        let mut buf = props::Buffer([0; props::BUFFER_BYTES]);
        result::get_device_properties(&self.hip, layout, &mut buf, ordinal)?;
        let offset = match layout {
            PropsLayout::R0600 => props::R0600_GCN_ARCH_NAME_OFFSET,
            PropsLayout::R0000 => props::R0000_GCN_ARCH_NAME_OFFSET,
        };
        let field = &buf.0[offset..offset + props::GCN_ARCH_NAME_BYTES];
        let text = field
            .iter()
            .position(|&b| b == 0)
            .and_then(|end| std::str::from_utf8(&field[..end]).ok())
            .filter(|s| is_gfx_target(s));
        match text {
            Some(target) => Ok(target.to_string()),
            None => Err(DeviceError::Unsupported(format!(
                "hipDeviceProp_t ({layout:?} layout) from {} holds no gfx target at offset {offset} \
                 (first bytes {:02x?}): the struct layout is not the one expected",
                self.hip.path,
                &field[..16]
            ))),
        }
    }

    /// Refuses targets the installed compiler does not know, when hipRTC's comgr can say:
    /// ROCm 5.2's hipRTC takes the process down when asked to compile for one (glibc abort
    /// "munmap_chunk(): invalid pointer" for gfx942, SIGSEGV for gfx9999), and the shim must
    /// never take the host down.
    /// Call after a program exists: hipRTC loads comgr when creating the first program.
    fn check_target_known(&self, arch: &str) -> Result<(), String> {
        if self.comgr.get().is_none() {
            if let Some(found) = sys::ComgrLib::find_loaded() {
                // Another thread may have set it first; either value is the same library.
                let _ = self.comgr.set(found);
            }
        }
        let Some(comgr) = self.comgr.get() else {
            return Ok(());
        };
        let Ok(isas) = result::comgr_isa_names(comgr) else {
            return Ok(());
        };
        let wanted = gfx_base(arch);
        let known: Vec<&str> =
            isas.iter().map(|isa| gfx_base(isa.rsplit("--").next().unwrap_or(isa))).collect();
        if known.contains(&wanted) {
            Ok(())
        } else {
            Err(format!(
                "{wanted} is not a target of the installed compiler ({}); not compiling, as some hipRTC \
                 versions abort the process on unknown targets. Known targets: {}",
                comgr.path,
                known.join(" ")
            ))
        }
    }
}

/// `gfx942` from `gfx942:sramecc+:xnack-`.
fn gfx_base(target: &str) -> &str {
    target.split(':').next().unwrap_or(target)
}

/// `gfx` + lowercase letters, digits or '-' (generic targets), then `:feature+` / `:feature-`.
fn is_gfx_target(target: &str) -> bool {
    let mut parts = target.split(':');
    let base = parts.next().unwrap_or("");
    let base_ok = base.len() > 3
        && base.starts_with("gfx")
        && base[3..].bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    base_ok
        && parts.all(|feature| {
            let name = feature.strip_suffix('+').or_else(|| feature.strip_suffix('-')).unwrap_or("");
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase())
        })
}

/// Checks that `image` is a whole code object before HIP parses it: HIP takes no size and
/// reads the ELF (or offload bundle) headers to find the rest, so a truncated image would be
/// read past its end.
fn check_code_object(image: &[u8]) -> Result<(), DeviceError> {
    const BUNDLE_MAGIC: &[u8] = b"__CLANG_OFFLOAD_BUNDLE__";
    if image.starts_with(BUNDLE_MAGIC) {
        return Ok(());
    }
    let bad = |why: &str| {
        DeviceError::Unsupported(format!("not a loadable code object ({} bytes): {why}", image.len()))
    };
    if !image.starts_with(b"\x7fELF") {
        return Err(bad("no ELF or offload-bundle magic"));
    }
    // ELF64 little-endian header fields (System V gABI): class at 4, data at 5, e_phoff at
    // 0x20, e_shoff at 0x28, e_phentsize/e_phnum at 0x36/0x38, e_shentsize/e_shnum at 0x3A/0x3C.
    if image.len() < 64 || image[4] != 2 || image[5] != 1 {
        return Err(bad("not a complete little-endian ELF64 header"));
    }
    let u64_at = |at: usize| u64::from_le_bytes(image[at..at + 8].try_into().unwrap_or([0xff; 8]));
    let u16_at = |at: usize| u64::from(u16::from_le_bytes([image[at], image[at + 1]]));
    let table_end = |offset: u64, entsize: u64, count: u64| offset.checked_add(entsize * count);
    let len = image.len() as u64;
    match (
        table_end(u64_at(0x20), u16_at(0x36), u16_at(0x38)),
        table_end(u64_at(0x28), u16_at(0x3A), u16_at(0x3C)),
    ) {
        (Some(ph), Some(sh)) if ph <= len && sh <= len => Ok(()),
        _ => Err(bad("program or section header table lies past the end")),
    }
}

fn stream_ptr(stream: Stream) -> *mut c_void {
    stream.0 as usize as *mut c_void
}

fn device_ptr(ptr: DevicePtr) -> *mut c_void {
    ptr as usize as *mut c_void
}

impl GpuRuntime for HipRuntime {
    fn vendor(&self) -> Vendor {
        Vendor::Amd
    }

    fn current_ordinal(&self) -> Result<i32, DeviceError> {
        result::get_device(&self.hip)
    }

    fn current_device(&self) -> Result<DeviceInfo, DeviceError> {
        let (status, count) = result::get_device_count(&self.hip)?;
        if status == sys::HIP_ERROR_NO_DEVICE || status == sys::HIP_ERROR_INSUFFICIENT_DRIVER {
            let error = result::hip_error(&self.hip, "hipGetDeviceCount", status);
            return Err(DeviceError::NoDevice {
                vendor: VENDOR,
                detail: format!("{error} [{}]", self.hip.path),
            });
        }
        result::check(&self.hip, "hipGetDeviceCount", status)?;
        if count <= 0 {
            return Err(DeviceError::NoDevice {
                vendor: VENDOR,
                detail: format!("hipGetDeviceCount reported {count} devices [{}]", self.hip.path),
            });
        }
        let ordinal = result::get_device(&self.hip)?;
        let version = result::runtime_get_version(&self.hip)?;
        let marketing_name = result::device_get_name(&self.hip, ordinal)?;
        let total_memory = result::device_total_mem(&self.hip, ordinal)?;
        let multiprocessors =
            result::device_get_attribute(&self.hip, sys::HIP_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, ordinal)?;
        let warp_size =
            result::device_get_attribute(&self.hip, sys::HIP_DEVICE_ATTRIBUTE_WARP_SIZE, ordinal)?;
        let target = self.read_target(ordinal, version)?;
        let arch = gfx_base(&target).to_string();
        // DeviceInfo has no field for the target features (xnack, sramecc); they matter when
        // reading a report, so they travel in the name.
        let name = if target == arch { marketing_name } else { format!("{marketing_name} ({target})") };
        Ok(DeviceInfo {
            vendor: Vendor::Amd,
            ordinal,
            name,
            arch,
            total_memory,
            multiprocessors: u32::try_from(multiprocessors).unwrap_or(0),
            warp_size: u32::try_from(warp_size).unwrap_or(0),
            runtime_version: version,
        })
    }

    fn malloc(&self, bytes: usize) -> Result<DevicePtr, DeviceError> {
        Ok(result::malloc(&self.hip, bytes)? as usize as DevicePtr)
    }

    unsafe fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        // SAFETY: the caller guarantees `ptr` came from `malloc` and is not used afterwards.
        unsafe { result::free(&self.hip, device_ptr(ptr)) }
    }

    /// The pages are the shim's own (`mmap`), registered with HIP, not `hipHostMalloc`'s: memory
    /// HIP allocated lives as long as HIP keeps it (what a host's `hipDeviceReset` or HIP's own
    /// teardown does to it depends on the version), and the poller and the exit drain read the
    /// ring without a HIP call, so they would fault on pages HIP gave back. HIP never unmaps
    /// registered pages: whatever it does, they stay readable until `free_mapped`. Coherence is
    /// what `hipHostMalloc(Coherent)` gave (`sys::HIP_RING_REGISTER_FLAGS`).
    fn alloc_mapped(&self, bytes: usize) -> Result<MappedHost, DeviceError> {
        if bytes == 0 {
            return Err(DeviceError::Unsupported("alloc_mapped of 0 bytes".into()));
        }
        result::host_register_available(&self.hip)?;
        // Dropped (unmapped) on every early return below until handed over.
        let pages = HostPages::new(bytes)?;
        // SAFETY: a private mapping of `pages.len()` bytes owned here; it stays mapped until
        // hipHostUnregister has succeeded on it (below, or in free_mapped).
        unsafe {
            result::host_register(&self.hip, pages.as_ptr(), pages.len(), sys::HIP_RING_REGISTER_FLAGS)?
        };
        // SAFETY: registered mapped just above and not yet shared.
        let device = match unsafe { result::host_get_device_pointer(&self.hip, pages.as_ptr()) } {
            Ok(device) if !device.is_null() => device,
            outcome => {
                let error = outcome.err().unwrap_or_else(|| {
                    DeviceError::Unsupported("hipHostGetDevicePointer gave a null device address".into())
                });
                // SAFETY: registered above; no kernel has its device address.
                if unsafe { result::host_unregister(&self.hip, pages.as_ptr()) }.is_err() {
                    // Still registered as far as HIP is concerned: the pages must outlive that
                    // (see free_mapped), so they are left mapped.
                    pages.leak();
                }
                return Err(error);
            }
        };
        // Anonymous pages come zeroed, as the ring's readers need.
        Ok(MappedHost { host: pages.into_raw(), device: device as usize as DevicePtr, bytes })
    }

    /// Unregisters, then unmaps. If HIP refuses to unregister, the pages are left mapped (a leak
    /// of one ring): after a host's `hipDeviceReset`, clr's `MemObjMap::Purge` can drop the
    /// registration from its map without releasing it, so the answer is
    /// hipErrorHostMemoryNotRegistered while the pages may stay locked for the device; unmapped,
    /// their address range could go to the host's next `mmap` with HIP's lock still covering it.
    unsafe fn free_mapped(&self, mapped: &MappedHost) -> Result<(), DeviceError> {
        // SAFETY: the caller guarantees `mapped` came from alloc_mapped and is not used
        // afterwards, so nothing writes through its device address any more.
        unsafe { result::host_unregister(&self.hip, mapped.host.cast())? };
        // SAFETY: alloc_mapped mapped exactly this range (HostPages rounds the same way), and
        // HIP no longer has it registered.
        unsafe { HostPages::unmap(mapped.host, mapped.bytes) };
        Ok(())
    }

    fn copy_to_device_sync(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DeviceError> {
        // The shim's own stream where it has one: a copy on the null stream waits for all work
        // queued on it and on every blocking stream, and joins (so invalidates) a capture on one
        // of those, as CUDA's legacy stream does (cuda.rs; the CUDA case verified on an H100,
        // docs/measurements/2026-11-27-h100-copy-cost-and-checks-beside.md).
        if let Some(s) = self.copy_stream() {
            // SAFETY: `src` is a live slice of exactly the length passed and outlives the copy:
            // the stream is synchronised before returning. HIP validates `dst`.
            unsafe {
                result::memcpy_async(
                    &self.hip,
                    device_ptr(dst),
                    src.as_ptr().cast(),
                    src.len(),
                    sys::HIP_MEMCPY_HOST_TO_DEVICE,
                    s,
                )?
            };
            return result::stream_synchronize(&self.hip, s);
        }
        // SAFETY: `src` is a live slice of exactly the length passed; HIP validates `dst`.
        unsafe { result::memcpy_htod(&self.hip, device_ptr(dst), src.as_ptr().cast(), src.len()) }
    }

    fn copy_to_host_sync(&self, dst: &mut [u8], src: DevicePtr) -> Result<(), DeviceError> {
        // SAFETY: `dst` is a live, exclusive slice of exactly the length passed; HIP validates `src`.
        unsafe { result::memcpy_dtoh(&self.hip, dst.as_mut_ptr().cast(), device_ptr(src), dst.len()) }
    }

    fn copy_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: Stream,
    ) -> Result<(), DeviceError> {
        // SAFETY: the trait's contract: both are device allocations the caller keeps alive until
        // the stream reaches the copy; HIP validates the addresses and the stream handle.
        unsafe {
            result::memcpy_async(
                &self.hip,
                device_ptr(dst),
                device_ptr(src),
                bytes,
                sys::HIP_MEMCPY_DEVICE_TO_DEVICE,
                stream_ptr(stream),
            )
        }
    }

    fn memset_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: Stream,
    ) -> Result<(), DeviceError> {
        // SAFETY: as for copy_async.
        unsafe { result::memset_d8_async(&self.hip, device_ptr(dst), value, bytes, stream_ptr(stream)) }
    }

    fn compiler_version(&self) -> Result<String, DeviceError> {
        // hipRTC ships with the HIP runtime: its version and the file it came from identify it.
        let version = result::runtime_get_version(&self.hip)?;
        Ok(format!("hiprtc (HIP runtime {version}) {}", self.rtc()?.path))
    }

    fn compile(
        &self,
        source: &str,
        name: &str,
        arch: &str,
        options: &[String],
        headers: &[(&str, &str)],
    ) -> Result<Vec<u8>, DeviceError> {
        let mut all_options = vec![format!("--offload-arch={arch}")];
        all_options.extend(options.iter().cloned());
        let compile_error = |log: String| DeviceError::Compile {
            name: name.to_string(),
            arch: arch.to_string(),
            options: all_options.join(" "),
            log,
        };
        if !is_gfx_target(arch) {
            return Err(compile_error(format!(
                "'{arch}' is not an AMD GPU target (gfx..., optionally with :feature+ or :feature- suffixes)"
            )));
        }
        let rtc = self.rtc()?;
        // hipRTC (with comgr) is not safe to call from two threads at once: two concurrent
        // compiles in one process crashed ROCm 5.2's (seen in this crate's tests). Kernels are
        // compiled once per program and cached, so serialising costs nothing that matters.
        static COMPILE: Mutex<()> = Mutex::new(());
        let _serialised = COMPILE.lock().unwrap_or_else(|e| e.into_inner());
        let c_source =
            CString::new(source).map_err(|_| compile_error("the source contains a NUL byte".into()))?;
        let c_name =
            CString::new(name).map_err(|_| compile_error("the program name contains a NUL byte".into()))?;
        let c_options = all_options
            .iter()
            .map(|o| CString::new(o.as_str()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| compile_error("an option contains a NUL byte".into()))?;
        let option_ptrs: Vec<_> = c_options.iter().map(|o| o.as_ptr()).collect();

        let c_headers = headers
            .iter()
            .map(|(n, t)| Ok((CString::new(*n)?, CString::new(*t)?)))
            .collect::<Result<Vec<_>, std::ffi::NulError>>()
            .map_err(|_| compile_error("a header contains a NUL byte".into()))?;
        let program = result::Program::create(rtc, &c_source, &c_name, &c_headers)?;
        self.check_target_known(arch).map_err(&compile_error)?;
        let status = program.compile(&option_ptrs)?;
        if status != sys::HIPRTC_SUCCESS {
            let log = program.log().unwrap_or_else(|e| format!("(no compiler log: {e})"));
            let error = result::rtc_error(rtc, "hiprtcCompileProgram", status);
            let log = if log.trim().is_empty() { error.to_string() } else { format!("{log}\n{error}") };
            return Err(compile_error(log));
        }
        let code = program.code()?;
        if code.is_empty() {
            return Err(compile_error("hipRTC reported success but returned an empty code object".into()));
        }
        Ok(code)
    }

    fn load_module(&self, image: &[u8]) -> Result<Module, DeviceError> {
        check_code_object(image)?;
        // HIP may read the image after loading: clr's DynCO stores the pointer in the module's
        // FatBinaryInfo. This trait never unloads a module, so the copy handed to HIP is leaked
        // on purpose: it lives as long as the module can. The u64 words give the ELF
        // readers 8-byte alignment. Kernels are compiled once per (arch, options), so this is
        // bounded by the kernel registry.
        let mut words = vec![0u64; image.len().div_ceil(8)];
        // SAFETY: `words` has at least `image.len()` bytes and does not overlap `image`.
        unsafe {
            std::ptr::copy_nonoverlapping(image.as_ptr(), words.as_mut_ptr().cast::<u8>(), image.len())
        };
        let copy: &'static [u64] = Box::leak(words.into_boxed_slice());
        // SAFETY: a complete code object (checked above) that outlives the module.
        let module = unsafe { result::module_load_data(&self.hip, copy.as_ptr().cast())? };
        Ok(Module(module as usize as u64))
    }

    fn get_function(&self, module: Module, name: &str) -> Result<Function, DeviceError> {
        let c_name = CString::new(name)
            .map_err(|_| DeviceError::Unsupported(format!("kernel name {name:?} contains a NUL byte")))?;
        let function = result::module_get_function(&self.hip, module.0 as usize as *mut c_void, &c_name)?;
        Ok(Function(function as usize as u64))
    }

    unsafe fn launch(
        &self,
        function: Function,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        stream: Stream,
        params: &mut [*mut c_void],
        order: LaunchOrder,
    ) -> Result<(), DeviceError> {
        if order == LaunchOrder::Early {
            return Err(DeviceError::Unsupported(
                "HIP has no early starts (programmatic dependent launch)".into(),
            ));
        }
        let params = if params.is_empty() { std::ptr::null_mut() } else { params.as_mut_ptr() };
        // SAFETY: the caller guarantees `params` matches the kernel's parameters and that the
        // memory the kernel touches is valid; HIP validates the function and stream handles.
        unsafe {
            result::module_launch_kernel(
                &self.hip,
                function.0 as usize as *mut c_void,
                grid,
                block,
                shared_bytes,
                stream_ptr(stream),
                params,
            )
        }
    }

    fn is_capturing(&self, stream: Stream) -> Result<bool, DeviceError> {
        match result::stream_is_capturing(&self.hip, stream_ptr(stream))? {
            sys::HIP_STREAM_CAPTURE_STATUS_NONE => Ok(false),
            // An invalidated capture is still a capture: work enqueued now would not run as
            // ordinary stream work, and allocating or syncing would be just as wrong.
            sys::HIP_STREAM_CAPTURE_STATUS_ACTIVE | sys::HIP_STREAM_CAPTURE_STATUS_INVALIDATED => Ok(true),
            other => Err(DeviceError::Unsupported(format!(
                "hipStreamIsCapturing returned unknown hipStreamCaptureStatus {other}"
            ))),
        }
    }

    fn synchronize(&self, stream: Stream) -> Result<(), DeviceError> {
        result::stream_synchronize(&self.hip, stream_ptr(stream))
    }

    fn create_side_stream(&self) -> Result<Stream, DeviceError> {
        let (least, _greatest) = result::device_get_stream_priority_range(&self.hip)?;
        let stream = result::stream_create_with_priority(&self.hip, sys::HIP_STREAM_NON_BLOCKING, least)?;
        Ok(Stream(stream as usize as u64))
    }

    fn create_event(&self) -> Result<Event, DeviceError> {
        let event = result::event_create_with_flags(&self.hip, sys::HIP_EVENT_DEFAULT)?;
        Ok(Event(event as usize as u64))
    }

    fn create_sync_event(&self) -> Result<Event, DeviceError> {
        let event = result::event_create_with_flags(&self.hip, sys::HIP_EVENT_DISABLE_TIMING)?;
        Ok(Event(event as usize as u64))
    }

    fn record_event(&self, event: Event, stream: Stream) -> Result<(), DeviceError> {
        result::event_record(&self.hip, event.0 as usize as *mut c_void, stream_ptr(stream))
    }

    fn wait_event(&self, stream: Stream, event: Event) -> Result<(), DeviceError> {
        result::stream_wait_event(&self.hip, stream_ptr(stream), event.0 as usize as *mut c_void)
    }

    fn event_done(&self, event: Event) -> Result<bool, DeviceError> {
        result::event_query(&self.hip, event.0 as usize as *mut c_void)
    }

    fn elapsed_ms(&self, start: Event, end: Event) -> Result<f32, DeviceError> {
        result::event_elapsed_time(&self.hip, start.0 as usize as *mut c_void, end.0 as usize as *mut c_void)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gfx_targets_are_recognised() {
        for good in ["gfx90a", "gfx942:sramecc+:xnack-", "gfx1100", "gfx9-4-generic", "gfx90a:xnack+"] {
            assert!(is_gfx_target(good), "{good}");
        }
        for bad in [
            "",
            "gfx",
            "sm_90",
            "gfx942:",
            "gfx942:xnack",
            "gfx942:+",
            "GFX942",
            "gfx942 -O3",
            "gfx94\u{e9}",
            "gfx942:x\u{e9}",
        ] {
            assert!(!is_gfx_target(bad), "{bad}");
        }
        assert_eq!(gfx_base("gfx942:sramecc+:xnack-"), "gfx942");
        assert_eq!(gfx_base("gfx90a"), "gfx90a");
    }

    #[test]
    fn ring_register_flags_are_mapped_and_fine_grained() {
        assert_eq!(HipRuntime::ring_register_flags(), 0x2, "hipHostRegisterMapped");
        assert_eq!(HipRuntime::ring_register_flags() & sys::HIP_EXT_HOST_REGISTER_COARSE_GRAINED, 0);
    }

    #[test]
    fn code_object_check_rejects_truncated_images() {
        let mut header = vec![0u8; 64];
        header[..4].copy_from_slice(b"\x7fELF");
        header[4] = 2;
        header[5] = 1;
        assert!(check_code_object(&header).is_ok());
        assert!(check_code_object(&header[..63]).is_err());
        assert!(check_code_object(b"not elf").is_err());
        assert!(check_code_object(b"").is_err());
        // A section header table of 2 x 64 bytes at offset 64 needs 192 bytes.
        header[0x28] = 64;
        header[0x3A] = 64;
        header[0x3C] = 2;
        assert!(check_code_object(&header).is_err());
        header.resize(192, 0);
        assert!(check_code_object(&header).is_ok());
        assert!(check_code_object(b"__CLANG_OFFLOAD_BUNDLE__\0\0").is_ok());
    }

    #[test]
    fn call_errors_carry_the_vendor_text() {
        let both = result::call_error(
            "hipMalloc",
            2,
            Some("hipErrorOutOfMemory".into()),
            Some("out of memory".into()),
        );
        assert_eq!(
            both,
            DeviceError::Call {
                call: "hipMalloc",
                code: 2,
                message: "hipErrorOutOfMemory: out of memory".into()
            }
        );
        // ROCm 5.2's hipGetErrorString returns the name again: say it once.
        let same = result::call_error(
            "hipFree",
            1,
            Some("hipErrorInvalidValue".into()),
            Some("hipErrorInvalidValue".into()),
        );
        assert_eq!(
            same,
            DeviceError::Call { call: "hipFree", code: 1, message: "hipErrorInvalidValue".into() }
        );
        let none = result::call_error("hipFree", 1, None, None);
        assert!(
            matches!(none, DeviceError::Call { code: 1, ref message, .. } if message.contains("no error text"))
        );
    }
}
