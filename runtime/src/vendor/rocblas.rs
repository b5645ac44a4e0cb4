//! rocBLAS (`rocblas/internal/rocblas-types.h`) enums used by `rocblas_gemm_ex` (which has
//! separate C and D matrices) and its strided-batched form.
//!
//! Source: `ROCm/rocm-libraries` `projects/rocblas/library/include/internal/rocblas-types.h`
//! (development header, 2016-2025 copyright). The datatype and operation numbering is CBLAS
//! style and unchanged since long before ROCm 6; `rocblas_gemm_flags_stochastic_rounding` was
//! only seen in the development header and is dated to rocBLAS 5.0 (ROCm 7.0), not pinned.
//! `rocblas_gemm_ex` takes no FP8 types: FP8 lives in the separate `rocblas_gemm_ex3` API.

use super::{abi_table, lookup_any, VersionRange};
use crate::formats::Format;
use crate::problem::{ComputeType, Transpose};

abi_table! {
    /// `rocblas_status` values an interposer returns or tests.
    pub const ROCBLAS_STATUS: [i32 => ()] = {
        enum: "rocblas_status", library: RocBlas, header: "rocblas/internal/rocblas-types.h";
        rocblas_status_success = 0,
        rocblas_status_invalid_handle = 1,
        rocblas_status_not_implemented = 2,
        rocblas_status_invalid_pointer = 3,
        rocblas_status_invalid_size = 4,
        rocblas_status_memory_error = 5,
        rocblas_status_internal_error = 6,
        rocblas_status_invalid_value = 11,
    };
}

abi_table! {
    /// `rocblas_operation`.
    pub const ROCBLAS_OPERATION: [i32 => Option<Transpose>] = {
        enum: "rocblas_operation", library: RocBlas, header: "rocblas/internal/rocblas-types.h";
        rocblas_operation_none = 111 => Some(Transpose::N),
        rocblas_operation_transpose = 112 => Some(Transpose::T),
        /// The transpose for real data.
        rocblas_operation_conjugate_transpose = 113 => Some(Transpose::T),
    };
}

abi_table! {
    /// `rocblas_datatype`: `rocblas_gemm_ex` a/b/c/d types and compute type.
    pub const ROCBLAS_DATATYPE: [i32 => Option<Format>] = {
        enum: "rocblas_datatype", library: RocBlas, header: "rocblas/internal/rocblas-types.h";
        rocblas_datatype_f16_r = 150 => Some(Format::F16),
        rocblas_datatype_f32_r = 151 => Some(Format::F32),
        rocblas_datatype_f64_r = 152 => None,
        rocblas_datatype_f16_c = 153 => None,
        rocblas_datatype_f32_c = 154 => None,
        rocblas_datatype_f64_c = 155 => None,
        rocblas_datatype_i8_r = 160 => Some(Format::Int8),
        rocblas_datatype_u8_r = 161 => None,
        rocblas_datatype_i32_r = 162 => Some(Format::I32),
        rocblas_datatype_u32_r = 163 => None,
        rocblas_datatype_i8_c = 164 => None,
        rocblas_datatype_u8_c = 165 => None,
        rocblas_datatype_i32_c = 166 => None,
        rocblas_datatype_u32_c = 167 => None,
        rocblas_datatype_bf16_r = 168 => Some(Format::Bf16),
        rocblas_datatype_bf16_c = 169 => None,
        /// `rocblas_f8`, only accepted by `rocblas_gemm_ex3`: rocBLAS's float8 is AMD's
        /// "NANOO" variant (gfx942, bias 8, 0x80 is NaN), i.e. E4M3 FNUZ. Not verified on an
        /// AMD host.
        rocblas_datatype_f8_r = 170 => Some(Format::E4m3fnuz),
        /// `rocblas_bf8`: E5M2 FNUZ (see `rocblas_datatype_f8_r`).
        rocblas_datatype_bf8_r = 171 => Some(Format::E5m2fnuz),
        rocblas_datatype_invalid = 255 => None,
    };
}

abi_table! {
    /// `rocblas_computetype`: the compute type of `rocblas_gemm_ex3`. The FP8 ones name the
    /// types A and B are converted to before the multiply (f8 = E4M3 FNUZ, bf8 = E5M2 FNUZ)
    /// and accumulate in f32; with A and B already of those types nothing is converted.
    pub const ROCBLAS_COMPUTETYPE: [i32 => Option<(Format, Format)>] = {
        enum: "rocblas_computetype", library: RocBlas, header: "rocblas/internal/rocblas-types.h";
        /// f32 accumulation, inputs used as given: the (A, B) pair is irrelevant.
        rocblas_compute_type_f32 = 300 => None,
        rocblas_compute_type_f8_f8_f32 = 301 => Some((Format::E4m3fnuz, Format::E4m3fnuz)),
        rocblas_compute_type_f8_bf8_f32 = 302 => Some((Format::E4m3fnuz, Format::E5m2fnuz)),
        rocblas_compute_type_bf8_f8_f32 = 303 => Some((Format::E5m2fnuz, Format::E4m3fnuz)),
        rocblas_compute_type_bf8_bf8_f32 = 304 => Some((Format::E5m2fnuz, Format::E5m2fnuz)),
        rocblas_compute_type_invalid = 455 => None,
    };
}

abi_table! {
    /// `rocblas_pointer_mode` (`rocblas_get_pointer_mode` for alpha/beta).
    pub const ROCBLAS_POINTER_MODE: [i32 => ()] = {
        enum: "rocblas_pointer_mode", library: RocBlas, header: "rocblas/internal/rocblas-types.h";
        rocblas_pointer_mode_host = 0,
        rocblas_pointer_mode_device = 1,
    };
}

abi_table! {
    /// `rocblas_gemm_algo`.
    pub const ROCBLAS_GEMM_ALGO: [i32 => ()] = {
        enum: "rocblas_gemm_algo", library: RocBlas, header: "rocblas/internal/rocblas-types.h";
        rocblas_gemm_algo_standard = 0x0,
        rocblas_gemm_algo_solution_index = 0x1,
    };
}

abi_table! {
    /// `rocblas_gemm_flags` (a bit set). The FP16 alternate implementations (BF16 instructions,
    /// subnormals flushed) and stochastic rounding change D and are not modeled.
    pub const ROCBLAS_GEMM_FLAGS: [u32 => ()] = {
        enum: "rocblas_gemm_flags", library: RocBlas, header: "rocblas/internal/rocblas-types.h";
        rocblas_gemm_flags_none = 0x0,
        rocblas_gemm_flags_use_cu_efficiency = 0x2,
        rocblas_gemm_flags_fp16_alt_impl = 0x4,
        rocblas_gemm_flags_check_solution_index = 0x8,
        rocblas_gemm_flags_fp16_alt_impl_rnz = 0x10,
        rocblas_gemm_flags_stochastic_rounding = 0x20; VersionRange::since(5, 0, 0),
    };
}

/// `rocblas_operation` -> `Transpose`.
pub fn transpose_from_rocblas_operation(value: i32) -> Option<Transpose> {
    lookup_any(ROCBLAS_OPERATION, value as i64).and_then(|e| e.meaning)
}

/// `rocblas_datatype` -> element format; `None` for complex, f64, unsigned and unknown values.
pub fn format_from_rocblas_datatype(value: i32) -> Option<Format> {
    lookup_any(ROCBLAS_DATATYPE, value as i64).and_then(|e| e.meaning)
}

/// Compute type of a `rocblas_gemm_ex` call (a `rocblas_datatype`): alpha and beta have this
/// type too. `None` for types that are not compute types quantshadow models.
#[allow(non_upper_case_globals)]
pub fn compute_type_from_rocblas_datatype(value: i32) -> Option<ComputeType> {
    match value {
        rocblas_datatype_f16_r => Some(ComputeType::F16),
        rocblas_datatype_f32_r => Some(ComputeType::F32),
        rocblas_datatype_f64_r => Some(ComputeType::F64),
        rocblas_datatype_i32_r => Some(ComputeType::I32),
        _ => None,
    }
}

/// What a `rocblas_computetype` means for A and B: `Ok(None)` for f32 compute on the inputs as
/// given, `Ok(Some((a, b)))` for the FP8 compute types (the formats A and B are multiplied in),
/// `Err(())` for invalid or unknown values.
#[allow(clippy::result_unit_err)]
pub fn rocblas_computetype_inputs(value: i32) -> Result<Option<(Format, Format)>, ()> {
    match lookup_any(ROCBLAS_COMPUTETYPE, value as i64) {
        Some(e) if value != rocblas_compute_type_invalid => Ok(e.meaning),
        _ => Err(()),
    }
}

/// Name of a `rocblas_computetype` value for logs and skip reasons.
pub fn rocblas_computetype_name(value: i32) -> &'static str {
    lookup_any(ROCBLAS_COMPUTETYPE, value as i64).map_or("<unknown rocblas_computetype>", |e| e.abi.name)
}

/// Name of a `rocblas_datatype` value for logs and skip reasons.
pub fn rocblas_datatype_name(value: i32) -> &'static str {
    lookup_any(ROCBLAS_DATATYPE, value as i64).map_or("<unknown rocblas_datatype>", |e| e.abi.name)
}

/// The first flag set in `flags` that changes D in a way the problem model cannot describe
/// (named for the skip reason), or `None` if all set flags are harmless.
pub fn unmodeled_gemm_flag(flags: u32) -> Option<&'static str> {
    [
        (rocblas_gemm_flags_fp16_alt_impl, "rocblas_gemm_flags_fp16_alt_impl"),
        (rocblas_gemm_flags_fp16_alt_impl_rnz, "rocblas_gemm_flags_fp16_alt_impl_rnz"),
        (rocblas_gemm_flags_stochastic_rounding, "rocblas_gemm_flags_stochastic_rounding"),
    ]
    .into_iter()
    .find(|(bit, _)| flags & bit != 0)
    .map(|(_, name)| name)
}

const _: () = {
    // rocBLAS and legacy hipBLAS datatypes share their numbering (hipBLAS forwarded them).
    assert!(rocblas_datatype_f16_r == super::hipblas::HIPBLAS_R_16F);
    assert!(rocblas_datatype_f32_r == super::hipblas::HIPBLAS_R_32F);
    assert!(rocblas_datatype_i8_r == super::hipblas::HIPBLAS_R_8I);
    assert!(rocblas_datatype_i32_r == super::hipblas::HIPBLAS_R_32I);
    assert!(rocblas_datatype_bf16_r == super::hipblas::HIPBLAS_R_16B);
    assert!(rocblas_datatype_invalid == super::hipblas::HIPBLAS_DATATYPE_INVALID);
};
