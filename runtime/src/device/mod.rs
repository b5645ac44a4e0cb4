//! Devices that run the reference side of a check.
//!
//! Two levels:
//! - [`GpuRuntime`]: the handful of vendor runtime operations the shadow engine needs (memory,
//!   run-time compilation, module load, launch, capture status), implemented by `cuda` (driver
//!   API + NVRTC, loaded at run time) and `hip` (HIP + hipRTC, loaded at run time). Both always
//!   compile; a missing library, symbol or device is a typed error, never a panic.
//! - The engine-facing device (reference GEMM, sketch, compare) is generic over a runtime, with
//!   a `host` implementation (host memory, the host oracle as "kernels") for machines without
//!   a GPU. The host device is never chosen when a GPU runtime is present.
//!
//! Every runtime works in the caller's current context and device: it never creates a context
//! in someone else's process.

use std::ffi::c_void;

pub mod abi;
pub mod cuda;
pub mod cuda_graph;
#[doc(hidden)]
pub mod fake;
pub mod gpu;
pub mod hip;
pub(crate) mod host_pages;
pub mod pool;
pub mod registry;
pub mod snapshot;

/// Which vendor runtime a device belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Vendor {
    Nvidia,
    Amd,
    Host,
}

/// A device address (CUdeviceptr / hipDeviceptr_t as an integer).
pub type DevicePtr = u64;

/// A stream handle as an integer (CUstream / hipStream_t); 0 is the legacy default stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Stream(pub u64);

/// A loaded module (CUmodule / hipModule_t).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Module(pub u64);

/// A kernel entry point (CUfunction / hipFunction_t).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Function(pub u64);

/// The nodes a graph branch added after `from` must precede ([`GpuRuntime::join_graph_branch`]):
/// every dependent of a `from` node other than `branch` and `from` themselves, each once. A node
/// captured after several `from` nodes (a stream whose capture dependencies were two nodes, e.g.
/// a GEMM and an earlier copy branch joined into the stream) is a dependent of each of them;
/// a second edge to it is refused by the driver (CUDA_ERROR_INVALID_VALUE), which dropped the
/// copy and its check (4 per Llama decode graph on an H100, docs/measurements/2026-11-27-h100-
/// host-cost.md).
pub fn branch_join_edges<E>(
    branch: GraphNode,
    from: &[GraphNode],
    mut dependents_of: impl FnMut(GraphNode) -> Result<Vec<GraphNode>, E>,
) -> Result<Vec<GraphNode>, E> {
    let mut edges = Vec::new();
    for &f in from {
        for d in dependents_of(f)? {
            if d != branch && !from.contains(&d) && !edges.contains(&d) {
                edges.push(d);
            }
        }
    }
    Ok(edges)
}

/// An event for timing and ordering (CUevent / hipEvent_t).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Event(pub u64);

/// A node of a graph being captured (CUgraphNode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphNode(pub u64);

/// What the reference side needs to know about the caller's current device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    pub vendor: Vendor,
    /// Device ordinal in the process.
    pub ordinal: i32,
    pub name: String,
    /// `sm_90`, `gfx942`, ...: selects the compile target and the kernel cache entry.
    pub arch: String,
    pub total_memory: u64,
    pub multiprocessors: u32,
    /// 32 on NVIDIA, 64 on most AMD data-centre GPUs.
    pub warp_size: u32,
    /// Driver / runtime version as the vendor reports it.
    pub runtime_version: i32,
}

/// Host memory mapped into the device's address space (the results ring lives here).
#[derive(Debug)]
pub struct MappedHost {
    pub host: *mut u8,
    pub device: DevicePtr,
    pub bytes: usize,
}

// SAFETY: the allocation is owned by whoever holds the MappedHost; the pointers are plain
// addresses and the runtime functions that use them are thread-safe.
unsafe impl Send for MappedHost {}
unsafe impl Sync for MappedHost {}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DeviceError {
    #[error("{lib}: library not found (searched {searched})")]
    LibraryMissing { lib: &'static str, searched: String },
    #[error("{lib}: symbol {name} not found")]
    SymbolMissing { lib: &'static str, name: &'static str },
    #[error("no {vendor} device: {detail}")]
    NoDevice { vendor: &'static str, detail: String },
    #[error("no current {vendor} context on this thread (the engine has not initialised the device)")]
    NoContext { vendor: &'static str },
    #[error("{call} failed: {code} ({message})")]
    Call { call: &'static str, code: i32, message: String },
    #[error("compiling {name} for {arch} failed with options [{options}]:\n{log}")]
    Compile { name: String, arch: String, options: String, log: String },
    #[error("{0}")]
    Unsupported(String),
}

/// When a launched kernel may start, relative to the grid ahead of it on its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchOrder {
    /// Once the grid ahead has finished: an ordinary launch.
    InOrder,
    /// Possibly before it finishes (CUDA programmatic dependent launch, an "early start"). The
    /// kernel waits for that grid before reading what it writes. Runtimes without it return
    /// `Unsupported`, having launched nothing.
    Early,
}

/// The vendor runtime operations the shadow engine needs, and only those.
///
/// Implementations are thin: each method is one or two vendor calls with their status turned
/// into [`DeviceError`]. Synchronous methods (`*_sync`, `synchronize`) are for set-up, tests,
/// the selftest and benchmarks; the per-call shadow path uses only the `*_async` ones, `launch`
/// and `is_capturing`.
pub trait GpuRuntime: Send + Sync {
    fn vendor(&self) -> Vendor;

    /// The caller's current device (its context is left as it is).
    fn current_device(&self) -> Result<DeviceInfo, DeviceError>;
    /// Ordinal of the calling thread's current device (one cheap driver call).
    fn current_ordinal(&self) -> Result<i32, DeviceError>;

    /// The calling thread's current context, as a raw handle (None: unknown, or the runtime
    /// has no such notion). A backend remembers the one it was made in, to know when the host
    /// destroys it.
    fn current_context(&self) -> Option<u64> {
        None
    }

    /// Whether the primary context of `device` (a vendor device handle, as the current
    /// ordinal) exists now (None: unknown). Read-only: never creates or releases it.
    fn primary_context_active(&self, device: i32) -> Option<bool> {
        let _ = device;
        None
    }

    /// Whether the calling thread's current context is its device's primary context (None:
    /// unknown). Asked once, when a backend starts.
    fn current_context_is_primary(&self) -> Option<bool> {
        None
    }

    fn malloc(&self, bytes: usize) -> Result<DevicePtr, DeviceError>;
    /// # Safety
    /// `ptr` came from [`GpuRuntime::malloc`] of this runtime and is not used afterwards.
    unsafe fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError>;

    /// Pinned host memory mapped into the device address space, zeroed.
    fn alloc_mapped(&self, bytes: usize) -> Result<MappedHost, DeviceError>;
    /// # Safety
    /// `mapped` came from [`GpuRuntime::alloc_mapped`] of this runtime and is not used afterwards.
    unsafe fn free_mapped(&self, mapped: &MappedHost) -> Result<(), DeviceError>;

    fn copy_to_device_sync(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DeviceError>;
    fn copy_to_host_sync(&self, dst: &mut [u8], src: DevicePtr) -> Result<(), DeviceError>;
    fn copy_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: Stream,
    ) -> Result<(), DeviceError>;
    fn memset_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: Stream,
    ) -> Result<(), DeviceError>;

    /// Compiles CUDA/HIP C++ `source` for `arch` with the run-time compiler; `headers` are
    /// (include name, text) pairs served from memory (no file-system includes). Returns the
    /// image to load (CUBIN on NVIDIA, a code object on AMD).
    fn compile(
        &self,
        source: &str,
        name: &str,
        arch: &str,
        options: &[String],
        headers: &[(&str, &str)],
    ) -> Result<Vec<u8>, DeviceError>;

    /// Version of the run-time compiler, part of the kernel cache key.
    fn compiler_version(&self) -> Result<String, DeviceError>;
    fn load_module(&self, image: &[u8]) -> Result<Module, DeviceError>;
    fn get_function(&self, module: Module, name: &str) -> Result<Function, DeviceError>;

    /// # Safety
    /// `params` must match the kernel's parameter list exactly (one pointer per parameter,
    /// each pointing at a value of the parameter's type), and every device pointer inside
    /// must be valid for what the kernel reads and writes. With [`LaunchOrder::Early`] the
    /// kernel must also wait for the prior grid (`qs_wait_prior_grid`) in every block before
    /// reading anything the work ahead of it on `stream` writes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch(
        &self,
        function: Function,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        stream: Stream,
        params: &mut [*mut c_void],
        order: LaunchOrder,
    ) -> Result<(), DeviceError>;

    /// Whether [`LaunchOrder::Early`] launches are available (the device must also support
    /// them: see `gpu::early_start_device`).
    fn early_launch(&self) -> bool {
        false
    }

    /// Whether compiled images may be kept in the disk cache: false for a runtime whose images
    /// are not real (the test fake), so that none lands beside real ones.
    fn disk_cache(&self) -> bool {
        true
    }

    fn is_capturing(&self, stream: Stream) -> Result<bool, DeviceError>;

    /// Id of the capture in progress on `stream` (None: not capturing, or the runtime cannot
    /// add graph branches, see [`GpuRuntime::launch_graph_branch`]).
    fn capture_id(&self, stream: Stream) -> Result<Option<u64>, DeviceError> {
        let _ = stream;
        Ok(None)
    }

    /// (capture id, graph) of the capture in progress on `stream` (None: not capturing, or
    /// unknown, as for [`GpuRuntime::capture_id`]).
    fn capture_graph(&self, stream: Stream) -> Result<Option<(u64, u64)>, DeviceError> {
        let _ = stream;
        Ok(None)
    }

    /// (capture id, graph, node) of the work last enqueued on `stream` while it captures: the
    /// stream's one capture dependency. None when not capturing, unknown, or not a single node.
    fn last_captured_node(&self, stream: Stream) -> Result<Option<(u64, u64, GraphNode)>, DeviceError> {
        let _ = stream;
        Ok(None)
    }

    /// The stream's current capture dependencies (the nodes the next captured work will
    /// follow); None when not capturing or unknown.
    fn capture_frontier(&self, stream: Stream) -> Result<Option<Vec<GraphNode>>, DeviceError> {
        let _ = stream;
        Ok(None)
    }

    /// Orders `node`, a branch added after the nodes `from` of the capture on `stream`, before
    /// everything captured since then: an edge from `node` to every dependent of `from` (other
    /// than `node` and `from` themselves), and, with `into_stream`, `node` added to the
    /// stream's capture dependencies so that the next captured work follows it too. Runtimes
    /// without it return `Unsupported`.
    fn join_graph_branch(
        &self,
        stream: Stream,
        node: GraphNode,
        from: &[GraphNode],
        into_stream: bool,
    ) -> Result<(), DeviceError> {
        let _ = (stream, node, from, into_stream);
        Err(DeviceError::Unsupported("graph branches are not implemented for this runtime".into()))
    }

    /// Adds a kernel node to the graph `stream` is capturing into, after the stream's current
    /// capture dependencies (the work just captured) and `after`, without making later captured
    /// work depend on it: a branch that runs at every replay and that nothing waits for but the
    /// end of the graph. (Legal while capturing: only node removal and graph destruction are
    /// not.) Runtimes without it return `Unsupported`.
    ///
    /// # Safety
    /// As [`GpuRuntime::launch`]; the parameter values are copied into the node.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch_graph_branch(
        &self,
        function: Function,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        stream: Stream,
        params: &mut [*mut c_void],
        after: Option<GraphNode>,
    ) -> Result<GraphNode, DeviceError> {
        let _ = (function, grid, block, shared_bytes, stream, params, after);
        Err(DeviceError::Unsupported("graph branches are not implemented for this runtime".into()))
    }
    /// As [`GpuRuntime::launch_graph_branch`], after exactly the nodes `deps` of the capture
    /// on `stream` (not its current dependencies).
    ///
    /// # Safety
    /// As [`GpuRuntime::launch`]; the parameter values are copied into the node.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch_graph_branch_from(
        &self,
        function: Function,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        stream: Stream,
        params: &mut [*mut c_void],
        deps: &[GraphNode],
    ) -> Result<GraphNode, DeviceError> {
        let _ = (function, grid, block, shared_bytes, stream, params, deps);
        Err(DeviceError::Unsupported("graph branches are not implemented for this runtime".into()))
    }
    /// Sets this thread's stream-capture interaction mode (CUDA: 0 global, 1 thread-local,
    /// 2 relaxed) and returns the previous one. Set-up work (allocations, synchronous copies,
    /// module loads) runs relaxed so that it never invalidates a capture another thread runs
    /// in the default global mode, as PyTorch's allocator does. Runtimes without the notion
    /// keep the default (nothing to exchange).
    fn exchange_capture_mode(&self, mode: u32) -> Result<u32, DeviceError> {
        let _ = mode;
        Ok(0)
    }
    fn synchronize(&self, stream: Stream) -> Result<(), DeviceError>;

    /// A non-blocking stream of the lowest priority, for reference work off the production
    /// stream.
    fn create_side_stream(&self) -> Result<Stream, DeviceError>;
    fn create_event(&self) -> Result<Event, DeviceError>;
    /// An event for ordering only (no timestamp: cheaper to record and to wait on). Runtimes
    /// without the distinction give a timing event.
    fn create_sync_event(&self) -> Result<Event, DeviceError> {
        self.create_event()
    }
    fn record_event(&self, event: Event, stream: Stream) -> Result<(), DeviceError>;
    fn wait_event(&self, stream: Stream, event: Event) -> Result<(), DeviceError>;
    /// Whether all work before the event's last record has completed (never waits).
    fn event_done(&self, event: Event) -> Result<bool, DeviceError>;
    /// Milliseconds between two completed events.
    fn elapsed_ms(&self, start: Event, end: Event) -> Result<f32, DeviceError>;
}

#[cfg(test)]
mod branch_join_tests {
    use super::{branch_join_edges, GraphNode};

    #[test]
    fn a_node_after_two_from_nodes_gets_one_edge() {
        // Capture dependencies {gemm 2, copy 1} (a copy joined into the stream), then kernel 3
        // captured after both: the branch must precede kernel 3 once, not once per from node.
        let (gemm2, copy1, k3, k4, branch) =
            (GraphNode(2), GraphNode(11), GraphNode(3), GraphNode(4), GraphNode(20));
        let graph = |n: GraphNode| -> Result<Vec<GraphNode>, ()> {
            Ok(match n.0 {
                2 => vec![k3, branch],
                11 => vec![k3, k4],
                _ => vec![],
            })
        };
        let edges = branch_join_edges(branch, &[gemm2, copy1], graph).unwrap();
        assert_eq!(edges, vec![k3, k4], "each dependent once, never the branch itself");
        // A from node that depends on another from node is not a target either.
        let chain = |n: GraphNode| -> Result<Vec<GraphNode>, ()> {
            Ok(if n == gemm2 { vec![copy1, k3] } else { vec![] })
        };
        assert_eq!(branch_join_edges(branch, &[gemm2, copy1], chain).unwrap(), vec![k3]);
        // The driver's failure to list dependents is passed on.
        assert!(branch_join_edges(branch, &[gemm2], |_| Err::<Vec<GraphNode>, _>("no")).is_err());
    }
}
