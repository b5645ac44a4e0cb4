//! cuBLAS (`cublas_api.h`) enums used by the classic GEMM entry points (`cublasGemmEx`,
//! `cublasGemmStridedBatchedEx`, `cublasSgemm_v2`, ...) and shared with cuBLASLt
//! (`cublasOperation_t` for TRANSA/TRANSB, `cublasComputeType_t` for COMPUTE_TYPE).
//!
//! Source: CUDA 13.0.88 `include/cublas_api.h` (cuBLAS 13.1.0.3, H200 host); cuBLAS 12.8 via
//! `cudarc` `sys_12080.rs` (no 78/79 compute types). `CUBLAS_COMPUTE_32F_EMULATED_16BFX9` is
//! documented as added in 12.9 (HIPIFY's CUBLAS table); the other additions are dated by the
//! first header read that has them.

use super::{abi_table, lookup_any, VersionRange};
use crate::problem::{ComputeType, Transpose};

abi_table! {
    /// `cublasStatus_t`: the interposer returns one of these when the real symbol is missing.
    pub const CUBLAS_STATUS: [i32 => ()] = {
        enum: "cublasStatus_t", library: Cublas, header: "cublas_api.h";
        CUBLAS_STATUS_SUCCESS = 0,
        CUBLAS_STATUS_NOT_INITIALIZED = 1,
        CUBLAS_STATUS_ALLOC_FAILED = 3,
        CUBLAS_STATUS_INVALID_VALUE = 7,
        CUBLAS_STATUS_ARCH_MISMATCH = 8,
        CUBLAS_STATUS_MAPPING_ERROR = 11,
        CUBLAS_STATUS_EXECUTION_FAILED = 13,
        CUBLAS_STATUS_INTERNAL_ERROR = 14,
        CUBLAS_STATUS_NOT_SUPPORTED = 15,
        CUBLAS_STATUS_LICENSE_ERROR = 16,
    };
}

abi_table! {
    /// `cublasOperation_t` (also the value type of cuBLASLt TRANSA/TRANSB/TRANSC).
    pub const CUBLAS_OPERATION: [i32 => Option<Transpose>] = {
        enum: "cublasOperation_t", library: Cublas, header: "cublas_api.h";
        CUBLAS_OP_N = 0 => Some(Transpose::N),
        CUBLAS_OP_T = 1 => Some(Transpose::T),
        /// Conjugate transpose: the transpose for the real formats quantshadow decodes.
        CUBLAS_OP_C = 2 => Some(Transpose::T),
        /// Synonym of `CUBLAS_OP_C` in the header.
        CUBLAS_OP_HERMITAN = 2 => Some(Transpose::T),
        /// "conjugate, placeholder - not supported in the current release".
        CUBLAS_OP_CONJG = 3 => None,
    };
}

abi_table! {
    /// `cublasFillMode_t`: cuBLASLt FILL_MODE must stay `CUBLAS_FILL_MODE_FULL` (its default).
    pub const CUBLAS_FILL_MODE: [i32 => ()] = {
        enum: "cublasFillMode_t", library: Cublas, header: "cublas_api.h";
        CUBLAS_FILL_MODE_LOWER = 0,
        CUBLAS_FILL_MODE_UPPER = 1,
        CUBLAS_FILL_MODE_FULL = 2,
    };
}

abi_table! {
    /// `cublasPointerMode_t` (`cublasGetPointerMode` for the classic API's alpha/beta).
    pub const CUBLAS_POINTER_MODE: [i32 => ()] = {
        enum: "cublasPointerMode_t", library: Cublas, header: "cublas_api.h";
        CUBLAS_POINTER_MODE_HOST = 0,
        CUBLAS_POINTER_MODE_DEVICE = 1,
    };
}

abi_table! {
    /// `cublasComputeType_t`: `cublasGemmEx`'s compute type and cuBLASLt COMPUTE_TYPE. The
    /// emulated types compute something other than the named precision: not modeled.
    pub const CUBLAS_COMPUTE_TYPE: [i32 => Option<ComputeType>] = {
        enum: "cublasComputeType_t", library: Cublas, header: "cublas_api.h";
        CUBLAS_COMPUTE_16F = 64 => Some(ComputeType::F16),
        CUBLAS_COMPUTE_16F_PEDANTIC = 65 => Some(ComputeType::F16),
        CUBLAS_COMPUTE_32F = 68 => Some(ComputeType::F32),
        CUBLAS_COMPUTE_32F_PEDANTIC = 69 => Some(ComputeType::F32),
        CUBLAS_COMPUTE_32F_FAST_16F = 74 => Some(ComputeType::F32FastF16),
        CUBLAS_COMPUTE_32F_FAST_16BF = 75 => Some(ComputeType::F32FastBf16),
        CUBLAS_COMPUTE_32F_FAST_TF32 = 77 => Some(ComputeType::F32FastTf32),
        /// "float - emulated, converts inputs into 3xBF16 values". Added in cuBLAS 12.9.
        CUBLAS_COMPUTE_32F_EMULATED_16BFX9 = 78 => None; VersionRange::since(12, 9, 0),
        CUBLAS_COMPUTE_64F = 70 => Some(ComputeType::F64),
        CUBLAS_COMPUTE_64F_PEDANTIC = 71 => Some(ComputeType::F64),
        /// "double - emulated, converts inputs into fixed-point". First seen in the 13.1 header.
        CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT = 79 => None; VersionRange::since(13, 1, 0),
        CUBLAS_COMPUTE_32I = 72 => Some(ComputeType::I32),
        CUBLAS_COMPUTE_32I_PEDANTIC = 73 => Some(ComputeType::I32),
    };
}

abi_table! {
    /// `cublasMath_t` (`cublasGetMathMode`): decides what `cublasSgemm` really computes.
    /// `CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION` is a flag OR-ed onto the mode.
    pub const CUBLAS_MATH: [i32 => ()] = {
        enum: "cublasMath_t", library: Cublas, header: "cublas_api.h";
        CUBLAS_DEFAULT_MATH = 0,
        /// Deprecated: "same effect as using CUBLAS_COMPUTE_32F_FAST_16F".
        CUBLAS_TENSOR_OP_MATH = 1,
        CUBLAS_PEDANTIC_MATH = 2,
        CUBLAS_TF32_TENSOR_OP_MATH = 3,
        /// First seen in the 13.1 header (absent in 12.8).
        CUBLAS_FP32_EMULATED_BF16X9_MATH = 4; VersionRange::since(13, 1, 0),
        /// First seen in the 13.1 header (absent in 12.8).
        CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH = 8; VersionRange::since(13, 1, 0),
        CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION = 16,
    };
}

abi_table! {
    /// `cublasGemmAlgo_t` values worth naming (the tensor-op ALGO0..15 variants are hints).
    pub const CUBLAS_GEMM_ALGO: [i32 => ()] = {
        enum: "cublasGemmAlgo_t", library: Cublas, header: "cublas_api.h";
        CUBLAS_GEMM_DEFAULT = -1,
        CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99,
    };
}

/// `cublasOperation_t` -> `Transpose`. `CUBLAS_OP_C` is the transpose for real data;
/// `CUBLAS_OP_CONJG` and unknown values are `None`.
pub fn transpose_from_cublas_operation(value: i32) -> Option<Transpose> {
    lookup_any(CUBLAS_OPERATION, value as i64).and_then(|e| e.meaning)
}

/// `cublasComputeType_t` -> `ComputeType`; `None` for emulated and unknown compute types.
pub fn compute_type_from_cublas(value: i32) -> Option<ComputeType> {
    lookup_any(CUBLAS_COMPUTE_TYPE, value as i64).and_then(|e| e.meaning)
}

/// What `cublasSgemm`/`cublasGemmEx` with `CUBLAS_COMPUTE_32F` compute under a
/// `cublasMath_t` mode (the reduced-precision-reduction flag does not change the inputs).
/// `None` for the BF16x9 emulation and unknown modes.
pub fn sgemm_compute_type_for_math_mode(mode: i32) -> Option<ComputeType> {
    match mode & !CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION {
        CUBLAS_DEFAULT_MATH | CUBLAS_PEDANTIC_MATH => Some(ComputeType::F32),
        CUBLAS_TENSOR_OP_MATH => Some(ComputeType::F32FastF16),
        CUBLAS_TF32_TENSOR_OP_MATH => Some(ComputeType::F32FastTf32),
        // Only double-precision routines are emulated in this mode.
        CUBLAS_FP64_EMULATED_FIXEDPOINT_MATH => Some(ComputeType::F32),
        _ => None,
    }
}

/// Name of a `cublasComputeType_t` value for logs and skip reasons.
pub fn cublas_compute_type_name(value: i32) -> &'static str {
    lookup_any(CUBLAS_COMPUTE_TYPE, value as i64).map_or("<unknown cublasComputeType_t>", |e| e.abi.name)
}

/// Name of a `cublasOperation_t` value (2 reads as `CUBLAS_OP_C`).
pub fn cublas_operation_name(value: i32) -> &'static str {
    lookup_any(CUBLAS_OPERATION, value as i64).map_or("<unknown cublasOperation_t>", |e| e.abi.name)
}

const _: () = {
    // cublas_api.h: `CUBLAS_OP_HERMITAN = 2, /* synonym if CUBLAS_OP_C */`.
    assert!(CUBLAS_OP_HERMITAN == CUBLAS_OP_C);
    // The math-mode flag must not collide with a mode.
    assert!(CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION & 0xF == 0);
};
