//! Each raw call wrapped so that it returns `Result`: a missing symbol becomes
//! `DeviceError::SymbolMissing`, a status other than success becomes `DeviceError::Call` with
//! the vendor's own name and description of the status.
//!
//! Out-parameters start zeroed rather than uninitialised: a library that reports success
//! without writing one leaves a defined zero behind, not undefined behaviour.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr;

use super::sys::{self, HipLib, HipStatus, RtcLib, RtcStatus};
use crate::device::DeviceError;

/// The function pointer for `$name` in `$lib`, or `SymbolMissing` from the enclosing function.
macro_rules! need {
    ($lib:expr, $name:ident) => {
        match $lib.fns.$name {
            Some(f) => f,
            None => return Err(DeviceError::SymbolMissing { lib: $lib.lib, name: stringify!($name) }),
        }
    };
}

/// `DeviceError::Call` from a status and whatever text the library gave for it.
pub fn call_error(
    call: &'static str,
    code: i32,
    name: Option<String>,
    description: Option<String>,
) -> DeviceError {
    let message = match (name, description) {
        (Some(name), Some(description)) if name != description => format!("{name}: {description}"),
        (Some(text), _) | (None, Some(text)) => text,
        (None, None) => "no error text (the library exports no error-string function)".to_string(),
    };
    DeviceError::Call { call, code, message }
}

/// Text for a HIP status from `hipGetErrorName` / `hipGetErrorString` when exported.
pub fn hip_error(hip: &HipLib, call: &'static str, status: HipStatus) -> DeviceError {
    // SAFETY: both functions take any status and return null or a static NUL-terminated string.
    let name = hip.fns.hipGetErrorName.and_then(|f| unsafe { sys::c_string(f(status)) });
    // SAFETY: as above.
    let description = hip.fns.hipGetErrorString.and_then(|f| unsafe { sys::c_string(f(status)) });
    call_error(call, status, name, description)
}

pub fn check(hip: &HipLib, call: &'static str, status: HipStatus) -> Result<(), DeviceError> {
    if status == sys::HIP_SUCCESS {
        Ok(())
    } else {
        Err(hip_error(hip, call, status))
    }
}

/// Text for a hipRTC status from `hiprtcGetErrorString` when exported.
pub fn rtc_error(rtc: &RtcLib, call: &'static str, status: RtcStatus) -> DeviceError {
    // SAFETY: takes any status; returns null or a static NUL-terminated string.
    let name = rtc.fns.hiprtcGetErrorString.and_then(|f| unsafe { sys::c_string(f(status)) });
    call_error(call, status, name, None)
}

pub fn rtc_check(rtc: &RtcLib, call: &'static str, status: RtcStatus) -> Result<(), DeviceError> {
    if status == sys::HIPRTC_SUCCESS {
        Ok(())
    } else {
        Err(rtc_error(rtc, call, status))
    }
}

// ---- device queries ----

pub fn runtime_get_version(hip: &HipLib) -> Result<c_int, DeviceError> {
    let f = need!(hip, hipRuntimeGetVersion);
    let mut version = 0;
    // SAFETY: one int out-parameter.
    check(hip, "hipRuntimeGetVersion", unsafe { f(&mut version) })?;
    Ok(version)
}

/// The raw status of `hipGetDeviceCount` alongside the count: "no device" is an expected
/// answer the caller maps, not an error to format.
pub fn get_device_count(hip: &HipLib) -> Result<(HipStatus, c_int), DeviceError> {
    let f = need!(hip, hipGetDeviceCount);
    let mut count = 0;
    // SAFETY: one int out-parameter.
    let status = unsafe { f(&mut count) };
    Ok((status, count))
}

pub fn get_device(hip: &HipLib) -> Result<c_int, DeviceError> {
    let f = need!(hip, hipGetDevice);
    let mut device = 0;
    // SAFETY: one int out-parameter.
    check(hip, "hipGetDevice", unsafe { f(&mut device) })?;
    Ok(device)
}

pub fn device_get_name(hip: &HipLib, device: c_int) -> Result<String, DeviceError> {
    let f = need!(hip, hipDeviceGetName);
    let mut buf = [0 as c_char; 256];
    // SAFETY: the buffer is writable for the length passed; the last byte stays NUL below.
    check(hip, "hipDeviceGetName", unsafe { f(buf.as_mut_ptr(), (buf.len() - 1) as c_int, device) })?;
    buf[buf.len() - 1] = 0;
    // SAFETY: NUL-terminated: the last byte was just set to zero.
    Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
}

pub fn device_total_mem(hip: &HipLib, device: c_int) -> Result<u64, DeviceError> {
    let f = need!(hip, hipDeviceTotalMem);
    let mut bytes = 0usize;
    // SAFETY: one size_t out-parameter.
    check(hip, "hipDeviceTotalMem", unsafe { f(&mut bytes, device) })?;
    Ok(bytes as u64)
}

pub fn device_get_attribute(hip: &HipLib, attribute: c_int, device: c_int) -> Result<c_int, DeviceError> {
    let f = need!(hip, hipDeviceGetAttribute);
    let mut value = 0;
    // SAFETY: one int out-parameter; an attribute the library does not know is an error status.
    check(hip, "hipDeviceGetAttribute", unsafe { f(&mut value, attribute, device) })?;
    Ok(value)
}

/// Which `hipDeviceProp_t` layout a properties call fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PropsLayout {
    /// `hipGetDevicePropertiesR0600` (ROCm 6.0 and later).
    R0600,
    /// `hipGetDeviceProperties` of ROCm 5.x (the R0000 layout).
    R0000,
}

/// Fills `buf` with the device's properties in `layout`.
pub fn get_device_properties(
    hip: &HipLib,
    layout: PropsLayout,
    buf: &mut sys::props::Buffer,
    device: c_int,
) -> Result<(), DeviceError> {
    let (f, call) = match layout {
        PropsLayout::R0600 => (need!(hip, hipGetDevicePropertiesR0600), "hipGetDevicePropertiesR0600"),
        PropsLayout::R0000 => (need!(hip, hipGetDeviceProperties), "hipGetDeviceProperties"),
    };
    // SAFETY: the buffer is 16-aligned and more than twice the size of either struct layout.
    check(hip, call, unsafe { f(buf.0.as_mut_ptr().cast(), device) })
}

// ---- memory ----

pub fn malloc(hip: &HipLib, bytes: usize) -> Result<*mut c_void, DeviceError> {
    let f = need!(hip, hipMalloc);
    let mut ptr = ptr::null_mut();
    // SAFETY: one pointer out-parameter.
    check(hip, "hipMalloc", unsafe { f(&mut ptr, bytes) })?;
    Ok(ptr)
}

/// # Safety
/// `ptr` came from `hipMalloc` and is not used afterwards.
pub unsafe fn free(hip: &HipLib, ptr: *mut c_void) -> Result<(), DeviceError> {
    let f = need!(hip, hipFree);
    // SAFETY: per this function's contract.
    check(hip, "hipFree", unsafe { f(ptr) })
}

/// Fails with `SymbolMissing` unless the library exports all three calls a registered mapping
/// needs. Checked before anything is registered: pages registered without a way to unregister
/// them could never be given back.
pub fn host_register_available(hip: &HipLib) -> Result<(), DeviceError> {
    need!(hip, hipHostRegister);
    need!(hip, hipHostGetDevicePointer);
    need!(hip, hipHostUnregister);
    Ok(())
}

/// `hipHostRegister(host, bytes, flags)` (`sys::HIP_HOST_REGISTER_*`).
///
/// # Safety
/// `host` is the start of a mapping of at least `bytes` bytes that the caller owns and keeps
/// mapped until [`host_unregister`] has succeeded on it.
pub unsafe fn host_register(
    hip: &HipLib,
    host: *mut c_void,
    bytes: usize,
    flags: u32,
) -> Result<(), DeviceError> {
    let f = need!(hip, hipHostRegister);
    // SAFETY: per this function's contract; HIP locks the pages where they are and never unmaps them.
    check(hip, "hipHostRegister", unsafe { f(host, bytes, flags) })
}

/// # Safety
/// `host` was registered with `hipHostRegisterMapped` and is still registered and mapped.
pub unsafe fn host_get_device_pointer(hip: &HipLib, host: *mut c_void) -> Result<*mut c_void, DeviceError> {
    let f = need!(hip, hipHostGetDevicePointer);
    let mut device = ptr::null_mut();
    // SAFETY: per this function's contract; flags must be 0 (hip_runtime_api.h).
    check(hip, "hipHostGetDevicePointer", unsafe { f(&mut device, host, 0) })?;
    Ok(device)
}

/// # Safety
/// `host` is the pointer [`host_register`] succeeded on, and no kernel writes through its device
/// address any more.
pub unsafe fn host_unregister(hip: &HipLib, host: *mut c_void) -> Result<(), DeviceError> {
    let f = need!(hip, hipHostUnregister);
    // SAFETY: per this function's contract; HIP looks the pointer up and fails if unknown.
    check(hip, "hipHostUnregister", unsafe { f(host) })
}

/// # Safety
/// `src` is readable for `bytes` bytes; `dst` is a device address HIP validates.
pub unsafe fn memcpy_htod(
    hip: &HipLib,
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
) -> Result<(), DeviceError> {
    let f = need!(hip, hipMemcpyHtoD);
    // SAFETY: per this function's contract.
    check(hip, "hipMemcpyHtoD", unsafe { f(dst, src, bytes) })
}

/// # Safety
/// `dst` is writable for `bytes` bytes; `src` is a device address HIP validates.
pub unsafe fn memcpy_dtoh(
    hip: &HipLib,
    dst: *mut c_void,
    src: *mut c_void,
    bytes: usize,
) -> Result<(), DeviceError> {
    let f = need!(hip, hipMemcpyDtoH);
    // SAFETY: per this function's contract.
    check(hip, "hipMemcpyDtoH", unsafe { f(dst, src, bytes) })
}

/// `hipMemcpyAsync` of `kind` (`sys::HIP_MEMCPY_*`).
///
/// # Safety
/// `dst` and `src` are valid for `bytes` bytes, as `kind` says where each lives, until the copy
/// has run on `stream`.
pub unsafe fn memcpy_async(
    hip: &HipLib,
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: c_int,
    stream: *mut c_void,
) -> Result<(), DeviceError> {
    let f = need!(hip, hipMemcpyAsync);
    // SAFETY: per this function's contract.
    check(hip, "hipMemcpyAsync", unsafe { f(dst, src, bytes, kind, stream) })
}

/// # Safety
/// `dst` is device memory valid for `bytes` bytes until the fill has run.
pub unsafe fn memset_d8_async(
    hip: &HipLib,
    dst: *mut c_void,
    value: u8,
    bytes: usize,
    stream: *mut c_void,
) -> Result<(), DeviceError> {
    let f = need!(hip, hipMemsetD8Async);
    // SAFETY: per this function's contract.
    check(hip, "hipMemsetD8Async", unsafe { f(dst, value, bytes, stream) })
}

// ---- modules and launches ----

/// # Safety
/// `image` points to a complete code object (HIP reads its size from the ELF headers).
pub unsafe fn module_load_data(hip: &HipLib, image: *const c_void) -> Result<*mut c_void, DeviceError> {
    let f = need!(hip, hipModuleLoadData);
    let mut module = ptr::null_mut();
    // SAFETY: per this function's contract; one handle out-parameter.
    check(hip, "hipModuleLoadData", unsafe { f(&mut module, image) })?;
    Ok(module)
}

pub fn module_get_function(
    hip: &HipLib,
    module: *mut c_void,
    name: &CStr,
) -> Result<*mut c_void, DeviceError> {
    let f = need!(hip, hipModuleGetFunction);
    let mut function = ptr::null_mut();
    // SAFETY: `name` is NUL-terminated; HIP validates the module handle.
    check(hip, "hipModuleGetFunction", unsafe { f(&mut function, module, name.as_ptr()) })?;
    Ok(function)
}

/// # Safety
/// `params` is null for a kernel without parameters, else points to one pointer per kernel
/// parameter, each to a value of that parameter's type; device memory the kernel touches is
/// valid until it has run.
pub unsafe fn module_launch_kernel(
    hip: &HipLib,
    function: *mut c_void,
    grid: [u32; 3],
    block: [u32; 3],
    shared_bytes: u32,
    stream: *mut c_void,
    params: *mut *mut c_void,
) -> Result<(), DeviceError> {
    let f = need!(hip, hipModuleLaunchKernel);
    // SAFETY: per this function's contract; `extra` is null because parameters go by pointer.
    let status = unsafe {
        f(
            function,
            grid[0],
            grid[1],
            grid[2],
            block[0],
            block[1],
            block[2],
            shared_bytes,
            stream,
            params,
            ptr::null_mut(),
        )
    };
    check(hip, "hipModuleLaunchKernel", status)
}

// ---- streams and events ----

pub fn stream_is_capturing(hip: &HipLib, stream: *mut c_void) -> Result<c_int, DeviceError> {
    let f = need!(hip, hipStreamIsCapturing);
    let mut status = sys::HIP_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: one enum (int) out-parameter; HIP validates the stream handle.
    check(hip, "hipStreamIsCapturing", unsafe { f(stream, &mut status) })?;
    Ok(status)
}

pub fn stream_synchronize(hip: &HipLib, stream: *mut c_void) -> Result<(), DeviceError> {
    let f = need!(hip, hipStreamSynchronize);
    // SAFETY: HIP validates the stream handle.
    check(hip, "hipStreamSynchronize", unsafe { f(stream) })
}

/// `(least, greatest)`: on HIP, as on CUDA, a larger number is a lower priority.
pub fn device_get_stream_priority_range(hip: &HipLib) -> Result<(c_int, c_int), DeviceError> {
    let f = need!(hip, hipDeviceGetStreamPriorityRange);
    let (mut least, mut greatest) = (0, 0);
    // SAFETY: two int out-parameters.
    check(hip, "hipDeviceGetStreamPriorityRange", unsafe { f(&mut least, &mut greatest) })?;
    Ok((least, greatest))
}

pub fn stream_create_with_priority(
    hip: &HipLib,
    flags: u32,
    priority: c_int,
) -> Result<*mut c_void, DeviceError> {
    let f = need!(hip, hipStreamCreateWithPriority);
    let mut stream = ptr::null_mut();
    // SAFETY: one handle out-parameter.
    check(hip, "hipStreamCreateWithPriority", unsafe { f(&mut stream, flags, priority) })?;
    Ok(stream)
}

pub fn event_create_with_flags(hip: &HipLib, flags: u32) -> Result<*mut c_void, DeviceError> {
    let f = need!(hip, hipEventCreateWithFlags);
    let mut event = ptr::null_mut();
    // SAFETY: one handle out-parameter.
    check(hip, "hipEventCreateWithFlags", unsafe { f(&mut event, flags) })?;
    Ok(event)
}

pub fn event_record(hip: &HipLib, event: *mut c_void, stream: *mut c_void) -> Result<(), DeviceError> {
    let f = need!(hip, hipEventRecord);
    // SAFETY: HIP validates both handles.
    check(hip, "hipEventRecord", unsafe { f(event, stream) })
}

pub fn stream_wait_event(hip: &HipLib, stream: *mut c_void, event: *mut c_void) -> Result<(), DeviceError> {
    let f = need!(hip, hipStreamWaitEvent);
    // SAFETY: HIP validates both handles; flags must be 0 (hip_runtime_api.h).
    check(hip, "hipStreamWaitEvent", unsafe { f(stream, event, 0) })
}

/// hipErrorNotReady: the event's work has not completed yet.
const HIP_ERROR_NOT_READY: HipStatus = 600;

pub fn event_query(hip: &HipLib, event: *mut c_void) -> Result<bool, DeviceError> {
    let f = need!(hip, hipEventQuery);
    // SAFETY: HIP validates the handle.
    let status = unsafe { f(event) };
    if status == HIP_ERROR_NOT_READY {
        return Ok(false);
    }
    check(hip, "hipEventQuery", status).map(|()| true)
}

pub fn event_elapsed_time(hip: &HipLib, start: *mut c_void, end: *mut c_void) -> Result<f32, DeviceError> {
    let f = need!(hip, hipEventElapsedTime);
    let mut ms = 0f32;
    // SAFETY: one float out-parameter; HIP validates both handles.
    check(hip, "hipEventElapsedTime", unsafe { f(&mut ms, start, end) })?;
    Ok(ms)
}

// ---- hipRTC ----

/// A hipRTC program, destroyed on drop.
pub struct Program<'a> {
    rtc: &'a RtcLib,
    handle: *mut c_void,
}

impl<'a> Program<'a> {
    /// `headers` are (include name, text) pairs served from memory.
    pub fn create(
        rtc: &'a RtcLib,
        source: &CStr,
        name: &CStr,
        headers: &[(CString, CString)],
    ) -> Result<Self, DeviceError> {
        let f = need!(rtc, hiprtcCreateProgram);
        // Checked before creating so that a program never exists without a way to destroy it.
        need!(rtc, hiprtcDestroyProgram);
        let mut handle = ptr::null_mut();
        let names: Vec<*const c_char> = headers.iter().map(|(n, _)| n.as_ptr()).collect();
        let texts: Vec<*const c_char> = headers.iter().map(|(_, t)| t.as_ptr()).collect();
        let (names_ptr, texts_ptr) =
            if headers.is_empty() { (ptr::null(), ptr::null()) } else { (names.as_ptr(), texts.as_ptr()) };
        // SAFETY: all strings are NUL-terminated and outlive the call; both header arrays have
        // `headers.len()` entries (or are null with a count of 0).
        let status = unsafe {
            f(&mut handle, source.as_ptr(), name.as_ptr(), headers.len() as c_int, texts_ptr, names_ptr)
        };
        rtc_check(rtc, "hiprtcCreateProgram", status)?;
        Ok(Program { rtc, handle })
    }

    /// The raw status: a compile error is an expected outcome the caller reports with the log.
    pub fn compile(&self, options: &[*const c_char]) -> Result<RtcStatus, DeviceError> {
        let f = need!(self.rtc, hiprtcCompileProgram);
        // SAFETY: `options` holds `len` NUL-terminated strings that outlive the call.
        Ok(unsafe { f(self.handle, options.len() as c_int, options.as_ptr()) })
    }

    /// The compiler log, empty when there is none.
    pub fn log(&self) -> Result<String, DeviceError> {
        let size_fn = need!(self.rtc, hiprtcGetProgramLogSize);
        let log_fn = need!(self.rtc, hiprtcGetProgramLog);
        let mut size = 0usize;
        // SAFETY: one size_t out-parameter on a live program.
        rtc_check(self.rtc, "hiprtcGetProgramLogSize", unsafe { size_fn(self.handle, &mut size) })?;
        if size == 0 {
            return Ok(String::new());
        }
        let mut buf = vec![0u8; size];
        // SAFETY: the buffer holds the `size` bytes hipRTC reported for this program's log.
        rtc_check(self.rtc, "hiprtcGetProgramLog", unsafe { log_fn(self.handle, buf.as_mut_ptr().cast()) })?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }

    pub fn code(&self) -> Result<Vec<u8>, DeviceError> {
        let size_fn = need!(self.rtc, hiprtcGetCodeSize);
        let code_fn = need!(self.rtc, hiprtcGetCode);
        let mut size = 0usize;
        // SAFETY: one size_t out-parameter on a live program.
        rtc_check(self.rtc, "hiprtcGetCodeSize", unsafe { size_fn(self.handle, &mut size) })?;
        let mut code = vec![0u8; size];
        if size > 0 {
            // SAFETY: the buffer holds the `size` bytes hipRTC reported for this program's code.
            rtc_check(self.rtc, "hiprtcGetCode", unsafe { code_fn(self.handle, code.as_mut_ptr().cast()) })?;
        }
        Ok(code)
    }
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        if let Some(f) = self.rtc.fns.hiprtcDestroyProgram {
            // SAFETY: the handle came from hiprtcCreateProgram and is destroyed exactly once.
            // A failure here leaks one program; there is nothing better to do in a destructor.
            let _ = unsafe { f(&mut self.handle) };
        }
    }
}

// ---- comgr ----

/// The targets the loaded comgr can compile for, as `amdgcn-amd-amdhsa--gfx90a` and the like.
pub fn comgr_isa_names(comgr: &sys::ComgrLib) -> Result<Vec<String>, DeviceError> {
    let count_fn = need!(comgr, amd_comgr_get_isa_count);
    let name_fn = need!(comgr, amd_comgr_get_isa_name);
    let mut count = 0usize;
    // SAFETY: one size_t out-parameter.
    let status = unsafe { count_fn(&mut count) };
    if status != sys::COMGR_SUCCESS {
        return Err(call_error("amd_comgr_get_isa_count", status, None, None));
    }
    let mut names = Vec::with_capacity(count.min(1024));
    for index in 0..count {
        let mut name: *const c_char = ptr::null();
        // SAFETY: index < count; comgr returns a pointer to a static NUL-terminated name.
        let status = unsafe { name_fn(index, &mut name) };
        if status != sys::COMGR_SUCCESS {
            return Err(call_error("amd_comgr_get_isa_name", status, None, None));
        }
        // SAFETY: as above.
        if let Some(name) = unsafe { sys::c_string(name) } {
            names.push(name);
        }
    }
    Ok(names)
}
