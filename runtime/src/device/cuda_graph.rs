//! CUDA graph surgery for the launch-time selection (`engine::graph_select`): clone a graph,
//! remove nodes keeping order, clear a check kernel's gate, instantiate, destroy. Raw driver
//! calls through cudarc's `sys`, behind the safe [`GraphDriver`] trait; every symbol is
//! probed by [`CudaGraphDriver::load`] before any is called (cudarc panics on a missing one).

use crate::engine::graph_select::{GateField, GraphDriver};
use cudarc::driver::sys as cu;
use std::ffi::c_void;

/// Driver symbols the surgery calls (CUDA >= 12.3 for the `_v2` edge-data variants).
const SYMBOLS: &[&str] = &[
    "cuGraphGetNodes",
    "cuGraphNodeGetType",
    "cuGraphClone",
    "cuGraphNodeFindInClone",
    "cuGraphNodeGetDependencies_v2",
    "cuGraphNodeGetDependentNodes_v2",
    "cuGraphAddDependencies_v2",
    "cuGraphDestroyNode",
    "cuGraphDestroy",
    "cuGraphInstantiateWithFlags",
    "cuGraphExecDestroy",
    "cuGraphKernelNodeGetParams_v2",
    "cuGraphKernelNodeSetParams_v2",
];

/// Node types a clone reproduces exactly (kernel, memcpy, memset, host, empty, event wait and
/// record: `CUgraphNodeType` in cuda.h). Child graphs, memory alloc/free, external semaphores,
/// batch memory operations and conditional nodes are refused: their state may not be shared
/// by clones, or they may hide nodes of ours.
const CLONABLE_TYPES: &[u32] = &[0, 1, 2, 3, 5, 6, 7];

/// The driver's graph calls, all present.
pub struct CudaGraphDriver(());

fn status(call: &str, s: cu::CUresult) -> Result<(), String> {
    if s == cu::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        // The code as an integer: a driver newer than cudarc's enum may return a value it lacks.
        Err(format!("{call} failed (CUresult {})", s as i32))
    }
}

fn node(h: u64) -> cu::CUgraphNode {
    h as cu::CUgraphNode
}

fn graph(h: u64) -> cu::CUgraph {
    h as cu::CUgraph
}

/// Reads a node list through `f(ptr, &mut count)`: size query, then fill.
fn node_list(
    call: &str,
    f: impl Fn(*mut cu::CUgraphNode, *mut usize) -> cu::CUresult,
) -> Result<Vec<u64>, String> {
    let mut n = 0usize;
    status(call, f(std::ptr::null_mut(), &mut n))?;
    let mut v: Vec<cu::CUgraphNode> = vec![std::ptr::null_mut(); n];
    if n > 0 {
        status(call, f(v.as_mut_ptr(), &mut n))?;
        v.truncate(n);
    }
    Ok(v.into_iter().map(|p| p as u64).collect())
}

impl CudaGraphDriver {
    /// Some when libcuda (already found present by `CudaRuntime::load`) has every symbol.
    pub fn load() -> Option<CudaGraphDriver> {
        SYMBOLS.iter().all(|s| super::cuda::driver_symbol_present(s)).then_some(CudaGraphDriver(()))
    }
}

// SAFETY (all calls below): `load` verified every symbol; handles come from the driver (the
// engine's capture records and the caller's graph) and the driver validates them; every
// out-pointer is a valid local or a vector sized from the driver's own count.
impl GraphDriver for CudaGraphDriver {
    fn nodes(&self, g: u64) -> Result<Vec<u64>, String> {
        node_list("cuGraphGetNodes", |p, n| unsafe { cu::cuGraphGetNodes(graph(g), p, n) })
    }

    fn has_unclonable_nodes(&self, g: u64) -> Result<bool, String> {
        for n in self.nodes(g)? {
            let mut t: u32 = u32::MAX;
            // A u32 out-pointer: node types newer than cudarc's enum must not become a Rust enum.
            status("cuGraphNodeGetType", unsafe {
                cu::cuGraphNodeGetType(node(n), &mut t as *mut u32 as *mut cu::CUgraphNodeType)
            })?;
            if !CLONABLE_TYPES.contains(&t) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn clone_graph(&self, g: u64) -> Result<u64, String> {
        let mut c: cu::CUgraph = std::ptr::null_mut();
        status("cuGraphClone", unsafe { cu::cuGraphClone(&mut c, graph(g)) })?;
        Ok(c as u64)
    }

    fn find_in_clone(&self, n: u64, clone: u64) -> Result<u64, String> {
        let mut c: cu::CUgraphNode = std::ptr::null_mut();
        status("cuGraphNodeFindInClone", unsafe {
            cu::cuGraphNodeFindInClone(&mut c, node(n), graph(clone))
        })?;
        Ok(c as u64)
    }

    fn dependencies(&self, n: u64) -> Result<Vec<u64>, String> {
        // Edge data NULL: the driver fails (CUDA_ERROR_LOSSY_QUERY) on edges that carry data
        // (programmatic launch ports), which a plain edge would not reproduce: refused then.
        node_list("cuGraphNodeGetDependencies_v2", |p, c| unsafe {
            cu::cuGraphNodeGetDependencies_v2(node(n), p, std::ptr::null_mut(), c)
        })
    }

    fn dependents(&self, n: u64) -> Result<Vec<u64>, String> {
        node_list("cuGraphNodeGetDependentNodes_v2", |p, c| unsafe {
            cu::cuGraphNodeGetDependentNodes_v2(node(n), p, std::ptr::null_mut(), c)
        })
    }

    fn add_edge(&self, g: u64, from: u64, to: u64) -> Result<(), String> {
        let (f, t) = (node(from), node(to));
        status("cuGraphAddDependencies_v2", unsafe {
            cu::cuGraphAddDependencies_v2(graph(g), &f, &t, std::ptr::null(), 1)
        })
    }

    fn destroy_node(&self, n: u64) -> Result<(), String> {
        status("cuGraphDestroyNode", unsafe { cu::cuGraphDestroyNode(node(n)) })
    }

    fn destroy_graph(&self, g: u64) {
        unsafe { cu::cuGraphDestroy(graph(g)) };
    }

    fn instantiate(&self, g: u64, flags: u64) -> Result<u64, String> {
        let mut e: cu::CUgraphExec = std::ptr::null_mut();
        status("cuGraphInstantiateWithFlags", unsafe {
            cu::cuGraphInstantiateWithFlags(&mut e, graph(g), flags)
        })?;
        Ok(e as u64)
    }

    fn destroy_exec(&self, e: u64) {
        unsafe { cu::cuGraphExecDestroy(e as cu::CUgraphExec) };
    }

    fn clear_gate(&self, n: u64, field: GateField) -> Result<(), String> {
        if field.gate_offset + 8 > field.params_size {
            return Err("gate outside the parameter struct".into());
        }
        let mut p: cu::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
        status("cuGraphKernelNodeGetParams_v2", unsafe {
            cu::cuGraphKernelNodeGetParams_v2(node(n), &mut p)
        })?;
        if p.kernelParams.is_null() || !p.extra.is_null() {
            return Err("check node without a kernel parameter array".into());
        }
        // The check kernels take one by-value struct: parameter 0, `params_size` bytes.
        let first = unsafe { *p.kernelParams } as *const u8;
        if first.is_null() {
            return Err("check node without parameters".into());
        }
        let mut bytes = unsafe { std::slice::from_raw_parts(first, field.params_size) }.to_vec();
        bytes[field.gate_offset..field.gate_offset + 8].fill(0);
        let mut args: [*mut c_void; 1] = [bytes.as_mut_ptr() as *mut c_void];
        p.kernelParams = args.as_mut_ptr();
        // The driver copies the values before returning.
        status("cuGraphKernelNodeSetParams_v2", unsafe { cu::cuGraphKernelNodeSetParams_v2(node(n), &p) })
    }
}
