//! hipBLASLt: `hipblasLtMatmul`, and the compute/scale types learnt at descriptor creation.

use super::hook::{hipblasLtMatmul, hipblasLtMatmulDescCreate, hipblasLtMatmulDescDestroy};
use super::RealCall;

pub fn matmul(args: &hipblasLtMatmul::Args, real: &RealCall) -> i32 {
    crate::engine::on_gemm(args, real)
}

pub fn desc_create(_args: &hipblasLtMatmulDescCreate::Args, real: &RealCall) -> i32 {
    real.call()
}

pub fn desc_destroy(_args: &hipblasLtMatmulDescDestroy::Args, real: &RealCall) -> i32 {
    real.call()
}
