//! Quantizer tests: round trips within each format's bound, scale values per the kernel rules,
//! scale and element placement checked against hand-written layout formulas, padding, batch
//! strides, broadcast, packed 4-bit with odd K, determinism of `random_inputs`, and errors.

use quantshadow_runtime::formats::Format;
use quantshadow_runtime::problem::{
    Bias, BiasAxis, Epilogue, GemmProblem, MatrixLayout, Order, ProblemError, Scalar, ScaleGranularity,
    ScaleSpec, ScaleStorage, Transpose,
};
use quantshadow_runtime::quantize::{
    quantize_a, quantize_b, random_inputs, random_logical, QuantizeError, QuantizedOperand,
};
use std::collections::{BTreeSet, HashMap};

// ---------------------------------------------------------------------------------------------
// Helpers: an independent dequantizer and per-element error bounds.

#[derive(Debug, Clone, Copy, PartialEq)]
enum Side {
    A,
    B,
}

impl Side {
    fn extents(self, p: &GemmProblem) -> (u64, u64) {
        match self {
            Side::A => (p.m, p.k),
            Side::B => (p.n, p.k),
        }
    }

    fn layout(self, p: &GemmProblem) -> MatrixLayout {
        match self {
            Side::A => p.a,
            Side::B => p.b,
        }
    }

    fn spec(self, p: &GemmProblem) -> Option<ScaleSpec> {
        match self {
            Side::A => p.a_scale,
            Side::B => p.b_scale,
        }
    }

    fn tensor_scalar(self, p: &GemmProblem) -> Option<Scalar> {
        match self {
            Side::A => p.a_tensor_scale,
            Side::B => p.b_tensor_scale,
        }
    }

    fn stored_dims(self, p: &GemmProblem) -> (u64, u64) {
        match self {
            Side::A => p.a_stored_dims(),
            Side::B => p.b_stored_dims(),
        }
    }

    /// Logical arrays: A is batch x M x K, B is batch x K x N.
    fn logical_index(self, p: &GemmProblem, b: u64, outer: u64, inner: u64) -> usize {
        (match self {
            Side::A => (b * p.m + outer) * p.k + inner,
            Side::B => (b * p.k + inner) * p.n + outer,
        }) as usize
    }

    fn offset(self, p: &GemmProblem, b: u64, outer: u64, inner: u64) -> u64 {
        match self {
            Side::A => p.a_offset(b, outer, inner),
            Side::B => p.b_offset(b, inner, outer),
        }
    }

    fn entry(self, p: &GemmProblem, spec: &ScaleSpec, b: u64, outer: u64, inner: u64) -> u64 {
        match self {
            Side::A => p.a_scale_entry(spec, b, outer, inner),
            Side::B => p.b_scale_entry(spec, b, inner, outer),
        }
    }

    fn quantize(self, p: &GemmProblem, logical: &[f64]) -> Result<QuantizedOperand, QuantizeError> {
        match self {
            Side::A => quantize_a(p, logical),
            Side::B => quantize_b(p, logical),
        }
    }

    fn random(self, p: &GemmProblem, seed: u64) -> Vec<f64> {
        match self {
            Side::A => random_logical(p.m, p.k, p.batch, seed),
            Side::B => random_logical(p.k, p.n, p.batch, seed),
        }
    }
}

/// Every logical element as (batch, outer, inner).
fn elements(p: &GemmProblem, side: Side) -> impl Iterator<Item = (u64, u64, u64)> {
    let (outer, inner) = side.extents(p);
    let batch = p.batch;
    (0..batch).flat_map(move |b| (0..outer).flat_map(move |o| (0..inner).map(move |i| (b, o, i))))
}

/// The tensor scale the oracle would resolve for this operand.
fn resolved_tensor_scale(p: &GemmProblem, side: Side, q: &QuantizedOperand) -> f64 {
    match side.tensor_scalar(p) {
        None => 1.0,
        Some(Scalar::Host(v)) => v,
        Some(Scalar::Device { .. }) => q.tensor_scale.expect("device tensor scale must be returned") as f64,
    }
}

/// Decodes an operand back to logical order: code * scale(entry) * tensor scale.
fn dequantize(p: &GemmProblem, side: Side, q: &QuantizedOperand) -> Vec<f64> {
    let layout = side.layout(p);
    let spec = side.spec(p);
    let tensor_scale = resolved_tensor_scale(p, side, q);
    let (outer, inner) = side.extents(p);
    let mut out = vec![f64::NAN; (p.batch * outer * inner) as usize];
    for (b, o, i) in elements(p, side) {
        let value = layout.format.load(&q.data, side.offset(p, b, o, i) as usize);
        let scale = match &spec {
            Some(spec) => spec.format.load(q.scales.as_ref().unwrap(), side.entry(p, spec, b, o, i) as usize),
            None => 1.0,
        };
        out[side.logical_index(p, b, o, i)] = value * scale * tensor_scale;
    }
    out
}

/// Largest |x| per scale entry, over every element the problem maps to that entry.
fn entry_amax(p: &GemmProblem, side: Side, spec: &ScaleSpec, logical: &[f64]) -> HashMap<u64, f64> {
    let mut amax = HashMap::new();
    for (b, o, i) in elements(p, side) {
        let slot = amax.entry(side.entry(p, spec, b, o, i)).or_insert(0.0f64);
        *slot = slot.max(logical[side.logical_index(p, b, o, i)].abs());
    }
    amax
}

fn mantissa_bits(format: Format) -> i32 {
    match format {
        Format::E4m3fn | Format::E4m3fnuz => 3,
        Format::E5m2 | Format::E5m2fnuz => 2,
        Format::E2m1 => 1,
        Format::F16 => 10,
        Format::Bf16 => 7,
        Format::F32 => 23,
        other => panic!("{other} has no mantissa"),
    }
}

/// Largest relative amount by which a scale rounded to nearest in `format` can fall short of,
/// or exceed, the ideal scale (half a step at the ideal scale).
fn scale_half_step(format: Format, ideal: f64) -> f64 {
    match format {
        Format::F32 => 2f64.powi(-24),
        Format::F16 => 2f64.powi(-11),
        Format::Bf16 => 2f64.powi(-8),
        // Normal ue4m3 has 3 mantissa bits; below 2^-6 the step is the fixed 2^-9.
        Format::Ue4m3 if ideal >= 2f64.powi(-6) => 2f64.powi(-4),
        Format::Ue4m3 => 2f64.powi(-10) / ideal,
        other => panic!("{other} is not rounded to nearest"),
    }
}

/// Bound on |x - dequantized| for an element of a block with largest magnitude `amax`, from
/// the format definitions only (not from the scales the quantizer chose).
fn error_bound(element: Format, scale: Option<Format>, amax: f64, range: f64, ideal_scale: f64) -> f64 {
    // How far the chosen scale can sit below (saturating the block max) or above (coarser
    // steps) the ideal one.
    let (shortfall, excess_factor) = match scale {
        None => (0.0, 1.0),
        // Power of two at or above the ideal: never short, at most 2x coarser.
        Some(Format::Ue8m0) => (0.0, 2.0),
        Some(f) => {
            let step = scale_half_step(f, ideal_scale);
            (step, 1.0 + step)
        }
    };
    let rounding = if element.is_integer() {
        // Half a quantization step: 0.5 * scale.
        0.5 * amax / range * excess_factor
    } else {
        // Half an ulp in the binade of the scaled block max, relative to the max.
        amax * 2f64.powi(-(mantissa_bits(element) + 1))
    };
    rounding + amax * shortfall + 1e-300
}

fn quantization_range(format: Format) -> f64 {
    match format {
        Format::F32 | Format::F16 | Format::Bf16 => 1.0,
        f => f.max_finite(),
    }
}

/// Checks every element against its bound; returns the worst error / bound ratio.
fn assert_round_trip(p: &GemmProblem, side: Side, logical: &[f64], q: &QuantizedOperand, what: &str) -> f64 {
    let element = side.layout(p).format;
    let range = quantization_range(element);
    let spec = side.spec(p);
    let tensor_scale = resolved_tensor_scale(p, side, q);
    let amax_by_entry = spec.map(|s| entry_amax(p, side, &s, logical));
    let decoded = dequantize(p, side, q);
    let mut worst = 0.0f64;
    for (b, o, i) in elements(p, side) {
        let index = side.logical_index(p, b, o, i);
        let (x, y) = (logical[index], decoded[index]);
        assert!(y.is_finite(), "{what}: element ({b},{o},{i}) decoded to {y}");
        let bound = match (&spec, &amax_by_entry) {
            (Some(spec), Some(amax)) => {
                let block_amax = amax[&side.entry(p, spec, b, o, i)];
                let ideal = block_amax / range / tensor_scale;
                error_bound(element, Some(spec.format), block_amax, range, ideal)
            }
            // Unscaled wide formats: rounding relative to the value itself (+ subnormal step).
            _ => x.abs() * 2f64.powi(-(mantissa_bits(element) + 1)) + 2f64.powi(-25),
        };
        let error = (x - y).abs();
        assert!(
            error <= bound,
            "{what}: element ({b},{o},{i}) = {x}, dequantized {y}, error {error} > {bound}"
        );
        worst = worst.max(error / bound);
    }
    worst
}

/// Stored element offsets the problem maps logical elements to.
fn mapped_offsets(p: &GemmProblem, side: Side) -> BTreeSet<u64> {
    elements(p, side).map(|(b, o, i)| side.offset(p, b, o, i)).collect()
}

/// Every stored element no logical element maps to must be zero (padding never holds data).
fn assert_padding_is_zero(p: &GemmProblem, side: Side, q: &QuantizedOperand, what: &str) {
    let layout = side.layout(p);
    let (rows, cols) = side.stored_dims(p);
    let required = layout.required_elements(rows, cols, p.batch);
    assert_eq!(q.data.len(), layout.format.bytes_for(required as usize), "{what}: data size");
    let mapped = mapped_offsets(p, side);
    let slots = q.data.len() * 8 / layout.format.bits() as usize;
    for slot in 0..slots {
        if !mapped.contains(&(slot as u64)) {
            assert_eq!(layout.format.load_code(&q.data, slot), 0, "{what}: padding element {slot}");
        }
    }
    if let Some(spec) = side.spec(p) {
        let (outer, inner) = side.extents(p);
        let scales = q.scales.as_ref().expect("scales for a scaled operand");
        let entries = spec.required_entries(outer, inner, p.batch) as usize;
        assert_eq!(scales.len(), spec.format.bytes_for(entries), "{what}: scale size");
        let used: BTreeSet<u64> = elements(p, side).map(|(b, o, i)| side.entry(p, &spec, b, o, i)).collect();
        for entry in 0..entries {
            let code = spec.format.load_code(scales, entry);
            if used.contains(&(entry as u64)) {
                assert!(spec.format.decode_code(code) > 0.0, "{what}: scale entry {entry} is not positive");
            } else {
                assert_eq!(code, 0, "{what}: padding scale entry {entry}");
            }
        }
    } else {
        assert!(q.scales.is_none(), "{what}: scales without a spec");
    }
}

// ---------------------------------------------------------------------------------------------
// Problem builders.

/// Smallest even number >= v (packed 4-bit layouts need even ld and batch stride).
fn even_up(v: u64) -> u64 {
    v + v % 2
}

/// A layout for a stored `rows x cols` matrix with `pad` extra elements per row/column and per
/// batch item, rounded to even so packed 4-bit formats validate.
fn padded_layout(format: Format, order: Order, rows: u64, cols: u64, pad: u64) -> MatrixLayout {
    let ld = even_up(
        match order {
            Order::RowMajor => cols,
            Order::ColMajor => rows,
        } + pad,
    );
    let mut layout = MatrixLayout { format, order, ld, batch_stride: 0 };
    layout.batch_stride = even_up(layout.required_elements(rows, cols, 1) + pad);
    layout
}

#[derive(Debug, Clone, Copy)]
struct Layouts {
    trans_a: Transpose,
    order_a: Order,
    trans_b: Transpose,
    order_b: Order,
    pad: u64,
}

/// "TN" as cuBLASLt FP8 GEMMs see it in row-major terms: A row-major, weights stored N x K.
const ACTIVATIONS_AND_WEIGHTS: Layouts = Layouts {
    trans_a: Transpose::N,
    order_a: Order::RowMajor,
    trans_b: Transpose::T,
    order_b: Order::RowMajor,
    pad: 0,
};
/// Everything column-major and transposed, with padded leading dimensions and batch strides.
const COLUMN_MAJOR_PADDED: Layouts = Layouts {
    trans_a: Transpose::T,
    order_a: Order::ColMajor,
    trans_b: Transpose::N,
    order_b: Order::ColMajor,
    pad: 6,
};
const ROW_MAJOR_NN: Layouts = Layouts {
    trans_a: Transpose::N,
    order_a: Order::RowMajor,
    trans_b: Transpose::N,
    order_b: Order::RowMajor,
    pad: 2,
};

fn problem(m: u64, n: u64, k: u64, batch: u64, element: Format, layouts: Layouts) -> GemmProblem {
    let mut p = GemmProblem::row_major(m, n, k, element, element, Format::Bf16);
    p.batch = batch;
    p.trans_a = layouts.trans_a;
    p.trans_b = layouts.trans_b;
    let (ar, ac) = p.a_stored_dims();
    let (br, bc) = p.b_stored_dims();
    p.a = padded_layout(element, layouts.order_a, ar, ac, layouts.pad);
    p.b = padded_layout(element, layouts.order_b, br, bc, layouts.pad);
    p
}

/// Gives each batch item its own scales (batch stride = one item's entries + `gap`).
fn per_item_scales(spec: ScaleSpec, outer: u64, k: u64, gap: u64) -> ScaleSpec {
    let grid = spec.granularity.grid(outer, k);
    ScaleSpec { batch_stride: spec.entries_per_item(grid) + gap, ..spec }
}

#[derive(Debug, Clone, Copy)]
enum Scheme {
    Unscaled,
    /// Same granularity for A and B.
    Both(ScaleGranularity),
    /// DeepSeek-style: A 1x128, B 128x128 blocks.
    Blocks128,
    /// NVFP4: 1x16 ue4m3 blocks plus a device f32 tensor scale on each operand.
    Nvfp4,
}

struct Case {
    element: Format,
    scheme: Scheme,
    scale_format: Option<Format>,
}

fn build(case: &Case, m: u64, n: u64, k: u64, batch: u64, layouts: Layouts) -> GemmProblem {
    let mut p = problem(m, n, k, batch, case.element, layouts);
    let spec = |g| ScaleSpec::new(g, case.scale_format.expect("scaled scheme needs a scale format"));
    match case.scheme {
        Scheme::Unscaled => {}
        Scheme::Both(g) => {
            p.a_scale = Some(spec(g));
            p.b_scale = Some(spec(g));
        }
        Scheme::Blocks128 => {
            p.a_scale = Some(spec(ScaleGranularity::Block { outer: 1, inner: 128 }));
            p.b_scale = Some(spec(ScaleGranularity::Block { outer: 128, inner: 128 }));
        }
        Scheme::Nvfp4 => {
            p.a_scale = Some(spec(ScaleGranularity::Nvfp4));
            p.b_scale = Some(spec(ScaleGranularity::Nvfp4));
            p.a_tensor_scale = Some(Scalar::Device { ptr: 0, format: Format::F32 });
            p.b_tensor_scale = Some(Scalar::Device { ptr: 0, format: Format::F32 });
        }
    }
    if batch > 1 {
        p.a_scale = p.a_scale.map(|s| per_item_scales(s, m, k, 3));
        p.b_scale = p.b_scale.map(|s| per_item_scales(s, n, k, 1));
    }
    p
}

/// Every element format x scale scheme combination real kernels use.
fn all_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for element in [Format::F32, Format::F16, Format::Bf16] {
        cases.push(Case { element, scheme: Scheme::Unscaled, scale_format: None });
    }
    for element in [Format::E4m3fn, Format::E4m3fnuz, Format::E5m2, Format::E5m2fnuz, Format::Int8] {
        for scale_format in [Format::F32, Format::Ue8m0] {
            for scheme in [
                Scheme::Both(ScaleGranularity::Tensor),
                Scheme::Both(ScaleGranularity::PerOuter),
                Scheme::Blocks128,
            ] {
                cases.push(Case { element, scheme, scale_format: Some(scale_format) });
            }
        }
    }
    cases.push(Case {
        element: Format::E2m1,
        scheme: Scheme::Both(ScaleGranularity::Mx32),
        scale_format: Some(Format::Ue8m0),
    });
    cases.push(Case { element: Format::E2m1, scheme: Scheme::Nvfp4, scale_format: Some(Format::Ue4m3) });
    for scale_format in [Format::F16, Format::Bf16] {
        for granularity in [ScaleGranularity::PerOuter, ScaleGranularity::Block { outer: 1, inner: 32 }] {
            cases.push(Case {
                element: Format::Int4,
                scheme: Scheme::Both(granularity),
                scale_format: Some(scale_format),
            });
        }
    }
    cases
}

fn describe(case: &Case) -> String {
    let scale = case.scale_format.map_or("-".to_string(), |f| f.to_string());
    format!("{} {:?} {}", case.element, case.scheme, scale)
}

// ---------------------------------------------------------------------------------------------
// Round trips.

#[test]
fn every_scheme_round_trips_within_its_format_bound() {
    // Shapes off every block boundary: M, N odd; K neither a multiple of 128 nor of 32.
    let shapes = [
        (67, 133, 300, 1, ACTIVATIONS_AND_WEIGHTS),
        (67, 133, 300, 1, COLUMN_MAJOR_PADDED),
        (5, 130, 160, 2, ROW_MAJOR_NN),
    ];
    for (index, case) in all_cases().iter().enumerate() {
        for &(m, n, k, batch, layouts) in &shapes {
            let p = build(case, m, n, k, batch, layouts);
            p.validate().unwrap_or_else(|e| panic!("{}: {e}", describe(case)));
            for side in [Side::A, Side::B] {
                let what = format!("{} {side:?} {m}x{n}x{k} b{batch} {layouts:?}", describe(case));
                let logical = side.random(&p, 1000 + index as u64);
                let q = side.quantize(&p, &logical).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_round_trip(&p, side, &logical, &q, &what);
                assert_padding_is_zero(&p, side, &q, &what);
            }
        }
    }
}

#[test]
fn narrow_formats_without_scales_are_encoded_directly_and_saturate() {
    let mut p = GemmProblem::row_major(1, 4, 4, Format::E4m3fn, Format::Int8, Format::Bf16);
    p.validate().unwrap();
    let q = quantize_a(&p, &[1.0, -2.5, 1000.0, -1000.0]).unwrap();
    let decoded: Vec<f64> = (0..4).map(|i| Format::E4m3fn.load(&q.data, i)).collect();
    assert_eq!(decoded, [1.0, -2.5, 448.0, -448.0]);
    assert_eq!(q.scales, None);
    assert_eq!(q.tensor_scale, None);
    let logical_b: Vec<f64> = (0..16).map(|i| i as f64 * 20.5 - 150.0).collect();
    let q = quantize_b(&p, &logical_b).unwrap();
    for (i, x) in logical_b.iter().enumerate() {
        let want = x.round_ties_even().clamp(-128.0, 127.0);
        assert_eq!(Format::Int8.load(&q.data, i), want, "b[{i}] = {x}");
    }
    // A device tensor scale turns plain FP8 into tensor-wise scaled FP8: amax lands on 448.
    p.a_tensor_scale = Some(Scalar::Device { ptr: 0, format: Format::F32 });
    let q = quantize_a(&p, &[1.0, -2.5, 1000.0, -1000.0]).unwrap();
    assert_eq!(q.tensor_scale, Some((1000.0f64 / 448.0) as f32));
    assert_eq!(Format::E4m3fn.load(&q.data, 2), 448.0);
}

// ---------------------------------------------------------------------------------------------
// Scale values follow the kernel rules (computed here independently).

/// Smallest power of two >= x, by walking the exponents (not the library's log2 + fix-up).
fn power_of_two_at_least(x: f64) -> f64 {
    (-127..=127).map(|e| 2f64.powi(e)).find(|p| *p >= x).expect("in ue8m0 range")
}

fn scale_values(p: &GemmProblem, side: Side, q: &QuantizedOperand) -> HashMap<u64, f64> {
    let spec = side.spec(p).unwrap();
    elements(p, side)
        .map(|(b, o, i)| side.entry(p, &spec, b, o, i))
        .map(|e| (e, spec.format.load(q.scales.as_ref().unwrap(), e as usize)))
        .collect()
}

#[test]
fn scale_values_follow_the_kernel_rules() {
    let (m, n, k) = (6, 10, 256);
    type ScaleRule = Box<dyn Fn(f64) -> f64>;
    let cases: Vec<(Format, ScaleGranularity, Format, ScaleRule)> = vec![
        // Per-token FP8 with f32 scales: amax / 448 rounded to f32.
        (
            Format::E4m3fn,
            ScaleGranularity::PerOuter,
            Format::F32,
            Box::new(|amax| (amax / 448.0) as f32 as f64),
        ),
        (
            Format::E4m3fnuz,
            ScaleGranularity::PerOuter,
            Format::F32,
            Box::new(|amax| (amax / 240.0) as f32 as f64),
        ),
        (
            Format::E5m2,
            ScaleGranularity::Tensor,
            Format::F32,
            Box::new(|amax| (amax / 57344.0) as f32 as f64),
        ),
        // UE8M0 block scales: the power of two at or above amax / max.
        (
            Format::E4m3fn,
            ScaleGranularity::Block { outer: 1, inner: 128 },
            Format::Ue8m0,
            Box::new(|amax| power_of_two_at_least(amax / 448.0)),
        ),
        (
            Format::E2m1,
            ScaleGranularity::Mx32,
            Format::Ue8m0,
            Box::new(|amax| power_of_two_at_least(amax / 6.0)),
        ),
        // Symmetric integers.
        (
            Format::Int8,
            ScaleGranularity::PerOuter,
            Format::F32,
            Box::new(|amax| (amax / 127.0) as f32 as f64),
        ),
        (
            Format::Int4,
            ScaleGranularity::Block { outer: 1, inner: 32 },
            Format::F16,
            Box::new(|amax| Format::F16.round(amax / 7.0)),
        ),
        (
            Format::Int4,
            ScaleGranularity::PerOuter,
            Format::Bf16,
            Box::new(|amax| Format::Bf16.round(amax / 7.0)),
        ),
    ];
    for (element, granularity, scale_format, rule) in cases {
        let mut p = GemmProblem::row_major(m, n, k, element, element, Format::Bf16);
        p.trans_b = Transpose::T;
        p.b = MatrixLayout::packed(element, Order::RowMajor, n, k);
        p.a_scale = Some(ScaleSpec::new(granularity, scale_format));
        p.b_scale = Some(ScaleSpec::new(granularity, scale_format));
        for side in [Side::A, Side::B] {
            let logical = side.random(&p, 7);
            let q = side.quantize(&p, &logical).unwrap();
            let amax = entry_amax(&p, side, &side.spec(&p).unwrap(), &logical);
            let scales = scale_values(&p, side, &q);
            assert_eq!(scales.len(), amax.len());
            for (entry, block_amax) in &amax {
                assert_eq!(
                    scales[entry],
                    rule(*block_amax),
                    "{element} {granularity:?} {scale_format} {side:?} entry {entry}: amax {block_amax}"
                );
            }
        }
    }
}

#[test]
fn nvfp4_uses_a_tensor_scale_of_amax_over_2688_and_ue4m3_block_scales() {
    let (m, n, k) = (4, 8, 64);
    let mut p = GemmProblem::row_major(m, n, k, Format::E2m1, Format::E2m1, Format::Bf16);
    p.trans_b = Transpose::T;
    p.b = MatrixLayout::packed(Format::E2m1, Order::RowMajor, n, k);
    p.a_scale = Some(ScaleSpec::new(ScaleGranularity::Nvfp4, Format::Ue4m3));
    p.b_scale = Some(ScaleSpec::new(ScaleGranularity::Nvfp4, Format::Ue4m3));
    p.a_tensor_scale = Some(Scalar::Device { ptr: 0x1000, format: Format::F32 });
    p.b_tensor_scale = Some(Scalar::Device { ptr: 0x2000, format: Format::F32 });
    for side in [Side::A, Side::B] {
        let logical = side.random(&p, 11);
        let q = side.quantize(&p, &logical).unwrap();
        let amax_tensor = logical.iter().fold(0.0f64, |a, v| a.max(v.abs()));
        let tensor_scale = (amax_tensor / (448.0 * 6.0)) as f32;
        assert_eq!(q.tensor_scale, Some(tensor_scale), "{side:?}");
        let amax = entry_amax(&p, side, &side.spec(&p).unwrap(), &logical);
        let scales = scale_values(&p, side, &q);
        assert_eq!(amax.len() as u64, p.k / 16 * side.extents(&p).0);
        for (entry, block_amax) in &amax {
            let want = Format::Ue4m3.round(block_amax / 6.0 / tensor_scale as f64);
            assert_eq!(scales[entry], want, "{side:?} entry {entry}");
        }
        // The block holding the tensor amax uses (close to) the top of the ue4m3 range.
        let top = scales.values().fold(0.0f64, |a, v| a.max(*v));
        assert!((416.0..=448.0).contains(&top), "{side:?}: largest block scale {top}");
        assert_round_trip(&p, side, &logical, &q, "nvfp4");
    }
    let inputs = random_inputs(&p, 5).unwrap();
    let scalars = p.resolve_scalars(&inputs.device_scalars).unwrap();
    assert!(scalars.a_tensor_scale > 0.0 && scalars.a_tensor_scale != 1.0);
    assert!(scalars.b_tensor_scale > 0.0 && scalars.b_tensor_scale != 1.0);
    assert_eq!(scalars.a_tensor_scale as f32 as f64, scalars.a_tensor_scale);
}

#[test]
fn host_tensor_scale_is_used_exactly_as_given() {
    let mut p = GemmProblem::row_major(2, 2, 32, Format::E2m1, Format::E2m1, Format::Bf16);
    p.a_scale = Some(ScaleSpec::new(ScaleGranularity::Nvfp4, Format::Ue4m3));
    // Not representable in f32: the elements must be quantized against the f64 value the
    // oracle resolves, not its f32 rounding.
    let host_value = 0.7000000001;
    p.a_tensor_scale = Some(Scalar::Host(host_value));
    let logical = random_logical(2, 32, 1, 3);
    let q = quantize_a(&p, &logical).unwrap();
    assert_eq!(q.tensor_scale, Some(host_value as f32));
    let amax = entry_amax(&p, Side::A, &p.a_scale.unwrap(), &logical);
    let scales = scale_values(&p, Side::A, &q);
    for (entry, block_amax) in amax {
        assert_eq!(scales[&entry], Format::Ue4m3.round(block_amax / 6.0 / host_value));
    }
    for kk in 0..32 {
        let scale = scales[&(kk / 16)];
        assert_eq!(
            Format::E2m1.load_code(&q.data, kk as usize),
            Format::E2m1.encode(logical[kk as usize] / (scale * host_value))
        );
    }
    assert_round_trip(&p, Side::A, &logical, &q, "host tensor scale");
    // random_inputs leaves host scalars in the problem, not in device_scalars.
    let inputs = random_inputs(&p, 1).unwrap();
    assert_eq!(inputs.device_scalars.a_tensor_scale, None);
    assert_eq!(p.resolve_scalars(&inputs.device_scalars).unwrap().a_tensor_scale, host_value);
}

#[test]
fn zero_blocks_get_scale_one_and_zero_codes() {
    let mut p = GemmProblem::row_major(3, 2, 64, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
    p.a_scale = Some(ScaleSpec::new(ScaleGranularity::Block { outer: 1, inner: 32 }, Format::F32));
    let mut logical = random_logical(3, 64, 1, 9);
    logical[64..96].iter_mut().for_each(|v| *v = 0.0); // row 1, first K block
    let q = quantize_a(&p, &logical).unwrap();
    let scales = q.scales.as_ref().unwrap();
    assert_eq!(Format::F32.load(scales, 2), 1.0, "row 1 block 0");
    assert!((64..96).all(|i| Format::E4m3fn.load_code(&q.data, i) == 0));
    assert_round_trip(&p, Side::A, &logical, &q, "zero block");

    // Same for ue8m0 (code 127 = 2^0) and ue4m3 with an all-zero tensor.
    for (granularity, scale_format, one_code) in
        [(ScaleGranularity::Mx32, Format::Ue8m0, 127), (ScaleGranularity::Nvfp4, Format::Ue4m3, 0x38)]
    {
        let mut p = GemmProblem::row_major(2, 2, 32, Format::E2m1, Format::E2m1, Format::Bf16);
        p.a_scale = Some(ScaleSpec::new(granularity, scale_format));
        p.a_tensor_scale = Some(Scalar::Device { ptr: 0, format: Format::F32 });
        let q = quantize_a(&p, &[0.0; 64]).unwrap();
        assert!(q.scales.as_ref().unwrap().iter().all(|c| *c as u32 == one_code), "{scale_format}");
        assert_eq!(q.tensor_scale, Some(1.0));
        assert!(q.data.iter().all(|b| *b == 0));
    }
}

#[test]
fn underflowing_scales_use_the_smallest_positive_value() {
    let mut p = GemmProblem::row_major(1, 1, 4, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
    for (scale_format, smallest) in [
        (Format::F32, f32::from_bits(1) as f64),
        (Format::F16, 2f64.powi(-24)),
        (Format::Bf16, 2f64.powi(-133)),
        (Format::Ue8m0, 2f64.powi(-127)),
    ] {
        p.a_scale = Some(ScaleSpec::new(ScaleGranularity::PerOuter, scale_format));
        let tiny = smallest * 448.0 * 1e-3;
        let logical = [tiny, -tiny / 2.0, tiny / 4.0, 0.0];
        let q = quantize_a(&p, &logical).unwrap();
        let scale = scale_format.load(q.scales.as_ref().unwrap(), 0);
        assert_eq!(scale, smallest, "{scale_format}");
        let decoded = dequantize(&p, Side::A, &q);
        for (x, y) in logical.iter().zip(&decoded) {
            // Coarse but not saturated: within one scale step.
            assert!((x - y).abs() <= smallest, "{scale_format}: {x} -> {y}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Scale placement, checked against hand-written layout formulas.

/// Expected scale for a (row, k-block) of A, from the logical values.
fn expected_block_scale(logical: &[f64], k: usize, row: usize, block: usize, block_len: usize) -> f64 {
    let start = row * k + block * block_len;
    let end = (start + block_len).min(row * k + k);
    let amax = logical[start..end].iter().fold(0.0f64, |a, v| a.max(v.abs()));
    (amax / 448.0) as f32 as f64
}

#[test]
fn outer_major_scales_sit_at_outer_times_ld_plus_inner() {
    let (m, k, ld) = (3u64, 300u64, 5u64); // 3 K-blocks of 128 per row, 2 entries of padding
    let mut p = GemmProblem::row_major(m, 4, k, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
    p.a_scale = Some(ScaleSpec {
        ld,
        ..ScaleSpec::new(ScaleGranularity::Block { outer: 1, inner: 128 }, Format::F32)
    });
    let logical = random_logical(m, k, 1, 21);
    let q = quantize_a(&p, &logical).unwrap();
    let scales = q.scales.as_ref().unwrap();
    assert_eq!(scales.len(), 4 * ((m - 1) * ld + 3) as usize);
    for row in 0..m {
        for block in 0..ld {
            let index = (row * ld + block) as usize;
            if index * 4 >= scales.len() {
                continue; // the last row has no trailing padding
            }
            let got = Format::F32.load(scales, index);
            if block < 3 {
                assert_eq!(
                    got,
                    expected_block_scale(&logical, k as usize, row as usize, block as usize, 128)
                );
            } else {
                assert_eq!(got, 0.0, "padding entry row {row} col {block}");
            }
        }
    }
}

#[test]
fn inner_major_scales_sit_at_inner_times_ld_plus_outer() {
    let (m, k, ld) = (3u64, 300u64, 7u64);
    let mut p = GemmProblem::row_major(m, 4, k, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
    p.a_scale = Some(ScaleSpec {
        ld,
        ..ScaleSpec::new(ScaleGranularity::Block { outer: 1, inner: 128 }, Format::F32)
            .with_storage(ScaleStorage::InnerMajor)
    });
    let logical = random_logical(m, k, 1, 22);
    let q = quantize_a(&p, &logical).unwrap();
    let scales = q.scales.as_ref().unwrap();
    assert_eq!(scales.len(), 4 * (2 * ld + m) as usize);
    for block in 0..3u64 {
        for row in 0..ld {
            let index = (block * ld + row) as usize;
            if index * 4 >= scales.len() {
                continue;
            }
            let got = Format::F32.load(scales, index);
            if row < m {
                assert_eq!(
                    got,
                    expected_block_scale(&logical, k as usize, row as usize, block as usize, 128)
                );
            } else {
                assert_eq!(got, 0.0, "padding entry block {block} slot {row}");
            }
        }
    }
}

#[test]
fn swizzled_scales_follow_the_128x4_tile_formula() {
    // 130 rows -> 2 row tiles (the second mostly padding); K = 320 -> 10 MX blocks -> 3 K tiles.
    let (m, k) = (130u64, 320u64);
    let mut p = GemmProblem::row_major(m, 2, k, Format::E2m1, Format::E2m1, Format::Bf16);
    p.a_scale =
        Some(ScaleSpec::new(ScaleGranularity::Mx32, Format::Ue8m0).with_storage(ScaleStorage::Swizzled128x4));
    let logical = random_logical(m, k, 1, 23);
    let q = quantize_a(&p, &logical).unwrap();
    let scales = q.scales.as_ref().unwrap();
    assert_eq!(scales.len(), 2 * 3 * 512);
    let mut expected = vec![0u8; scales.len()];
    for row in 0..m as usize {
        for block in 0..10usize {
            let amax = logical[row * 320 + block * 32..row * 320 + block * 32 + 32]
                .iter()
                .fold(0.0f64, |a, v| a.max(v.abs()));
            let code = (power_of_two_at_least(amax / 6.0).log2() as i32 + 127) as u8;
            // cuBLASLt "block scaling factors layout": 128x4 tiles, row-tile-major; inside a
            // tile, row r and column c sit at (r % 32) * 16 + (r / 32) * 4 + c.
            let tile = (row / 128) * 3 + block / 4;
            let (r, c) = (row % 128, block % 4);
            expected[tile * 512 + (r % 32) * 16 + (r / 32) * 4 + c] = code;
        }
    }
    assert_eq!(scales, &expected);
    assert_round_trip(&p, Side::A, &logical, &q, "swizzled");
}

#[test]
fn b_scales_use_n_as_the_outer_dimension() {
    // F.linear weights: B stored N x K row-major (op(B) = B^T), one scale per output channel.
    let (n, k) = (5u64, 64u64);
    let mut p = GemmProblem::row_major(2, n, k, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
    p.trans_b = Transpose::T;
    p.b = MatrixLayout::packed(Format::E4m3fn, Order::RowMajor, n, k);
    p.b_scale = Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32));
    let logical = random_logical(k, n, 1, 24); // op(B): K x N
    let q = quantize_b(&p, &logical).unwrap();
    let scales = q.scales.as_ref().unwrap();
    assert_eq!(scales.len(), 4 * n as usize);
    for j in 0..n as usize {
        let amax = (0..k as usize).map(|kk| logical[kk * n as usize + j].abs()).fold(0.0, f64::max);
        assert_eq!(Format::F32.load(scales, j), (amax / 448.0) as f32 as f64, "channel {j}");
        for kk in 0..k as usize {
            // Stored N x K row-major: op(B)(kk, j) is at j * K + kk.
            let code = Format::E4m3fn.load_code(&q.data, j * k as usize + kk);
            let want = Format::E4m3fn.encode(logical[kk * n as usize + j] / Format::F32.load(scales, j));
            assert_eq!(code, want, "op(B)({kk},{j})");
        }
    }
}

#[test]
fn batch_strides_place_items_and_leave_gaps_zero() {
    let (m, k, batch) = (3u64, 64u64, 3u64);
    let mut p = GemmProblem::row_major(m, 2, k, Format::Int8, Format::Int8, Format::Bf16);
    p.batch = batch;
    p.a.batch_stride = m * k + 9;
    p.a_scale = Some(ScaleSpec {
        batch_stride: m * 2 + 1,
        ..ScaleSpec::new(ScaleGranularity::Block { outer: 1, inner: 32 }, Format::F32)
    });
    let logical = random_logical(m, k, batch, 25);
    let q = quantize_a(&p, &logical).unwrap();
    assert_eq!(q.data.len(), ((batch - 1) * (m * k + 9) + m * k) as usize);
    let scales = q.scales.as_ref().unwrap();
    assert_eq!(scales.len(), 4 * ((batch - 1) * 7 + 6) as usize);
    for b in 0..batch as usize {
        let data_base = b * (m * k + 9) as usize;
        let scale_base = b * 7;
        for row in 0..m as usize {
            for block in 0..2usize {
                let base = b * (m * k) as usize + row * k as usize + block * 32;
                let amax = logical[base..base + 32].iter().fold(0.0f64, |a, v| a.max(v.abs()));
                let scale = Format::F32.load(scales, scale_base + row * 2 + block);
                assert_eq!(scale, (amax / 127.0) as f32 as f64, "item {b} row {row} block {block}");
                for kk in 0..32 {
                    let code =
                        Format::Int8.load_code(&q.data, data_base + row * k as usize + block * 32 + kk);
                    assert_eq!(code, Format::Int8.encode(logical[base + kk] / scale));
                }
            }
        }
        if b + 1 < batch as usize {
            assert!(q.data[data_base + (m * k) as usize..data_base + (m * k + 9) as usize]
                .iter()
                .all(|v| *v == 0));
            assert_eq!(Format::F32.load(scales, scale_base + 6), 0.0, "scale gap after item {b}");
        }
    }
    assert_padding_is_zero(&p, Side::A, &q, "batch strides");
}

#[test]
fn broadcast_operands_share_bytes_and_scales() {
    let (k, n, batch) = (64u64, 4u64, 3u64);
    let mut p = GemmProblem::row_major(2, n, k, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
    p.batch = batch;
    p.b.batch_stride = 0; // one weight matrix for every batch item
    p.b_scale = Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32));
    let item = random_logical(k, n, 1, 26);
    let repeated: Vec<f64> = item.iter().copied().cycle().take((k * n * batch) as usize).collect();
    let q = quantize_b(&p, &repeated).unwrap();
    assert_eq!(q.data.len(), (k * n) as usize);
    assert_eq!(q.data, quantize_b(&GemmProblem { batch: 1, ..p.clone() }, &item).unwrap().data);
    assert_round_trip(&p, Side::B, &repeated, &q, "broadcast");

    // Different items cannot share one stored matrix.
    let mut different = repeated.clone();
    let changed = (k * n) as usize + 3; // item 1, op(B)(0, 3): flip its sign and grow it
    different[changed] = -different[changed].signum() * (different[changed].abs() + 10.0);
    assert!(matches!(quantize_b(&p, &different), Err(QuantizeError::AliasedElement { operand: "b", .. })));

    // Per-item data with shared scales (scale batch stride 0): each channel's scale covers the
    // channel in every item.
    p.b.batch_stride = k * n;
    let logical = random_logical(k, n, batch, 27);
    let q = quantize_b(&p, &logical).unwrap();
    let scales = q.scales.as_ref().unwrap();
    assert_eq!(scales.len(), 4 * n as usize);
    for j in 0..n as usize {
        let amax =
            (0..(batch * k) as usize).map(|row| logical[row * n as usize + j].abs()).fold(0.0, f64::max);
        assert_eq!(Format::F32.load(scales, j), (amax / 448.0) as f32 as f64);
    }
    assert_round_trip(&p, Side::B, &logical, &q, "shared scales");

    // random_inputs generates one item for a broadcast operand instead of failing.
    p.b.batch_stride = 0;
    let inputs = random_inputs(&p, 3).unwrap();
    assert_eq!(inputs.b.len(), (k * n) as usize);
}

// ---------------------------------------------------------------------------------------------
// Element placement: transposes and orders.

#[test]
fn transposed_and_column_major_operands_hold_the_same_codes() {
    let (m, n, k) = (5u64, 7u64, 96u64);
    let a_logical = random_logical(m, k, 1, 31);
    let b_logical = random_logical(k, n, 1, 32);
    let mut reference: Option<(QuantizedOperand, QuantizedOperand)> = None;
    for trans_a in [Transpose::N, Transpose::T] {
        for order_a in [Order::RowMajor, Order::ColMajor] {
            for trans_b in [Transpose::N, Transpose::T] {
                for order_b in [Order::RowMajor, Order::ColMajor] {
                    let layouts = Layouts { trans_a, order_a, trans_b, order_b, pad: 3 };
                    let mut p = problem(m, n, k, 1, Format::E5m2, layouts);
                    p.a_scale =
                        Some(ScaleSpec::new(ScaleGranularity::Block { outer: 1, inner: 32 }, Format::F32));
                    p.b_scale =
                        Some(ScaleSpec::new(ScaleGranularity::Block { outer: 4, inner: 32 }, Format::Ue8m0));
                    let qa = quantize_a(&p, &a_logical).unwrap();
                    let qb = quantize_b(&p, &b_logical).unwrap();
                    // Hand-written offsets: op(A)(i, kk) is stored at (i, kk) or, transposed, at
                    // (kk, i); row-major puts (r, c) at r * ld + c, column-major at c * ld + r.
                    let at = |order: Order, ld: u64, r: u64, c: u64| match order {
                        Order::RowMajor => r * ld + c,
                        Order::ColMajor => c * ld + r,
                    };
                    let (reference_a, reference_b) =
                        reference.get_or_insert_with(|| (qa.clone(), qb.clone()));
                    assert_eq!(qa.scales, reference_a.scales, "{layouts:?}: scales depend only on op(A)");
                    assert_eq!(qb.scales, reference_b.scales, "{layouts:?}: scales depend only on op(B)");
                    for i in 0..m {
                        for kk in 0..k {
                            let (r, c) = if trans_a == Transpose::N { (i, kk) } else { (kk, i) };
                            let code = Format::E5m2.load_code(&qa.data, at(order_a, p.a.ld, r, c) as usize);
                            // The first layout is plain row-major N with ld = K + 3 (+ even).
                            let reference_code =
                                Format::E5m2.load_code(&reference_a.data, (i * even_up(k + 3) + kk) as usize);
                            assert_eq!(code, reference_code, "{layouts:?}: A({i},{kk})");
                        }
                    }
                    for kk in 0..k {
                        for j in 0..n {
                            let (r, c) = if trans_b == Transpose::N { (kk, j) } else { (j, kk) };
                            let code = Format::E5m2.load_code(&qb.data, at(order_b, p.b.ld, r, c) as usize);
                            let reference_code =
                                Format::E5m2.load_code(&reference_b.data, (kk * even_up(n + 3) + j) as usize);
                            assert_eq!(code, reference_code, "{layouts:?}: B({kk},{j})");
                        }
                    }
                    assert_round_trip(&p, Side::A, &a_logical, &qa, &format!("{layouts:?} A"));
                    assert_round_trip(&p, Side::B, &b_logical, &qb, &format!("{layouts:?} B"));
                    assert_padding_is_zero(&p, Side::A, &qa, &format!("{layouts:?} A"));
                    assert_padding_is_zero(&p, Side::B, &qb, &format!("{layouts:?} B"));
                }
            }
        }
    }
}

/// Packed 4-bit with odd K: problem.validate requires an even leading dimension (and batch
/// stride), so each row of a row-major A starts on a byte boundary and its last nibble, past
/// K, is padding. K = 33 therefore needs ld >= 34.
#[test]
fn packed_four_bit_with_odd_k_pads_each_row_to_a_byte() {
    let (m, k) = (3u64, 33u64);
    let mut p = GemmProblem::row_major(m, 2, k, Format::E2m1, Format::E2m1, Format::Bf16);
    p.a_scale = Some(ScaleSpec::new(ScaleGranularity::Mx32, Format::Ue8m0));
    let logical = random_logical(m, k, 1, 41);
    // ld = K = 33 is odd: rejected before any byte is written.
    assert_eq!(
        quantize_a(&p, &logical),
        Err(QuantizeError::Problem(ProblemError::PackedAlignment { operand: "a" }))
    );
    p.a.ld = 34;
    p.a.batch_stride = m * 34;
    p.trans_b = Transpose::T;
    p.b = MatrixLayout { format: Format::E2m1, order: Order::RowMajor, ld: 34, batch_stride: 2 * 34 };
    p.validate().unwrap();
    let q = quantize_a(&p, &logical).unwrap();
    assert_eq!(q.data.len(), (((m - 1) * 34 + 33) as usize).div_ceil(2));
    for row in 0..m as usize {
        for kk in 0..k as usize {
            // Row `row` starts at byte row * 17; element kk is nibble kk of that row.
            let byte = q.data[row * 17 + kk / 2];
            let nibble = if kk % 2 == 0 { byte & 0xF } else { byte >> 4 };
            assert_eq!(nibble as u32, Format::E2m1.load_code(&q.data, row * 34 + kk));
        }
        if row + 1 < m as usize {
            assert_eq!(q.data[row * 17 + 16] >> 4, 0, "padding nibble of row {row}");
        }
    }
    assert_round_trip(&p, Side::A, &logical, &q, "odd K e2m1");
    assert_padding_is_zero(&p, Side::A, &q, "odd K e2m1");

    // Int4 group-wise weights with odd K, stored N x K (transposed B), ld = K + 1.
    p.b_scale = Some(ScaleSpec::new(ScaleGranularity::Block { outer: 1, inner: 32 }, Format::F16));
    p.b.format = Format::Int4;
    p.a.format = Format::Int4;
    p.a_scale = Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::Bf16));
    let b_logical = random_logical(k, 2, 1, 42);
    let qb = quantize_b(&p, &b_logical).unwrap();
    assert_round_trip(&p, Side::B, &b_logical, &qb, "odd K int4");
    assert_padding_is_zero(&p, Side::B, &qb, "odd K int4");
    let qa = quantize_a(&p, &logical).unwrap();
    assert_round_trip(&p, Side::A, &logical, &qa, "odd K int4 A");
}

// ---------------------------------------------------------------------------------------------
// random_inputs.

fn full_problem() -> GemmProblem {
    let mut p = build(
        &Case { element: Format::E4m3fn, scheme: Scheme::Blocks128, scale_format: Some(Format::F32) },
        40,
        24,
        256,
        2,
        ACTIVATIONS_AND_WEIGHTS,
    );
    p.c = Some(MatrixLayout::packed(Format::Bf16, Order::RowMajor, 40, 24));
    p.epilogue =
        Epilogue { bias: Some(Bias { format: Format::Bf16, axis: BiasAxis::Cols }), ..Epilogue::NONE };
    p.beta = Scalar::Host(1.0);
    p
}

#[test]
fn random_inputs_are_deterministic_and_seed_sensitive() {
    let p = full_problem();
    let first = random_inputs(&p, 42).unwrap();
    assert_eq!(first, random_inputs(&p, 42).unwrap());
    let other = random_inputs(&p, 43).unwrap();
    assert_ne!(first.a, other.a);
    assert_ne!(first.b, other.b);
    assert_ne!(first.c, other.c);
    assert_ne!(first.bias, other.bias);
    assert_ne!(first.a_scale, other.a_scale);
    // A and B come from different streams of the seed, not the same numbers twice.
    assert_ne!(first.a[..64], first.b[..64]);
}

#[test]
fn random_inputs_fill_every_buffer_the_problem_reads() {
    let mut p = full_problem();
    let inputs = random_inputs(&p, 1).unwrap();
    let c_layout = p.c.unwrap();
    assert_eq!(inputs.c.as_ref().unwrap().len(), 2 * c_layout.required_elements(40, 24, 2) as usize);
    assert_eq!(inputs.bias.as_ref().unwrap().len(), 2 * 24);
    let a_spec = p.a_scale.unwrap();
    assert_eq!(inputs.a_scale.as_ref().unwrap().len(), 4 * a_spec.required_entries(40, 256, 2) as usize);
    assert_eq!(inputs.device_scalars, Default::default());
    let c_values: Vec<f64> = (0..40 * 24).map(|i| Format::Bf16.load(inputs.c.as_ref().unwrap(), i)).collect();
    let mean_square = c_values.iter().map(|v| v * v).sum::<f64>() / c_values.len() as f64;
    assert!((0.7..1.3).contains(&mean_square), "C should be standard normal, mean square {mean_square}");

    // Bias along rows has length M, in its own format.
    p.epilogue.bias = Some(Bias { format: Format::F32, axis: BiasAxis::Rows });
    p.c = None;
    let inputs = random_inputs(&p, 1).unwrap();
    assert_eq!(inputs.bias.as_ref().unwrap().len(), 4 * 40);
    assert_eq!(inputs.c, None);
    assert!((0..40).all(|i| Format::F32.load(inputs.bias.as_ref().unwrap(), i) != 0.0));
}

#[test]
fn random_inputs_are_never_zero_for_any_scheme() {
    for case in all_cases() {
        let p = build(&case, 33, 48, 160, 1, ACTIVATIONS_AND_WEIGHTS);
        let inputs = random_inputs(&p, 7).unwrap_or_else(|e| panic!("{}: {e}", describe(&case)));
        for (side, data) in [(Side::A, &inputs.a), (Side::B, &inputs.b)] {
            let format = side.layout(&p).format;
            let offsets = mapped_offsets(&p, side);
            let non_zero = offsets.iter().filter(|o| format.load(data, **o as usize) != 0.0).count();
            // Most elements survive quantization. Small ones legitimately round to zero: up to
            // ~40% for per-token int4 (7 levels against Gaussian tails and outlier channels).
            assert!(
                non_zero * 2 >= offsets.len(),
                "{} {side:?}: only {non_zero} of {} elements are non-zero",
                describe(&case),
                offsets.len()
            );
        }
        if case.scale_format.is_some() {
            assert!(inputs.a_scale.as_ref().unwrap().iter().any(|b| *b != 0));
            assert!(inputs.b_scale.as_ref().unwrap().iter().any(|b| *b != 0));
        }
    }
}

/// The data exists to expose layout bugs: decoding with a misread scale layout, ignored scales,
/// or another batch item's scales must be far off, while the right reading is close.
#[test]
fn misread_scale_layouts_are_visible_in_random_data() {
    let (m, k, batch) = (64u64, 512u64, 2u64);
    let mut p = GemmProblem::row_major(m, 8, k, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
    p.batch = batch;
    p.a_scale = Some(per_item_scales(
        ScaleSpec::new(ScaleGranularity::Block { outer: 1, inner: 128 }, Format::F32),
        m,
        k,
        0,
    ));
    let logical = random_logical(m, k, batch, 51);
    let q = quantize_a(&p, &logical).unwrap();
    let spec = p.a_scale.unwrap();
    let scales = q.scales.as_ref().unwrap();
    let nmse = |entry_of: &dyn Fn(u64, u64, u64) -> Option<u64>| {
        let (mut error, mut energy) = (0.0, 0.0);
        for (b, i, kk) in elements(&p, Side::A) {
            let x = logical[Side::A.logical_index(&p, b, i, kk)];
            let scale = entry_of(b, i, kk).map_or(1.0, |e| Format::F32.load(scales, e as usize));
            let y = Format::E4m3fn.load(&q.data, p.a_offset(b, i, kk) as usize) * scale;
            error += (x - y) * (x - y);
            energy += x * x;
        }
        error / energy
    };
    let right = nmse(&|b, i, kk| Some(p.a_scale_entry(&spec, b, i, kk)));
    assert!(right < 3e-3, "correct reading: NMSE {right}");
    let transposed = ScaleSpec { storage: ScaleStorage::InnerMajor, ..spec };
    type EntryReading<'a> = &'a dyn Fn(u64, u64, u64) -> Option<u64>;
    let misreadings: [(&str, EntryReading); 3] = [
        ("inner-major instead of outer-major", &|b, i, kk| Some(p.a_scale_entry(&transposed, b, i, kk))),
        ("batch stride ignored", &|_, i, kk| Some(p.a_scale_entry(&spec, 0, i, kk))),
        ("scales ignored", &|_, _, _| None),
    ];
    for (what, entry_of) in misreadings {
        let wrong = nmse(entry_of);
        assert!(wrong > 100.0 * right && wrong > 0.05, "{what}: NMSE {wrong} vs {right}");
    }
}

// ---------------------------------------------------------------------------------------------
// Errors.

#[test]
fn bad_inputs_are_errors() {
    let mut p = GemmProblem::row_major(2, 3, 64, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
    let good = random_logical(2, 64, 1, 1);
    assert_eq!(
        quantize_a(&p, &good[..100]),
        Err(QuantizeError::LogicalLength { operand: "a", expected: 128, actual: 100 })
    );
    assert!(matches!(
        quantize_b(&p, &good),
        Err(QuantizeError::LogicalLength { operand: "b", expected: 192, .. })
    ));

    let mut with_nan = good.clone();
    with_nan[17] = f64::NAN;
    assert!(matches!(
        quantize_a(&p, &with_nan),
        Err(QuantizeError::NonFinite { operand: "a", index: 17, .. })
    ));
    with_nan[17] = f64::NEG_INFINITY;
    assert!(matches!(quantize_a(&p, &with_nan), Err(QuantizeError::NonFinite { index: 17, .. })));

    // Invalid problems are rejected by problem.validate().
    let mut zero_k = p.clone();
    zero_k.k = 0;
    assert_eq!(
        quantize_a(&zero_k, &[]),
        Err(QuantizeError::Problem(ProblemError::EmptyDimension { what: "k" }))
    );
    p.a_scale = Some(
        ScaleSpec::new(ScaleGranularity::Block { outer: 1, inner: 128 }, Format::F32)
            .with_storage(ScaleStorage::Swizzled128x4),
    );
    assert!(matches!(
        quantize_a(&p, &good),
        Err(QuantizeError::Problem(ProblemError::Scale { operand: "a", .. }))
    ));
    assert!(matches!(random_inputs(&p, 0), Err(QuantizeError::Problem(_))));

    // A scale the scale format cannot hold is an error, not a silent saturation.
    p.a_scale = Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F16));
    let huge: Vec<f64> = good.iter().map(|v| v * 1e9).collect();
    assert!(matches!(
        quantize_a(&p, &huge),
        Err(QuantizeError::ScaleOutOfRange { operand: "a", format: Format::F16, .. })
    ));
    p.a_scale = Some(ScaleSpec::new(ScaleGranularity::Nvfp4, Format::Ue4m3));
    p.a.format = Format::E2m1;
    assert!(matches!(
        quantize_a(&p, &good.iter().map(|v| v * 1e4).collect::<Vec<_>>()),
        Err(QuantizeError::ScaleOutOfRange { format: Format::Ue4m3, .. })
    ));

    // Tensor scales: a host value must be positive, a device one a float format.
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        p.a_tensor_scale = Some(Scalar::Host(bad));
        assert!(
            matches!(quantize_a(&p, &good), Err(QuantizeError::TensorScale { operand: "a", .. })),
            "{bad}"
        );
    }
    p.a_tensor_scale = Some(Scalar::Device { ptr: 0, format: Format::Int8 });
    assert!(matches!(quantize_a(&p, &good), Err(QuantizeError::TensorScale { .. })));
    // A leading dimension or batch stride near u64::MAX is an error, not an index overflow.
    let mut absurd = p.clone();
    absurd.a_tensor_scale = None;
    absurd.a.batch_stride = u64::MAX / 4 * 2; // even: A is packed e2m1 here
    absurd.batch = 3;
    let three_items: Vec<f64> = good.iter().copied().cycle().take(3 * good.len()).collect();
    assert!(matches!(
        quantize_a(&absurd, &three_items),
        Err(QuantizeError::IndexOverflow { what: "a" })
            | Err(QuantizeError::Problem(ProblemError::TooLarge { operand: "a" }))
    ));
    absurd.a.batch_stride = 128;
    absurd.a.ld = u64::MAX - 1;
    assert!(matches!(
        quantize_a(&absurd, &three_items),
        Err(QuantizeError::IndexOverflow { what: "a" })
            | Err(QuantizeError::Problem(ProblemError::TooLarge { operand: "a" }))
    ));
    absurd.a.ld = 64;
    absurd.a_scale = Some(ScaleSpec { batch_stride: u64::MAX / 2, ..absurd.a_scale.unwrap() });
    assert_eq!(
        quantize_a(&absurd, &three_items),
        Err(QuantizeError::IndexOverflow { what: "scale entries" })
    );
    // Large but representable: refused by the allocator check, not by an abort.
    absurd.a_scale = None;
    absurd.a.batch_stride = 1 << 60;
    assert!(matches!(quantize_a(&absurd, &three_items), Err(QuantizeError::TooLarge { .. })));

    p.a_tensor_scale = Some(Scalar::Device { ptr: 0, format: Format::Bf16 });
    let q = quantize_a(&p, &good).unwrap();
    let ts = q.tensor_scale.unwrap() as f64;
    assert_eq!(Format::Bf16.round(ts), ts, "a bf16 device scalar holds a bf16 value");
}
