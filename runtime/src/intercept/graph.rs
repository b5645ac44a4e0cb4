//! CUDA graph entry points: instantiation, launch, destruction and changes of executables,
//! forwarded to `engine::graph_select`, which may launch a clone instead (per-replay sampling
//! chosen on the host). Nothing happens here until a CUDA backend installed the selection.

use super::{hook, RealCall};
use crate::engine::graph_select::{self, LaunchAs};
use std::ffi::c_void;

/// `cuGraphInstantiateWithFlags`: after the real call, the selection looks at the graph.
pub fn instantiate_with_flags(a: &hook::cuGraphInstantiateWithFlags::Args, real: &RealCall) -> i32 {
    let status = real.call();
    after_instantiate(status, a.exec_out, a.graph, || a.flags);
    status
}

macro_rules! instantiate_with_params {
    ($handler:ident, $sym:ident) => {
        /// `cuGraphInstantiateWithParams*`: flags are the first field of
        /// `CUDA_GRAPH_INSTANTIATE_PARAMS` (cuda.h).
        pub fn $handler(a: &hook::$sym::Args, real: &RealCall) -> i32 {
            let status = real.call();
            // SAFETY: after a successful call the caller's params struct is readable; its first
            // field is the u64 flags.
            after_instantiate(status, a.exec_out, a.graph, || {
                if a.params.is_null() {
                    0
                } else {
                    unsafe { std::ptr::read_unaligned(a.params as *const u64) }
                }
            });
            status
        }
    };
}
instantiate_with_params!(instantiate_with_params, cuGraphInstantiateWithParams);
instantiate_with_params!(instantiate_with_params_ptsz, cuGraphInstantiateWithParams_ptsz);

fn after_instantiate(status: i32, exec_out: *mut *mut c_void, graph: *mut c_void, flags: impl Fn() -> u64) {
    if status != 0 || exec_out.is_null() {
        return;
    }
    if let Some(sel) = graph_select::get() {
        // SAFETY: the driver wrote the new executable to the caller's out-pointer.
        let exec = unsafe { *exec_out } as u64;
        sel.on_instantiate(graph as u64, exec, flags());
    }
}

macro_rules! launch {
    ($handler:ident, $sym:ident) => {
        /// A launch of a selected executable runs its plain or checked clone instead, on the
        /// same stream (the `_ptsz` variant keeps the per-thread default stream).
        pub fn $handler(a: &hook::$sym::Args, real: &RealCall) -> i32 {
            let Some(LaunchAs::Instead(other)) = graph_select::get().map(|s| s.launch_as(a.exec as u64))
            else {
                return real.call();
            };
            let Some(f) = hook::$sym::REAL.get() else {
                return real.call();
            };
            let mut instead = *a;
            instead.exec = other as *mut c_void;
            // SAFETY: the slot holds the driver's function of this name and signature; the
            // clone is a live executable of the same context. Nothing after this call can panic
            // (a panic would make the guard launch the caller's executable as well).
            unsafe { instead.call(std::mem::transmute::<*mut c_void, hook::$sym::Real>(f)) }
        }
    };
}
launch!(launch, cuGraphLaunch);
launch!(launch_ptsz, cuGraphLaunch_ptsz);

macro_rules! end_capture {
    ($handler:ident, $sym:ident) => {
        /// The end of a stream capture: the engine first adds the checks it deferred to the
        /// capture's end (they run after the graph's production work), then the capture ends.
        /// The selection then learns how the capture ended: a failed end frees the graph with no
        /// `cuGraphDestroy`, and a later graph at the same address must never meet its nodes.
        pub fn $handler(a: &hook::$sym::Args, real: &RealCall) -> i32 {
            let capture = crate::engine::on_capture_end(a.stream as u64);
            let status = real.call();
            if let (Some((graph, id)), Some(sel)) = (capture, graph_select::get()) {
                sel.on_capture_end(graph, id, status == 0);
            }
            status
        }
    };
}
end_capture!(end_capture, cuStreamEndCapture);
end_capture!(end_capture_ptsz, cuStreamEndCapture_ptsz);

pub fn exec_destroy(a: &hook::cuGraphExecDestroy::Args, real: &RealCall) -> i32 {
    if let Some(sel) = graph_select::get() {
        sel.on_exec_destroy(a.exec as u64);
    }
    real.call()
}

pub fn graph_destroy(a: &hook::cuGraphDestroy::Args, real: &RealCall) -> i32 {
    if let Some(sel) = graph_select::get() {
        sel.on_graph_destroy(a.graph as u64);
    }
    real.call()
}

macro_rules! exec_change {
    ($($handler:ident: $sym:ident),* $(,)?) => {$(
        /// A change to an executable: its clones would run stale work, so the selection of
        /// that executable is dropped before the change is made.
        pub fn $handler(a: &hook::$sym::Args, real: &RealCall) -> i32 {
            if let Some(sel) = graph_select::get() {
                sel.on_exec_change(a.exec as u64);
            }
            real.call()
        }
    )*};
}
exec_change!(
    exec_update_v1: cuGraphExecUpdate,
    exec_update: cuGraphExecUpdate_v2,
    exec_kernel_params_v1: cuGraphExecKernelNodeSetParams,
    exec_kernel_params: cuGraphExecKernelNodeSetParams_v2,
    exec_memcpy_params: cuGraphExecMemcpyNodeSetParams,
    exec_memset_params: cuGraphExecMemsetNodeSetParams,
    exec_host_params: cuGraphExecHostNodeSetParams,
    exec_child_params: cuGraphExecChildGraphNodeSetParams,
    exec_record_event: cuGraphExecEventRecordNodeSetEvent,
    exec_wait_event: cuGraphExecEventWaitNodeSetEvent,
    exec_sema_signal: cuGraphExecExternalSemaphoresSignalNodeSetParams,
    exec_sema_wait: cuGraphExecExternalSemaphoresWaitNodeSetParams,
    exec_batch_mem_op: cuGraphExecBatchMemOpNodeSetParams,
    exec_node_params: cuGraphExecNodeSetParams,
    exec_node_enabled: cuGraphNodeSetEnabled,
);

macro_rules! event_record {
    ($($handler:ident: $sym:ident),* $(,)?) => {$(
        /// An event recorded on a stream: a snapshot copy pending there is captured first (see
        /// `engine::copy_beside`), then the event is recorded.
        pub fn $handler(a: &hook::$sym::Args, real: &RealCall) -> i32 {
            crate::engine::on_event_record(a.stream as u64);
            real.call()
        }
    )*};
}
event_record!(
    event_record: cuEventRecord,
    event_record_ptsz: cuEventRecord_ptsz,
    event_record_with_flags: cuEventRecordWithFlags,
    event_record_with_flags_ptsz: cuEventRecordWithFlags_ptsz,
);
