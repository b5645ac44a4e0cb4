//! libquantshadow.so: the LD_PRELOAD interposer. In this stage it only exports its version.

use std::ffi::c_char;

static VERSION: &[u8] = concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes();

/// NUL-terminated version string of the shim, for `dlsym(handle, "quantshadow_version")`.
#[no_mangle]
pub extern "C" fn quantshadow_version() -> *const c_char {
    VERSION.as_ptr() as *const c_char
}
