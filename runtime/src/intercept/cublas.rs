//! cublas: classic GEMM entry points decoded from their arguments.
use super::RealCall;

pub fn gemm_ex(args: &super::hook::cublasGemmEx::Args, real: &RealCall) -> i32 {
    crate::engine::on_gemm(args, real)
}

pub fn gemm_ex_64(args: &super::hook::cublasGemmEx_64::Args, real: &RealCall) -> i32 {
    crate::engine::on_gemm(args, real)
}

pub fn gemm_strided_batched_ex(args: &super::hook::cublasGemmStridedBatchedEx::Args, real: &RealCall) -> i32 {
    crate::engine::on_gemm(args, real)
}

pub fn gemm_strided_batched_ex_64(
    args: &super::hook::cublasGemmStridedBatchedEx_64::Args,
    real: &RealCall,
) -> i32 {
    crate::engine::on_gemm(args, real)
}

pub fn gemm_batched_ex(args: &super::hook::cublasGemmBatchedEx::Args, real: &RealCall) -> i32 {
    crate::engine::on_gemm(args, real)
}

pub fn gemm_batched_ex_64(args: &super::hook::cublasGemmBatchedEx_64::Args, real: &RealCall) -> i32 {
    crate::engine::on_gemm(args, real)
}

pub fn sgemm(args: &super::hook::cublasSgemm_v2::Args, real: &RealCall) -> i32 {
    crate::engine::on_gemm(args, real)
}

pub fn sgemm_64(args: &super::hook::cublasSgemm_v2_64::Args, real: &RealCall) -> i32 {
    crate::engine::on_gemm(args, real)
}

pub fn hgemm(args: &super::hook::cublasHgemm::Args, real: &RealCall) -> i32 {
    crate::engine::on_gemm(args, real)
}

pub fn hgemm_64(args: &super::hook::cublasHgemm_64::Args, real: &RealCall) -> i32 {
    crate::engine::on_gemm(args, real)
}

pub fn sgemm_strided_batched(args: &super::hook::cublasSgemmStridedBatched::Args, real: &RealCall) -> i32 {
    crate::engine::on_gemm(args, real)
}

pub fn sgemm_strided_batched_64(
    args: &super::hook::cublasSgemmStridedBatched_64::Args,
    real: &RealCall,
) -> i32 {
    crate::engine::on_gemm(args, real)
}

pub fn hgemm_strided_batched(args: &super::hook::cublasHgemmStridedBatched::Args, real: &RealCall) -> i32 {
    crate::engine::on_gemm(args, real)
}

pub fn hgemm_strided_batched_64(
    args: &super::hook::cublasHgemmStridedBatched_64::Args,
    real: &RealCall,
) -> i32 {
    crate::engine::on_gemm(args, real)
}
