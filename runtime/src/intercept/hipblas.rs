//! hipBLAS classic GEMM entry points (`hipblasGemmEx`, `hipblasGemmStridedBatchedEx` and their
//! `_v2` forms) decoded from their arguments.
//!
//! The `_v2` symbols take `hipDataType` / `hipblasComputeType_t`. The plain ones take
//! `hipblasDatatype_t` for both in hipBLAS 2.x and the v2 types from hipBLAS 3.0 (ROCm 7.0);
//! the two value sets are disjoint, so the call is classified by its A type's value
//! ([`crate::vendor::hipblas::gemm_ex_abi`] with no version): no version query is needed and a
//! wrong guess is impossible for valid calls. Column-major, C is D: the transpose identity of
//! [`super::common`] applies.

use super::common::{
    classic_entry, ClassicCall, HandleQueries, RawClassic, RawOperand, ScalarKind, Variant, VendorHandle,
};
use super::Skip;
use crate::vendor::hipblas::{
    compute_type_from_gemm_ex, format_from_gemm_ex_type, gemm_ex_abi, hipblas_compute_type_name,
    hipblas_datatype_name, transpose_from_hipblas_operation, GemmExAbi,
};
use std::ffi::c_void;

/// The real hipblas handle getters.
pub static HIPBLAS_HANDLE: VendorHandle =
    VendorHandle::new("hipblas", c"hipblasGetStream", c"hipblasGetPointerMode", None);

/// Maps a raw hipBLAS call under the ABI its symbol and A type imply.
pub fn resolve(raw: &RawClassic, _q: &dyn HandleQueries) -> Result<ClassicCall, Skip> {
    let v = "hipblas";
    let Variant::HipblasEx { v2 } = raw.variant else {
        return Err(Skip::new("hipblas: internal: not a hipBLAS call"));
    };
    let abi = gemm_ex_abi(v2, None, raw.a.ty);
    let trans = |t: i32| {
        transpose_from_hipblas_operation(t)
            .ok_or_else(|| Skip::new("hipblas: unsupported hipblasOperation_t"))
    };
    let type_name = |ty: i32| match abi {
        GemmExAbi::LegacyDatatype => hipblas_datatype_name(ty),
        GemmExAbi::V2 => crate::vendor::data_type::hip_data_type_name(ty),
    };
    let fmt = |ty: i32| {
        format_from_gemm_ex_type(abi, ty)
            .ok_or_else(|| Skip::new(format!("{v}: data type {} not supported", type_name(ty))))
    };
    let formats = [fmt(raw.a.ty)?, fmt(raw.b.ty)?, fmt(raw.c.ty)?, fmt(raw.d.ty)?];
    let compute = compute_type_from_gemm_ex(abi, raw.compute).ok_or_else(|| {
        let name = match abi {
            GemmExAbi::LegacyDatatype => hipblas_datatype_name(raw.compute),
            GemmExAbi::V2 => hipblas_compute_type_name(raw.compute),
        };
        Skip::new(format!("{v}: compute type {name} not supported"))
    })?;
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

macro_rules! hipblas_ex {
    ($sym:ident, $handler:ident, $v2:expr) => {
        classic_entry!($sym, $handler, resolve, HIPBLAS_HANDLE, |s| RawClassic {
            variant: Variant::HipblasEx { v2: $v2 },
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
            d: op(s.c, s.c_type, s.ldc, 0),
            alpha: s.alpha,
            beta: s.beta,
            compute: s.compute,
            flags: 0,
            arrays: false,
        });
    };
}

macro_rules! hipblas_strided {
    ($sym:ident, $handler:ident, $v2:expr) => {
        classic_entry!($sym, $handler, resolve, HIPBLAS_HANDLE, |s| RawClassic {
            variant: Variant::HipblasEx { v2: $v2 },
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
            d: op(s.c, s.c_type, s.ldc, s.stride_c),
            alpha: s.alpha,
            beta: s.beta,
            compute: s.compute,
            flags: 0,
            arrays: false,
        });
    };
}

hipblas_ex!(hipblasGemmEx, gemm_ex, false);
hipblas_ex!(hipblasGemmEx_v2, gemm_ex_v2, true);
hipblas_strided!(hipblasGemmStridedBatchedEx, gemm_strided_batched_ex, false);
hipblas_strided!(hipblasGemmStridedBatchedEx_v2, gemm_strided_batched_ex_v2, true);

/// `hipblasSetWorkspace`: the workspace is remembered for the handle's later GEMMs (their scratch).
pub fn set_workspace(a: &super::hook::hipblasSetWorkspace::Args, real: &super::RealCall) -> i32 {
    HIPBLAS_HANDLE.set_workspace_hook(a.handle, a.workspace, a.bytes, real)
}
