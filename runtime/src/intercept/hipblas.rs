//! hipblas: classic GEMM entry points decoded from their arguments.
use super::RealCall;

pub fn gemm_ex(args: &super::hook::hipblasGemmEx::Args, real: &RealCall) -> i32 {
    crate::engine::on_gemm(args, real)
}

pub fn gemm_ex_v2(args: &super::hook::hipblasGemmEx_v2::Args, real: &RealCall) -> i32 {
    crate::engine::on_gemm(args, real)
}

pub fn gemm_strided_batched_ex(
    args: &super::hook::hipblasGemmStridedBatchedEx::Args,
    real: &RealCall,
) -> i32 {
    crate::engine::on_gemm(args, real)
}

pub fn gemm_strided_batched_ex_v2(
    args: &super::hook::hipblasGemmStridedBatchedEx_v2::Args,
    real: &RealCall,
) -> i32 {
    crate::engine::on_gemm(args, real)
}
