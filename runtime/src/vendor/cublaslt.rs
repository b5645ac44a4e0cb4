//! cuBLASLt (`cublasLt.h`): matmul-descriptor and matrix-layout attributes, orders, epilogues,
//! scale modes, pointer modes and the semi-opaque struct sizes, keyed by the cuBLAS version
//! `cublasLtGetVersion()` reports (`CUBLAS_VERSION` encoding, 130100 for 13.1.0: read on the
//! H200 host).
//!
//! Sources: CUDA 13.0.88 `include/cublasLt.h` (cuBLAS 13.1.0.3, H200 host) and cuBLAS 12.8
//! (`cudarc` `src/cublaslt/sys/sys_12080.rs`, bindgen output of the 12.8 header). Version
//! bounds:
//! - scale modes SCALAR_32F/VEC16_UE4M3/VEC32_UE8M0 and the A/B/C/D/AUX_SCALE_MODE and
//!   D_OUT_SCALE attributes: in the 12.8 header (the release that introduced block scaling);
//! - OUTER_VEC_32F/VEC128_32F/BLK128x128_32F: cuBLAS 12.9 (absent from 12.8; PyTorch guards
//!   them with `CUDA_VERSION >= 12090`; NVIDIA's cuBLAS 12.9 announcement);
//! - ATOMIC_SYNC_* (27-30): in the 12.8 header, gone from 13.1 (exact bounds not pinned);
//! - BATCH_MODE layout attribute, EMULATION_DESCRIPTOR: first seen in the 13.1 header;
//! - PER_BATCH_SCALAR_32F (6): listed by nvmath-python's cuBLASLt bindings, absent from the
//!   13.1 header; 13.2 is assumed.
//!
//! Scale storage (the descriptor has no attribute for it; PyTorch `_scaled_mm` shape/stride
//! checks and TransformerEngine's scale shapes, both fed straight to cuBLASLt, define it):
//! - VEC16_UE4M3 / VEC32_UE8M0: the 128x4-tile swizzle ([`ScaleStorage::Swizzled128x4`]).
//! - VEC128_32F (1x128 blocks): one f32 per (outer index, 128-wide K block), outer index
//!   contiguous (PyTorch: scale `[outer, ceil(K/128)]` with strides `(1, outer)`) ->
//!   [`ScaleStorage::InnerMajor`], leading dimension the outer extent rounded up to a multiple
//!   of 4 (TransformerEngine allocates `[ceil(K/128), roundup(outer, 4)]`).
//! - BLK128x128_32F: one f32 per 128x128 block, K blocks contiguous (PyTorch: `[ceil(outer/128),
//!   ceil(K/128)]` with strides `(roundup(ceil(K/128), 4), 1)`) -> [`ScaleStorage::OuterMajor`],
//!   leading dimension `roundup(ceil(K/128), 4)`.
//! - OUTER_VEC_32F: a vector of `outer` f32 (M for A, N for B). SCALAR_32F: one f32.

use super::{
    abi_table, lookup, lookup_any, AttrValue, EpilogueMapping, LayoutAttr, LibVersion, Library,
    MatmulDescAttr, PointerMode, ScaleMapping, VersionRange,
};
use crate::formats::Format;
use crate::problem::{Activation, Order, ScaleGranularity, ScaleSpec, ScaleStorage};

const V12_8: LibVersion = LibVersion::new(12, 8, 0);
const V13_0: LibVersion = LibVersion::new(13, 0, 0);

abi_table! {
    /// `cublasLtMatmulDescAttributes_t`.
    pub const CUBLASLT_MATMUL_DESC_ATTRIBUTES: [i32 => MatmulDescAttr] = {
        enum: "cublasLtMatmulDescAttributes_t", library: Cublas, header: "cublasLt.h";
        CUBLASLT_MATMUL_DESC_COMPUTE_TYPE = 0 => MatmulDescAttr::ComputeType,
        CUBLASLT_MATMUL_DESC_SCALE_TYPE = 1 => MatmulDescAttr::ScaleType,
        CUBLASLT_MATMUL_DESC_POINTER_MODE = 2 => MatmulDescAttr::PointerMode,
        CUBLASLT_MATMUL_DESC_TRANSA = 3 => MatmulDescAttr::TransA,
        CUBLASLT_MATMUL_DESC_TRANSB = 4 => MatmulDescAttr::TransB,
        CUBLASLT_MATMUL_DESC_TRANSC = 5 => MatmulDescAttr::TransC,
        CUBLASLT_MATMUL_DESC_FILL_MODE = 6 => MatmulDescAttr::FillMode,
        CUBLASLT_MATMUL_DESC_EPILOGUE = 7 => MatmulDescAttr::Epilogue,
        CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8 => MatmulDescAttr::BiasPointer,
        CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE = 10 => MatmulDescAttr::BiasBatchStride,
        CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 11 => MatmulDescAttr::EpilogueAuxPointer,
        CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 12 => MatmulDescAttr::EpilogueAuxLd,
        CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE = 13 => MatmulDescAttr::EpilogueAuxBatchStride,
        CUBLASLT_MATMUL_DESC_ALPHA_VECTOR_BATCH_STRIDE = 14 => MatmulDescAttr::AlphaVectorBatchStride,
        CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET = 15 => MatmulDescAttr::SmCountTarget,
        CUBLASLT_MATMUL_DESC_A_SCALE_POINTER = 17 => MatmulDescAttr::AScalePointer,
        CUBLASLT_MATMUL_DESC_B_SCALE_POINTER = 18 => MatmulDescAttr::BScalePointer,
        CUBLASLT_MATMUL_DESC_C_SCALE_POINTER = 19 => MatmulDescAttr::CScalePointer,
        CUBLASLT_MATMUL_DESC_D_SCALE_POINTER = 20 => MatmulDescAttr::DScalePointer,
        CUBLASLT_MATMUL_DESC_AMAX_D_POINTER = 21 => MatmulDescAttr::AmaxDPointer,
        CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE = 22 => MatmulDescAttr::EpilogueAuxDataType,
        CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER = 23 => MatmulDescAttr::EpilogueAuxScalePointer,
        CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER = 24 => MatmulDescAttr::EpilogueAuxAmaxPointer,
        CUBLASLT_MATMUL_DESC_FAST_ACCUM = 25 => MatmulDescAttr::FastAccum,
        CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26 => MatmulDescAttr::BiasDataType,
        CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_NUM_CHUNKS_D_ROWS = 27
            => MatmulDescAttr::AtomicSyncNumChunksDRows; VersionRange::between(V12_8, V13_0),
        CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_NUM_CHUNKS_D_COLS = 28
            => MatmulDescAttr::AtomicSyncNumChunksDCols; VersionRange::between(V12_8, V13_0),
        CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_IN_COUNTERS_POINTER = 29
            => MatmulDescAttr::AtomicSyncInCountersPointer; VersionRange::between(V12_8, V13_0),
        CUBLASLT_MATMUL_DESC_ATOMIC_SYNC_OUT_COUNTERS_POINTER = 30
            => MatmulDescAttr::AtomicSyncOutCountersPointer; VersionRange::between(V12_8, V13_0),
        CUBLASLT_MATMUL_DESC_A_SCALE_MODE = 31 => MatmulDescAttr::AScaleMode; VersionRange::since(12, 8, 0),
        CUBLASLT_MATMUL_DESC_B_SCALE_MODE = 32 => MatmulDescAttr::BScaleMode; VersionRange::since(12, 8, 0),
        CUBLASLT_MATMUL_DESC_C_SCALE_MODE = 33 => MatmulDescAttr::CScaleMode; VersionRange::since(12, 8, 0),
        CUBLASLT_MATMUL_DESC_D_SCALE_MODE = 34 => MatmulDescAttr::DScaleMode; VersionRange::since(12, 8, 0),
        CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_MODE = 35
            => MatmulDescAttr::EpilogueAuxScaleMode; VersionRange::since(12, 8, 0),
        CUBLASLT_MATMUL_DESC_D_OUT_SCALE_POINTER = 36
            => MatmulDescAttr::DOutScalePointer; VersionRange::since(12, 8, 0),
        CUBLASLT_MATMUL_DESC_D_OUT_SCALE_MODE = 37 => MatmulDescAttr::DOutScaleMode; VersionRange::since(12, 8, 0),
        CUBLASLT_MATMUL_DESC_EMULATION_DESCRIPTOR = 38
            => MatmulDescAttr::EmulationDescriptor; VersionRange::since(13, 1, 0),
    };
}

abi_table! {
    /// `cublasLtMatrixLayoutAttribute_t`.
    pub const CUBLASLT_MATRIX_LAYOUT_ATTRIBUTES: [i32 => LayoutAttr] = {
        enum: "cublasLtMatrixLayoutAttribute_t", library: Cublas, header: "cublasLt.h";
        CUBLASLT_MATRIX_LAYOUT_TYPE = 0 => LayoutAttr::Type,
        CUBLASLT_MATRIX_LAYOUT_ORDER = 1 => LayoutAttr::Order,
        CUBLASLT_MATRIX_LAYOUT_ROWS = 2 => LayoutAttr::Rows,
        CUBLASLT_MATRIX_LAYOUT_COLS = 3 => LayoutAttr::Cols,
        CUBLASLT_MATRIX_LAYOUT_LD = 4 => LayoutAttr::Ld,
        CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 5 => LayoutAttr::BatchCount,
        CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 6 => LayoutAttr::StridedBatchOffset,
        CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET = 7 => LayoutAttr::PlaneOffset,
        CUBLASLT_MATRIX_LAYOUT_BATCH_MODE = 8 => LayoutAttr::BatchMode; VersionRange::since(13, 1, 0),
    };
}

abi_table! {
    /// `cublasLtOrder_t`: only COL and ROW are plain strided layouts.
    pub const CUBLASLT_ORDER: [i32 => Option<Order>] = {
        enum: "cublasLtOrder_t", library: Cublas, header: "cublasLt.h";
        CUBLASLT_ORDER_COL = 0 => Some(Order::ColMajor),
        CUBLASLT_ORDER_ROW = 1 => Some(Order::RowMajor),
        CUBLASLT_ORDER_COL32 = 2 => None,
        CUBLASLT_ORDER_COL4_4R2_8C = 3 => None,
        CUBLASLT_ORDER_COL32_2R_4R4 = 4 => None,
    };
}

abi_table! {
    /// `cublasLtBatchMode_t` (value of `CUBLASLT_MATRIX_LAYOUT_BATCH_MODE`).
    pub const CUBLASLT_BATCH_MODE: [i32 => ()] = {
        enum: "cublasLtBatchMode_t", library: Cublas, header: "cublasLt.h";
        CUBLASLT_BATCH_MODE_STRIDED = 0; VersionRange::since(13, 1, 0),
        CUBLASLT_BATCH_MODE_POINTER_ARRAY = 1; VersionRange::since(13, 1, 0),
    };
}

abi_table! {
    /// `cublasLtEpilogue_t` (a `uint32_t` attribute value). Gradient epilogues read an
    /// auxiliary input and are not modeled; `*_AUX` ones write an extra output but compute D
    /// like their plain forms; BGRADA/BGRADB reduce a bias gradient into BIAS_POINTER and leave
    /// D the plain product.
    pub const CUBLASLT_EPILOGUE: [u32 => Option<EpilogueMapping>] = {
        enum: "cublasLtEpilogue_t", library: Cublas, header: "cublasLt.h";
        CUBLASLT_EPILOGUE_DEFAULT = 1 => Some(EpilogueMapping::new(Activation::None, false, false)),
        CUBLASLT_EPILOGUE_RELU = 2 => Some(EpilogueMapping::new(Activation::Relu, false, false)),
        CUBLASLT_EPILOGUE_RELU_AUX = 130 => Some(EpilogueMapping::new(Activation::Relu, false, true)),
        CUBLASLT_EPILOGUE_BIAS = 4 => Some(EpilogueMapping::new(Activation::None, true, false)),
        CUBLASLT_EPILOGUE_RELU_BIAS = 6 => Some(EpilogueMapping::new(Activation::Relu, true, false)),
        CUBLASLT_EPILOGUE_RELU_AUX_BIAS = 134 => Some(EpilogueMapping::new(Activation::Relu, true, true)),
        CUBLASLT_EPILOGUE_DRELU = 136 => None,
        CUBLASLT_EPILOGUE_DRELU_BGRAD = 152 => None,
        CUBLASLT_EPILOGUE_GELU = 32 => Some(EpilogueMapping::new(Activation::GeluTanh, false, false)),
        CUBLASLT_EPILOGUE_GELU_AUX = 160 => Some(EpilogueMapping::new(Activation::GeluTanh, false, true)),
        CUBLASLT_EPILOGUE_GELU_BIAS = 36 => Some(EpilogueMapping::new(Activation::GeluTanh, true, false)),
        CUBLASLT_EPILOGUE_GELU_AUX_BIAS = 164 => Some(EpilogueMapping::new(Activation::GeluTanh, true, true)),
        CUBLASLT_EPILOGUE_DGELU = 192 => None,
        CUBLASLT_EPILOGUE_DGELU_BGRAD = 208 => None,
        CUBLASLT_EPILOGUE_BGRADA = 256 => Some(EpilogueMapping::new(Activation::None, false, true)),
        CUBLASLT_EPILOGUE_BGRADB = 512 => Some(EpilogueMapping::new(Activation::None, false, true)),
    };
}

abi_table! {
    /// `cublasLtMatmulMatrixScale_t` (value of A/B/C/D_SCALE_MODE).
    pub const CUBLASLT_MATRIX_SCALE: [i32 => Option<ScaleMapping>] = {
        enum: "cublasLtMatmulMatrixScale_t", library: Cublas, header: "cublasLt.h";
        CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F = 0
            => Some((ScaleGranularity::Tensor, Format::F32, ScaleStorage::OuterMajor)); VersionRange::since(12, 8, 0),
        CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 = 1
            => Some((ScaleGranularity::Nvfp4, Format::Ue4m3, ScaleStorage::Swizzled128x4));
            VersionRange::since(12, 8, 0),
        CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 = 2
            => Some((ScaleGranularity::Mx32, Format::Ue8m0, ScaleStorage::Swizzled128x4));
            VersionRange::since(12, 8, 0),
        CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F = 3
            => Some((ScaleGranularity::PerOuter, Format::F32, ScaleStorage::OuterMajor));
            VersionRange::since(12, 9, 0),
        CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F = 4
            => Some((ScaleGranularity::Block { outer: 1, inner: 128 }, Format::F32, ScaleStorage::InnerMajor));
            VersionRange::since(12, 9, 0),
        CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F = 5
            => Some((ScaleGranularity::Block { outer: 128, inner: 128 }, Format::F32, ScaleStorage::OuterMajor));
            VersionRange::since(12, 9, 0),
        /// One f32 per batch item: not modeled. Not in the 13.1 header; see the module doc.
        CUBLASLT_MATMUL_MATRIX_SCALE_PER_BATCH_SCALAR_32F = 6 => None; VersionRange::since(13, 2, 0),
    };
}

abi_table! {
    /// `cublasLtPointerMode_t` (value of POINTER_MODE).
    pub const CUBLASLT_POINTER_MODE: [i32 => PointerMode] = {
        enum: "cublasLtPointerMode_t", library: Cublas, header: "cublasLt.h";
        CUBLASLT_POINTER_MODE_HOST = 0 => PointerMode::Host,
        CUBLASLT_POINTER_MODE_DEVICE = 1 => PointerMode::Device,
        CUBLASLT_POINTER_MODE_DEVICE_VECTOR = 2 => PointerMode::DeviceVector,
        CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO = 3 => PointerMode::AlphaDeviceVectorBetaZero,
        CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST = 4 => PointerMode::AlphaDeviceVectorBetaHost,
    };
}

abi_table! {
    /// Sizes of the semi-opaque structs (`uint64_t data[N]`).
    pub const CUBLASLT_SIZES: [usize => ()] = {
        enum: "sizeof", library: Cublas, header: "cublasLt.h";
        SIZEOF_CUBLASLT_MATMUL_ALGO as "sizeof(cublasLtMatmulAlgo_t)" = 64,
        SIZEOF_CUBLASLT_MATMUL_DESC_OPAQUE as "sizeof(cublasLtMatmulDescOpaque_t)" = 256,
        SIZEOF_CUBLASLT_MATRIX_LAYOUT_OPAQUE as "sizeof(cublasLtMatrixLayoutOpaque_t)" = 64,
        SIZEOF_CUBLASLT_MATMUL_PREFERENCE_OPAQUE as "sizeof(cublasLtMatmulPreferenceOpaque_t)" = 64,
    };
}

/// `cublasLtMatmulAlgo_t`: `typedef struct { uint64_t data[8]; }` (copied when an interposer
/// keeps the algorithm a caller passed).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CublasLtMatmulAlgo {
    pub data: [u64; 8],
}

const _: () = {
    assert!(std::mem::size_of::<CublasLtMatmulAlgo>() == SIZEOF_CUBLASLT_MATMUL_ALGO);
    assert!(std::mem::align_of::<CublasLtMatmulAlgo>() == 8);
    // cublasLt.h spells these as OR-combinations.
    assert!(CUBLASLT_EPILOGUE_RELU_AUX == CUBLASLT_EPILOGUE_RELU | 128);
    assert!(CUBLASLT_EPILOGUE_RELU_BIAS == CUBLASLT_EPILOGUE_RELU | CUBLASLT_EPILOGUE_BIAS);
    assert!(CUBLASLT_EPILOGUE_RELU_AUX_BIAS == CUBLASLT_EPILOGUE_RELU_AUX | CUBLASLT_EPILOGUE_BIAS);
    assert!(CUBLASLT_EPILOGUE_DRELU == 8 | 128);
    assert!(CUBLASLT_EPILOGUE_DRELU_BGRAD == CUBLASLT_EPILOGUE_DRELU | 16);
    assert!(CUBLASLT_EPILOGUE_GELU_AUX == CUBLASLT_EPILOGUE_GELU | 128);
    assert!(CUBLASLT_EPILOGUE_GELU_BIAS == CUBLASLT_EPILOGUE_GELU | CUBLASLT_EPILOGUE_BIAS);
    assert!(CUBLASLT_EPILOGUE_GELU_AUX_BIAS == CUBLASLT_EPILOGUE_GELU_AUX | CUBLASLT_EPILOGUE_BIAS);
    assert!(CUBLASLT_EPILOGUE_DGELU == 64 | 128);
    assert!(CUBLASLT_EPILOGUE_DGELU_BGRAD == CUBLASLT_EPILOGUE_DGELU | 16);
    // `CUBLASLT_POINTER_MODE_HOST = CUBLAS_POINTER_MODE_HOST` (and DEVICE) in the header.
    assert!(CUBLASLT_POINTER_MODE_HOST == super::cublas::CUBLAS_POINTER_MODE_HOST);
    assert!(CUBLASLT_POINTER_MODE_DEVICE == super::cublas::CUBLAS_POINTER_MODE_DEVICE);
};

/// Value of CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE when the caller never set it ("default: -1"
/// in cublasLt.h): the bias has D's type, with exceptions for IMMA and FP8 kernels.
pub const CUBLASLT_BIAS_DATA_TYPE_UNSET: i32 = -1;

/// The cuBLAS version `cublasLtGetVersion()` reports, if it is one the tables describe.
pub fn cublaslt_version(raw: usize) -> Option<LibVersion> {
    LibVersion::from_cublas_raw(raw).filter(|v| *v >= Library::Cublas.min_supported())
}

/// The matmul-descriptor attribute `id` means in cuBLAS `version`.
pub fn desc_attribute(version: LibVersion, id: i32) -> Option<MatmulDescAttr> {
    lookup(CUBLASLT_MATMUL_DESC_ATTRIBUTES, version, id as i64).map(|e| e.meaning)
}

/// The cuBLASLt id of a matmul-descriptor attribute in `version` (`None` if that version does
/// not have it).
pub fn desc_attribute_id(version: LibVersion, attr: MatmulDescAttr) -> Option<i32> {
    CUBLASLT_MATMUL_DESC_ATTRIBUTES
        .iter()
        .find(|e| e.meaning == attr && e.abi.range.contains(version))
        .map(|e| e.abi.value as i32)
}

/// The matrix-layout attribute `id` means in cuBLAS `version`.
pub fn layout_attribute(version: LibVersion, id: i32) -> Option<LayoutAttr> {
    lookup(CUBLASLT_MATRIX_LAYOUT_ATTRIBUTES, version, id as i64).map(|e| e.meaning)
}

/// The cuBLASLt id of a layout attribute in `version`.
pub fn layout_attribute_id(version: LibVersion, attr: LayoutAttr) -> Option<i32> {
    CUBLASLT_MATRIX_LAYOUT_ATTRIBUTES
        .iter()
        .find(|e| e.meaning == attr && e.abi.range.contains(version))
        .map(|e| e.abi.value as i32)
}

/// C type of a cuBLASLt matmul-descriptor attribute value (from the comments in cublasLt.h).
/// `None` for hipBLASLt-only attributes.
pub fn desc_attribute_value(attr: MatmulDescAttr) -> Option<AttrValue> {
    use MatmulDescAttr::*;
    Some(match attr {
        ComputeType
        | ScaleType
        | PointerMode
        | TransA
        | TransB
        | TransC
        | FillMode
        | SmCountTarget
        | EpilogueAuxDataType
        | BiasDataType
        | AtomicSyncNumChunksDRows
        | AtomicSyncNumChunksDCols
        | AScaleMode
        | BScaleMode
        | CScaleMode
        | DScaleMode
        | EpilogueAuxScaleMode
        | DOutScaleMode => AttrValue::I32,
        Epilogue => AttrValue::U32,
        BiasBatchStride | EpilogueAuxLd | EpilogueAuxBatchStride | AlphaVectorBatchStride => AttrValue::I64,
        FastAccum => AttrValue::I8,
        BiasPointer
        | EpilogueAuxPointer
        | AScalePointer
        | BScalePointer
        | CScalePointer
        | DScalePointer
        | AmaxDPointer
        | EpilogueAuxScalePointer
        | EpilogueAuxAmaxPointer
        | AtomicSyncInCountersPointer
        | AtomicSyncOutCountersPointer
        | DOutScalePointer => AttrValue::Ptr,
        EmulationDescriptor => AttrValue::Handle,
        ComputeInputTypeA
        | ComputeInputTypeB
        | AScalePointerVec
        | BScalePointerVec
        | EpilogueActArg0
        | EpilogueActArg1
        | StreamKTileScheduling
        | UniformSummationOrder
        | FusedEpilogue => return None,
    })
}

/// C type of a cuBLASLt matrix-layout attribute value (from the comments in cublasLt.h).
pub fn layout_attribute_value(attr: LayoutAttr) -> Option<AttrValue> {
    Some(match attr {
        LayoutAttr::Type | LayoutAttr::BatchMode => AttrValue::U32,
        LayoutAttr::Order | LayoutAttr::BatchCount => AttrValue::I32,
        LayoutAttr::Rows | LayoutAttr::Cols => AttrValue::U64,
        LayoutAttr::Ld | LayoutAttr::StridedBatchOffset | LayoutAttr::PlaneOffset => AttrValue::I64,
        LayoutAttr::Offset => return None,
    })
}

/// `cublasLtOrder_t` -> `Order`; `None` for the tiled IMMA orders.
pub fn order_from_cublaslt(value: i32) -> Option<Order> {
    lookup_any(CUBLASLT_ORDER, value as i64).and_then(|e| e.meaning)
}

/// `cublasLtEpilogue_t` -> activation, bias and aux output; `None` for gradient and unknown
/// epilogues. The bias runs along the rows of D in cuBLASLt's column-major view.
pub fn epilogue_from_cublaslt(value: u32) -> Option<EpilogueMapping> {
    lookup_any(CUBLASLT_EPILOGUE, value as i64).and_then(|e| e.meaning)
}

/// Name of a `cublasLtEpilogue_t` value for logs and skip reasons.
pub fn cublaslt_epilogue_name(value: u32) -> &'static str {
    lookup_any(CUBLASLT_EPILOGUE, value as i64).map_or("<unknown cublasLtEpilogue_t>", |e| e.abi.name)
}

/// Scale mode -> (granularity, scale format, storage of the scale grid); `None` for modes that
/// cannot be modeled and for unknown values.
pub fn scale_granularity_from_cublaslt_scale_mode(mode: i32) -> Option<ScaleMapping> {
    lookup_any(CUBLASLT_MATRIX_SCALE, mode as i64).and_then(|e| e.meaning)
}

/// Name of a `cublasLtMatmulMatrixScale_t` value for logs and skip reasons.
pub fn cublaslt_scale_mode_name(mode: i32) -> &'static str {
    lookup_any(CUBLASLT_MATRIX_SCALE, mode as i64)
        .map_or("<unknown cublasLtMatmulMatrixScale_t>", |e| e.abi.name)
}

/// The full scale description of one operand in cuBLAS `version`: `outer` is M for A and N for
/// B, `k` the inner extent. Leading dimensions follow the module doc; `None` if `version` does
/// not have the mode or it cannot be modeled.
pub fn cublaslt_scale_spec(version: LibVersion, mode: i32, outer: u64, k: u64) -> Option<ScaleSpec> {
    let (granularity, format, storage) = lookup(CUBLASLT_MATRIX_SCALE, version, mode as i64)?.meaning?;
    let ld = if mode == CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F {
        outer.checked_next_multiple_of(4)?
    } else if mode == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F {
        k.div_ceil(128).checked_next_multiple_of(4)?
    } else {
        0
    };
    Some(ScaleSpec { granularity, format, storage, ld, batch_stride: 0 })
}

/// `cublasLtPointerMode_t` -> where alpha and beta live.
pub fn pointer_mode_from_cublaslt(value: i32) -> Option<PointerMode> {
    lookup_any(CUBLASLT_POINTER_MODE, value as i64).map(|e| e.meaning)
}

/// Name of a matmul-descriptor attribute id in `version`.
pub fn desc_attribute_name(version: LibVersion, id: i32) -> Option<&'static str> {
    lookup(CUBLASLT_MATMUL_DESC_ATTRIBUTES, version, id as i64).map(|e| e.abi.name)
}
