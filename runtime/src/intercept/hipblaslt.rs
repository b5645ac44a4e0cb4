//! hipBLASLt: `hipblasLtMatmul`, and the compute/scale types learnt at descriptor creation.
//!
//! hipBLASLt's matmul descriptor has no compute-type or scale-type attribute: both are
//! arguments of `hipblasLtMatmulDescCreate`, which is interposed to record them per descriptor
//! in a bounded map (`hipblasLtMatmulDescDestroy` removes the entry). A descriptor that is not in
//! the map (created before the interposer was active, inside another hook, or after the map
//! filled up) is skipped rather than assumed f32: a wrong scale type would read alpha/beta
//! with the wrong width and raise a false alarm, and a counted skip is the honest outcome.
//! Everything else is [`common::decode_lt`] with hipBLASLt's numbering by `hipblasLtGetVersion`.

use super::common::{self, lt_get_attr, LtCall, LtDialect, LtQueries};
use super::hook::{hipblasLtMatmul, hipblasLtMatmulDescCreate, hipblasLtMatmulDescDestroy};
use super::RealSlot;
use super::{GemmArgs, InterceptedGemm, RealCall, Skip};
use crate::problem::ScaleSpec;
use crate::vendor::data_type::{format_from_hip_data_type, hip_data_type_name};
use crate::vendor::hipblas::{
    compute_type_from_hipblas, hipblas_compute_type_name, transpose_from_hipblas_operation,
};
use crate::vendor::hipblaslt::{
    desc_attribute_id, desc_attribute_value, epilogue_from_hipblaslt, hipblaslt_epilogue_name,
    hipblaslt_scale_mode_name, hipblaslt_version, layout_attribute_id, layout_attribute_value,
    order_from_hipblaslt, pointer_mode_from_hipblaslt, scale_granularity_from_hipblaslt_scale_mode,
    HIPBLASLT_BATCH_MODE_POINTER_ARRAY, HIPBLASLT_DATATYPE_INVALID, HIPBLASLT_MATMUL_DESC_ATTRIBUTES,
    HIPBLASLT_MATRIX_LAYOUT_ATTRIBUTES, SCALE_POINTER_VEC_EXT_MAPPING,
};
use crate::vendor::{LibVersion, MatmulDescAttr};
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

/// hipBLASLt's numbering and enums.
pub static HIPBLASLT: LtDialect = LtDialect {
    name: "hipblasLt",
    desc_table: HIPBLASLT_MATMUL_DESC_ATTRIBUTES,
    desc_id: desc_attribute_id,
    desc_value: desc_attribute_value,
    // The defaults of COMPUTE_INPUT_TYPE_A/B_EXT are not documented in the headers read, and
    // the clamp bounds (EPILOGUE_ACT_ARG0/1_EXT) only act with the CLAMP epilogues, which are
    // skipped: those are not checked. Everything else must-be-default is 0 / null.
    default_of: |attr| match attr {
        MatmulDescAttr::ComputeInputTypeA
        | MatmulDescAttr::ComputeInputTypeB
        | MatmulDescAttr::EpilogueActArg0
        | MatmulDescAttr::EpilogueActArg1 => None,
        _ => Some(0),
    },
    layout_table: HIPBLASLT_MATRIX_LAYOUT_ATTRIBUTES,
    layout_id: layout_attribute_id,
    layout_value: layout_attribute_value,
    transpose: transpose_from_hipblas_operation,
    format: format_from_hip_data_type,
    format_name: hip_data_type_name,
    compute: compute_type_from_hipblas,
    compute_name: hipblas_compute_type_name,
    order: order_from_hipblaslt,
    epilogue: epilogue_from_hipblaslt,
    epilogue_name: hipblaslt_epilogue_name,
    pointer_mode: pointer_mode_from_hipblaslt,
    scale_spec: |v, mode, _outer, _k| {
        scale_granularity_from_hipblaslt_scale_mode(v, mode)
            .map(|(g, f, s)| ScaleSpec::new(g, f).with_storage(s))
    },
    scale_mode_name: hipblaslt_scale_mode_name,
    vec_scale: Some(SCALE_POINTER_VEC_EXT_MAPPING),
    // 255 per the header; -1 (cuBLASLt's spelling) is accepted too.
    bias_type_unset: &[HIPBLASLT_DATATYPE_INVALID, -1],
    batch_mode_pointer_array: HIPBLASLT_BATCH_MODE_POINTER_ARRAY as i64,
};

// ---- descriptor types learnt at creation ------------------------------------------------------

/// Descriptor -> (compute type, scale type), bounded: descriptors beyond the cap are counted
/// and not recorded (their calls are then skipped), never an unbounded allocation.
pub struct DescTypes {
    map: Mutex<BTreeMap<usize, (i32, i32)>>,
    cap: usize,
    overflow: AtomicU64,
}

impl DescTypes {
    pub const fn new(cap: usize) -> DescTypes {
        DescTypes { map: Mutex::new(BTreeMap::new()), cap, overflow: AtomicU64::new(0) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<usize, (i32, i32)>> {
        self.map.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the (compute type, scale type) a descriptor was created with.
    pub fn record(&self, desc: *mut c_void, compute: i32, scale_type: i32) {
        let mut map = self.lock();
        if map.len() >= self.cap && !map.contains_key(&(desc as usize)) {
            self.overflow.fetch_add(1, Ordering::Relaxed);
            return;
        }
        map.insert(desc as usize, (compute, scale_type));
    }

    /// Forgets a destroyed descriptor.
    pub fn forget(&self, desc: *mut c_void) {
        self.lock().remove(&(desc as usize));
    }

    /// The (compute type, scale type) `desc` was created with, if recorded.
    pub fn get(&self, desc: *mut c_void) -> Option<(i32, i32)> {
        self.lock().get(&(desc as usize)).copied()
    }

    /// Descriptors not recorded because the map was full.
    pub fn overflow(&self) -> u64 {
        self.overflow.load(Ordering::Relaxed)
    }
}

/// Most descriptors tracked at once (PyTorch creates and destroys one per call; libraries that
/// cache descriptors hold a few hundred).
pub const DESC_MAP_CAP: usize = 4096;
/// The process's descriptor map, filled by the `hipblasLtMatmulDescCreate` hook.
pub static DESC_TYPES: DescTypes = DescTypes::new(DESC_MAP_CAP);

/// Records a descriptor in [`DESC_TYPES`].
pub fn record_desc(desc: *mut c_void, compute: i32, scale_type: i32) {
    DESC_TYPES.record(desc, compute, scale_type);
}

/// Forgets a descriptor in [`DESC_TYPES`].
pub fn forget_desc(desc: *mut c_void) {
    DESC_TYPES.forget(desc);
}

/// The recorded types of a descriptor in [`DESC_TYPES`].
pub fn desc_types(desc: *mut c_void) -> Option<(i32, i32)> {
    DESC_TYPES.get(desc)
}

pub fn matmul(args: &hipblasLtMatmul::Args, real: &RealCall) -> i32 {
    crate::engine::on_gemm(args, real)
}

pub fn desc_create(args: &hipblasLtMatmulDescCreate::Args, real: &RealCall) -> i32 {
    let status = real.call();
    if status == 0 && !args.desc_out.is_null() {
        // SAFETY: the real call succeeded, so it wrote the new descriptor to the caller's
        // out-pointer, which it dereferenced itself.
        let desc = unsafe { args.desc_out.read() };
        record_desc(desc, args.compute, args.scale_type);
    }
    status
}

pub fn desc_destroy(args: &hipblasLtMatmulDescDestroy::Args, real: &RealCall) -> i32 {
    forget_desc(args.desc);
    real.call()
}

// ---- real queries -----------------------------------------------------------------------------

static GET_VERSION: RealSlot = RealSlot::new(c"hipblasLtGetVersion");
static DESC_GET: RealSlot = RealSlot::new(c"hipblasLtMatmulDescGetAttribute");
static LAYOUT_GET: RealSlot = RealSlot::new(c"hipblasLtMatrixLayoutGetAttribute");
/// `hipblasLtGetVersion` once read (-1: not yet; one hipBLASLt per process).
static VERSION_RAW: AtomicI64 = AtomicI64::new(-1);

/// The real hipBLASLt getters.
pub struct HipblasLtReal;

impl LtQueries for HipblasLtReal {
    // The handle is the intercepted call's own, passed to the vendor getter as the vendor
    // itself will receive it for the real call.
    #[allow(clippy::not_unsafe_ptr_arg_deref)]
    fn version(&self, handle: *mut c_void) -> Result<LibVersion, Skip> {
        let mut raw = VERSION_RAW.load(Ordering::Relaxed);
        if raw < 0 {
            let p = GET_VERSION.get().ok_or_else(|| Skip::new("hipblasLt: hipblasLtGetVersion not found"))?;
            let mut v: i32 = -1;
            // SAFETY: `hipblasStatus_t hipblasLtGetVersion(hipblasLtHandle_t, int*)`, with the
            // caller's live handle.
            let status = unsafe {
                std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void, *mut i32) -> i32>(p)(
                    handle, &mut v,
                )
            };
            if status != 0 || v < 0 {
                return Err(Skip::new("hipblasLt: hipblasLtGetVersion failed"));
            }
            raw = v as i64;
            VERSION_RAW.store(raw, Ordering::Relaxed);
        }
        hipblaslt_version(raw as i32).ok_or_else(|| Skip::new("hipblasLt: library version not supported"))
    }
    fn desc_attr(&self, desc: *mut c_void, id: i32, buf: &mut [u8]) -> Result<(), Skip> {
        lt_get_attr(&DESC_GET, desc, id, buf)
            .map_err(|()| Skip::new("hipblasLt: hipblasLtMatmulDescGetAttribute failed"))
    }
    fn layout_attr(&self, layout: *mut c_void, id: i32, buf: &mut [u8]) -> Result<(), Skip> {
        lt_get_attr(&LAYOUT_GET, layout, id, buf)
            .map_err(|()| Skip::new("hipblasLt: hipblasLtMatrixLayoutGetAttribute failed"))
    }
}

impl hipblasLtMatmul::Args {
    /// [`GemmArgs::decode`] over the given queries (compute/scale types from the map).
    pub fn decode_with(&self, q: &dyn LtQueries) -> Result<InterceptedGemm, Skip> {
        let types = desc_types(self.desc).ok_or_else(|| {
            Skip::new("hipblasLt: descriptor not seen at creation (compute and scale type unknown)")
        })?;
        common::decode_lt(hipblasLtMatmul::NAME, &HIPBLASLT, &LtCall::from(self), q, Some(types))
    }

    /// [`GemmArgs::quick_key`] over the given queries.
    pub fn quick_key_with(&self, q: &dyn LtQueries) -> u64 {
        common::lt_key(hipblasLtMatmul::NAME, &HIPBLASLT, &LtCall::from(self), q)
    }
}

impl GemmArgs for hipblasLtMatmul::Args {
    const ENTRY: &'static str = hipblasLtMatmul::NAME;
    fn quick_key(&self) -> u64 {
        self.quick_key_with(&HipblasLtReal)
    }
    fn decode(&self) -> Result<InterceptedGemm, Skip> {
        self.decode_with(&HipblasLtReal)
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
