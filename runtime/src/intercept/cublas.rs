//! cuBLAS classic GEMM entry points (`cublasGemmEx`, `cublasSgemm_v2`, `cublasHgemm`, their
//! strided-batched, pointer-array batched and `_64` forms) decoded from their arguments.
//!
//! cuBLAS is column-major and C is D: the call goes through [`common::decode_classic`] (the
//! transpose identity is proved there). Stream, pointer mode and math mode come from the handle
//! (`cublasGetStream_v2`, `cublasGetPointerMode_v2`, `cublasGetMathMode`).

use super::common::{
    classic_entry, ClassicCall, HandleQueries, RawClassic, RawOperand, ScalarKind, Variant, VendorHandle,
};
use super::Skip;
use crate::formats::Format;
use crate::problem::ComputeType;
use crate::vendor::cublas::{
    compute_type_from_cublas, cublas_compute_type_name, sgemm_compute_type_for_math_mode,
    transpose_from_cublas_operation, CUBLAS_COMPUTE_32F,
};
use crate::vendor::data_type::{cuda_data_type_name, format_from_cuda_data_type, CUDA_R_16F, CUDA_R_32F};
use std::ffi::c_void;

/// The real cublas handle getters.
pub static CUBLAS_HANDLE: VendorHandle = VendorHandle::new(
    "cublas",
    c"cublasGetStream_v2",
    c"cublasGetPointerMode_v2",
    Some(c"cublasGetMathMode"),
);

/// Maps a raw cuBLAS call: types, transposes, compute (math mode applies to CUBLAS_COMPUTE_32F
/// with f32 inputs and to Sgemm) and the alpha/beta type (the compute type's).
pub fn resolve(raw: &RawClassic, q: &dyn HandleQueries) -> Result<ClassicCall, Skip> {
    let v = "cublas";
    let trans = |t: i32| {
        transpose_from_cublas_operation(t).ok_or_else(|| Skip::new("cublas: unsupported cublasOperation_t"))
    };
    let trans = (trans(raw.trans_a)?, trans(raw.trans_b)?);
    let fmt = |ty: i32| {
        format_from_cuda_data_type(ty)
            .ok_or_else(|| Skip::new(format!("{v}: data type {} not supported", cuda_data_type_name(ty))))
    };
    let math = |compute: ComputeType| -> Result<ComputeType, Skip> {
        match q.math_mode(raw.handle) {
            None => Ok(compute),
            Some(mode) => sgemm_compute_type_for_math_mode(mode)
                .ok_or_else(|| Skip::new("cublas: math mode not supported")),
        }
    };
    let formats = [fmt(raw.a.ty)?, fmt(raw.b.ty)?, fmt(raw.c.ty)?, fmt(raw.d.ty)?];
    let compute = match raw.variant {
        Variant::CublasSgemm => math(ComputeType::F32)?,
        Variant::CublasHgemm => ComputeType::F16,
        _ => {
            let c = compute_type_from_cublas(raw.compute).ok_or_else(|| {
                Skip::new(format!(
                    "{v}: compute type {} not supported",
                    cublas_compute_type_name(raw.compute)
                ))
            })?;
            if raw.compute == CUBLAS_COMPUTE_32F && formats[0] == Format::F32 && formats[1] == Format::F32 {
                math(c)?
            } else {
                c
            }
        }
    };
    Ok(raw.with(v, trans, formats, compute, ScalarKind::for_compute(compute)))
}

fn op(ptr: *const c_void, ty: i32, ld: i64, stride: i64) -> RawOperand {
    RawOperand { ptr: ptr as u64, ty, ld, stride }
}

#[allow(clippy::too_many_arguments)]
fn raw(
    variant: Variant,
    handle: *mut c_void,
    trans: (i32, i32),
    mnk: (i64, i64, i64),
    batch: i64,
    a: RawOperand,
    b: RawOperand,
    c: RawOperand,
    scalars: (*const c_void, *const c_void),
    compute: i32,
    arrays: bool,
) -> RawClassic {
    RawClassic {
        variant,
        handle,
        trans_a: trans.0,
        trans_b: trans.1,
        m: mnk.0,
        n: mnk.1,
        k: mnk.2,
        batch,
        a,
        b,
        c,
        d: c,
        alpha: scalars.0,
        beta: scalars.1,
        compute,
        flags: 0,
        arrays,
    }
}

const EX: Variant = Variant::CublasEx;
const S: Variant = Variant::CublasSgemm;
const H: Variant = Variant::CublasHgemm;
const F32: i32 = CUDA_R_32F;
const F16: i32 = CUDA_R_16F;

classic_entry!(cublasGemmEx, gemm_ex, resolve, CUBLAS_HANDLE, |s| raw(
    EX,
    s.handle,
    (s.trans_a, s.trans_b),
    (s.m as i64, s.n as i64, s.k as i64),
    1,
    op(s.a, s.a_type, s.lda as i64, 0),
    op(s.b, s.b_type, s.ldb as i64, 0),
    op(s.c, s.c_type, s.ldc as i64, 0),
    (s.alpha, s.beta),
    s.compute,
    false
));
classic_entry!(cublasGemmEx_64, gemm_ex_64, resolve, CUBLAS_HANDLE, |s| raw(
    EX,
    s.handle,
    (s.trans_a, s.trans_b),
    (s.m, s.n, s.k),
    1,
    op(s.a, s.a_type, s.lda, 0),
    op(s.b, s.b_type, s.ldb, 0),
    op(s.c, s.c_type, s.ldc, 0),
    (s.alpha, s.beta),
    s.compute,
    false
));
classic_entry!(cublasGemmStridedBatchedEx, gemm_strided_batched_ex, resolve, CUBLAS_HANDLE, |s| raw(
    EX,
    s.handle,
    (s.trans_a, s.trans_b),
    (s.m as i64, s.n as i64, s.k as i64),
    s.batch as i64,
    op(s.a, s.a_type, s.lda as i64, s.stride_a),
    op(s.b, s.b_type, s.ldb as i64, s.stride_b),
    op(s.c, s.c_type, s.ldc as i64, s.stride_c),
    (s.alpha, s.beta),
    s.compute,
    false
));
classic_entry!(cublasGemmStridedBatchedEx_64, gemm_strided_batched_ex_64, resolve, CUBLAS_HANDLE, |s| raw(
    EX,
    s.handle,
    (s.trans_a, s.trans_b),
    (s.m, s.n, s.k),
    s.batch,
    op(s.a, s.a_type, s.lda, s.stride_a),
    op(s.b, s.b_type, s.ldb, s.stride_b),
    op(s.c, s.c_type, s.ldc, s.stride_c),
    (s.alpha, s.beta),
    s.compute,
    false
));
classic_entry!(cublasGemmBatchedEx, gemm_batched_ex, resolve, CUBLAS_HANDLE, |s| raw(
    EX,
    s.handle,
    (s.trans_a, s.trans_b),
    (s.m as i64, s.n as i64, s.k as i64),
    s.batch as i64,
    op(s.a_array as *const c_void, s.a_type, s.lda as i64, 0),
    op(s.b_array as *const c_void, s.b_type, s.ldb as i64, 0),
    op(s.c_array as *const c_void, s.c_type, s.ldc as i64, 0),
    (s.alpha, s.beta),
    s.compute,
    true
));
classic_entry!(cublasGemmBatchedEx_64, gemm_batched_ex_64, resolve, CUBLAS_HANDLE, |s| raw(
    EX,
    s.handle,
    (s.trans_a, s.trans_b),
    (s.m, s.n, s.k),
    s.batch,
    op(s.a_array as *const c_void, s.a_type, s.lda, 0),
    op(s.b_array as *const c_void, s.b_type, s.ldb, 0),
    op(s.c_array as *const c_void, s.c_type, s.ldc, 0),
    (s.alpha, s.beta),
    s.compute,
    true
));
classic_entry!(cublasSgemm_v2, sgemm, resolve, CUBLAS_HANDLE, |s| raw(
    S,
    s.handle,
    (s.trans_a, s.trans_b),
    (s.m as i64, s.n as i64, s.k as i64),
    1,
    op(s.a as _, F32, s.lda as i64, 0),
    op(s.b as _, F32, s.ldb as i64, 0),
    op(s.c as _, F32, s.ldc as i64, 0),
    (s.alpha as _, s.beta as _),
    0,
    false
));
classic_entry!(cublasSgemm_v2_64, sgemm_64, resolve, CUBLAS_HANDLE, |s| raw(
    S,
    s.handle,
    (s.trans_a, s.trans_b),
    (s.m, s.n, s.k),
    1,
    op(s.a as _, F32, s.lda, 0),
    op(s.b as _, F32, s.ldb, 0),
    op(s.c as _, F32, s.ldc, 0),
    (s.alpha as _, s.beta as _),
    0,
    false
));
classic_entry!(cublasHgemm, hgemm, resolve, CUBLAS_HANDLE, |s| raw(
    H,
    s.handle,
    (s.trans_a, s.trans_b),
    (s.m as i64, s.n as i64, s.k as i64),
    1,
    op(s.a as _, F16, s.lda as i64, 0),
    op(s.b as _, F16, s.ldb as i64, 0),
    op(s.c as _, F16, s.ldc as i64, 0),
    (s.alpha as _, s.beta as _),
    0,
    false
));
classic_entry!(cublasHgemm_64, hgemm_64, resolve, CUBLAS_HANDLE, |s| raw(
    H,
    s.handle,
    (s.trans_a, s.trans_b),
    (s.m, s.n, s.k),
    1,
    op(s.a as _, F16, s.lda, 0),
    op(s.b as _, F16, s.ldb, 0),
    op(s.c as _, F16, s.ldc, 0),
    (s.alpha as _, s.beta as _),
    0,
    false
));
classic_entry!(cublasSgemmStridedBatched, sgemm_strided_batched, resolve, CUBLAS_HANDLE, |s| raw(
    S,
    s.handle,
    (s.trans_a, s.trans_b),
    (s.m as i64, s.n as i64, s.k as i64),
    s.batch as i64,
    op(s.a as _, F32, s.lda as i64, s.stride_a),
    op(s.b as _, F32, s.ldb as i64, s.stride_b),
    op(s.c as _, F32, s.ldc as i64, s.stride_c),
    (s.alpha as _, s.beta as _),
    0,
    false
));
classic_entry!(cublasSgemmStridedBatched_64, sgemm_strided_batched_64, resolve, CUBLAS_HANDLE, |s| raw(
    S,
    s.handle,
    (s.trans_a, s.trans_b),
    (s.m, s.n, s.k),
    s.batch,
    op(s.a as _, F32, s.lda, s.stride_a),
    op(s.b as _, F32, s.ldb, s.stride_b),
    op(s.c as _, F32, s.ldc, s.stride_c),
    (s.alpha as _, s.beta as _),
    0,
    false
));
classic_entry!(cublasHgemmStridedBatched, hgemm_strided_batched, resolve, CUBLAS_HANDLE, |s| raw(
    H,
    s.handle,
    (s.trans_a, s.trans_b),
    (s.m as i64, s.n as i64, s.k as i64),
    s.batch as i64,
    op(s.a as _, F16, s.lda as i64, s.stride_a),
    op(s.b as _, F16, s.ldb as i64, s.stride_b),
    op(s.c as _, F16, s.ldc as i64, s.stride_c),
    (s.alpha as _, s.beta as _),
    0,
    false
));
classic_entry!(cublasHgemmStridedBatched_64, hgemm_strided_batched_64, resolve, CUBLAS_HANDLE, |s| raw(
    H,
    s.handle,
    (s.trans_a, s.trans_b),
    (s.m, s.n, s.k),
    s.batch,
    op(s.a as _, F16, s.lda, s.stride_a),
    op(s.b as _, F16, s.ldb, s.stride_b),
    op(s.c as _, F16, s.ldc, s.stride_c),
    (s.alpha as _, s.beta as _),
    0,
    false
));

/// `cublasSetWorkspace_v2`: the workspace is remembered for the handle's later GEMMs (their scratch).
pub fn set_workspace(a: &super::hook::cublasSetWorkspace_v2::Args, real: &super::RealCall) -> i32 {
    CUBLAS_HANDLE.set_workspace_hook(a.handle, a.workspace, a.bytes, real)
}
