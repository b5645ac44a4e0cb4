//! Kernel spec files: how to read a GEMM out of a custom kernel launch (Triton, CUTLASS-style,
//! ASM kernels), so launches that never reach a vendor BLAS can be checked too.
//!
//! The interface between the launch interposers (`intercept::launch`) and the spec engine:
//! - the interposer resolves a kernel's name once per function handle and asks
//!   [`SpecSet::find`]; kernels without a spec cost that lookup and nothing else;
//! - for a matched launch it builds a [`LaunchView`] whose argument bytes it can justify (each
//!   indexed parameter with its driver-reported size, or the packed argument buffer with its
//!   size) and calls [`SpecSet::decode`];
//! - a spec that does not fit its launch returns [`SpecError::Mismatch`]: the interposer calls
//!   [`SpecSet::disable`] (one log line, counted skip) and never uses that spec again.
//!
//! STATUS: interface skeleton. The TOML format, matching and decoding are being implemented.

use crate::problem::{GemmBuffers, GemmProblem};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// One kernel launch as the spec engine sees it.
#[derive(Debug, Clone, Copy)]
pub struct LaunchView<'a> {
    /// The kernel's (mangled) name as the driver reports it.
    pub name: &'a str,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub args: LaunchArgs<'a>,
}

/// The launch's arguments, only as far as their extent is known.
#[derive(Debug, Clone, Copy)]
pub enum LaunchArgs<'a> {
    /// `kernelParams`: parameter i's bytes, each slice exactly the size the driver reports for
    /// that parameter (`cuFuncGetParamInfo`). Launches whose parameter sizes are unknown are
    /// never decoded.
    Indexed(&'a [&'a [u8]]),
    /// A packed argument buffer (`CU_LAUNCH_PARAM_BUFFER_POINTER` /
    /// `HIP_LAUNCH_PARAM_BUFFER_POINTER` with its `..._BUFFER_SIZE`).
    Packed(&'a [u8]),
}

/// Index of a spec inside its [`SpecSet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpecId(pub u32);

/// A launch read through its spec: the GEMM to check and its device addresses.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedLaunch {
    pub problem: GemmProblem,
    pub buffers: GemmBuffers,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpecError {
    /// The spec does not fit this kernel's launches (parameter count or sizes disagree, an
    /// offset outside the packed buffer): disable the spec.
    Mismatch(String),
    /// This one launch cannot be checked (a shape the problem model rejects, a null operand):
    /// a counted skip, the spec stays enabled.
    Skip(String),
}

/// Every loaded spec, matched by kernel name.
#[derive(Debug, Default)]
pub struct SpecSet {}

impl SpecSet {
    /// Specs from `QUANTSHADOW_SPECS` (files or directories, `:`-separated); problems with
    /// single files are returned as warnings and those files are left out.
    pub fn from_env() -> (SpecSet, Vec<String>) {
        match std::env::var_os("QUANTSHADOW_SPECS") {
            Some(v) => SpecSet::load(&std::env::split_paths(&v).collect::<Vec<_>>()),
            None => (SpecSet::default(), Vec::new()),
        }
    }

    pub fn load(_paths: &[PathBuf]) -> (SpecSet, Vec<String>) {
        (SpecSet::default(), vec!["kernel specs are not implemented yet".to_string()])
    }

    pub fn is_empty(&self) -> bool {
        true
    }

    /// The first enabled spec whose name pattern matches `kernel_name`.
    pub fn find(&self, _kernel_name: &str) -> Option<SpecId> {
        None
    }

    pub fn decode(&self, _id: SpecId, _launch: &LaunchView) -> Result<DecodedLaunch, SpecError> {
        Err(SpecError::Skip("kernel specs are not implemented yet".to_string()))
    }

    /// Disables a spec after a mismatch; returns the log line to print once.
    pub fn disable(&self, _id: SpecId, reason: &str) -> String {
        reason.to_string()
    }
}

/// One kernel seen in a run (observe mode), for `quantshadow kernels`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelStat {
    pub name: String,
    /// The interposed launch function (`cuLaunchKernel`, `hipModuleLaunchKernel`, ...).
    pub entry: String,
    pub calls: u64,
    /// Grid and block of the first launch; `shapes` counts distinct (grid, block) pairs.
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shapes: u32,
    /// Parameter sizes in bytes when the driver reports them.
    pub param_sizes: Option<Vec<usize>>,
    /// Bytes of the packed argument buffer when the launch used one.
    pub packed_bytes: Option<usize>,
    /// The spec that matched, if any.
    pub spec: Option<String>,
}

/// What the shim writes to `QUANTSHADOW_KERNELS_OUT` at exit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelListing {
    pub kernels: Vec<KernelStat>,
}
