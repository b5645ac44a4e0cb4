//! The `dlsym` override: a lookup of a hooked name returns our export, so code that resolves
//! vendor entry points itself (JAX's cuBLASLt, Triton's `cuLaunchKernelEx`, the CUDA runtime's
//! `cuGetProcAddress`) reaches the interposers as if it had called through its PLT.
//!
//! The export is a small assembly trampoline in the shim (`shim/src/lib.rs`) that passes the
//! caller's return address to [`route`]:
//! - not a hooked name, a nested call on this thread, or a call from our own object (the
//!   runtime's own lookups, `cudarc`'s included): `route` returns the real `dlsym` and the
//!   trampoline *tail-jumps* into it with the caller's return address still on the stack. glibc
//!   resolves `RTLD_NEXT` (and `RTLD_DEFAULT`'s scope) from that return address, so every such
//!   lookup behaves exactly as without us, other interposers' `dlsym(RTLD_NEXT, ...)` included;
//! - a hooked name: [`hooked`] looks the name up for the caller (for `RTLD_NEXT`: the first
//!   object loaded after the caller's that itself defines the name, found with
//!   `dl_iterate_phdr` + `dlopen(path, RTLD_NOLOAD)` + the real `dlsym`, returned as found),
//!   and for a real handle or `RTLD_DEFAULT`, when the address found is the function our
//!   export forwards to (see [`wrap`]), returns our export instead.
//!
//! The real `dlsym` is `dlvsym(RTLD_NEXT, "dlsym", <glibc version>)`; nothing here allocates
//! or takes a lock before a hooked name is seen, and nothing panics across the ABI.

use super::{HOOK_NAMES, REAL_SLOTS};
use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};

/// glibc's `dlsym`.
pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// Versions of glibc's `dlsym`, newest first (2.34 moved libdl into libc).
#[cfg(target_arch = "aarch64")]
const DLSYM_VERSIONS: &[&CStr] = &[c"GLIBC_2.34", c"GLIBC_2.17"];
#[cfg(not(target_arch = "aarch64"))]
const DLSYM_VERSIONS: &[&CStr] = &[c"GLIBC_2.34", c"GLIBC_2.2.5"];

/// 0: not looked up yet; 1: not found; otherwise glibc's `dlsym`.
static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// glibc's `dlsym`, never our override (`resolve` and this module call it directly).
pub fn real_dlsym() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p == 0 {
        p = 1;
        for v in DLSYM_VERSIONS {
            // SAFETY: dlvsym only reads the loader's tables; both strings are NUL-terminated.
            let q = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), v.as_ptr()) };
            if !q.is_null() {
                p = q as usize;
                break;
            }
        }
        REAL_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: a non-sentinel value is glibc's dlsym, of this signature.
    (p > 1).then(|| unsafe { std::mem::transmute::<usize, DlsymFn>(p) })
}

thread_local! {
    /// Set while this thread is inside [`hooked`]: lookups made by the lookup go straight through.
    static IN_DLSYM: Cell<bool> = const { Cell::new(false) };
}

struct DlsymGuard;

impl DlsymGuard {
    fn enter() -> Option<DlsymGuard> {
        IN_DLSYM.try_with(|g| if g.replace(true) { None } else { Some(DlsymGuard) }).ok().flatten()
    }
}

impl Drop for DlsymGuard {
    fn drop(&mut self) {
        let _ = IN_DLSYM.try_with(|g| g.set(false));
    }
}

/// Index of `name` in the hook list. Cheap reject first: every hooked name starts with `cu`,
/// `hip` or `rocblas_`, and most `dlsym` traffic (Python's `PyInit_*`, libc) does not.
pub fn hook_index(name: &[u8]) -> Option<usize> {
    match name.first() {
        Some(b'c') | Some(b'h') | Some(b'r') => {}
        _ => return None,
    }
    HOOK_NAMES.iter().position(|n| n.as_bytes() == name)
}

/// Called by the shim's `dlsym` trampoline: 0 means "take the hooked path", anything else is
/// the real `dlsym` to tail-jump to.
///
/// # Safety
/// `name` is the caller's `dlsym` argument (NULL or a C string); `caller` its return address.
pub unsafe extern "C" fn route(name: *const c_char, caller: *const c_void) -> usize {
    let Some(real) = real_dlsym() else {
        return 0;
    };
    let forward = real as usize;
    if name.is_null() {
        return forward;
    }
    let decided = catch_unwind(|| {
        // SAFETY: a non-null dlsym name is a NUL-terminated string (dlsym itself requires it).
        let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
        if hook_index(bytes).is_none() {
            return forward;
        }
        if IN_DLSYM.try_with(|g| g.get()).unwrap_or(true) || own_object().contains(caller as usize) {
            return forward;
        }
        0
    });
    decided.unwrap_or(forward)
}

/// The hooked path of the trampoline (see the module doc).
///
/// # Safety
/// Called by the trampoline with the caller's `dlsym` arguments and return address.
pub unsafe extern "C" fn hooked(
    handle: *mut c_void,
    name: *const c_char,
    caller: *const c_void,
) -> *mut c_void {
    let Some(real) = real_dlsym() else {
        return std::ptr::null_mut();
    };
    let _guard = DlsymGuard::enter();
    // SAFETY: forwarded arguments; see `lookup`.
    let found = catch_unwind(AssertUnwindSafe(|| unsafe { lookup(real, handle, name, caller) }));
    match found {
        Ok(p) => p,
        // SAFETY: as the caller asked (RTLD_NEXT then counts from our object: a panic's fallback).
        Err(_) => unsafe { real(handle, name) },
    }
}

unsafe fn lookup(
    real: DlsymFn,
    handle: *mut c_void,
    name: *const c_char,
    caller: *const c_void,
) -> *mut c_void {
    // SAFETY: `route` checked that name is a non-null C string.
    let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    let p = if handle == libc::RTLD_NEXT {
        // Returned as found, never wrapped: RTLD_NEXT is how another interposer finds the
        // function behind its own wrapper, and handing it ours would close a loop (our real
        // slot may well hold that interposer's function).
        // SAFETY: see next_after.
        return unsafe { next_after(real, caller, name) };
    } else {
        // SAFETY: the caller's own handle and name. RTLD_DEFAULT searched from our object sees
        // the global scope, where our preloaded export comes first, exactly as for the caller.
        unsafe { real(handle, name) }
    };
    if p.is_null() {
        return p;
    }
    match hook_index(bytes) {
        Some(i) => wrap(i, p, false).unwrap_or(p),
        None => p,
    }
}

/// `dlsym(RTLD_NEXT, name)` as glibc answers it for `caller`: the first object loaded after
/// the caller's that defines `name` itself. (glibc searches the caller's scope; objects loaded
/// RTLD_LOCAL by someone else are in load order here too: a documented difference that only
/// matters for hooked names defined twice.)
unsafe fn next_after(real: DlsymFn, caller: *const c_void, name: *const c_char) -> *mut c_void {
    let objects = loaded_ranges();
    let Some(at) = objects.iter().position(|o| o.contains(caller as usize)) else {
        // Unknown caller (JIT code): count from our object, as glibc would count from the
        // main program (our object comes right after it when preloaded).
        // SAFETY: plain lookup.
        return unsafe { real(libc::RTLD_NEXT, name) };
    };
    for o in &objects[at + 1..] {
        if o.path.as_bytes().is_empty() {
            continue;
        }
        // SAFETY: RTLD_NOLOAD never loads anything; the reference it takes is dropped below.
        unsafe {
            let h = libc::dlopen(o.path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY);
            if h.is_null() {
                continue;
            }
            let p = real(h, name);
            libc::dlclose(h);
            // dlsym(handle) also searches the object's dependencies: keep only its own definition.
            if !p.is_null() && o.contains(p as usize) {
                return p;
            }
        }
    }
    std::ptr::null_mut()
}

/// `p` is a real definition of hook `i`'s name (or, with `variants`, of a name the lookup may
/// answer with a variant: `cuGetProcAddress("cuLaunchKernel")` may return
/// `cuLaunchKernel_ptsz`). Returns the export that forwards to exactly `p`, if one does: the
/// hook whose real slot holds `p`, or hook `i` when its slot has nothing (`p` is stored then).
/// Never an export that would forward to a different function than the one asked for.
pub fn wrap(i: usize, p: *mut c_void, variants: bool) -> Option<*mut c_void> {
    if p.is_null() || own_object().contains(p as usize) {
        return None;
    }
    let name = HOOK_NAMES[i];
    let mut candidates = vec![i];
    if variants {
        for (j, n) in HOOK_NAMES.iter().enumerate() {
            if j != i && matches!(n.strip_prefix(name), Some("_ptsz") | Some("_v2")) {
                candidates.push(j);
            }
        }
    }
    for &j in &candidates {
        if REAL_SLOTS[j].get() == Some(p) {
            return own_export(j);
        }
    }
    // `set` fails when another thread filled the slot since `get` with a different function:
    // our export would then forward elsewhere.
    if REAL_SLOTS[i].get().is_none() && REAL_SLOTS[i].set(p) {
        return own_export(i);
    }
    None
}

/// Address range of one loaded object (its PT_LOAD segments).
pub(super) struct Loaded {
    /// Empty for the main program.
    pub(super) path: CString,
    start: usize,
    end: usize,
}

impl Loaded {
    pub(super) fn contains(&self, a: usize) -> bool {
        self.start <= a && a < self.end
    }
}

/// Every loaded object with its address range, in load (link-map) order.
pub(super) fn loaded_ranges() -> Vec<Loaded> {
    unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: libc::size_t, data: *mut c_void) -> i32 {
        // SAFETY: the loader passes a valid info whose phdr array has dlpi_phnum entries; data
        // is the Vec below.
        unsafe {
            let out = &mut *(data as *mut Vec<Loaded>);
            let info = &*info;
            let (mut start, mut end) = (usize::MAX, 0usize);
            for k in 0..info.dlpi_phnum as usize {
                let ph = &*info.dlpi_phdr.add(k);
                if ph.p_type == libc::PT_LOAD {
                    let s = info.dlpi_addr as usize + ph.p_vaddr as usize;
                    start = start.min(s);
                    end = end.max(s + ph.p_memsz as usize);
                }
            }
            let path = if info.dlpi_name.is_null() {
                CString::default()
            } else {
                CStr::from_ptr(info.dlpi_name).to_owned()
            };
            if start < end {
                out.push(Loaded { path, start, end });
            }
        }
        0
    }
    let mut out: Vec<Loaded> = Vec::new();
    // SAFETY: the callback only appends to `out`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut out as *mut Vec<Loaded> as *mut c_void) };
    out
}

/// The object containing this code (libquantshadow.so in a process), found once.
pub struct OwnObject {
    start: AtomicUsize,
    end: AtomicUsize,
}

static OWN: OwnObject = OwnObject { start: AtomicUsize::new(0), end: AtomicUsize::new(0) };

impl OwnObject {
    pub fn contains(&self, a: usize) -> bool {
        self.start.load(Ordering::Relaxed) <= a && a < self.end.load(Ordering::Relaxed)
    }
}

pub fn own_object() -> &'static OwnObject {
    if OWN.end.load(Ordering::Acquire) == 0 {
        let me = own_object as *const () as usize;
        if let Some(o) = loaded_ranges().into_iter().find(|o| o.contains(me)) {
            OWN.start.store(o.start, Ordering::Relaxed);
            OWN.end.store(o.end, Ordering::Release);
        }
    }
    &OWN
}

/// 0: not looked up; 1: none; otherwise the address of our export of hook i.
static EXPORTS: [AtomicUsize; HOOK_NAMES.len()] = [const { AtomicUsize::new(0) }; HOOK_NAMES.len()];

/// Our export of hook `i` (None outside the shim, e.g. in the runtime's own tests).
pub fn own_export(i: usize) -> Option<*mut c_void> {
    let mut p = EXPORTS[i].load(Ordering::Acquire);
    if p == 0 {
        p = find_own_export(HOOK_NAMES[i]).map_or(1, |q| q as usize);
        EXPORTS[i].store(p, Ordering::Release);
    }
    (p > 1).then_some(p as *mut c_void)
}

fn find_own_export(name: &str) -> Option<*mut c_void> {
    let real = real_dlsym()?;
    let name = CString::new(name).ok()?;
    // SAFETY: dladdr only reads loader tables; RTLD_NOLOAD never loads anything (the reference
    // it takes is dropped below).
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(find_own_export as *const c_void, &mut info) == 0 || info.dli_fname.is_null() {
            return None;
        }
        let h = libc::dlopen(info.dli_fname, libc::RTLD_NOLOAD | libc::RTLD_LAZY);
        if h.is_null() {
            return None;
        }
        let p = real(h, name.as_ptr());
        libc::dlclose(h);
        (!p.is_null() && own_object().contains(p as usize)).then_some(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_real_dlsym_is_glibcs() {
        let real = real_dlsym().expect("glibc dlsym");
        // SAFETY: plain lookup.
        let p = unsafe { real(libc::RTLD_DEFAULT, c"getpid".as_ptr()) };
        assert!(!p.is_null());
    }

    #[test]
    fn hook_names_are_recognised_and_others_rejected() {
        assert!(hook_index(b"cuLaunchKernel").is_some());
        assert!(hook_index(b"cublasLtMatmul").is_some());
        assert!(hook_index(b"cuLaunchKernelX").is_none());
        assert!(hook_index(b"PyInit_foo").is_none());
        assert!(hook_index(b"").is_none());
    }

    #[test]
    fn own_object_contains_this_code_and_no_export_outside_the_shim() {
        assert!(own_object().contains(own_object as *const () as usize));
        assert!(!own_object().contains(libc::getpid as *const () as usize));
        assert!(own_export(hook_index(b"cuLaunchKernel").unwrap()).is_none());
    }

    // Only the proc-address hooks are lookups (checked at compile time).
    const _: () = {
        use crate::intercept::hook;
        assert!(hook::cuGetProcAddress::LOOKUP && hook::cuGetProcAddress_v2::LOOKUP);
        assert!(
            !hook::cuLaunchKernel::LOOKUP && !hook::cublasLtMatmul::LOOKUP && !hook::hipLaunchKernel::LOOKUP
        );
    };

    #[test]
    fn route_forwards_unhooked_names_and_own_calls() {
        let real = real_dlsym().unwrap() as usize;
        // SAFETY: valid C strings; a return address inside this object.
        unsafe {
            assert_eq!(route(c"getpid".as_ptr(), std::ptr::null()), real);
            assert_eq!(route(c"cuLaunchKernel".as_ptr(), route as *const c_void), real);
            assert_eq!(route(c"cuLaunchKernel".as_ptr(), libc::getpid as *const c_void), 0);
        }
    }
}
