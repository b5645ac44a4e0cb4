//! `GemmProblem`: the vendor-neutral description of one GEMM call that every interposer fills.
//!
//! Semantics (one definition for the oracle, the device kernels and the decoders):
//!
//! ```text
//! acc[b](i,j) = sum_k  a(i,k) * sa(i,k) * b(k,j) * sb(k,j)          (f64 on the host)
//! t(i,j)      = alpha * acc + beta * c(i,j) + bias                    (bias per row or column)
//! d(i,j)      = round_to(d.format, epilogue_activation(t) * d_scale)  (cuBLASLt D_SCALE convention)
//! ```
//! where `a(i,k)` is element (i,k) of op(A) (M x K) and `b(k,j)` of op(B) (K x N). Each stored
//! matrix has its own memory order and leading dimension; `op` transposes it. Scales are
//! described per operand in operand-neutral terms: the *outer* dimension is M for A and N for B,
//! the *inner* dimension is K for both, so swapping A and B (as happens when a column-major
//! caller is canonicalised to a row-major D) keeps scale descriptions valid.

use crate::formats::Format;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Memory order of a stored matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Order {
    RowMajor,
    ColMajor,
}

impl Order {
    pub fn flipped(self) -> Order {
        match self {
            Order::RowMajor => Order::ColMajor,
            Order::ColMajor => Order::RowMajor,
        }
    }

    /// Element offset of (row, col) in a matrix with leading dimension `ld`.
    #[inline]
    pub fn offset(self, row: u64, col: u64, ld: u64) -> u64 {
        match self {
            Order::RowMajor => row * ld + col,
            Order::ColMajor => col * ld + row,
        }
    }
}

/// A stored matrix: format, order, leading dimension and batch stride, all in elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MatrixLayout {
    pub format: Format,
    pub order: Order,
    /// Distance between consecutive rows (row-major) or columns (column-major), in elements.
    pub ld: u64,
    /// Distance between consecutive batch items, in elements (0 = broadcast one matrix).
    pub batch_stride: u64,
}

impl MatrixLayout {
    /// A densely packed matrix of `rows x cols`, with `batch` items back to back.
    pub fn packed(format: Format, order: Order, rows: u64, cols: u64) -> MatrixLayout {
        let ld = match order {
            Order::RowMajor => cols,
            Order::ColMajor => rows,
        };
        MatrixLayout { format, order, ld, batch_stride: rows * cols }
    }

    /// Smallest element count that holds `batch` items of a `rows x cols` stored matrix.
    pub fn required_elements(&self, rows: u64, cols: u64, batch: u64) -> u64 {
        if rows == 0 || cols == 0 || batch == 0 {
            return 0;
        }
        let last = self.order.offset(rows - 1, cols - 1, self.ld);
        (batch - 1) * self.batch_stride + last + 1
    }

    /// Checks the leading dimension covers the stored matrix.
    pub fn validate(&self, what: &'static str, rows: u64, cols: u64) -> Result<(), ProblemError> {
        let min_ld = match self.order {
            Order::RowMajor => cols,
            Order::ColMajor => rows,
        };
        if self.ld < min_ld.max(1) {
            return Err(ProblemError::LeadingDimension { operand: what, ld: self.ld, min: min_ld });
        }
        Ok(())
    }
}

/// Whether an operand is used as stored (N) or transposed (T) before the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Transpose {
    N,
    T,
}

impl Transpose {
    pub fn flipped(self) -> Transpose {
        match self {
            Transpose::N => Transpose::T,
            Transpose::T => Transpose::N,
        }
    }
}

/// How scale factors cover an operand, in outer (M for A, N for B) x inner (K) coordinates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ScaleGranularity {
    /// One scalar for the whole tensor.
    Tensor,
    /// One scale per outer index: per token (row of A) or per output channel (column of B).
    PerOuter,
    /// One scale per inner index (per input channel), e.g. SmoothQuant-style.
    PerInner,
    /// Blocks of `outer x inner` elements: activations 1x128, weights 128x128, or any size.
    Block { outer: u32, inner: u32 },
    /// OCP MX: 32 consecutive K elements share one ue8m0 scale.
    Mx32,
    /// NVFP4: 16 consecutive K elements share one ue4m3 scale, times a per-tensor f32.
    Nvfp4,
}

impl ScaleGranularity {
    /// Block shape (outer, inner) in elements for an operand with `outer x inner` logical size.
    pub fn block_shape(self, outer: u64, inner: u64) -> (u64, u64) {
        match self {
            ScaleGranularity::Tensor => (outer.max(1), inner.max(1)),
            ScaleGranularity::PerOuter => (1, inner.max(1)),
            ScaleGranularity::PerInner => (outer.max(1), 1),
            ScaleGranularity::Block { outer: bo, inner: bi } => (bo.max(1) as u64, bi.max(1) as u64),
            ScaleGranularity::Mx32 => (1, 32),
            ScaleGranularity::Nvfp4 => (1, 16),
        }
    }

    /// Number of scale blocks along (outer, inner).
    pub fn grid(self, outer: u64, inner: u64) -> (u64, u64) {
        let (bo, bi) = self.block_shape(outer, inner);
        (outer.div_ceil(bo).max(1), inner.div_ceil(bi).max(1))
    }

    pub fn short_name(self) -> String {
        match self {
            ScaleGranularity::Tensor => "tensor".into(),
            ScaleGranularity::PerOuter => "per-outer".into(),
            ScaleGranularity::PerInner => "per-inner".into(),
            ScaleGranularity::Block { outer, inner } => format!("block{outer}x{inner}"),
            ScaleGranularity::Mx32 => "mx32".into(),
            ScaleGranularity::Nvfp4 => "nvfp4".into(),
        }
    }
}

/// How the grid of scale factors is laid out in memory. Real libraries use more than plain
/// row/column order; each such layout is a variant here, never a flag buried in a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ScaleStorage {
    /// grid[outer_block][inner_block]: "row-major" for A's per-token-group scales.
    OuterMajor,
    /// grid[inner_block][outer_block]: "column-major" (transposed) scales, as DeepGEMM-style
    /// kernels want activation scales.
    InnerMajor,
    /// cuBLASLt / CUTLASS block-scaled layout for VEC16_UE4M3 and VEC32_UE8M0: the grid is cut
    /// into 128 (outer) x 4 (inner) tiles, tiles stored outer-tile-major, each tile of 512
    /// entries at offset (o % 32) * 16 + (o % 128) / 32 * 4 + (i % 4).
    Swizzled128x4,
}

/// Scale factors of one operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ScaleSpec {
    pub granularity: ScaleGranularity,
    pub format: Format,
    pub storage: ScaleStorage,
    /// Leading dimension of the scale grid in entries (0 = packed: the grid's minor extent).
    pub ld: u64,
    /// Distance between batch items in entries (0 = the same scales for every batch item).
    pub batch_stride: u64,
}

impl ScaleSpec {
    pub fn new(granularity: ScaleGranularity, format: Format) -> ScaleSpec {
        ScaleSpec { granularity, format, storage: ScaleStorage::OuterMajor, ld: 0, batch_stride: 0 }
    }

    pub fn with_storage(mut self, storage: ScaleStorage) -> ScaleSpec {
        self.storage = storage;
        self
    }

    /// Entry index of the scale covering block (outer_block, inner_block) for a grid of
    /// (grid_outer x grid_inner) blocks.
    pub fn entry_index(&self, outer_block: u64, inner_block: u64, grid: (u64, u64)) -> u64 {
        let (grid_outer, grid_inner) = grid;
        match self.storage {
            ScaleStorage::OuterMajor => {
                let ld = if self.ld == 0 { grid_inner } else { self.ld };
                outer_block * ld + inner_block
            }
            ScaleStorage::InnerMajor => {
                let ld = if self.ld == 0 { grid_outer } else { self.ld };
                inner_block * ld + outer_block
            }
            ScaleStorage::Swizzled128x4 => {
                let inner_tiles = grid_inner.div_ceil(4);
                let tile = (outer_block / 128) * inner_tiles + inner_block / 4;
                tile * 512 + (outer_block % 32) * 16 + (outer_block % 128) / 32 * 4 + inner_block % 4
            }
        }
    }

    /// Entry index of the scale covering element (outer, inner) of batch item `batch`, for an
    /// operand of logical size `outer_extent x inner_extent`. The one place that maps an
    /// element to its scale: the oracle, the quantizers and the kernels all go through it.
    pub fn entry_for_element(
        &self,
        batch: u64,
        outer: u64,
        inner: u64,
        outer_extent: u64,
        inner_extent: u64,
    ) -> u64 {
        let (bo, bi) = self.granularity.block_shape(outer_extent, inner_extent);
        let grid = self.granularity.grid(outer_extent, inner_extent);
        batch * self.batch_stride + self.entry_index(outer / bo, inner / bi, grid)
    }

    /// Entries a scale buffer must hold for `batch` items.
    pub fn required_entries(&self, outer_extent: u64, inner_extent: u64, batch: u64) -> u64 {
        let grid = self.granularity.grid(outer_extent, inner_extent);
        // Saturating: the values may come from a record of someone else's process.
        (batch.max(1) - 1).saturating_mul(self.batch_stride).saturating_add(self.entries_per_item(grid))
    }

    /// Entries needed for one batch item of a grid (padding of the swizzled layout included).
    pub fn entries_per_item(&self, grid: (u64, u64)) -> u64 {
        let (go, gi) = grid;
        match self.storage {
            ScaleStorage::OuterMajor => {
                let ld = if self.ld == 0 { gi } else { self.ld };
                go.saturating_sub(1).saturating_mul(ld).saturating_add(gi)
            }
            ScaleStorage::InnerMajor => {
                let ld = if self.ld == 0 { go } else { self.ld };
                gi.saturating_sub(1).saturating_mul(ld).saturating_add(go)
            }
            ScaleStorage::Swizzled128x4 => {
                go.div_ceil(128).saturating_mul(gi.div_ceil(4)).saturating_mul(512)
            }
        }
    }
}

/// The epilogue applied after alpha*AB + beta*C (+ bias).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Activation {
    None,
    Relu,
    /// tanh-approximated GELU, as cuBLASLt and hipBLASLt implement it.
    GeluTanh,
}

/// Which output dimension a bias vector runs along.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BiasAxis {
    /// One bias per row of D (length M): cuBLASLt's convention in its own column-major view.
    Rows,
    /// One bias per column of D (length N): `F.linear` in row-major terms.
    Cols,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Bias {
    pub format: Format,
    pub axis: BiasAxis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Epilogue {
    pub bias: Option<Bias>,
    pub activation: Activation,
}

impl Epilogue {
    pub const NONE: Epilogue = Epilogue { bias: None, activation: Activation::None };

    pub fn is_linear(&self) -> bool {
        self.activation == Activation::None
    }

    pub fn short_name(&self) -> &'static str {
        match (self.bias.is_some(), self.activation) {
            (false, Activation::None) => "none",
            (true, Activation::None) => "bias",
            (false, Activation::Relu) => "relu",
            (true, Activation::Relu) => "relu+bias",
            (false, Activation::GeluTanh) => "gelu",
            (true, Activation::GeluTanh) => "gelu+bias",
        }
    }
}

/// A scalar argument: a host value, or a device pointer read when the check runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum Scalar {
    Host(f64),
    Device { ptr: u64, format: Format },
}

impl Scalar {
    pub fn host_value(&self) -> Option<f64> {
        match self {
            Scalar::Host(v) => Some(*v),
            Scalar::Device { .. } => None,
        }
    }
}

/// Accumulation / compute type the caller asked for (recorded, and used to pick tolerances).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ComputeType {
    F32,
    F32FastF16,
    F32FastBf16,
    F32FastTf32,
    F16,
    F64,
    I32,
}

/// One GEMM call, vendor-neutral: shapes, layouts, formats, scales, scalars and epilogue.
/// Buffer addresses are kept apart (`GemmBuffers`) so a problem can be hashed and compared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GemmProblem {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub batch: u64,
    pub trans_a: Transpose,
    pub trans_b: Transpose,
    pub a: MatrixLayout,
    pub b: MatrixLayout,
    /// Present when beta may be non-zero (C is read).
    pub c: Option<MatrixLayout>,
    pub d: MatrixLayout,
    pub a_scale: Option<ScaleSpec>,
    pub b_scale: Option<ScaleSpec>,
    /// Per-tensor second-level scales (NVFP4's f32 tensor scale), multiplied into A and B.
    pub a_tensor_scale: Option<Scalar>,
    pub b_tensor_scale: Option<Scalar>,
    /// Multiplies the result before it is rounded to D's format (cuBLASLt D_SCALE).
    pub d_scale: Option<Scalar>,
    /// Whether the caller asked for amax of D (recorded only).
    pub amax_d: bool,
    pub alpha: Scalar,
    pub beta: Scalar,
    pub epilogue: Epilogue,
    pub compute: ComputeType,
    pub fast_accum: bool,
}

/// Device (or host) addresses of a call's buffers; 0 = absent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GemmBuffers {
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub d: u64,
    pub a_scale: u64,
    pub b_scale: u64,
    pub bias: u64,
    pub amax_d: u64,
}

/// Values of the scalars that live in device memory, read by the caller before a host check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceScalarValues {
    pub alpha: Option<f64>,
    pub beta: Option<f64>,
    pub a_tensor_scale: Option<f64>,
    pub b_tensor_scale: Option<f64>,
    pub d_scale: Option<f64>,
}

/// Every scalar of a problem as a number (absent optional scales are 1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ResolvedScalars {
    pub alpha: f64,
    pub beta: f64,
    pub a_tensor_scale: f64,
    pub b_tensor_scale: f64,
    pub d_scale: f64,
}

/// Host copies of a call's inputs, laid out exactly as the problem describes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HostInputs {
    pub a: Vec<u8>,
    pub b: Vec<u8>,
    pub c: Option<Vec<u8>>,
    pub a_scale: Option<Vec<u8>>,
    pub b_scale: Option<Vec<u8>>,
    pub bias: Option<Vec<u8>>,
    pub device_scalars: DeviceScalarValues,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProblemError {
    #[error("scalar {what} lives in device memory and was not read")]
    UnresolvedScalar { what: &'static str },
    #[error("{operand}: leading dimension {ld} is smaller than {min}")]
    LeadingDimension { operand: &'static str, ld: u64, min: u64 },
    #[error("{what} is zero")]
    EmptyDimension { what: &'static str },
    #[error("{operand}: format {format} is not an element format")]
    NotElementFormat { operand: &'static str, format: Format },
    #[error("{operand} scale: {reason}")]
    Scale { operand: &'static str, reason: String },
    #[error("{operand}: extents overflow (leading dimension or batch stride too large)")]
    TooLarge { operand: &'static str },
    #[error("{operand}: packed 4-bit format needs an even leading dimension and batch stride")]
    PackedAlignment { operand: &'static str },
}

impl GemmProblem {
    /// A plain row-major problem D = A(MxK) B(KxN): the starting point for builders and tests.
    pub fn row_major(m: u64, n: u64, k: u64, a: Format, b: Format, d: Format) -> GemmProblem {
        GemmProblem {
            m,
            n,
            k,
            batch: 1,
            trans_a: Transpose::N,
            trans_b: Transpose::N,
            a: MatrixLayout::packed(a, Order::RowMajor, m, k),
            b: MatrixLayout::packed(b, Order::RowMajor, k, n),
            c: None,
            d: MatrixLayout::packed(d, Order::RowMajor, m, n),
            a_scale: None,
            b_scale: None,
            a_tensor_scale: None,
            b_tensor_scale: None,
            d_scale: None,
            amax_d: false,
            alpha: Scalar::Host(1.0),
            beta: Scalar::Host(0.0),
            epilogue: Epilogue::NONE,
            compute: ComputeType::F32,
            fast_accum: false,
        }
    }

    /// Stored (rows, cols) of A: op(A) is M x K.
    pub fn a_stored_dims(&self) -> (u64, u64) {
        match self.trans_a {
            Transpose::N => (self.m, self.k),
            Transpose::T => (self.k, self.m),
        }
    }

    /// Stored (rows, cols) of B: op(B) is K x N.
    pub fn b_stored_dims(&self) -> (u64, u64) {
        match self.trans_b {
            Transpose::N => (self.k, self.n),
            Transpose::T => (self.n, self.k),
        }
    }

    /// Element offset of op(A)(i, kk) within batch item `batch`.
    #[inline]
    pub fn a_offset(&self, batch: u64, i: u64, kk: u64) -> u64 {
        let (r, c) = match self.trans_a {
            Transpose::N => (i, kk),
            Transpose::T => (kk, i),
        };
        batch * self.a.batch_stride + self.a.order.offset(r, c, self.a.ld)
    }

    /// Element offset of op(B)(kk, j) within batch item `batch`.
    #[inline]
    pub fn b_offset(&self, batch: u64, kk: u64, j: u64) -> u64 {
        let (r, c) = match self.trans_b {
            Transpose::N => (kk, j),
            Transpose::T => (j, kk),
        };
        batch * self.b.batch_stride + self.b.order.offset(r, c, self.b.ld)
    }

    /// Element offset of D(i, j) (and of C(i, j) with C's layout).
    #[inline]
    pub fn out_offset(layout: &MatrixLayout, batch: u64, i: u64, j: u64) -> u64 {
        batch * layout.batch_stride + layout.order.offset(i, j, layout.ld)
    }

    /// Scale entry of op(A)(i, kk) (outer = M, inner = K).
    #[inline]
    pub fn a_scale_entry(&self, spec: &ScaleSpec, batch: u64, i: u64, kk: u64) -> u64 {
        spec.entry_for_element(batch, i, kk, self.m, self.k)
    }

    /// Scale entry of op(B)(kk, j) (outer = N, inner = K).
    #[inline]
    pub fn b_scale_entry(&self, spec: &ScaleSpec, batch: u64, kk: u64, j: u64) -> u64 {
        spec.entry_for_element(batch, j, kk, self.n, self.k)
    }

    /// All scalars as numbers: host values from the problem, device ones from `device`.
    pub fn resolve_scalars(&self, device: &DeviceScalarValues) -> Result<ResolvedScalars, ProblemError> {
        fn one(s: Option<&Scalar>, read: Option<f64>, what: &'static str) -> Result<f64, ProblemError> {
            match s {
                None => Ok(1.0),
                Some(Scalar::Host(v)) => Ok(*v),
                Some(Scalar::Device { .. }) => read.ok_or(ProblemError::UnresolvedScalar { what }),
            }
        }
        Ok(ResolvedScalars {
            alpha: one(Some(&self.alpha), device.alpha, "alpha")?,
            beta: one(Some(&self.beta), device.beta, "beta")?,
            a_tensor_scale: one(self.a_tensor_scale.as_ref(), device.a_tensor_scale, "a_tensor_scale")?,
            b_tensor_scale: one(self.b_tensor_scale.as_ref(), device.b_tensor_scale, "b_tensor_scale")?,
            d_scale: one(self.d_scale.as_ref(), device.d_scale, "d_scale")?,
        })
    }

    /// Format class used for thresholds: the narrowest of A and B.
    pub fn class(&self) -> crate::formats::FormatClass {
        self.a.format.class().max(self.b.format.class())
    }

    /// Checks the description is self-consistent (not that buffers are large enough).
    pub fn validate(&self) -> Result<(), ProblemError> {
        for (what, v) in [("m", self.m), ("n", self.n), ("k", self.k), ("batch", self.batch)] {
            if v == 0 {
                return Err(ProblemError::EmptyDimension { what });
            }
        }
        let c_layout = self.c.as_ref().map(|c| ("c", c));
        for (what, layout) in [("a", &self.a), ("b", &self.b), ("d", &self.d)].into_iter().chain(c_layout) {
            if layout.format.is_scale_only() {
                return Err(ProblemError::NotElementFormat { operand: what, format: layout.format });
            }
            if layout.format.bits() == 4 && (layout.ld % 2 != 0 || layout.batch_stride % 2 != 0) {
                return Err(ProblemError::PackedAlignment { operand: what });
            }
        }
        let (ar, ac) = self.a_stored_dims();
        let (br, bc) = self.b_stored_dims();
        // Extents come from intercepted descriptors: make sure every offset fits in u64
        // (2^62 leaves room for byte conversion) before anything indexes with them.
        let mut extents =
            vec![("a", &self.a, ar, ac), ("b", &self.b, br, bc), ("d", &self.d, self.m, self.n)];
        if let Some(c) = &self.c {
            extents.push(("c", c, self.m, self.n));
        }
        for (what, layout, rows, cols) in extents {
            let last = rows
                .checked_sub(1)
                .zip(cols.checked_sub(1))
                .and_then(|(r, c)| r.max(c).checked_mul(layout.ld.max(1))?.checked_add(r.max(c)))
                .and_then(|v| v.checked_add(layout.batch_stride.checked_mul(self.batch)?));
            if last.is_none_or(|v| v > 1 << 62) {
                return Err(ProblemError::TooLarge { operand: what });
            }
        }
        self.a.validate("a", ar, ac)?;
        self.b.validate("b", br, bc)?;
        self.d.validate("d", self.m, self.n)?;
        if let Some(c) = &self.c {
            c.validate("c", self.m, self.n)?;
        }
        for (what, spec, outer) in [("a", &self.a_scale, self.m), ("b", &self.b_scale, self.n)] {
            let Some(spec) = spec else { continue };
            if !matches!(
                spec.format,
                Format::F32 | Format::Bf16 | Format::F16 | Format::Ue8m0 | Format::Ue4m3
            ) {
                return Err(ProblemError::Scale {
                    operand: what,
                    reason: format!("format {} cannot hold scales", spec.format),
                });
            }
            if let ScaleGranularity::Block { outer: 0, .. } | ScaleGranularity::Block { inner: 0, .. } =
                spec.granularity
            {
                return Err(ProblemError::Scale { operand: what, reason: "block size 0".into() });
            }
            if spec.storage == ScaleStorage::Swizzled128x4
                && !matches!(spec.granularity, ScaleGranularity::Mx32 | ScaleGranularity::Nvfp4)
            {
                return Err(ProblemError::Scale {
                    operand: what,
                    reason: "the 128x4 swizzled layout is defined for MX and NVFP4 block scales only".into(),
                });
            }
            let grid = spec.granularity.grid(outer, self.k);
            let minor = match spec.storage {
                ScaleStorage::OuterMajor => grid.1,
                ScaleStorage::InnerMajor => grid.0,
                ScaleStorage::Swizzled128x4 => 0,
            };
            if spec.ld != 0 && spec.ld < minor {
                return Err(ProblemError::Scale {
                    operand: what,
                    reason: format!("ld {} < {}", spec.ld, minor),
                });
            }
        }
        Ok(())
    }

    /// One-line shape and contract summary for logs and reports.
    pub fn summary(&self) -> String {
        let scale = |s: &Option<ScaleSpec>| match s {
            None => "-".to_string(),
            Some(s) => format!("{}:{}", s.granularity.short_name(), s.format),
        };
        format!(
            "{}x{}x{}{} {}{}*{}{}->{} scales[{} {}] epi={}",
            self.m,
            self.n,
            self.k,
            if self.batch > 1 { format!(" b{}", self.batch) } else { String::new() },
            self.a.format,
            if self.trans_a == Transpose::T { "^T" } else { "" },
            self.b.format,
            if self.trans_b == Transpose::T { "^T" } else { "" },
            self.d.format,
            scale(&self.a_scale),
            scale(&self.b_scale),
            self.epilogue.short_name()
        )
    }
}

impl fmt::Display for GemmProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_entry_counts_saturate_on_absurd_recorded_values() {
        // Values from a record of someone else's process: no overflow panic, a count no
        // buffer can hold.
        for storage in [ScaleStorage::OuterMajor, ScaleStorage::InnerMajor, ScaleStorage::Swizzled128x4] {
            let mut spec = ScaleSpec::new(ScaleGranularity::Mx32, Format::Ue8m0).with_storage(storage);
            spec.ld = u64::MAX / 2;
            spec.batch_stride = u64::MAX;
            assert_eq!(spec.required_entries(u64::MAX, u64::MAX, 2), u64::MAX, "{storage:?}");
            assert_eq!(spec.entries_per_item((0, 0)), 0, "{storage:?}: an empty grid");
        }
        let plain = ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32);
        assert_eq!(plain.required_entries(57, 96, 1), 57);
    }

    #[test]
    fn swizzled_index_matches_cublas_tile_formula() {
        let spec =
            ScaleSpec::new(ScaleGranularity::Mx32, Format::Ue8m0).with_storage(ScaleStorage::Swizzled128x4);
        let grid = (256, 8); // 256 rows, K = 256 -> 8 scale columns, 2 inner tiles
        assert_eq!(spec.entry_index(0, 0, grid), 0);
        assert_eq!(spec.entry_index(1, 0, grid), 16);
        assert_eq!(spec.entry_index(32, 0, grid), 4);
        assert_eq!(spec.entry_index(0, 3, grid), 3);
        assert_eq!(spec.entry_index(0, 4, grid), 512);
        assert_eq!(spec.entry_index(128, 0, grid), 1024);
        assert_eq!(spec.entries_per_item(grid), 2048);
    }

    #[test]
    fn validate_rejects_short_ld() {
        let mut p = GemmProblem::row_major(4, 4, 4, Format::Bf16, Format::Bf16, Format::Bf16);
        assert!(p.validate().is_ok());
        p.a.ld = 3;
        assert!(matches!(p.validate(), Err(ProblemError::LeadingDimension { .. })));
    }
}
