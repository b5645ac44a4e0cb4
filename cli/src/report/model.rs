//! What a report says: verdicts, configurations, sessions, sites and the heatmap, as plain
//! serializable data. [`super::aggregate`] builds it from records; the renderers only read it.

use super::load::RunSource;
use super::rules::{FailurePattern, Recommendation};
use quantshadow_runtime::formats::FormatClass;
use quantshadow_runtime::metrics::Metrics;
use quantshadow_runtime::record::{CheckMode, ClosingRecord, DiagnosisRecord, KeyValue, SkipCount};
use quantshadow_runtime::thresholds::{Thresholds, Violation};
use serde::Serialize;
use std::fmt;

/// Configuration name for observations whose session record is in none of the files.
pub const NO_SESSION_LABEL: &str = "(no session record)";
/// Configuration name for sessions that set an empty QUANTSHADOW_LABEL.
pub const UNLABELLED: &str = "(unlabelled)";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Verdict {
    Pass,
    Fail,
    /// Not a single call was checked: no evidence either way, so never a pass.
    NoData,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::NoData => "NO DATA",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SiteStatus {
    Pass,
    Fail,
    /// Seen only by observe-mode records: described, never compared.
    Observed,
}

impl SiteStatus {
    pub fn name(self) -> &'static str {
        match self {
            SiteStatus::Pass => "PASS",
            SiteStatus::Fail => "FAIL",
            SiteStatus::Observed => "OBSERVED",
        }
    }
}

/// Identity of a site across sessions and configurations: the parameter name when the engine
/// told us, else (entry point, ordinal), which is stable across ranks and runs of the same
/// model because ordinals count first appearances in program order.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SiteKey {
    Named(String),
    Unnamed { entry_point: String, ordinal: u32 },
}

impl Serialize for SiteKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl fmt::Display for SiteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SiteKey::Named(name) => f.write_str(name),
            SiteKey::Unnamed { entry_point, ordinal } => write!(f, "{entry_point} #{ordinal}"),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// PASS only when every configuration passes; FAIL when any fails; else NO DATA.
    pub verdict: Verdict,
    pub sources: Vec<RunSource>,
    pub thresholds: Thresholds,
    /// The file the thresholds came from; None for the built-in defaults.
    pub thresholds_file: Option<String>,
    /// `quantshadow report --policy FILE`: evaluated against every configuration in addition
    /// to the policies the runs recorded.
    pub policy_file: Option<String>,
    /// Problems with the input files (torn tails, undecodable records).
    pub warnings: Vec<String>,
    pub configurations: Vec<ConfigurationReport>,
    pub heatmap: Heatmap,
}

impl Report {
    /// Configurations that fail or have no data.
    pub fn not_passing(&self) -> impl Iterator<Item = &ConfigurationReport> {
        self.configurations.iter().filter(|c| c.verdict != Verdict::Pass)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ConfigurationReport {
    pub label: String,
    pub verdict: Verdict,
    /// Why the verdict is what it is, in one sentence (without the verdict word).
    pub reason: String,
    /// Fault injection recorded by the sessions (QUANTSHADOW_INJECT); None when off.
    pub injection: Option<InjectionReport>,
    /// The backend policies evaluated for this configuration; None when there were none.
    pub policy: Option<PolicyReport>,
    pub summary: ConfigSummary,
    pub counters: Counters,
    pub sessions: Vec<SessionSummary>,
    /// Distinct (library, version) pairs over the sessions.
    pub library_versions: Vec<KeyValue>,
    /// Distinct (setting, value) pairs over the sessions.
    pub settings: Vec<KeyValue>,
    /// In program order (ordinal), then by key.
    pub sites: Vec<SiteReport>,
    pub warnings: Vec<String>,
    pub recommendations: Vec<Recommendation>,
}

impl ConfigurationReport {
    pub fn failing_sites(&self) -> impl Iterator<Item = &SiteReport> {
        self.sites.iter().filter(|s| s.status == SiteStatus::Fail)
    }

    /// Policy rules broken by this configuration (empty without a policy).
    pub fn policy_violations(&self) -> &[PolicyViolation] {
        self.policy.as_ref().map_or(&[], |p| &p.violations)
    }
}

/// What `QUANTSHADOW_INJECT` planted in a configuration (a banner in the report).
#[derive(Debug, Clone, Serialize)]
pub struct InjectionReport {
    /// Canonical specs as recorded (one per distinct value over the sessions).
    pub specs: Vec<String>,
    /// Every item of the specs, with what its class does.
    pub faults: Vec<InjectedFault>,
    /// Injections that could not be applied to a call (reason without the
    /// `fault injection not applied: ` prefix, count); not counted as ordinary skips.
    pub not_applied: Vec<SkipCount>,
    /// Calls whose observation carries the INJECTED flag.
    pub injected_calls: u64,
}

impl InjectionReport {
    /// One line for logs: "FAULT INJECTION ACTIVE (QUANTSHADOW_INJECT=garbage@0): 3 calls
    /// faulted on purpose; 2 injections could not be applied".
    pub fn summary(&self) -> String {
        let spec =
            if self.specs.is_empty() { "no spec recorded".to_string() } else { self.specs.join(" / ") };
        let mut line = format!(
            "FAULT INJECTION ACTIVE (QUANTSHADOW_INJECT={spec}): {} calls faulted on purpose, their failures are expected",
            self.injected_calls
        );
        let not_applied: u64 = self.not_applied.iter().map(|s| s.count).sum();
        if not_applied > 0 {
            let what = if not_applied == 1 { "injection" } else { "injections" };
            line.push_str(&format!("; {not_applied} {what} could not be applied"));
        }
        line
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InjectedFault {
    /// The spec item, e.g. `nan@*mlp*`.
    pub item: String,
    pub class: String,
    /// "every site", "site 3", "sites matching '*mlp*'".
    pub target: String,
    /// What the class does (`FaultClass::describe`); None for a class this build does not know.
    pub effect: Option<String>,
}

/// Backend policy results of one configuration.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyReport {
    pub policies: Vec<PolicySummary>,
    /// The environment variables the sessions recorded for their policies; value None: unset.
    pub env: Vec<EnvFact>,
    /// Broken rules, by site (ordinal) then rule; one per (rule, site, serving kernel).
    pub violations: Vec<PolicyViolation>,
    /// Rules that could not be decided for this configuration (also in its warnings).
    pub undecided: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicySource {
    /// QUANTSHADOW_POLICY of the run, recorded in its session records.
    Recorded,
    /// `quantshadow report --policy FILE`.
    Report,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicySummary {
    pub origin: String,
    pub source: PolicySource,
    pub rules: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct EnvFact {
    pub name: String,
    pub value: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyViolation {
    /// Origin of the policy holding the rule.
    pub policy: String,
    pub source: PolicySource,
    pub rule: String,
    pub why: Option<String>,
    pub site: SiteKey,
    pub ordinal: u32,
    pub entry_point: String,
    /// The kernel that served the calls (None: unknown).
    pub kernel: Option<String>,
    /// One sentence quoting the rule (`policy::Violation::text`).
    pub text: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ConfigSummary {
    pub sites: usize,
    pub sites_checked: usize,
    pub sites_failing: usize,
    pub sites_observed_only: usize,
    pub calls_observed: u64,
    pub calls_checked: u64,
    pub calls_failed: u64,
    /// Over every checked call of the configuration; None when nothing was checked.
    pub metrics: Option<MetricSpread>,
}

/// Spread of the metrics over a set of checked calls. A NaN anywhere makes the minimum cosine
/// (or maximum NMSE) NaN: a NaN must never hide behind a good-looking extreme.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct MetricSpread {
    pub cosine_min: f64,
    /// Lower median (an observed value), NaN counted as the lowest cosine.
    pub cosine_median: f64,
    pub nmse_max: f64,
    pub norm_ratio_min: f64,
    pub norm_ratio_max: f64,
}

/// Calls and records as counted by the sessions' closing records, against what the files hold.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counters {
    pub sessions: usize,
    pub sessions_closed: usize,
    pub calls_seen: u64,
    pub sampled: u64,
    pub checked: u64,
    /// Summed over sessions, largest first.
    pub skipped: Vec<SkipCount>,
    pub dropped: u64,
    /// Observation records in the files (checked or observe-only).
    pub observations_received: u64,
    /// Checked calls counted by closing records whose observation is in none of the files.
    pub checked_missing: u64,
}

impl Counters {
    pub fn skipped_total(&self) -> u64 {
        self.skipped.iter().map(|s| s.count).sum()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct SessionSummary {
    pub session_id: u64,
    pub has_session_record: bool,
    pub host: String,
    pub pid: u32,
    /// -1 when unknown.
    pub rank: i32,
    pub device_name: String,
    pub device_arch: String,
    /// None: the session ended without a closing record (crashed or killed?).
    pub closing: Option<ClosingRecord>,
    pub observations: u64,
    pub calls_checked: u64,
    pub calls_failed: u64,
    pub nonfinite_calls: u64,
}

impl SessionSummary {
    /// "session 00000000deadbeef (host gpu7, pid 1234, rank 3)".
    pub fn describe(&self) -> String {
        let mut out = format!("session {:016x}", self.session_id);
        if self.has_session_record {
            out.push_str(&format!(" (host {}, pid {}", self.host, self.pid));
            if self.rank >= 0 {
                out.push_str(&format!(", rank {}", self.rank));
            }
            out.push(')');
        }
        out
    }

    /// "rank 3" when the rank is known, else the session id: how a rank is named in advice.
    pub fn short_name(&self) -> String {
        if self.rank >= 0 {
            format!("rank {}", self.rank)
        } else {
            format!("session {:016x}", self.session_id)
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct SiteReport {
    /// Serialized as its display form: the name, or "entry point #ordinal".
    pub key: SiteKey,
    pub name: Option<String>,
    /// Smallest ordinal over the sessions (ranks agree when they run the same program).
    pub ordinal: u32,
    pub entry_point: String,
    pub backends: Vec<String>,
    /// "MxNxK" (batch appended), with M as a range when the calls had different M.
    pub shape: String,
    pub m_min: u64,
    pub m_max: u64,
    pub n: u64,
    pub k: u64,
    pub batch: u64,
    pub formats: String,
    pub scale_scheme: String,
    pub class: FormatClass,
    /// Scales finer than per-tensor (per row, per block, MX...): their layout can be wrong.
    pub block_scaled: bool,
    pub fast_accum: bool,
    pub status: SiteStatus,
    pub calls_observed: u64,
    pub calls_checked: u64,
    pub calls_failed: u64,
    /// Calls whose production output has NaN/Inf the reference does not have.
    pub nonfinite_calls: u64,
    /// Calls whose reference already had NaN/Inf: broken inputs, upstream of this GEMM.
    pub reference_nonfinite_calls: u64,
    /// Calls with a fault injected on purpose (QUANTSHADOW_INJECT).
    pub injected_calls: u64,
    pub modes: Vec<CheckMode>,
    pub metrics: Option<MetricSpread>,
    /// The failing call with the largest error, or the largest-error call when none fails.
    pub worst_call: Option<CallReport>,
    /// The lowest row cosine over the calls that report rows.
    pub worst_row: Option<WorstRowReport>,
    pub m_dependence: Option<MDependence>,
    pub logits: Option<LogitsSummary>,
    /// The explanation of a failure (see [`super::rules::classify`]); None unless the site fails.
    pub pattern: Option<FailurePattern>,
    /// Calls per serving kernel (the observations' `backend`, opaque; None: unknown), most
    /// calls first.
    pub serving: Vec<ServingKernel>,
    /// "Fails only from M >= 56": calls fail exactly from one M on (`diagnosis::onset_m`).
    pub onset: Option<MOnset>,
    /// The diagnosis shown for this site: the most recent one with an explanation, else the
    /// most recent (by timestamp, then call).
    pub diagnosis: Option<DiagnosisRecord>,
    /// Diagnosis records of this site in the input.
    pub diagnoses: u64,
    /// Scale layout analysis, one line per operand: the diagnosis' when there is one, else
    /// computed from the worst call's problem; filled for failing and diagnosed sites.
    pub scale_layout: Vec<String>,
}

impl SiteReport {
    /// The diagnosis reading that explains this failing site's production output, if any.
    pub fn explanation(&self) -> Option<&quantshadow_runtime::record::ReadingSummary> {
        if self.status != SiteStatus::Fail {
            return None;
        }
        self.diagnosis.as_ref()?.explaining()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServingKernel {
    pub kernel: Option<String>,
    pub calls: u64,
}

/// Failures that start at one M: every call with a smaller M passes, every other call fails.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MOnset {
    pub first_failing_m: u64,
    /// Distinct M of the passing calls, ascending.
    pub passing_m: Vec<u64>,
}

impl MOnset {
    /// Passing M values named before "and N more".
    const LISTED: usize = 8;

    /// "fails only from M >= 56 (calls with M in {1, 55} pass)".
    pub fn describe(&self) -> String {
        let shown: Vec<String> = self.passing_m.iter().take(Self::LISTED).map(u64::to_string).collect();
        let more = self.passing_m.len().saturating_sub(Self::LISTED);
        let more = if more > 0 { format!(" and {more} more") } else { String::new() };
        format!(
            "fails only from M >= {} (calls with M in {{{}{more}}} pass)",
            self.first_failing_m,
            shown.join(", ")
        )
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct CallReport {
    pub session_id: u64,
    pub call_seq: u64,
    pub m: u64,
    pub mode: CheckMode,
    pub backend: Option<String>,
    pub metrics: Metrics,
    pub failed: bool,
    pub violations: Vec<Violation>,
    /// `violations` in words, one sentence each.
    pub reasons: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct WorstRowReport {
    pub index: u64,
    pub cosine: f64,
    /// Whole-output cosine of the call the row belongs to.
    pub call_cosine: f64,
    pub m: u64,
    pub rows_checked: u64,
    /// The row is bad while the rest of the output is much better: few rows carry the error.
    pub concentrated: bool,
}

/// Failures that depend on M alone: every failing call's M lies on one side of every passing
/// call's M (the "only M >= 56 is wrong" pattern of M-dependent kernel selection).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum MDependence {
    FailsFromM { first_failing: u64, last_passing: u64 },
    FailsUpToM { last_failing: u64, first_passing: u64 },
}

impl MDependence {
    pub(crate) fn from_ranges(
        failing: Option<(u64, u64)>,
        passing: Option<(u64, u64)>,
    ) -> Option<MDependence> {
        let ((fail_lo, fail_hi), (pass_lo, pass_hi)) = (failing?, passing?);
        if pass_hi < fail_lo {
            Some(MDependence::FailsFromM { first_failing: fail_lo, last_passing: pass_hi })
        } else if fail_hi < pass_lo {
            Some(MDependence::FailsUpToM { last_failing: fail_hi, first_passing: pass_lo })
        } else {
            None
        }
    }

    pub fn describe(&self) -> String {
        match *self {
            MDependence::FailsFromM { first_failing, last_passing } => {
                format!("fails only for M >= {first_failing} (passes for M <= {last_passing})")
            }
            MDependence::FailsUpToM { last_failing, first_passing } => {
                format!("fails only for M <= {last_failing} (passes for M >= {first_passing})")
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LogitsSummary {
    pub calls: u64,
    pub kl_mean: f64,
    pub kl_max: f64,
    /// Fraction of calls whose top-1 token agrees with the reference.
    pub top1_agreement: f64,
    pub topk_overlap_mean: f64,
    pub k: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct Heatmap {
    /// Configuration labels, in report order.
    pub columns: Vec<String>,
    /// Union of the sites of all configurations, in program order.
    pub rows: Vec<HeatmapRow>,
}

#[derive(Debug, Clone, Serialize)]
pub struct HeatmapRow {
    pub site: String,
    /// False when `site` is "entry point #ordinal" (the name was never known).
    pub named: bool,
    pub ordinal: u32,
    /// One per column; None where the configuration never saw the site.
    pub cells: Vec<Option<HeatmapCell>>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct HeatmapCell {
    pub status: SiteStatus,
    pub cosine_min: Option<f64>,
    pub nmse_max: Option<f64>,
    pub calls_checked: u64,
    pub calls_failed: u64,
}
