//! Finding the real vendor function behind an interposed name.
//!
//! `dlsym(RTLD_NEXT, name)` returns NULL when the vendor library was loaded into a local scope
//! (Python extension modules load libtorch_cuda, and with it libcublasLt, RTLD_LOCAL), and
//! calling that NULL crashes the host. So: walk the loaded objects (`dl_iterate_phdr`), open
//! each already-loaded one by path with RTLD_NOLOAD and look the name up there, skipping any
//! hit inside our own object; then fall back to RTLD_NEXT. Callers cache the result.
//! Lookups go through glibc's own `dlsym` ([`super::dlsym::real_dlsym`]), never our override.

use std::ffi::{c_void, CStr, CString};

/// Base address of the object that contains this code (libquantshadow.so in a process, the
/// test binary in tests).
fn own_base() -> usize {
    object_base(own_base as *const c_void).unwrap_or(0)
}

/// Load base of the object containing `addr`, if any.
fn object_base(addr: *const c_void) -> Option<usize> {
    // SAFETY: dladdr only reads loader tables; info is a valid out-pointer.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(addr, &mut info) == 0 {
            return None;
        }
        Some(info.dli_fbase as usize)
    }
}

/// Paths of the loaded objects (the main program, with an empty name, excluded), in load order.
pub fn loaded_objects() -> Vec<CString> {
    unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: libc::size_t, data: *mut c_void) -> i32 {
        // SAFETY: the loader passes a valid info; data is the Vec below.
        unsafe {
            let out = &mut *(data as *mut Vec<CString>);
            let name = (*info).dlpi_name;
            if !name.is_null() {
                let name = CStr::from_ptr(name);
                if !name.to_bytes().is_empty() {
                    out.push(name.to_owned());
                }
            }
        }
        0
    }
    let mut out: Vec<CString> = Vec::new();
    // SAFETY: the callback only appends to `out`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut out as *mut Vec<CString> as *mut c_void) };
    out
}

/// The real `name`: the first loaded object other than ours that defines it, else RTLD_NEXT.
pub fn real_symbol(name: &CStr) -> Option<*mut c_void> {
    let dlsym = super::dlsym::real_dlsym()?;
    let own = own_base();
    for path in loaded_objects() {
        // SAFETY: RTLD_NOLOAD never loads anything; it only returns a handle (with a
        // reference we drop below) to an object that is already mapped.
        unsafe {
            let handle = libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY);
            if handle.is_null() {
                continue;
            }
            let p = dlsym(handle, name.as_ptr());
            libc::dlclose(handle);
            if !p.is_null() && object_base(p) != Some(own) {
                return Some(p);
            }
        }
    }
    // SAFETY: plain lookup in the objects loaded after ours.
    let p = unsafe { dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    (!p.is_null() && object_base(p) != Some(own)).then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_libc_functions_outside_this_object() {
        let p = real_symbol(c"getpid").expect("getpid is in libc");
        // SAFETY: getpid's signature.
        let f: extern "C" fn() -> i32 = unsafe { std::mem::transmute(p) };
        assert_eq!(f() as u32, std::process::id());
    }

    #[test]
    fn a_missing_symbol_is_none_not_a_crash() {
        assert!(real_symbol(c"quantshadow_no_such_symbol_xyz").is_none());
    }

    #[test]
    fn lists_loaded_objects() {
        let objs = loaded_objects();
        assert!(objs.iter().any(|p| p.to_string_lossy().contains("libc.so")), "{objs:?}");
    }
}
