//! cuBLASLt: `cublasLtMatmul` decoded through the real descriptor getters
//! (`cublasLtMatmulDescGetAttribute`, `cublasLtMatrixLayoutGetAttribute`), with attribute ids
//! chosen by the version `cublasLtGetVersion()` reports. The decoding itself (transpose
//! identity, ROW/COL orders, scales, epilogue) is [`common::decode_lt`].

use super::common::{self, lt_get_attr, LtCall, LtDialect, LtQueries};
use super::hook::cublasLtMatmul;
use super::RealSlot;
use super::{GemmArgs, InterceptedGemm, RealCall, Skip};
use crate::vendor::cublas::{
    compute_type_from_cublas, cublas_compute_type_name, transpose_from_cublas_operation,
    CUBLAS_FILL_MODE_FULL,
};
use crate::vendor::cublaslt::{
    cublaslt_epilogue_name, cublaslt_scale_mode_name, cublaslt_scale_spec, cublaslt_version,
    desc_attribute_id, desc_attribute_value, epilogue_from_cublaslt, layout_attribute_id,
    layout_attribute_value, order_from_cublaslt, pointer_mode_from_cublaslt,
    CUBLASLT_BATCH_MODE_POINTER_ARRAY, CUBLASLT_BIAS_DATA_TYPE_UNSET, CUBLASLT_MATMUL_DESC_ATTRIBUTES,
    CUBLASLT_MATRIX_LAYOUT_ATTRIBUTES,
};
use crate::vendor::data_type::{cuda_data_type_name, format_from_cuda_data_type};
use crate::vendor::{LibVersion, MatmulDescAttr};
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};

pub fn matmul(args: &cublasLtMatmul::Args, real: &RealCall) -> i32 {
    crate::engine::on_gemm(args, real)
}

/// cuBLASLt's numbering and enums.
pub static CUBLASLT: LtDialect = LtDialect {
    name: "cublasLt",
    desc_table: CUBLASLT_MATMUL_DESC_ATTRIBUTES,
    desc_id: desc_attribute_id,
    desc_value: desc_attribute_value,
    default_of: |attr| match attr {
        MatmulDescAttr::FillMode => Some(CUBLAS_FILL_MODE_FULL as i64),
        _ => Some(0),
    },
    layout_table: CUBLASLT_MATRIX_LAYOUT_ATTRIBUTES,
    layout_id: layout_attribute_id,
    layout_value: layout_attribute_value,
    transpose: transpose_from_cublas_operation,
    format: format_from_cuda_data_type,
    format_name: cuda_data_type_name,
    compute: compute_type_from_cublas,
    compute_name: cublas_compute_type_name,
    order: |_, v| order_from_cublaslt(v),
    epilogue: |_, v| epilogue_from_cublaslt(v),
    epilogue_name: |_, v| cublaslt_epilogue_name(v),
    pointer_mode: |_, v| pointer_mode_from_cublaslt(v),
    scale_spec: cublaslt_scale_spec,
    scale_mode_name: |_, m| cublaslt_scale_mode_name(m),
    vec_scale: None,
    bias_type_unset: &[CUBLASLT_BIAS_DATA_TYPE_UNSET],
    batch_mode_pointer_array: CUBLASLT_BATCH_MODE_POINTER_ARRAY as i64,
};

static GET_VERSION: RealSlot = RealSlot::new(c"cublasLtGetVersion");
static DESC_GET: RealSlot = RealSlot::new(c"cublasLtMatmulDescGetAttribute");
static LAYOUT_GET: RealSlot = RealSlot::new(c"cublasLtMatrixLayoutGetAttribute");
/// `cublasLtGetVersion()` once read (0: not yet).
static VERSION_RAW: AtomicUsize = AtomicUsize::new(0);

/// The real cuBLASLt getters.
pub struct CublasLtReal;

impl LtQueries for CublasLtReal {
    fn version(&self, _handle: *mut c_void) -> Result<LibVersion, Skip> {
        let mut raw = VERSION_RAW.load(Ordering::Relaxed);
        if raw == 0 {
            let p = GET_VERSION.get().ok_or_else(|| Skip::new("cublasLt: cublasLtGetVersion not found"))?;
            // SAFETY: `size_t cublasLtGetVersion(void)`.
            raw = unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn() -> usize>(p)() };
            VERSION_RAW.store(raw, Ordering::Relaxed);
        }
        cublaslt_version(raw).ok_or_else(|| Skip::new("cublasLt: library version not supported"))
    }
    fn desc_attr(&self, desc: *mut c_void, id: i32, buf: &mut [u8]) -> Result<(), Skip> {
        lt_get_attr(&DESC_GET, desc, id, buf)
            .map_err(|()| Skip::new("cublasLt: cublasLtMatmulDescGetAttribute failed"))
    }
    fn layout_attr(&self, layout: *mut c_void, id: i32, buf: &mut [u8]) -> Result<(), Skip> {
        lt_get_attr(&LAYOUT_GET, layout, id, buf)
            .map_err(|()| Skip::new("cublasLt: cublasLtMatrixLayoutGetAttribute failed"))
    }
}

impl cublasLtMatmul::Args {
    /// [`GemmArgs::decode`] over the given queries.
    pub fn decode_with(&self, q: &dyn LtQueries) -> Result<InterceptedGemm, Skip> {
        common::decode_lt(cublasLtMatmul::NAME, &CUBLASLT, &LtCall::from(self), q, None)
    }

    /// [`GemmArgs::quick_key`] over the given queries.
    pub fn quick_key_with(&self, q: &dyn LtQueries) -> u64 {
        common::lt_key(cublasLtMatmul::NAME, &CUBLASLT, &LtCall::from(self), q)
    }
}

impl GemmArgs for cublasLtMatmul::Args {
    const ENTRY: &'static str = cublasLtMatmul::NAME;
    fn quick_key(&self) -> u64 {
        self.quick_key_with(&CublasLtReal)
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        self.decode_with(&CublasLtReal)
    }
    fn scratch(&self) -> Option<(u64, u64)> {
        let start = self.workspace as u64;
        (start != 0 && self.workspace_bytes > 0)
            .then(|| (start, start.saturating_add(self.workspace_bytes as u64)))
    }
    fn stream(&self) -> Option<u64> {
        Some(self.stream as u64)
    }
}
