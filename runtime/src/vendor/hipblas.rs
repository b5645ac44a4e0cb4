//! hipBLAS (`hipblas/hipblas.h`) and `hipblas-common.h` enums: the operations, compute types
//! and statuses shared by hipBLAS and hipBLASLt, and the two `hipblasGemmEx` ABIs.
//!
//! Sources: bindgen output of the ROCm 6.0.2 ... 7.2.3 headers (`hipblasOperation_t`,
//! `hipblasStatus_t`, `hipblasComputeType_t`, `hipblasDatatype_t` as seen through hipBLASLt's
//! includes); `ROCm/rocm-libraries` `projects/hipblas/CHANGELOG.md`:
//! - hipBLAS 2.0 (ROCm 6.0) deprecated `hipblasDatatype_t` and added the `_v2` entry points
//!   taking `hipDataType` + `hipblasComputeType_t` (`HIPBLAS_V2` selects them at compile time);
//! - hipBLAS 3.0 (ROCm 7.0) removed `hipblasDatatype_t`: `hipblasGemmEx` itself takes
//!   `hipDataType` + `hipblasComputeType_t`.
//!
//! The two ABIs do not share values (`hipblasDatatype_t` is 150..=169 and 255; `hipDataType`
//! is 0..=33 and 1000/1001; `hipblasComputeType_t` is 0..=10 and 100..=103), so a call whose
//! library version is unknown can still be classified by value ([`gemm_ex_abi_from_type`]).

use super::{abi_table, lookup_any, LibVersion, VersionRange};
use crate::formats::Format;
use crate::problem::{ComputeType, Transpose};

abi_table! {
    /// `hipblasStatus_t` (hipBLAS and hipBLASLt return it).
    pub const HIPBLAS_STATUS: [i32 => ()] = {
        enum: "hipblasStatus_t", library: Hip, header: "hipblas-common/hipblas-common.h";
        HIPBLAS_STATUS_SUCCESS = 0,
        HIPBLAS_STATUS_NOT_INITIALIZED = 1,
        HIPBLAS_STATUS_ALLOC_FAILED = 2,
        HIPBLAS_STATUS_INVALID_VALUE = 3,
        HIPBLAS_STATUS_MAPPING_ERROR = 4,
        HIPBLAS_STATUS_EXECUTION_FAILED = 5,
        HIPBLAS_STATUS_INTERNAL_ERROR = 6,
        HIPBLAS_STATUS_NOT_SUPPORTED = 7,
        HIPBLAS_STATUS_ARCH_MISMATCH = 8,
        HIPBLAS_STATUS_HANDLE_IS_NULLPTR = 9,
        HIPBLAS_STATUS_INVALID_ENUM = 10,
        HIPBLAS_STATUS_UNKNOWN = 11,
    };
}

abi_table! {
    /// `hipblasOperation_t` (hipBLAS transA/transB and hipBLASLt TRANSA/TRANSB values).
    pub const HIPBLAS_OPERATION: [i32 => Option<Transpose>] = {
        enum: "hipblasOperation_t", library: Hip, header: "hipblas-common/hipblas-common.h";
        HIPBLAS_OP_N = 111 => Some(Transpose::N),
        HIPBLAS_OP_T = 112 => Some(Transpose::T),
        /// Conjugate transpose: the transpose for real data.
        HIPBLAS_OP_C = 113 => Some(Transpose::T),
    };
}

abi_table! {
    /// `hipblasPointerMode_t` (`hipblasGetPointerMode` for hipBLAS's alpha/beta).
    pub const HIPBLAS_POINTER_MODE: [i32 => ()] = {
        enum: "hipblasPointerMode_t", library: HipBlas, header: "hipblas/hipblas.h";
        HIPBLAS_POINTER_MODE_HOST = 0,
        HIPBLAS_POINTER_MODE_DEVICE = 1,
    };
}

abi_table! {
    /// `hipblasComputeType_t`: hipBLASLt's `hipblasLtMatmulDescCreate` compute type and the v2
    /// hipBLAS GEMM compute type. The FNUZ "fast" types down-convert inputs to FP8: not modeled.
    pub const HIPBLAS_COMPUTE_TYPE: [i32 => Option<ComputeType>] = {
        enum: "hipblasComputeType_t", library: Hip, header: "hipblas-common/hipblas-common.h";
        HIPBLAS_COMPUTE_16F = 0 => Some(ComputeType::F16),
        HIPBLAS_COMPUTE_16F_PEDANTIC = 1 => Some(ComputeType::F16),
        HIPBLAS_COMPUTE_32F = 2 => Some(ComputeType::F32),
        HIPBLAS_COMPUTE_32F_PEDANTIC = 3 => Some(ComputeType::F32),
        HIPBLAS_COMPUTE_32F_FAST_16F = 4 => Some(ComputeType::F32FastF16),
        HIPBLAS_COMPUTE_32F_FAST_16BF = 5 => Some(ComputeType::F32FastBf16),
        HIPBLAS_COMPUTE_32F_FAST_TF32 = 6 => Some(ComputeType::F32FastTf32),
        HIPBLAS_COMPUTE_64F = 7 => Some(ComputeType::F64),
        HIPBLAS_COMPUTE_64F_PEDANTIC = 8 => Some(ComputeType::F64),
        HIPBLAS_COMPUTE_32I = 9 => Some(ComputeType::I32),
        HIPBLAS_COMPUTE_32I_PEDANTIC = 10 => Some(ComputeType::I32),
        HIPBLAS_COMPUTE_32F_FAST_8F_FNUZ = 100 => None; VersionRange::since(7, 0, 0),
        HIPBLAS_COMPUTE_32F_FAST_8BF_FNUZ = 101 => None; VersionRange::since(7, 0, 0),
        HIPBLAS_COMPUTE_32F_FAST_8F8BF_FNUZ = 102 => None; VersionRange::since(7, 0, 0),
        HIPBLAS_COMPUTE_32F_FAST_8BF8F_FNUZ = 103 => None; VersionRange::since(7, 0, 0),
    };
}

abi_table! {
    /// `hipblasDatatype_t`: types and compute type of the legacy `hipblasGemmEx` (hipBLAS 2.x,
    /// ROCm 6.x). Removed in hipBLAS 3.0.
    pub const HIPBLAS_DATATYPE: [i32 => Option<Format>] = {
        enum: "hipblasDatatype_t", library: HipBlas, header: "hipblas/hipblas.h";
        HIPBLAS_R_16F = 150 => Some(Format::F16); VersionRange::until(3, 0, 0),
        HIPBLAS_R_32F = 151 => Some(Format::F32); VersionRange::until(3, 0, 0),
        HIPBLAS_R_64F = 152 => None; VersionRange::until(3, 0, 0),
        HIPBLAS_C_16F = 153 => None; VersionRange::until(3, 0, 0),
        HIPBLAS_C_32F = 154 => None; VersionRange::until(3, 0, 0),
        HIPBLAS_C_64F = 155 => None; VersionRange::until(3, 0, 0),
        HIPBLAS_R_8I = 160 => Some(Format::Int8); VersionRange::until(3, 0, 0),
        HIPBLAS_R_8U = 161 => None; VersionRange::until(3, 0, 0),
        HIPBLAS_R_32I = 162 => Some(Format::I32); VersionRange::until(3, 0, 0),
        HIPBLAS_R_32U = 163 => None; VersionRange::until(3, 0, 0),
        HIPBLAS_C_8I = 164 => None; VersionRange::until(3, 0, 0),
        HIPBLAS_C_8U = 165 => None; VersionRange::until(3, 0, 0),
        HIPBLAS_C_32I = 166 => None; VersionRange::until(3, 0, 0),
        HIPBLAS_C_32U = 167 => None; VersionRange::until(3, 0, 0),
        HIPBLAS_R_16B = 168 => Some(Format::Bf16); VersionRange::until(3, 0, 0),
        HIPBLAS_C_16B = 169 => None; VersionRange::until(3, 0, 0),
        HIPBLAS_DATATYPE_INVALID = 255 => None; VersionRange::until(3, 0, 0),
    };
}

/// Which argument types a `hipblasGemmEx`-family call uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemmExAbi {
    /// hipBLAS 2.x `hipblasGemmEx`: `hipblasDatatype_t` for A/B/C and the compute type.
    LegacyDatatype,
    /// `hipblasGemmEx_v2` (hipBLAS 2.x) and `hipblasGemmEx` (hipBLAS >= 3.0): `hipDataType`
    /// for A/B/C and `hipblasComputeType_t`.
    V2,
}

/// The ABI of a call through `hipblasGemmEx` (`is_v2_symbol = false`) or one of the `_v2`
/// symbols, given the hipBLAS version when known. With no version, the A type's value decides.
pub fn gemm_ex_abi(is_v2_symbol: bool, hipblas_version: Option<LibVersion>, a_type: i32) -> GemmExAbi {
    if is_v2_symbol {
        return GemmExAbi::V2;
    }
    match hipblas_version {
        Some(v) if v >= LibVersion::new(3, 0, 0) => GemmExAbi::V2,
        Some(_) => GemmExAbi::LegacyDatatype,
        None => gemm_ex_abi_from_type(a_type),
    }
}

/// Classifies a `hipblasGemmEx` type argument by value (the ABIs' value sets are disjoint).
pub fn gemm_ex_abi_from_type(type_value: i32) -> GemmExAbi {
    if (HIPBLAS_R_16F..=HIPBLAS_DATATYPE_INVALID).contains(&type_value) {
        GemmExAbi::LegacyDatatype
    } else {
        GemmExAbi::V2
    }
}

/// Element format of a `hipblasGemmEx` A/B/C type under `abi`.
pub fn format_from_gemm_ex_type(abi: GemmExAbi, value: i32) -> Option<Format> {
    match abi {
        GemmExAbi::LegacyDatatype => lookup_any(HIPBLAS_DATATYPE, value as i64).and_then(|e| e.meaning),
        GemmExAbi::V2 => super::data_type::format_from_hip_data_type(value),
    }
}

/// Compute type of a `hipblasGemmEx` call under `abi` (legacy calls pass a `hipblasDatatype_t`).
pub fn compute_type_from_gemm_ex(abi: GemmExAbi, value: i32) -> Option<ComputeType> {
    match abi {
        GemmExAbi::LegacyDatatype => match value {
            HIPBLAS_R_16F => Some(ComputeType::F16),
            HIPBLAS_R_32F => Some(ComputeType::F32),
            HIPBLAS_R_64F => Some(ComputeType::F64),
            HIPBLAS_R_32I => Some(ComputeType::I32),
            _ => None,
        },
        GemmExAbi::V2 => compute_type_from_hipblas(value),
    }
}

/// `hipblasOperation_t` -> `Transpose` (`HIPBLAS_OP_C` is the transpose for real data).
pub fn transpose_from_hipblas_operation(value: i32) -> Option<Transpose> {
    lookup_any(HIPBLAS_OPERATION, value as i64).and_then(|e| e.meaning)
}

/// `hipblasComputeType_t` -> `ComputeType`; `None` for the FP8 "fast" types and unknown values.
pub fn compute_type_from_hipblas(value: i32) -> Option<ComputeType> {
    lookup_any(HIPBLAS_COMPUTE_TYPE, value as i64).and_then(|e| e.meaning)
}

/// Name of a `hipblasComputeType_t` value for logs and skip reasons.
pub fn hipblas_compute_type_name(value: i32) -> &'static str {
    lookup_any(HIPBLAS_COMPUTE_TYPE, value as i64).map_or("<unknown hipblasComputeType_t>", |e| e.abi.name)
}

/// Name of a legacy `hipblasDatatype_t` value for logs and skip reasons.
pub fn hipblas_datatype_name(value: i32) -> &'static str {
    lookup_any(HIPBLAS_DATATYPE, value as i64).map_or("<unknown hipblasDatatype_t>", |e| e.abi.name)
}

const _: () = {
    // The legacy datatype range must not overlap hipDataType or hipblasComputeType_t values,
    // which is what makes classification by value sound.
    assert!(super::data_type::HIP_R_4F_E2M1 < HIPBLAS_R_16F);
    assert!(HIPBLAS_COMPUTE_32F_FAST_8BF8F_FNUZ < HIPBLAS_R_16F);
    assert!(super::data_type::HIP_R_8F_E4M3_FNUZ > HIPBLAS_DATATYPE_INVALID);
    // hipBLAS and rocBLAS share the CBLAS-style operation numbering.
    assert!(HIPBLAS_OP_N == super::rocblas::rocblas_operation_none);
    assert!(HIPBLAS_OP_T == super::rocblas::rocblas_operation_transpose);
    assert!(HIPBLAS_OP_C == super::rocblas::rocblas_operation_conjugate_transpose);
};
