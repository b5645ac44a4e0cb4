//! Host reference GEMM in f64: the ground truth every device kernel and every check is
//! validated against.
//!
//! It implements the semantics written down in [`crate::problem`] and nothing else:
//!
//! ```text
//! acc[b](i,j) = sum_k  a(i,k) * sa(i,k) * b(k,j) * sb(k,j)
//! t(i,j)      = alpha * acc + beta * c(i,j) + bias
//! d(i,j)      = round_to(d.format, activation(t) * d_scale)
//! ```
//!
//! Element positions come from [`GemmProblem::a_offset`], [`GemmProblem::b_offset`] and
//! [`GemmProblem::out_offset`], scale entries from [`GemmProblem::a_scale_entry`] and
//! [`GemmProblem::b_scale_entry`], values from [`Format`]'s decoders: the oracle adds no second
//! reading of the contract that could drift from the one the device kernels use.
//!
//! Every buffer is checked against the extent the problem implies before anything is read, with
//! overflow-checked arithmetic, and every read is bounds-checked again, so a malformed problem
//! or a short host copy gives an [`OracleError`], never a panic.
//!
//! Operands are decoded once into f64 (op(A) rows as `rows x K`, op(B) in column panels of
//! `K x PANEL_COLS`), then multiplied in register tiles of an i-k-j loop. Each output element is
//! accumulated in ascending k whatever the blocking, so rows mode gives bit-identical rows to
//! the full product. Integer inputs (int8 x int8 -> i32) accumulate exactly: every product and
//! partial sum is an integer below 2^53 for any K below 2^39, far beyond any buffer.

use crate::formats::Format;
use crate::problem::{
    Activation, BiasAxis, GemmProblem, HostInputs, MatrixLayout, Order, ProblemError, ResolvedScalars,
    Scalar, ScaleSpec, ScaleStorage, Transpose,
};

/// Columns of op(B) decoded and multiplied at a time: a `K_BLOCK x PANEL_COLS` slice of the
/// panel (512 KiB) stays in L2 while every row of A streams past it.
const PANEL_COLS: usize = 256;
/// Rows of the B panel (and columns of A) consumed per pass over the rows of A.
const K_BLOCK: usize = 256;
/// Register tile: 4 rows of A x 4 columns of the panel, 16 accumulators that stay in registers
/// (8 SSE2 registers) while k runs, so each loaded value feeds 4 multiply-adds.
const TILE_ROWS: usize = 4;
const TILE_COLS: usize = 4;

/// What to compute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OracleOptions {
    /// Round the result to D's format (saturating for the 8-bit floats, as [`Format::encode`]).
    /// Off, the result is the exact f64 value before the store.
    pub round_output: bool,
    /// Only these rows of D (rows mode), in this order; `None` computes every row.
    pub rows: Option<Vec<u64>>,
}

impl Default for OracleOptions {
    fn default() -> OracleOptions {
        OracleOptions { round_output: true, rows: None }
    }
}

/// Values of (a subset of the rows of) D for every batch item.
#[derive(Debug, Clone, PartialEq)]
pub struct OracleOutput {
    pub batch: u64,
    /// Which rows of D are present, in the order they are stored.
    pub rows: Vec<u64>,
    pub n: u64,
    /// `[batch][row][n]`, row-major.
    pub values: Vec<f64>,
}

impl OracleOutput {
    /// Values of batch item `batch`: `rows.len() x n`, row-major.
    pub fn batch_item(&self, batch: u64) -> Option<&[f64]> {
        if batch >= self.batch {
            return None;
        }
        let per_item = self.rows.len() * self.n as usize;
        let start = batch as usize * per_item;
        self.values.get(start..start + per_item)
    }

    /// The `position`-th stored row (D's row `rows[position]`) of batch item `batch`.
    pub fn row(&self, batch: u64, position: usize) -> Option<&[f64]> {
        if position >= self.rows.len() {
            return None;
        }
        let n = self.n as usize;
        self.batch_item(batch)?.get(position * n..(position + 1) * n)
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OracleError {
    #[error("invalid problem: {0}")]
    Problem(#[from] ProblemError),
    #[error("{operand}: buffer holds {have_bytes} bytes, the problem reads {need_bytes}")]
    BufferTooSmall { operand: &'static str, need_bytes: u64, have_bytes: u64 },
    #[error("{operand}: the extent the problem implies overflows 64-bit arithmetic")]
    SizeOverflow { operand: &'static str },
    #[error("{operand}: the problem reads it but no host copy was given")]
    MissingBuffer { operand: &'static str },
    #[error("beta is {beta} but the problem has no C matrix to scale")]
    BetaWithoutC { beta: f64 },
    #[error("row {row} is outside D's {m} rows")]
    RowOutOfRange { row: u64, m: u64 },
    #[error("batch item {batch} is outside the problem's {count} items")]
    BatchOutOfRange { batch: u64, count: u64 },
    #[error("{what}: {elements} f64 values cannot be allocated")]
    TooLarge { what: &'static str, elements: u128 },
}

/// Computes D (or the requested rows of D) for every batch item from host copies of the inputs.
pub fn reference_gemm(
    problem: &GemmProblem,
    inputs: &HostInputs,
    options: &OracleOptions,
) -> Result<OracleOutput, OracleError> {
    problem.validate()?;
    let scalars = problem.resolve_scalars(&inputs.device_scalars)?;
    let rows = selected_rows(problem, options.rows.as_deref())?;
    let a = Operand::new(problem, inputs, Side::A, scalars.a_tensor_scale)?;
    let b = Operand::new(problem, inputs, Side::B, scalars.b_tensor_scale)?;
    let epilogue = EpilogueInputs::new(problem, inputs, &scalars, options.round_output)?;

    let k = to_usize(problem.k, "k")?;
    let n = to_usize(problem.n, "n")?;
    let per_item = checked_count(&[rows.len() as u64, problem.n], "d")?;
    let mut values = zeroed(checked_count(&[per_item as u64, problem.batch], "d")?, "d")?;
    let mut a_rows = zeroed(checked_count(&[rows.len() as u64, problem.k], "a")?, "a")?;
    // A batch-invariant B (stride 0, as for shared weights) is decoded whole, once; otherwise
    // one panel at a time so memory stays at K x PANEL_COLS whatever N is.
    let b_whole = problem.batch > 1 && b.batch_invariant();
    let mut b_panels = zeroed(
        checked_count(&[problem.k, if b_whole { problem.n } else { problem.n.min(PANEL_COLS as u64) }], "b")?,
        "b",
    )?;

    for item in 0..problem.batch {
        if item == 0 || !a.batch_invariant() {
            a.decode_rows(item, &rows, k, &mut a_rows)?;
        }
        let out = &mut values[item as usize * per_item..(item as usize + 1) * per_item];
        for col0 in (0..n).step_by(PANEL_COLS) {
            let width = PANEL_COLS.min(n - col0);
            let panel = if b_whole {
                let panel = &mut b_panels[k * col0..k * (col0 + width)];
                if item == 0 {
                    b.decode_panel(item, col0, width, k, panel)?;
                }
                &*panel
            } else {
                let panel = &mut b_panels[..k * width];
                b.decode_panel(item, col0, width, k, panel)?;
                &*panel
            };
            accumulate_panel(&a_rows, k, panel, width, out, n, col0);
        }
        epilogue.apply(problem, item, &rows, out)?;
    }
    Ok(OracleOutput { batch: problem.batch, rows, n: problem.n, values })
}

/// op(A) of batch item `batch` as a row-major `M x K` matrix, element and tensor scales applied.
pub fn decode_operand_a(
    problem: &GemmProblem,
    inputs: &HostInputs,
    batch: u64,
) -> Result<Vec<f64>, OracleError> {
    problem.validate()?;
    check_batch(problem, batch)?;
    let tensor_scale =
        resolve_optional(problem.a_tensor_scale, inputs.device_scalars.a_tensor_scale, "a_tensor_scale")?;
    let a = Operand::new(problem, inputs, Side::A, tensor_scale)?;
    let rows: Vec<u64> = (0..problem.m).collect();
    let mut out = zeroed(checked_count(&[problem.m, problem.k], "a")?, "a")?;
    a.decode_rows(batch, &rows, to_usize(problem.k, "k")?, &mut out)?;
    Ok(out)
}

/// op(B) of batch item `batch` as a row-major `K x N` matrix, element and tensor scales applied.
pub fn decode_operand_b(
    problem: &GemmProblem,
    inputs: &HostInputs,
    batch: u64,
) -> Result<Vec<f64>, OracleError> {
    problem.validate()?;
    check_batch(problem, batch)?;
    let tensor_scale =
        resolve_optional(problem.b_tensor_scale, inputs.device_scalars.b_tensor_scale, "b_tensor_scale")?;
    let b = Operand::new(problem, inputs, Side::B, tensor_scale)?;
    let k = to_usize(problem.k, "k")?;
    let n = to_usize(problem.n, "n")?;
    let mut out = zeroed(checked_count(&[problem.k, problem.n], "b")?, "b")?;
    // Full width in one panel: the panel layout `K x width` is then exactly row-major K x N.
    b.decode_panel(batch, 0, n, k, &mut out)?;
    Ok(out)
}

/// A production D buffer, laid out as the problem says, decoded to `[batch][row][n]`.
pub fn decode_output(problem: &GemmProblem, d: &[u8]) -> Result<OracleOutput, OracleError> {
    decode_output_impl(problem, d, None)
}

/// Like [`decode_output`], for the rows `rows` of D only (in that order), as rows mode needs.
pub fn decode_output_rows(
    problem: &GemmProblem,
    d: &[u8],
    rows: &[u64],
) -> Result<OracleOutput, OracleError> {
    decode_output_impl(problem, d, Some(rows))
}

fn decode_output_impl(
    problem: &GemmProblem,
    d: &[u8],
    rows: Option<&[u64]>,
) -> Result<OracleOutput, OracleError> {
    problem.validate()?;
    let rows = selected_rows(problem, rows)?;
    check_matrix("d", &problem.d, problem.m, problem.n, problem.batch, d)?;
    let reader = Elements::new("d", problem.d.format, d);
    let n = problem.n;
    let mut values = with_capacity(checked_count(&[problem.batch, rows.len() as u64, n], "d")?, "d")?;
    for item in 0..problem.batch {
        for &i in &rows {
            for j in 0..n {
                values.push(reader.get(GemmProblem::out_offset(&problem.d, item, i, j))?);
            }
        }
    }
    Ok(OracleOutput { batch: problem.batch, rows, n, values })
}

/// The rows to compute: the requested ones, each checked against M, or all of them.
fn selected_rows(problem: &GemmProblem, rows: Option<&[u64]>) -> Result<Vec<u64>, OracleError> {
    match rows {
        None => {
            let mut all = with_capacity(to_usize(problem.m, "m")?, "rows")?;
            all.extend(0..problem.m);
            Ok(all)
        }
        Some(rows) => {
            if let Some(&row) = rows.iter().find(|&&row| row >= problem.m) {
                return Err(OracleError::RowOutOfRange { row, m: problem.m });
            }
            Ok(rows.to_vec())
        }
    }
}

fn check_batch(problem: &GemmProblem, batch: u64) -> Result<(), OracleError> {
    if batch >= problem.batch {
        return Err(OracleError::BatchOutOfRange { batch, count: problem.batch });
    }
    Ok(())
}

/// The value of an optional per-tensor scalar (absent = 1), read from `device` when it lives in
/// device memory. Decoding one operand must not require the other operand's scalars.
fn resolve_optional(
    scalar: Option<Scalar>,
    device: Option<f64>,
    what: &'static str,
) -> Result<f64, OracleError> {
    match scalar {
        None => Ok(1.0),
        Some(Scalar::Host(v)) => Ok(v),
        Some(Scalar::Device { .. }) => Ok(device.ok_or(ProblemError::UnresolvedScalar { what })?),
    }
}

fn to_usize(v: u64, what: &'static str) -> Result<usize, OracleError> {
    usize::try_from(v).map_err(|_| OracleError::TooLarge { what, elements: v as u128 })
}

/// Product of `factors` as an element count, or `TooLarge` when it does not fit.
fn checked_count(factors: &[u64], what: &'static str) -> Result<usize, OracleError> {
    let product = factors.iter().try_fold(1u128, |acc, &f| acc.checked_mul(f as u128)).unwrap_or(u128::MAX);
    usize::try_from(product).map_err(|_| OracleError::TooLarge { what, elements: product })
}

/// An empty buffer with room for `count` values; an allocation the machine cannot give is an
/// error, not an abort.
fn with_capacity<T>(count: usize, what: &'static str) -> Result<Vec<T>, OracleError> {
    let mut v = Vec::new();
    v.try_reserve_exact(count).map_err(|_| OracleError::TooLarge { what, elements: count as u128 })?;
    Ok(v)
}

fn zeroed(count: usize, what: &'static str) -> Result<Vec<f64>, OracleError> {
    let mut v = with_capacity(count, what)?;
    v.resize(count, 0.0);
    Ok(v)
}

// ---------------------------------------------------------------------------------------------
// Buffer extents. These mirror `MatrixLayout::required_elements` and
// `ScaleSpec::required_entries` with overflow-checked arithmetic: the shared ones would wrap (or
// panic in debug builds) on a hostile leading dimension, and a wrapped extent would let a short
// buffer through the check. The tests compare both on ordinary layouts.
// ---------------------------------------------------------------------------------------------

fn matrix_elements(layout: &MatrixLayout, rows: u64, cols: u64, batch: u64) -> Option<u64> {
    if rows == 0 || cols == 0 || batch == 0 {
        return Some(0);
    }
    let last = match layout.order {
        Order::RowMajor => (rows - 1).checked_mul(layout.ld)?.checked_add(cols - 1)?,
        Order::ColMajor => (cols - 1).checked_mul(layout.ld)?.checked_add(rows - 1)?,
    };
    (batch - 1).checked_mul(layout.batch_stride)?.checked_add(last)?.checked_add(1)
}

fn scale_entries(spec: &ScaleSpec, outer: u64, inner: u64, batch: u64) -> Option<u64> {
    let (go, gi) = spec.granularity.grid(outer, inner);
    let per_item = match spec.storage {
        ScaleStorage::OuterMajor => {
            let ld = if spec.ld == 0 { gi } else { spec.ld };
            (go - 1).checked_mul(ld)?.checked_add(gi)?
        }
        ScaleStorage::InnerMajor => {
            let ld = if spec.ld == 0 { go } else { spec.ld };
            (gi - 1).checked_mul(ld)?.checked_add(go)?
        }
        ScaleStorage::Swizzled128x4 => go.div_ceil(128).checked_mul(gi.div_ceil(4))?.checked_mul(512)?,
    };
    (batch.max(1) - 1).checked_mul(spec.batch_stride)?.checked_add(per_item)
}

fn bytes_for(format: Format, elements: u64) -> Option<u64> {
    Some(elements.checked_mul(format.bits() as u64)?.div_ceil(8))
}

fn check_len(
    operand: &'static str,
    need: Option<u64>,
    format: Format,
    have: &[u8],
) -> Result<(), OracleError> {
    let need_bytes = need.and_then(|e| bytes_for(format, e)).ok_or(OracleError::SizeOverflow { operand })?;
    let have_bytes = have.len() as u64;
    if have_bytes < need_bytes {
        return Err(OracleError::BufferTooSmall { operand, need_bytes, have_bytes });
    }
    Ok(())
}

fn check_matrix(
    operand: &'static str,
    layout: &MatrixLayout,
    rows: u64,
    cols: u64,
    batch: u64,
    have: &[u8],
) -> Result<(), OracleError> {
    check_len(operand, matrix_elements(layout, rows, cols, batch), layout.format, have)
}

// ---------------------------------------------------------------------------------------------
// Element access.
// ---------------------------------------------------------------------------------------------

/// One buffer read as elements of one format. Reads are bounds-checked even after the extent
/// check, so a disagreement between an extent formula and an offset formula is an error
/// instead of a panic.
struct Elements<'a> {
    operand: &'static str,
    format: Format,
    bytes: &'a [u8],
    capacity: u64,
    /// Value of every code for the 4- and 8-bit formats: decoding minifloats by formula costs
    /// more than the multiply-add that consumes them.
    table: Option<Vec<f64>>,
}

impl<'a> Elements<'a> {
    fn new(operand: &'static str, format: Format, bytes: &'a [u8]) -> Elements<'a> {
        let bits = format.bits() as u64;
        let table = (bits <= 8).then(|| (0..1u32 << bits).map(|code| format.decode_code(code)).collect());
        Elements { operand, format, bytes, capacity: bytes.len() as u64 * 8 / bits, table }
    }

    #[inline]
    fn get(&self, index: u64) -> Result<f64, OracleError> {
        if index >= self.capacity {
            return Err(OracleError::BufferTooSmall {
                operand: self.operand,
                need_bytes: bytes_for(self.format, index.saturating_add(1)).unwrap_or(u64::MAX),
                have_bytes: self.bytes.len() as u64,
            });
        }
        let code = self.format.load_code(self.bytes, index as usize);
        Ok(match &self.table {
            Some(table) => table[code as usize],
            None => self.format.decode_code(code),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    A,
    B,
}

/// One input operand with its scales, read in operand-neutral (outer, inner) coordinates:
/// outer is M for A and N for B, inner is K for both.
struct Operand<'a> {
    problem: &'a GemmProblem,
    side: Side,
    elements: Elements<'a>,
    scale: Option<(ScaleSpec, Elements<'a>)>,
    tensor_scale: f64,
}

impl<'a> Operand<'a> {
    /// Checks the operand's buffers cover everything the problem reads from them.
    fn new(
        problem: &'a GemmProblem,
        inputs: &'a HostInputs,
        side: Side,
        tensor_scale: f64,
    ) -> Result<Operand<'a>, OracleError> {
        let (name, scale_name, layout, stored, bytes, spec, scale_bytes, outer) = match side {
            Side::A => (
                "a",
                "a_scale",
                &problem.a,
                problem.a_stored_dims(),
                &inputs.a,
                problem.a_scale,
                inputs.a_scale.as_deref(),
                problem.m,
            ),
            Side::B => (
                "b",
                "b_scale",
                &problem.b,
                problem.b_stored_dims(),
                &inputs.b,
                problem.b_scale,
                inputs.b_scale.as_deref(),
                problem.n,
            ),
        };
        check_matrix(name, layout, stored.0, stored.1, problem.batch, bytes)?;
        let scale = match spec {
            None => None,
            Some(spec) => {
                let scale_bytes = scale_bytes.ok_or(OracleError::MissingBuffer { operand: scale_name })?;
                check_len(
                    scale_name,
                    scale_entries(&spec, outer, problem.k, problem.batch),
                    spec.format,
                    scale_bytes,
                )?;
                Some((spec, Elements::new(scale_name, spec.format, scale_bytes)))
            }
        };
        Ok(Operand {
            problem,
            side,
            elements: Elements::new(name, layout.format, bytes),
            scale,
            tensor_scale,
        })
    }

    /// Whether every batch item reads the same elements and scales.
    fn batch_invariant(&self) -> bool {
        let layout = match self.side {
            Side::A => &self.problem.a,
            Side::B => &self.problem.b,
        };
        layout.batch_stride == 0 && self.scale.as_ref().is_none_or(|(spec, _)| spec.batch_stride == 0)
    }

    /// Value of op element (outer, inner) of batch item `batch`, scales applied.
    #[inline]
    fn value(&self, batch: u64, outer: u64, inner: u64) -> Result<f64, OracleError> {
        let p = self.problem;
        let (offset, entry) = match self.side {
            Side::A => (
                p.a_offset(batch, outer, inner),
                self.scale.as_ref().map(|(s, _)| p.a_scale_entry(s, batch, outer, inner)),
            ),
            Side::B => (
                p.b_offset(batch, inner, outer),
                self.scale.as_ref().map(|(s, _)| p.b_scale_entry(s, batch, inner, outer)),
            ),
        };
        let mut v = self.elements.get(offset)?;
        if let (Some(entry), Some((_, scales))) = (entry, &self.scale) {
            v *= scales.get(entry)?;
        }
        Ok(v * self.tensor_scale)
    }

    /// Whether consecutive inner (K) indices are adjacent in memory, to pick the loop order
    /// that walks the stored matrix sequentially.
    fn inner_contiguous(&self) -> bool {
        let (layout, trans) = match self.side {
            Side::A => (&self.problem.a, self.problem.trans_a),
            Side::B => (&self.problem.b, self.problem.trans_b),
        };
        // op(A) = A: K runs along stored columns; op(B) = B: K runs along stored rows.
        let inner_is_stored_col =
            matches!((self.side, trans), (Side::A, Transpose::N) | (Side::B, Transpose::T));
        inner_is_stored_col == (layout.order == Order::RowMajor)
    }

    /// Rows `rows` of op(A) into `out` (`rows.len() x k`, row-major). A only.
    fn decode_rows(&self, batch: u64, rows: &[u64], k: usize, out: &mut [f64]) -> Result<(), OracleError> {
        debug_assert_eq!(self.side, Side::A);
        if self.inner_contiguous() {
            for (slot_row, &i) in out.chunks_exact_mut(k.max(1)).zip(rows) {
                for (kk, slot) in slot_row.iter_mut().enumerate() {
                    *slot = self.value(batch, i, kk as u64)?;
                }
            }
        } else {
            for kk in 0..k {
                for (r, &i) in rows.iter().enumerate() {
                    out[r * k + kk] = self.value(batch, i, kk as u64)?;
                }
            }
        }
        Ok(())
    }

    /// Columns `col0..col0 + width` of op(B) into `out` (`k x width`, row-major). B only.
    fn decode_panel(
        &self,
        batch: u64,
        col0: usize,
        width: usize,
        k: usize,
        out: &mut [f64],
    ) -> Result<(), OracleError> {
        debug_assert_eq!(self.side, Side::B);
        if self.inner_contiguous() {
            for c in 0..width {
                let j = (col0 + c) as u64;
                for kk in 0..k {
                    out[kk * width + c] = self.value(batch, j, kk as u64)?;
                }
            }
        } else {
            for kk in 0..k {
                for c in 0..width {
                    out[kk * width + c] = self.value(batch, (col0 + c) as u64, kk as u64)?;
                }
            }
        }
        Ok(())
    }
}

/// out[r][col0..col0+width] += sum_k a[r][k] * panel[k][..] for every decoded row r.
///
/// Every path (register tile or edge) loads the running sum of an element from `out`, adds the
/// k terms in ascending order and stores it back, so each element sees the same additions in
/// the same order as a naive loop, whichever rows are computed together.
fn accumulate_panel(
    a: &[f64],
    k: usize,
    panel: &[f64],
    width: usize,
    out: &mut [f64],
    n: usize,
    col0: usize,
) {
    if k == 0 || width == 0 {
        return;
    }
    let row_count = a.len() / k;
    for k0 in (0..k).step_by(K_BLOCK) {
        let k1 = (k0 + K_BLOCK).min(k);
        let mut r = 0;
        while r + TILE_ROWS <= row_count {
            let a_rows: [&[f64]; TILE_ROWS] = std::array::from_fn(|t| &a[(r + t) * k + k0..(r + t) * k + k1]);
            let mut c = 0;
            while c + TILE_COLS <= width {
                let mut acc = [[0.0f64; TILE_COLS]; TILE_ROWS];
                for (t, acc_row) in acc.iter_mut().enumerate() {
                    acc_row.copy_from_slice(&out[(r + t) * n + col0 + c..][..TILE_COLS]);
                }
                for kk in 0..k1 - k0 {
                    let b = &panel[(k0 + kk) * width + c..][..TILE_COLS];
                    for (acc_row, a_row) in acc.iter_mut().zip(&a_rows) {
                        let a_val = a_row[kk];
                        for (slot, &b_val) in acc_row.iter_mut().zip(b) {
                            *slot += a_val * b_val;
                        }
                    }
                }
                for (t, acc_row) in acc.iter().enumerate() {
                    out[(r + t) * n + col0 + c..][..TILE_COLS].copy_from_slice(acc_row);
                }
                c += TILE_COLS;
            }
            for t in 0..TILE_ROWS {
                accumulate_edge(a_rows[t], k0, panel, width, &mut out[(r + t) * n + col0..][..width], c);
            }
            r += TILE_ROWS;
        }
        for r in r..row_count {
            accumulate_edge(
                &a[r * k + k0..r * k + k1],
                k0,
                panel,
                width,
                &mut out[r * n + col0..][..width],
                0,
            );
        }
    }
}

/// One row's columns `first_col..width` of the panel, for k0..k0 + a_row.len(): the edges the
/// register tiles do not cover.
fn accumulate_edge(
    a_row: &[f64],
    k0: usize,
    panel: &[f64],
    width: usize,
    out_row: &mut [f64],
    first_col: usize,
) {
    for c in first_col..width {
        let mut acc = out_row[c];
        for (kk, &a_val) in a_row.iter().enumerate() {
            acc += a_val * panel[(k0 + kk) * width + c];
        }
        out_row[c] = acc;
    }
}

// ---------------------------------------------------------------------------------------------
// Epilogue.
// ---------------------------------------------------------------------------------------------

struct EpilogueInputs<'a> {
    alpha: f64,
    beta: f64,
    d_scale: f64,
    /// C's layout and data, present only when beta != 0: with beta == 0, C is not read at all
    /// (BLAS semantics), so NaN in an uninitialised C cannot leak into the result.
    c: Option<(MatrixLayout, Elements<'a>)>,
    bias: Option<(BiasAxis, Elements<'a>)>,
    activation: Activation,
    round_to: Option<Format>,
}

impl<'a> EpilogueInputs<'a> {
    fn new(
        problem: &GemmProblem,
        inputs: &'a HostInputs,
        scalars: &ResolvedScalars,
        round_output: bool,
    ) -> Result<EpilogueInputs<'a>, OracleError> {
        let c = if scalars.beta != 0.0 {
            let layout = problem.c.ok_or(OracleError::BetaWithoutC { beta: scalars.beta })?;
            let bytes = inputs.c.as_deref().ok_or(OracleError::MissingBuffer { operand: "c" })?;
            check_matrix("c", &layout, problem.m, problem.n, problem.batch, bytes)?;
            Some((layout, Elements::new("c", layout.format, bytes)))
        } else {
            None
        };
        let bias = match problem.epilogue.bias {
            None => None,
            Some(bias) => {
                let bytes = inputs.bias.as_deref().ok_or(OracleError::MissingBuffer { operand: "bias" })?;
                let len = match bias.axis {
                    BiasAxis::Rows => problem.m,
                    BiasAxis::Cols => problem.n,
                };
                check_len("bias", Some(len), bias.format, bytes)?;
                Some((bias.axis, Elements::new("bias", bias.format, bytes)))
            }
        };
        Ok(EpilogueInputs {
            alpha: scalars.alpha,
            beta: scalars.beta,
            d_scale: scalars.d_scale,
            c,
            bias,
            activation: problem.epilogue.activation,
            round_to: round_output.then_some(problem.d.format),
        })
    }

    /// Turns the accumulators of one batch item (`rows.len() x n`) into D values in place.
    fn apply(
        &self,
        problem: &GemmProblem,
        batch: u64,
        rows: &[u64],
        out: &mut [f64],
    ) -> Result<(), OracleError> {
        let n = problem.n as usize;
        for (out_row, &i) in out.chunks_exact_mut(n.max(1)).zip(rows) {
            for (j, slot) in out_row.iter_mut().enumerate() {
                let j = j as u64;
                let mut t = self.alpha * *slot;
                if let Some((layout, c)) = &self.c {
                    t += self.beta * c.get(GemmProblem::out_offset(layout, batch, i, j))?;
                }
                if let Some((axis, bias)) = &self.bias {
                    t += bias.get(match axis {
                        BiasAxis::Rows => i,
                        BiasAxis::Cols => j,
                    })?;
                }
                let d = activation(self.activation, t) * self.d_scale;
                *slot = match self.round_to {
                    Some(format) => format.round(d),
                    None => d,
                };
            }
        }
        Ok(())
    }
}

/// The epilogue activation. NaN propagates through ReLU (fmaxf would turn it into 0): a NaN in
/// the reference is a finding to report, not something to hide.
fn activation(kind: Activation, x: f64) -> f64 {
    match kind {
        Activation::None => x,
        Activation::Relu => {
            if x < 0.0 {
                0.0
            } else {
                x
            }
        }
        Activation::GeluTanh => gelu_tanh(x),
    }
}

/// GELU, tanh approximation, as cuBLASLt's and hipBLASLt's GELU epilogues compute it:
/// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
pub fn gelu_tanh(x: f64) -> f64 {
    const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
}
