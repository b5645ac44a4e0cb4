//! Tests of the host reference GEMM against computations written here, independently of the
//! runtime: values are built as dense f64 matrices, placed into buffers by the little writer
//! below (own offset, nibble and scale-swizzle formulas, own code tables), every padding slot
//! filled with a NaN code, and the expected result comes from a naive triple loop.
//!
//! Test data are small dyadic numbers, so every product and partial sum is exact in f64 and
//! results can be compared for equality whatever the summation order.

use quantshadow_runtime::formats::Format;
use quantshadow_runtime::oracle::{
    decode_operand_a, decode_operand_b, decode_output, decode_output_rows, gelu_tanh, reference_gemm,
    OracleError, OracleOptions, OracleOutput,
};
use quantshadow_runtime::problem::{
    Activation, Bias, BiasAxis, DeviceScalarValues, Epilogue, GemmProblem, HostInputs, MatrixLayout, Order,
    ProblemError, Scalar, ScaleGranularity, ScaleSpec, ScaleStorage, Transpose,
};
use quantshadow_runtime::rng::SplitMix64;

// =============================================================================================
// Format knowledge written from the format definitions, not from formats.rs.
// =============================================================================================

fn bits_of(format: Format) -> u32 {
    match format {
        Format::F32 | Format::I32 => 32,
        Format::F16 | Format::Bf16 => 16,
        Format::E2m1 | Format::Int4 => 4,
        _ => 8,
    }
}

/// sign | exponent | mantissa small float with the given bias (no special codes handled).
fn minifloat(code: u32, exp_bits: u32, man_bits: u32, bias: i32, signed: bool) -> f64 {
    let exp = (code >> man_bits) & ((1 << exp_bits) - 1);
    let man = code & ((1 << man_bits) - 1);
    let frac = man as f64 / (1u32 << man_bits) as f64;
    let magnitude =
        if exp == 0 { frac * 2f64.powi(1 - bias) } else { (1.0 + frac) * 2f64.powi(exp as i32 - bias) };
    let negative = signed && (code >> (exp_bits + man_bits)) & 1 == 1;
    if negative {
        -magnitude
    } else {
        magnitude
    }
}

fn spec_decode(format: Format, code: u32) -> f64 {
    match format {
        Format::F32 => f32::from_bits(code) as f64,
        Format::F16 => half::f16::from_bits(code as u16).to_f64(),
        Format::Bf16 => f32::from_bits(code << 16) as f64,
        Format::E4m3fn if code & 0x7F == 0x7F => f64::NAN,
        Format::E4m3fn => minifloat(code, 4, 3, 7, true),
        Format::E4m3fnuz if code == 0x80 => f64::NAN,
        Format::E4m3fnuz => minifloat(code, 4, 3, 8, true),
        Format::E5m2 if (code >> 2) & 0x1F == 0x1F => {
            if code & 3 == 0 {
                if code & 0x80 != 0 {
                    f64::NEG_INFINITY
                } else {
                    f64::INFINITY
                }
            } else {
                f64::NAN
            }
        }
        Format::E5m2 => minifloat(code, 5, 2, 15, true),
        Format::E5m2fnuz if code == 0x80 => f64::NAN,
        Format::E5m2fnuz => minifloat(code, 5, 2, 16, true),
        Format::E2m1 => minifloat(code, 2, 1, 1, true),
        Format::Int8 => code as u8 as i8 as f64,
        Format::Int4 => {
            if code >= 8 {
                code as f64 - 16.0
            } else {
                code as f64
            }
        }
        Format::Ue8m0 if code == 0xFF => f64::NAN,
        Format::Ue8m0 => 2f64.powi(code as i32 - 127),
        Format::Ue4m3 => spec_decode(Format::E4m3fn, code & 0x7F),
        Format::I32 => code as i32 as f64,
    }
}

/// The code holding exactly `value` (test data are chosen representable; anything else is a
/// bug in the test).
fn encode_exact(format: Format, value: f64) -> u32 {
    let code = match format {
        Format::F32 => (value as f32).to_bits(),
        Format::Bf16 => (value as f32).to_bits() >> 16,
        Format::F16 => half::f16::from_f64(value).to_bits() as u32,
        Format::I32 => value as i32 as u32,
        _ => (0..1u32 << bits_of(format))
            .find(|&c| spec_decode(format, c) == value)
            .unwrap_or_else(|| panic!("{value} is not representable in {format}")),
    };
    assert_eq!(spec_decode(format, code), value, "{value} is not representable in {format}");
    code
}

/// A code that reads as NaN, or the largest value where the format has no NaN: written into
/// every slot the oracle must not read.
fn junk_code(format: Format) -> u32 {
    match format {
        Format::F32 => 0x7FC0_0000,
        Format::F16 => 0x7E00,
        Format::Bf16 => 0x7FC0,
        Format::E4m3fn | Format::Ue4m3 | Format::E5m2 => 0x7F,
        Format::E4m3fnuz | Format::E5m2fnuz => 0x80,
        Format::Ue8m0 => 0xFF,
        Format::E2m1 | Format::Int4 => 0x7,
        Format::Int8 => 0x7F,
        Format::I32 => i32::MAX as u32,
    }
}

/// Round-to-nearest-even of `value` into `format`, saturating for the 8-bit floats.
fn round_expected(format: Format, value: f64) -> f64 {
    match format {
        Format::F32 => value as f32 as f64,
        Format::Bf16 => {
            if !value.is_finite() {
                return value;
            }
            // Quantum of bf16 (8 significant bits) at value's binade; dividing by a power of two
            // is exact, so rounding the quotient to an integer is the exact RNE.
            let exponent = (value.abs().to_bits() >> 52) as i32 - 1023;
            let quantum = 2f64.powi(exponent.max(-126) - 7);
            let rounded = (value / quantum).round_ties_even() * quantum;
            if rounded.abs() >= 2f64.powi(128) {
                rounded.signum() * f64::INFINITY
            } else {
                rounded
            }
        }
        Format::I32 => value.round_ties_even().clamp(i32::MIN as f64, i32::MAX as f64),
        _ => {
            let mut best: Option<(f64, u32)> = None;
            for code in 0..1u32 << bits_of(format) {
                let v = spec_decode(format, code);
                if !v.is_finite() {
                    continue;
                }
                let better = match best {
                    None => true,
                    Some((b, bc)) => {
                        let (d, db) = ((v - value).abs(), (b - value).abs());
                        d < db || (d == db && code % 2 == 0 && bc % 2 == 1)
                    }
                };
                if better {
                    best = Some((v, code));
                }
            }
            best.unwrap().0
        }
    }
}

// =============================================================================================
// The little writer: dense matrices into buffers.
// =============================================================================================

fn store(format: Format, bytes: &mut [u8], index: usize, code: u32) {
    match bits_of(format) {
        4 => {
            let shift = (index & 1) * 4;
            bytes[index / 2] = (bytes[index / 2] & !(0xF << shift)) | (((code & 0xF) as u8) << shift);
        }
        8 => bytes[index] = code as u8,
        16 => bytes[2 * index..2 * index + 2].copy_from_slice(&(code as u16).to_le_bytes()),
        _ => bytes[4 * index..4 * index + 4].copy_from_slice(&code.to_le_bytes()),
    }
}

/// A buffer of `elements` slots of `format`, every slot holding the junk code.
fn junk_buffer(format: Format, elements: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; (elements as usize * bits_of(format) as usize).div_ceil(8)];
    for e in 0..elements as usize {
        store(format, &mut bytes, e, junk_code(format));
    }
    bytes
}

fn element_offset(order: Order, ld: u64, row: u64, col: u64) -> u64 {
    match order {
        Order::RowMajor => row * ld + col,
        Order::ColMajor => col * ld + row,
    }
}

/// Places `items` (each `rows x cols`, row-major) into a buffer laid out as `layout`; a
/// broadcast layout (batch stride 0) gets `items[0]` only.
fn write_matrix(layout: &MatrixLayout, rows: u64, cols: u64, batch: u64, items: &[Vec<f64>]) -> Vec<u8> {
    let last = element_offset(layout.order, layout.ld, rows - 1, cols - 1);
    let extent = (batch - 1) * layout.batch_stride + last + 1;
    let mut bytes = junk_buffer(layout.format, extent);
    let written = if layout.batch_stride == 0 { 1 } else { batch };
    for b in 0..written {
        for r in 0..rows {
            for c in 0..cols {
                let value = items[b as usize][(r * cols + c) as usize];
                let at = b * layout.batch_stride + element_offset(layout.order, layout.ld, r, c);
                store(layout.format, &mut bytes, at as usize, encode_exact(layout.format, value));
            }
        }
    }
    bytes
}

fn write_vector(format: Format, values: &[f64]) -> Vec<u8> {
    let mut bytes = junk_buffer(format, values.len() as u64);
    for (i, v) in values.iter().enumerate() {
        store(format, &mut bytes, i, encode_exact(format, *v));
    }
    bytes
}

fn transpose(m: &[f64], rows: u64, cols: u64) -> Vec<f64> {
    let mut t = vec![0.0; m.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[(c * rows + r) as usize] = m[(r * cols + c) as usize];
        }
    }
    t
}

// =============================================================================================
// Scales: own block shapes, grids and storage formulas.
// =============================================================================================

fn block_shape(g: ScaleGranularity, outer: u64, inner: u64) -> (u64, u64) {
    match g {
        ScaleGranularity::Tensor => (outer, inner),
        ScaleGranularity::PerOuter => (1, inner),
        ScaleGranularity::PerInner => (outer, 1),
        ScaleGranularity::Block { outer, inner } => (outer as u64, inner as u64),
        ScaleGranularity::Mx32 => (1, 32),
        ScaleGranularity::Nvfp4 => (1, 16),
    }
}

/// Entry of block (ob, ib) in a grid of (go, gi) blocks stored as `storage` with leading
/// dimension `ld`; the swizzle is cuBLASLt's documented 128x4 tile formula.
fn scale_entry(storage: ScaleStorage, ld: u64, (go, gi): (u64, u64), ob: u64, ib: u64) -> u64 {
    match storage {
        ScaleStorage::OuterMajor => ob * ld + ib,
        ScaleStorage::InnerMajor => ib * ld + ob,
        ScaleStorage::Swizzled128x4 => {
            let _ = go;
            let tile = (ob / 128) * gi.div_ceil(4) + ib / 4;
            tile * 512 + (ob % 32) * 16 + ((ob % 128) / 32) * 4 + ib % 4
        }
    }
}

fn scale_values(format: Format) -> &'static [f64] {
    match format {
        Format::Ue8m0 => &[0.25, 0.5, 1.0, 2.0, 4.0],
        Format::Ue4m3 => &[0.5, 0.75, 1.0, 1.5, 2.0, 3.0],
        _ => &[0.25, 0.5, 1.5, 2.0, 3.5],
    }
}

/// How a case's scales look.
#[derive(Debug, Clone, Copy)]
struct Scales {
    granularity: ScaleGranularity,
    format: Format,
    storage: ScaleStorage,
    /// Extra entries per line of the grid (OuterMajor / InnerMajor), filled with NaN.
    ld_pad: u64,
    /// Distinct scales per batch item (a gap of NaN between items), or one set for all.
    per_item: bool,
}

impl Scales {
    fn new(granularity: ScaleGranularity, format: Format, storage: ScaleStorage) -> Scales {
        Scales { granularity, format, storage, ld_pad: 0, per_item: false }
    }
}

/// Scales of one operand (outer x inner per item): the spec, the buffer, and the scale of every
/// element as a dense `[item][outer * inner]` matrix.
fn build_scales(
    s: &Scales,
    outer: u64,
    inner: u64,
    batch: u64,
    rng: &mut SplitMix64,
) -> (ScaleSpec, Vec<u8>, Vec<Vec<f64>>) {
    let (bo, bi) = block_shape(s.granularity, outer, inner);
    let grid = (outer.div_ceil(bo), inner.div_ceil(bi));
    let (ld, per_item) = match s.storage {
        ScaleStorage::OuterMajor => (grid.1 + s.ld_pad, (grid.0 - 1) * (grid.1 + s.ld_pad) + grid.1),
        ScaleStorage::InnerMajor => (grid.0 + s.ld_pad, (grid.1 - 1) * (grid.0 + s.ld_pad) + grid.0),
        ScaleStorage::Swizzled128x4 => (0, grid.0.div_ceil(128) * grid.1.div_ceil(4) * 512),
    };
    let batch_stride = if s.per_item { per_item + 3 } else { 0 };
    let items = if s.per_item { batch } else { 1 };
    let mut bytes = junk_buffer(s.format, (items - 1) * batch_stride + per_item);
    let mut dense = Vec::new();
    let choices = scale_values(s.format);
    for item in 0..items {
        let block_values: Vec<f64> =
            (0..grid.0 * grid.1).map(|_| choices[rng.below(choices.len() as u64) as usize]).collect();
        for ob in 0..grid.0 {
            for ib in 0..grid.1 {
                let at = item * batch_stride + scale_entry(s.storage, ld, grid, ob, ib);
                let code = encode_exact(s.format, block_values[(ob * grid.1 + ib) as usize]);
                store(s.format, &mut bytes, at as usize, code);
            }
        }
        let mut per_element = vec![0.0; (outer * inner) as usize];
        for o in 0..outer {
            for i in 0..inner {
                per_element[(o * inner + i) as usize] = block_values[((o / bo) * grid.1 + i / bi) as usize];
            }
        }
        dense.push(per_element);
    }
    let spec_ld = if s.ld_pad == 0 { 0 } else { ld };
    let spec = ScaleSpec {
        granularity: s.granularity,
        format: s.format,
        storage: s.storage,
        ld: spec_ld,
        batch_stride,
    };
    let dense = (0..batch).map(|b| dense[if s.per_item { b as usize } else { 0 }].clone()).collect();
    (spec, bytes, dense)
}

// =============================================================================================
// Cases.
// =============================================================================================

#[derive(Debug, Clone, Copy)]
enum Batching {
    /// Items one after another with `pad` junk elements between them.
    Strided { pad: u64 },
    /// Batch stride 0: one matrix for every item.
    Broadcast,
}

/// One stored matrix of a case.
#[derive(Debug, Clone, Copy)]
struct Mat {
    format: Format,
    order: Order,
    /// Leading dimension beyond the minimum, filled with junk.
    ld_pad: u64,
    batching: Batching,
}

impl Mat {
    fn new(format: Format, order: Order) -> Mat {
        Mat { format, order, ld_pad: 0, batching: Batching::Strided { pad: 0 } }
    }

    fn padded(format: Format, order: Order, ld_pad: u64) -> Mat {
        Mat { format, order, ld_pad, batching: Batching::Strided { pad: 2 } }
    }

    fn layout(&self, rows: u64, cols: u64) -> MatrixLayout {
        let (lines, min_ld) = match self.order {
            Order::RowMajor => (rows, cols),
            Order::ColMajor => (cols, rows),
        };
        let ld = min_ld + self.ld_pad;
        let batch_stride = match self.batching {
            Batching::Strided { pad } => lines * ld + pad,
            Batching::Broadcast => 0,
        };
        if bits_of(self.format) == 4 {
            assert!((ld | batch_stride) & 1 == 0, "packed test layouts need even ld and stride");
        }
        MatrixLayout { format: self.format, order: self.order, ld, batch_stride }
    }
}

#[derive(Debug, Clone)]
struct Case {
    name: String,
    m: u64,
    n: u64,
    k: u64,
    batch: u64,
    trans_a: Transpose,
    trans_b: Transpose,
    a: Mat,
    b: Mat,
    /// C is generated (and read) only when beta != 0.
    c: Mat,
    d: Mat,
    a_scale: Option<Scales>,
    b_scale: Option<Scales>,
    a_tensor_scale: Option<f64>,
    b_tensor_scale: Option<f64>,
    /// Pass the tensor scales and alpha/beta/d_scale as device pointers with read values.
    scalars_on_device: bool,
    alpha: f64,
    beta: f64,
    bias: Option<Bias>,
    activation: Activation,
    d_scale: Option<f64>,
    round_output: bool,
    seed: u64,
}

impl Case {
    fn new(name: &str, m: u64, n: u64, k: u64) -> Case {
        Case {
            name: name.to_string(),
            m,
            n,
            k,
            batch: 1,
            trans_a: Transpose::N,
            trans_b: Transpose::N,
            a: Mat::new(Format::Bf16, Order::RowMajor),
            b: Mat::new(Format::Bf16, Order::RowMajor),
            c: Mat::new(Format::F32, Order::RowMajor),
            d: Mat::new(Format::F32, Order::RowMajor),
            a_scale: None,
            b_scale: None,
            a_tensor_scale: None,
            b_tensor_scale: None,
            scalars_on_device: false,
            alpha: 1.0,
            beta: 0.0,
            bias: None,
            activation: Activation::None,
            d_scale: None,
            round_output: true,
            seed: 1,
        }
    }
}

/// Exactly representable test values for an element format.
fn random_value(format: Format, rng: &mut SplitMix64) -> f64 {
    const SMALL: [f64; 15] =
        [-4.0, -3.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -6.0];
    match format {
        Format::Int8 => rng.below(256) as f64 - 128.0,
        Format::Int4 => rng.below(16) as f64 - 8.0,
        Format::I32 => rng.below(2001) as f64 - 1000.0,
        _ => SMALL[rng.below(SMALL.len() as u64) as usize],
    }
}

fn random_matrix(format: Format, len: u64, rng: &mut SplitMix64) -> Vec<f64> {
    (0..len).map(|_| random_value(format, rng)).collect()
}

struct Built {
    problem: GemmProblem,
    inputs: HostInputs,
    /// op(A) and op(B) of every item with all scales applied.
    a_eff: Vec<Vec<f64>>,
    b_eff: Vec<Vec<f64>>,
    /// `[batch][m][n]`.
    expected: Vec<f64>,
}

fn scalar(v: f64, on_device: bool, ptr: u64) -> Scalar {
    if on_device {
        Scalar::Device { ptr, format: Format::F32 }
    } else {
        Scalar::Host(v)
    }
}

fn build(case: &Case) -> Built {
    let (m, n, k, batch) = (case.m, case.n, case.k, case.batch);
    let mut rng = SplitMix64::new(case.seed);
    let one_per_item = |mat: &Mat| match mat.batching {
        Batching::Broadcast => 1,
        Batching::Strided { .. } => batch,
    };

    // Logical op(A) (m x k) and op(B) (k x n) per item; broadcast operands repeat item 0.
    let a_items: Vec<Vec<f64>> =
        (0..one_per_item(&case.a)).map(|_| random_matrix(case.a.format, m * k, &mut rng)).collect();
    let b_items: Vec<Vec<f64>> =
        (0..one_per_item(&case.b)).map(|_| random_matrix(case.b.format, k * n, &mut rng)).collect();
    let a_op = |b: u64| &a_items[(b as usize).min(a_items.len() - 1)];
    let b_op = |b: u64| &b_items[(b as usize).min(b_items.len() - 1)];

    let (a_rows, a_cols) = if case.trans_a == Transpose::N { (m, k) } else { (k, m) };
    let (b_rows, b_cols) = if case.trans_b == Transpose::N { (k, n) } else { (n, k) };
    let a_layout = case.a.layout(a_rows, a_cols);
    let b_layout = case.b.layout(b_rows, b_cols);
    let stored = |op: &Vec<f64>, t: Transpose, rows: u64, cols: u64| {
        if t == Transpose::N {
            op.clone()
        } else {
            transpose(op, cols, rows)
        }
    };
    let a_stored: Vec<Vec<f64>> = a_items.iter().map(|x| stored(x, case.trans_a, a_rows, a_cols)).collect();
    let b_stored: Vec<Vec<f64>> = b_items.iter().map(|x| stored(x, case.trans_b, b_rows, b_cols)).collect();
    let a_bytes = write_matrix(&a_layout, a_rows, a_cols, batch, &a_stored);
    let b_bytes = write_matrix(&b_layout, b_rows, b_cols, batch, &b_stored);

    // Scales in outer x inner: A is (m, k) as op(A) is; B is (n, k), the transpose of op(B).
    let ones = |outer: u64, inner: u64| vec![vec![1.0; (outer * inner) as usize]; batch as usize];
    let (a_spec, a_scale_bytes, a_scale_dense) = match &case.a_scale {
        Some(s) => {
            let (spec, bytes, dense) = build_scales(s, m, k, batch, &mut rng);
            (Some(spec), Some(bytes), dense)
        }
        None => (None, None, ones(m, k)),
    };
    let (b_spec, b_scale_bytes, b_scale_dense) = match &case.b_scale {
        Some(s) => {
            let (spec, bytes, dense) = build_scales(s, n, k, batch, &mut rng);
            (Some(spec), Some(bytes), dense)
        }
        None => (None, None, ones(n, k)),
    };
    let ta = case.a_tensor_scale.unwrap_or(1.0);
    let tb = case.b_tensor_scale.unwrap_or(1.0);
    let a_eff: Vec<Vec<f64>> = (0..batch)
        .map(|b| {
            let mut v = vec![0.0; (m * k) as usize];
            for i in 0..m {
                for kk in 0..k {
                    let at = (i * k + kk) as usize;
                    v[at] = a_op(b)[at] * a_scale_dense[b as usize][at] * ta;
                }
            }
            v
        })
        .collect();
    let b_eff: Vec<Vec<f64>> = (0..batch)
        .map(|b| {
            let mut v = vec![0.0; (k * n) as usize];
            for kk in 0..k {
                for j in 0..n {
                    v[(kk * n + j) as usize] = b_op(b)[(kk * n + j) as usize]
                        * b_scale_dense[b as usize][(j * k + kk) as usize]
                        * tb;
                }
            }
            v
        })
        .collect();

    let reads_c = case.beta != 0.0;
    let c_layout = case.c.layout(m, n);
    let c_items: Vec<Vec<f64>> = if reads_c {
        (0..one_per_item(&case.c)).map(|_| random_matrix(case.c.format, m * n, &mut rng)).collect()
    } else {
        Vec::new()
    };
    let c_bytes = reads_c.then(|| write_matrix(&c_layout, m, n, batch, &c_items));
    let bias_values: Vec<f64> = match case.bias {
        Some(bias) => {
            let len = if bias.axis == BiasAxis::Rows { m } else { n };
            random_matrix(bias.format, len, &mut rng)
        }
        None => Vec::new(),
    };

    let alpha = case.alpha;
    let beta = case.beta;
    let d_scale = case.d_scale.unwrap_or(1.0);
    let mut expected = Vec::with_capacity((batch * m * n) as usize);
    for b in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0;
                for kk in 0..k {
                    acc +=
                        a_eff[b as usize][(i * k + kk) as usize] * b_eff[b as usize][(kk * n + j) as usize];
                }
                let mut t = alpha * acc;
                if reads_c {
                    t += beta * c_items[(b as usize).min(c_items.len() - 1)][(i * n + j) as usize];
                }
                if let Some(bias) = case.bias {
                    t += bias_values[if bias.axis == BiasAxis::Rows { i } else { j } as usize];
                }
                let t = match case.activation {
                    Activation::None => t,
                    Activation::Relu => t.max(0.0),
                    Activation::GeluTanh => {
                        0.5 * t
                            * (1.0
                                + ((2.0 / std::f64::consts::PI).sqrt() * (t + 0.044715 * t.powi(3))).tanh())
                    }
                };
                let d = t * d_scale;
                expected.push(if case.round_output { round_expected(case.d.format, d) } else { d });
            }
        }
    }

    let dev = case.scalars_on_device;
    let problem = GemmProblem {
        m,
        n,
        k,
        batch,
        trans_a: case.trans_a,
        trans_b: case.trans_b,
        a: a_layout,
        b: b_layout,
        c: reads_c.then_some(c_layout),
        d: case.d.layout(m, n),
        a_scale: a_spec,
        b_scale: b_spec,
        a_tensor_scale: case.a_tensor_scale.map(|v| scalar(v, dev, 0x1000)),
        b_tensor_scale: case.b_tensor_scale.map(|v| scalar(v, dev, 0x2000)),
        d_scale: case.d_scale.map(|v| scalar(v, dev, 0x3000)),
        alpha: scalar(alpha, dev, 0x4000),
        beta: scalar(beta, dev, 0x5000),
        epilogue: Epilogue { bias: case.bias, activation: case.activation },
        ..GemmProblem::row_major(m, n, k, case.a.format, case.b.format, case.d.format)
    };
    let device_scalars = if dev {
        DeviceScalarValues {
            alpha: Some(alpha),
            beta: Some(beta),
            a_tensor_scale: case.a_tensor_scale,
            b_tensor_scale: case.b_tensor_scale,
            d_scale: case.d_scale,
        }
    } else {
        DeviceScalarValues::default()
    };
    let inputs = HostInputs {
        a: a_bytes,
        b: b_bytes,
        c: c_bytes,
        a_scale: a_scale_bytes,
        b_scale: b_scale_bytes,
        bias: case.bias.map(|bias| write_vector(bias.format, &bias_values)),
        device_scalars,
    };
    Built { problem, inputs, a_eff, b_eff, expected }
}

/// Equal values (NaN equals NaN); GELU goes through tanh, the only inexact step in the tests.
fn assert_matches(name: &str, got: &[f64], expected: &[f64], rel_tol: f64) {
    assert_eq!(got.len(), expected.len(), "{name}: length");
    for (at, (g, e)) in got.iter().zip(expected).enumerate() {
        let ok = if e.is_nan() { g.is_nan() } else { (g - e).abs() <= rel_tol * e.abs().max(1.0) || g == e };
        assert!(ok, "{name}: element {at}: got {g}, expected {e}");
    }
}

fn run_case(case: &Case) -> Built {
    let built = build(case);
    let options = OracleOptions { round_output: case.round_output, rows: None };
    let out = reference_gemm(&built.problem, &built.inputs, &options)
        .unwrap_or_else(|e| panic!("{}: {e} ({})", case.name, built.problem));
    assert_eq!(out.batch, case.batch, "{}", case.name);
    assert_eq!(out.n, case.n, "{}", case.name);
    assert_eq!(out.rows, (0..case.m).collect::<Vec<_>>(), "{}", case.name);
    let tol = if case.activation == Activation::GeluTanh { 1e-13 } else { 0.0 };
    assert_matches(&case.name, &out.values, &built.expected, tol);
    built
}

fn row_major(format: Format) -> Mat {
    Mat::new(format, Order::RowMajor)
}

// =============================================================================================
// Hand-computed cases: numbers written out.
// =============================================================================================

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn inputs(a: Vec<u8>, b: Vec<u8>) -> HostInputs {
    HostInputs { a, b, ..HostInputs::default() }
}

fn full(problem: &GemmProblem, inputs: &HostInputs) -> Vec<f64> {
    reference_gemm(problem, inputs, &OracleOptions::default()).unwrap().values
}

#[test]
fn hand_2x2x2_f32_row_major() {
    // [1 2] [5 6]   [1*5+2*7 1*6+2*8]   [19 22]
    // [3 4] [7 8] = [3*5+4*7 3*6+4*8] = [43 50]
    let p = GemmProblem::row_major(2, 2, 2, Format::F32, Format::F32, Format::F32);
    let x = inputs(f32_bytes(&[1., 2., 3., 4.]), f32_bytes(&[5., 6., 7., 8.]));
    assert_eq!(full(&p, &x), [19., 22., 43., 50.]);
}

#[test]
fn hand_2x2x2_transposed_and_column_major() {
    // The same product with A stored column-major, B stored as B^T (trans_b = T) and D
    // column-major: the values come back in [row][n] order whatever D's order.
    let mut p = GemmProblem::row_major(2, 2, 2, Format::F32, Format::F32, Format::F32);
    p.a.order = Order::ColMajor;
    p.trans_b = Transpose::T;
    p.d.order = Order::ColMajor;
    let x = inputs(f32_bytes(&[1., 3., 2., 4.]), f32_bytes(&[5., 7., 6., 8.]));
    assert_eq!(full(&p, &x), [19., 22., 43., 50.]);
    // trans_a = T over a row-major buffer reads the same bytes as column-major A.
    let mut q = GemmProblem::row_major(2, 2, 2, Format::F32, Format::F32, Format::F32);
    q.trans_a = Transpose::T;
    q.b.order = Order::ColMajor;
    let y = inputs(f32_bytes(&[1., 3., 2., 4.]), f32_bytes(&[5., 7., 6., 8.]));
    assert_eq!(full(&q, &y), [19., 22., 43., 50.]);
}

#[test]
fn hand_2x2x2_e4m3_with_per_row_and_per_column_scales() {
    // e4m3fn codes: 1.0 = 0x38, 2.0 = 0x40, 3.0 = 0x44, 4.0 = 0x48, 5.0 = 0x4A, 6.0 = 0x4C,
    // 7.0 = 0x4E, 8.0 = 0x50.
    // A = [1 2; 3 4] with per-row scales (0.5, 2): effective [0.5 1; 6 8].
    // B = [5 6; 7 8] with per-column scales (1, 0.25): effective [5 1.5; 7 2].
    // D = [0.5*5+1*7  0.5*1.5+1*2; 6*5+8*7  6*1.5+8*2] = [9.5 2.75; 86 25].
    let mut p = GemmProblem::row_major(2, 2, 2, Format::E4m3fn, Format::E4m3fn, Format::F32);
    p.a_scale = Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32));
    p.b_scale = Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32));
    let x = HostInputs {
        a_scale: Some(f32_bytes(&[0.5, 2.0])),
        b_scale: Some(f32_bytes(&[1.0, 0.25])),
        ..inputs(vec![0x38, 0x40, 0x44, 0x48], vec![0x4A, 0x4C, 0x4E, 0x50])
    };
    assert_eq!(full(&p, &x), [9.5, 2.75, 86., 25.]);
}

#[test]
fn hand_2x2x2_epilogue_alpha_beta_bias_relu_d_scale() {
    // acc = I * [1 -2; 3 -4]; C = [1 1; 0.5 10]; alpha 2, beta -1, column bias (0.5, 0):
    // t = [2-1+0.5  -4-1+0; 6-0.5+0.5  -8-10+0] = [1.5 -5; 6 -18]
    // relu -> [1.5 0; 6 0]; d_scale 0.5 -> [0.75 0; 3 0].
    let mut p = GemmProblem::row_major(2, 2, 2, Format::F32, Format::F32, Format::F32);
    p.c = Some(MatrixLayout::packed(Format::F32, Order::RowMajor, 2, 2));
    p.alpha = Scalar::Host(2.0);
    p.beta = Scalar::Host(-1.0);
    p.epilogue = Epilogue {
        bias: Some(Bias { format: Format::F32, axis: BiasAxis::Cols }),
        activation: Activation::Relu,
    };
    p.d_scale = Some(Scalar::Host(0.5));
    let x = HostInputs {
        c: Some(f32_bytes(&[1., 1., 0.5, 10.])),
        bias: Some(f32_bytes(&[0.5, 0.])),
        ..inputs(f32_bytes(&[1., 0., 0., 1.]), f32_bytes(&[1., -2., 3., -4.]))
    };
    assert_eq!(full(&p, &x), [0.75, 0., 3., 0.]);
    // A row bias (2, -1) instead, no activation, no d_scale:
    // t = [2-1+2  -4-1+2; 6-0.5-1  -8-10-1] = [3 -3; 4.5 -19].
    p.epilogue = Epilogue {
        bias: Some(Bias { format: Format::F32, axis: BiasAxis::Rows }),
        activation: Activation::None,
    };
    p.d_scale = None;
    let y = HostInputs { bias: Some(f32_bytes(&[2., -1.])), ..x };
    assert_eq!(full(&p, &y), [3., -3., 4.5, -19.]);
}

#[test]
fn hand_nan_input_propagates_through_relu() {
    // A = [NaN 0; -1 1], B = I: relu gives [NaN 0; 0 1]. A NaN in the inputs stays visible in the
    // reference instead of being clamped to 0 as fmaxf would.
    let mut p = GemmProblem::row_major(2, 2, 2, Format::F32, Format::F32, Format::F32);
    p.epilogue.activation = Activation::Relu;
    let x = inputs(f32_bytes(&[f32::NAN, 0., -1., 1.]), f32_bytes(&[1., 0., 0., 1.]));
    let got = full(&p, &x);
    assert!(got[0].is_nan() && got[1].is_nan(), "{got:?}");
    assert_eq!(got[2..], [0., 1.]);
}

#[test]
fn hand_2x2x2_gelu_tanh() {
    // t = I * [1 -1; 0 2] -> GELU_tanh values computed independently (Python, math.tanh).
    let mut p = GemmProblem::row_major(2, 2, 2, Format::F32, Format::F32, Format::F32);
    p.epilogue.activation = Activation::GeluTanh;
    let x = inputs(f32_bytes(&[1., 0., 0., 1.]), f32_bytes(&[1., -1., 0., 2.]));
    let got = full(&p, &x);
    let expected = [0.8411919906082768, -0.15880800939172324, 0.0, 1.954597694087775];
    // D is f32: compare after rounding the expected values the same way.
    let expected: Vec<f64> = expected.iter().map(|v| *v as f32 as f64).collect();
    assert_eq!(got, expected);
    assert_eq!(gelu_tanh(-0.5), -0.15428599017485606);
    assert_eq!(gelu_tanh(3.0), 2.996362607918227);
}

#[test]
fn hand_2x2x2_int8_to_i32_exact() {
    // [127 -128] [ 127 1]   [127*127+128*128  127-128]   [32513  -1]
    // [  1    2] [-128 1] = [127-256          1+2    ] = [ -129   3]
    let p = GemmProblem::row_major(2, 2, 2, Format::Int8, Format::Int8, Format::I32);
    let x = inputs(vec![127, 0x80, 1, 2], vec![127, 1, 0x80, 1]);
    assert_eq!(full(&p, &x), [32513., -1., -129., 3.]);
}

#[test]
fn hand_2x2x2_packed_e2m1_and_int4() {
    // e2m1 codes 0.5=1, 1=2, 1.5=3, 2=4, 3=5, 4=6, 6=7; element 2i in the low nibble.
    // A = [0.5 1; 1.5 2] -> bytes 0x21, 0x43; B = [2 3; 4 6] -> bytes 0x54, 0x76.
    // D = [0.5*2+1*4  0.5*3+1*6; 1.5*2+2*4  1.5*3+2*6] = [5 7.5; 11 16.5].
    let p = GemmProblem::row_major(2, 2, 2, Format::E2m1, Format::E2m1, Format::F32);
    assert_eq!(full(&p, &inputs(vec![0x21, 0x43], vec![0x54, 0x76])), [5., 7.5, 11., 16.5]);
    // int4: A = [-8 7; -1 1] -> bytes 0x78, 0x1F; B = identity -> bytes 0x01, 0x10; D = A.
    let q = GemmProblem::row_major(2, 2, 2, Format::Int4, Format::Int4, Format::I32);
    assert_eq!(full(&q, &inputs(vec![0x78, 0x1F], vec![0x01, 0x10])), [-8., 7., -1., 1.]);
}

#[test]
fn hand_output_rounding_to_fp8_saturates_and_bf16_rounds_to_even() {
    // 1 x 1 x 1 products: 1000 -> e4m3fn saturates to 448; 1 + 2^-8 is a bf16 tie between 1 and
    // 1 + 2^-7 and goes to the even one, 1; 1 + 3 * 2^-8 ties to 1 + 2^-6.
    let mut p = GemmProblem::row_major(1, 1, 1, Format::F32, Format::F32, Format::E4m3fn);
    let x = inputs(f32_bytes(&[1000.]), f32_bytes(&[1.]));
    assert_eq!(full(&p, &x), [448.]);
    let x = inputs(f32_bytes(&[-1000.]), f32_bytes(&[1.]));
    assert_eq!(full(&p, &x), [-448.]);
    p.d.format = Format::Bf16;
    let x = inputs(f32_bytes(&[1. + 2f32.powi(-8)]), f32_bytes(&[1.]));
    assert_eq!(full(&p, &x), [1.]);
    let x = inputs(f32_bytes(&[1. + 3. * 2f32.powi(-8)]), f32_bytes(&[1.]));
    assert_eq!(full(&p, &x), [1. + 2f64.powi(-6)]);
    // Without rounding the exact value comes back.
    let out = reference_gemm(&p, &x, &OracleOptions { round_output: false, rows: None }).unwrap();
    assert_eq!(out.values, [1. + 3. * 2f64.powi(-8)]);
}

// =============================================================================================
// Table-driven cases.
// =============================================================================================

#[test]
fn every_transposition_and_order() {
    let mut count = 0;
    for trans_a in [Transpose::N, Transpose::T] {
        for trans_b in [Transpose::N, Transpose::T] {
            for a_order in [Order::RowMajor, Order::ColMajor] {
                for b_order in [Order::RowMajor, Order::ColMajor] {
                    for d_order in [Order::RowMajor, Order::ColMajor] {
                        let name =
                            format!("{trans_a:?}{trans_b:?} a:{a_order:?} b:{b_order:?} d:{d_order:?}");
                        run_case(&Case {
                            trans_a,
                            trans_b,
                            a: Mat::padded(Format::Bf16, a_order, 3),
                            b: Mat::padded(Format::E4m3fn, b_order, 5),
                            d: Mat::padded(Format::F32, d_order, 1),
                            seed: count,
                            ..Case::new(&name, 5, 7, 6)
                        });
                        count += 1;
                    }
                }
            }
        }
    }
    assert_eq!(count, 32);
}

#[test]
fn leading_dimension_padding_is_never_read() {
    // Padding full of NaN in A, B, C and (irrelevant to the oracle) D: any stray read shows.
    for (a_fmt, b_fmt) in
        [(Format::F32, Format::F16), (Format::E5m2, Format::E4m3fnuz), (Format::Int8, Format::Int8)]
    {
        let built = run_case(&Case {
            a: Mat::padded(a_fmt, Order::RowMajor, 9),
            b: Mat::padded(b_fmt, Order::ColMajor, 4),
            c: Mat::padded(Format::Bf16, Order::ColMajor, 2),
            d: Mat::padded(Format::F32, Order::RowMajor, 3),
            beta: 0.5,
            ..Case::new(&format!("ld padding {a_fmt}x{b_fmt}"), 4, 3, 5)
        });
        assert!(built.expected.iter().all(|v| v.is_finite()));
    }
}

#[test]
fn batches_strided_and_broadcast() {
    let base = Case { batch: 3, beta: 1.0, ..Case::new("batch", 4, 5, 6) };
    run_case(&Case {
        name: "strided with gaps".into(),
        a: Mat::padded(Format::Bf16, Order::RowMajor, 2),
        b: Mat::padded(Format::Bf16, Order::ColMajor, 1),
        c: Mat::padded(Format::F32, Order::ColMajor, 1),
        d: Mat::padded(Format::F32, Order::ColMajor, 2),
        ..base.clone()
    });
    let broadcast = |format, order| Mat { format, order, ld_pad: 0, batching: Batching::Broadcast };
    run_case(&Case {
        name: "broadcast A".into(),
        a: broadcast(Format::Bf16, Order::ColMajor),
        trans_b: Transpose::T,
        ..base.clone()
    });
    run_case(&Case {
        name: "broadcast B (shared weights) with per-item A scales".into(),
        a: row_major(Format::E4m3fn),
        b: broadcast(Format::E4m3fn, Order::RowMajor),
        a_scale: Some(Scales {
            per_item: true,
            ..Scales::new(ScaleGranularity::PerOuter, Format::F32, ScaleStorage::OuterMajor)
        }),
        b_scale: Some(Scales::new(ScaleGranularity::PerOuter, Format::F32, ScaleStorage::OuterMajor)),
        ..base.clone()
    });
    run_case(&Case {
        name: "broadcast B with per-item B scales".into(),
        b: broadcast(Format::E4m3fn, Order::RowMajor),
        b_scale: Some(Scales {
            per_item: true,
            ..Scales::new(ScaleGranularity::PerInner, Format::F32, ScaleStorage::InnerMajor)
        }),
        ..base.clone()
    });
    run_case(&Case {
        name: "broadcast C".into(),
        c: broadcast(Format::F32, Order::RowMajor),
        ..base.clone()
    });
    // Broadcast B wider than one decode panel (N > 256): decoded once and reused.
    run_case(&Case {
        name: "broadcast wide B".into(),
        b: broadcast(Format::E4m3fn, Order::ColMajor),
        trans_b: Transpose::T,
        ..Case { batch: 2, ..Case::new("", 3, 300, 4) }
    });
}

#[test]
fn every_scale_granularity_and_storage() {
    use ScaleGranularity as G;
    use ScaleStorage as S;
    let granularities = [
        G::Tensor,
        G::PerOuter,
        G::PerInner,
        G::Block { outer: 1, inner: 4 },
        G::Block { outer: 3, inner: 4 },
        G::Block { outer: 4, inner: 1 },
        G::Mx32,
        G::Nvfp4,
    ];
    let mut seed = 100;
    for granularity in granularities {
        for storage in [S::OuterMajor, S::InnerMajor] {
            for ld_pad in [0, 3] {
                for per_item in [false, true] {
                    let spec = |format| Scales { granularity, format, storage, ld_pad, per_item };
                    seed += 1;
                    // m, n not multiples of the block sizes: partial edge blocks; K = 40 gives two
                    // MX blocks and three NVFP4 blocks, the last partial.
                    run_case(&Case {
                        batch: 2,
                        trans_a: if seed % 2 == 0 { Transpose::T } else { Transpose::N },
                        trans_b: if seed % 3 == 0 { Transpose::N } else { Transpose::T },
                        a: row_major(Format::E4m3fn),
                        b: Mat::new(Format::E4m3fn, Order::ColMajor),
                        a_scale: Some(spec(Format::F32)),
                        b_scale: Some(spec(Format::Ue8m0)),
                        seed,
                        ..Case::new(
                            &format!("{granularity:?} {storage:?} ld+{ld_pad} per_item={per_item}"),
                            7,
                            5,
                            40,
                        )
                    });
                }
            }
        }
    }
    // Weight-style 128x128 blocks on B with 1x128 activation groups on A (DeepSeek-style).
    run_case(&Case {
        a: row_major(Format::E4m3fn),
        b: row_major(Format::E4m3fn),
        trans_b: Transpose::T,
        a_scale: Some(Scales::new(G::Block { outer: 1, inner: 128 }, Format::F32, S::InnerMajor)),
        b_scale: Some(Scales::new(G::Block { outer: 128, inner: 128 }, Format::F32, S::OuterMajor)),
        ..Case::new("deepseek blocks", 3, 130, 260)
    });
    // bf16 and f16 scale formats.
    run_case(&Case {
        a_scale: Some(Scales::new(G::PerOuter, Format::Bf16, S::OuterMajor)),
        b_scale: Some(Scales::new(G::PerInner, Format::F16, S::OuterMajor)),
        ..Case::new("bf16/f16 scales", 3, 4, 5)
    });
}

#[test]
fn swizzled_128x4_scales_over_several_tiles() {
    use ScaleGranularity as G;
    use ScaleStorage as S;
    // M = 160 and N = 136 span two 128-row tiles; K = 320 gives 10 MX blocks (3 inner tiles,
    // the last half empty) and 20 NVFP4 blocks (5 inner tiles).
    let swizzled = |g, format| Some(Scales::new(g, format, S::Swizzled128x4));
    run_case(&Case {
        a: row_major(Format::E2m1),
        b: row_major(Format::E2m1),
        trans_b: Transpose::T,
        a_scale: swizzled(G::Mx32, Format::Ue8m0),
        b_scale: swizzled(G::Mx32, Format::Ue8m0),
        ..Case::new("mxfp4 swizzled", 160, 136, 320)
    });
    run_case(&Case {
        a: row_major(Format::E2m1),
        b: row_major(Format::E2m1),
        trans_b: Transpose::T,
        a_scale: swizzled(G::Nvfp4, Format::Ue4m3),
        b_scale: swizzled(G::Nvfp4, Format::Ue4m3),
        a_tensor_scale: Some(0.5),
        b_tensor_scale: Some(1.25),
        ..Case::new("nvfp4 swizzled with tensor scales", 160, 136, 320)
    });
    // MXFP8 with per-item swizzled scales in a batch.
    run_case(&Case {
        batch: 2,
        a: Mat::padded(Format::E4m3fn, Order::RowMajor, 4),
        b: Mat::padded(Format::E5m2, Order::ColMajor, 2),
        a_scale: Some(Scales { per_item: true, ..Scales::new(G::Mx32, Format::Ue8m0, S::Swizzled128x4) }),
        b_scale: Some(Scales { per_item: true, ..Scales::new(G::Mx32, Format::Ue8m0, S::Swizzled128x4) }),
        ..Case::new("mxfp8 swizzled batch", 130, 9, 160)
    });
}

#[test]
fn tensor_scales_host_and_device() {
    for on_device in [false, true] {
        run_case(&Case {
            a: row_major(Format::E2m1),
            b: row_major(Format::E2m1),
            trans_b: Transpose::T,
            a_scale: Some(Scales::new(ScaleGranularity::Nvfp4, Format::Ue4m3, ScaleStorage::OuterMajor)),
            b_scale: Some(Scales::new(ScaleGranularity::Nvfp4, Format::Ue4m3, ScaleStorage::OuterMajor)),
            a_tensor_scale: Some(0.375),
            b_tensor_scale: Some(2.5),
            scalars_on_device: on_device,
            alpha: 0.5,
            d_scale: Some(4.0),
            ..Case::new(&format!("nvfp4 tensor scales on_device={on_device}"), 6, 4, 48)
        });
    }
}

#[test]
fn alpha_beta_c_bias_activation_d_scale() {
    let base = Case { batch: 2, alpha: 1.5, beta: -0.5, ..Case::new("epilogue", 6, 5, 8) };
    for (c, d) in [(Order::ColMajor, Order::RowMajor), (Order::RowMajor, Order::ColMajor)] {
        for axis in [BiasAxis::Rows, BiasAxis::Cols] {
            for activation in [Activation::None, Activation::Relu, Activation::GeluTanh] {
                for on_device in [false, true] {
                    run_case(&Case {
                        name: format!("C {c:?} D {d:?} bias {axis:?} {activation:?} device={on_device}"),
                        c: Mat::padded(Format::Bf16, c, 2),
                        d: Mat::padded(Format::F32, d, 1),
                        bias: Some(Bias { format: Format::Bf16, axis }),
                        activation,
                        d_scale: Some(0.25),
                        scalars_on_device: on_device,
                        round_output: false,
                        ..base.clone()
                    });
                }
            }
        }
    }
}

#[test]
fn output_rounding_to_bf16_and_fp8() {
    for d_format in [Format::Bf16, Format::E4m3fn, Format::E5m2, Format::F32] {
        for d_scale in [None, Some(0.125), Some(64.0)] {
            run_case(&Case {
                a: row_major(Format::E4m3fn),
                b: row_major(Format::E4m3fn),
                d: row_major(d_format),
                a_scale: Some(Scales::new(ScaleGranularity::PerOuter, Format::F32, ScaleStorage::OuterMajor)),
                d_scale,
                ..Case::new(&format!("round to {d_format} d_scale {d_scale:?}"), 5, 6, 64)
            });
        }
    }
}

#[test]
fn int8_to_i32_is_exact() {
    // Sums up to 96 * 128 * 128 = 1.5M with alternating signs: every partial sum an integer.
    let built = run_case(&Case {
        a: row_major(Format::Int8),
        b: Mat::new(Format::Int8, Order::ColMajor),
        c: row_major(Format::I32),
        d: row_major(Format::I32),
        beta: 1.0,
        ..Case::new("int8 gemm", 4, 3, 96)
    });
    assert!(built.expected.iter().all(|v| v.fract() == 0.0));
    // Extreme operands: every product is (-128)^2.
    let k = 512u64;
    let p = GemmProblem::row_major(1, 1, k, Format::Int8, Format::Int8, Format::I32);
    let x = inputs(vec![0x80; k as usize], vec![0x80; k as usize]);
    assert_eq!(full(&p, &x), [(k * 128 * 128) as f64]);
}

#[test]
fn packed_4bit_operands_in_every_layout() {
    for (fa, fb) in [(Format::E2m1, Format::E2m1), (Format::Int4, Format::Int4), (Format::E2m1, Format::Bf16)]
    {
        for trans_a in [Transpose::N, Transpose::T] {
            for order in [Order::RowMajor, Order::ColMajor] {
                // Odd M, N, K: a row of odd length ends mid-byte, so ld needs an odd pad.
                run_case(&Case {
                    batch: 2,
                    trans_a,
                    a: Mat::padded(fa, order, 1),
                    b: Mat::padded(fb, order.flipped(), 3),
                    d: row_major(Format::F32),
                    ..Case::new(&format!("{fa}x{fb} {trans_a:?} {order:?}"), 5, 3, 7)
                });
            }
        }
    }
}

// =============================================================================================
// Rows mode, operand decoding, output decoding.
// =============================================================================================

/// A problem of non-dyadic data (bf16 normals with f32 scales) wider than one decode panel
/// and deeper than one k block, so blocking is exercised.
fn awkward_problem() -> (GemmProblem, HostInputs) {
    let (m, n, k, batch) = (9u64, 301u64, 300u64, 2u64);
    let mut rng = SplitMix64::new(7);
    let mut p = GemmProblem::row_major(m, n, k, Format::Bf16, Format::Bf16, Format::F32);
    p.batch = batch;
    p.trans_b = Transpose::T;
    p.a = MatrixLayout { format: Format::Bf16, order: Order::RowMajor, ld: k + 8, batch_stride: m * (k + 8) };
    p.b = MatrixLayout { format: Format::Bf16, order: Order::RowMajor, ld: k, batch_stride: 0 };
    p.a_scale = Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32));
    p.b_scale = Some(ScaleSpec::new(ScaleGranularity::Block { outer: 128, inner: 128 }, Format::F32));
    p.c = Some(MatrixLayout::packed(Format::Bf16, Order::ColMajor, m, n));
    p.c.as_mut().unwrap().batch_stride = m * n;
    p.beta = Scalar::Host(0.3);
    p.epilogue = Epilogue {
        bias: Some(Bias { format: Format::F32, axis: BiasAxis::Cols }),
        activation: Activation::GeluTanh,
    };
    let bf16 = |rng: &mut SplitMix64| (rng.normal() as f32).to_bits() >> 16;
    let mut a = junk_buffer(Format::Bf16, batch * m * (k + 8));
    for b in 0..batch {
        for i in 0..m {
            for kk in 0..k {
                store(Format::Bf16, &mut a, (b * m * (k + 8) + i * (k + 8) + kk) as usize, bf16(&mut rng));
            }
        }
    }
    let b_bytes: Vec<u8> = (0..n * k).flat_map(|_| (bf16(&mut rng) as u16).to_le_bytes()).collect();
    let c: Vec<u8> = (0..batch * m * n).flat_map(|_| (bf16(&mut rng) as u16).to_le_bytes()).collect();
    let scales = |count: u64, rng: &mut SplitMix64| {
        f32_bytes(&(0..count).map(|_| rng.uniform(0.1, 2.0) as f32).collect::<Vec<_>>())
    };
    let x = HostInputs {
        a,
        b: b_bytes,
        c: Some(c),
        a_scale: Some(scales(m, &mut rng)),
        b_scale: Some(scales(3 * 3, &mut rng)),
        bias: Some(scales(n, &mut rng)),
        device_scalars: DeviceScalarValues::default(),
    };
    (p, x)
}

#[test]
fn rows_mode_equals_rows_of_the_full_result() {
    let (p, x) = awkward_problem();
    // Unrounded, so a difference in the last bit of the f64 sums cannot hide behind rounding
    // to D's format; then rounded, as the checks use it.
    for round_output in [false, true] {
        let full_out = reference_gemm(&p, &x, &OracleOptions { round_output, rows: None }).unwrap();
        // Rows 8 and 5 change between the 4-row register tiles and the edge path.
        let rows = vec![8, 0, 3, 3, 5];
        let part = reference_gemm(&p, &x, &OracleOptions { round_output, rows: Some(rows.clone()) }).unwrap();
        assert_eq!(part.rows, rows);
        assert_eq!(part.values.len(), (p.batch * 5 * p.n) as usize);
        for b in 0..p.batch {
            for (position, &row) in rows.iter().enumerate() {
                let expected = full_out.row(b, row as usize).unwrap();
                let got = part.row(b, position).unwrap();
                // Bit-identical: the same additions in the same order.
                assert!(
                    expected.iter().zip(got).all(|(e, g)| e.to_bits() == g.to_bits()),
                    "batch {b} row {row} round_output {round_output}"
                );
            }
        }
        assert!(part.row(p.batch, 0).is_none() && part.row(0, rows.len()).is_none());
    }
}

#[test]
fn full_result_of_awkward_problem_matches_naive_loop() {
    let (p, x) = awkward_problem();
    let out = reference_gemm(&p, &x, &OracleOptions { round_output: false, rows: None }).unwrap();
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    let rd = |bytes: &[u8], format: Format, i: usize| match format {
        Format::Bf16 => spec_decode(format, u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]) as u32),
        _ => spec_decode(format, u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap())),
    };
    for b in 0..p.batch as usize {
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0;
                let mut magnitude = 0.0;
                for kk in 0..k {
                    let a = rd(&x.a, Format::Bf16, b * m * (k + 8) + i * (k + 8) + kk)
                        * rd(x.a_scale.as_ref().unwrap(), Format::F32, i);
                    let w = rd(&x.b, Format::Bf16, j * k + kk)
                        * rd(x.b_scale.as_ref().unwrap(), Format::F32, (j / 128) * 3 + kk / 128);
                    acc += a * w;
                    magnitude += (a * w).abs();
                }
                let c = rd(x.c.as_ref().unwrap(), Format::Bf16, b * m * n + j * m + i);
                let t = acc + 0.3 * c + rd(x.bias.as_ref().unwrap(), Format::F32, j);
                let expected = gelu_reference(t);
                let got = out.values[(b * m + i) * n + j];
                assert!(
                    (got - expected).abs() <= 1e-12 * (magnitude + 1.0),
                    "({b},{i},{j}): {got} vs {expected}"
                );
            }
        }
    }
}

fn gelu_reference(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

#[test]
fn decoded_operands_have_scales_applied() {
    let case = Case {
        batch: 2,
        trans_a: Transpose::T,
        trans_b: Transpose::T,
        a: Mat::padded(Format::E4m3fn, Order::ColMajor, 2),
        b: Mat::padded(Format::E2m1, Order::RowMajor, 2),
        a_scale: Some(Scales {
            per_item: true,
            ..Scales::new(
                ScaleGranularity::Block { outer: 2, inner: 3 },
                Format::F32,
                ScaleStorage::InnerMajor,
            )
        }),
        b_scale: Some(Scales::new(ScaleGranularity::Nvfp4, Format::Ue4m3, ScaleStorage::OuterMajor)),
        a_tensor_scale: Some(0.5),
        b_tensor_scale: Some(3.0),
        scalars_on_device: true,
        ..Case::new("decode operands", 5, 4, 36)
    };
    let built = build(&case);
    for b in 0..case.batch {
        assert_eq!(decode_operand_a(&built.problem, &built.inputs, b).unwrap(), built.a_eff[b as usize]);
        assert_eq!(decode_operand_b(&built.problem, &built.inputs, b).unwrap(), built.b_eff[b as usize]);
    }
    assert_eq!(
        decode_operand_a(&built.problem, &built.inputs, 2),
        Err(OracleError::BatchOutOfRange { batch: 2, count: 2 })
    );
    // Decoding A needs A's tensor scale only: an unread alpha does not stop it.
    let mut only_a = built.inputs.clone();
    only_a.device_scalars.alpha = None;
    assert!(decode_operand_a(&built.problem, &only_a, 0).is_ok());
    only_a.device_scalars.a_tensor_scale = None;
    assert_eq!(
        decode_operand_a(&built.problem, &only_a, 0),
        Err(OracleError::Problem(ProblemError::UnresolvedScalar { what: "a_tensor_scale" }))
    );
}

#[test]
fn decode_output_in_every_layout() {
    let (m, n, batch) = (3u64, 4u64, 2u64);
    let mut rng = SplitMix64::new(5);
    for format in [Format::F32, Format::Bf16, Format::E4m3fn, Format::I32, Format::E2m1] {
        for order in [Order::RowMajor, Order::ColMajor] {
            // Packed formats need an even ld: 4 + 2 row-major, 3 + 1 column-major.
            let pad = match (bits_of(format), order) {
                (4, Order::RowMajor) => 2,
                (4, Order::ColMajor) => 1,
                _ => 3,
            };
            let mat = Mat::padded(format, order, pad);
            let layout = mat.layout(m, n);
            let items: Vec<Vec<f64>> = (0..batch).map(|_| random_matrix(format, m * n, &mut rng)).collect();
            let d = write_matrix(&layout, m, n, batch, &items);
            let mut p = GemmProblem::row_major(m, n, 2, Format::Bf16, Format::Bf16, format);
            p.batch = batch;
            p.a.batch_stride = 0;
            p.b.batch_stride = 0;
            p.d = layout;
            let out = decode_output(&p, &d).unwrap();
            assert_eq!(out.values, items.concat(), "{format} {order:?}");
            assert_eq!(out.rows, [0, 1, 2]);
            let some = decode_output_rows(&p, &d, &[2, 0]).unwrap();
            for (b, item) in items.iter().enumerate() {
                assert_eq!(some.batch_item(b as u64).unwrap(), [&item[8..12], &item[0..4]].concat());
            }
            assert_eq!(decode_output_rows(&p, &d, &[3]), Err(OracleError::RowOutOfRange { row: 3, m: 3 }));
            let short = &d[..d.len() - 1];
            assert!(matches!(
                decode_output(&p, short),
                Err(OracleError::BufferTooSmall { operand: "d", .. })
            ));
        }
    }
}

// =============================================================================================
// Errors: never a panic.
// =============================================================================================

fn small_scaled_problem() -> Built {
    build(&Case {
        batch: 2,
        a: Mat::padded(Format::E4m3fn, Order::RowMajor, 2),
        b: Mat::padded(Format::E4m3fn, Order::ColMajor, 2),
        c: Mat::padded(Format::Bf16, Order::RowMajor, 1),
        a_scale: Some(Scales {
            ld_pad: 1,
            per_item: true,
            ..Scales::new(ScaleGranularity::Mx32, Format::Ue8m0, ScaleStorage::OuterMajor)
        }),
        b_scale: Some(Scales {
            per_item: true,
            ..Scales::new(ScaleGranularity::Mx32, Format::Ue8m0, ScaleStorage::Swizzled128x4)
        }),
        beta: 1.0,
        bias: Some(Bias { format: Format::Bf16, axis: BiasAxis::Rows }),
        ..Case::new("errors", 3, 4, 64)
    })
}

fn expect_err(problem: &GemmProblem, inputs: &HostInputs) -> OracleError {
    reference_gemm(problem, inputs, &OracleOptions::default()).expect_err("the oracle accepted a bad input")
}

#[test]
fn short_buffers_are_reported_with_the_size_the_problem_needs() {
    let built = small_scaled_problem();
    let p = &built.problem;
    assert!(reference_gemm(p, &built.inputs, &OracleOptions::default()).is_ok());
    let (ar, ac) = p.a_stored_dims();
    let (br, bc) = p.b_stored_dims();
    let need = |format: Format, elements: u64| format.bytes_for(elements as usize) as u64;
    let a_spec = p.a_scale.unwrap();
    let b_spec = p.b_scale.unwrap();
    type BufferOf = fn(&mut HostInputs) -> &mut Vec<u8>;
    let cases: [(&'static str, u64, BufferOf); 6] = [
        ("a", need(p.a.format, p.a.required_elements(ar, ac, p.batch)), |x| &mut x.a),
        ("b", need(p.b.format, p.b.required_elements(br, bc, p.batch)), |x| &mut x.b),
        ("c", need(Format::Bf16, p.c.unwrap().required_elements(p.m, p.n, p.batch)), |x| {
            x.c.as_mut().unwrap()
        }),
        ("a_scale", a_spec.required_entries(p.m, p.k, p.batch), |x| x.a_scale.as_mut().unwrap()),
        ("b_scale", b_spec.required_entries(p.n, p.k, p.batch), |x| x.b_scale.as_mut().unwrap()),
        ("bias", 2 * p.m, |x| x.bias.as_mut().unwrap()),
    ];
    for (operand, need_bytes, buffer) in cases {
        let mut short = built.inputs.clone();
        let buf = buffer(&mut short);
        // The exact fit passes (checked above); one byte less does not.
        assert_eq!(buf.len() as u64, need_bytes, "{operand}: the writer and the shared extent disagree");
        buf.pop();
        assert_eq!(
            expect_err(p, &short),
            OracleError::BufferTooSmall { operand, need_bytes, have_bytes: need_bytes - 1 },
            "{operand}"
        );
    }
    // A column bias has N entries.
    let mut cols = built.problem.clone();
    cols.epilogue.bias = Some(Bias { format: Format::Bf16, axis: BiasAxis::Cols });
    assert_eq!(
        expect_err(&cols, &built.inputs),
        OracleError::BufferTooSmall { operand: "bias", need_bytes: 8, have_bytes: 6 }
    );
    // Packed 4-bit extents round up to whole bytes: 3 x 3 e2m1 with ld 4 needs 2*4+3 = 11
    // nibbles, 6 bytes.
    let mut p4 = GemmProblem::row_major(3, 2, 3, Format::E2m1, Format::E2m1, Format::F32);
    p4.a.ld = 4;
    p4.a.batch_stride = 12;
    let x = inputs(vec![0; 5], vec![0; 3]);
    assert_eq!(
        expect_err(&p4, &x),
        OracleError::BufferTooSmall { operand: "a", need_bytes: 6, have_bytes: 5 }
    );
}

#[test]
fn missing_buffers_and_scalars() {
    let built = small_scaled_problem();
    let p = &built.problem;
    let without = |f: fn(&mut HostInputs)| {
        let mut x = built.inputs.clone();
        f(&mut x);
        x
    };
    assert_eq!(
        expect_err(p, &without(|x| x.a_scale = None)),
        OracleError::MissingBuffer { operand: "a_scale" }
    );
    assert_eq!(
        expect_err(p, &without(|x| x.b_scale = None)),
        OracleError::MissingBuffer { operand: "b_scale" }
    );
    assert_eq!(expect_err(p, &without(|x| x.c = None)), OracleError::MissingBuffer { operand: "c" });
    assert_eq!(expect_err(p, &without(|x| x.bias = None)), OracleError::MissingBuffer { operand: "bias" });

    // beta != 0 with no C in the problem.
    let mut no_c = p.clone();
    no_c.c = None;
    assert_eq!(expect_err(&no_c, &built.inputs), OracleError::BetaWithoutC { beta: 1.0 });

    // beta == 0: C is not read, so a C full of NaN (or none at all) changes nothing.
    let mut zero_beta = p.clone();
    zero_beta.beta = Scalar::Host(0.0);
    let clean = reference_gemm(&zero_beta, &without(|x| x.c = None), &OracleOptions::default()).unwrap();
    let nan_c = without(|x| x.c = Some(vec![0xFF; x.c.as_ref().unwrap().len()]));
    assert_eq!(reference_gemm(&zero_beta, &nan_c, &OracleOptions::default()).unwrap(), clean);
    assert!(clean.values.iter().all(|v| v.is_finite()));

    // Scalars in device memory must have been read.
    for (what, set) in [
        (
            "alpha",
            (|p: &mut GemmProblem| p.alpha = Scalar::Device { ptr: 8, format: Format::F32 })
                as fn(&mut GemmProblem),
        ),
        ("beta", |p| p.beta = Scalar::Device { ptr: 8, format: Format::F32 }),
        ("a_tensor_scale", |p| p.a_tensor_scale = Some(Scalar::Device { ptr: 8, format: Format::F32 })),
        ("b_tensor_scale", |p| p.b_tensor_scale = Some(Scalar::Device { ptr: 8, format: Format::F32 })),
        ("d_scale", |p| p.d_scale = Some(Scalar::Device { ptr: 8, format: Format::F32 })),
    ] {
        let mut q = p.clone();
        set(&mut q);
        assert_eq!(
            expect_err(&q, &built.inputs),
            OracleError::Problem(ProblemError::UnresolvedScalar { what })
        );
    }
    // Once read, the device value is used exactly as a host value would be.
    let mut on_device = p.clone();
    on_device.alpha = Scalar::Device { ptr: 8, format: Format::F32 };
    let mut x = built.inputs.clone();
    x.device_scalars.alpha = Some(2.0);
    let mut on_host = p.clone();
    on_host.alpha = Scalar::Host(2.0);
    let from_device = reference_gemm(&on_device, &x, &OracleOptions::default()).unwrap();
    assert_eq!(from_device, reference_gemm(&on_host, &built.inputs, &OracleOptions::default()).unwrap());
    assert_ne!(from_device, reference_gemm(p, &built.inputs, &OracleOptions::default()).unwrap());
}

#[test]
fn invalid_problems_and_hostile_sizes_are_errors() {
    let built = small_scaled_problem();
    let options = OracleOptions::default();
    let mut empty = built.problem.clone();
    empty.m = 0;
    assert_eq!(
        expect_err(&empty, &built.inputs),
        OracleError::Problem(ProblemError::EmptyDimension { what: "m" })
    );
    assert!(matches!(decode_output(&empty, &[]), Err(OracleError::Problem(_))));
    assert!(matches!(decode_operand_b(&empty, &built.inputs, 0), Err(OracleError::Problem(_))));

    let mut short_ld = built.problem.clone();
    short_ld.a.ld = 1;
    assert!(matches!(
        expect_err(&short_ld, &built.inputs),
        OracleError::Problem(ProblemError::LeadingDimension { .. })
    ));

    let out_of_range = OracleOptions { round_output: true, rows: Some(vec![0, 3]) };
    assert_eq!(
        reference_gemm(&built.problem, &built.inputs, &out_of_range),
        Err(OracleError::RowOutOfRange { row: 3, m: 3 })
    );

    // Extents that overflow 64 bits: an error, not a wrapped size or a panic.
    let mut huge_ld = built.problem.clone();
    huge_ld.a.ld = u64::MAX / 2;
    assert!(matches!(
        expect_err(&huge_ld, &built.inputs),
        OracleError::SizeOverflow { operand: "a" }
            | OracleError::Problem(ProblemError::TooLarge { operand: "a" })
    ));
    let mut huge_stride = built.problem.clone();
    huge_stride.b.batch_stride = u64::MAX - 3;
    assert!(matches!(
        expect_err(&huge_stride, &built.inputs),
        OracleError::SizeOverflow { operand: "b" }
            | OracleError::Problem(ProblemError::TooLarge { operand: "b" })
    ));
    let mut huge_scale = built.problem.clone();
    huge_scale.a_scale.as_mut().unwrap().batch_stride = u64::MAX - 1;
    assert!(matches!(
        expect_err(&huge_scale, &built.inputs),
        OracleError::SizeOverflow { operand: "a_scale" }
            | OracleError::Problem(ProblemError::TooLarge { operand: "a" })
    ));
    let mut huge_d = built.problem.clone();
    huge_d.d.ld = u64::MAX;
    assert!(matches!(
        decode_output(&huge_d, &[0; 64]),
        Err(OracleError::SizeOverflow { operand: "d" })
            | Err(OracleError::Problem(ProblemError::TooLarge { operand: "d" }))
    ));

    // An output too large to allocate from tiny inputs (broadcast over a huge batch) is an error
    // too: 2^36 x 4096 x 4096 values overflow isize bytes, 2^40 x ... overflow usize elements.
    for batch_log2 in [36, 40] {
        let mut wide = GemmProblem::row_major(4096, 4096, 1, Format::Int8, Format::Int8, Format::F32);
        wide.batch = 1 << batch_log2;
        wide.a.batch_stride = 0;
        wide.b.batch_stride = 0;
        let x = inputs(vec![1; 4096], vec![1; 4096]);
        assert!(matches!(
            reference_gemm(&wide, &x, &options),
            Err(OracleError::TooLarge { what: "d", .. })
                | Err(OracleError::Problem(ProblemError::TooLarge { operand: "d" }))
        ));
    }
}

#[test]
fn output_accessors() {
    let out = OracleOutput { batch: 2, rows: vec![4, 1], n: 3, values: (0..12).map(f64::from).collect() };
    assert_eq!(out.batch_item(1).unwrap(), [6., 7., 8., 9., 10., 11.]);
    assert_eq!(out.row(1, 1).unwrap(), [9., 10., 11.]);
    assert!(out.batch_item(2).is_none());
}

// =============================================================================================
// Shared-file findings (formats.rs, problem.rs): these fail until the fixes in the hand-off
// report land.
// =============================================================================================

#[test]
fn shared_formats_bf16_rounding_keeps_sticky_bits() {
    // 1 + 2^-8 + 2^-40 lies above the bf16 tie between 1 and 1 + 2^-7: RNE gives 1 + 2^-7.
    // half's f64 -> bf16 drops the low 32 bits of the f64 mantissa before rounding, sees an exact
    // tie and rounds to 1.
    let above_tie = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
    assert_eq!(round_expected(Format::Bf16, above_tie), 1.0 + 2f64.powi(-7));
    assert_eq!(Format::Bf16.round(above_tie), 1.0 + 2f64.powi(-7));
    // Through the oracle: f32 inputs whose exact product is above a bf16 tie. A device rounding
    // its f32 accumulator (1 + 2^-8 + 2^-23) gets 1 + 2^-7; the oracle must too.
    let p = GemmProblem::row_major(1, 1, 1, Format::F32, Format::F32, Format::Bf16);
    let x = inputs(f32_bytes(&[1. + 2f32.powi(-8)]), f32_bytes(&[1. + 2f32.powi(-23)]));
    assert_eq!(full(&p, &x), [1.0 + 2f64.powi(-7)]);
}

#[test]
fn shared_formats_f16_rounding_keeps_sticky_bits() {
    // Same defect for f16 (the f16c path rounds to f32 first, the fallback truncates): 1 + 2^-11
    // + 2^-40 is above the tie between 1 and 1 + 2^-10.
    assert_eq!(Format::F16.round(1.0 + 2f64.powi(-11) + 2f64.powi(-40)), 1.0 + 2f64.powi(-10));
}

#[test]
fn shared_problem_validate_checks_c_like_a_b_d() {
    // validate() checks element formats and packed alignment of A, B and D but not of C.
    let mut p = GemmProblem::row_major(4, 4, 4, Format::F16, Format::F16, Format::F16);
    p.c = Some(MatrixLayout { format: Format::Ue8m0, order: Order::RowMajor, ld: 4, batch_stride: 16 });
    assert!(matches!(p.validate(), Err(ProblemError::NotElementFormat { operand: "c", .. })));
    p.c = Some(MatrixLayout { format: Format::E2m1, order: Order::RowMajor, ld: 5, batch_stride: 20 });
    assert_eq!(p.validate(), Err(ProblemError::PackedAlignment { operand: "c" }));
}
