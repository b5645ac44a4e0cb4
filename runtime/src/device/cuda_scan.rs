//! What the nodes of a CUDA graph being captured may write, read from their descriptions
//! (`GpuRuntime::captured_since`): a snapshot copy may run beside work that cannot write what
//! it reads. Raw driver calls through cudarc's `sys`; every symbol is probed by [`present`]
//! before any is called (cudarc panics on a missing one).

use super::{DeviceError, GraphNode, NodeWrites};
use cudarc::driver::sys as cu;
use std::ffi::c_void;

/// Driver symbols the scan calls (CUDA >= 12.4 for `cuFuncGetParamInfo`).
const SYMBOLS: &[&str] = &[
    "cuGraphNodeGetDependentNodes_v2",
    "cuGraphNodeGetType",
    "cuGraphKernelNodeGetParams_v2",
    "cuFuncGetParamInfo",
    "cuGraphMemsetNodeGetParams",
    "cuGraphMemcpyNodeGetParams",
];

/// Most parameters read of one kernel (a kernel with more is `Unknown`).
const MAX_PARAMS: usize = 256;
/// Most bytes of one parameter read (CUDA allows 32 KiB of parameters in all since 12.1).
const MAX_PARAM_BYTES: usize = 32 * 1024;

/// Whether libcuda (already found present by `CudaRuntime::load`) has every symbol the scan
/// calls.
pub(crate) fn present() -> bool {
    SYMBOLS.iter().all(|s| super::cuda::driver_symbol_present(s))
}

use super::cuda::check;

/// The dependents of `n`.
///
/// # Safety
/// [`present`] must have returned true and `n` must be a node of a live graph.
pub(crate) unsafe fn dependents(n: GraphNode) -> Result<Vec<GraphNode>, DeviceError> {
    let f = n.0 as cu::CUgraphNode;
    let mut count = 0usize;
    // SAFETY: as the function's contract; out-pointers are valid locals or a vector of the
    // driver's own count.
    check("cuGraphNodeGetDependentNodes_v2", unsafe {
        cu::cuGraphNodeGetDependentNodes_v2(f, std::ptr::null_mut(), std::ptr::null_mut(), &mut count)
    })?;
    let mut v: Vec<cu::CUgraphNode> = vec![std::ptr::null_mut(); count];
    if count > 0 {
        check("cuGraphNodeGetDependentNodes_v2", unsafe {
            cu::cuGraphNodeGetDependentNodes_v2(f, v.as_mut_ptr(), std::ptr::null_mut(), &mut count)
        })?;
        v.truncate(count);
    }
    Ok(v.into_iter().map(|d| GraphNode(d as u64)).collect())
}

/// What the node `n` may write.
///
/// # Safety
/// As [`dependents`].
pub(crate) unsafe fn node_writes(n: GraphNode) -> NodeWrites {
    let node = n.0 as cu::CUgraphNode;
    let mut kind = cu::CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST;
    // SAFETY: as the function's contract; out-pointer is a valid local.
    if check("cuGraphNodeGetType", unsafe { cu::cuGraphNodeGetType(node, &mut kind) }).is_err() {
        return NodeWrites::Unknown;
    }
    use cu::CUgraphNodeType as T;
    match kind {
        // SAFETY: a kernel node of a live graph.
        T::CU_GRAPH_NODE_TYPE_KERNEL => unsafe { kernel_writes(node) },
        T::CU_GRAPH_NODE_TYPE_MEMSET => {
            let mut p: cu::CUDA_MEMSET_NODE_PARAMS = unsafe { std::mem::zeroed() };
            if check("cuGraphMemsetNodeGetParams", unsafe { cu::cuGraphMemsetNodeGetParams(node, &mut p) })
                .is_err()
            {
                return NodeWrites::Unknown;
            }
            let rows = p.height.max(1) as u64;
            let row_bytes = p.width as u64 * p.elementSize as u64;
            span(p.dst, (rows - 1).checked_mul(p.pitch as u64).and_then(|b| b.checked_add(row_bytes)))
        }
        T::CU_GRAPH_NODE_TYPE_MEMCPY => {
            let mut p: cu::CUDA_MEMCPY3D = unsafe { std::mem::zeroed() };
            if check("cuGraphMemcpyNodeGetParams", unsafe { cu::cuGraphMemcpyNodeGetParams(node, &mut p) })
                .is_err()
            {
                return NodeWrites::Unknown;
            }
            use cu::CUmemorytype as M;
            match p.dstMemoryType {
                M::CU_MEMORYTYPE_HOST => NodeWrites::Nothing,
                M::CU_MEMORYTYPE_DEVICE | M::CU_MEMORYTYPE_UNIFIED => {
                    // Every byte from the start of the destination to the end of its last row
                    // (a bound: offsets, pitch and depth included).
                    let pitch = (p.dstPitch as u64).max(p.WidthInBytes as u64);
                    let rows = (p.dstZ as u64 + p.Depth.max(1) as u64)
                        .checked_mul((p.dstHeight as u64).max(p.dstY as u64 + p.Height.max(1) as u64));
                    let end = rows
                        .and_then(|r| r.checked_mul(pitch))
                        .and_then(|b| b.checked_add(p.dstXInBytes as u64 + p.WidthInBytes as u64));
                    span(p.dstDevice, end)
                }
                // Arrays are allocations of their own (never a GEMM's operand).
                _ => NodeWrites::Nothing,
            }
        }
        T::CU_GRAPH_NODE_TYPE_EMPTY
        | T::CU_GRAPH_NODE_TYPE_WAIT_EVENT
        | T::CU_GRAPH_NODE_TYPE_EVENT_RECORD => NodeWrites::Nothing,
        _ => NodeWrites::Unknown,
    }
}

fn span(start: cu::CUdeviceptr, bytes: Option<u64>) -> NodeWrites {
    match bytes.and_then(|b| start.checked_add(b)) {
        Some(end) => NodeWrites::Range(start, end),
        None => NodeWrites::Unknown,
    }
}

/// A kernel node's function and parameter values (`cuFuncGetParamInfo` gives each one's size).
///
/// # Safety
/// `node` is a kernel node of a live graph; [`present`] returned true.
unsafe fn kernel_writes(node: cu::CUgraphNode) -> NodeWrites {
    let mut p: cu::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    // SAFETY: as the function's contract; out-pointer is a valid local.
    if check("cuGraphKernelNodeGetParams_v2", unsafe { cu::cuGraphKernelNodeGetParams_v2(node, &mut p) })
        .is_err()
    {
        return NodeWrites::Unknown;
    }
    // Parameters packed in `extra`, or a kernel known only as a library kernel: not read.
    if p.func.is_null() || p.kernelParams.is_null() || !p.extra.is_null() {
        return NodeWrites::Unknown;
    }
    let mut params = Vec::new();
    for i in 0..=MAX_PARAMS {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: a valid function handle from the node; out-pointers are valid locals. An index
        // past the last parameter is an error, which ends the list.
        let r = unsafe { cu::cuFuncGetParamInfo(p.func, i, &mut offset, &mut size) };
        if r != cu::CUresult::CUDA_SUCCESS {
            break;
        }
        if i == MAX_PARAMS || size > MAX_PARAM_BYTES {
            return NodeWrites::Unknown;
        }
        // SAFETY: the driver's parameter array has one pointer per parameter, each to `size`
        // bytes of its value (what the driver copied into the node).
        let value = unsafe { *p.kernelParams.add(i) } as *const c_void as *const u8;
        if value.is_null() {
            return NodeWrites::Unknown;
        }
        params.push(unsafe { std::slice::from_raw_parts(value, size) }.to_vec());
    }
    NodeWrites::Kernel { function: p.func as u64, params }
}
