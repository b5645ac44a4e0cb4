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

/// `CUDA_MEMCPY3D` with its memory types as plain integers: the driver may write a value that
/// cudarc's enum lacks, and a Rust enum cannot even be zero-initialised (a non-unwinding panic
/// that aborts the host process, seen on an H100 in session 22 `exp95`).
#[repr(C)]
struct Memcpy3d {
    src_x_in_bytes: usize,
    src_y: usize,
    src_z: usize,
    src_lod: usize,
    src_memory_type: u32,
    src_host: *const c_void,
    src_device: u64,
    src_array: *mut c_void,
    reserved0: *mut c_void,
    src_pitch: usize,
    src_height: usize,
    dst_x_in_bytes: usize,
    dst_y: usize,
    dst_z: usize,
    dst_lod: usize,
    dst_memory_type: u32,
    dst_host: *mut c_void,
    dst_device: u64,
    dst_array: *mut c_void,
    reserved1: *mut c_void,
    dst_pitch: usize,
    dst_height: usize,
    width_in_bytes: usize,
    height: usize,
    depth: usize,
}

const _: () = {
    assert!(std::mem::size_of::<Memcpy3d>() == std::mem::size_of::<cu::CUDA_MEMCPY3D>());
    assert!(std::mem::align_of::<Memcpy3d>() == std::mem::align_of::<cu::CUDA_MEMCPY3D>());
    assert!(std::mem::offset_of!(Memcpy3d, dst_memory_type) == std::mem::offset_of!(cu::CUDA_MEMCPY3D, dstMemoryType));
    assert!(std::mem::offset_of!(Memcpy3d, dst_device) == std::mem::offset_of!(cu::CUDA_MEMCPY3D, dstDevice));
    assert!(std::mem::offset_of!(Memcpy3d, depth) == std::mem::offset_of!(cu::CUDA_MEMCPY3D, Depth));
};

// cuda.h values (plain integers, see `Memcpy3d`).
const NODE_KERNEL: u32 = 0;
const NODE_MEMCPY: u32 = 1;
const NODE_MEMSET: u32 = 2;
const NODE_EMPTY: u32 = 5;
const NODE_WAIT_EVENT: u32 = 6;
const NODE_EVENT_RECORD: u32 = 7;
const MEMORY_HOST: u32 = 1;
const MEMORY_DEVICE: u32 = 2;
const MEMORY_ARRAY: u32 = 3;
const MEMORY_UNIFIED: u32 = 4;

/// What the node `n` may write.
///
/// # Safety
/// As [`dependents`].
pub(crate) unsafe fn node_writes(n: GraphNode) -> NodeWrites {
    let node = n.0 as cu::CUgraphNode;
    let mut kind: u32 = u32::MAX;
    // SAFETY: as the function's contract. A u32 out-pointer: node types newer than cudarc's
    // enum must not become a Rust enum.
    if check("cuGraphNodeGetType", unsafe {
        cu::cuGraphNodeGetType(node, &mut kind as *mut u32 as *mut cu::CUgraphNodeType)
    })
    .is_err()
    {
        return NodeWrites::Unknown;
    }
    match kind {
        // SAFETY: a kernel node of a live graph.
        NODE_KERNEL => unsafe { kernel_writes(node) },
        NODE_MEMSET => {
            // Plain integers and an address: zero is a valid value of every field.
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
        NODE_MEMCPY => {
            let mut p = std::mem::MaybeUninit::<Memcpy3d>::zeroed();
            // SAFETY: `Memcpy3d` has CUDA_MEMCPY3D's layout (asserted above) with integers where
            // it has enums; the driver fills it.
            if check("cuGraphMemcpyNodeGetParams", unsafe {
                cu::cuGraphMemcpyNodeGetParams(node, p.as_mut_ptr() as *mut cu::CUDA_MEMCPY3D)
            })
            .is_err()
            {
                return NodeWrites::Unknown;
            }
            // SAFETY: all-zero bytes are a valid Memcpy3d (integers and raw pointers), and the
            // driver wrote the rest.
            let p = unsafe { p.assume_init() };
            match p.dst_memory_type {
                MEMORY_HOST => NodeWrites::Nothing,
                // Arrays are allocations of their own (never a GEMM's operand).
                MEMORY_ARRAY => NodeWrites::Nothing,
                // Device or unified: every byte from the start of the destination to the end of
                // its last row (a bound: offsets, pitch and depth included).
                MEMORY_DEVICE | MEMORY_UNIFIED => {
                    let pitch = (p.dst_pitch as u64).max(p.width_in_bytes as u64);
                    let rows = (p.dst_z as u64 + p.depth.max(1) as u64)
                        .checked_mul((p.dst_height as u64).max(p.dst_y as u64 + p.height.max(1) as u64));
                    let end = rows
                        .and_then(|r| r.checked_mul(pitch))
                        .and_then(|b| b.checked_add(p.dst_x_in_bytes as u64 + p.width_in_bytes as u64));
                    span(p.dst_device, end)
                }
                _ => NodeWrites::Unknown,
            }
        }
        NODE_EMPTY | NODE_WAIT_EVENT | NODE_EVENT_RECORD => NodeWrites::Nothing,
        _ => NodeWrites::Unknown,
    }
}

fn span(start: u64, bytes: Option<u64>) -> NodeWrites {
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
