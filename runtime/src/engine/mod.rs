//! The shadow engine: configuration, sampling, sites, the check backends and the poller.

pub mod backend;
pub mod host;

use crate::intercept::{GemmArgs, RealCall};

/// Entry of every intercepted GEMM: decide, run the real call, enqueue the check.
pub fn on_gemm<A: GemmArgs>(args: &A, real: &RealCall) -> i32 {
    let _ = args;
    real.call()
}
