//! Records that leave the process: the Rust view, independent of the wire encoding.
//!
//! The wire encoding is FlatBuffers (`runtime/schema/quantshadow.fbs`, generated code in
//! `generated.rs`, conversion in `codec.rs`). Every encoded record carries the schema version;
//! a reader refuses an unknown major version with an error naming both versions.

mod codec;
#[allow(unused_imports, dead_code, non_snake_case, unsafe_op_in_unsafe_fn, mismatched_lifetime_syntaxes, clippy::all)]
#[rustfmt::skip]
mod generated;

pub use codec::{decode, encode, Encoder};

use crate::formats::Format;
use crate::metrics::{LogitsMetrics, Metrics};
use crate::problem::{Activation, ComputeType, GemmProblem, Order, ScaleSpec, Transpose};
use serde::{Deserialize, Serialize};

/// Schema version written into every record. Bump MINOR for added fields (old readers keep
/// working), MAJOR for anything an old reader would misread.
pub const SCHEMA_MAJOR: u16 = 1;
pub const SCHEMA_MINOR: u16 = 1;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RecordError {
    #[error("malformed record: {0}")]
    Malformed(String),
    #[error("record schema version {found_major}.{found_minor} is not readable by this build (reads {supported_major}.x)")]
    UnsupportedVersion { found_major: u16, found_minor: u16, supported_major: u16 },
    #[error("record holds an unknown {what} value {value}")]
    UnknownEnum { what: &'static str, value: i64 },
}

/// How a sampled call was checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum CheckMode {
    /// Seen and described, not checked.
    Observe,
    /// Random-projection estimate of the metrics (DESIGN.md "Checking without paying...").
    Sketch,
    /// Exact reference for a subset of rows.
    Rows,
    /// The whole reference GEMM.
    Full,
}

impl CheckMode {
    pub fn name(self) -> &'static str {
        match self {
            CheckMode::Observe => "observe",
            CheckMode::Sketch => "sketch",
            CheckMode::Rows => "rows",
            CheckMode::Full => "full",
        }
    }

    pub fn from_name(s: &str) -> Option<CheckMode> {
        [CheckMode::Observe, CheckMode::Sketch, CheckMode::Rows, CheckMode::Full]
            .into_iter()
            .find(|m| m.name() == s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyValue {
    pub key: String,
    pub value: String,
}

/// First record of every process (and resent after each reconnect).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// Random per process; ties observations and the closing record to this session.
    pub session_id: u64,
    pub host: String,
    pub pid: u32,
    /// Distributed rank, -1 when unknown.
    pub rank: i32,
    pub device_name: String,
    pub device_arch: String,
    /// e.g. ("cublasLt", "130000"), ("torch", "2.11.0").
    pub library_versions: Vec<KeyValue>,
    /// Configuration name shown in the report (QUANTSHADOW_LABEL).
    pub label: String,
    pub start_time_ns: u64,
    /// Effective settings (mode, sampling, injections, ...), for the report's header.
    pub settings: Vec<KeyValue>,
}

/// Scale description as recorded (the problem model's `ScaleSpec`).
pub type ScaleSummary = ScaleSpec;

/// What the report needs to know of a problem: shapes, formats, layouts, scales, epilogue.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProblemSummary {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub batch: u64,
    pub trans_a: Transpose,
    pub trans_b: Transpose,
    pub a_format: Format,
    pub b_format: Format,
    pub d_format: Format,
    pub a_order: Order,
    pub b_order: Order,
    pub d_order: Order,
    pub a_scale: Option<ScaleSummary>,
    pub b_scale: Option<ScaleSummary>,
    pub has_bias: bool,
    pub activation: Activation,
    pub compute: ComputeType,
    pub fast_accum: bool,
    pub has_d_scale: bool,
}

impl From<&GemmProblem> for ProblemSummary {
    fn from(p: &GemmProblem) -> Self {
        ProblemSummary {
            m: p.m,
            n: p.n,
            k: p.k,
            batch: p.batch,
            trans_a: p.trans_a,
            trans_b: p.trans_b,
            a_format: p.a.format,
            b_format: p.b.format,
            d_format: p.d.format,
            a_order: p.a.order,
            b_order: p.b.order,
            d_order: p.d.order,
            a_scale: p.a_scale,
            b_scale: p.b_scale,
            has_bias: p.epilogue.bias.is_some(),
            activation: p.epilogue.activation,
            compute: p.compute,
            fast_accum: p.fast_accum,
            has_d_scale: p.d_scale.is_some(),
        }
    }
}

impl ProblemSummary {
    pub fn class(&self) -> crate::formats::FormatClass {
        self.a_format.class().max(self.b_format.class())
    }

    pub fn shape(&self) -> String {
        if self.batch > 1 {
            format!("{}x{}x{} b{}", self.m, self.n, self.k, self.batch)
        } else {
            format!("{}x{}x{}", self.m, self.n, self.k)
        }
    }

    pub fn formats(&self) -> String {
        format!("{}*{}->{}", self.a_format, self.b_format, self.d_format)
    }

    pub fn scale_scheme(&self) -> String {
        let one = |s: &Option<ScaleSummary>| match s {
            None => "-".to_string(),
            Some(s) => format!("{}:{}", s.granularity.short_name(), s.format),
        };
        if self.a_scale.is_none() && self.b_scale.is_none() {
            "none".into()
        } else {
            format!("A {} / B {}", one(&self.a_scale), one(&self.b_scale))
        }
    }
}

/// Top-k entries of one logits row, production and reference side by side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogitsRow {
    pub row: u64,
    pub prod_top: Vec<(u32, f32)>,
    pub ref_top: Vec<(u32, f32)>,
}

/// Bits of `GemmObservation::flags`.
pub mod flags {
    /// The check ran inside a captured graph (replayed).
    pub const GRAPH_REPLAY: u32 = 1 << 0;
    /// A fault was injected into this call on purpose (QUANTSHADOW_INJECT).
    pub const INJECTED: u32 = 1 << 1;
    /// Only a sample of the rows was compared.
    pub const ROW_SAMPLE: u32 = 1 << 2;
    /// The reference side itself has NaN/Inf (inputs already broken upstream).
    pub const REFERENCE_NONFINITE: u32 = 1 << 3;
}

/// One checked (or observed) GEMM call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GemmObservation {
    pub session_id: u64,
    /// Hash of the site identity (entry point, N, K, formats, scales, weight pointer).
    pub site_id: u64,
    /// 0-based order of first appearance of the site in its process.
    pub site_ordinal: u32,
    /// Parameter name if known (e.g. "model.layers.3.mlp.down_proj").
    pub site_name: Option<String>,
    /// Per-process sequence number of intercepted calls.
    pub call_seq: u64,
    /// e.g. "cublasLtMatmul", "hipblasLtMatmul", "kernel:fp8_gemm_kernel".
    pub entry_point: String,
    /// Kernel or algorithm that served the call, if known.
    pub backend: Option<String>,
    pub problem: ProblemSummary,
    pub mode: CheckMode,
    /// None for `Observe`.
    pub metrics: Option<Metrics>,
    /// Rows of D compared (all M for full, the sample for rows/sketch).
    pub rows_checked: u64,
    /// Seed of the probe matrix; with it, sketches are comparable across runs.
    pub sketch_seed: u64,
    /// y = D R and x = Ref R summed over the checked rows (k entries each), when sketched.
    pub sketch_prod: Vec<f32>,
    pub sketch_ref: Vec<f32>,
    pub logits: Option<LogitsMetrics>,
    pub logits_rows: Vec<LogitsRow>,
    pub flags: u32,
    pub timestamp_ns: u64,
}

/// One reading of a call's contract in a diagnosis (see [`crate::diagnosis`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReadingSummary {
    /// Stable id: `declared`, `a-scales-inner-major`, `a-fnuz`, ...
    pub id: String,
    pub description: String,
    pub declared: bool,
    pub cosine: f64,
    pub nmse: f64,
    pub norm_ratio: f64,
    /// Values where exactly one side is finite.
    pub nonfinite_mismatch: u64,
    /// Whether this reading reproduces production.
    pub explains: bool,
}

/// Bad rows are every `period`-th row (i % period == offset) from `first_row`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RowPeriodSummary {
    pub period: u64,
    pub offset: u64,
    pub first_row: u64,
}

/// Where a diagnosed call's errors are (see [`crate::diagnosis::ErrorMap`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorMapSummary {
    pub m: u64,
    pub rows_checked: u64,
    /// At most [`ErrorMapSummary::MAX_ROWS`] listed; `bad_rows_total` counts them all.
    pub bad_rows: Vec<u64>,
    pub bad_rows_total: u64,
    pub row_period: Option<RowPeriodSummary>,
    pub col_block: u64,
    pub col_blocks: u64,
    pub bad_col_blocks: Vec<u64>,
    /// None without A (B) block scales.
    pub bad_a_scale_blocks: Option<Vec<u64>>,
    pub bad_b_scale_blocks: Option<Vec<u64>>,
    pub summary: String,
}

impl ErrorMapSummary {
    /// Bad rows listed in a record at most.
    pub const MAX_ROWS: usize = 256;
}

/// A diagnosis pass over one call of a failing site: the reference under alternative readings
/// of the contract, ranked best first, and the error map of the declared reading.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiagnosisRecord {
    pub session_id: u64,
    pub site_id: u64,
    pub site_ordinal: u32,
    /// The call diagnosed.
    pub call_seq: u64,
    /// Rows compared under every reading.
    pub rows: u64,
    /// Best first; the declared reading is among them.
    pub readings: Vec<ReadingSummary>,
    /// Readings that could not be evaluated on the call's buffers (description, why).
    pub skipped: Vec<KeyValue>,
    /// Id of the reading that explains production better than the declared contract.
    pub explanation: Option<String>,
    /// Descriptions of readings indistinguishable from the explanation.
    pub equivalent: Vec<String>,
    /// One sentence for the report.
    pub text: String,
    pub recommendation: Option<String>,
    pub error_map: Option<ErrorMapSummary>,
    /// One line per operand ("A scales: 1x128 blocks, grid 57x32, f32, OuterMajor, ld 32, ...").
    pub scale_layout: Vec<String>,
    pub timestamp_ns: u64,
}

impl DiagnosisRecord {
    /// The reading that explains production, when one does.
    pub fn explaining(&self) -> Option<&ReadingSummary> {
        let id = self.explanation.as_deref()?;
        self.readings.iter().find(|r| r.id == id)
    }

    /// The declared reading's result.
    pub fn declared(&self) -> Option<&ReadingSummary> {
        self.readings.iter().find(|r| r.declared)
    }
}

/// Counters for one skip reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkipCount {
    pub reason: String,
    pub count: u64,
}

/// Last record of a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClosingRecord {
    pub session_id: u64,
    pub calls_seen: u64,
    pub sampled: u64,
    pub checked: u64,
    pub skipped: Vec<SkipCount>,
    /// Records dropped by the transport (queue full, collector gone).
    pub dropped: u64,
    pub end_time_ns: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
// Observations are the common record and the largest; boxing them would add an allocation
// per record on the shim's hot path for no gain.
#[allow(clippy::large_enum_variant)]
pub enum Record {
    Session(SessionRecord),
    Observation(GemmObservation),
    Closing(ClosingRecord),
    /// Since schema 1.1.
    Diagnosis(DiagnosisRecord),
}

impl Record {
    pub fn session_id(&self) -> u64 {
        match self {
            Record::Session(s) => s.session_id,
            Record::Observation(o) => o.session_id,
            Record::Closing(c) => c.session_id,
            Record::Diagnosis(d) => d.session_id,
        }
    }
}
