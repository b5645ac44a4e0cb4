//! Finding the real vendor function behind an interposed name.
//!
//! `dlsym(RTLD_NEXT, name)` returns NULL when the vendor library was loaded into a local scope
//! (Python extension modules load libtorch_cuda, and with it libcublasLt, RTLD_LOCAL), and
//! calling that NULL crashes the host. So: walk the loaded objects (`dl_iterate_phdr`), open
//! each already-loaded one by path with RTLD_NOLOAD and look the name up there, skipping any
//! hit inside our own object; then fall back to RTLD_NEXT. The walk goes in RTLD_NEXT's order
//! (see [`first_hit`]). Callers cache the result.
//! Lookups go through glibc's own `dlsym` ([`super::dlsym::real_dlsym`]), never our override.

use super::dlsym::{loaded_ranges, own_object, real_dlsym};
use std::ffi::{c_void, CStr, CString};

/// Paths of the loaded objects (the main program, with an empty name, excluded), in load order.
pub fn loaded_objects() -> Vec<CString> {
    loaded_ranges().into_iter().map(|o| o.path).filter(|p| !p.as_bytes().is_empty()).collect()
}

/// The real `name`: the first object that defines it in [`first_hit`]'s order, else RTLD_NEXT.
pub fn real_symbol(name: &CStr) -> Option<*mut c_void> {
    let dlsym = real_dlsym()?;
    let own = own_object();
    let objects = loaded_ranges();
    let me = real_symbol as *const () as usize;
    let at = objects.iter().position(|o| o.contains(me));
    let found = first_hit(objects.len(), at, |i| {
        let path = &objects[i].path;
        // The main program has no path to open (and comes first: never after us).
        if path.as_bytes().is_empty() {
            return None;
        }
        // SAFETY: RTLD_NOLOAD never loads anything; it only returns a handle (with a
        // reference we drop below) to an object that is already mapped.
        unsafe {
            let handle = libc::dlopen(path.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY);
            if handle.is_null() {
                return None;
            }
            let p = dlsym(handle, name.as_ptr());
            libc::dlclose(handle);
            (!p.is_null() && !own.contains(p as usize)).then_some(p)
        }
    });
    if found.is_some() {
        return found;
    }
    // SAFETY: plain lookup in the objects loaded after ours.
    let p = unsafe { dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    (!p.is_null() && !own.contains(p as usize)).then_some(p)
}

/// The first hit of `lookup` over `count` objects in load order, ours at `own`: the objects
/// after ours first, then those before it, ours never; without `own`, all in load order.
/// RTLD_NEXT's order: an interposer preloaded before us (a tracer whose wrapper forwards with
/// `dlsym(RTLD_NEXT)`, which is our export) must not be taken for the real function while the
/// library after us defines it, or each side calls the other until the stack runs out. Objects
/// before ours still count when none after defines the name (the vendor library preloaded).
fn first_hit<T>(count: usize, own: Option<usize>, lookup: impl FnMut(usize) -> Option<T>) -> Option<T> {
    let after = own.map_or(0, |k| k + 1);
    (after..count).chain(0..own.unwrap_or(0)).find_map(lookup)
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

    /// Objects in load order, the names each defines; ours is "shim".
    fn pick(objects: &[(&'static str, &[&str])], name: &str) -> Option<&'static str> {
        let own = objects.iter().position(|(o, _)| *o == "shim");
        first_hit(objects.len(), own, |i| {
            let (o, defines) = objects[i];
            defines.contains(&name).then_some(o)
        })
    }

    #[test]
    fn an_interposer_before_ours_is_passed_over_for_the_library_after() {
        let objects: &[(&str, &[&str])] = &[
            ("tracer.so", &["cublasSgemm_v2"]),
            ("shim", &["cublasSgemm_v2"]),
            ("libc.so.6", &[]),
            ("libcublas.so.13", &["cublasSgemm_v2", "cublasGemmEx"]),
        ];
        assert_eq!(pick(objects, "cublasSgemm_v2"), Some("libcublas.so.13"));
        assert_eq!(pick(objects, "cublasGemmEx"), Some("libcublas.so.13"));
    }

    #[test]
    fn an_interposer_after_ours_comes_first_as_with_rtld_next() {
        let objects: &[(&str, &[&str])] = &[
            ("shim", &["cublasSgemm_v2"]),
            ("tracer.so", &["cublasSgemm_v2"]),
            ("libcublas.so.13", &["cublasSgemm_v2"]),
        ];
        assert_eq!(pick(objects, "cublasSgemm_v2"), Some("tracer.so"));
    }

    #[test]
    fn objects_before_ours_are_searched_last_in_load_order_and_ours_never() {
        let objects: &[(&str, &[&str])] = &[
            ("libcublas.so.13", &["cublasSgemm_v2"]),
            ("tracer.so", &["cublasSgemm_v2"]),
            ("shim", &["cublasSgemm_v2", "quantshadow_only"]),
            ("libc.so.6", &[]),
        ];
        assert_eq!(pick(objects, "cublasSgemm_v2"), Some("libcublas.so.13"));
        assert_eq!(pick(objects, "quantshadow_only"), None);
    }

    #[test]
    fn the_search_order_visits_every_other_object_once() {
        let order = |count, own| {
            let mut seen = Vec::new();
            first_hit(count, own, |i| {
                seen.push(i);
                None::<()>
            });
            seen
        };
        assert_eq!(order(5, Some(2)), [3, 4, 0, 1]);
        assert_eq!(order(5, Some(0)), [1, 2, 3, 4]);
        assert_eq!(order(5, Some(4)), [0, 1, 2, 3]);
        assert_eq!(order(3, None), [0, 1, 2]);
        assert_eq!(order(0, None), [] as [usize; 0]);
    }

    #[test]
    fn lists_loaded_objects() {
        let objs = loaded_objects();
        assert!(objs.iter().any(|p| p.to_string_lossy().contains("libc.so")), "{objs:?}");
    }
}
