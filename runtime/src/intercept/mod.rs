//! Interposed vendor entry points: the hook list expanded into argument structs, real-pointer
//! slots and guarded entries, plus per-vendor decoders from call arguments to the problem model.
//!
//! The shim's exports are one line each: they call `hooks::<symbol>::enter(...)`. Everything
//! else happens here, under three rules:
//! - a thread-local guard: a hooked call made while this thread is already inside a hook
//!   (cuBLAS calling cuBLASLt, our own work) goes straight to the real function;
//! - no panic leaves `enter`: a panic becomes a counted internal error and a passthrough, and
//!   the real function is called exactly once either way;
//! - a real symbol that cannot be found returns the vendor's error status (never a null call).
//!
//! The entry-point lookups (`cuGetProcAddress*`) run their body even when nested (see
//! [`guarded_lookup`]); `dlsym` is not a hook of the list but a trampoline in the shim (see
//! [`dlsym`]). Both hand out our exports for hooked names (`launch` for the kernel launches).

use std::cell::Cell;
use std::ffi::{c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

pub mod common;
pub mod cublas;
pub mod cublaslt;
pub mod dlsym;
pub mod graph;
pub mod hipblas;
pub mod hipblaslt;
#[macro_use]
pub mod hooks;
pub mod launch;
pub mod lifetime;
pub mod resolve;
pub mod rocblas;

use crate::problem::{GemmBuffers, GemmProblem};

/// One intercepted GEMM decoded into the problem model: what the shadow engine checks.
#[derive(Debug, Clone)]
pub struct InterceptedGemm {
    /// The exported symbol the call came through (`cublasLtMatmul`, `rocblas_gemm_ex`, ...).
    pub entry: &'static str,
    /// Row-major view of the call: D (M x N) = op(A) (M x K) op(B) (K x N). Column-major
    /// vendor calls are expressed through the transpose identity, so B is the weight of a
    /// `linear` layer (PyTorch's `cublas*(T, N, out_features, tokens, in_features, W, x)`).
    pub problem: GemmProblem,
    pub buffers: GemmBuffers,
    /// Raw `cudaStream_t` / `hipStream_t` the call was enqueued on (0: the legacy default).
    pub stream: u64,
    /// Batched-pointer calls (`*BatchedEx`): per-item addresses of A, B and D.
    pub pointer_arrays: Option<PointerArrays>,
}

/// Device addresses of the per-item matrices of an array-of-pointers batched call.
#[derive(Debug, Clone, Copy)]
pub struct PointerArrays {
    pub a: u64,
    pub b: u64,
    pub d: u64,
}

/// Why a call is passed through unchecked; counted per reason in the closing record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skip(pub String);

impl Skip {
    pub fn new(reason: impl Into<String>) -> Skip {
        Skip(reason.into())
    }
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What the engine needs from one hook's arguments.
pub trait GemmArgs {
    /// The exported symbol.
    const ENTRY: &'static str;
    /// A cheap identity of the call's site for the sampling decision: what can be read
    /// without decoding descriptors (at most a couple of attribute reads), the entry point
    /// included. Calls of one site must map to one key; distinct sites may rarely share one.
    fn quick_key(&self) -> u64;
    /// Full decode into the problem model, or why this call cannot be checked.
    fn decode(&self) -> Result<InterceptedGemm, Skip>;
    /// The raw stream the call is enqueued on, when it is cheap to know (an argument, or one
    /// handle query); the engine asks only for calls the host sampling passes over, to see
    /// whether they are being captured into a graph.
    fn stream(&self) -> Option<u64> {
        None
    }
    /// A name for the call's site when the names map has none (a launched kernel's name).
    fn label(&self) -> Option<&str> {
        None
    }
    /// The kernel that serves this call when the call itself says (a launch); BLAS calls
    /// learn theirs by watching the launches they make ([`LaunchWatch`]).
    fn kernel(&self) -> Option<String> {
        None
    }
    /// Device memory the library may write besides D during the call, as [start, end): the
    /// workspace a cuBLASLt / hipBLASLt call is given.
    fn scratch(&self) -> Option<(u64, u64)> {
        None
    }
}

/// The real function of one call, called at most once through [`RealCall::call`].
pub struct RealCall<'a> {
    call: &'a dyn Fn() -> i32,
    status: &'a Cell<Option<i32>>,
}

impl<'a> RealCall<'a> {
    /// Runs the real function (once; later calls return the first status).
    pub fn call(&self) -> i32 {
        if let Some(s) = self.status.get() {
            return s;
        }
        let s = (self.call)();
        self.status.set(Some(s));
        s
    }

    /// A real call over `call` (tests and benches of the engine without an interposer).
    #[cfg(test)]
    pub(crate) fn for_test(call: &'a dyn Fn() -> i32, status: &'a Cell<Option<i32>>) -> RealCall<'a> {
        RealCall { call, status }
    }

    /// Whether the real function has run.
    pub fn done(&self) -> Option<i32> {
        self.status.get()
    }
}

thread_local! {
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Panics caught at the C ABI boundary (each one a passthrough).
pub static CAUGHT_PANICS: AtomicU64 = AtomicU64::new(0);

struct HookGuard;

impl HookGuard {
    /// None when this thread is already inside a hook (or its TLS is being torn down).
    fn enter() -> Option<HookGuard> {
        IN_HOOK
            .try_with(|flag| {
                if flag.get() {
                    None
                } else {
                    flag.set(true);
                    Some(HookGuard)
                }
            })
            .ok()
            .flatten()
    }
}

impl Drop for HookGuard {
    fn drop(&mut self) {
        let _ = IN_HOOK.try_with(|flag| flag.set(false));
    }
}

/// The body of every export: guard, catch_unwind, exactly one real call.
pub fn guarded(body: impl FnOnce(&RealCall) -> i32, real: &dyn Fn() -> i32) -> i32 {
    if crate::engine::in_forked_child() {
        return real(); // locks the parent's threads held at fork() may never be released
    }
    let Some(_guard) = HookGuard::enter() else {
        return real();
    };
    let status = Cell::new(None);
    let call = RealCall { call: real, status: &status };
    match catch_unwind(AssertUnwindSafe(|| body(&call))) {
        Ok(s) => s,
        Err(_) => {
            CAUGHT_PANICS.fetch_add(1, Ordering::Relaxed);
            call.call()
        }
    }
}

/// The body of an entry-point lookup export (`cuGetProcAddress*`): runs even when this thread
/// is already inside a hook, since rewriting a returned pointer is harmless (the wrapper it
/// returns guards itself when called) while a lookup left unrewritten would never be seen
/// again (the CUDA runtime fetches its driver entry points once, possibly inside a BLAS hook).
pub fn guarded_lookup(body: impl FnOnce(&RealCall) -> i32, real: &dyn Fn() -> i32) -> i32 {
    let _guard = HookGuard::enter();
    let status = Cell::new(None);
    let call = RealCall { call: real, status: &status };
    match catch_unwind(AssertUnwindSafe(|| body(&call))) {
        Ok(s) => s,
        Err(_) => {
            CAUGHT_PANICS.fetch_add(1, Ordering::Relaxed);
            call.call()
        }
    }
}

/// Whether a hook is an entry-point lookup (see [`guarded_lookup`]); const for the hook list.
pub const fn is_lookup(name: &str) -> bool {
    starts_with(name.as_bytes(), b"cuGetProcAddress")
}

/// Whether a hook is a kernel launch (see [`guarded_launch`]); const for the hook list.
pub const fn is_launch(name: &str) -> bool {
    let n = name.as_bytes();
    starts_with(n, b"cuLaunchKernel")
        || starts_with(n, b"cudaLaunchKernel")
        || starts_with(n, b"hipModuleLaunchKernel")
        || starts_with(n, b"hipExtModuleLaunchKernel")
        || starts_with(n, b"hipDrvLaunchKernelEx")
        || starts_with(n, b"hipLaunchKernel")
}

const fn starts_with(n: &[u8], p: &[u8]) -> bool {
    if n.len() < p.len() {
        return false;
    }
    let mut i = 0;
    while i < p.len() {
        if n[i] != p[i] {
            return false;
        }
        i += 1;
    }
    true
}

// ---------------------------------------------------------------------------------------------
// Kernels launched inside a BLAS call: which kernel served it (the report's backend column and
// the backend policy). A launch made while this thread is inside another hook is forwarded at
// once, as any nested hooked call; when the outer hook armed a [`LaunchWatch`], the handle is
// noted first (two stores, no lookup: names are resolved after the BLAS call returns).
// ---------------------------------------------------------------------------------------------

/// Launches noted per watched call.
pub const WATCHED_LAUNCHES: usize = 2;

#[derive(Clone, Copy, Default)]
struct Watch {
    armed: bool,
    count: u8,
    /// (launch API code, handle) of the first launches.
    seen: [(u8, usize); WATCHED_LAUNCHES],
}

thread_local! {
    /// Set while a launch hook's body runs nested inside another hook.
    static NESTED_LAUNCH: Cell<bool> = const { Cell::new(false) };
    static WATCH: Cell<Watch> = const { Cell::new(Watch { armed: false, count: 0, seen: [(0, 0); WATCHED_LAUNCHES] }) };
}

/// Notes the launches this thread makes until dropped (the outer hook's real call).
pub struct LaunchWatch(());

impl LaunchWatch {
    pub fn arm() -> LaunchWatch {
        let _ = WATCH.try_with(|w| w.set(Watch { armed: true, ..Watch::default() }));
        LaunchWatch(())
    }

    /// (API code, handle) of the launches seen so far, at most [`WATCHED_LAUNCHES`].
    pub fn seen(&self) -> Vec<(u8, usize)> {
        WATCH
            .try_with(|w| {
                let w = w.get();
                w.seen[..(w.count as usize).min(WATCHED_LAUNCHES)].to_vec()
            })
            .unwrap_or_default()
    }
}

impl Drop for LaunchWatch {
    fn drop(&mut self) {
        let _ = WATCH.try_with(|w| w.set(Watch::default()));
    }
}

/// Whether the launch hook running on this thread is nested inside another hook.
pub fn launch_is_nested() -> bool {
    NESTED_LAUNCH.try_with(|n| n.get()).unwrap_or(false)
}

/// Notes a nested launch for an armed [`LaunchWatch`] (a no-op when none is armed).
pub fn note_nested_launch(api: u8, handle: usize) {
    let _ = WATCH.try_with(|w| {
        let mut v = w.get();
        if v.armed && (v.count as usize) < WATCHED_LAUNCHES {
            v.seen[v.count as usize] = (api, handle);
            v.count += 1;
            w.set(v);
        }
    });
}

/// The body of a kernel-launch export: as [`guarded`], except that a nested launch (one made
/// by a library inside another hooked call) still enters the body, marked nested, so that the
/// outer call can learn which kernel served it; the body forwards it at once.
pub fn guarded_launch(body: impl FnOnce(&RealCall) -> i32, real: &dyn Fn() -> i32) -> i32 {
    if crate::engine::in_forked_child() {
        return real(); // as in `guarded`
    }
    let guard = HookGuard::enter();
    let nested = guard.is_none();
    if nested {
        let _ = NESTED_LAUNCH.try_with(|n| n.set(true));
    }
    let status = Cell::new(None);
    let call = RealCall { call: real, status: &status };
    let result = match catch_unwind(AssertUnwindSafe(|| body(&call))) {
        Ok(s) => s,
        Err(_) => {
            CAUGHT_PANICS.fetch_add(1, Ordering::Relaxed);
            call.call()
        }
    };
    if nested {
        let _ = NESTED_LAUNCH.try_with(|n| n.set(false));
    }
    result
}

/// A real vendor function (a hooked entry's, or a helper such as `cublasGetStream_v2`)
/// resolved by [`resolve::real_symbol`] on first use and cached for the process, a miss
/// included: walking every loaded object again on each call would cost milliseconds per GEMM,
/// and the library whose hooked entry is being called is loaded by then.
pub struct RealSlot {
    name: &'static CStr,
    /// 0: not resolved yet; [`RealSlot::MISSING`]: not found; otherwise the address.
    ptr: AtomicUsize,
}

impl RealSlot {
    const MISSING: usize = 1;

    pub const fn new(name: &'static CStr) -> RealSlot {
        RealSlot { name, ptr: AtomicUsize::new(0) }
    }

    pub fn name(&self) -> &'static str {
        self.name.to_str().unwrap_or("?")
    }

    /// Stores the real function found by a `dlsym`/`cuGetProcAddress` lookup (only where the
    /// walk of loaded objects found none; see `dlsym::wrap`). Never replaces a function already
    /// found: an export handed out may forward to it. Returns whether the slot now holds `p`.
    pub fn set(&self, p: *mut c_void) -> bool {
        if p.is_null() {
            return false;
        }
        let p = p as usize;
        let stored = self.ptr.fetch_update(Ordering::AcqRel, Ordering::Acquire, |cur| {
            (cur == 0 || cur == Self::MISSING).then_some(p)
        });
        stored.map_or_else(|cur| cur == p, |_| true)
    }

    pub fn get(&self) -> Option<*mut c_void> {
        let mut p = self.ptr.load(Ordering::Acquire);
        if p == 0 {
            p = self.publish(resolve::real_symbol(self.name).map_or(Self::MISSING, |f| f as usize));
        }
        (p != Self::MISSING).then_some(p as *mut c_void)
    }

    /// Stores a first resolution over "not resolved" only and returns what the slot holds: a
    /// racing first call or a `set` may have stored first, and theirs stands (a late MISSING
    /// must not erase the function a `set` stored and an export already forwards to).
    fn publish(&self, found: usize) -> usize {
        match self.ptr.compare_exchange(0, found, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => found,
            Err(current) => current,
        }
    }
}

/// Expands the hook list into `pub mod <symbol>` with `Args`, `Real`, `REAL` and `enter`.
macro_rules! define_hook_modules {
    ($( $sym:ident : $($handler:ident)::+ , missing = $status:expr, ( $($p:ident : $t:ty),* $(,)? ) ;)*) => {
        /// Every hooked symbol, in list order (the shim exports exactly these).
        pub const HOOK_NAMES: &[&str] = &[$(stringify!($sym)),*];

        /// The real-pointer slot of every hook, in [`HOOK_NAMES`] order.
        pub static REAL_SLOTS: &[&crate::intercept::RealSlot] = &[$(&hook::$sym::REAL),*];

        /// One module per hooked symbol.
        pub mod hook {
            $(
            #[allow(non_snake_case)]
            pub mod $sym {
                #[allow(unused_imports)]
                use std::ffi::c_void;
                /// The real function's type.
                pub type Real = unsafe extern "C" fn($($t),*) -> i32;
                /// The call's arguments, as passed.
                #[derive(Clone, Copy, Debug)]
                pub struct Args { $(pub $p: $t),* }
                impl Args {
                    /// Calls `real` with these arguments.
                    ///
                    /// # Safety
                    /// `real` must be the vendor function of this signature.
                    pub unsafe fn call(&self, real: Real) -> i32 {
                        // SAFETY: forwarded as received from the caller.
                        unsafe { real($(self.$p),*) }
                    }
                }
                pub const NAME: &str = stringify!($sym);
                /// An entry-point lookup (runs its body even when nested; see `guarded_lookup`).
                pub const LOOKUP: bool = crate::intercept::is_lookup(NAME);
                /// A kernel launch (nested ones are noted for the outer call; `guarded_launch`).
                pub const LAUNCH: bool = crate::intercept::is_launch(NAME);
                /// Returned when the real symbol cannot be found.
                pub const MISSING_STATUS: i32 = $status;
                pub static REAL: crate::intercept::RealSlot =
                    crate::intercept::RealSlot::new(match std::ffi::CStr::from_bytes_with_nul(
                        concat!(stringify!($sym), "\0").as_bytes(),
                    ) {
                        Ok(name) => name,
                        Err(_) => panic!("hook names are C identifiers"),
                    });

                /// The export's body.
                ///
                /// # Safety
                /// Called by the exported C symbol with the caller's arguments.
                #[allow(clippy::too_many_arguments)]
                pub unsafe fn enter($($p: $t),*) -> i32 {
                    let args = Args { $($p),* };
                    let real = || match REAL.get() {
                        // SAFETY: the slot holds the vendor's symbol of this name and signature.
                        Some(p) => unsafe { args.call(std::mem::transmute::<*mut c_void, Real>(p)) },
                        None => MISSING_STATUS,
                    };
                    let body = |call: &crate::intercept::RealCall| crate::intercept::$($handler)::+(&args, call);
                    if LOOKUP {
                        crate::intercept::guarded_lookup(body, &real)
                    } else if LAUNCH {
                        crate::intercept::guarded_launch(body, &real)
                    } else {
                        crate::intercept::guarded(body, &real)
                    }
                }
            }
            )*
        }
    };
}

for_each_hook!(define_hook_modules);

#[cfg(test)]
mod tests {
    use super::*;

    extern "C" fn stand_in() {}

    fn stand_in_ptr() -> *mut c_void {
        stand_in as *const () as *mut c_void
    }

    #[test]
    fn a_late_first_resolution_does_not_erase_a_set_function() {
        // A thread in its first `get` found nothing and publishes after another thread's `set`.
        let slot = RealSlot::new(c"quantshadow_no_such_symbol_slot_a");
        assert!(slot.set(stand_in_ptr()));
        assert_eq!(slot.publish(RealSlot::MISSING), stand_in_ptr() as usize);
        assert_eq!(slot.get(), Some(stand_in_ptr()));
    }

    #[test]
    fn a_missing_function_can_be_set_later() {
        let slot = RealSlot::new(c"quantshadow_no_such_symbol_slot_b");
        assert_eq!(slot.get(), None);
        assert!(slot.set(stand_in_ptr()));
        assert_eq!(slot.get(), Some(stand_in_ptr()));
        assert!(!slot.set(std::ptr::null_mut()));
        assert_eq!(slot.get(), Some(stand_in_ptr()));
    }

    #[test]
    fn a_found_function_is_never_replaced() {
        let slot = RealSlot::new(c"getpid");
        let found = slot.get().expect("getpid is in libc");
        assert!(!slot.set(stand_in_ptr()));
        assert_eq!(slot.get(), Some(found));
        assert!(slot.set(found), "setting the held function reports it held");
    }

    #[test]
    fn the_first_published_resolution_wins() {
        let slot = RealSlot::new(c"quantshadow_no_such_symbol_slot_c");
        assert_eq!(slot.publish(stand_in_ptr() as usize), stand_in_ptr() as usize);
        assert_eq!(slot.publish(RealSlot::MISSING), stand_in_ptr() as usize);
        assert_eq!(slot.get(), Some(stand_in_ptr()));
    }

    #[test]
    fn racing_first_calls_and_a_set_end_with_the_set_function() {
        // As `dlsym::wrap` does: get (nothing found), then set, while other threads make their
        // first calls; none of them may leave the slot missing. (Timing-dependent: it caught a
        // plain store in most runs on 2 cores; the tests above are the deterministic ones.)
        for _ in 0..50 {
            let slot = RealSlot::new(c"quantshadow_no_such_symbol_slot_d");
            let start = std::sync::Barrier::new(4);
            std::thread::scope(|s| {
                for _ in 0..3 {
                    s.spawn(|| {
                        start.wait();
                        slot.get().is_some()
                    });
                }
                s.spawn(|| {
                    start.wait();
                    if slot.get().is_none() {
                        assert!(slot.set(stand_in_ptr()));
                    }
                });
            });
            assert_eq!(slot.get(), Some(stand_in_ptr()));
        }
    }
}
