//! Aggregation: records -> configurations -> sites, with a verdict for each.
//!
//! [`ReportBuilder`] takes records one at a time, in any order and from any number of files,
//! and keeps only per-site accumulators (counts, extremes, the worst call, the list of cosines
//! for the median). Observations are first accumulated per *session*, keyed by the session id
//! and the record's `site_id`: an observation may arrive before its session record (several
//! files, reconnects), so which configuration it belongs to is only settled in
//! [`ReportBuilder::finish`], where each session's sites are merged into its configuration by
//! [`SiteKey`]. Work per record is two hash lookups and a threshold judgement; `finish` is
//! linear in the number of sites plus one selection per median.

use super::injection;
use super::load::{LoadedRun, RunSource};
use super::model::{
    CallReport, ConfigSummary, ConfigurationReport, Counters, Heatmap, HeatmapCell, HeatmapRow,
    InjectionReport, LogitsSummary, MDependence, MOnset, MetricSpread, Report, ServingKernel, SessionSummary,
    SiteKey, SiteReport, SiteStatus, Verdict, WorstRowReport, NO_SESSION_LABEL, UNLABELLED,
};
use super::policy::{ConfigPolicy, PolicyCache, SiteServing};
use super::rules;
use super::text;
use quantshadow_runtime::diagnosis::{onset_m, scale_layout_lines};
use quantshadow_runtime::metrics::{LogitsMetrics, Metrics};
use quantshadow_runtime::policy::{Policy, SiteFacts};
use quantshadow_runtime::problem::ScaleGranularity;
use quantshadow_runtime::record::{
    flags, CheckMode, ClosingRecord, DiagnosisRecord, GemmObservation, KeyValue, ProblemSummary, Record,
    SessionRecord, SkipCount,
};
use quantshadow_runtime::thresholds::Thresholds;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// A worst row is "concentrated" when its error (1 - cosine) is at least this many times the
/// whole output's: the signature of a few bad rows (tile boundaries) rather than noise.
const CONCENTRATION_FACTOR: f64 = 10.0;
/// Sessions named one by one in a warning before the rest are summed up.
const SESSIONS_LISTED: usize = 8;
/// Distinct (M, failed) pairs kept per site for the M onset; beyond this none is stated.
const M_OUTCOMES_KEPT: usize = 4096;

/// Builds a report from loaded runs. The binary streams records into a [`ReportBuilder`]
/// instead, so that a large run is never held in memory as records.
pub fn build_report(runs: &[LoadedRun], thresholds: &Thresholds) -> Report {
    let mut builder = ReportBuilder::new(thresholds);
    for run in runs {
        builder.add_source(run.source.clone());
        for record in &run.records {
            builder.add_record(record);
        }
    }
    builder.finish()
}

/// Streaming aggregation of records into a [`Report`] (see the module doc).
pub struct ReportBuilder {
    thresholds: Thresholds,
    /// `--policy`: evaluated against every configuration besides the recorded policies.
    policy: Option<Policy>,
    sources: Vec<RunSource>,
    sessions: HashMap<u64, SessionAcc>,
    /// Order of first appearance of sessions: configurations are reported in input order.
    sessions_seen: u64,
}

impl ReportBuilder {
    pub fn new(thresholds: &Thresholds) -> ReportBuilder {
        ReportBuilder {
            thresholds: thresholds.clone(),
            policy: None,
            sources: Vec::new(),
            sessions: HashMap::new(),
            sessions_seen: 0,
        }
    }

    /// A policy to evaluate against every configuration, in addition to the policies the runs
    /// recorded (`quantshadow report --policy FILE`).
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = Some(policy);
    }

    /// Describes one input file (shown in the report header, with its load problems).
    pub fn add_source(&mut self, source: RunSource) {
        self.sources.push(source);
    }

    pub fn add_record(&mut self, record: &Record) {
        let sessions_seen = &mut self.sessions_seen;
        let session = self.sessions.entry(record.session_id()).or_insert_with(|| {
            *sessions_seen += 1;
            SessionAcc::new(*sessions_seen)
        });
        match record {
            // A session record is resent after every reconnect: the first one describes it.
            Record::Session(s) => {
                if session.session.is_none() {
                    session.session = Some(s.clone());
                }
            }
            // Only one closing record is expected; the last one has the final counts.
            Record::Closing(c) => session.closing = Some(c.clone()),
            Record::Observation(o) => session.observe(o, &self.thresholds),
            // Diagnoses of failing sites; rendered with their site (issue 6).
            Record::Diagnosis(d) => session.diagnoses.push(d.clone()),
        }
    }

    pub fn finish(self) -> Report {
        let thresholds = self.thresholds;
        let mut sessions: Vec<(u64, SessionAcc)> = self.sessions.into_iter().collect();
        sessions.sort_by_key(|(_, s)| s.first_seen);

        let mut by_label: Vec<(String, Vec<(u64, SessionAcc)>)> = Vec::new();
        let mut label_index: HashMap<String, usize> = HashMap::new();
        for (id, session) in sessions {
            let label = session.label();
            let index = *label_index.entry(label.clone()).or_insert_with(|| {
                by_label.push((label, Vec::new()));
                by_label.len() - 1
            });
            by_label[index].1.push((id, session));
        }
        let mut cache = PolicyCache::default();
        let configurations: Vec<ConfigurationReport> = by_label
            .into_iter()
            .map(|(label, sessions)| {
                build_configuration(label, sessions, &thresholds, self.policy.as_ref(), &mut cache)
            })
            .collect();

        let verdict = if configurations.is_empty() {
            Verdict::NoData
        } else if configurations.iter().any(|c| c.verdict == Verdict::Fail) {
            Verdict::Fail
        } else if configurations.iter().any(|c| c.verdict == Verdict::NoData) {
            Verdict::NoData
        } else {
            Verdict::Pass
        };
        let warnings = self.sources.iter().flat_map(RunSource::warnings).collect();
        let heatmap = build_heatmap(&configurations);
        Report {
            verdict,
            sources: self.sources,
            thresholds,
            thresholds_file: None,
            policy_file: self.policy.map(|p| p.origin),
            warnings,
            configurations,
            heatmap,
        }
    }
}

struct SessionAcc {
    first_seen: u64,
    session: Option<SessionRecord>,
    closing: Option<ClosingRecord>,
    sites: Vec<SiteAcc>,
    /// `site_id` -> index in `sites`: the cheapest exact identity within one process.
    site_index: HashMap<u64, usize>,
    observations: u64,
    calls_checked: u64,
    calls_failed: u64,
    nonfinite_calls: u64,
    diagnoses: Vec<DiagnosisRecord>,
}

impl SessionAcc {
    fn new(first_seen: u64) -> SessionAcc {
        SessionAcc {
            first_seen,
            session: None,
            closing: None,
            sites: Vec::new(),
            site_index: HashMap::new(),
            observations: 0,
            calls_checked: 0,
            calls_failed: 0,
            nonfinite_calls: 0,
            diagnoses: Vec::new(),
        }
    }

    fn label(&self) -> String {
        match &self.session {
            None => NO_SESSION_LABEL.to_string(),
            Some(s) if s.label.trim().is_empty() => UNLABELLED.to_string(),
            Some(s) => s.label.clone(),
        }
    }

    fn observe(&mut self, obs: &GemmObservation, thresholds: &Thresholds) {
        let index = match self.site_index.get(&obs.site_id) {
            Some(&index) => index,
            None => {
                self.sites.push(SiteAcc::new(obs));
                self.site_index.insert(obs.site_id, self.sites.len() - 1);
                self.sites.len() - 1
            }
        };
        let outcome = self.sites[index].observe(obs, thresholds);
        self.observations += 1;
        self.calls_checked += outcome.checked as u64;
        self.calls_failed += outcome.failed as u64;
        self.nonfinite_calls += outcome.nonfinite as u64;
    }

    fn summary(&self, session_id: u64) -> SessionSummary {
        let s = self.session.as_ref();
        SessionSummary {
            session_id,
            has_session_record: s.is_some(),
            host: s.map(|s| s.host.clone()).unwrap_or_default(),
            pid: s.map_or(0, |s| s.pid),
            rank: s.map_or(-1, |s| s.rank),
            device_name: s.map(|s| s.device_name.clone()).unwrap_or_default(),
            device_arch: s.map(|s| s.device_arch.clone()).unwrap_or_default(),
            closing: self.closing.clone(),
            observations: self.observations,
            calls_checked: self.calls_checked,
            calls_failed: self.calls_failed,
            nonfinite_calls: self.nonfinite_calls,
        }
    }
}

#[derive(Clone, Copy)]
struct CallOutcome {
    checked: bool,
    failed: bool,
    nonfinite: bool,
}

/// Extremes over checked calls, NaN-sticky (see [`MetricSpread`]).
#[derive(Debug, Clone, Copy)]
struct Extremes {
    cosine_min: f64,
    nmse_max: f64,
    norm_ratio_min: f64,
    norm_ratio_max: f64,
}

impl Extremes {
    const EMPTY: Extremes = Extremes {
        cosine_min: f64::INFINITY,
        nmse_max: f64::NEG_INFINITY,
        norm_ratio_min: f64::INFINITY,
        norm_ratio_max: f64::NEG_INFINITY,
    };

    fn add(&mut self, m: &Metrics) {
        self.merge(&Extremes {
            cosine_min: m.cosine,
            nmse_max: m.nmse,
            norm_ratio_min: m.norm_ratio,
            norm_ratio_max: m.norm_ratio,
        });
    }

    fn merge(&mut self, other: &Extremes) {
        self.cosine_min = nan_sticky(self.cosine_min, other.cosine_min, f64::min);
        self.nmse_max = nan_sticky(self.nmse_max, other.nmse_max, f64::max);
        self.norm_ratio_min = nan_sticky(self.norm_ratio_min, other.norm_ratio_min, f64::min);
        self.norm_ratio_max = nan_sticky(self.norm_ratio_max, other.norm_ratio_max, f64::max);
    }

    fn spread(&self, cosines: &mut [f64]) -> Option<MetricSpread> {
        Some(MetricSpread {
            cosine_min: self.cosine_min,
            cosine_median: lower_median_cosine(cosines)?,
            nmse_max: self.nmse_max,
            norm_ratio_min: self.norm_ratio_min,
            norm_ratio_max: self.norm_ratio_max,
        })
    }
}

fn nan_sticky(a: f64, b: f64, pick: fn(f64, f64) -> f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        pick(a, b)
    }
}

/// Lower median by selection (linear time); NaN sorts below every cosine.
fn lower_median_cosine(cosines: &mut [f64]) -> Option<f64> {
    if cosines.is_empty() {
        return None;
    }
    let key = |c: &f64| if c.is_nan() { f64::NEG_INFINITY } else { *c };
    let mid = (cosines.len() - 1) / 2;
    let (_, median, _) = cosines.select_nth_unstable_by(mid, |a, b| key(a).total_cmp(&key(b)));
    Some(*median)
}

/// Orders calls by how bad they are: failing first, then NaN/Inf introduced, then NMSE (which
/// sees both direction and magnitude errors; a NaN NMSE counts as the largest).
fn severity_worse(a: (bool, bool, f64), b: (bool, bool, f64)) -> bool {
    let nmse_key = |v: f64| if v.is_nan() { f64::INFINITY } else { v };
    (a.0, a.1).cmp(&(b.0, b.1)).then(nmse_key(a.2).total_cmp(&nmse_key(b.2))).is_gt()
}

fn call_severity(c: &CallReport) -> (bool, bool, f64) {
    (c.failed, c.metrics.introduced_nonfinite() > 0, c.metrics.nmse)
}

/// Row cosine ordering where NaN is the worst.
fn row_worse(a: f64, b: f64) -> bool {
    let key = |c: f64| if c.is_nan() { f64::NEG_INFINITY } else { c };
    key(a) < key(b)
}

fn widen(range: &mut Option<(u64, u64)>, m: u64) {
    *range = Some(match *range {
        None => (m, m),
        Some((lo, hi)) => (lo.min(m), hi.max(m)),
    });
}

fn widen_range(range: &mut Option<(u64, u64)>, other: Option<(u64, u64)>) {
    if let Some((lo, hi)) = other {
        widen(range, lo);
        widen(range, hi);
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct LogitsAcc {
    calls: u64,
    kl_sum: f64,
    kl_max: f64,
    top1_agree: u64,
    topk_overlap_sum: f64,
    k: u32,
}

impl LogitsAcc {
    fn add(&mut self, l: &LogitsMetrics) {
        self.calls += 1;
        self.kl_sum += l.kl;
        // A NaN KL (non-finite logits) must stay visible in the maximum.
        self.kl_max = if self.calls == 1 { l.kl } else { nan_sticky(self.kl_max, l.kl, f64::max) };
        self.top1_agree += l.top1_agree as u64;
        self.topk_overlap_sum += l.topk_overlap;
        self.k = self.k.max(l.k);
    }

    fn merge(&mut self, other: &LogitsAcc) {
        if other.calls == 0 {
            return;
        }
        self.kl_max =
            if self.calls == 0 { other.kl_max } else { nan_sticky(self.kl_max, other.kl_max, f64::max) };
        self.calls += other.calls;
        self.kl_sum += other.kl_sum;
        self.top1_agree += other.top1_agree;
        self.topk_overlap_sum += other.topk_overlap_sum;
        self.k = self.k.max(other.k);
    }

    fn summary(&self) -> Option<LogitsSummary> {
        (self.calls > 0).then(|| {
            let n = self.calls as f64;
            LogitsSummary {
                calls: self.calls,
                kl_mean: self.kl_sum / n,
                kl_max: self.kl_max,
                top1_agreement: self.top1_agree as f64 / n,
                topk_overlap_mean: self.topk_overlap_sum / n,
                k: self.k,
            }
        })
    }
}

#[derive(Debug, Clone)]
struct SiteAcc {
    name: Option<String>,
    entry_point: String,
    ordinal: u32,
    /// Calls per serving kernel (None: the observation named none).
    serving: BTreeMap<Option<String>, u64>,
    /// The first call's problem: formats, scales and N, K are part of the site's identity.
    problem: ProblemSummary,
    m_min: u64,
    m_max: u64,
    modes: BTreeSet<CheckMode>,
    calls_observed: u64,
    calls_checked: u64,
    calls_failed: u64,
    nonfinite_calls: u64,
    reference_nonfinite_calls: u64,
    injected_calls: u64,
    cosines: Vec<f64>,
    extremes: Extremes,
    worst_call: Option<CallReport>,
    worst_row: Option<WorstRowReport>,
    failing_m: Option<(u64, u64)>,
    passing_m: Option<(u64, u64)>,
    /// Distinct (M, failed) of the checked calls; None once more than [`M_OUTCOMES_KEPT`].
    m_outcomes: Option<BTreeSet<(u64, bool)>>,
    logits: LogitsAcc,
    /// The diagnosis to show (see [`diagnosis_preferred`]) and how many there were.
    diagnosis: Option<DiagnosisRecord>,
    diagnoses: u64,
}

/// Whether diagnosis `a` is shown rather than `b`: one with an explanation first, then the most
/// recent (timestamp, then call sequence).
fn diagnosis_preferred(a: &DiagnosisRecord, b: &DiagnosisRecord) -> bool {
    let key = |d: &DiagnosisRecord| (d.explanation.is_some(), d.timestamp_ns, d.call_seq);
    key(a) > key(b)
}

impl SiteAcc {
    fn new(first: &GemmObservation) -> SiteAcc {
        SiteAcc {
            name: first.site_name.clone(),
            entry_point: first.entry_point.clone(),
            ordinal: first.site_ordinal,
            serving: BTreeMap::new(),
            problem: first.problem.clone(),
            m_min: first.problem.m,
            m_max: first.problem.m,
            modes: BTreeSet::new(),
            calls_observed: 0,
            calls_checked: 0,
            calls_failed: 0,
            nonfinite_calls: 0,
            reference_nonfinite_calls: 0,
            injected_calls: 0,
            cosines: Vec::new(),
            extremes: Extremes::EMPTY,
            worst_call: None,
            worst_row: None,
            failing_m: None,
            passing_m: None,
            m_outcomes: Some(BTreeSet::new()),
            logits: LogitsAcc::default(),
            diagnosis: None,
            diagnoses: 0,
        }
    }

    fn add_diagnosis(&mut self, d: DiagnosisRecord) {
        self.diagnoses += 1;
        if self.diagnosis.as_ref().is_none_or(|shown| diagnosis_preferred(&d, shown)) {
            self.diagnosis = Some(d);
        }
    }

    fn add_m_outcome(&mut self, m: u64, failed: bool) {
        if let Some(set) = &mut self.m_outcomes {
            set.insert((m, failed));
            if set.len() > M_OUTCOMES_KEPT {
                self.m_outcomes = None;
            }
        }
    }

    /// What a policy is evaluated against for this site, as this session saw it.
    fn serving_facts(&self) -> SiteServing {
        let p = &self.problem;
        SiteServing {
            key: self.key(),
            facts: SiteFacts {
                ordinal: self.ordinal,
                entry: self.entry_point.clone(),
                kernel: None,
                name: self.name.clone(),
                a_format: p.a_format.name().to_string(),
                b_format: p.b_format.name().to_string(),
                d_format: p.d_format.name().to_string(),
            },
            kernels: self.serving.keys().cloned().collect(),
        }
    }

    fn key(&self) -> SiteKey {
        match &self.name {
            Some(name) => SiteKey::Named(name.clone()),
            None => SiteKey::Unnamed { entry_point: self.entry_point.clone(), ordinal: self.ordinal },
        }
    }

    fn observe(&mut self, obs: &GemmObservation, thresholds: &Thresholds) -> CallOutcome {
        // Names may be resolved after the first calls of a site were recorded.
        if self.name.is_none() && obs.site_name.is_some() {
            self.name = obs.site_name.clone();
        }
        match self.serving.get_mut(&obs.backend) {
            Some(calls) => *calls += 1,
            None => {
                self.serving.insert(obs.backend.clone(), 1);
            }
        }
        let m = obs.problem.m;
        self.m_min = self.m_min.min(m);
        self.m_max = self.m_max.max(m);
        self.modes.insert(obs.mode);
        self.calls_observed += 1;
        self.injected_calls += (obs.flags & flags::INJECTED != 0) as u64;
        self.reference_nonfinite_calls += (obs.flags & flags::REFERENCE_NONFINITE != 0) as u64;
        if let Some(logits) = &obs.logits {
            self.logits.add(logits);
        }
        let Some(metrics) = &obs.metrics else {
            return CallOutcome { checked: false, failed: false, nonfinite: false };
        };

        // Judged with the call's own class: the class is part of the site identity, but a
        // record is the authority on what was checked.
        let mut violations = thresholds.judge(obs.problem.class(), metrics);
        violations.extend(obs.logits.as_ref().and_then(|l| thresholds.judge_logits(obs.problem.class(), l)));
        let failed = !violations.is_empty();
        let nonfinite = metrics.introduced_nonfinite() > 0;
        self.calls_checked += 1;
        self.calls_failed += failed as u64;
        self.nonfinite_calls += nonfinite as u64;
        self.cosines.push(metrics.cosine);
        self.extremes.add(metrics);
        widen(if failed { &mut self.failing_m } else { &mut self.passing_m }, m);
        self.add_m_outcome(m, failed);

        let severity = (failed, nonfinite, metrics.nmse);
        if self.worst_call.as_ref().is_none_or(|w| severity_worse(severity, call_severity(w))) {
            self.worst_call = Some(CallReport {
                session_id: obs.session_id,
                call_seq: obs.call_seq,
                m,
                mode: obs.mode,
                backend: obs.backend.clone(),
                metrics: *metrics,
                failed,
                reasons: violations.iter().map(rules::describe_violation).collect(),
                violations,
            });
        }
        if let Some(row) = metrics.worst_row {
            if self.worst_row.as_ref().is_none_or(|w| row_worse(row.cosine, w.cosine)) {
                self.worst_row = Some(WorstRowReport {
                    index: row.index,
                    cosine: row.cosine,
                    call_cosine: metrics.cosine,
                    m,
                    rows_checked: obs.rows_checked,
                    concentrated: false,
                });
            }
        }
        CallOutcome { checked: true, failed, nonfinite }
    }

    /// Folds the same site seen by another session into this one.
    fn merge(&mut self, other: SiteAcc) {
        if self.name.is_none() {
            self.name = other.name;
        }
        self.ordinal = self.ordinal.min(other.ordinal);
        for (kernel, calls) in other.serving {
            *self.serving.entry(kernel).or_default() += calls;
        }
        self.m_min = self.m_min.min(other.m_min);
        self.m_max = self.m_max.max(other.m_max);
        self.modes.extend(other.modes);
        self.calls_observed += other.calls_observed;
        self.calls_checked += other.calls_checked;
        self.calls_failed += other.calls_failed;
        self.nonfinite_calls += other.nonfinite_calls;
        self.reference_nonfinite_calls += other.reference_nonfinite_calls;
        self.injected_calls += other.injected_calls;
        self.cosines.extend_from_slice(&other.cosines);
        self.extremes.merge(&other.extremes);
        if let Some(call) = other.worst_call {
            if self.worst_call.as_ref().is_none_or(|w| severity_worse(call_severity(&call), call_severity(w)))
            {
                self.worst_call = Some(call);
            }
        }
        if let Some(row) = other.worst_row {
            if self.worst_row.as_ref().is_none_or(|w| row_worse(row.cosine, w.cosine)) {
                self.worst_row = Some(row);
            }
        }
        widen_range(&mut self.failing_m, other.failing_m);
        widen_range(&mut self.passing_m, other.passing_m);
        match (&mut self.m_outcomes, other.m_outcomes) {
            (Some(mine), Some(theirs)) => {
                mine.extend(theirs);
                if mine.len() > M_OUTCOMES_KEPT {
                    self.m_outcomes = None;
                }
            }
            _ => self.m_outcomes = None,
        }
        self.logits.merge(&other.logits);
        self.diagnoses += other.diagnoses;
        if let Some(d) = other.diagnosis {
            if self.diagnosis.as_ref().is_none_or(|shown| diagnosis_preferred(&d, shown)) {
                self.diagnosis = Some(d);
            }
        }
    }

    fn finish(mut self, key: SiteKey, thresholds: &Thresholds) -> SiteReport {
        let p = &self.problem;
        let class = p.class();
        let status = if self.calls_failed > 0 {
            SiteStatus::Fail
        } else if self.calls_checked > 0 {
            SiteStatus::Pass
        } else {
            SiteStatus::Observed
        };
        let cosine_min_bound = thresholds.for_class(class).cosine_min;
        if let Some(row) = &mut self.worst_row {
            row.concentrated = row.rows_checked > 1
                && row.cosine < cosine_min_bound
                && (1.0 - row.cosine) >= CONCENTRATION_FACTOR * (1.0 - row.call_cosine);
        }
        let shape = if self.m_min == self.m_max {
            p.shape()
        } else {
            let batch = if p.batch > 1 { format!(" b{}", p.batch) } else { String::new() };
            format!("({}..{})x{}x{}{batch}", self.m_min, self.m_max, p.n, p.k)
        };
        let block_scaled =
            [p.a_scale, p.b_scale].iter().flatten().any(|s| s.granularity != ScaleGranularity::Tensor);
        let onset = match (&self.m_outcomes, status) {
            (Some(outcomes), SiteStatus::Fail) => {
                let calls: Vec<(u64, bool)> = outcomes.iter().copied().collect();
                onset_m(&calls).map(|first_failing_m| {
                    let mut passing_m: Vec<u64> = calls.iter().filter(|c| !c.1).map(|c| c.0).collect();
                    passing_m.dedup();
                    MOnset { first_failing_m, passing_m }
                })
            }
            _ => None,
        };
        let mut scale_layout = match &self.diagnosis {
            Some(d) if !d.scale_layout.is_empty() => d.scale_layout.clone(),
            _ if status == SiteStatus::Fail || self.diagnosis.is_some() => {
                if p.a_scale.is_some() || p.b_scale.is_some() {
                    // The grid of A depends on M: describe the worst call's.
                    let mut at_worst = p.clone();
                    if let Some(call) = &self.worst_call {
                        at_worst.m = call.m;
                    }
                    scale_layout_lines(&at_worst)
                } else {
                    Vec::new()
                }
            }
            _ => Vec::new(),
        };
        // "A scales: none; B scales: none" analyses nothing.
        if scale_layout.iter().all(|line| line.ends_with("scales: none")) {
            scale_layout.clear();
        }
        let mut serving: Vec<ServingKernel> = self
            .serving
            .iter()
            .map(|(kernel, &calls)| ServingKernel { kernel: kernel.clone(), calls })
            .collect();
        serving.sort_by(|a, b| b.calls.cmp(&a.calls).then_with(|| a.kernel.cmp(&b.kernel)));
        let mut site = SiteReport {
            key,
            name: self.name,
            ordinal: self.ordinal,
            entry_point: self.entry_point,
            backends: self.serving.into_keys().flatten().collect(),
            shape,
            m_min: self.m_min,
            m_max: self.m_max,
            n: p.n,
            k: p.k,
            batch: p.batch,
            formats: p.formats(),
            scale_scheme: p.scale_scheme(),
            class,
            block_scaled,
            fast_accum: p.fast_accum,
            status,
            calls_observed: self.calls_observed,
            calls_checked: self.calls_checked,
            calls_failed: self.calls_failed,
            nonfinite_calls: self.nonfinite_calls,
            reference_nonfinite_calls: self.reference_nonfinite_calls,
            injected_calls: self.injected_calls,
            modes: self.modes.into_iter().collect(),
            metrics: self.extremes.spread(&mut self.cosines),
            worst_call: self.worst_call,
            worst_row: self.worst_row,
            m_dependence: MDependence::from_ranges(self.failing_m, self.passing_m),
            logits: self.logits.summary(),
            pattern: None,
            serving,
            onset,
            diagnosis: self.diagnosis,
            diagnoses: self.diagnoses,
            scale_layout,
        };
        site.pattern = rules::classify(&site);
        site
    }
}

fn build_configuration(
    label: String,
    sessions: Vec<(u64, SessionAcc)>,
    thresholds: &Thresholds,
    extra_policy: Option<&Policy>,
    policy_cache: &mut PolicyCache,
) -> ConfigurationReport {
    let mut counters = Counters { sessions: sessions.len(), ..Counters::default() };
    let mut skipped: BTreeMap<String, u64> = BTreeMap::new();
    let mut library_versions: BTreeSet<(String, String)> = BTreeSet::new();
    let mut settings: BTreeSet<(String, String)> = BTreeSet::new();
    let mut summaries = Vec::with_capacity(sessions.len());
    let mut merged: Vec<SiteAcc> = Vec::new();
    let mut merged_index: HashMap<SiteKey, usize> = HashMap::new();
    let mut inject_specs: Vec<String> = Vec::new();
    let mut policy = ConfigPolicy::default();
    let mut orphan_diagnoses = 0u64;

    for (session_id, mut session) in sessions {
        // Diagnoses go to their site: by site id within the session, else by ordinal.
        for d in std::mem::take(&mut session.diagnoses) {
            let index = session
                .site_index
                .get(&d.site_id)
                .copied()
                .or_else(|| session.sites.iter().position(|s| s.ordinal == d.site_ordinal));
            match index {
                Some(i) => session.sites[i].add_diagnosis(d),
                None => orphan_diagnoses += 1,
            }
        }
        let record = session.session.as_ref();
        let has_policy = record.is_some_and(|r| r.settings.iter().any(|kv| kv.key == "policy.text"));
        if has_policy || extra_policy.is_some() {
            let sites: Vec<SiteServing> = session.sites.iter().map(SiteAcc::serving_facts).collect();
            policy.add_session(record, &sites, extra_policy, policy_cache);
        }
        if let Some(spec) = record
            .and_then(|r| r.settings.iter().find(|kv| kv.key == injection::SETTING))
            .and_then(|kv| injection::active_spec(&kv.value))
        {
            if !inject_specs.iter().any(|s| s == spec) {
                inject_specs.push(spec.to_string());
            }
        }
        let summary = session.summary(session_id);
        counters.observations_received += session.observations;
        if let Some(closing) = &session.closing {
            counters.sessions_closed += 1;
            counters.calls_seen += closing.calls_seen;
            counters.sampled += closing.sampled;
            counters.checked += closing.checked;
            counters.dropped += closing.dropped;
            counters.checked_missing += closing.checked.saturating_sub(session.calls_checked);
            for skip in &closing.skipped {
                *skipped.entry(skip.reason.clone()).or_default() += skip.count;
            }
        }
        if let Some(record) = &session.session {
            library_versions
                .extend(record.library_versions.iter().map(|kv| (kv.key.clone(), kv.value.clone())));
            settings.extend(record.settings.iter().map(|kv| (kv.key.clone(), kv.value.clone())));
        }
        for site in std::mem::take(&mut session.sites) {
            let key = site.key();
            match merged_index.get(&key) {
                Some(&index) => merged[index].merge(site),
                None => {
                    merged_index.insert(key, merged.len());
                    merged.push(site);
                }
            }
        }
        summaries.push(summary);
    }
    let mut skipped: Vec<SkipCount> =
        skipped.into_iter().map(|(reason, count)| SkipCount { reason, count }).collect();
    skipped.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.reason.cmp(&b.reason)));
    let injected_calls: u64 = merged.iter().map(|s| s.injected_calls).sum();
    let injection = injection::build(inject_specs, &mut skipped, injected_calls);
    counters.skipped = skipped;
    let (policy, policy_warnings) = policy.finish();
    let policy_broken = policy.as_ref().is_some_and(|p| !p.violations.is_empty());

    // The configuration's spread covers every checked call; the per-site lists are moved
    // into one vector only here, after the per-site medians no longer need them in place.
    let mut all_cosines = Vec::with_capacity(merged.iter().map(|s| s.cosines.len()).sum());
    let mut extremes = Extremes::EMPTY;
    for site in &merged {
        all_cosines.extend_from_slice(&site.cosines);
        if site.calls_checked > 0 {
            extremes.merge(&site.extremes);
        }
    }
    let mut sites: Vec<SiteReport> = merged
        .into_iter()
        .map(|site| {
            let key = site.key();
            site.finish(key, thresholds)
        })
        .collect();
    sites.sort_by(|a, b| a.ordinal.cmp(&b.ordinal).then_with(|| a.key.cmp(&b.key)));

    let count_status = |status: SiteStatus| sites.iter().filter(|s| s.status == status).count();
    let summary = ConfigSummary {
        sites: sites.len(),
        sites_checked: sites.len() - count_status(SiteStatus::Observed),
        sites_failing: count_status(SiteStatus::Fail),
        sites_observed_only: count_status(SiteStatus::Observed),
        calls_observed: sites.iter().map(|s| s.calls_observed).sum(),
        calls_checked: sites.iter().map(|s| s.calls_checked).sum(),
        calls_failed: sites.iter().map(|s| s.calls_failed).sum(),
        metrics: extremes.spread(&mut all_cosines),
    };
    let verdict = if summary.sites_failing > 0 || policy_broken {
        Verdict::Fail
    } else if summary.calls_checked == 0 {
        Verdict::NoData
    } else {
        Verdict::Pass
    };
    let to_key_values = |set: BTreeSet<(String, String)>| {
        set.into_iter().map(|(key, value)| KeyValue { key, value }).collect()
    };
    let mut warnings = configuration_warnings(&label, &summaries, &counters, &sites, injection.as_ref());
    warnings.extend(policy_warnings);
    if orphan_diagnoses > 0 {
        warnings.push(format!(
            "{} about sites with no observation in the given run files: not shown",
            text::count(orphan_diagnoses as usize, "diagnosis record is", "diagnosis records are")
        ));
    }
    let mut config = ConfigurationReport {
        warnings,
        label,
        verdict,
        reason: String::new(),
        injection,
        policy,
        summary,
        counters,
        sessions: summaries,
        library_versions: to_key_values(library_versions),
        settings: to_key_values(settings),
        sites,
        recommendations: Vec::new(),
    };
    config.recommendations = rules::recommend(&config);
    config.reason = rules::verdict_reason(&config);
    config
}

fn configuration_warnings(
    label: &str,
    sessions: &[SessionSummary],
    counters: &Counters,
    sites: &[SiteReport],
    injection: Option<&InjectionReport>,
) -> Vec<String> {
    let mut warnings = Vec::new();
    let unclosed: Vec<&SessionSummary> = sessions.iter().filter(|s| s.closing.is_none()).collect();
    for session in unclosed.iter().take(SESSIONS_LISTED) {
        warnings.push(format!(
            "{} ended without closing record (crashed or killed?): its counters are missing and \
             its last results may be too",
            session.describe()
        ));
    }
    if unclosed.len() > SESSIONS_LISTED {
        warnings.push(format!(
            "{} more sessions ended without closing record (crashed or killed?)",
            unclosed.len() - SESSIONS_LISTED
        ));
    }
    if counters.dropped > 0 {
        warnings.push(format!(
            "{} records were dropped by the transport (queue full or collector gone): results are \
             incomplete",
            counters.dropped
        ));
    }
    if counters.checked_missing > 0 {
        warnings.push(format!(
            "closing records count {} checked calls whose results are in none of the given run \
             files (lost in transport, or in a run file not given here)",
            counters.checked_missing
        ));
    }
    if label == NO_SESSION_LABEL {
        warnings.push(format!(
            "{} without session record: the run file holds their results but not who produced \
             them (was the collector started late, or a run file left out?)",
            text::count(sessions.len(), "session", "sessions")
        ));
    }
    let injected: u64 = sites.iter().map(|s| s.injected_calls).sum();
    // With a recorded spec the banner at the top of the report says it (and stderr, see
    // `InjectionReport::summary`); the warning is for planted faults nobody declared.
    let declared = injection.is_some_and(|i| !i.specs.is_empty());
    if injected > 0 && !declared {
        warnings.push(format!(
            "{injected} calls carry a fault injected on purpose (fault injection or a planted test fault): their failures \
             are expected"
        ));
    }
    warnings
}

fn build_heatmap(configurations: &[ConfigurationReport]) -> Heatmap {
    let columns: Vec<String> = configurations.iter().map(|c| c.label.clone()).collect();
    let mut row_index: HashMap<&SiteKey, usize> = HashMap::new();
    let mut rows: Vec<(SiteKey, HeatmapRow)> = Vec::new();
    for (column, config) in configurations.iter().enumerate() {
        for site in &config.sites {
            let index = *row_index.entry(&site.key).or_insert_with(|| {
                rows.push((
                    site.key.clone(),
                    HeatmapRow {
                        site: site.key.to_string(),
                        named: site.name.is_some(),
                        ordinal: site.ordinal,
                        cells: vec![None; columns.len()],
                    },
                ));
                rows.len() - 1
            });
            let row = &mut rows[index].1;
            row.ordinal = row.ordinal.min(site.ordinal);
            row.cells[column] = Some(HeatmapCell {
                status: site.status,
                cosine_min: site.metrics.map(|m| m.cosine_min),
                nmse_max: site.metrics.map(|m| m.nmse_max),
                calls_checked: site.calls_checked,
                calls_failed: site.calls_failed,
            });
        }
    }
    rows.sort_by(|a, b| a.1.ordinal.cmp(&b.1.ordinal).then_with(|| a.0.cmp(&b.0)));
    Heatmap { columns, rows: rows.into_iter().map(|(_, row)| row).collect() }
}
