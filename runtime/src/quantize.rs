//! Quantizers that make realistic test data: the bytes, scales and per-tensor scales that real
//! quantization kernels (vLLM / SGLang / TensorRT-LLM / DeepGEMM style) would hand to a GEMM.
//!
//! Every placement goes through `problem.rs`: element offsets through
//! [`GemmProblem::a_offset`] / [`GemmProblem::b_offset`], scale entries through
//! [`GemmProblem::a_scale_entry`] / [`GemmProblem::b_scale_entry`], buffer sizes through
//! [`MatrixLayout::required_elements`] and [`ScaleSpec::required_entries`]. The quantizers, the
//! oracle and the device kernels therefore share one definition of every layout, and a layout
//! bug cannot hide by being made twice in the same way.
//!
//! # What is stored
//! The dequantized value of an element is
//!
//! ```text
//! x ~= decode(code) * scale(entry) * tensor_scale
//! ```
//!
//! where `scale` is 1 without a scale spec and `tensor_scale` is 1 when the problem declares
//! none (`problem.a_tensor_scale` / `b_tensor_scale` is `None`). Elements are encoded with
//! [`Format::encode`]: round-to-nearest-even, saturating for the narrow formats; f16 / bf16
//! follow IEEE and overflow to inf (only values beyond their range, which no scale rule makes).
//!
//! # Scale rules (each mirrors what real kernels do)
//! Let `range` be the largest magnitude an element should take after scaling: the element
//! format's `max_finite` for the narrow formats (FP8, FP4, INT8, INT4: symmetric quantization,
//! so int8 uses 127 and int4 7, never -128 / -8), and 1 for f32 / f16 / bf16 elements (they
//! need no range mapping; a scale, if the problem asks for one, normalises blocks to [-1, 1]).
//! For a scale entry covering elements with largest magnitude `amax` the ideal scale is
//! `amax / range / tensor_scale`, then:
//! - f32 / f16 / bf16 scales: the ideal scale rounded to nearest-even in the scale format
//!   (per-token FP8, DeepSeek-style 1x128 / 128x128 f32 block scales, GPTQ/AWQ f16 group
//!   scales). Rounding down can saturate the block maximum by at most half an ulp of the scale
//!   format, as it does in those kernels.
//! - ue8m0 scales (OCP MX, DeepSeek-V3.1 UE8M0 FP8 scales): `2^ceil(log2(ideal))`, the power of
//!   two at or above the ideal scale, so no element saturates. (The OCP MX spec's
//!   `floor(log2(amax)) - emax` can saturate the largest elements; the ceiling variant is the
//!   `ceil_to_ue8m0` of the DeepGEMM / SGLang UE8M0 paths and keeps the round-trip bound simple.)
//! - ue4m3 scales (NVFP4): the ideal scale rounded to ue4m3. With a tensor scale (NVFP4 always
//!   has one) the tensor scale is chosen as `amax_tensor / (range * 448)`, so block scales use
//!   the whole ue4m3 range: for e2m1 this is `amax / (448 * 6)`, the decode-side inverse of
//!   TensorRT-LLM's global scale `448 * 6 / amax`.
//! - A scale entry whose block is all zeros gets scale 1 (kernels guard the division the same
//!   way). A non-zero block whose ideal scale underflows the scale format gets the format's
//!   smallest positive value (elements then lose precision but never saturate). An ideal scale
//!   that would not round to a finite scale (above the largest value by half a step or more;
//!   for ue8m0, above 2^127 at all) is an error, not a silent saturation.
//! - Scale entries shared by several blocks (a scale batch stride of 0, or any aliasing the
//!   layout describes) get the amax over every element mapped to them.
//!
//! # Tensor scales
//! A per-tensor scale is used exactly when the problem declares one:
//! - `Some(Scalar::Device { format, .. })`: the quantizer chooses it: `amax_tensor / (range *
//!   448)` with ue4m3 block scales, `amax_tensor / range` otherwise (tensor-wise FP8 scaling
//!   when there are no block scales), rounded to `format` (f32, f16 or bf16). It is returned in
//!   [`QuantizedOperand::tensor_scale`], and [`random_inputs`] puts it into
//!   `HostInputs::device_scalars`, where [`GemmProblem::resolve_scalars`] finds it.
//! - `Some(Scalar::Host(v))`: a static, calibrated scale: elements are quantized against `v`
//!   exactly as given (it must be finite and positive).
//! - `None`: no tensor scale. NVFP4 kernels always use one, so an NVFP4 problem should declare
//!   `Scalar::Device`; without one the ue4m3 block scales must hold the magnitudes alone.
//!
//! # Padding
//! Buffers are sized by `problem.rs` and start zeroed; bytes and scale entries no element maps
//! to (leading-dimension and batch-stride gaps, the padding tiles of the swizzled scale layout,
//! the unused high nibble of a packed 4-bit row with odd length) stay zero. Zero is a valid
//! code in every format, so a reader that wrongly includes padding sees plausible-looking
//! zeros: the oracle's tests must check that padding is never read, not rely on junk values.
//!
//! # Packed 4-bit operands
//! e2m1 and int4 hold two elements per byte, element `2i` in the low nibble.
//! [`GemmProblem::validate`] requires an even leading dimension and batch stride for them, so
//! every stored row (row-major) or column (column-major) starts on a byte boundary. With an odd
//! contiguous extent (odd K for a row-major, untransposed A) the leading dimension is at least
//! K + 1 and the last nibble of each row is padding.

use crate::formats::Format;
use crate::problem::{BiasAxis, GemmProblem, HostInputs, MatrixLayout, ProblemError, Scalar, ScaleSpec};
use crate::rng::{hash3, unit_f64, SplitMix64};

/// One quantized operand, laid out exactly as its problem describes.
#[derive(Debug, Clone, PartialEq)]
pub struct QuantizedOperand {
    /// Elements in the operand's stored layout (format, order, ld, batch stride, transpose).
    pub data: Vec<u8>,
    /// Scale entries in the layout of the operand's [`ScaleSpec`]; `None` without a spec.
    pub scales: Option<Vec<u8>>,
    /// The per-tensor scale the elements were quantized against; `None` when the problem
    /// declares none. For `Scalar::Device` this is the value the caller must make available
    /// (e.g. in `HostInputs::device_scalars`); for `Scalar::Host(v)` it is `v` as f32.
    pub tensor_scale: Option<f32>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantizeError {
    #[error("invalid problem: {0}")]
    Problem(#[from] ProblemError),
    #[error("{operand}: expected {expected} logical values (batch x rows x cols), got {actual}")]
    LogicalLength { operand: &'static str, expected: u64, actual: u64 },
    #[error("{operand}: logical value {index} is {value}; quantizers need finite inputs")]
    NonFinite { operand: &'static str, index: u64, value: f64 },
    #[error("{operand}: scale entry {entry} needs scale {scale}, above the largest {format} ({max})")]
    ScaleOutOfRange { operand: &'static str, entry: u64, scale: f64, format: Format, max: f64 },
    #[error("{operand}: tensor scale: {reason}")]
    TensorScale { operand: &'static str, reason: String },
    #[error(
        "{operand}: stored element {offset} is shared by logical elements that quantize differently; \
         a broadcast (batch stride 0) operand needs identical batch items"
    )]
    AliasedElement { operand: &'static str, offset: u64 },
    #[error("{what}: {count} elements do not fit in memory")]
    TooLarge { what: &'static str, count: u64 },
    #[error("{what}: dimensions, leading dimension or batch stride make indices overflow 64 bits")]
    IndexOverflow { what: &'static str },
    #[error("{operand}: {what} index {index} is outside the {len} that problem.rs sized the buffer for")]
    MappingOutOfRange { operand: &'static str, what: &'static str, index: u64, len: u64 },
}

/// Quantizes op(A): `logical` holds batch x M x K values, row-major, batch-major.
pub fn quantize_a(problem: &GemmProblem, logical: &[f64]) -> Result<QuantizedOperand, QuantizeError> {
    quantize_operand(problem, Operand::A, logical)
}

/// Quantizes op(B): `logical` holds batch x K x N values, row-major, batch-major.
pub fn quantize_b(problem: &GemmProblem, logical: &[f64]) -> Result<QuantizedOperand, QuantizeError> {
    quantize_operand(problem, Operand::B, logical)
}

/// Deterministic inputs for a whole problem, quantized as real kernels would.
///
/// A (batch x M x K) and B (batch x K x N) come from [`random_logical`]: normal values with
/// per-row, per-column and per-batch-item magnitudes and a few outliers, so per-row, per-block
/// and per-batch scales all differ and reading them from the wrong place changes the result. An
/// operand with batch stride 0 (one matrix broadcast to every batch item) gets one item,
/// repeated. C (when `problem.c` is present) and the bias (when the epilogue has one; length M
/// for `BiasAxis::Rows`, N for `BiasAxis::Cols`, in the bias format) are standard normal.
///
/// Tensor scales follow the problem (see the module docs): a `Scalar::Device` tensor scale is
/// chosen here and returned in `device_scalars.a_tensor_scale` / `b_tensor_scale`. Other device
/// scalars (alpha, beta, d_scale) are the caller's to fill: they are not derived from data.
pub fn random_inputs(problem: &GemmProblem, seed: u64) -> Result<HostInputs, QuantizeError> {
    problem.validate()?;
    let (m, n, k, batch) = (problem.m, problem.n, problem.k, problem.batch);
    let a_logical = random_operand_logical(m, k, batch, problem.a.batch_stride, hash3(seed, STREAM_A, 0))?;
    let b_logical = random_operand_logical(k, n, batch, problem.b.batch_stride, hash3(seed, STREAM_B, 0))?;
    let a = quantize_a(problem, &a_logical)?;
    let b = quantize_b(problem, &b_logical)?;

    let c = match &problem.c {
        Some(layout) => Some(random_output_matrix(problem, layout, hash3(seed, STREAM_C, 0))?),
        None => None,
    };
    let bias = match &problem.epilogue.bias {
        Some(bias) => {
            let len = match bias.axis {
                BiasAxis::Rows => m,
                BiasAxis::Cols => n,
            };
            let mut bytes = zeroed_elements(bias.format, len, "bias")?;
            let mut rng = SplitMix64::new(hash3(seed, STREAM_BIAS, 0));
            for index in 0..len as usize {
                bias.format.store_code(&mut bytes, index, bias.format.encode(rng.normal()));
            }
            Some(bytes)
        }
        None => None,
    };

    let device_value = |declared: &Option<Scalar>, chosen: Option<f32>| match declared {
        Some(Scalar::Device { .. }) => chosen.map(f64::from),
        _ => None,
    };
    let mut inputs = HostInputs {
        a: a.data,
        b: b.data,
        c,
        a_scale: a.scales,
        b_scale: b.scales,
        bias,
        ..HostInputs::default()
    };
    inputs.device_scalars.a_tensor_scale = device_value(&problem.a_tensor_scale, a.tensor_scale);
    inputs.device_scalars.b_tensor_scale = device_value(&problem.b_tensor_scale, b.tensor_scale);
    Ok(inputs)
}

/// `batch x rows x cols` values (row-major, batch-major) shaped like LLM activations and
/// weights: standard normal times
/// - a magnitude per column, shared by all batch items (an input channel's scale is a property
///   of the model): 2^[-1, 1), with one column in 32 an "outlier channel" 4x larger;
/// - a magnitude per row, drawn afresh for every batch item (tokens, heads and experts differ):
///   2^[-1, 1) times a per-item 2^[-1, 1);
/// - isolated outliers: about one element in 1024 is 4x to 8x larger.
///
/// So per-row, per-block and per-item scales all differ, and a scale read from the wrong row,
/// block or batch item visibly changes the result, while the dynamic range stays one that
/// tensor-wise int8 and per-token int4 still represent with most elements non-zero. Never
/// exactly zero.
pub fn random_logical(rows: u64, cols: u64, batch: u64, seed: u64) -> Vec<f64> {
    let mut rng = SplitMix64::new(seed);
    let col_magnitude: Vec<f64> = (0..cols)
        .map(|_| {
            let channel = 2f64.powf(rng.uniform(-1.0, 1.0));
            if rng.below(32) == 0 {
                channel * 4.0
            } else {
                channel
            }
        })
        .collect();
    // Capacity is only a hint: never let a huge request overflow the multiplication.
    let hint = rows.saturating_mul(cols).saturating_mul(batch).min(1 << 24) as usize;
    let mut values = Vec::with_capacity(hint);
    for _ in 0..batch {
        let item_magnitude = 2f64.powf(rng.uniform(-1.0, 1.0));
        for _ in 0..rows {
            let row_magnitude = item_magnitude * 2f64.powf(rng.uniform(-1.0, 1.0));
            for col_scale in &col_magnitude {
                let mut value = rng.normal() * row_magnitude * col_scale;
                if rng.below(1024) == 0 {
                    value *= rng.uniform(4.0, 8.0);
                }
                if value == 0.0 {
                    // Box-Muller returns exactly 0 with probability ~2^-53; keep the promise.
                    value = f64::MIN_POSITIVE.sqrt() * row_magnitude;
                }
                values.push(value);
            }
        }
    }
    values
}

// Independent random streams of one seed.
const STREAM_A: u64 = 1;
const STREAM_B: u64 = 2;
const STREAM_C: u64 = 3;
const STREAM_BIAS: u64 = 4;

/// Logical values for an operand; a broadcast operand (stored batch stride 0) gets one item
/// repeated, since every batch item reads the same bytes.
fn random_operand_logical(
    rows: u64,
    cols: u64,
    batch: u64,
    batch_stride: u64,
    seed: u64,
) -> Result<Vec<f64>, QuantizeError> {
    let total = rows.checked_mul(cols).and_then(|v| v.checked_mul(batch));
    let total = total.ok_or(QuantizeError::IndexOverflow { what: "logical operand" })?;
    to_usize(total, "logical operand")?;
    if batch_stride == 0 && batch > 1 {
        let item = random_logical(rows, cols, 1, seed);
        Ok(item.iter().copied().cycle().take(total as usize).collect())
    } else {
        Ok(random_logical(rows, cols, batch, seed))
    }
}

/// A standard-normal M x N matrix (C) in `layout`. Values come from a counter-based hash of
/// (batch item, row, column), so a broadcast C (batch stride 0) writes the same code to each
/// shared element.
fn random_output_matrix(
    problem: &GemmProblem,
    layout: &MatrixLayout,
    seed: u64,
) -> Result<Vec<u8>, QuantizeError> {
    let (m, n, batch) = (problem.m, problem.n, problem.batch);
    check_index_range("c", batch, layout.batch_stride, m.max(n), layout.ld)?;
    let elements = layout.required_elements(m, n, batch);
    let mut bytes = zeroed_elements(layout.format, elements, "c")?;
    for item in 0..batch {
        let source_item = if layout.batch_stride == 0 { 0 } else { item };
        for i in 0..m {
            for j in 0..n {
                let offset = GemmProblem::out_offset(layout, item, i, j);
                if offset >= elements {
                    return Err(QuantizeError::MappingOutOfRange {
                        operand: "c",
                        what: "element",
                        index: offset,
                        len: elements,
                    });
                }
                // A hash input only: wrapping is harmless for absurd shapes.
                let counter = source_item.wrapping_mul(m).wrapping_add(i).wrapping_mul(n).wrapping_add(j);
                let value = hashed_normal(seed, counter);
                layout.format.store_code(&mut bytes, offset as usize, layout.format.encode(value));
            }
        }
    }
    Ok(bytes)
}

/// Standard normal from two counter-based uniforms (Box-Muller).
fn hashed_normal(seed: u64, counter: u64) -> f64 {
    let u1 = unit_f64(hash3(seed, 0, counter)).max(f64::MIN_POSITIVE);
    let u2 = unit_f64(hash3(seed, 1, counter));
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// A or B, with the operand-neutral view `problem.rs` uses for scales: outer is M for A and
/// N for B, inner is K for both.
#[derive(Debug, Clone, Copy)]
enum Operand {
    A,
    B,
}

impl Operand {
    fn name(self) -> &'static str {
        match self {
            Operand::A => "a",
            Operand::B => "b",
        }
    }

    fn layout(self, problem: &GemmProblem) -> &MatrixLayout {
        match self {
            Operand::A => &problem.a,
            Operand::B => &problem.b,
        }
    }

    fn scale_spec(self, problem: &GemmProblem) -> Option<&ScaleSpec> {
        match self {
            Operand::A => problem.a_scale.as_ref(),
            Operand::B => problem.b_scale.as_ref(),
        }
    }

    fn tensor_scalar(self, problem: &GemmProblem) -> Option<&Scalar> {
        match self {
            Operand::A => problem.a_tensor_scale.as_ref(),
            Operand::B => problem.b_tensor_scale.as_ref(),
        }
    }

    /// (outer, inner) extents.
    fn extents(self, problem: &GemmProblem) -> (u64, u64) {
        match self {
            Operand::A => (problem.m, problem.k),
            Operand::B => (problem.n, problem.k),
        }
    }

    fn stored_dims(self, problem: &GemmProblem) -> (u64, u64) {
        match self {
            Operand::A => problem.a_stored_dims(),
            Operand::B => problem.b_stored_dims(),
        }
    }

    /// Index into the caller's logical array: A is batch x M x K, B is batch x K x N.
    fn logical_index(self, problem: &GemmProblem, batch: u64, outer: u64, inner: u64) -> u64 {
        match self {
            Operand::A => (batch * problem.m + outer) * problem.k + inner,
            Operand::B => (batch * problem.k + inner) * problem.n + outer,
        }
    }

    fn element_offset(self, problem: &GemmProblem, batch: u64, outer: u64, inner: u64) -> u64 {
        match self {
            Operand::A => problem.a_offset(batch, outer, inner),
            Operand::B => problem.b_offset(batch, inner, outer),
        }
    }

    fn scale_entry(self, problem: &GemmProblem, spec: &ScaleSpec, batch: u64, outer: u64, inner: u64) -> u64 {
        match self {
            Operand::A => problem.a_scale_entry(spec, batch, outer, inner),
            Operand::B => problem.b_scale_entry(spec, batch, inner, outer),
        }
    }
}

/// Visits every logical element of an operand as (batch, outer, inner, value).
fn for_each_element(
    problem: &GemmProblem,
    operand: Operand,
    logical: &[f64],
    mut visit: impl FnMut(u64, u64, u64, f64) -> Result<(), QuantizeError>,
) -> Result<(), QuantizeError> {
    let (outer_extent, inner_extent) = operand.extents(problem);
    for batch in 0..problem.batch {
        for outer in 0..outer_extent {
            for inner in 0..inner_extent {
                // In range: the caller checked logical.len() == batch * outer * inner.
                let value = logical[operand.logical_index(problem, batch, outer, inner) as usize];
                visit(batch, outer, inner, value)?;
            }
        }
    }
    Ok(())
}

fn quantize_operand(
    problem: &GemmProblem,
    operand: Operand,
    logical: &[f64],
) -> Result<QuantizedOperand, QuantizeError> {
    problem.validate()?;
    let name = operand.name();
    let (outer_extent, inner_extent) = operand.extents(problem);
    let expected = outer_extent
        .checked_mul(inner_extent)
        .and_then(|v| v.checked_mul(problem.batch))
        .ok_or(QuantizeError::IndexOverflow { what: "logical operand" })?;
    if logical.len() as u64 != expected {
        return Err(QuantizeError::LogicalLength { operand: name, expected, actual: logical.len() as u64 });
    }
    if let Some(index) = logical.iter().position(|v| !v.is_finite()) {
        return Err(QuantizeError::NonFinite { operand: name, index: index as u64, value: logical[index] });
    }

    let layout = operand.layout(problem);
    let element_format = layout.format;
    let range = quantization_range(element_format);
    let spec = operand.scale_spec(problem);
    let amax_tensor = logical.iter().fold(0.0f64, |acc, v| acc.max(v.abs()));
    let tensor_scale = choose_tensor_scale(
        name,
        operand.tensor_scalar(problem),
        amax_tensor,
        range,
        spec.map(|s| s.format),
    )?;
    let tensor_multiplier = tensor_scale.unwrap_or(1.0);

    // Scales first: each entry's amax over every element mapped to it, then one code per entry.
    let mut scale_bytes = None;
    let mut entry_scales: Vec<f64> = Vec::new();
    if let Some(spec) = spec {
        let extent = outer_extent.max(inner_extent);
        check_index_range("scale entries", problem.batch, spec.batch_stride, extent, spec.ld)?;
        let entries = spec.required_entries(outer_extent, inner_extent, problem.batch);
        let entry_count = to_usize(entries, "scale entries")?;
        // -1 marks an entry no element maps to: padding, left as zero bytes.
        let mut entry_amax = try_filled(entry_count, -1.0f64, "scale entries")?;
        for_each_element(problem, operand, logical, |batch, outer, inner, value| {
            let entry = operand.scale_entry(problem, spec, batch, outer, inner);
            if entry >= entries {
                return Err(QuantizeError::MappingOutOfRange {
                    operand: name,
                    what: "scale entry",
                    index: entry,
                    len: entries,
                });
            }
            let slot = &mut entry_amax[entry as usize];
            *slot = slot.max(value.abs());
            Ok(())
        })?;
        let mut bytes = zeroed_elements(spec.format, entries, "scale entries")?;
        entry_scales = try_filled(entry_count, 1.0f64, "scale entries")?;
        for (entry, amax) in entry_amax.iter().enumerate() {
            if *amax < 0.0 {
                continue;
            }
            let code = scale_code(name, entry as u64, spec.format, *amax, range, tensor_multiplier)?;
            spec.format.store_code(&mut bytes, entry, code);
            entry_scales[entry] = spec.format.decode_code(code);
        }
        scale_bytes = Some(bytes);
    }

    let (rows, cols) = operand.stored_dims(problem);
    check_index_range(name, problem.batch, layout.batch_stride, rows.max(cols), layout.ld)?;
    let elements = layout.required_elements(rows, cols, problem.batch);
    let element_count = to_usize(elements, "operand elements")?;
    let mut data = zeroed_elements(element_format, elements, "operand elements")?;
    // Which stored elements are written, to catch two logical elements sharing one.
    let mut written = try_filled(element_count.div_ceil(64), 0u64, "operand elements")?;
    for_each_element(problem, operand, logical, |batch, outer, inner, value| {
        let block_scale = match spec {
            // In range: the first pass checked every entry against the buffer.
            Some(spec) => entry_scales[operand.scale_entry(problem, spec, batch, outer, inner) as usize],
            None => 1.0,
        };
        let code = element_format.encode(value / (block_scale * tensor_multiplier));
        let offset = operand.element_offset(problem, batch, outer, inner);
        if offset >= elements {
            return Err(QuantizeError::MappingOutOfRange {
                operand: name,
                what: "element",
                index: offset,
                len: elements,
            });
        }
        let (word, bit) = ((offset / 64) as usize, 1u64 << (offset % 64));
        if written[word] & bit != 0 {
            if element_format.load_code(&data, offset as usize) != code {
                return Err(QuantizeError::AliasedElement { operand: name, offset });
            }
        } else {
            element_format.store_code(&mut data, offset as usize, code);
            written[word] |= bit;
        }
        Ok(())
    })?;

    Ok(QuantizedOperand { data, scales: scale_bytes, tensor_scale: tensor_scale.map(|v| v as f32) })
}

/// Largest magnitude an element should take after scaling (see the module docs).
fn quantization_range(format: Format) -> f64 {
    match format {
        Format::F32 | Format::F16 | Format::Bf16 => 1.0,
        _ => format.max_finite(),
    }
}

/// The tensor scale the elements are quantized against, per the problem's declaration.
fn choose_tensor_scale(
    operand: &'static str,
    declared: Option<&Scalar>,
    amax_tensor: f64,
    range: f64,
    block_scale_format: Option<Format>,
) -> Result<Option<f64>, QuantizeError> {
    match declared {
        None => Ok(None),
        Some(Scalar::Host(value)) => {
            if value.is_finite() && *value > 0.0 {
                Ok(Some(*value))
            } else {
                Err(QuantizeError::TensorScale {
                    operand,
                    reason: format!("host value {value} is not finite and positive"),
                })
            }
        }
        Some(Scalar::Device { format, .. }) => {
            if !matches!(format, Format::F32 | Format::F16 | Format::Bf16) {
                return Err(QuantizeError::TensorScale {
                    operand,
                    reason: format!("a device tensor scale in {format} is not supported (f32, f16, bf16)"),
                });
            }
            if amax_tensor == 0.0 {
                return Ok(Some(1.0));
            }
            // Two-level NVFP4-style scaling: leave the ue4m3 block scales their whole range.
            let block_headroom = match block_scale_format {
                Some(Format::Ue4m3) => Format::Ue4m3.max_finite(),
                _ => 1.0,
            };
            let ideal = amax_tensor / (range * block_headroom);
            let rounded = format.round(ideal);
            if !rounded.is_finite() {
                return Err(QuantizeError::TensorScale {
                    operand,
                    reason: format!("{ideal} overflows {format}"),
                });
            }
            if rounded == 0.0 {
                return Ok(Some(smallest_positive(*format)));
            }
            Ok(Some(rounded))
        }
    }
}

/// Code of the scale for one entry whose elements have largest magnitude `amax`.
fn scale_code(
    operand: &'static str,
    entry: u64,
    format: Format,
    amax: f64,
    range: f64,
    tensor_scale: f64,
) -> Result<u32, QuantizeError> {
    if amax == 0.0 {
        return Ok(format.encode(1.0));
    }
    let ideal = amax / range / tensor_scale;
    if ideal >= overflow_threshold(format) {
        return Err(QuantizeError::ScaleOutOfRange {
            operand,
            entry,
            scale: ideal,
            format,
            max: format.max_finite(),
        });
    }
    let code = match format {
        // Power of two at or above the ideal scale: nothing saturates. 2^-127 is the smallest
        // ue8m0 value; the overflow side was rejected above.
        Format::Ue8m0 => (ceil_log2(ideal).max(-127) + 127) as u32,
        _ => {
            let code = format.encode(ideal);
            if format.decode_code(code) == 0.0 {
                smallest_positive_code(format)
            } else {
                code
            }
        }
    };
    Ok(code)
}

/// Smallest ideal scale that `format` cannot hold: ue8m0 rounds up, so anything above its
/// largest value; the round-to-nearest formats round up to (but not beyond) their largest
/// value until half a step above it. Ideal scales just above the largest value are rounding
/// noise of the tensor scale (an NVFP4 block holding the tensor amax asks for 448 * (1 + eps));
/// they round to the largest value and saturate the block maximum by that same tiny amount.
fn overflow_threshold(format: Format) -> f64 {
    let max = format.max_finite();
    match format {
        Format::Ue8m0 => f64::from_bits(max.to_bits() + 1),
        _ => {
            let below_max = format.decode_code(format.encode(max) - 1);
            max + (max - below_max) / 2.0
        }
    }
}

/// Smallest integer e with 2^e >= x, for finite x > 0; values at or below 2^-127 give -127.
fn ceil_log2(x: f64) -> i32 {
    if x <= 2f64.powi(-127) {
        return -127;
    }
    // log2 can be off by an ulp next to exact powers of two: settle with exact comparisons
    // (powers of two between 2^-128 and 2^128 are exact in f64).
    let mut e = x.log2().ceil() as i32;
    while 2f64.powi(e - 1) >= x {
        e -= 1;
    }
    while 2f64.powi(e) < x {
        e += 1;
    }
    e
}

/// Code of the smallest positive value of a scale format (the first subnormal for the IEEE-like
/// formats, 2^-127 for ue8m0).
fn smallest_positive_code(format: Format) -> u32 {
    match format {
        Format::Ue8m0 => 0,
        _ => 1,
    }
}

fn smallest_positive(format: Format) -> f64 {
    format.decode_code(smallest_positive_code(format))
}

/// `problem.rs` computes indices with unchecked u64 arithmetic, and a leading dimension or batch
/// stride comes from the caller. This coarse bound on every index of a buffer, computed with
/// checked arithmetic, turns descriptions that could overflow it into errors first:
/// `batch * batch_stride + (extent + 1) * (ld + extent + 1) * 512`, where `extent` is the
/// largest dimension involved and 512 covers a padded swizzled 128x4 scale tile.
fn check_index_range(
    what: &'static str,
    batch: u64,
    batch_stride: u64,
    extent: u64,
    ld: u64,
) -> Result<(), QuantizeError> {
    let per_item = extent
        .checked_add(1)
        .zip(ld.checked_add(extent).and_then(|v| v.checked_add(1)))
        .and_then(|(a, b)| a.checked_mul(b))
        .and_then(|v| v.checked_mul(512));
    let bound =
        batch.checked_mul(batch_stride).zip(per_item).and_then(|(items, item)| items.checked_add(item));
    bound.map(|_| ()).ok_or(QuantizeError::IndexOverflow { what })
}

fn to_usize(count: u64, what: &'static str) -> Result<usize, QuantizeError> {
    usize::try_from(count).map_err(|_| QuantizeError::TooLarge { what, count })
}

/// A vector of `len` copies of `value`, or an error when the allocation cannot be made (a huge
/// leading dimension or batch stride must not abort the process).
fn try_filled<T: Clone>(len: usize, value: T, what: &'static str) -> Result<Vec<T>, QuantizeError> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| QuantizeError::TooLarge { what, count: len as u64 })?;
    v.resize(len, value);
    Ok(v)
}

/// A zeroed buffer for `count` elements of `format` (packed formats round up to whole bytes).
fn zeroed_elements(format: Format, count: u64, what: &'static str) -> Result<Vec<u8>, QuantizeError> {
    // Checked here because `Format::bytes_for` multiplies without a check.
    let bits = count.checked_mul(format.bits() as u64).ok_or(QuantizeError::TooLarge { what, count })?;
    try_filled(to_usize(bits.div_ceil(8), what)?, 0u8, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceil_log2_is_exact_at_and_around_powers_of_two() {
        for e in -126..=127 {
            let p = 2f64.powi(e);
            assert_eq!(ceil_log2(p), e);
            assert_eq!(ceil_log2(p * (1.0 + f64::EPSILON)), e + 1);
            assert_eq!(ceil_log2(p * (1.0 - f64::EPSILON / 2.0)), e);
        }
        assert_eq!(ceil_log2(1e-300), -127);
    }
}
