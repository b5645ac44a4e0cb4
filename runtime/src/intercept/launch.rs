//! Kernel-launch interposers (CUDA driver and runtime, HIP module and runtime launches) and
//! the `cuGetProcAddress` wrappers that hand them out.
//!
//! Per function handle, once: the kernel's name (`cuFuncGetName`; runtime-API launches through
//! `cudaGetFuncBySymbol` first; `hipKernelNameRef` / `hipKernelNameRefByPtr` on AMD), its
//! parameter sizes (`cuFuncGetParamInfo`, where the driver has it) and [`SpecSet::find`],
//! cached in a fixed-size lock-free table keyed by the handle. Then:
//! - no specs loaded and no kernel listing asked for: the launch is forwarded at once;
//! - a kernel without a spec: one table lookup, then the real launch;
//! - a kernel with a spec: a [`LaunchGemm`] through the engine's usual flow (sampling,
//!   decode through the spec, before_call, the real launch, after_call). A spec that does not
//!   fit (`SpecError::Mismatch`) is disabled with one log line and a counted skip.
//!
//! `QUANTSHADOW_KERNELS_OUT=PATH` (`{pid}` is replaced by the process id) keeps per-kernel
//! statistics and writes a [`KernelListing`] as JSON at process exit.
//!
//! The launch's behaviour never changes: every internal failure is a passthrough.

use super::common::KeyHasher;
use super::dlsym;
use super::hook;
use super::{GemmArgs, InterceptedGemm, RealCall, RealSlot, Skip};
use crate::engine::log;
use crate::specs::{KernelListing, KernelStat, LaunchArgs, LaunchView, SpecError, SpecId, SpecSet};
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

// =============================================================================================
// ABI
// =============================================================================================

/// `dim3`, passed by value by `cudaLaunchKernel` / `hipLaunchKernel`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

/// `CUlaunchConfig` (cuLaunchKernelEx); `HIP_LAUNCH_CONFIG` (hipDrvLaunchKernelEx) has the
/// same layout.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CuLaunchConfig {
    pub grid_x: u32,
    pub grid_y: u32,
    pub grid_z: u32,
    pub block_x: u32,
    pub block_y: u32,
    pub block_z: u32,
    pub shared_bytes: u32,
    pub stream: *mut c_void,
    pub attrs: *mut c_void,
    pub num_attrs: u32,
}

/// `cudaLaunchConfig_t` (cudaLaunchKernelExC).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CudaLaunchConfig {
    pub grid: Dim3,
    pub block: Dim3,
    pub shared_bytes: usize,
    pub stream: *mut c_void,
    pub attrs: *mut c_void,
    pub num_attrs: u32,
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(std::mem::size_of::<Dim3>() == 12);
    assert!(std::mem::size_of::<CuLaunchConfig>() == 56);
    assert!(std::mem::offset_of!(CuLaunchConfig, stream) == 32);
    assert!(std::mem::size_of::<CudaLaunchConfig>() == 56);
    assert!(std::mem::offset_of!(CudaLaunchConfig, shared_bytes) == 24);
    assert!(std::mem::offset_of!(CudaLaunchConfig, stream) == 32);
};

/// `extra` keys: `CU_LAUNCH_PARAM_*` and `HIP_LAUNCH_PARAM_*` share 1 and 2; the end marker is
/// 0 on CUDA and 3 on HIP.
pub const LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
pub const LAUNCH_PARAM_BUFFER_SIZE: usize = 2;
pub const CU_LAUNCH_PARAM_END: usize = 0;
pub const HIP_LAUNCH_PARAM_END: usize = 3;
/// `CUDA_ERROR_INVALID_VALUE`: what `cuFuncGetParamInfo` returns past the last parameter.
const CUDA_ERROR_INVALID_VALUE: i32 = 1;
/// Parameters asked of `cuFuncGetParamInfo` at most (CUDA allows 32 KiB of parameters).
const MAX_PARAMS: usize = 4096;
/// `extra` pairs read at most.
const MAX_EXTRA_PAIRS: usize = 16;

/// Which API a launch came through: how its handle is named and how `extra` ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Api {
    /// `CUfunction`.
    CuDriver,
    /// Host stub address (`cudaLaunchKernel`).
    CudaRuntime,
    /// `hipFunction_t`.
    HipModule,
    /// Host stub address (`hipLaunchKernel`).
    HipRuntime,
}

/// One launch, whatever function it came through.
#[derive(Debug, Clone, Copy)]
struct Launch {
    entry: &'static str,
    api: Api,
    handle: usize,
    grid: [u32; 3],
    block: [u32; 3],
    stream: u64,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
}

impl Launch {
    /// The packed argument buffer of `extra`, if the launch has one.
    fn packed(&self) -> Option<(*const u8, usize)> {
        if self.extra.is_null() {
            return None;
        }
        let end = match self.api {
            Api::HipModule | Api::HipRuntime => HIP_LAUNCH_PARAM_END,
            Api::CuDriver | Api::CudaRuntime => CU_LAUNCH_PARAM_END,
        };
        let (mut buf, mut size) = (None, None);
        for i in 0..MAX_EXTRA_PAIRS {
            // SAFETY: `extra` is the caller's key/value array, which the driver reads the same
            // way, pair by pair, up to its end marker.
            let key = unsafe { *self.extra.add(2 * i) } as usize;
            if key == end || key == CU_LAUNCH_PARAM_END {
                break;
            }
            // SAFETY: as above; a key other than the end marker has a value.
            let value = unsafe { *self.extra.add(2 * i + 1) };
            match key {
                LAUNCH_PARAM_BUFFER_POINTER => buf = Some(value as *const u8),
                LAUNCH_PARAM_BUFFER_SIZE if !value.is_null() => {
                    // SAFETY: the value of BUFFER_SIZE points to a size_t.
                    size = Some(unsafe { (value as *const usize).read_unaligned() })
                }
                _ => {}
            }
        }
        match (buf, size) {
            (Some(p), Some(n)) if !p.is_null() => Some((p, n)),
            _ => None,
        }
    }
}

// =============================================================================================
// Interposers
// =============================================================================================

macro_rules! grid_launch {
    ($fn:ident, $sym:ident, $api:expr) => {
        pub fn $fn(a: &hook::$sym::Args, real: &RealCall) -> i32 {
            on_launch(
                &Launch {
                    entry: hook::$sym::NAME,
                    api: $api,
                    handle: a.f as usize,
                    grid: [a.grid_x, a.grid_y, a.grid_z],
                    block: [a.block_x, a.block_y, a.block_z],
                    stream: a.stream as u64,
                    params: a.params,
                    extra: a.extra,
                },
                real,
            )
        }
    };
}

macro_rules! config_launch {
    ($fn:ident, $sym:ident, $api:expr) => {
        pub fn $fn(a: &hook::$sym::Args, real: &RealCall) -> i32 {
            if a.config.is_null() {
                return real.call();
            }
            // SAFETY: a non-null config is the caller's launch configuration.
            let c = unsafe { *a.config };
            on_launch(
                &Launch {
                    entry: hook::$sym::NAME,
                    api: $api,
                    handle: a.f as usize,
                    grid: [c.grid_x, c.grid_y, c.grid_z],
                    block: [c.block_x, c.block_y, c.block_z],
                    stream: c.stream as u64,
                    params: a.params,
                    extra: a.extra,
                },
                real,
            )
        }
    };
}

macro_rules! runtime_launch {
    ($fn:ident, $sym:ident, $api:expr) => {
        pub fn $fn(a: &hook::$sym::Args, real: &RealCall) -> i32 {
            on_launch(
                &Launch {
                    entry: hook::$sym::NAME,
                    api: $api,
                    handle: a.func as usize,
                    grid: [a.grid.x, a.grid.y, a.grid.z],
                    block: [a.block.x, a.block.y, a.block.z],
                    stream: a.stream as u64,
                    params: a.args,
                    extra: std::ptr::null_mut(),
                },
                real,
            )
        }
    };
}

macro_rules! runtime_config_launch {
    ($fn:ident, $sym:ident) => {
        pub fn $fn(a: &hook::$sym::Args, real: &RealCall) -> i32 {
            if a.config.is_null() {
                return real.call();
            }
            // SAFETY: a non-null config is the caller's launch configuration.
            let c = unsafe { *a.config };
            on_launch(
                &Launch {
                    entry: hook::$sym::NAME,
                    api: Api::CudaRuntime,
                    handle: a.func as usize,
                    grid: [c.grid.x, c.grid.y, c.grid.z],
                    block: [c.block.x, c.block.y, c.block.z],
                    stream: c.stream as u64,
                    params: a.args,
                    extra: std::ptr::null_mut(),
                },
                real,
            )
        }
    };
}

grid_launch!(cu_launch_kernel, cuLaunchKernel, Api::CuDriver);
grid_launch!(cu_launch_kernel_ptsz, cuLaunchKernel_ptsz, Api::CuDriver);
grid_launch!(hip_module_launch_kernel, hipModuleLaunchKernel, Api::HipModule);
config_launch!(cu_launch_kernel_ex, cuLaunchKernelEx, Api::CuDriver);
config_launch!(cu_launch_kernel_ex_ptsz, cuLaunchKernelEx_ptsz, Api::CuDriver);
config_launch!(hip_drv_launch_kernel_ex, hipDrvLaunchKernelEx, Api::HipModule);
runtime_launch!(cuda_launch_kernel, cudaLaunchKernel, Api::CudaRuntime);
runtime_launch!(cuda_launch_kernel_ptsz, cudaLaunchKernel_ptsz, Api::CudaRuntime);
runtime_launch!(hip_launch_kernel, hipLaunchKernel, Api::HipRuntime);
runtime_config_launch!(cuda_launch_kernel_ex_c, cudaLaunchKernelExC);
runtime_config_launch!(cuda_launch_kernel_ex_c_ptsz, cudaLaunchKernelExC_ptsz);

/// `hipExtModuleLaunchKernel` takes work-item counts: grid = global / local.
pub fn hip_ext_module_launch_kernel(a: &hook::hipExtModuleLaunchKernel::Args, real: &RealCall) -> i32 {
    let blocks = |global: u32, local: u32| global.checked_div(local).unwrap_or(0);
    on_launch(
        &Launch {
            entry: hook::hipExtModuleLaunchKernel::NAME,
            api: Api::HipModule,
            handle: a.f as usize,
            grid: [
                blocks(a.global_x, a.local_x),
                blocks(a.global_y, a.local_y),
                blocks(a.global_z, a.local_z),
            ],
            block: [a.local_x, a.local_y, a.local_z],
            stream: a.stream as u64,
            params: a.params,
            extra: a.extra,
        },
        real,
    )
}

pub fn get_proc_address(a: &hook::cuGetProcAddress::Args, real: &RealCall) -> i32 {
    let status = real.call();
    if status == 0 {
        // SAFETY: the driver succeeded, so symbol is its C string and pfn its out-pointer.
        unsafe { rewrite_proc(a.symbol, a.pfn) };
    }
    status
}

pub fn get_proc_address_v2(a: &hook::cuGetProcAddress_v2::Args, real: &RealCall) -> i32 {
    let status = real.call();
    if status == 0 {
        // SAFETY: as in get_proc_address.
        unsafe { rewrite_proc(a.symbol, a.pfn) };
    }
    status
}

/// Names a lookup asks for that the driver answers with a hooked function of another name
/// (CUDA >= 12: "cuGraphInstantiate" is cuGraphInstantiateWithFlags). `wrap` still returns
/// our export only when the answer is exactly that function.
pub const LOOKUP_ALIASES: &[(&[u8], &str)] = &[(b"cuGraphInstantiate", "cuGraphInstantiateWithFlags")];

/// Replaces the function a successful `cuGetProcAddress*` returned by our export when one
/// forwards to exactly that function (the `_ptsz` and `_v2` variants included).
unsafe fn rewrite_proc(symbol: *const c_char, pfn: *mut *mut c_void) {
    if symbol.is_null() || pfn.is_null() {
        return;
    }
    // SAFETY: see the caller.
    let (name, p) = unsafe { (CStr::from_ptr(symbol).to_bytes(), *pfn) };
    let alias = LOOKUP_ALIASES.iter().find(|(asked, _)| *asked == name).map(|(_, hooked)| hooked.as_bytes());
    let Some(i) = dlsym::hook_index(alias.unwrap_or(name)) else {
        return;
    };
    if alias.is_some() {
        // Only the very function of the hooked name: never store an answer of another name.
        if !p.is_null() && crate::intercept::REAL_SLOTS[i].get() == Some(p) {
            if let Some(w) = dlsym::own_export(i) {
                // SAFETY: the caller's out-pointer, which the driver just wrote.
                unsafe { *pfn = w };
            }
        }
        return;
    }
    match dlsym::wrap(i, p, true) {
        // SAFETY: the caller's out-pointer, which the driver just wrote.
        Some(w) => unsafe { *pfn = w },
        None if !p.is_null() && !dlsym::own_object().contains(p as usize) => {
            // Calls through this pointer are not seen: say so where someone is looking (a
            // driver that answers with a function other than its export of that name).
            state();
            log::debug(&format!(
                "cuGetProcAddress({}) returned {p:?}, which no export forwards to: left unwrapped",
                String::from_utf8_lossy(name)
            ));
        }
        None => {}
    }
}

// =============================================================================================
// Per-process state
// =============================================================================================

struct LaunchState {
    specs: SpecSet,
    listing: Option<String>,
    /// Specs loaded or a listing asked for: otherwise every launch is forwarded at once.
    active: bool,
    pid: u32,
}

static STATE: OnceLock<LaunchState> = OnceLock::new();

fn state() -> &'static LaunchState {
    STATE.get_or_init(LaunchState::from_env)
}

impl LaunchState {
    fn from_env() -> LaunchState {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let off = var("QUANTSHADOW_MODE")
            .and_then(|m| crate::engine::config::Mode::parse(&m))
            .is_some_and(|m| m == crate::engine::config::Mode::Off);
        let pid = std::process::id();
        // The engine sets the level when it starts; launches and lookups may come long before.
        log::set_level(crate::engine::config::Config::from_env().log);
        if off {
            return LaunchState { specs: SpecSet::default(), listing: None, active: false, pid };
        }
        let (specs, warnings) = SpecSet::from_env();
        for w in &warnings {
            log::warn(&format!("kernel specs: {w}"));
        }
        let listing = var("QUANTSHADOW_KERNELS_OUT").map(|p| p.replace("{pid}", &pid.to_string()));
        if listing.is_some() {
            // SAFETY: registers a plain extern "C" function run once at exit.
            unsafe { libc::atexit(write_listing_at_exit) };
        }
        let active = listing.is_some() || !specs.is_empty();
        LaunchState { specs, listing, active, pid }
    }
}

// =============================================================================================
// Kernel table
// =============================================================================================

/// What is known of one kernel (one function handle).
struct KernelInfo {
    name: Option<String>,
    entry: &'static str,
    param_sizes: Option<Vec<usize>>,
    spec: Option<SpecId>,
    /// The spec was disabled after a mismatch (cached from [`DISABLED`]).
    disabled: AtomicBool,
    /// `DISABLED_COUNT` when `disabled` was last brought up to date.
    disabled_seen: AtomicUsize,
    /// Listing statistics (only with `QUANTSHADOW_KERNELS_OUT`).
    stats: Option<Mutex<KernelCounts>>,
    /// [`UNLOADS`] when the handle was last found to name this kernel.
    checked_at: AtomicU64,
    /// The handle came to name another kernel and no replacement could be made (the bound):
    /// its launches pass through until the next unload, without naming it again each time.
    stale: AtomicBool,
}

#[derive(Default)]
struct KernelCounts {
    calls: u64,
    grid: [u32; 3],
    block: [u32; 3],
    shapes: Vec<([u32; 3], [u32; 3])>,
    packed_bytes: Option<usize>,
}

/// Distinct (grid, block) pairs remembered per kernel.
const MAX_SHAPES: usize = 256;

/// Kernels remembered (a power of two); a launch of any other kernel is forwarded and counted.
const TABLE_SIZE: usize = 1 << 14;
const MAX_PROBE: usize = 64;

struct Table {
    keys: [AtomicUsize; TABLE_SIZE],
    vals: [AtomicPtr<KernelInfo>; TABLE_SIZE],
    /// Launches of kernels that found no room.
    overflow: AtomicU64,
}

static TABLE: Table = Table {
    keys: [const { AtomicUsize::new(0) }; TABLE_SIZE],
    vals: [const { AtomicPtr::new(std::ptr::null_mut()) }; TABLE_SIZE],
    overflow: AtomicU64::new(0),
};

impl Table {
    /// A launch found no room: forwarded unexamined, counted, and said once (a kernel with a
    /// spec launched from now on goes unchecked, which the listing alone would not tell).
    fn no_room(&self) {
        if self.overflow.fetch_add(1, Ordering::Relaxed) == 0 {
            crate::engine::log::shared_warn(&format!(
                "more than {TABLE_SIZE} kernels launched: launches of further kernels pass unexamined"
            ));
        }
    }

    /// The info of `key` (never 0), made by `make` on first sight. Reads take no lock; the
    /// infos are leaked (bounded by the table size).
    fn get_or_insert(&self, key: usize, make: impl FnOnce() -> KernelInfo) -> Option<&'static KernelInfo> {
        let h = crate::rng::mix64(key as u64) as usize;
        for i in 0..MAX_PROBE {
            let slot = (h + i) & (TABLE_SIZE - 1);
            let k = self.keys[slot].load(Ordering::Acquire);
            if k == key {
                return self.wait(slot);
            }
            if k != 0 {
                continue;
            }
            match self.keys[slot].compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    let info: &'static KernelInfo = Box::leak(Box::new(make()));
                    self.vals[slot].store(info as *const KernelInfo as *mut KernelInfo, Ordering::Release);
                    return Some(info);
                }
                Err(other) if other == key => return self.wait(slot),
                Err(_) => continue,
            }
        }
        None
    }

    /// The value of a slot whose key another thread just claimed (None if it never comes).
    fn wait(&self, slot: usize) -> Option<&'static KernelInfo> {
        for spin in 0..100_000u32 {
            let p = self.vals[slot].load(Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: values are leaked boxes, never freed.
                return Some(unsafe { &*p });
            }
            if spin > 64 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        None
    }

    /// Puts `fresh` in place of `old` as the info of `key`: the kernel at that handle changed
    /// after a module unload. Another thread's replacement wins a race; None when the key is
    /// gone or the replacements' bound is reached (the launch then passes through).
    fn renew(&self, key: usize, old: &'static KernelInfo, fresh: KernelInfo) -> Option<&'static KernelInfo> {
        let h = crate::rng::mix64(key as u64) as usize;
        let slot = (0..MAX_PROBE)
            .map(|i| (h + i) & (TABLE_SIZE - 1))
            .find(|&slot| self.keys[slot].load(Ordering::Acquire) == key)?;
        let mut replaced = REPLACED.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.vals[slot].load(Ordering::Acquire);
        if !std::ptr::eq(current, old) {
            // SAFETY: values are leaked boxes, never freed.
            return (!current.is_null()).then(|| unsafe { &*current });
        }
        if replaced.len() >= MAX_REPLACED {
            return None;
        }
        let new: &'static KernelInfo = Box::leak(Box::new(fresh));
        self.vals[slot].store(new as *const KernelInfo as *mut KernelInfo, Ordering::Release);
        replaced.push(old);
        Some(new)
    }

    fn infos(&self) -> impl Iterator<Item = &'static KernelInfo> + '_ {
        self.vals.iter().filter_map(|v| {
            let p = v.load(Ordering::Acquire);
            // SAFETY: values are leaked boxes, never freed.
            (!p.is_null()).then(|| unsafe { &*p })
        })
    }
}

/// Successful module (or library) unloads so far: a kernel info checked before the latest one
/// is checked again at its next launch, since a later module may reuse the function handle.
static UNLOADS: AtomicU64 = AtomicU64::new(0);
/// Infos replaced because their handle came to name another kernel (kept for the listing).
static REPLACED: Mutex<Vec<&'static KernelInfo>> = Mutex::new(Vec::new());
/// Replacements at most (each leaks one small info); later stale handles pass through.
const MAX_REPLACED: usize = 4096;

/// A module or library was unloaded: every cached kernel name is checked again before use.
pub fn forget_kernel_handles() {
    // The name caches below empty themselves at their next use (UnloadScoped).
    UNLOADS.fetch_add(1, Ordering::AcqRel);
}

/// A cache of what handles named at one count of [`UNLOADS`]: emptied when the count has
/// moved on, and filled only with what was found entirely at the current count. (Emptying it
/// in `forget_kernel_handles` would race: a lookup that read names before the unload could
/// store them after the emptying.)
struct UnloadScoped<M> {
    unloads: u64,
    map: M,
}

impl<M: Default> UnloadScoped<M> {
    /// The cache as of now (emptied if modules were unloaded since it was filled).
    fn current(slot: &mut Option<UnloadScoped<M>>) -> &mut M {
        let now = UNLOADS.load(Ordering::Acquire);
        let scoped = slot.get_or_insert_with(|| UnloadScoped { unloads: now, map: M::default() });
        if scoped.unloads != now {
            *scoped = UnloadScoped { unloads: now, map: M::default() };
        }
        &mut scoped.map
    }

    /// Stores `entry`, found by a lookup that began at count `began`, unless a module was
    /// unloaded since (or `fits` says the cache is full).
    fn keep<E>(slot: &mut Option<UnloadScoped<M>>, began: u64, fits: impl FnOnce(&M) -> bool, entry: E)
    where
        M: Extend<E>,
    {
        let map = Self::current(slot);
        if UNLOADS.load(Ordering::Acquire) == began && fits(map) {
            map.extend(std::iter::once(entry));
        }
    }
}

/// Specs disabled after a mismatch, and how many (a change tells a kernel to look again).
static DISABLED: Mutex<Vec<u32>> = Mutex::new(Vec::new());
static DISABLED_COUNT: AtomicUsize = AtomicUsize::new(0);

impl KernelInfo {
    fn live_spec(&self) -> Option<SpecId> {
        let id = self.spec?;
        if self.disabled.load(Ordering::Relaxed) {
            return None;
        }
        let n = DISABLED_COUNT.load(Ordering::Acquire);
        if n != self.disabled_seen.load(Ordering::Relaxed) {
            let off = DISABLED.lock().unwrap_or_else(|e| e.into_inner()).contains(&id.0);
            self.disabled.store(off, Ordering::Relaxed);
            self.disabled_seen.store(n, Ordering::Relaxed);
            if off {
                return None;
            }
        }
        Some(id)
    }

    fn count(&self, l: &Launch) {
        let Some(stats) = &self.stats else {
            return;
        };
        let packed = if l.params.is_null() { l.packed().map(|(_, n)| n) } else { None };
        let mut s = stats.lock().unwrap_or_else(|e| e.into_inner());
        if s.calls == 0 {
            s.grid = l.grid;
            s.block = l.block;
        }
        s.calls += 1;
        let shape = (l.grid, l.block);
        if s.shapes.len() < MAX_SHAPES && !s.shapes.contains(&shape) {
            s.shapes.push(shape);
        }
        if packed.is_some() {
            s.packed_bytes = packed;
        }
    }
}

fn disable(st: &LaunchState, id: SpecId, kernel: &str, why: &str) {
    let mut d = DISABLED.lock().unwrap_or_else(|e| e.into_inner());
    if d.contains(&id.0) {
        return;
    }
    d.push(id.0);
    DISABLED_COUNT.fetch_add(1, Ordering::Release);
    drop(d);
    let line = st.specs.disable(id, why);
    log::warn(&format!("kernel spec for {kernel} disabled: {line}"));
}

// =============================================================================================
// Names and parameter sizes
// =============================================================================================

static CU_FUNC_GET_NAME: RealSlot = RealSlot::new(c"cuFuncGetName");
static CU_FUNC_GET_PARAM_INFO: RealSlot = RealSlot::new(c"cuFuncGetParamInfo");
static CUDA_GET_FUNC_BY_SYMBOL: RealSlot = RealSlot::new(c"cudaGetFuncBySymbol");
static CU_KERNEL_GET_FUNCTION: RealSlot = RealSlot::new(c"cuKernelGetFunction");
static HIP_KERNEL_NAME_REF: RealSlot = RealSlot::new(c"hipKernelNameRef");
static HIP_KERNEL_NAME_REF_BY_PTR: RealSlot = RealSlot::new(c"hipKernelNameRefByPtr");

type CuFuncGetName = unsafe extern "C" fn(*mut *const c_char, *mut c_void) -> i32;
type CuFuncGetParamInfo = unsafe extern "C" fn(*mut c_void, usize, *mut usize, *mut usize) -> i32;
type CudaGetFuncBySymbol = unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> i32;
type CuKernelGetFunction = unsafe extern "C" fn(*mut *mut c_void, *mut c_void) -> i32;
type HipKernelNameRef = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type HipKernelNameRefByPtr = unsafe extern "C" fn(*const c_void, *mut c_void) -> *const c_char;

fn c_name(p: *const c_char) -> Option<String> {
    // SAFETY: a non-null name from the driver is a NUL-terminated string it owns.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

fn cu_func_name(f: *mut c_void) -> Option<String> {
    let get = CU_FUNC_GET_NAME.get()?;
    let mut name: *const c_char = std::ptr::null();
    // SAFETY: the slot holds cuFuncGetName; f is a CUfunction the caller is launching.
    let status = unsafe { std::mem::transmute::<*mut c_void, CuFuncGetName>(get)(&mut name, f) };
    if status != 0 {
        return None;
    }
    c_name(name)
}

fn cu_param_sizes(f: *mut c_void) -> Option<Vec<usize>> {
    let get = CU_FUNC_GET_PARAM_INFO.get()?;
    // SAFETY: the slot holds cuFuncGetParamInfo.
    let get = unsafe { std::mem::transmute::<*mut c_void, CuFuncGetParamInfo>(get) };
    let mut sizes = Vec::new();
    for i in 0..MAX_PARAMS {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: f is the launched CUfunction; both out-pointers are valid.
        let status = unsafe { get(f, i, &mut offset, &mut size) };
        match status {
            0 => sizes.push(size),
            // Past the last parameter.
            CUDA_ERROR_INVALID_VALUE => return Some(sizes),
            // Not supported by this driver (or another failure): sizes unknown.
            _ => return None,
        }
    }
    None
}

fn cuda_function(host_stub: *const c_void) -> Option<*mut c_void> {
    let get = CUDA_GET_FUNC_BY_SYMBOL.get()?;
    let mut f: *mut c_void = std::ptr::null_mut();
    // SAFETY: the slot holds cudaGetFuncBySymbol; host_stub is the caller's kernel symbol.
    let status = unsafe { std::mem::transmute::<*mut c_void, CudaGetFuncBySymbol>(get)(&mut f, host_stub) };
    (status == 0 && !f.is_null()).then_some(f)
}

/// The current context's CUfunction of a CUkernel. Since CUDA 12 the runtime loads its kernels
/// as libraries and launches CUkernel handles through cuLaunchKernel (measured on an H100 with
/// PyTorch 2.11: every PyTorch kernel arrived this way, and cuFuncGetName refused the handle).
/// Only asked after cuFuncGetName failed, i.e. for handles the driver did not take as CUfunction.
fn cu_kernel_function(kernel: *mut c_void) -> Option<*mut c_void> {
    let get = CU_KERNEL_GET_FUNCTION.get()?;
    let mut f: *mut c_void = std::ptr::null_mut();
    // SAFETY: the slot holds cuKernelGetFunction; the driver validates the handle.
    let status = unsafe { std::mem::transmute::<*mut c_void, CuKernelGetFunction>(get)(&mut f, kernel) };
    (status == 0 && !f.is_null()).then_some(f)
}

/// The kernel's name and, on CUDA, the CUfunction its parameters can be asked of.
fn kernel_name(api: Api, handle: *mut c_void, stream: u64) -> (Option<String>, Option<*mut c_void>) {
    match api {
        Api::CuDriver => match cu_func_name(handle) {
            Some(name) => (Some(name), Some(handle)),
            None => match cu_kernel_function(handle) {
                Some(f) => (cu_func_name(f), Some(f)),
                None => (None, Some(handle)),
            },
        },
        Api::CudaRuntime => {
            let f = cuda_function(handle);
            (f.and_then(cu_func_name), f)
        }
        Api::HipModule => (
            HIP_KERNEL_NAME_REF.get().and_then(|get| {
                // SAFETY: the slot holds hipKernelNameRef; handle is the launched hipFunction_t.
                c_name(unsafe { std::mem::transmute::<*mut c_void, HipKernelNameRef>(get)(handle) })
            }),
            None,
        ),
        Api::HipRuntime => (
            HIP_KERNEL_NAME_REF_BY_PTR.get().and_then(|get| {
                // SAFETY: the slot holds hipKernelNameRefByPtr; handle is the host stub.
                c_name(unsafe {
                    std::mem::transmute::<*mut c_void, HipKernelNameRefByPtr>(get)(
                        handle,
                        stream as *mut c_void,
                    )
                })
            }),
            None,
        ),
    }
}

fn describe(l: &Launch, st: &LaunchState, unloads: u64) -> KernelInfo {
    let (name, function) = kernel_name(l.api, l.handle as *mut c_void, l.stream);
    let param_sizes = function.and_then(cu_param_sizes);
    let spec = name.as_deref().and_then(|n| st.specs.find(n));
    KernelInfo {
        name,
        entry: l.entry,
        param_sizes,
        spec,
        disabled: AtomicBool::new(false),
        disabled_seen: AtomicUsize::new(0),
        stats: st.listing.is_some().then(|| Mutex::new(KernelCounts::default())),
        checked_at: AtomicU64::new(unloads),
        stale: AtomicBool::new(false),
    }
}

/// `info` if its handle still names the same kernel (name and parameters) after the modules
/// unloaded since it was made; otherwise the info of the kernel there now. None: the handle
/// could not be brought up to date (pass the launch through, never with a stale spec).
fn up_to_date(
    l: &Launch,
    st: &LaunchState,
    info: &'static KernelInfo,
    unloads: u64,
) -> Option<&'static KernelInfo> {
    if info.checked_at.load(Ordering::Acquire) == unloads {
        return (!info.stale.load(Ordering::Acquire)).then_some(info);
    }
    let fresh = describe(l, st, unloads);
    if fresh.name == info.name && fresh.param_sizes == info.param_sizes {
        info.stale.store(false, Ordering::Release);
        info.checked_at.fetch_max(unloads, Ordering::AcqRel);
        return Some(info);
    }
    let renewed = TABLE.renew(l.handle, info, fresh);
    if renewed.is_none() {
        info.stale.store(true, Ordering::Release);
        info.checked_at.fetch_max(unloads, Ordering::AcqRel);
    }
    renewed
}

// =============================================================================================
// The launch path
// =============================================================================================

fn on_launch(l: &Launch, real: &RealCall) -> i32 {
    if super::launch_is_nested() {
        // A library's own launch inside a hooked call (cuBLAS's GEMM kernel): forwarded as
        // any nested call, noted for the outer call when it watches.
        super::note_nested_launch(l.api as u8, l.handle);
        return real.call();
    }
    let st = state();
    if !st.active || l.handle == 0 {
        return real.call();
    }
    let unloads = UNLOADS.load(Ordering::Acquire);
    let Some(info) = TABLE.get_or_insert(l.handle, || describe(l, st, unloads)) else {
        TABLE.no_room();
        return real.call();
    };
    let Some(info) = up_to_date(l, st, info, unloads) else {
        TABLE.no_room();
        return real.call();
    };
    info.count(l);
    match info.live_spec() {
        None => real.call(),
        Some(id) => crate::engine::on_gemm(&LaunchGemm { l, info, id, st }, real),
    }
}

/// A launch of a kernel with a spec, as the engine sees a GEMM call.
struct LaunchGemm<'a> {
    l: &'a Launch,
    info: &'static KernelInfo,
    id: SpecId,
    st: &'static LaunchState,
}

impl GemmArgs for LaunchGemm<'_> {
    const ENTRY: &'static str = "kernel launch";

    fn quick_key(&self) -> u64 {
        let l = self.l;
        let dims = |d: [u32; 3]| (d[0] as u64) | ((d[1] as u64) << 21) | ((d[2] as u64) << 42);
        // The weight too: the layers of a model share one kernel and grid, and one counter for
        // all of them would check under `1/N` only the layers at multiples of gcd(layers, N).
        let weight = self.weight_ptr();
        KeyHasher::new(l.entry)
            .mix(l.handle as u64)
            .mix(dims(l.grid))
            .mix(dims(l.block))
            .mix(weight.unwrap_or(0))
            .finish()
    }

    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        let l = self.l;
        let name = self.info.name.as_deref().unwrap_or("");
        let decoded = self.with_args(|args| {
            let view = LaunchView { name, grid: l.grid, block: l.block, args };
            self.st.specs.decode(self.id, &view)
        })?;
        match decoded {
            Ok(d) => Ok(InterceptedGemm {
                entry: l.entry,
                problem: d.problem,
                buffers: d.buffers,
                stream: l.stream,
                pointer_arrays: None,
            }),
            Err(SpecError::Mismatch(why)) => {
                disable(self.st, self.id, name, &why);
                Err(Skip::new("kernel spec disabled after a mismatch"))
            }
            Err(SpecError::Skip(why)) => Err(Skip::new(why)),
        }
    }

    fn stream(&self) -> Option<u64> {
        Some(self.l.stream)
    }

    fn label(&self) -> Option<&str> {
        self.info.name.as_deref()
    }

    fn kernel(&self) -> Option<String> {
        self.info.name.clone()
    }
}

impl LaunchGemm<'_> {
    /// The weight's address, read alone (this runs for every launch of a spec'd kernel,
    /// sampled or not: no allocation). None where the spec reads it otherwise than from one
    /// parameter or a packed buffer.
    fn weight_ptr(&self) -> Option<u64> {
        let (l, specs) = (self.l, &self.st.specs);
        if l.params.is_null() {
            let (p, n) = l.packed()?;
            // SAFETY: the packed buffer and its size as given to the driver, which copies them.
            return specs
                .weight_ptr(self.id, &LaunchArgs::Packed(unsafe { std::slice::from_raw_parts(p, n) }));
        }
        let sizes = self.info.param_sizes.as_ref()?;
        const MOST: usize = 64;
        let index = match specs.weight_param(self.id) {
            Some(i) if sizes.len() <= MOST => i as usize,
            // Named through `vars`, or a kernel of many parameters: read with all of them.
            _ => return self.with_args(|args| specs.weight_ptr(self.id, &args)).ok().flatten(),
        };
        if index >= sizes.len() {
            return None;
        }
        // SAFETY: kernelParams has one pointer per parameter (index is below their count, the
        // driver's), each to the parameter's bytes of the size the driver reports.
        let p = unsafe { *l.params.add(index) } as *const u8;
        if p.is_null() {
            return None;
        }
        // SAFETY: as above.
        let bytes = unsafe { std::slice::from_raw_parts(p, sizes[index]) };
        // Only the weight's parameter is filled in: the spec reads no other for it.
        let mut slots: [&[u8]; MOST] = [&[]; MOST];
        slots[index] = bytes;
        specs.weight_ptr(self.id, &LaunchArgs::Indexed(&slots[..sizes.len()]))
    }

    /// `f` of the launch's arguments, as far as their extent is known.
    fn with_args<R>(&self, f: impl FnOnce(LaunchArgs) -> R) -> Result<R, Skip> {
        let l = self.l;
        let slices: Vec<&[u8]>;
        let args = if !l.params.is_null() {
            let sizes = self
                .info
                .param_sizes
                .as_ref()
                .ok_or_else(|| Skip::new("kernel launch: parameter sizes unknown"))?;
            slices = sizes
                .iter()
                .enumerate()
                .map(|(i, &n)| {
                    // SAFETY: kernelParams has one pointer per parameter of the kernel, each to
                    // the parameter's bytes, of the size the driver reports (it copies them).
                    let p = unsafe { *l.params.add(i) } as *const u8;
                    if p.is_null() {
                        return Err(Skip::new("kernel launch: null parameter pointer"));
                    }
                    // SAFETY: as above.
                    Ok(unsafe { std::slice::from_raw_parts(p, n) })
                })
                .collect::<Result<_, _>>()?;
            LaunchArgs::Indexed(&slices)
        } else if let Some((p, n)) = l.packed() {
            // SAFETY: the packed buffer and its size as given to the driver, which copies them.
            LaunchArgs::Packed(unsafe { std::slice::from_raw_parts(p, n) })
        } else {
            return Err(Skip::new("kernel launch: no arguments"));
        };
        Ok(f(args))
    }
}

/// Names of kernels seen launched inside BLAS calls, per handle (bounded).
type ServedNames = std::collections::HashMap<(u8, usize), Option<String>>;
static SERVED_NAMES: Mutex<Option<UnloadScoped<ServedNames>>> = Mutex::new(None);
const SERVED_NAMES_CAP: usize = 4096;

/// What [`served_by`] answered per list of launches seen (bounded): a call's answer is one
/// lookup and a shared string, not a join of copied names.
type ServedKey = (u8, [(u8, usize); super::WATCHED_LAUNCHES]);
type ServedBy = rustc_hash::FxHashMap<ServedKey, Option<Arc<str>>>;
static SERVED_BY: Mutex<Option<UnloadScoped<ServedBy>>> = Mutex::new(None);

/// The kernels a watched BLAS call launched ([`super::LaunchWatch::seen`]), named: "k1" or
/// "k1 + k2"; None when it launched none that could be named. Cached per list of launches.
pub fn served_by(seen: &[(u8, usize)]) -> Option<Arc<str>> {
    let mut key: ServedKey = (0, [(0, 0); super::WATCHED_LAUNCHES]);
    for (slot, launch) in key.1.iter_mut().zip(seen) {
        *slot = *launch;
        key.0 += 1;
    }
    let began = UNLOADS.load(Ordering::Acquire);
    if let Some(hit) =
        UnloadScoped::current(&mut SERVED_BY.lock().unwrap_or_else(|e| e.into_inner())).get(&key)
    {
        return hit.clone();
    }
    let joined: Option<Arc<str>> = served_by_uncached(seen, began).map(Arc::from);
    // Names found before an unload that happened meanwhile may belong to unloaded kernels
    // whose handles get reused: not kept.
    let fits = |m: &ServedBy| m.len() < SERVED_NAMES_CAP;
    UnloadScoped::keep(
        &mut SERVED_BY.lock().unwrap_or_else(|e| e.into_inner()),
        began,
        fits,
        (key, joined.clone()),
    );
    joined
}

/// [`served_by`] without its cache: names cached per handle, joined. `began`: the count of
/// [`UNLOADS`] when the lookup began.
fn served_by_uncached(seen: &[(u8, usize)], began: u64) -> Option<String> {
    let api_of = |code: u8| {
        [Api::CuDriver, Api::CudaRuntime, Api::HipModule, Api::HipRuntime]
            .into_iter()
            .find(|a| *a as u8 == code)
    };
    let mut names = Vec::new();
    for &(code, handle) in seen {
        let Some(api) = api_of(code) else { continue };
        if handle == 0 {
            continue;
        }
        // The vendor's name query runs outside the lock, which every watched BLAS call of
        // every thread takes. Once the map is full, new handles go unnamed rather than cost a
        // driver query per call.
        let cached = {
            let mut cache = SERVED_NAMES.lock().unwrap_or_else(|e| e.into_inner());
            let map = UnloadScoped::current(&mut cache);
            match map.get(&(code, handle)) {
                Some(n) => Some(n.clone()),
                None if map.len() >= SERVED_NAMES_CAP => Some(None),
                None => None,
            }
        };
        let name = match cached {
            Some(n) => n,
            None => {
                let (n, _) = kernel_name(api, handle as *mut c_void, 0);
                let mut cache = SERVED_NAMES.lock().unwrap_or_else(|e| e.into_inner());
                let fits = |m: &ServedNames| m.len() < SERVED_NAMES_CAP;
                UnloadScoped::keep(&mut cache, began, fits, ((code, handle), n.clone()));
                n
            }
        };
        if let Some(n) = name {
            names.push(n);
        }
    }
    (!names.is_empty()).then(|| names.join(" + "))
}

// =============================================================================================
// Kernel listing
// =============================================================================================

/// The kernels launched so far (most launched first).
pub fn listing() -> KernelListing {
    let replaced = REPLACED.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut kernels: Vec<KernelStat> = TABLE
        .infos()
        .chain(replaced)
        .filter_map(|info| {
            let s = info.stats.as_ref()?.lock().unwrap_or_else(|e| e.into_inner());
            Some(KernelStat {
                name: info.name.clone().unwrap_or_else(|| "(unnamed)".into()),
                entry: info.entry.to_string(),
                calls: s.calls,
                grid: s.grid,
                block: s.block,
                shapes: s.shapes.len() as u32,
                param_sizes: info.param_sizes.clone(),
                packed_bytes: s.packed_bytes,
                spec: info.spec.map(|id| state().specs.label(id).unwrap_or_else(|| format!("spec#{}", id.0))),
            })
        })
        .collect();
    kernels.sort_by(|a, b| b.calls.cmp(&a.calls).then_with(|| a.name.cmp(&b.name)));
    let overflow = TABLE.overflow.load(Ordering::Relaxed);
    if overflow > 0 {
        kernels.push(KernelStat {
            name: "(kernels beyond the table)".into(),
            entry: String::new(),
            calls: overflow,
            grid: [0; 3],
            block: [0; 3],
            shapes: 0,
            param_sizes: None,
            packed_bytes: None,
            spec: None,
        });
    }
    KernelListing { kernels }
}

extern "C" fn write_listing_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let Some(st) = STATE.get() else {
            return;
        };
        // A child made by fork() without exec inherits the handler, not the file.
        if st.pid != std::process::id() {
            return;
        }
        let Some(path) = &st.listing else {
            return;
        };
        let json = match serde_json::to_string_pretty(&listing()) {
            Ok(j) => j,
            Err(e) => return log::error(&format!("kernel listing: {e}")),
        };
        if let Err(e) = std::fs::write(path, json + "\n") {
            log::error(&format!("kernel listing: cannot write {path}: {e}"));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_found_across_an_unload_are_not_cached() {
        type Names = std::collections::HashMap<usize, &'static str>;
        let mut cache: Option<UnloadScoped<Names>> = None;
        let fits = |_: &Names| true;
        // Found and stored at one count: kept.
        let began = UNLOADS.load(Ordering::Acquire);
        UnloadScoped::keep(&mut cache, began, fits, (1, "gemm_a"));
        assert_eq!(UnloadScoped::current(&mut cache).get(&1), Some(&"gemm_a"));
        // A lookup that began before an unload and stores after it (the race of emptying the
        // cache in forget_kernel_handles): not kept.
        let began = UNLOADS.load(Ordering::Acquire);
        forget_kernel_handles();
        UnloadScoped::keep(&mut cache, began, fits, (2, "gemm_of_an_unloaded_module"));
        let now = UnloadScoped::current(&mut cache);
        assert!(now.is_empty(), "emptied by the unload, the late name not kept: {now:?}");
        // A full cache keeps nothing new.
        let began = UNLOADS.load(Ordering::Acquire);
        UnloadScoped::keep(&mut cache, began, |m: &Names| m.is_empty(), (3, "gemm_c"));
        UnloadScoped::keep(&mut cache, began, |m: &Names| m.is_empty(), (4, "gemm_d"));
        assert_eq!(UnloadScoped::current(&mut cache).len(), 1);
    }

    #[test]
    fn packed_arguments_are_read_up_to_the_end_marker() {
        let mut buf = [7u8; 176];
        let mut size: usize = buf.len();
        let mut extra: [*mut c_void; 5] = [
            LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
            buf.as_mut_ptr() as *mut c_void,
            LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
            &mut size as *mut usize as *mut c_void,
            CU_LAUNCH_PARAM_END as *mut c_void,
        ];
        let mut l = Launch {
            entry: "cuLaunchKernel",
            api: Api::CuDriver,
            handle: 1,
            grid: [1; 3],
            block: [1; 3],
            stream: 0,
            params: std::ptr::null_mut(),
            extra: extra.as_mut_ptr(),
        };
        assert_eq!(l.packed().map(|(_, n)| n), Some(176));
        // SAFETY: l.extra points into `extra`, 5 entries.
        unsafe { *l.extra.add(4) = HIP_LAUNCH_PARAM_END as *mut c_void };
        l.api = Api::HipModule;
        assert_eq!(l.packed().map(|(_, n)| n), Some(176));
        l.extra = std::ptr::null_mut();
        assert!(l.packed().is_none());
    }

    #[test]
    fn the_table_keeps_one_info_per_handle() {
        let make = |name: &str| KernelInfo {
            name: Some(name.into()),
            entry: "cuLaunchKernel",
            param_sizes: None,
            spec: None,
            disabled: AtomicBool::new(false),
            disabled_seen: AtomicUsize::new(0),
            stats: None,
            checked_at: AtomicU64::new(0),
            stale: AtomicBool::new(false),
        };
        let a = TABLE.get_or_insert(0x1234_5678, || make("a")).unwrap();
        let b = TABLE.get_or_insert(0x1234_5678, || make("b")).unwrap();
        assert!(std::ptr::eq(a, b));
        assert_eq!(b.name.as_deref(), Some("a"));
    }
}
