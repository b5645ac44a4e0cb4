//! The alternative readings of a call's contract, each a [`GemmProblem`] the oracle can run.

use crate::formats::Format;
use crate::inject::{flip_transpose, flipped_storage, transpose_obstacle, Operand};
use crate::problem::{GemmProblem, ScaleGranularity, ScaleSpec, ScaleStorage, Transpose};

/// What a reading changes, by kind (the recommendation depends on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReadingKind {
    Declared,
    /// Scales read in the other plain storage order (row- vs column-major).
    ScaleStorageFlipped(Operand),
    /// Scales read as pre-shuffled (swizzled 128x4) instead of plain, or the reverse.
    ScaleSwizzle(Operand),
    ScalesIgnored(Operand),
    AllScalesIgnored,
    /// Scale blocks of another size (outer, inner).
    ScaleBlockSize(Operand, u32, u32),
    /// A per-row (per-outer) scale vector applied per K index, or the reverse.
    ScaleAxis(Operand),
    ScalesSwapped,
    /// The operand's bytes read as another FP8 variant.
    Format(Operand, Format),
    /// Both operands read as their fn <-> fnuz twins.
    BothFormats,
    TransposeFlipped(Operand),
}

/// One reading: a stable id (for records and tests), a description for the report.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reading {
    pub id: String,
    pub kind: ReadingKind,
    pub description: String,
    /// Run with the A and B scale buffers exchanged.
    pub swap_scale_buffers: bool,
}

impl Reading {
    fn new(id: impl Into<String>, kind: ReadingKind, description: impl Into<String>) -> Reading {
        Reading { id: id.into(), kind, description: description.into(), swap_scale_buffers: false }
    }

    /// What to check when this reading explains production.
    pub fn recommendation(&self) -> &'static str {
        match self.kind {
            ReadingKind::Declared => "nothing: the library honours the declared contract",
            ReadingKind::ScaleStorageFlipped(_) => {
                "scale layout mismatch: check that the quantization kernel writes the scales in the order the GEMM is told (row- vs column-major, a transpose_scale flag, a fallback path that ignores it)"
            }
            ReadingKind::ScaleSwizzle(_) => {
                "pre-shuffled vs plain scales: check the shuffle_scale / swizzle step and that every backend for this shape expects the same layout"
            }
            ReadingKind::ScalesIgnored(_) | ReadingKind::AllScalesIgnored => {
                "the scale argument is dropped: check that the backend picked for this shape honours the scale pointer and scale mode (a fallback that ignores a flag or parameter)"
            }
            ReadingKind::ScaleBlockSize(..) => {
                "scale block size mismatch: check the group / block_shape setting of the quantizer against the GEMM's (e.g. 128 vs 32)"
            }
            ReadingKind::ScaleAxis(_) => {
                "scale axis mismatch: per-token / per-channel scales are applied along K; check the scale mode (outer vector vs per-K) passed to the GEMM"
            }
            ReadingKind::ScalesSwapped => "A and B scales are swapped: check the argument order of scale_a / scale_b",
            ReadingKind::Format(..) | ReadingKind::BothFormats => {
                "FP8 variant confusion: e4m3fn bytes read as e4m3fnuz (or e5m2 variants) are off by exactly 2x; reinterpret with the platform's FP8 type, or convert (not reinterpret) between OCP and fnuz formats"
            }
            ReadingKind::TransposeFlipped(_) => {
                "an operand's transpose is not applied (a no-op 'partial transpose', or a view whose strides are ignored): check TRANSA/TRANSB and make the operand contiguous"
            }
        }
    }
}

fn lower(op: Operand) -> &'static str {
    match op {
        Operand::A => "a",
        Operand::B => "b",
    }
}

fn scale_mut(p: &mut GemmProblem, op: Operand) -> &mut Option<ScaleSpec> {
    match op {
        Operand::A => &mut p.a_scale,
        Operand::B => &mut p.b_scale,
    }
}

fn format_mut(p: &mut GemmProblem, op: Operand) -> &mut Format {
    match op {
        Operand::A => &mut p.a.format,
        Operand::B => &mut p.b.format,
    }
}

/// The fn <-> fnuz twin of an FP8 format.
fn fnuz_twin(f: Format) -> Option<Format> {
    match f {
        Format::E4m3fn => Some(Format::E4m3fnuz),
        Format::E4m3fnuz => Some(Format::E4m3fn),
        Format::E5m2 => Some(Format::E5m2fnuz),
        Format::E5m2fnuz => Some(Format::E5m2),
        _ => None,
    }
}

/// The other FP8 family member (e4m3 <-> e5m2, same fn / fnuz flavour).
fn family_twin(f: Format) -> Option<Format> {
    match f {
        Format::E4m3fn => Some(Format::E5m2),
        Format::E5m2 => Some(Format::E4m3fn),
        Format::E4m3fnuz => Some(Format::E5m2fnuz),
        Format::E5m2fnuz => Some(Format::E4m3fnuz),
        _ => None,
    }
}

fn storage_name(s: ScaleStorage) -> &'static str {
    match s {
        ScaleStorage::OuterMajor => "row-major (outer-major)",
        ScaleStorage::InnerMajor => "column-major (inner-major)",
        ScaleStorage::Swizzled128x4 => "pre-shuffled (128x4 swizzled)",
    }
}

/// Every alternative reading valid for `problem`, the declared one first. "Valid" is decided
/// from the description alone; a reading that needs more scale entries than a buffer holds is
/// found (and skipped) when it is run.
pub fn alternatives(problem: &GemmProblem) -> Vec<(Reading, GemmProblem)> {
    let mut out =
        vec![(Reading::new("declared", ReadingKind::Declared, "the declared contract"), problem.clone())];
    let mut push = |reading: Reading, p: GemmProblem| {
        if p.validate().is_ok() {
            out.push((reading, p));
        }
    };
    for op in [Operand::A, Operand::B] {
        let (name, id) = (op.name(), lower(op));
        let spec = match op {
            Operand::A => problem.a_scale,
            Operand::B => problem.b_scale,
        };
        let Some(spec) = spec else { continue };
        if transpose_obstacle(problem, op).is_none() {
            let flipped = flipped_storage(&spec).expect("plain storage");
            let mut p = problem.clone();
            *scale_mut(&mut p, op) = Some(flipped);
            let tag = if flipped.storage == ScaleStorage::InnerMajor { "inner-major" } else { "outer-major" };
            push(
                Reading::new(
                    format!("{id}-scales-{tag}"),
                    ReadingKind::ScaleStorageFlipped(op),
                    format!("{name} scales read {}", storage_name(flipped.storage)),
                ),
                p,
            );
        }
        if matches!(spec.granularity, ScaleGranularity::Mx32 | ScaleGranularity::Nvfp4) {
            let (storage, what) = match spec.storage {
                ScaleStorage::Swizzled128x4 => {
                    (ScaleStorage::OuterMajor, "as plain instead of pre-shuffled (128x4)")
                }
                _ => (ScaleStorage::Swizzled128x4, "as pre-shuffled (128x4) instead of plain"),
            };
            let mut p = problem.clone();
            *scale_mut(&mut p, op) = Some(ScaleSpec { storage, ld: 0, ..spec });
            push(
                Reading::new(
                    format!(
                        "{id}-scales-{}",
                        if storage == ScaleStorage::OuterMajor { "plain" } else { "swizzled" }
                    ),
                    ReadingKind::ScaleSwizzle(op),
                    format!("{name} scales read {what}"),
                ),
                p,
            );
        }
        let mut p = problem.clone();
        *scale_mut(&mut p, op) = None;
        push(
            Reading::new(
                format!("{id}-scales-ignored"),
                ReadingKind::ScalesIgnored(op),
                format!("{name} scales ignored"),
            ),
            p,
        );
        if let ScaleGranularity::Block { outer, inner } = spec.granularity {
            let mut shapes: Vec<(u32, u32)> =
                [32u32, 64, 128, 256].iter().filter(|&&i| i != inner).map(|&i| (outer, i)).collect();
            if outer > 1 {
                shapes.extend([1u32, 32, 64, 128].iter().filter(|&&o| o != outer).map(|&o| (o, inner)));
            }
            for (o, i) in shapes {
                let mut p = problem.clone();
                let ld = if spec.storage == ScaleStorage::Swizzled128x4 { spec.ld } else { 0 };
                *scale_mut(&mut p, op) = Some(ScaleSpec {
                    granularity: ScaleGranularity::Block { outer: o, inner: i },
                    ld,
                    ..spec
                });
                push(
                    Reading::new(
                        format!("{id}-scale-block-{o}x{i}"),
                        ReadingKind::ScaleBlockSize(op, o, i),
                        format!("{name} scale block size {o}x{i} instead of {outer}x{inner}"),
                    ),
                    p,
                );
            }
        }
        let axis = match spec.granularity {
            ScaleGranularity::PerOuter => {
                Some((ScaleGranularity::PerInner, "per K index instead of per row/column"))
            }
            ScaleGranularity::PerInner => {
                Some((ScaleGranularity::PerOuter, "per row/column instead of per K index"))
            }
            _ => None,
        };
        if let Some((g, what)) = axis {
            let mut p = problem.clone();
            *scale_mut(&mut p, op) = Some(ScaleSpec { granularity: g, ld: 0, ..spec });
            push(
                Reading::new(
                    format!("{id}-scale-axis"),
                    ReadingKind::ScaleAxis(op),
                    format!("{name} scales applied {what}"),
                ),
                p,
            );
        }
    }
    if problem.a_scale.is_some() && problem.b_scale.is_some() {
        let mut p = problem.clone();
        p.a_scale = None;
        p.b_scale = None;
        push(
            Reading::new("all-scales-ignored", ReadingKind::AllScalesIgnored, "scales ignored (A and B)"),
            p,
        );
        let mut r = Reading::new("ab-scales-swapped", ReadingKind::ScalesSwapped, "A and B scales swapped");
        r.swap_scale_buffers = true;
        push(r, problem.clone());
    }
    for op in [Operand::A, Operand::B] {
        let f = match op {
            Operand::A => problem.a.format,
            Operand::B => problem.b.format,
        };
        for twin in [fnuz_twin(f), family_twin(f)].into_iter().flatten() {
            let mut p = problem.clone();
            *format_mut(&mut p, op) = twin;
            push(
                Reading::new(
                    format!("{}-as-{}", lower(op), twin.name()),
                    ReadingKind::Format(op, twin),
                    format!("{} read as {twin}", op.name()),
                ),
                p,
            );
        }
    }
    if let (Some(ta), Some(tb)) = (fnuz_twin(problem.a.format), fnuz_twin(problem.b.format)) {
        let mut p = problem.clone();
        p.a.format = ta;
        p.b.format = tb;
        push(
            Reading::new(
                "ab-as-fnuz-twins",
                ReadingKind::BothFormats,
                format!("A read as {ta} and B as {tb}"),
            ),
            p,
        );
    }
    for op in [Operand::A, Operand::B] {
        if let Ok(p) = flip_transpose(problem, op) {
            let declared = match op {
                Operand::A => problem.trans_a,
                Operand::B => problem.trans_b,
            };
            let what = match declared {
                Transpose::T => format!("{} transpose not applied (read as stored)", op.name()),
                Transpose::N => format!("{} transposed although declared as stored", op.name()),
            };
            push(
                Reading::new(
                    format!("{}-transpose-flipped", lower(op)),
                    ReadingKind::TransposeFlipped(op),
                    what,
                ),
                p,
            );
        }
    }
    out
}
