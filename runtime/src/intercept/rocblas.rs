//! rocblas: classic GEMM entry points decoded from their arguments.
use super::RealCall;

pub fn gemm_ex(args: &super::hook::rocblas_gemm_ex::Args, real: &RealCall) -> i32 {
    crate::engine::on_gemm(args, real)
}

pub fn gemm_strided_batched_ex(
    args: &super::hook::rocblas_gemm_strided_batched_ex::Args,
    real: &RealCall,
) -> i32 {
    crate::engine::on_gemm(args, real)
}

pub fn gemm_ex3(args: &super::hook::rocblas_gemm_ex3::Args, real: &RealCall) -> i32 {
    crate::engine::on_gemm(args, real)
}
