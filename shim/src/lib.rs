//! libquantshadow.so: the LD_PRELOAD interposer.
//!
//! Thin by design: every export below is generated from the runtime's one hook list
//! (`quantshadow_runtime::for_each_hook!`) and forwards to `intercept::hook::<symbol>::enter`,
//! where the guard, the panic boundary, real-symbol resolution and all decisions live. The one
//! other export is `dlsym` (see `quantshadow_runtime::intercept::dlsym`).

use std::ffi::{c_char, c_void};

static VERSION: &[u8] = concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes();

/// NUL-terminated version string of the shim, for `dlsym(handle, "quantshadow_version")`.
#[no_mangle]
pub extern "C" fn quantshadow_version() -> *const c_char {
    VERSION.as_ptr() as *const c_char
}

/// Pauses (`on` != 0) or resumes checking in this process; returns 1 if it was paused, else 0.
/// While paused every intercepted call is forwarded at once; calls the sampling rule picks are
/// counted as skipped ("paused by quantshadow_pause"). For A/B timing in one process and for
/// sections an application does not want checked. Checks already recorded into a CUDA graph
/// still run at its replays. Look it up with `dlsym(RTLD_DEFAULT, "quantshadow_pause")`.
#[no_mangle]
pub extern "C" fn quantshadow_pause(on: i32) -> i32 {
    // An atomic swap: nothing here can panic, and it never starts the engine.
    quantshadow_runtime::engine::set_paused(on != 0) as i32
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

/// `dlsym` override: a trampoline that passes the caller's return address to
/// `intercept::dlsym::route`; for names that are not hooked (and for our own lookups) it
/// tail-jumps into glibc's `dlsym` with the caller's return address still in place, so glibc
/// resolves `RTLD_NEXT` for the real caller. Hooked names go to `intercept::dlsym::hooked`.
/// No frame of its own: it must be `naked`.
///
/// # Safety
/// Called as `dlsym(handle, symbol)`.
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    // Entry: rdi = handle, rsi = symbol, [rsp] = return address, rsp = 8 (mod 16).
    core::arch::naked_asm!(
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "mov rdi, rsi",
        "mov rsi, [rsp + 24]",
        "call {route}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        "mov rdx, [rsp]",
        "jmp {hooked}",
        route = sym quantshadow_runtime::intercept::dlsym::route,
        hooked = sym quantshadow_runtime::intercept::dlsym::hooked,
    );
}

/// See the x86_64 version. Entry: x0 = handle, x1 = symbol, x30 = return address.
///
/// # Safety
/// Called as `dlsym(handle, symbol)`.
#[cfg(target_arch = "aarch64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "stp x29, x30, [sp, #-32]!",
        "mov x29, sp",
        "stp x0, x1, [sp, #16]",
        "mov x0, x1",
        "mov x1, x30",
        "bl {route}",
        "mov x16, x0",
        "ldp x0, x1, [sp, #16]",
        "ldp x29, x30, [sp], #32",
        "cbz x16, 2f",
        "br x16",
        "2:",
        "mov x2, x30",
        "b {hooked}",
        route = sym quantshadow_runtime::intercept::dlsym::route,
        hooked = sym quantshadow_runtime::intercept::dlsym::hooked,
    );
}
