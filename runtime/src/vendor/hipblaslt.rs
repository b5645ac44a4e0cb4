//! hipBLASLt (`hipblaslt/hipblaslt.h`) by release, keyed by `hipblasLtGetVersion()`
//! (major * 100000 + minor * 100 + patch).
//!
//! hipBLASLt releases and the ROCm releases that ship them (hipBLASLt `CHANGELOG.md` and the
//! `HIPBLASLT_VERSION_*` macros of each release's headers):
//!
//! | hipBLASLt | ROCm  | what changed in the tables below |
//! |-----------|-------|----------------------------------|
//! | 0.6       | 6.0   | pointer mode 1 = ALPHA_DEVICE_VECTOR_BETA_HOST |
//! | 0.7       | 6.1   | pointer modes DEVICE = 1, ALPHA_DEVICE_VECTOR_BETA_HOST = 4 |
//! | 0.8       | 6.2   | + AMAX_D_POINTER 14, COMPUTE_INPUT_TYPE_A/B_EXT 100/101 |
//! | 0.10      | 6.3   | + A/B_SCALE_POINTER_VEC_EXT 102/103 (per-row / per-column f32 vectors) |
//! | 0.12      | 6.4   | (same attributes as 0.10) |
//! | 1.0       | 7.0   | - *_VEC_EXT; + EPILOGUE_AUX_DATA_TYPE 22, A/B_SCALE_MODE 31/32, scale modes 0-5, orders COL16_4R* 100-103, SWISH epilogues |
//! | 1.1       | 7.1   | + EPILOGUE_ACT_ARG0/1_EXT reuse 102/103 (clamp bounds), RELU_AUX, CLAMP epilogues |
//! | 1.2       | 7.2   | + SIGMOID_EXT epilogues |
//! | 1.3-1.5   | later | development headers: BIAS_BATCH_STRIDE 23, BATCH_MODE / OFFSET layout attributes, EXT scale modes 1001-1005, SM_COUNT_TARGET 33, STREAMK 104, UNIFORM_SUMMATION_ORDER 105, FUSED_EPILOGUE 106 |
//!
//! So attribute 102 is A's scale *vector* on ROCm 6.3/6.4, nothing on 7.0, and a clamp bound
//! (a float) on 7.1+: decoding it without the run-time version reads garbage.
//!
//! Sources: bindgen output of the hipBLASLt headers of ROCm 6.0.2, 6.1.5, 6.2.4, 6.3.3, 6.4.3,
//! 7.0.2, 7.1.1, 7.2.1-7.2.3 (per-release `rocm-0XXYY` cfg features of a public bindings crate);
//! `ROCm/hipBLASLt` `library/include/hipblaslt.h` (0.10/0.12 era, with the VEC_EXT attributes)
//! and `library/include/hipblaslt/hipblaslt.h` (1.x, VEC_EXT turned into `static_assert`
//! macros); `ROCm/rocm-libraries` `projects/hipblaslt/library/include/hipblaslt/hipblaslt.h`
//! (development, 1.5.0) and `projects/hipblaslt/CHANGELOG.md`. Entries only in the development
//! header are dated by the changelog where it names them (1.3.0 general batched GEMM, 1.4.0
//! SM_COUNT_TARGET / STREAMK, 1.4.1 UNIFORM_SUMMATION_ORDER, 1.5.0 LAYOUT_OFFSET) and otherwise
//! to 1.3.0, the first release after the 1.2.x headers that lack them.
//!
//! hipBLASLt has no compute-type or scale-type attribute: both are arguments of
//! `hipblasLtMatmulDescCreate`, which the shim interposes to record them.
//!
//! Scale modes: hipBLASLt's header marks VEC16_UE4M3, VEC128_32F and BLK128x128_32F "Not
//! supported yet". VEC32_UE8M0 is supported on gfx950, but the storage of its scales (the
//! separate BLK32_UE8M0_32_8_EXT mode is the "pre-swizzled" one) has not been verified on an
//! AMD host, so it maps to `None` rather than to a guessed layout.

use super::{
    abi_table, lookup, AttrValue, EpilogueMapping, LayoutAttr, LibVersion, Library, MatmulDescAttr,
    PointerMode, ScaleMapping, VersionRange,
};
use crate::formats::Format;
use crate::problem::{Activation, Order, ScaleGranularity, ScaleStorage};

/// hipBLASLt 0.6 (ROCm 6.0).
pub const V0_6: LibVersion = LibVersion::new(0, 6, 0);
/// hipBLASLt 0.7 (ROCm 6.1).
pub const V0_7: LibVersion = LibVersion::new(0, 7, 0);
/// hipBLASLt 0.8 (ROCm 6.2).
pub const V0_8: LibVersion = LibVersion::new(0, 8, 0);
/// hipBLASLt 0.10 (ROCm 6.3).
pub const V0_10: LibVersion = LibVersion::new(0, 10, 0);
/// hipBLASLt 0.12 (ROCm 6.4).
pub const V0_12: LibVersion = LibVersion::new(0, 12, 0);
/// hipBLASLt 1.0 (ROCm 7.0).
pub const V1_0: LibVersion = LibVersion::new(1, 0, 0);
/// hipBLASLt 1.1 (ROCm 7.1).
pub const V1_1: LibVersion = LibVersion::new(1, 1, 0);
/// hipBLASLt 1.2 (ROCm 7.2).
pub const V1_2: LibVersion = LibVersion::new(1, 2, 0);

abi_table! {
    /// `hipblasLtMatmulDescAttributes_t`, every release from 0.6 on.
    pub const HIPBLASLT_MATMUL_DESC_ATTRIBUTES: [i32 => MatmulDescAttr] = {
        enum: "hipblasLtMatmulDescAttributes_t", library: HipBlasLt, header: "hipblaslt/hipblaslt.h";
        HIPBLASLT_MATMUL_DESC_TRANSA = 0 => MatmulDescAttr::TransA,
        HIPBLASLT_MATMUL_DESC_TRANSB = 1 => MatmulDescAttr::TransB,
        HIPBLASLT_MATMUL_DESC_EPILOGUE = 2 => MatmulDescAttr::Epilogue,
        HIPBLASLT_MATMUL_DESC_BIAS_POINTER = 3 => MatmulDescAttr::BiasPointer,
        HIPBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 4 => MatmulDescAttr::BiasDataType,
        HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER = 5 => MatmulDescAttr::AScalePointer,
        HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER = 6 => MatmulDescAttr::BScalePointer,
        HIPBLASLT_MATMUL_DESC_C_SCALE_POINTER = 7 => MatmulDescAttr::CScalePointer,
        HIPBLASLT_MATMUL_DESC_D_SCALE_POINTER = 8 => MatmulDescAttr::DScalePointer,
        HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER = 9 => MatmulDescAttr::EpilogueAuxScalePointer,
        HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER = 10 => MatmulDescAttr::EpilogueAuxPointer,
        HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD = 11 => MatmulDescAttr::EpilogueAuxLd,
        HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_BATCH_STRIDE = 12 => MatmulDescAttr::EpilogueAuxBatchStride,
        HIPBLASLT_MATMUL_DESC_POINTER_MODE = 13 => MatmulDescAttr::PointerMode,
        HIPBLASLT_MATMUL_DESC_AMAX_D_POINTER = 14 => MatmulDescAttr::AmaxDPointer; VersionRange::since(0, 8, 0),
        HIPBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE = 22
            => MatmulDescAttr::EpilogueAuxDataType; VersionRange::since(1, 0, 0),
        HIPBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE = 23 => MatmulDescAttr::BiasBatchStride; VersionRange::since(1, 3, 0),
        HIPBLASLT_MATMUL_DESC_A_SCALE_MODE = 31 => MatmulDescAttr::AScaleMode; VersionRange::since(1, 0, 0),
        HIPBLASLT_MATMUL_DESC_B_SCALE_MODE = 32 => MatmulDescAttr::BScaleMode; VersionRange::since(1, 0, 0),
        HIPBLASLT_MATMUL_DESC_SM_COUNT_TARGET = 33 => MatmulDescAttr::SmCountTarget; VersionRange::since(1, 4, 0),
        HIPBLASLT_MATMUL_DESC_COMPUTE_INPUT_TYPE_A_EXT = 100
            => MatmulDescAttr::ComputeInputTypeA; VersionRange::since(0, 8, 0),
        HIPBLASLT_MATMUL_DESC_COMPUTE_INPUT_TYPE_B_EXT = 101
            => MatmulDescAttr::ComputeInputTypeB; VersionRange::since(0, 8, 0),
        /// ROCm 6.3/6.4: "Equivalent to HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER but in vector".
        /// In 1.x the name is a `static_assert` macro.
        HIPBLASLT_MATMUL_DESC_A_SCALE_POINTER_VEC_EXT = 102
            => MatmulDescAttr::AScalePointerVec; VersionRange::between(V0_10, V1_0),
        HIPBLASLT_MATMUL_DESC_B_SCALE_POINTER_VEC_EXT = 103
            => MatmulDescAttr::BScalePointerVec; VersionRange::between(V0_10, V1_0),
        /// ROCm 7.1+: "First extra argument for the activation function", a float.
        HIPBLASLT_MATMUL_DESC_EPILOGUE_ACT_ARG0_EXT = 102
            => MatmulDescAttr::EpilogueActArg0; VersionRange::since(1, 1, 0),
        HIPBLASLT_MATMUL_DESC_EPILOGUE_ACT_ARG1_EXT = 103
            => MatmulDescAttr::EpilogueActArg1; VersionRange::since(1, 1, 0),
        HIPBLASLT_MATMUL_DESC_STREAMK_TILE_SCHEDULING_EXT = 104
            => MatmulDescAttr::StreamKTileScheduling; VersionRange::since(1, 4, 0),
        HIPBLASLT_MATMUL_DESC_UNIFORM_SUMMATION_ORDER_EXT = 105
            => MatmulDescAttr::UniformSummationOrder; VersionRange::since(1, 4, 1),
        HIPBLASLT_MATMUL_DESC_FUSED_EPILOGUE = 106 => MatmulDescAttr::FusedEpilogue; VersionRange::since(1, 5, 0),
    };
}

abi_table! {
    /// `hipblasLtMatrixLayoutAttribute_t` (numbered differently from cuBLASLt's).
    pub const HIPBLASLT_MATRIX_LAYOUT_ATTRIBUTES: [i32 => LayoutAttr] = {
        enum: "hipblasLtMatrixLayoutAttribute_t", library: HipBlasLt, header: "hipblaslt/hipblaslt.h";
        HIPBLASLT_MATRIX_LAYOUT_BATCH_COUNT = 0 => LayoutAttr::BatchCount,
        HIPBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET = 1 => LayoutAttr::StridedBatchOffset,
        HIPBLASLT_MATRIX_LAYOUT_TYPE = 2 => LayoutAttr::Type,
        HIPBLASLT_MATRIX_LAYOUT_ORDER = 3 => LayoutAttr::Order,
        HIPBLASLT_MATRIX_LAYOUT_ROWS = 4 => LayoutAttr::Rows,
        HIPBLASLT_MATRIX_LAYOUT_COLS = 5 => LayoutAttr::Cols,
        HIPBLASLT_MATRIX_LAYOUT_LD = 6 => LayoutAttr::Ld,
        HIPBLASLT_MATRIX_LAYOUT_BATCH_MODE = 7 => LayoutAttr::BatchMode; VersionRange::since(1, 3, 0),
        HIPBLASLT_MATRIX_LAYOUT_OFFSET = 8 => LayoutAttr::Offset; VersionRange::since(1, 5, 0),
    };
}

abi_table! {
    /// `hipblasLtOrder_t`: the COL16_4R* orders are pre-swizzled tiles (not modeled).
    pub const HIPBLASLT_ORDER: [i32 => Option<Order>] = {
        enum: "hipblasLtOrder_t", library: HipBlasLt, header: "hipblaslt/hipblaslt.h";
        HIPBLASLT_ORDER_COL = 0 => Some(Order::ColMajor),
        HIPBLASLT_ORDER_ROW = 1 => Some(Order::RowMajor),
        HIPBLASLT_ORDER_COL16_4R32 = 99 => None; VersionRange::since(1, 5, 0),
        HIPBLASLT_ORDER_COL16_4R16 = 100 => None; VersionRange::since(1, 0, 0),
        HIPBLASLT_ORDER_COL16_4R8 = 101 => None; VersionRange::since(1, 0, 0),
        HIPBLASLT_ORDER_COL16_4R4 = 102 => None; VersionRange::since(1, 0, 0),
        HIPBLASLT_ORDER_COL16_4R2 = 103 => None; VersionRange::since(1, 0, 0),
    };
}

abi_table! {
    /// `hipblasLtEpilogue_t`. Values shared with cuBLASLt mean the same; the `_EXT` activations
    /// (swish, clamp, sigmoid) are not modeled. Development headers after 1.2 renumber the
    /// sigmoid epilogue (1024): not listed until a release carries it.
    pub const HIPBLASLT_EPILOGUE: [u32 => Option<EpilogueMapping>] = {
        enum: "hipblasLtEpilogue_t", library: HipBlasLt, header: "hipblaslt/hipblaslt.h";
        HIPBLASLT_EPILOGUE_DEFAULT = 1 => Some(EpilogueMapping::new(Activation::None, false, false)),
        HIPBLASLT_EPILOGUE_RELU = 2 => Some(EpilogueMapping::new(Activation::Relu, false, false)),
        HIPBLASLT_EPILOGUE_BIAS = 4 => Some(EpilogueMapping::new(Activation::None, true, false)),
        HIPBLASLT_EPILOGUE_RELU_BIAS = 6 => Some(EpilogueMapping::new(Activation::Relu, true, false)),
        HIPBLASLT_EPILOGUE_GELU = 32 => Some(EpilogueMapping::new(Activation::GeluTanh, false, false)),
        HIPBLASLT_EPILOGUE_GELU_BIAS = 36 => Some(EpilogueMapping::new(Activation::GeluTanh, true, false)),
        HIPBLASLT_EPILOGUE_RELU_AUX = 130
            => Some(EpilogueMapping::new(Activation::Relu, false, true)); VersionRange::since(1, 1, 0),
        HIPBLASLT_EPILOGUE_RELU_AUX_BIAS = 134
            => Some(EpilogueMapping::new(Activation::Relu, true, true)); VersionRange::since(1, 1, 0),
        HIPBLASLT_EPILOGUE_GELU_AUX = 160 => Some(EpilogueMapping::new(Activation::GeluTanh, false, true)),
        HIPBLASLT_EPILOGUE_GELU_AUX_BIAS = 164 => Some(EpilogueMapping::new(Activation::GeluTanh, true, true)),
        HIPBLASLT_EPILOGUE_DGELU = 192 => None,
        HIPBLASLT_EPILOGUE_DGELU_BGRAD = 208 => None,
        HIPBLASLT_EPILOGUE_BGRADA = 256 => Some(EpilogueMapping::new(Activation::None, false, true)),
        HIPBLASLT_EPILOGUE_BGRADB = 512 => Some(EpilogueMapping::new(Activation::None, false, true)),
        HIPBLASLT_EPILOGUE_SWISH_EXT = 65536 => None; VersionRange::since(1, 0, 0),
        HIPBLASLT_EPILOGUE_SWISH_BIAS_EXT = 65540 => None; VersionRange::since(1, 0, 0),
        HIPBLASLT_EPILOGUE_CLAMP_EXT = 131072 => None; VersionRange::since(1, 1, 0),
        HIPBLASLT_EPILOGUE_CLAMP_BIAS_EXT = 131076 => None; VersionRange::since(1, 1, 0),
        HIPBLASLT_EPILOGUE_CLAMP_AUX_EXT = 131200 => None; VersionRange::since(1, 1, 0),
        HIPBLASLT_EPILOGUE_CLAMP_AUX_BIAS_EXT = 131204 => None; VersionRange::since(1, 1, 0),
        HIPBLASLT_EPILOGUE_SIGMOID_EXT = 262144 => None; VersionRange::since(1, 2, 0),
        HIPBLASLT_EPILOGUE_SIGMOID_BIAS_EXT = 262148 => None; VersionRange::since(1, 2, 0),
    };
}

abi_table! {
    /// `hipblasLtMatmulMatrixScale_t` (value of A/B_SCALE_MODE, hipBLASLt >= 1.0).
    pub const HIPBLASLT_MATRIX_SCALE: [i32 => Option<ScaleMapping>] = {
        enum: "hipblasLtMatmulMatrixScale_t", library: HipBlasLt, header: "hipblaslt/hipblaslt.h";
        HIPBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F = 0
            => Some((ScaleGranularity::Tensor, Format::F32, ScaleStorage::OuterMajor)); VersionRange::since(1, 0, 0),
        HIPBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 = 1 => None; VersionRange::since(1, 0, 0),
        HIPBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0 = 2 => None; VersionRange::since(1, 0, 0),
        HIPBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F = 3
            => Some((ScaleGranularity::PerOuter, Format::F32, ScaleStorage::OuterMajor));
            VersionRange::since(1, 0, 0),
        HIPBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F = 4 => None; VersionRange::since(1, 0, 0),
        HIPBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F = 5 => None; VersionRange::since(1, 0, 0),
        /// "pre-swizzled to match the memory access pattern expected by the kernel". Listed
        /// under 1.2.0 in the changelog but absent from the ROCm 7.2.x headers.
        HIPBLASLT_MATMUL_MATRIX_SCALE_BLK32_UE8M0_32_8_EXT = 1001 => None; VersionRange::since(1, 3, 0),
        HIPBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE8M0_EXT = 1002 => None; VersionRange::since(1, 3, 0),
        HIPBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE4M3_EXT = 1003 => None; VersionRange::since(1, 3, 0),
        HIPBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE5M3_EXT = 1004 => None; VersionRange::since(1, 3, 0),
        HIPBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE5M3_EXT = 1005 => None; VersionRange::since(1, 3, 0),
    };
}

abi_table! {
    /// `hipblasLtPointerMode_t`: value 1 changed meaning after hipBLASLt 0.6 (ROCm 6.0).
    pub const HIPBLASLT_POINTER_MODE: [i32 => PointerMode] = {
        enum: "hipblasLtPointerMode_t", library: HipBlasLt, header: "hipblaslt/hipblaslt.h";
        HIPBLASLT_POINTER_MODE_HOST = 0 => PointerMode::Host,
        HIPBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST_V0_6 as "HIPBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST"
            = 1 => PointerMode::AlphaDeviceVectorBetaHost; VersionRange::between(V0_6, V0_7),
        HIPBLASLT_POINTER_MODE_DEVICE = 1 => PointerMode::Device; VersionRange::since(0, 7, 0),
        HIPBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST = 4
            => PointerMode::AlphaDeviceVectorBetaHost; VersionRange::since(0, 7, 0),
    };
}

abi_table! {
    /// `hipblasLtBatchMode_t` (value of `HIPBLASLT_MATRIX_LAYOUT_BATCH_MODE`).
    pub const HIPBLASLT_BATCH_MODE: [i32 => ()] = {
        enum: "hipblasLtBatchMode_t", library: HipBlasLt, header: "hipblaslt/hipblaslt.h";
        HIPBLASLT_BATCH_MODE_STRIDED = 0; VersionRange::since(1, 3, 0),
        HIPBLASLT_BATCH_MODE_POINTER_ARRAY = 1; VersionRange::since(1, 3, 0),
    };
}

abi_table! {
    /// Sizes of the semi-opaque structs, identical in every release read.
    pub const HIPBLASLT_SIZES: [usize => ()] = {
        enum: "sizeof", library: HipBlasLt, header: "hipblaslt/hipblaslt.h";
        /// `uint8_t data[16]; size_t max_workspace_bytes;`.
        SIZEOF_HIPBLASLT_MATMUL_ALGO as "sizeof(hipblasLtMatmulAlgo_t)" = 24,
        SIZEOF_HIPBLASLT_MATMUL_DESC_OPAQUE as "sizeof(hipblasLtMatmulDescOpaque_t)" = 32,
        SIZEOF_HIPBLASLT_MATRIX_LAYOUT_OPAQUE as "sizeof(hipblasLtMatrixLayoutOpaque_t)" = 32,
        SIZEOF_HIPBLASLT_MATMUL_PREFERENCE_OPAQUE as "sizeof(hipblasLtMatmulPreferenceOpaque_t)" = 40,
    };
}

/// `hipblasLtMatmulAlgo_t`: `uint8_t data[16]; size_t max_workspace_bytes;`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HipblasLtMatmulAlgo {
    pub data: [u8; 16],
    pub max_workspace_bytes: usize,
}

const _: () = {
    assert!(std::mem::size_of::<HipblasLtMatmulAlgo>() == SIZEOF_HIPBLASLT_MATMUL_ALGO);
    // Epilogues hipBLASLt shares with cuBLASLt carry the same numbers.
    assert!(HIPBLASLT_EPILOGUE_DEFAULT == super::cublaslt::CUBLASLT_EPILOGUE_DEFAULT);
    assert!(HIPBLASLT_EPILOGUE_RELU_BIAS == super::cublaslt::CUBLASLT_EPILOGUE_RELU_BIAS);
    assert!(HIPBLASLT_EPILOGUE_RELU_AUX_BIAS == super::cublaslt::CUBLASLT_EPILOGUE_RELU_AUX_BIAS);
    assert!(HIPBLASLT_EPILOGUE_GELU_AUX_BIAS == super::cublaslt::CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
    assert!(HIPBLASLT_EPILOGUE_DGELU_BGRAD == super::cublaslt::CUBLASLT_EPILOGUE_DGELU_BGRAD);
    assert!(HIPBLASLT_EPILOGUE_BGRADB == super::cublaslt::CUBLASLT_EPILOGUE_BGRADB);
    // The scale modes hipBLASLt copied from cuBLASLt keep cuBLASLt's numbers.
    assert!(
        HIPBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
            == super::cublaslt::CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F
    );
    assert!(
        HIPBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
            == super::cublaslt::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
    );
    // ...and the scale-mode attributes too, unlike every other descriptor attribute.
    assert!(HIPBLASLT_MATMUL_DESC_A_SCALE_MODE == super::cublaslt::CUBLASLT_MATMUL_DESC_A_SCALE_MODE);
    assert!(HIPBLASLT_MATMUL_DESC_B_SCALE_MODE == super::cublaslt::CUBLASLT_MATMUL_DESC_B_SCALE_MODE);
};

/// `HIPBLASLT_DATATYPE_INVALID` (`#define ... static_cast<hipDataType>(255)` in hipblaslt.h,
/// ROCm 6.x and 7.x): the value BIAS_DATA_TYPE holds when the caller never set it.
pub const HIPBLASLT_DATATYPE_INVALID: i32 = 255;

/// The hipBLASLt version `hipblasLtGetVersion` reports, if the tables describe it.
pub fn hipblaslt_version(raw: i32) -> Option<LibVersion> {
    LibVersion::from_hipblaslt_raw(raw).filter(|v| *v >= Library::HipBlasLt.min_supported())
}

/// The matmul-descriptor attribute `id` means in hipBLASLt `version`.
pub fn desc_attribute(version: LibVersion, id: i32) -> Option<MatmulDescAttr> {
    lookup(HIPBLASLT_MATMUL_DESC_ATTRIBUTES, version, id as i64).map(|e| e.meaning)
}

/// The hipBLASLt id of a matmul-descriptor attribute in `version`.
pub fn desc_attribute_id(version: LibVersion, attr: MatmulDescAttr) -> Option<i32> {
    HIPBLASLT_MATMUL_DESC_ATTRIBUTES
        .iter()
        .find(|e| e.meaning == attr && e.abi.range.contains(version))
        .map(|e| e.abi.value as i32)
}

/// Name of a matmul-descriptor attribute id in `version` (102 is `..._A_SCALE_POINTER_VEC_EXT`
/// on 0.10/0.12 and `..._EPILOGUE_ACT_ARG0_EXT` from 1.1).
pub fn desc_attribute_name(version: LibVersion, id: i32) -> Option<&'static str> {
    lookup(HIPBLASLT_MATMUL_DESC_ATTRIBUTES, version, id as i64).map(|e| e.abi.name)
}

/// The matrix-layout attribute `id` means in hipBLASLt `version`.
pub fn layout_attribute(version: LibVersion, id: i32) -> Option<LayoutAttr> {
    lookup(HIPBLASLT_MATRIX_LAYOUT_ATTRIBUTES, version, id as i64).map(|e| e.meaning)
}

/// The hipBLASLt id of a layout attribute in `version`.
pub fn layout_attribute_id(version: LibVersion, attr: LayoutAttr) -> Option<i32> {
    HIPBLASLT_MATRIX_LAYOUT_ATTRIBUTES
        .iter()
        .find(|e| e.meaning == attr && e.abi.range.contains(version))
        .map(|e| e.abi.value as i32)
}

/// C type of a hipBLASLt matmul-descriptor attribute value (from the comments in
/// hipblaslt.h). `None` for cuBLASLt-only attributes. Note BIAS_BATCH_STRIDE is `int32_t` here
/// and `int64_t` in cuBLASLt.
pub fn desc_attribute_value(attr: MatmulDescAttr) -> Option<AttrValue> {
    use MatmulDescAttr::*;
    Some(match attr {
        TransA
        | TransB
        | PointerMode
        | BiasDataType
        | EpilogueAuxDataType
        | AScaleMode
        | BScaleMode
        | ComputeInputTypeA
        | ComputeInputTypeB
        | BiasBatchStride
        | SmCountTarget
        | StreamKTileScheduling
        | UniformSummationOrder => AttrValue::I32,
        Epilogue => AttrValue::U32,
        EpilogueAuxLd | EpilogueAuxBatchStride => AttrValue::I64,
        BiasPointer
        | AScalePointer
        | BScalePointer
        | CScalePointer
        | DScalePointer
        | EpilogueAuxScalePointer
        | EpilogueAuxPointer
        | AmaxDPointer
        | AScalePointerVec
        | BScalePointerVec => AttrValue::Ptr,
        EpilogueActArg0 | EpilogueActArg1 => AttrValue::F32,
        FusedEpilogue => AttrValue::Handle,
        ComputeType
        | ScaleType
        | TransC
        | FillMode
        | EpilogueAuxAmaxPointer
        | EpilogueAuxScaleMode
        | AlphaVectorBatchStride
        | FastAccum
        | AtomicSyncNumChunksDRows
        | AtomicSyncNumChunksDCols
        | AtomicSyncInCountersPointer
        | AtomicSyncOutCountersPointer
        | CScaleMode
        | DScaleMode
        | DOutScalePointer
        | DOutScaleMode
        | EmulationDescriptor => return None,
    })
}

/// C type of a hipBLASLt matrix-layout attribute value.
pub fn layout_attribute_value(attr: LayoutAttr) -> Option<AttrValue> {
    Some(match attr {
        LayoutAttr::BatchCount | LayoutAttr::Order | LayoutAttr::BatchMode => AttrValue::I32,
        LayoutAttr::Type => AttrValue::U32,
        LayoutAttr::StridedBatchOffset | LayoutAttr::Ld | LayoutAttr::Offset => AttrValue::I64,
        LayoutAttr::Rows | LayoutAttr::Cols => AttrValue::U64,
        LayoutAttr::PlaneOffset => return None,
    })
}

/// `hipblasLtOrder_t` -> `Order` in `version`.
pub fn order_from_hipblaslt(version: LibVersion, value: i32) -> Option<Order> {
    lookup(HIPBLASLT_ORDER, version, value as i64).and_then(|e| e.meaning)
}

/// `hipblasLtEpilogue_t` -> activation, bias and aux output in `version`; `None` for gradient,
/// `_EXT` and unknown epilogues.
pub fn epilogue_from_hipblaslt(version: LibVersion, value: u32) -> Option<EpilogueMapping> {
    lookup(HIPBLASLT_EPILOGUE, version, value as i64).and_then(|e| e.meaning)
}

/// Name of a `hipblasLtEpilogue_t` value in `version`.
pub fn hipblaslt_epilogue_name(version: LibVersion, value: u32) -> &'static str {
    lookup(HIPBLASLT_EPILOGUE, version, value as i64).map_or("<unknown hipblasLtEpilogue_t>", |e| e.abi.name)
}

/// hipBLASLt scale mode -> (granularity, format, storage) in `version`; `None` for modes that
/// are unsupported by hipBLASLt, unverified (VEC32_UE8M0) or unknown.
pub fn scale_granularity_from_hipblaslt_scale_mode(version: LibVersion, mode: i32) -> Option<ScaleMapping> {
    lookup(HIPBLASLT_MATRIX_SCALE, version, mode as i64).and_then(|e| e.meaning)
}

/// The per-row (A) / per-column (B) f32 scales of the 0.10/0.12 `*_SCALE_POINTER_VEC_EXT`
/// attributes: the same contract as OUTER_VEC_32F.
pub const SCALE_POINTER_VEC_EXT_MAPPING: ScaleMapping =
    (ScaleGranularity::PerOuter, Format::F32, ScaleStorage::OuterMajor);

/// Name of a `hipblasLtMatmulMatrixScale_t` value in `version`.
pub fn hipblaslt_scale_mode_name(version: LibVersion, mode: i32) -> &'static str {
    lookup(HIPBLASLT_MATRIX_SCALE, version, mode as i64)
        .map_or("<unknown hipblasLtMatmulMatrixScale_t>", |e| e.abi.name)
}

/// `hipblasLtPointerMode_t` -> where alpha and beta live, in `version`.
pub fn pointer_mode_from_hipblaslt(version: LibVersion, value: i32) -> Option<PointerMode> {
    lookup(HIPBLASLT_POINTER_MODE, version, value as i64).map(|e| e.meaning)
}
