//! Ends of vendor objects whose handles the shim remembers: streams (a site's projection keeps
//! the streams its checks ran on, to retire it behind them), modules (kernel names and specs
//! are cached per function handle) and whole device contexts (a device reset, or a context the
//! host made and destroys). Each hook tells the runtime before the real call, while
//! the handle is still valid, and forwards; nothing here starts the engine.

use super::{hook, RealCall};

macro_rules! stream_destroy {
    ($($handler:ident: $sym:ident),* $(,)?) => {$(
        /// A stream is about to be destroyed: the engine forgets it first (its handle may be
        /// reused, and a destroyed stream must never be passed to the driver).
        pub fn $handler(a: &hook::$sym::Args, real: &RealCall) -> i32 {
            crate::engine::on_stream_destroy(a.stream as u64);
            real.call()
        }
    )*};
}
stream_destroy!(
    cu_stream_destroy: cuStreamDestroy,
    cu_stream_destroy_v2: cuStreamDestroy_v2,
    hip_stream_destroy: hipStreamDestroy,
);

macro_rules! module_unload {
    ($($handler:ident: $sym:ident),* $(,)?) => {$(
        /// A module (or CUDA library) is unloaded: kernels cached by function handle are named
        /// again at their next launch, since a later module may reuse the handles.
        pub fn $handler(_: &hook::$sym::Args, real: &RealCall) -> i32 {
            let status = real.call();
            if status == 0 {
                super::launch::forget_kernel_handles();
            }
            status
        }
    )*};
}
module_unload!(
    cu_module_unload: cuModuleUnload,
    cu_library_unload: cuLibraryUnload,
    hip_module_unload: hipModuleUnload,
);

macro_rules! primary_ctx_reset {
    ($($handler:ident: $sym:ident),* $(,)?) => {$(
        /// The device's primary context is about to be reset: the backend made in it is
        /// retired first (its next call starts a new one in the new context), and serves again
        /// if the reset fails.
        pub fn $handler(a: &hook::$sym::Args, real: &RealCall) -> i32 {
            let retired = crate::engine::on_device_reset(Some(a.device));
            let status = real.call();
            if retired && status != 0 {
                crate::engine::on_device_reset_failed(Some(a.device));
            }
            status
        }
    )*};
}
primary_ctx_reset!(primary_ctx_reset: cuDevicePrimaryCtxReset, primary_ctx_reset_v2: cuDevicePrimaryCtxReset_v2);

/// `hipDeviceReset` resets the calling thread's current device.
pub fn hip_device_reset(_: &hook::hipDeviceReset::Args, real: &RealCall) -> i32 {
    let retired = crate::engine::on_device_reset(None);
    let status = real.call();
    if retired && status != 0 {
        crate::engine::on_device_reset_failed(None);
    }
    status
}

macro_rules! ctx_destroy {
    ($($handler:ident: $sym:ident),* $(,)?) => {$(
        /// A context is about to be destroyed: a backend made in it is retired first (its
        /// streams, kernels and pool go with the context; the device's next call in another
        /// context starts a new backend). If the destroy fails the context lives on, and the
        /// backend serves again.
        pub fn $handler(a: &hook::$sym::Args, real: &RealCall) -> i32 {
            let retired = !a.ctx.is_null() && crate::engine::on_context_destroy(a.ctx as u64);
            let status = real.call();
            if retired {
                crate::engine::on_context_destroy_returned(a.ctx as u64, status == 0);
            }
            status
        }
    )*};
}
ctx_destroy!(cu_ctx_destroy: cuCtxDestroy, cu_ctx_destroy_v2: cuCtxDestroy_v2);

macro_rules! primary_ctx_release {
    ($($handler:ident: $sym:ident),* $(,)?) => {$(
        /// A primary context was released: if that was its last reference it is gone, and a
        /// backend made in it is retired (asked after the call, read-only).
        pub fn $handler(a: &hook::$sym::Args, real: &RealCall) -> i32 {
            let status = real.call();
            if status == 0 {
                crate::engine::on_primary_context_release(a.device);
            }
            status
        }
    )*};
}
primary_ctx_release!(
    primary_ctx_release: cuDevicePrimaryCtxRelease,
    primary_ctx_release_v2: cuDevicePrimaryCtxRelease_v2,
);
