//! cuBLASLt: `cublasLtMatmul` decoded through the real descriptor getters.

use super::hook::cublasLtMatmul;
use super::RealCall;

pub fn matmul(args: &cublasLtMatmul::Args, real: &RealCall) -> i32 {
    crate::engine::on_gemm(args, real)
}
