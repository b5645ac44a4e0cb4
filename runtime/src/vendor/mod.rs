//! Vendor ABI: one definition of every vendor constant quantshadow depends on, the library
//! versions each one exists in, and the mappings from vendor enums onto the problem model.
//!
//! Every constant is declared once, through the `abi_table!` macro, which produces both the named Rust
//! constant (spelled exactly as the C identifier, with a generated doc line naming its header)
//! and an entry in a per-C-enum table. The tables drive:
//! - decoding by the library version read at run time (`cublasLtGetVersion`,
//!   `hipblasLtGetVersion`, ...): a value is looked up among the entries whose [`VersionRange`]
//!   contains that version, so a number whose meaning changed between releases (hipBLASLt
//!   matmul-descriptor attributes 102/103, hipBLASLt pointer mode 1) decodes correctly;
//! - names for logs and skip reasons ("skipped: CUBLASLT_EPILOGUE_DGELU (192)");
//! - the ABI check against real headers ([`abi`]): the C programs under `tests/abi/` are
//!   generated from these tables, print `name value` for every entry that exists in the
//!   header version they are compiled against, and the dump is compared with the tables.
//!
//! A `since` bound is the documented introduction of a constant where one was found, otherwise
//! the earliest header that was read and contains it (each table says which). A `since` that is
//! later than the truth cannot produce a false mismatch, only a check that is skipped on older
//! headers and an "unknown value" name on older libraries.
//!
//! Headers read (see each module for the exact files):
//! - NVIDIA: CUDA 13.0.88 toolkit `include/` (cuBLAS 13.1.0.3) copied from the H200 host;
//!   cuBLAS 12.8 via `coreylowman/cudarc` `src/cublaslt/sys/sys_12080.rs` (bindgen output).
//! - AMD: hipBLASLt headers of ROCm 6.0.2, 6.1.5, 6.2.4, 6.3.3, 6.4.3, 7.0.2, 7.1.1, 7.2.1-7.2.3
//!   through per-release bindgen output (version-gated `rocm-0XXYY` features) in a public
//!   bindings crate; `ROCm/hipBLASLt` `library/include/hipblaslt.h` (0.10/0.12 era) and
//!   `library/include/hipblaslt/hipblaslt.h` (1.x); `ROCm/rocm-libraries`
//!   `projects/hipblaslt/library/include/hipblaslt/hipblaslt.h` (development, 1.5.0) and its
//!   `CHANGELOG.md`; `projects/rocblas/library/include/internal/rocblas-types.h`;
//!   `projects/hipblas/CHANGELOG.md`.

use std::fmt;

pub mod abi;
pub mod cublas;
pub mod cublaslt;
pub mod cuda_driver;
pub mod data_type;
pub mod hipblas;
pub mod hipblaslt;
pub mod rocblas;

/// A library version as major.minor.patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LibVersion {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl LibVersion {
    pub const fn new(major: u32, minor: u32, patch: u32) -> LibVersion {
        LibVersion { major, minor, patch }
    }

    /// `cublasLtGetVersion()` / `CUBLAS_VERSION` (cuBLAS >= 12: major * 10000 + minor * 100 +
    /// patch; 130100 was read from cuBLAS 13.1.0 on the H200 host). cuBLAS 11 used
    /// major * 1000 + minor * 100 + patch, which is ambiguous for minor >= 10 (11.11.3 reads as
    /// 12103): anything below 12.0.0 is refused.
    pub fn from_cublas_raw(raw: usize) -> Option<LibVersion> {
        if raw < 120_000 {
            return None;
        }
        Some(LibVersion::new((raw / 10_000) as u32, (raw / 100 % 100) as u32, (raw % 100) as u32))
    }

    /// `CUDA_VERSION` (cuda.h) and `cuDriverGetVersion`: major * 1000 + minor * 10.
    pub fn from_cuda_raw(raw: i32) -> Option<LibVersion> {
        if raw <= 0 {
            return None;
        }
        Some(LibVersion::new((raw / 1000) as u32, (raw % 1000 / 10) as u32, 0))
    }

    /// `hipblasLtGetVersion(handle, &v)`: major * 100000 + minor * 100 + patch (hipBLASLt's
    /// `library/src/amd_detail/hipblaslt.cpp`).
    pub fn from_hipblaslt_raw(raw: i32) -> Option<LibVersion> {
        if raw < 0 {
            return None;
        }
        let raw = raw as u32;
        Some(LibVersion::new(raw / 100_000, raw / 100 % 1000, raw % 100))
    }

    /// `HIP_VERSION` / `hipRuntimeGetVersion`: major * 10000000 + minor * 100000 + patch.
    pub fn from_hip_raw(raw: i32) -> Option<LibVersion> {
        if raw <= 0 {
            return None;
        }
        let raw = raw as u32;
        Some(LibVersion::new(raw / 10_000_000, raw / 100_000 % 100, raw % 100_000))
    }
}

impl fmt::Display for LibVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// Versions `[since, until)` of a library in which a constant exists with the given value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VersionRange {
    pub since: Option<LibVersion>,
    /// Exclusive.
    pub until: Option<LibVersion>,
}

impl VersionRange {
    /// In every supported version of the library (see [`Library::min_supported`]).
    pub const ALWAYS: VersionRange = VersionRange { since: None, until: None };

    pub const fn since(major: u32, minor: u32, patch: u32) -> VersionRange {
        VersionRange { since: Some(LibVersion::new(major, minor, patch)), until: None }
    }

    pub const fn until(major: u32, minor: u32, patch: u32) -> VersionRange {
        VersionRange { since: None, until: Some(LibVersion::new(major, minor, patch)) }
    }

    pub const fn between(since: LibVersion, until: LibVersion) -> VersionRange {
        VersionRange { since: Some(since), until: Some(until) }
    }

    pub fn contains(&self, v: LibVersion) -> bool {
        self.since.is_none_or(|s| v >= s) && self.until.is_none_or(|u| v < u)
    }

    /// Whether some version lies in both ranges.
    pub fn overlaps(&self, other: &VersionRange) -> bool {
        let lo = match (self.since, other.since) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        let hi = match (self.until, other.until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match (lo, hi) {
            (Some(lo), Some(hi)) => lo < hi,
            _ => true,
        }
    }
}

impl fmt::Display for VersionRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.since, self.until) {
            (None, None) => f.write_str("all supported versions"),
            (Some(s), None) => write!(f, ">= {s}"),
            (None, Some(u)) => write!(f, "< {u}"),
            (Some(s), Some(u)) => write!(f, ">= {s}, < {u}"),
        }
    }
}

/// Which vendor side a library belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    Cuda,
    Hip,
}

impl Side {
    pub fn name(self) -> &'static str {
        match self {
            Side::Cuda => "cuda",
            Side::Hip => "hip",
        }
    }
}

/// The library whose version governs a constant (the header it comes from ships with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Library {
    /// CUDA toolkit headers `cuda.h` and `library_types.h`; version from `CUDA_VERSION` /
    /// `cuDriverGetVersion`.
    CudaToolkit,
    /// cuBLAS and cuBLASLt (`cublas_api.h`, `cublasLt.h`); version from `cublasLtGetVersion`.
    Cublas,
    /// HIP headers (`hip/library_types.h`) and `hipblas-common.h`, which ship with each ROCm
    /// release; version from `hipRuntimeGetVersion` (major.minor only).
    Hip,
    /// `hipblaslt/hipblaslt.h`; version from `hipblasLtGetVersion`.
    HipBlasLt,
    /// `hipblas/hipblas.h`; version from the `hipblasVersion*` macros / `hipblasGetVersion`.
    HipBlas,
    /// `rocblas/internal/rocblas-types.h`; version from `rocblas_get_version_string`.
    RocBlas,
}

impl Library {
    pub const ALL: [Library; 6] = [
        Library::CudaToolkit,
        Library::Cublas,
        Library::Hip,
        Library::HipBlasLt,
        Library::HipBlas,
        Library::RocBlas,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Library::CudaToolkit => "CUDA",
            Library::Cublas => "cuBLAS",
            Library::Hip => "HIP",
            Library::HipBlasLt => "hipBLASLt",
            Library::HipBlas => "hipBLAS",
            Library::RocBlas => "rocBLAS",
        }
    }

    pub fn side(self) -> Side {
        match self {
            Library::CudaToolkit | Library::Cublas => Side::Cuda,
            _ => Side::Hip,
        }
    }

    /// The oldest version whose ABI the tables describe; [`VersionRange::ALWAYS`] means "from
    /// this version on". Older libraries are refused by the version-keyed decoders.
    pub fn min_supported(self) -> LibVersion {
        match self {
            Library::CudaToolkit => LibVersion::new(12, 0, 0),
            Library::Cublas => LibVersion::new(12, 0, 0),
            // ROCm 6.0: hipBLASLt 0.6 replaced hipblasLtComputeType_t with hipblasComputeType_t
            // and hipblasDatatype_t with hipDataType (hipBLASLt CHANGELOG 0.6.0).
            Library::Hip => LibVersion::new(6, 0, 0),
            Library::HipBlasLt => LibVersion::new(0, 6, 0),
            Library::HipBlas => LibVersion::new(2, 0, 0),
            Library::RocBlas => LibVersion::new(4, 0, 0),
        }
    }
}

/// One constant of a vendor header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbiConst {
    /// The C identifier (or C expression for sizes, e.g. `sizeof(cublasLtMatmulAlgo_t)`),
    /// exactly as the ABI check prints it.
    pub name: &'static str,
    pub value: i64,
    /// The C enum (typedef) or macro group the constant belongs to.
    pub enum_name: &'static str,
    pub header: &'static str,
    pub library: Library,
    pub range: VersionRange,
}

/// A table row: the constant and what it means to quantshadow.
#[derive(Debug, Clone, Copy)]
pub struct Entry<M: 'static> {
    pub abi: AbiConst,
    pub meaning: M,
}

/// The entry of `table` with `value` that exists in `version`.
pub fn lookup<M>(table: &'static [Entry<M>], version: LibVersion, value: i64) -> Option<&'static Entry<M>> {
    table.iter().find(|e| e.abi.value == value && e.abi.range.contains(version))
}

/// The first entry of `table` with `value` in any version: for enums whose values are never
/// reused (checked by the tests). Aliases (two names, one value) resolve to the first listed.
pub fn lookup_any<M>(table: &'static [Entry<M>], value: i64) -> Option<&'static Entry<M>> {
    table.iter().find(|e| e.abi.value == value)
}

/// `NAME (value)` of the entry valid in `version`, or `unknown <enum> value <value> (<lib>
/// <version>)`.
pub fn describe<M>(table: &'static [Entry<M>], version: LibVersion, value: i64) -> String {
    match lookup(table, version, value) {
        Some(e) => format!("{} ({})", e.abi.name, value),
        None => match table.first() {
            Some(first) => format!(
                "unknown {} value {} ({} {})",
                first.abi.enum_name,
                value,
                first.abi.library.name(),
                version
            ),
            None => format!("unknown value {value}"),
        },
    }
}

/// Declares vendor constants and the table of one C enum in one place.
///
/// ```text
/// abi_table! {
///     /// doc of the table
///     pub const TABLE: [i32 => Meaning] = {
///         enum: "cEnum_t", library: Cublas, header: "cublasLt.h";
///         C_NAME = 3 => meaning,
///         RUST_NAME as "C_NAME" = 4 => meaning; VersionRange::since(12, 8, 0),
///     };
/// }
/// ```
/// `=> meaning` may be left out for tables of `()`; `; range` defaults to
/// [`VersionRange::ALWAYS`]; `as "C name"` gives the printed name where the Rust name must
/// differ (the same C name with a different value in another version range, or `sizeof(T)`).
macro_rules! abi_table {
    (@name $name:ident) => { stringify!($name) };
    (@name $name:ident $cname:literal) => { $cname };
    (@range) => { $crate::vendor::VersionRange::ALWAYS };
    (@range $r:expr) => { $r };
    (@meaning) => { () };
    (@meaning $m:expr) => { $m };
    (
        $(#[$tmeta:meta])*
        pub const $table:ident: [$cty:ty => $mty:ty] = {
            enum: $enum_name:literal, library: $lib:ident, header: $header:literal;
            $(
                $(#[$meta:meta])*
                $name:ident $(as $cname:literal)? = $value:expr $(=> $meaning:expr)? $(; $range:expr)?,
            )*
        };
    ) => {
        $(
            #[doc = concat!("`", abi_table!(@name $name $($cname)?), "` (", $enum_name, "), from `", $header, "`.")]
            $(#[$meta])*
            #[allow(non_upper_case_globals)]
            pub const $name: $cty = $value;
        )*
        $(#[$tmeta])*
        pub const $table: &[$crate::vendor::Entry<$mty>] = &[
            $(
                $crate::vendor::Entry {
                    abi: $crate::vendor::AbiConst {
                        name: abi_table!(@name $name $($cname)?),
                        value: $name as i64,
                        enum_name: $enum_name,
                        header: $header,
                        library: $crate::vendor::Library::$lib,
                        range: abi_table!(@range $($range)?),
                    },
                    meaning: abi_table!(@meaning $($meaning)?),
                },
            )*
        ];
    };
}
pub(crate) use abi_table;

/// Every table of one side, as plain constants: what the ABI check prints and compares.
pub fn side_tables(side: Side) -> Vec<(&'static str, Vec<&'static AbiConst>)> {
    fn t<M>(name: &'static str, table: &'static [Entry<M>]) -> (&'static str, Vec<&'static AbiConst>) {
        (name, table.iter().map(|e| &e.abi).collect())
    }
    match side {
        Side::Cuda => vec![
            t("CUDA_DATA_TYPE", data_type::CUDA_DATA_TYPE),
            t("CUBLAS_STATUS", cublas::CUBLAS_STATUS),
            t("CUBLAS_OPERATION", cublas::CUBLAS_OPERATION),
            t("CUBLAS_FILL_MODE", cublas::CUBLAS_FILL_MODE),
            t("CUBLAS_POINTER_MODE", cublas::CUBLAS_POINTER_MODE),
            t("CUBLAS_COMPUTE_TYPE", cublas::CUBLAS_COMPUTE_TYPE),
            t("CUBLAS_MATH", cublas::CUBLAS_MATH),
            t("CUBLAS_GEMM_ALGO", cublas::CUBLAS_GEMM_ALGO),
            t("CUBLASLT_MATMUL_DESC_ATTRIBUTES", cublaslt::CUBLASLT_MATMUL_DESC_ATTRIBUTES),
            t("CUBLASLT_MATRIX_LAYOUT_ATTRIBUTES", cublaslt::CUBLASLT_MATRIX_LAYOUT_ATTRIBUTES),
            t("CUBLASLT_ORDER", cublaslt::CUBLASLT_ORDER),
            t("CUBLASLT_BATCH_MODE", cublaslt::CUBLASLT_BATCH_MODE),
            t("CUBLASLT_EPILOGUE", cublaslt::CUBLASLT_EPILOGUE),
            t("CUBLASLT_MATRIX_SCALE", cublaslt::CUBLASLT_MATRIX_SCALE),
            t("CUBLASLT_POINTER_MODE", cublaslt::CUBLASLT_POINTER_MODE),
            t("CUBLASLT_SIZES", cublaslt::CUBLASLT_SIZES),
            t("CU_RESULT", cuda_driver::CU_RESULT),
            t("CU_STREAM_CAPTURE_STATUS", cuda_driver::CU_STREAM_CAPTURE_STATUS),
            t("CU_STREAM_CAPTURE_MODE", cuda_driver::CU_STREAM_CAPTURE_MODE),
            t("CU_STREAM_FLAGS", cuda_driver::CU_STREAM_FLAGS),
            t("CU_EVENT_FLAGS", cuda_driver::CU_EVENT_FLAGS),
            t("CU_MEMHOSTALLOC", cuda_driver::CU_MEMHOSTALLOC),
            t("CU_JIT_OPTION", cuda_driver::CU_JIT_OPTION),
            t("CU_DEVICE_ATTRIBUTE", cuda_driver::CU_DEVICE_ATTRIBUTE),
            t("CU_POINTER_ATTRIBUTE", cuda_driver::CU_POINTER_ATTRIBUTE),
            t("CU_MEMORYTYPE", cuda_driver::CU_MEMORYTYPE),
            t("CU_GET_PROC_ADDRESS_FLAGS", cuda_driver::CU_GET_PROC_ADDRESS_FLAGS),
            t("CU_GET_PROC_ADDRESS_RESULT", cuda_driver::CU_GET_PROC_ADDRESS_RESULT),
            t("CUDA_DRIVER_SIZES", cuda_driver::CUDA_DRIVER_SIZES),
        ],
        Side::Hip => vec![
            t("HIP_DATA_TYPE", data_type::HIP_DATA_TYPE),
            t("HIPBLAS_STATUS", hipblas::HIPBLAS_STATUS),
            t("HIPBLAS_OPERATION", hipblas::HIPBLAS_OPERATION),
            t("HIPBLAS_POINTER_MODE", hipblas::HIPBLAS_POINTER_MODE),
            t("HIPBLAS_COMPUTE_TYPE", hipblas::HIPBLAS_COMPUTE_TYPE),
            t("HIPBLAS_DATATYPE", hipblas::HIPBLAS_DATATYPE),
            t("HIPBLASLT_MATMUL_DESC_ATTRIBUTES", hipblaslt::HIPBLASLT_MATMUL_DESC_ATTRIBUTES),
            t("HIPBLASLT_MATRIX_LAYOUT_ATTRIBUTES", hipblaslt::HIPBLASLT_MATRIX_LAYOUT_ATTRIBUTES),
            t("HIPBLASLT_ORDER", hipblaslt::HIPBLASLT_ORDER),
            t("HIPBLASLT_EPILOGUE", hipblaslt::HIPBLASLT_EPILOGUE),
            t("HIPBLASLT_MATRIX_SCALE", hipblaslt::HIPBLASLT_MATRIX_SCALE),
            t("HIPBLASLT_POINTER_MODE", hipblaslt::HIPBLASLT_POINTER_MODE),
            t("HIPBLASLT_BATCH_MODE", hipblaslt::HIPBLASLT_BATCH_MODE),
            t("HIPBLASLT_SIZES", hipblaslt::HIPBLASLT_SIZES),
            t("ROCBLAS_STATUS", rocblas::ROCBLAS_STATUS),
            t("ROCBLAS_OPERATION", rocblas::ROCBLAS_OPERATION),
            t("ROCBLAS_DATATYPE", rocblas::ROCBLAS_DATATYPE),
            t("ROCBLAS_COMPUTETYPE", rocblas::ROCBLAS_COMPUTETYPE),
            t("ROCBLAS_POINTER_MODE", rocblas::ROCBLAS_POINTER_MODE),
            t("ROCBLAS_GEMM_ALGO", rocblas::ROCBLAS_GEMM_ALGO),
            t("ROCBLAS_GEMM_FLAGS", rocblas::ROCBLAS_GEMM_FLAGS),
        ],
    }
}

/// How a matmul-descriptor attribute relates to the problem model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttrHandling {
    /// Decoded into the `GemmProblem`.
    Modeled,
    /// Changes D but is not modeled: a value other than the default means the call is skipped,
    /// named after the attribute.
    MustBeDefault,
    /// Does not change D (tuning hints, auxiliary outputs, synchronisation).
    NoEffectOnD,
}

/// C type of an attribute's value, as its header documents it (the size to pass to
/// `*GetAttribute`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttrValue {
    I8,
    I32,
    U32,
    I64,
    U64,
    F32,
    /// A pointer (device or host address).
    Ptr,
    /// An opaque handle (pointer-sized).
    Handle,
}

impl AttrValue {
    pub fn bytes(self) -> usize {
        match self {
            AttrValue::I8 => 1,
            AttrValue::I32 | AttrValue::U32 | AttrValue::F32 => 4,
            AttrValue::I64 | AttrValue::U64 => 8,
            AttrValue::Ptr | AttrValue::Handle => std::mem::size_of::<*const u8>(),
        }
    }
}

/// What a matmul-descriptor attribute is, vendor-neutral (cuBLASLt and hipBLASLt number them
/// differently, and hipBLASLt reused numbers across releases).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatmulDescAttr {
    ComputeType,
    ScaleType,
    PointerMode,
    TransA,
    TransB,
    TransC,
    FillMode,
    Epilogue,
    BiasPointer,
    BiasBatchStride,
    BiasDataType,
    EpilogueAuxPointer,
    EpilogueAuxLd,
    EpilogueAuxBatchStride,
    EpilogueAuxDataType,
    EpilogueAuxScalePointer,
    EpilogueAuxAmaxPointer,
    EpilogueAuxScaleMode,
    AlphaVectorBatchStride,
    SmCountTarget,
    AScalePointer,
    BScalePointer,
    CScalePointer,
    DScalePointer,
    AmaxDPointer,
    FastAccum,
    AtomicSyncNumChunksDRows,
    AtomicSyncNumChunksDCols,
    AtomicSyncInCountersPointer,
    AtomicSyncOutCountersPointer,
    AScaleMode,
    BScaleMode,
    CScaleMode,
    DScaleMode,
    DOutScalePointer,
    DOutScaleMode,
    EmulationDescriptor,
    /// hipBLASLt: data type the A input is converted to before the multiply.
    ComputeInputTypeA,
    ComputeInputTypeB,
    /// hipBLASLt <= 0.12 (ROCm <= 6.4): per-row f32 scale vector for A (102).
    AScalePointerVec,
    /// hipBLASLt <= 0.12 (ROCm <= 6.4): per-column f32 scale vector for B (103).
    BScalePointerVec,
    /// hipBLASLt >= 1.1 (ROCm >= 7.1): activation argument 0 (clamp lower bound) (102).
    EpilogueActArg0,
    /// hipBLASLt >= 1.1 (ROCm >= 7.1): activation argument 1 (clamp upper bound) (103).
    EpilogueActArg1,
    StreamKTileScheduling,
    UniformSummationOrder,
    FusedEpilogue,
}

impl MatmulDescAttr {
    pub fn handling(self) -> AttrHandling {
        use MatmulDescAttr::*;
        match self {
            ComputeType | ScaleType | PointerMode | TransA | TransB | Epilogue | BiasPointer
            | BiasDataType | AScalePointer | BScalePointer | DScalePointer | AmaxDPointer | FastAccum
            | AScaleMode | BScaleMode | AScalePointerVec | BScalePointerVec => AttrHandling::Modeled,
            // TRANSC must stay N and FILL_MODE FULL (cuBLASLt header); the rest change D in ways
            // GemmProblem cannot describe (per-batch bias, scaled C, block-scaled D output,
            // emulation, inputs down-converted before the multiply, clamp bounds, fused
            // epilogue chains, per-row alpha vectors).
            TransC
            | FillMode
            | BiasBatchStride
            | AlphaVectorBatchStride
            | CScalePointer
            | CScaleMode
            | DScaleMode
            | DOutScalePointer
            | DOutScaleMode
            | EmulationDescriptor
            | ComputeInputTypeA
            | ComputeInputTypeB
            | EpilogueActArg0
            | EpilogueActArg1
            | FusedEpilogue => AttrHandling::MustBeDefault,
            EpilogueAuxPointer
            | EpilogueAuxLd
            | EpilogueAuxBatchStride
            | EpilogueAuxDataType
            | EpilogueAuxScalePointer
            | EpilogueAuxAmaxPointer
            | EpilogueAuxScaleMode
            | SmCountTarget
            | AtomicSyncNumChunksDRows
            | AtomicSyncNumChunksDCols
            | AtomicSyncInCountersPointer
            | AtomicSyncOutCountersPointer
            | StreamKTileScheduling
            | UniformSummationOrder => AttrHandling::NoEffectOnD,
        }
    }
}

/// What a matrix-layout attribute is, vendor-neutral.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayoutAttr {
    Type,
    Order,
    Rows,
    Cols,
    Ld,
    BatchCount,
    StridedBatchOffset,
    /// cuBLASLt planar complex: quantshadow has no complex formats.
    PlaneOffset,
    BatchMode,
    /// hipBLASLt: element offset into a sub-matrix for pointer-array batches.
    Offset,
}

impl LayoutAttr {
    pub fn handling(self) -> AttrHandling {
        match self {
            LayoutAttr::PlaneOffset | LayoutAttr::BatchMode | LayoutAttr::Offset => {
                AttrHandling::MustBeDefault
            }
            _ => AttrHandling::Modeled,
        }
    }
}

/// Where alpha and beta live (cuBLASLt / hipBLASLt pointer modes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PointerMode {
    /// Both scalars in host memory.
    Host,
    /// Both scalars in device memory.
    Device,
    /// Alpha and beta are device vectors with one entry per row of D: not modeled.
    DeviceVector,
    /// Alpha is a device vector, beta is zero: not modeled.
    AlphaDeviceVectorBetaZero,
    /// Alpha is a device vector, beta a host scalar: not modeled.
    AlphaDeviceVectorBetaHost,
}

impl PointerMode {
    /// Whether `GemmProblem`'s scalar alpha/beta can describe this mode.
    pub fn is_scalar(self) -> bool {
        matches!(self, PointerMode::Host | PointerMode::Device)
    }
}

/// What an epilogue does to D: the problem-model activation, whether a bias vector is added,
/// and whether an auxiliary output is written too (it does not change D; it is not checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EpilogueMapping {
    pub activation: crate::problem::Activation,
    pub bias: bool,
    pub aux_output: bool,
}

impl EpilogueMapping {
    pub(crate) const fn new(activation: crate::problem::Activation, bias: bool, aux_output: bool) -> Self {
        EpilogueMapping { activation, bias, aux_output }
    }
}

/// How a scale mode covers an operand: granularity, scale format and storage of the scale grid.
pub type ScaleMapping =
    (crate::problem::ScaleGranularity, crate::formats::Format, crate::problem::ScaleStorage);
