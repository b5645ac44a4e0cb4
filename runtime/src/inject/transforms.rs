//! Host implementations of the fault transforms, bit-identical to `kernels/qs_inject.cu`.
//!
//! Definitions shared with the device (change both or neither):
//! - Rows are visited per (batch item b, row i); D element (b, i, j) sits at
//!   `GemmProblem::out_offset(&d, b, i, j)`.
//! - `garbage`: per row, s = [`row_sum_squares`] (256 strided partial sums with fused
//!   multiply-add, then a pairwise tree: the device block's reduction order), non-finite values
//!   counted as 0; rms = sqrt(s / N); value(b, i, j) = [`garbage_value`] =
//!   f32((2u - 1) * sqrt(3) * rms) with u = [`noise_unit`] of hash3(seed, STREAM_GARBAGE,
//!   (b * M + i) * N + j), then encoded in D's format. Uniform noise of that amplitude has the
//!   row's RMS.
//! - `fn-as-fnuz`: every finite value halved and re-encoded (exact for f32/f16/bf16 normals);
//!   NaN codes left as they are.
//! - `tile-rows`: when M >= 56, row i with i % 16 == 15 gets the codes of row i - 1.
//! - `nan`: element [`nan_position`] = hash3(seed, STREAM_NAN, 0) mod (batch * M * N) gets the
//!   format's NaN code.
//! - `zero-after-first`: every element of D gets code 0.
//! - scale rewrites: [`prepare_scale_fault`].

use super::{
    flipped_storage, output_obstacle, scale_of, transpose_obstacle, FaultClass, InjectError, NotApplicable,
    Operand,
};
use crate::formats::Format;
use crate::problem::{GemmProblem, ScaleSpec};
use crate::rng::hash3;

pub const TILE_PERIOD: u64 = 16;
pub const TILE_OFFSET: u64 = 15;
pub const TILE_MIN_M: u64 = 56;
/// hash3 stream of the garbage noise ("GARB").
pub const STREAM_GARBAGE: u64 = 0x4752_4142;
/// hash3 stream of the NaN position ("NAN").
pub const STREAM_NAN: u64 = 0x004E_414E;
/// sqrt(3): uniform noise on [-a, a] has RMS a / sqrt(3).
pub const NOISE_AMPLITUDE: f64 = 1.732_050_807_568_877_2;
/// Threads of the device block that reduces one row (QS_BLOCK).
const REDUCE_LANES: usize = 256;

/// What an output transform changed.
#[derive(Debug, Clone, PartialEq)]
pub struct OutputEffect {
    pub class: FaultClass,
    /// Rows (global: b * M + i) whose values were rewritten.
    pub rows_touched: u64,
    /// (batch item, row, column) of the planted NaN.
    pub nan_at: Option<(u64, u64, u64)>,
    /// Why nothing changed, when nothing did (tile-rows with M < 56).
    pub note: Option<String>,
}

/// Uniform in [0, 1) from a hash: 53 high bits (rng.rs unit_f64).
#[inline]
pub fn noise_unit(h: u64) -> f64 {
    crate::rng::unit_f64(h)
}

/// Sum of squares of one row in the device block's order (see the module text).
pub fn row_sum_squares(values: impl Iterator<Item = f64>) -> f64 {
    let mut part = [0f64; REDUCE_LANES];
    for (j, v) in values.enumerate() {
        let v = if v.is_finite() { v } else { 0.0 };
        let slot = &mut part[j % REDUCE_LANES];
        *slot = v.mul_add(v, *slot);
    }
    let mut s = REDUCE_LANES / 2;
    while s > 0 {
        for t in 0..s {
            part[t] += part[t + s];
        }
        s /= 2;
    }
    part[0]
}

/// The garbage value of element (b, i, j) for a row of RMS `rms` (before D's rounding).
#[inline]
pub fn garbage_value(seed: u64, m: u64, n: u64, b: u64, i: u64, j: u64, rms: f64) -> f64 {
    let u = noise_unit(hash3(seed, STREAM_GARBAGE, (b * m + i) * n + j));
    let t = u * 2.0 - 1.0;
    (t * NOISE_AMPLITUDE * rms) as f32 as f64
}

/// (batch item, row, column) of the planted NaN.
pub fn nan_position(seed: u64, m: u64, n: u64, batch: u64) -> (u64, u64, u64) {
    let total = batch * m * n;
    let g = hash3(seed, STREAM_NAN, 0) % total.max(1);
    (g / (m * n), (g % (m * n)) / n, g % n)
}

/// The NaN code of an element format (the one every side writes).
pub fn nan_code(f: Format) -> Option<u32> {
    match f {
        Format::F32 => Some(0x7FC0_0000),
        Format::F16 => Some(0x7E00),
        Format::Bf16 => Some(0x7FC0),
        Format::E4m3fn => Some(0x7F),
        Format::E4m3fnuz | Format::E5m2fnuz => Some(0x80),
        Format::E5m2 => Some(0x7E),
        _ => None,
    }
}

/// Code of 1.0 in a scale format (what `scale-ignore` fills with).
pub fn one_code(f: Format) -> u32 {
    f.encode(1.0)
}

fn check_len(what: &'static str, need_elements: u64, f: Format, have: usize) -> Result<(), InjectError> {
    let need = (need_elements * f.bits() as u64).div_ceil(8);
    if (have as u64) < need {
        return Err(InjectError::BufferTooSmall { what, need, have: have as u64 });
    }
    Ok(())
}

/// Applies an output class to a host copy of D (laid out as `problem.d` says).
/// `zero-after-first` zeroes unconditionally: whether this site is "after the first" is the
/// plan's decision ([`super::InjectPlan::applies`]).
pub fn apply_output_fault(
    problem: &GemmProblem,
    class: FaultClass,
    d: &mut [u8],
    seed: u64,
) -> Result<OutputEffect, InjectError> {
    problem.validate().map_err(|e| InjectError::Problem(e.to_string()))?;
    if let Some(reason) = output_obstacle(problem, class) {
        return Err(NotApplicable { class, reason }.into());
    }
    let layout = problem.d;
    let f = layout.format;
    check_len("d", layout.required_elements(problem.m, problem.n, problem.batch), f, d.len())?;
    let (m, n, batch) = (problem.m, problem.n, problem.batch);
    let off = |b, i, j| GemmProblem::out_offset(&layout, b, i, j) as usize;
    let mut effect = OutputEffect { class, rows_touched: 0, nan_at: None, note: None };
    match class {
        FaultClass::Garbage => {
            for b in 0..batch {
                for i in 0..m {
                    let s = row_sum_squares((0..n).map(|j| f.load(d, off(b, i, j))));
                    let rms = (s / n as f64).sqrt();
                    for j in 0..n {
                        let v = garbage_value(seed, m, n, b, i, j, rms);
                        f.store_code(d, off(b, i, j), f.encode(v));
                    }
                }
            }
            effect.rows_touched = batch * m;
        }
        FaultClass::FnAsFnuz => {
            for b in 0..batch {
                for i in 0..m {
                    for j in 0..n {
                        let v = f.load(d, off(b, i, j));
                        if !v.is_nan() {
                            f.store_code(d, off(b, i, j), f.encode(v * 0.5));
                        }
                    }
                }
            }
            effect.rows_touched = batch * m;
        }
        FaultClass::TileRows => {
            if m < TILE_MIN_M {
                effect.note = Some(format!("M = {m} < {TILE_MIN_M}: rows are right at this M"));
            } else {
                for b in 0..batch {
                    for i in (TILE_OFFSET..m).step_by(TILE_PERIOD as usize) {
                        for j in 0..n {
                            let code = f.load_code(d, off(b, i - 1, j));
                            f.store_code(d, off(b, i, j), code);
                        }
                        effect.rows_touched += 1;
                    }
                }
            }
        }
        FaultClass::Nan => {
            let code = nan_code(f)
                .ok_or_else(|| NotApplicable { class, reason: format!("D's format {f} has no NaN") })?;
            let (b, i, j) = nan_position(seed, m, n, batch);
            f.store_code(d, off(b, i, j), code);
            effect.nan_at = Some((b, i, j));
            effect.rows_touched = 1;
        }
        FaultClass::ZeroAfterFirst => {
            for b in 0..batch {
                for i in 0..m {
                    for j in 0..n {
                        f.store_code(d, off(b, i, j), 0);
                    }
                }
            }
            effect.rows_touched = batch * m;
        }
        FaultClass::ScaleTranspose | FaultClass::ScaleIgnore | FaultClass::NoTranspose => {
            unreachable!("output_obstacle rejects the before-call classes")
        }
    }
    Ok(effect)
}

/// The rewritten copy of `operand`'s scale buffer for `scale-transpose` (entry (o, i) of the
/// declared storage receives what the original holds at (o, i) of the flipped, packed storage)
/// or `scale-ignore` (every declared entry set to 1). Bytes outside the declared grid (ld
/// padding) are copied unchanged; the result has the input's length.
pub fn prepare_scale_fault(
    problem: &GemmProblem,
    class: FaultClass,
    operand: Operand,
    scale_bytes: &[u8],
) -> Result<Vec<u8>, InjectError> {
    problem.validate().map_err(|e| InjectError::Problem(e.to_string()))?;
    let (outer, spec) = scale_of(problem, operand);
    let na = |reason: String| InjectError::NotApplicable(NotApplicable { class, reason });
    let spec = spec.ok_or_else(|| na(format!("{} has no scales", operand.name())))?;
    let k = problem.k;
    let items = if spec.batch_stride == 0 { 1 } else { problem.batch };
    let what = match operand {
        Operand::A => "a_scale",
        Operand::B => "b_scale",
    };
    check_len(what, spec.required_entries(outer, k, items), spec.format, scale_bytes.len())?;
    let grid = spec.granularity.grid(outer, k);
    let mut out = scale_bytes.to_vec();
    let f = spec.format;
    let entry =
        |s: &ScaleSpec, b: u64, o: u64, i: u64| (b * s.batch_stride + s.entry_index(o, i, grid)) as usize;
    match class {
        FaultClass::ScaleTranspose => {
            if let Some(reason) = transpose_obstacle(problem, operand) {
                return Err(na(reason));
            }
            let src = flipped_storage(&spec).expect("transpose_obstacle rejects swizzled scales");
            check_len(what, src.required_entries(outer, k, items), f, scale_bytes.len())?;
            for b in 0..items {
                for o in 0..grid.0 {
                    for i in 0..grid.1 {
                        let code = f.load_code(scale_bytes, entry(&src, b, o, i));
                        f.store_code(&mut out, entry(&spec, b, o, i), code);
                    }
                }
            }
        }
        FaultClass::ScaleIgnore => {
            let one = one_code(f);
            for b in 0..items {
                for o in 0..grid.0 {
                    for i in 0..grid.1 {
                        f.store_code(&mut out, entry(&spec, b, o, i), one);
                    }
                }
            }
        }
        _ => return Err(na("not a scale fault".into())),
    }
    Ok(out)
}

/// The rewritten operand buffer for `no-transpose`: element (b, i, k) of op(A) at the declared
/// position receives what the original holds where the call with `operand`'s transpose flipped
/// (`flipped`, from [`super::flip_transpose`]) reads it, so that the library, honouring the
/// declared flag, computes what a library ignoring the flag would compute from the original.
/// Positions the declared layout never reads (ld padding) keep their bytes. Element formats of
/// 8 bits or more (a 4-bit element shares its byte with a neighbour).
pub fn prepare_transpose_fault(
    problem: &GemmProblem,
    operand: Operand,
    flipped: &GemmProblem,
    bytes: &[u8],
) -> Result<Vec<u8>, InjectError> {
    problem.validate().map_err(|e| InjectError::Problem(e.to_string()))?;
    let class = FaultClass::NoTranspose;
    let layout = match operand {
        Operand::A => problem.a,
        Operand::B => problem.b,
    };
    let f = layout.format;
    if f.bits() < 8 {
        return Err(
            NotApplicable { class, reason: format!("{} is packed 4-bit ({f})", operand.name()) }.into()
        );
    }
    let (rows, cols) = match operand {
        Operand::A => problem.a_stored_dims(),
        Operand::B => problem.b_stored_dims(),
    };
    let what = match operand {
        Operand::A => "a",
        Operand::B => "b",
    };
    check_len(what, layout.required_elements(rows, cols, problem.batch), f, bytes.len())?;
    let width = (f.bits() / 8) as usize;
    let mut out = bytes.to_vec();
    // (outer, inner) of op(X): A is M x K read as (i, k); B is K x N read as (k, j).
    let (outer, inner) = match operand {
        Operand::A => (problem.m, problem.k),
        Operand::B => (problem.k, problem.n),
    };
    let position = |p: &GemmProblem, b: u64, x: u64, y: u64| -> usize {
        match operand {
            Operand::A => p.a_offset(b, x, y) as usize,
            Operand::B => p.b_offset(b, x, y) as usize,
        }
    };
    for b in 0..problem.batch {
        for x in 0..outer {
            for y in 0..inner {
                let (dst, src) = (position(problem, b, x, y) * width, position(flipped, b, x, y) * width);
                out[dst..dst + width].copy_from_slice(&bytes[src..src + width]);
            }
        }
    }
    Ok(out)
}
