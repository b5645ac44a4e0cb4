//! libquantshadow.so: the LD_PRELOAD interposer.
//!
//! Thin by design: every export below is generated from the runtime's one hook list
//! (`quantshadow_runtime::for_each_hook!`) and forwards to `intercept::hook::<symbol>::enter`,
//! where the guard, the panic boundary, real-symbol resolution and all decisions live.

use std::ffi::{c_char, c_void};

static VERSION: &[u8] = concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes();

/// NUL-terminated version string of the shim, for `dlsym(handle, "quantshadow_version")`.
#[no_mangle]
pub extern "C" fn quantshadow_version() -> *const c_char {
    VERSION.as_ptr() as *const c_char
}

macro_rules! export_hooks {
    ($( $sym:ident : $($handler:ident)::+ , missing = $status:expr, ( $($p:ident : $t:ty),* $(,)? ) ;)*) => {
        $(
            /// Interposed vendor entry point (see the runtime's hook list).
            ///
            /// # Safety
            /// Called by the dynamic linker's binding in place of the vendor function, with
            /// the vendor function's arguments.
            #[no_mangle]
            #[allow(non_snake_case, clippy::too_many_arguments)]
            pub unsafe extern "C" fn $sym($($p: $t),*) -> i32 {
                // SAFETY: the caller's arguments are forwarded unchanged.
                unsafe { quantshadow_runtime::intercept::hook::$sym::enter($($p),*) }
            }
        )*
    };
}

quantshadow_runtime::for_each_hook!(export_hooks);
