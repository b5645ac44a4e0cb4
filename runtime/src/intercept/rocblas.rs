//! rocBLAS classic GEMM entry points (`rocblas_gemm_ex`, `rocblas_gemm_strided_batched_ex`,
//! `rocblas_gemm_ex3`) decoded from their arguments.
//!
//! rocBLAS has a separate D (`D = alpha op(A) op(B) + beta C`, D may be C): both get their own
//! layout. Types and the `rocblas_gemm_ex` compute type are `rocblas_datatype`; `ex3` takes a
//! `rocblas_computetype` whose FP8 values convert A/B before the multiply unless they already
//! are of those types (only that case is decoded). Flags that change D (fp16 alternate
//! implementations, stochastic rounding) skip the call. Column-major: the transpose identity
//! of [`super::common`] applies.

use super::common::{
    classic_entry, ClassicCall, HandleQueries, RawClassic, RawOperand, ScalarKind, Variant, VendorHandle,
};
use super::Skip;
use crate::problem::ComputeType;
use crate::vendor::rocblas::{
    compute_type_from_rocblas_datatype, format_from_rocblas_datatype, rocblas_computetype_inputs,
    rocblas_computetype_name, rocblas_datatype_name, transpose_from_rocblas_operation, unmodeled_gemm_flag,
};
use std::ffi::c_void;

/// The real rocblas handle getters.
pub static ROCBLAS_HANDLE: VendorHandle =
    VendorHandle::new("rocblas", c"rocblas_get_stream", c"rocblas_get_pointer_mode", None);

/// Maps a raw rocBLAS call.
pub fn resolve(raw: &RawClassic, _q: &dyn HandleQueries) -> Result<ClassicCall, Skip> {
    let v = "rocblas";
    if let Some(flag) = unmodeled_gemm_flag(raw.flags) {
        return Err(Skip::new(format!("{v}: {flag} not modeled")));
    }
    let trans = |t: i32| {
        transpose_from_rocblas_operation(t).ok_or_else(|| Skip::new("rocblas: unsupported rocblas_operation"))
    };
    let fmt = |ty: i32| {
        format_from_rocblas_datatype(ty)
            .ok_or_else(|| Skip::new(format!("{v}: data type {} not supported", rocblas_datatype_name(ty))))
    };
    let formats = [fmt(raw.a.ty)?, fmt(raw.b.ty)?, fmt(raw.c.ty)?, fmt(raw.d.ty)?];
    let compute = match raw.variant {
        Variant::RocblasEx3 => match rocblas_computetype_inputs(raw.compute) {
            Ok(None) => ComputeType::F32,
            Ok(Some((fa, fb))) if (fa, fb) == (formats[0], formats[1]) => ComputeType::F32,
            Ok(Some(_)) => {
                return Err(Skip::new(format!(
                    "{v}: {} converting A/B before the multiply not modeled",
                    rocblas_computetype_name(raw.compute)
                )))
            }
            Err(()) => {
                return Err(Skip::new(format!(
                    "{v}: compute type {} not supported",
                    rocblas_computetype_name(raw.compute)
                )))
            }
        },
        _ => compute_type_from_rocblas_datatype(raw.compute).ok_or_else(|| {
            Skip::new(format!("{v}: compute type {} not supported", rocblas_datatype_name(raw.compute)))
        })?,
    };
    Ok(raw.with(
        v,
        (trans(raw.trans_a)?, trans(raw.trans_b)?),
        formats,
        compute,
        ScalarKind::for_compute(compute),
    ))
}

fn op(ptr: *const c_void, ty: i32, ld: i32, stride: i64) -> RawOperand {
    RawOperand { ptr: ptr as u64, ty, ld: ld as i64, stride }
}

macro_rules! rocblas_ex {
    ($sym:ident, $handler:ident, $variant:expr) => {
        classic_entry!($sym, $handler, resolve, ROCBLAS_HANDLE, |s| RawClassic {
            variant: $variant,
            handle: s.handle,
            trans_a: s.trans_a,
            trans_b: s.trans_b,
            m: s.m as i64,
            n: s.n as i64,
            k: s.k as i64,
            batch: 1,
            a: op(s.a, s.a_type, s.lda, 0),
            b: op(s.b, s.b_type, s.ldb, 0),
            c: op(s.c, s.c_type, s.ldc, 0),
            d: op(s.d, s.d_type, s.ldd, 0),
            alpha: s.alpha,
            beta: s.beta,
            compute: s.compute,
            flags: s.flags,
            arrays: false,
        });
    };
}

rocblas_ex!(rocblas_gemm_ex, gemm_ex, Variant::RocblasEx);
rocblas_ex!(rocblas_gemm_ex3, gemm_ex3, Variant::RocblasEx3);
classic_entry!(rocblas_gemm_strided_batched_ex, gemm_strided_batched_ex, resolve, ROCBLAS_HANDLE, |s| {
    RawClassic {
        variant: Variant::RocblasEx,
        handle: s.handle,
        trans_a: s.trans_a,
        trans_b: s.trans_b,
        m: s.m as i64,
        n: s.n as i64,
        k: s.k as i64,
        batch: s.batch as i64,
        a: op(s.a, s.a_type, s.lda, s.stride_a),
        b: op(s.b, s.b_type, s.ldb, s.stride_b),
        c: op(s.c, s.c_type, s.ldc, s.stride_c),
        d: op(s.d, s.d_type, s.ldd, s.stride_d),
        alpha: s.alpha,
        beta: s.beta,
        compute: s.compute,
        flags: s.flags,
        arrays: false,
    }
});

/// `rocblas_set_workspace`: the workspace is remembered for the handle's later GEMMs (their scratch).
pub fn set_workspace(a: &super::hook::rocblas_set_workspace::Args, real: &super::RealCall) -> i32 {
    ROCBLAS_HANDLE.set_workspace_hook(a.handle, a.workspace, a.bytes, real)
}
