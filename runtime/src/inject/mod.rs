//! Fault injection for testing the detector (issue 6): off unless `QUANTSHADOW_INJECT` is set.
//!
//! ```text
//! QUANTSHADOW_INJECT=<class>[@<site ordinal | name glob>][,...]
//!   classes: garbage scale-transpose scale-ignore fn-as-fnuz no-transpose tile-rows
//!            zero-after-first nan
//!   garbage            every site          garbage@3          site ordinal 3 only
//!   nan@*mlp*          sites whose name matches the glob (`*` any run, `?` one character)
//! ```
//!
//! API for the interposer (all engine-independent; nothing here touches a device):
//!
//! 1. At start: `let plan = InjectPlan::from_env()?` (`Ok(None)` when unset or empty). Log
//!    [`InjectPlan::banner`] loudly, record [`InjectPlan::spec_string`] in the session record
//!    and show the banner in the report.
//! 2. Per real call: `let faults = plan.applies(site_ordinal, site_name, call)` gives the
//!    [`FaultSet`] to apply (empty on the fast path). `zero-after-first` is decided here: it
//!    never applies to the first site the plan sees, and always to every other site.
//! 3. Before the real call, for each class with [`FaultClass::phase`] `Before`:
//!    [`plan_call`] says what to rewrite ([`CallRewrite`]: a scale pointer replaced by a
//!    rewritten copy, or a transpose flag flipped with the stored layout it implies) or why the
//!    class cannot be applied to this call ([`NotApplicable`], to log and record).
//!    The copy is made by [`prepare_scale_fault`] on host bytes, or by the device kernel
//!    `qs_inject_scale` (`kernels/qs_inject.cu`, [`crate::device::abi::KernelBuild::inject`]),
//!    bit-identical.
//! 4. After the real call, for each class with phase `After`: [`apply_output_fault`] on a host
//!    copy of D, or the device kernel `qs_inject_output_{d}` on D in place, bit-identical.
//!    The seed is [`InjectPlan::seed`] (site ordinal, call).
//!
//! Every transform reads and writes buffers laid out exactly as the [`GemmProblem`] says (D in
//! D's format, order, ld and batch stride; scales per their [`ScaleSpec`]).

mod transforms;

pub use transforms::{
    apply_output_fault, garbage_value, nan_position, noise_unit, one_code, prepare_scale_fault,
    prepare_transpose_fault, row_sum_squares, OutputEffect, NOISE_AMPLITUDE, STREAM_GARBAGE, STREAM_NAN,
    TILE_MIN_M, TILE_OFFSET, TILE_PERIOD,
};

use crate::formats::Format;
use crate::problem::{GemmProblem, MatrixLayout, Order, ScaleSpec, ScaleStorage};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable that turns injection on.
pub const ENV_VAR: &str = "QUANTSHADOW_INJECT";

/// One planted bug class. Names ([`FaultClass::name`]) are stable: they appear in
/// `QUANTSHADOW_INJECT`, session records and reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultClass {
    /// D replaced by hash noise with the same per-row RMS (an ASM GEMM with cosine ~0.006).
    Garbage,
    /// One operand's scale grid handed over in the other storage order (row- vs column-major).
    ScaleTranspose,
    /// One operand's scale argument dropped (a fallback ignoring a flag): scales of 1.
    ScaleIgnore,
    /// e4m3fn data read as e4m3fnuz: D exactly 0.5x, cosine 1.
    FnAsFnuz,
    /// An operand's transpose silently not applied (a no-op "partial transpose").
    NoTranspose,
    /// Rows i with i % 16 == 15 wrong (copy of the row above), only when M >= 56.
    TileRows,
    /// Zero output at every site after the first (scale aliasing).
    ZeroAfterFirst,
    /// A single NaN at a seeded position of D.
    Nan,
}

/// When a class acts on a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Rewrites the call's arguments before the real call.
    Before,
    /// Transforms D after the real call.
    After,
}

impl FaultClass {
    pub const ALL: [FaultClass; 8] = [
        FaultClass::Garbage,
        FaultClass::ScaleTranspose,
        FaultClass::ScaleIgnore,
        FaultClass::FnAsFnuz,
        FaultClass::NoTranspose,
        FaultClass::TileRows,
        FaultClass::ZeroAfterFirst,
        FaultClass::Nan,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultClass::Garbage => "garbage",
            FaultClass::ScaleTranspose => "scale-transpose",
            FaultClass::ScaleIgnore => "scale-ignore",
            FaultClass::FnAsFnuz => "fn-as-fnuz",
            FaultClass::NoTranspose => "no-transpose",
            FaultClass::TileRows => "tile-rows",
            FaultClass::ZeroAfterFirst => "zero-after-first",
            FaultClass::Nan => "nan",
        }
    }

    pub fn from_name(name: &str) -> Option<FaultClass> {
        FaultClass::ALL.into_iter().find(|c| c.name() == name)
    }

    pub fn phase(self) -> Phase {
        match self {
            FaultClass::ScaleTranspose | FaultClass::ScaleIgnore | FaultClass::NoTranspose => Phase::Before,
            _ => Phase::After,
        }
    }

    /// What the class does, in one sentence (banner, docs).
    pub fn describe(self) -> &'static str {
        match self {
            FaultClass::Garbage => "output replaced by noise of the same RMS per row",
            FaultClass::ScaleTranspose => "one operand's scales passed in the other storage order",
            FaultClass::ScaleIgnore => "one operand's scale argument dropped (scales of 1)",
            FaultClass::FnAsFnuz => "e4m3fn data read as e4m3fnuz: output exactly 0.5x",
            FaultClass::NoTranspose => "an operand's transpose silently not applied",
            FaultClass::TileRows => "rows i % 16 == 15 wrong (copy of the row above) when M >= 56",
            FaultClass::ZeroAfterFirst => "zero output at every site after the first",
            FaultClass::Nan => "a single NaN in the output",
        }
    }

    fn bit(self) -> u16 {
        1 << (self as u16)
    }
}

impl fmt::Display for FaultClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of classes (what applies to one call), without allocation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultSet(u16);

impl FaultSet {
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    pub fn contains(self, c: FaultClass) -> bool {
        self.0 & c.bit() != 0
    }
    pub fn insert(&mut self, c: FaultClass) {
        self.0 |= c.bit();
    }
    pub fn iter(self) -> impl Iterator<Item = FaultClass> {
        FaultClass::ALL.into_iter().filter(move |c| self.contains(*c))
    }
}

/// Which sites one entry targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    All,
    Ordinal(u64),
    /// Glob over the site name: `*` any run of characters, `?` exactly one.
    Pattern(String),
}

impl Target {
    pub fn matches(&self, ordinal: u64, name: &str) -> bool {
        match self {
            Target::All => true,
            Target::Ordinal(n) => *n == ordinal,
            Target::Pattern(p) => glob_match(p.as_bytes(), name.as_bytes()),
        }
    }
}

/// One `<class>[@target]` item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectEntry {
    pub class: FaultClass,
    pub target: Target,
}

impl fmt::Display for InjectEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.target {
            Target::All => write!(f, "{}", self.class),
            Target::Ordinal(n) => write!(f, "{}@{n}", self.class),
            Target::Pattern(p) => write!(f, "{}@{p}", self.class),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InjectError {
    #[error("{ENV_VAR}: unknown fault class '{name}' (known: {known})")]
    UnknownClass { name: String, known: String },
    #[error("{ENV_VAR}: empty item at position {position} in '{spec}'")]
    EmptyItem { position: usize, spec: String },
    #[error("{ENV_VAR}: '{item}': empty target after '@' (give a site ordinal or a name pattern)")]
    EmptyTarget { item: String },
    #[error("{ENV_VAR}: '{item}': more than one '@'")]
    TwoTargets { item: String },
    #[error("{ENV_VAR}: '{item}': site ordinal does not fit 64 bits")]
    BadOrdinal { item: String },
    #[error("{0}")]
    NotApplicable(#[from] NotApplicable),
    #[error("{what}: buffer holds {have} bytes, the problem needs {need}")]
    BufferTooSmall { what: &'static str, need: u64, have: u64 },
    #[error("invalid problem: {0}")]
    Problem(String),
}

/// The parsed `QUANTSHADOW_INJECT` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectSpec {
    pub entries: Vec<InjectEntry>,
}

impl InjectSpec {
    /// Parses `<class>[@<ordinal | glob>][,...]`; whitespace around items is ignored. An empty
    /// string gives an empty spec (injection off).
    pub fn parse(spec: &str) -> Result<InjectSpec, InjectError> {
        let trimmed = spec.trim();
        if trimmed.is_empty() {
            return Ok(InjectSpec { entries: vec![] });
        }
        let mut entries = vec![];
        for (position, raw) in trimmed.split(',').enumerate() {
            let item = raw.trim();
            if item.is_empty() {
                return Err(InjectError::EmptyItem { position, spec: spec.to_string() });
            }
            let (class_name, target) = match item.split_once('@') {
                None => (item, Target::All),
                Some((c, t)) => {
                    let t = t.trim();
                    if t.contains('@') {
                        return Err(InjectError::TwoTargets { item: item.into() });
                    }
                    if t.is_empty() {
                        return Err(InjectError::EmptyTarget { item: item.into() });
                    }
                    let target = if t.bytes().all(|b| b.is_ascii_digit()) {
                        Target::Ordinal(t.parse().map_err(|_| InjectError::BadOrdinal { item: item.into() })?)
                    } else {
                        Target::Pattern(t.to_string())
                    };
                    (c.trim(), target)
                }
            };
            let class = FaultClass::from_name(&class_name.to_ascii_lowercase()).ok_or_else(|| {
                InjectError::UnknownClass {
                    name: class_name.to_string(),
                    known: FaultClass::ALL.map(|c| c.name()).join(", "),
                }
            })?;
            entries.push(InjectEntry { class, target });
        }
        Ok(InjectSpec { entries })
    }

    /// Canonical text (what the session record keeps): `garbage@3,nan@*mlp*`.
    pub fn spec_string(&self) -> String {
        self.entries.iter().map(|e| e.to_string()).collect::<Vec<_>>().join(",")
    }
}

/// The plan the interposer consults per call. Cheap to query; thread-safe.
#[derive(Debug)]
pub struct InjectPlan {
    pub spec: InjectSpec,
    /// Base seed of the noise and NaN positions (default 0x0051_5349_4E4A; fixed so runs repeat).
    pub seed: u64,
    /// Ordinal of the first site `zero-after-first` saw (u64::MAX until one is seen).
    first_site: AtomicU64,
}

impl InjectPlan {
    pub const DEFAULT_SEED: u64 = 0x0051_5349_4E4A;

    pub fn new(spec: InjectSpec) -> InjectPlan {
        InjectPlan { spec, seed: InjectPlan::DEFAULT_SEED, first_site: AtomicU64::new(u64::MAX) }
    }

    /// From `QUANTSHADOW_INJECT`: `Ok(None)` when unset or empty (injection off).
    pub fn from_env() -> Result<Option<InjectPlan>, InjectError> {
        match std::env::var(ENV_VAR) {
            Ok(v) => InjectPlan::from_spec_str(&v),
            Err(_) => Ok(None),
        }
    }

    pub fn from_spec_str(v: &str) -> Result<Option<InjectPlan>, InjectError> {
        let spec = InjectSpec::parse(v)?;
        Ok((!spec.entries.is_empty()).then(|| InjectPlan::new(spec)))
    }

    pub fn spec_string(&self) -> String {
        self.spec.spec_string()
    }

    /// The loud start-up / report banner.
    pub fn banner(&self) -> String {
        let items: Vec<String> = self
            .spec
            .entries
            .iter()
            .map(|e| {
                let at = match &e.target {
                    Target::All => "every site".to_string(),
                    Target::Ordinal(n) => format!("site {n}"),
                    Target::Pattern(p) => format!("sites matching '{p}'"),
                };
                format!("{} at {at} ({})", e.class, e.class.describe())
            })
            .collect();
        format!(
            "FAULT INJECTION ACTIVE ({ENV_VAR}={}): {}. Results at these sites are deliberately wrong.",
            self.spec_string(),
            items.join("; ")
        )
    }

    /// Classes to apply to call `call` of site `site_ordinal` named `site_name`.
    pub fn applies(&self, site_ordinal: u64, site_name: &str, call: u64) -> FaultSet {
        let _ = call; // every call of a targeted site is faulted; `call` only varies the seed
        let mut set = FaultSet::default();
        for e in &self.spec.entries {
            if !e.target.matches(site_ordinal, site_name) {
                continue;
            }
            if e.class == FaultClass::ZeroAfterFirst {
                let first = match self.first_site.compare_exchange(
                    u64::MAX,
                    site_ordinal,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => site_ordinal,
                    Err(seen) => seen,
                };
                if first == site_ordinal {
                    continue;
                }
            }
            set.insert(e.class);
        }
        set
    }

    /// Seed of one call's noise and NaN position.
    pub fn seed(&self, site_ordinal: u64, call: u64) -> u64 {
        crate::rng::hash3(self.seed, site_ordinal, call)
    }
}

/// `*` matches any run (also empty), `?` one byte; everything else literally.
fn glob_match(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, si));
            pi += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

// ---------------------------------------------------------------------------------------------
// Before the call
// ---------------------------------------------------------------------------------------------

/// A GEMM input operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operand {
    A,
    B,
}

impl Operand {
    pub fn name(self) -> &'static str {
        match self {
            Operand::A => "A",
            Operand::B => "B",
        }
    }
}

/// How a scale buffer is rewritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleRewrite {
    /// The grid re-laid-out so that the library, reading the declared storage, sees what the
    /// original buffer holds when read in the flipped storage (`flipped_storage`).
    Transposed,
    /// Every entry of the declared grid set to 1.
    Ones,
}

/// Why a class cannot be applied to a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{class} cannot be applied to this call: {reason}")]
pub struct NotApplicable {
    pub class: FaultClass,
    pub reason: String,
}

fn not_applicable(class: FaultClass, reason: impl Into<String>) -> NotApplicable {
    NotApplicable { class, reason: reason.into() }
}

/// What to do to a call's arguments before the real call.
#[derive(Debug, Clone, PartialEq)]
pub enum CallRewrite {
    /// The class acts after the call only.
    Nothing,
    /// Pass a rewritten copy of `operand`'s scale buffer (same size and declared layout)
    /// instead of the original: [`prepare_scale_fault`] or `qs_inject_scale`.
    ReplaceScale { operand: Operand, rewrite: ScaleRewrite, spec: ScaleSpec, entries: u64 },
    /// Flip `operand`'s transpose flag. `problem` is the call as the library then sees it: the
    /// same buffer, order and ld, with stored dimensions swapped (for cuBLASLt-style APIs the
    /// layout's rows/cols must be swapped too; the ld stays). The production output then equals
    /// the reference of the declared call with that operand's transpose not applied.
    FlipTranspose { operand: Operand, problem: Box<GemmProblem> },
}

/// The flipped storage order of a plain scale grid, packed (ld 0); `None` for the swizzled
/// layout, which has no transposed counterpart.
pub fn flipped_storage(spec: &ScaleSpec) -> Option<ScaleSpec> {
    let storage = match spec.storage {
        ScaleStorage::OuterMajor => ScaleStorage::InnerMajor,
        ScaleStorage::InnerMajor => ScaleStorage::OuterMajor,
        ScaleStorage::Swizzled128x4 => return None,
    };
    Some(ScaleSpec { storage, ld: 0, ..*spec })
}

/// (outer extent, spec) of an operand's scales.
pub(crate) fn scale_of(problem: &GemmProblem, op: Operand) -> (u64, Option<ScaleSpec>) {
    match op {
        Operand::A => (problem.m, problem.a_scale),
        Operand::B => (problem.n, problem.b_scale),
    }
}

/// Why `op`'s scales cannot be transposed, or `None` when they can.
pub fn transpose_obstacle(problem: &GemmProblem, op: Operand) -> Option<String> {
    let (outer, spec) = scale_of(problem, op);
    let Some(spec) = spec else { return Some(format!("{} has no scales", op.name())) };
    if spec.storage == ScaleStorage::Swizzled128x4 {
        return Some(format!("{} scales are swizzled (128x4): no transposed order", op.name()));
    }
    let (go, gi) = spec.granularity.grid(outer, problem.k);
    if go == 1 || gi == 1 {
        return Some(format!(
            "{} scale grid is {go}x{gi} ({}): a vector reads the same in both storage orders",
            op.name(),
            spec.granularity.short_name()
        ));
    }
    None
}

/// The stored layout of `op` with its transpose flipped, or why that is not a valid call:
/// the buffer, order and ld stay; the stored dimensions swap. Valid when the ld covers the new
/// minor extent and the new extent does not exceed the old one (so the real buffer holds it).
pub fn flip_transpose(problem: &GemmProblem, op: Operand) -> Result<GemmProblem, String> {
    let mut p = problem.clone();
    let (layout, old_dims) = match op {
        Operand::A => (problem.a, problem.a_stored_dims()),
        Operand::B => (problem.b, problem.b_stored_dims()),
    };
    match op {
        Operand::A => p.trans_a = problem.trans_a.flipped(),
        Operand::B => p.trans_b = problem.trans_b.flipped(),
    }
    let new_dims = match op {
        Operand::A => p.a_stored_dims(),
        Operand::B => p.b_stored_dims(),
    };
    let minor = |l: &MatrixLayout, (r, c): (u64, u64)| match l.order {
        Order::RowMajor => c,
        Order::ColMajor => r,
    };
    if layout.ld < minor(&layout, new_dims) {
        return Err(format!(
            "{} stored {}x{} with ld {} cannot be re-read as {}x{} (ld < {})",
            op.name(),
            old_dims.0,
            old_dims.1,
            layout.ld,
            new_dims.0,
            new_dims.1,
            minor(&layout, new_dims)
        ));
    }
    let old_extent = layout.required_elements(old_dims.0, old_dims.1, problem.batch);
    let new_extent = layout.required_elements(new_dims.0, new_dims.1, problem.batch);
    if new_extent > old_extent {
        return Err(format!(
            "{} re-read as {}x{} needs {new_extent} elements, the buffer holds {old_extent}",
            op.name(),
            new_dims.0,
            new_dims.1
        ));
    }
    p.validate().map_err(|e| e.to_string())?;
    Ok(p)
}

/// What `class` does to this call before the real call, or why it cannot be applied.
///
/// - `scale-transpose`: A's scales if their grid is a true 2-D grid in plain storage, else B's.
///   Not applicable to per-tensor or vector scales (same bytes in both orders), swizzled
///   scales, or calls without scales.
/// - `scale-ignore`: A's scales if present, else B's. Not applicable without scales.
/// - `no-transpose`: A's flag if the flipped call is valid for the shape ([`flip_transpose`]:
///   always for square operands), else B's.
/// - output classes: [`CallRewrite::Nothing`]; `fn-as-fnuz` is not applicable to an integer D
///   (0.5x is not exact there), output classes not to 4-bit packed D.
pub fn plan_call(problem: &GemmProblem, class: FaultClass) -> Result<CallRewrite, NotApplicable> {
    problem.validate().map_err(|e| not_applicable(class, format!("invalid problem: {e}")))?;
    match class {
        FaultClass::ScaleTranspose => {
            let mut reasons = vec![];
            for op in [Operand::A, Operand::B] {
                match transpose_obstacle(problem, op) {
                    None => return Ok(replace_scale(problem, op, ScaleRewrite::Transposed)),
                    Some(r) => reasons.push(r),
                }
            }
            Err(not_applicable(class, reasons.join("; ")))
        }
        FaultClass::ScaleIgnore => {
            for op in [Operand::A, Operand::B] {
                if scale_of(problem, op).1.is_some() {
                    return Ok(replace_scale(problem, op, ScaleRewrite::Ones));
                }
            }
            Err(not_applicable(class, "the call passes no scales"))
        }
        FaultClass::NoTranspose => {
            let mut reasons = vec![];
            for op in [Operand::A, Operand::B] {
                match flip_transpose(problem, op) {
                    Ok(p) => return Ok(CallRewrite::FlipTranspose { operand: op, problem: Box::new(p) }),
                    Err(r) => reasons.push(r),
                }
            }
            Err(not_applicable(class, reasons.join("; ")))
        }
        _ => output_obstacle(problem, class)
            .map_or(Ok(CallRewrite::Nothing), |r| Err(not_applicable(class, r))),
    }
}

fn replace_scale(problem: &GemmProblem, op: Operand, rewrite: ScaleRewrite) -> CallRewrite {
    let (outer, spec) = scale_of(problem, op);
    let spec = spec.expect("caller checked the scales are present");
    let entries = spec.required_entries(outer, problem.k, problem.batch);
    CallRewrite::ReplaceScale { operand: op, rewrite, spec, entries }
}

/// Why an output class cannot transform this call's D, or `None`.
pub fn output_obstacle(problem: &GemmProblem, class: FaultClass) -> Option<String> {
    if class.phase() == Phase::Before {
        return Some(format!("{class} acts before the call, not on D"));
    }
    let f = problem.d.format;
    if f.bits() == 4 {
        return Some(format!("D is packed 4-bit ({f})"));
    }
    if class == FaultClass::FnAsFnuz && matches!(f, Format::Int8 | Format::I32) {
        return Some(format!("D is an integer format ({f}): 0.5x is not exact"));
    }
    None
}

#[cfg(test)]
mod tests;

/// Helpers shared with the diagnosis tests.
#[cfg(test)]
pub(crate) mod tests_support {
    pub(crate) use super::tests::encode_output;
}
