//! `cudaDataType_t` (CUDA `library_types.h`) and `hipDataType` (HIP `hip/library_types.h`):
//! the element types of cuBLAS/cuBLASLt/hipBLASLt/hipBLAS(v2) matrices and scales.
//!
//! Sources: CUDA 13.0.88 `include/library_types.h` (H200 host); cuBLAS 12.8 bindgen output
//! (`cudarc` `sys_12080.rs`, which already has UE8M0/FP6/FP4); hipDataType per ROCm release
//! from bindgen output of ROCm 6.0.2 ... 7.2.3 headers: the OCP FP8 values 28/29 first appear
//! in ROCm 6.3, UE8M0/FP6/FP4 (30-33) in ROCm 7.0, the FNUZ values 1000/1001 in every release.
//!
//! FP8 variants: `HIP_R_8F_E4M3`/`HIP_R_8F_E5M2` (28/29) are the OCP formats (gfx950, NVIDIA);
//! `HIP_R_8F_E4M3_FNUZ`/`HIP_R_8F_E5M2_FNUZ` (1000/1001) are gfx942's (MI300). Reading one as
//! the other is exactly the 2x magnitude bug class quantshadow exists for, so the mapping never
//! folds them together.

use super::{abi_table, VersionRange};
use crate::formats::Format;

abi_table! {
    /// `cudaDataType_t`: every value, so unsupported ones can be named in skip reasons.
    pub const CUDA_DATA_TYPE: [i32 => ()] = {
        enum: "cudaDataType_t", library: CudaToolkit, header: "library_types.h";
        CUDA_R_16F = 2,
        CUDA_C_16F = 6,
        CUDA_R_16BF = 14,
        CUDA_C_16BF = 15,
        CUDA_R_32F = 0,
        CUDA_C_32F = 4,
        CUDA_R_64F = 1,
        CUDA_C_64F = 5,
        CUDA_R_4I = 16,
        CUDA_C_4I = 17,
        CUDA_R_4U = 18,
        CUDA_C_4U = 19,
        CUDA_R_8I = 3,
        CUDA_C_8I = 7,
        CUDA_R_8U = 8,
        CUDA_C_8U = 9,
        CUDA_R_16I = 20,
        CUDA_C_16I = 21,
        CUDA_R_16U = 22,
        CUDA_C_16U = 23,
        CUDA_R_32I = 10,
        CUDA_C_32I = 11,
        CUDA_R_32U = 12,
        CUDA_C_32U = 13,
        CUDA_R_64I = 24,
        CUDA_C_64I = 25,
        CUDA_R_64U = 26,
        CUDA_C_64U = 27,
        /// OCP E4M3 ("fn").
        CUDA_R_8F_E4M3 = 28,
        /// Alias of `CUDA_R_8F_E4M3` (same value) used for NVFP4 block scales; the sign bit is
        /// ignored. First seen in the 12.8 header.
        CUDA_R_8F_UE4M3 = 28; VersionRange::since(12, 8, 0),
        CUDA_R_8F_E5M2 = 29,
        /// Exponent-only MX scale (OCP E8M0). Introduced with CUDA 12.8.
        CUDA_R_8F_UE8M0 = 30; VersionRange::since(12, 8, 0),
        CUDA_R_6F_E2M3 = 31; VersionRange::since(12, 8, 0),
        CUDA_R_6F_E3M2 = 32; VersionRange::since(12, 8, 0),
        /// OCP FP4, two per byte.
        CUDA_R_4F_E2M1 = 33; VersionRange::since(12, 8, 0),
    };
}

abi_table! {
    /// `hipDataType`: every value of the releases read, FNUZ included.
    pub const HIP_DATA_TYPE: [i32 => ()] = {
        enum: "hipDataType", library: Hip, header: "hip/library_types.h";
        HIP_R_32F = 0,
        HIP_R_64F = 1,
        HIP_R_16F = 2,
        HIP_R_8I = 3,
        HIP_C_32F = 4,
        HIP_C_64F = 5,
        HIP_C_16F = 6,
        HIP_C_8I = 7,
        HIP_R_8U = 8,
        HIP_C_8U = 9,
        HIP_R_32I = 10,
        HIP_C_32I = 11,
        HIP_R_32U = 12,
        HIP_C_32U = 13,
        HIP_R_16BF = 14,
        HIP_C_16BF = 15,
        HIP_R_4I = 16,
        HIP_C_4I = 17,
        HIP_R_4U = 18,
        HIP_C_4U = 19,
        HIP_R_16I = 20,
        HIP_C_16I = 21,
        HIP_R_16U = 22,
        HIP_C_16U = 23,
        HIP_R_64I = 24,
        HIP_C_64I = 25,
        HIP_R_64U = 26,
        HIP_C_64U = 27,
        /// OCP E4M3 ("fn", gfx950). First seen in the ROCm 6.3 headers (absent in 6.2).
        HIP_R_8F_E4M3 = 28; VersionRange::since(6, 3, 0),
        /// OCP E5M2 (gfx950). First seen in the ROCm 6.3 headers.
        HIP_R_8F_E5M2 = 29; VersionRange::since(6, 3, 0),
        HIP_R_8F_UE8M0 = 30; VersionRange::since(7, 0, 0),
        HIP_R_6F_E2M3 = 31; VersionRange::since(7, 0, 0),
        HIP_R_6F_E3M2 = 32; VersionRange::since(7, 0, 0),
        HIP_R_4F_E2M1 = 33; VersionRange::since(7, 0, 0),
        /// gfx942 E4M3 FNUZ: bias 8, max 240, 0x80 is NaN.
        HIP_R_8F_E4M3_FNUZ = 1000,
        /// gfx942 E5M2 FNUZ: bias 16, 0x80 is NaN.
        HIP_R_8F_E5M2_FNUZ = 1001,
    };
}

// HIP mirrors CUDA's numbering for the types both have: two independent transcriptions agree.
const _: () = {
    assert!(HIP_R_32F == CUDA_R_32F && HIP_R_64F == CUDA_R_64F && HIP_R_16F == CUDA_R_16F);
    assert!(HIP_R_8I == CUDA_R_8I && HIP_R_8U == CUDA_R_8U && HIP_R_32I == CUDA_R_32I);
    assert!(HIP_R_16BF == CUDA_R_16BF && HIP_C_32F == CUDA_C_32F && HIP_C_64U == CUDA_C_64U);
    assert!(HIP_R_8F_E4M3 == CUDA_R_8F_E4M3 && HIP_R_8F_E5M2 == CUDA_R_8F_E5M2);
    assert!(HIP_R_8F_UE8M0 == CUDA_R_8F_UE8M0 && HIP_R_4F_E2M1 == CUDA_R_4F_E2M1);
    assert!(HIP_R_6F_E2M3 == CUDA_R_6F_E2M3 && HIP_R_6F_E3M2 == CUDA_R_6F_E3M2);
    // library_types.h: `CUDA_R_8F_UE4M3 = CUDA_R_8F_E4M3`.
    assert!(CUDA_R_8F_UE4M3 == CUDA_R_8F_E4M3);
};

/// Element format of a `cudaDataType_t` used for a matrix (A, B, C, D, bias). `None` for types
/// quantshadow cannot decode (complex, f64, unsigned, FP6, CUDA_R_4I whose packing is
/// undocumented for GEMMs). Value 28 is E4M3 as an element type; as a VEC16 block scale the
/// same bytes are UE4M3, which the scale mode decides, not the data type.
pub fn format_from_cuda_data_type(value: i32) -> Option<Format> {
    match value {
        CUDA_R_32F => Some(Format::F32),
        CUDA_R_16F => Some(Format::F16),
        CUDA_R_16BF => Some(Format::Bf16),
        CUDA_R_8I => Some(Format::Int8),
        CUDA_R_32I => Some(Format::I32),
        CUDA_R_8F_E4M3 => Some(Format::E4m3fn),
        CUDA_R_8F_E5M2 => Some(Format::E5m2),
        CUDA_R_8F_UE8M0 => Some(Format::Ue8m0),
        CUDA_R_4F_E2M1 => Some(Format::E2m1),
        _ => None,
    }
}

/// Element format of a `hipDataType`. OCP FP8 (28/29) and FNUZ FP8 (1000/1001) stay distinct.
pub fn format_from_hip_data_type(value: i32) -> Option<Format> {
    match value {
        HIP_R_32F => Some(Format::F32),
        HIP_R_16F => Some(Format::F16),
        HIP_R_16BF => Some(Format::Bf16),
        HIP_R_8I => Some(Format::Int8),
        HIP_R_32I => Some(Format::I32),
        HIP_R_8F_E4M3 => Some(Format::E4m3fn),
        HIP_R_8F_E5M2 => Some(Format::E5m2),
        HIP_R_8F_E4M3_FNUZ => Some(Format::E4m3fnuz),
        HIP_R_8F_E5M2_FNUZ => Some(Format::E5m2fnuz),
        HIP_R_8F_UE8M0 => Some(Format::Ue8m0),
        HIP_R_4F_E2M1 => Some(Format::E2m1),
        _ => None,
    }
}

/// The `cudaDataType_t` that stores `format`, for building calls (fixtures, self-tests).
/// `Ue4m3` shares 28 with E4M3 (`CUDA_R_8F_UE4M3`); FNUZ formats and int4 have none.
pub fn cuda_data_type_for_format(format: Format) -> Option<i32> {
    match format {
        Format::F32 => Some(CUDA_R_32F),
        Format::F16 => Some(CUDA_R_16F),
        Format::Bf16 => Some(CUDA_R_16BF),
        Format::Int8 => Some(CUDA_R_8I),
        Format::I32 => Some(CUDA_R_32I),
        Format::E4m3fn => Some(CUDA_R_8F_E4M3),
        Format::Ue4m3 => Some(CUDA_R_8F_UE4M3),
        Format::E5m2 => Some(CUDA_R_8F_E5M2),
        Format::Ue8m0 => Some(CUDA_R_8F_UE8M0),
        Format::E2m1 => Some(CUDA_R_4F_E2M1),
        Format::E4m3fnuz | Format::E5m2fnuz | Format::Int4 => None,
    }
}

/// The `hipDataType` that stores `format`. `Ue4m3` has no hipDataType of its own.
pub fn hip_data_type_for_format(format: Format) -> Option<i32> {
    match format {
        Format::F32 => Some(HIP_R_32F),
        Format::F16 => Some(HIP_R_16F),
        Format::Bf16 => Some(HIP_R_16BF),
        Format::Int8 => Some(HIP_R_8I),
        Format::I32 => Some(HIP_R_32I),
        Format::E4m3fn => Some(HIP_R_8F_E4M3),
        Format::E5m2 => Some(HIP_R_8F_E5M2),
        Format::E4m3fnuz => Some(HIP_R_8F_E4M3_FNUZ),
        Format::E5m2fnuz => Some(HIP_R_8F_E5M2_FNUZ),
        Format::Ue8m0 => Some(HIP_R_8F_UE8M0),
        Format::E2m1 => Some(HIP_R_4F_E2M1),
        Format::Ue4m3 | Format::Int4 => None,
    }
}

/// Name of a `cudaDataType_t` value for logs and skip reasons (28 reads as `CUDA_R_8F_E4M3`).
pub fn cuda_data_type_name(value: i32) -> &'static str {
    super::lookup_any(CUDA_DATA_TYPE, value as i64).map_or("<unknown cudaDataType_t>", |e| e.abi.name)
}

/// Name of a `hipDataType` value for logs and skip reasons.
pub fn hip_data_type_name(value: i32) -> &'static str {
    super::lookup_any(HIP_DATA_TYPE, value as i64).map_or("<unknown hipDataType>", |e| e.abi.name)
}
