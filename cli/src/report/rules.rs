//! Recommendations: a table of rules, each a pattern over a configuration's results and the
//! advice it calls for (the bug classes of DESIGN.md, in the words of the people who hit them).
//!
//! Every failing site gets exactly one [`FailurePattern`] from [`classify`], the most specific
//! explanation first (NaN/Inf, zero output, garbage, an exact power of two, ...), so a site is
//! never explained twice in contradictory ways. A site whose diagnosis names the reading that
//! explains production gets the diagnosis' advice (rule `diagnosis`, first) and none of the
//! pattern rules, whose guesses could contradict it. Rules about patterns name the sites that show
//! them; the other rules look at the configuration as a whole (nothing checked, incomplete
//! runs, unchecked sites, M-dependence, bad inputs upstream). [`RULES`] is in the order the
//! recommendations are shown: the likeliest root cause first.

use super::model::{ConfigurationReport, SessionSummary, SiteReport, SiteStatus, Verdict};
use super::policy::broken_rules;
use super::text;
use quantshadow_runtime::thresholds::Violation;
use serde::Serialize;

/// |cosine| below this: the output is unrelated to the reference.
const GARBAGE_COSINE: f64 = 0.1;
/// Norm ratio below this: the output is (nearly) all zero.
const ZERO_NORM_RATIO: f64 = 0.01;
/// Relative distance to a power of two that still counts as "exactly" that factor.
const POWER_OF_TWO_TOLERANCE: f64 = 0.01;
/// Sites named in one piece of advice before "and N more".
const SITES_NAMED: usize = 3;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recommendation {
    /// Stable identifier of the rule, for scripts reading the JSON.
    pub rule: &'static str,
    pub title: &'static str,
    /// What to do, in markdown (site names in code spans).
    pub advice: String,
}

/// The one explanation given to a failing site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailurePattern {
    /// NaN/Inf in production that the reference does not have.
    NonFinite,
    ZeroOutput,
    /// Output uncorrelated with the reference.
    Garbage,
    /// Right direction, magnitude off by exactly 2 or 4 (FP8 fn/fnuz, scale exponent).
    PowerOfTwo,
    /// Right direction, magnitude off by another factor.
    Magnitude,
    /// A few rows carry the error.
    FewRows,
    /// Partly correlated output with block/row scales.
    ScaleLayout,
    /// Below the accuracy bound with no structural signature.
    Precision,
    Unclassified,
}

pub struct Rule {
    pub id: &'static str,
    pub title: &'static str,
    /// The advice when the rule's pattern is present in the configuration.
    pub advice: fn(&ConfigurationReport) -> Option<String>,
}

pub const RULES: &[Rule] = &[
    Rule { id: "no-data", title: "Nothing was checked", advice: no_data },
    Rule { id: "diagnosis", title: "Diagnosis names the bug", advice: diagnosis },
    Rule { id: "policy", title: "Backend policy broken", advice: policy },
    Rule { id: "nonfinite", title: "NaN/Inf introduced", advice: nonfinite },
    Rule { id: "reference-nonfinite", title: "Inputs already NaN/Inf", advice: reference_nonfinite },
    Rule { id: "zero-output", title: "Output is zero", advice: zero_output },
    Rule { id: "garbage-output", title: "Backend returns garbage", advice: garbage_output },
    Rule { id: "fp8-variant", title: "Exact power-of-two factor: FP8 variant mix-up", advice: fp8_variant },
    Rule { id: "magnitude", title: "Right direction, wrong magnitude", advice: magnitude },
    Rule { id: "few-rows", title: "A few bad rows: tile-boundary bug", advice: few_rows },
    Rule { id: "m-dependent", title: "Failures depend on M", advice: m_dependent },
    Rule { id: "scale-layout", title: "Scale layout mismatch suspected", advice: scale_layout },
    Rule { id: "precision", title: "Accuracy below the bound", advice: precision },
    Rule { id: "unclassified", title: "Failure without a known pattern", advice: unclassified },
    Rule { id: "unchecked-sites", title: "Sites never checked", advice: unchecked_sites },
    Rule { id: "skipped-calls", title: "Many sampled calls not checked", advice: skipped_calls },
    Rule { id: "incomplete-run", title: "Incomplete run", advice: incomplete_run },
    Rule { id: "pass", title: "No action needed", advice: pass },
];

/// Every rule that applies to `config`, in [`RULES`] order.
pub fn recommend(config: &ConfigurationReport) -> Vec<Recommendation> {
    RULES
        .iter()
        .filter_map(|rule| {
            (rule.advice)(config).map(|advice| Recommendation { rule: rule.id, title: rule.title, advice })
        })
        .collect()
}

/// The explanation of a failing site (None for a site that does not fail).
pub fn classify(site: &SiteReport) -> Option<FailurePattern> {
    if site.status != SiteStatus::Fail {
        return None;
    }
    let call = site.worst_call.as_ref()?;
    let m = &call.metrics;
    let has = |pred: fn(&Violation) -> bool| call.violations.iter().any(pred);
    let cosine_fails = has(|v| matches!(v, Violation::Cosine { .. }));
    let norm_fails = has(|v| matches!(v, Violation::NormRatio { .. }));
    let nmse_fails = has(|v| matches!(v, Violation::Nmse { .. }));
    let pattern = if site.nonfinite_calls > 0 {
        FailurePattern::NonFinite
    } else if m.norm_ratio < ZERO_NORM_RATIO {
        FailurePattern::ZeroOutput
    } else if m.cosine.abs() < GARBAGE_COSINE {
        FailurePattern::Garbage
    } else if !cosine_fails && power_of_two_factor(m.norm_ratio).is_some() {
        FailurePattern::PowerOfTwo
    } else if !cosine_fails && norm_fails {
        FailurePattern::Magnitude
    } else if site.worst_row.as_ref().is_some_and(|r| r.concentrated) {
        FailurePattern::FewRows
    } else if cosine_fails && site.block_scaled {
        FailurePattern::ScaleLayout
    } else if (cosine_fails || nmse_fails) && !norm_fails {
        FailurePattern::Precision
    } else {
        FailurePattern::Unclassified
    };
    Some(pattern)
}

/// A broken threshold in words, with the report's number formats (cosine to 6 decimals, NMSE
/// in scientific notation, norm ratio to 4 decimals) so that reasons read like the tables.
/// `Violation::describe` says the same with other number formats.
pub fn describe_violation(violation: &Violation) -> String {
    match *violation {
        Violation::NonFinite { nan, inf } => {
            format!("production has {nan} NaN and {inf} Inf values the reference does not have")
        }
        Violation::Cosine { value, min } => format!("cosine {} is below {min}", text::cosine(value)),
        Violation::Nmse { value, max } => format!("NMSE {} is above {}", text::sci(value), text::sci(max)),
        Violation::NormRatio { value, tol } => {
            let factor = match power_of_two_factor(value) {
                Some(f) => format!(": an exact factor of {f}"),
                None => String::new(),
            };
            format!("norm ratio {} is off by more than {tol}{factor}", text::ratio(value))
        }
        Violation::WorstRow { index, value, min } => {
            format!("row {index} has cosine {}, below the per-row bound {min}", text::cosine(value))
        }
        Violation::LogitsKl { value, max } => {
            format!("logits KL(ref||prod) {} nats is above {}", text::sci(value), text::sci(max))
        }
    }
}

/// The factor (0.25, 0.5, 2 or 4) a norm ratio is, within [`POWER_OF_TWO_TOLERANCE`].
pub fn power_of_two_factor(norm_ratio: f64) -> Option<f64> {
    [0.25, 0.5, 2.0, 4.0].into_iter().find(|f| ((norm_ratio - f) / f).abs() <= POWER_OF_TWO_TOLERANCE)
}

impl FailurePattern {
    /// The rule that gives this pattern's advice.
    pub fn rule_id(self) -> &'static str {
        match self {
            FailurePattern::NonFinite => "nonfinite",
            FailurePattern::ZeroOutput => "zero-output",
            FailurePattern::Garbage => "garbage-output",
            FailurePattern::PowerOfTwo => "fp8-variant",
            FailurePattern::Magnitude => "magnitude",
            FailurePattern::FewRows => "few-rows",
            FailurePattern::ScaleLayout => "scale-layout",
            FailurePattern::Precision => "precision",
            FailurePattern::Unclassified => "unclassified",
        }
    }

    /// What the pattern says about a site, as the end of "the worst, `x` (...), ...".
    fn in_words(self, site: &SiteReport) -> String {
        match self {
            FailurePattern::NonFinite => "introduces NaN/Inf".into(),
            FailurePattern::ZeroOutput => "returns (nearly) all zeros".into(),
            FailurePattern::Garbage => "returns output unrelated to the reference".into(),
            FailurePattern::PowerOfTwo => {
                let ratio = site.worst_call.as_ref().map_or(f64::NAN, |c| c.metrics.norm_ratio);
                match power_of_two_factor(ratio) {
                    Some(f) => format!("is off by an exact factor of {f}"),
                    None => "is off by a power of two".into(),
                }
            }
            FailurePattern::Magnitude => "has the right direction but the wrong magnitude".into(),
            FailurePattern::FewRows => "has a few bad rows".into(),
            FailurePattern::ScaleLayout => "looks like a scale layout mismatch".into(),
            FailurePattern::Precision => "is short of precision".into(),
            FailurePattern::Unclassified => "fails without a known pattern".into(),
        }
    }
}

/// Failing sites with `pattern`, except those a diagnosis explains (their advice is the
/// diagnosis').
fn sites_with(config: &ConfigurationReport, pattern: FailurePattern) -> Vec<&SiteReport> {
    config.sites.iter().filter(|s| s.pattern == Some(pattern) && s.explanation().is_none()).collect()
}

fn names(sites: &[&SiteReport]) -> String {
    let items: Vec<String> = sites.iter().map(|s| text::code(&s.key.to_string())).collect();
    let noun = text::count(sites.len(), "site", "sites");
    format!("{noun} ({})", text::list_some(&items, SITES_NAMED))
}

/// The worst call's metrics of the first site (sites are in program order).
fn first_metrics(sites: &[&SiteReport]) -> quantshadow_runtime::metrics::Metrics {
    sites[0].worst_call.as_ref().expect("a failing site has a worst call").metrics
}

fn no_data(config: &ConfigurationReport) -> Option<String> {
    if config.verdict != Verdict::NoData {
        return None;
    }
    let c = &config.counters;
    let mut facts = Vec::new();
    if c.sessions_closed > 0 {
        facts.push(format!("{} calls seen, {} sampled", c.calls_seen, c.sampled));
        if !c.skipped.is_empty() {
            let reasons: Vec<String> =
                c.skipped.iter().map(|s| format!("{} ({})", s.reason, s.count)).collect();
            facts.push(format!("skipped: {}", text::list_some(&reasons, SITES_NAMED)));
        }
    } else {
        facts.push("no session sent a closing record: the processes may have died before any check".into());
    }
    if config.summary.calls_observed > 0 {
        facts.push(format!("{} calls observed only", config.summary.calls_observed));
    }
    Some(format!(
        "No call was checked ({}). Make sure sampling is on and the mode is not `observe`, and that \
         the shim intercepts this engine's GEMM entry points; the skip reasons say why sampled \
         calls were not checked.",
        facts.join("; ")
    ))
}

fn diagnosis(config: &ConfigurationReport) -> Option<String> {
    // Failing sites a diagnosis explains, grouped by the reading (same bug, same advice).
    let mut groups: Vec<(&str, Vec<&SiteReport>)> = Vec::new();
    for site in config.failing_sites() {
        let Some(reading) = site.explanation() else { continue };
        match groups.iter_mut().find(|(id, _)| *id == reading.id) {
            Some((_, sites)) => sites.push(site),
            None => groups.push((reading.id.as_str(), vec![site])),
        }
    }
    if groups.is_empty() {
        return None;
    }
    let parts: Vec<String> = groups
        .iter()
        .map(|(_, sites)| {
            let d = sites[0].diagnosis.as_ref().expect("explained sites have a diagnosis");
            let reading = d.explaining().expect("explained");
            let declared = d
                .declared()
                .map(|r| format!("; the declared contract gives cosine {}", text::cosine(r.cosine)))
                .unwrap_or_default();
            let check = match &d.recommendation {
                Some(r) => format!(" Check: {}.", text::plain(r.trim_end_matches('.'))),
                None => String::new(),
            };
            format!(
                "At {} production matches the reference with {} (cosine {}, norm ratio {}{declared}).{check}",
                names(sites),
                text::plain(&reading.description),
                text::cosine(reading.cosine),
                text::ratio(reading.norm_ratio)
            )
        })
        .collect();
    Some(parts.join(" "))
}

fn policy(config: &ConfigurationReport) -> Option<String> {
    let violations = config.policy_violations();
    if violations.is_empty() {
        return None;
    }
    let mut parts = Vec::new();
    for (rule, sites) in broken_rules(violations) {
        let of_rule: Vec<_> = violations.iter().filter(|v| v.rule == rule).collect();
        let first = of_rule[0];
        let site_names: Vec<String> = sites.iter().map(|k| text::code(&k.to_string())).collect();
        let mut kernels: Vec<String> = Vec::new();
        for v in &of_rule {
            let served = match &v.kernel {
                Some(k) => text::code(k),
                None => format!("{} (no kernel name)", text::code(&v.entry_point)),
            };
            if !kernels.contains(&served) {
                kernels.push(served);
            }
        }
        let why = first
            .why
            .as_deref()
            .map(|w| format!(" The rule exists because: {}.", text::plain(w.trim_end_matches('.'))))
            .unwrap_or_default();
        parts.push(format!(
            "Rule \"{}\" of policy {} is broken at {} ({}), served by {}.{why}",
            text::plain(rule),
            text::code(&first.policy),
            text::count(sites.len(), "site", "sites"),
            text::list_some(&site_names, SITES_NAMED),
            text::list_some(&kernels, SITES_NAMED)
        ));
    }
    parts.push(
        "Route these GEMMs to a backend the rules allow (the environment flags, tuned configs or \
         shape-based fallbacks that chose these kernels), or change the policy if a rule is out of date."
            .into(),
    );
    Some(parts.join(" "))
}

/// The verdict's reason in one sentence (markdown, without the verdict word): what fails and
/// the worst failure's explanation, or what passed.
pub fn verdict_reason(config: &ConfigurationReport) -> String {
    let s = &config.summary;
    let mut failures = Vec::new();
    if s.sites_failing > 0 {
        let mut classes: Vec<&str> = config.failing_sites().map(|site| site.class.name()).collect();
        classes.sort();
        classes.dedup();
        let thresholds = match classes.as_slice() {
            [class] => format!("their {class} thresholds"),
            _ => "their thresholds".to_string(),
        };
        let verb = if s.sites_failing == 1 { "fails" } else { "fail" };
        failures.push(format!(
            "{} of {} {verb} {thresholds}",
            s.sites_failing,
            text::count(s.sites_checked, "site", "sites")
        ));
    }
    let broken = broken_rules(config.policy_violations());
    if !broken.is_empty() {
        let mut sites: Vec<&super::model::SiteKey> =
            broken.iter().flat_map(|(_, sites)| sites.iter().copied()).collect();
        sites.sort();
        sites.dedup();
        let at = text::count(sites.len(), "site", "sites");
        failures.push(match broken.as_slice() {
            [(rule, _)] => format!("rule \"{}\" is broken at {at}", text::plain(rule)),
            [(a, _), (b, _)] => {
                format!("rules \"{}\" and \"{}\" are broken at {at}", text::plain(a), text::plain(b))
            }
            _ => format!("{} policy rules are broken at {at}", broken.len()),
        });
    }
    if !failures.is_empty() {
        let mut reason = failures.join(" and ");
        if let Some(worst) = worst_failing_site(config) {
            let metrics = worst.worst_call.as_ref().map(|c| c.metrics);
            let numbers = match (metrics, worst.pattern) {
                (Some(m), Some(FailurePattern::NonFinite)) => {
                    format!(
                        " ({} NaN, {} Inf introduced)",
                        m.nan_prod.saturating_sub(m.nan_ref),
                        m.inf_prod.saturating_sub(m.inf_ref)
                    )
                }
                (
                    Some(m),
                    Some(FailurePattern::PowerOfTwo | FailurePattern::Magnitude | FailurePattern::ZeroOutput),
                ) => {
                    format!(" (cosine {}, norm ratio {})", text::cosine(m.cosine), text::ratio(m.norm_ratio))
                }
                (Some(m), _) => format!(" (cosine {})", text::cosine(m.cosine)),
                (None, _) => String::new(),
            };
            let what = match (worst.explanation(), worst.pattern) {
                (Some(reading), _) => format!("is explained by {}", text::plain(&reading.description)),
                (None, Some(pattern)) => pattern.in_words(worst),
                (None, None) => "fails".into(),
            };
            let lead = if s.sites_failing > 1 { "the worst" } else { "the failing site" };
            reason.push_str(&format!("; {lead}, {}{numbers}, {what}", text::code(&worst.key.to_string())));
        }
        return reason;
    }
    match config.verdict {
        Verdict::NoData => {
            let observed = if s.calls_observed > 0 {
                format!(" ({} calls were only observed)", s.calls_observed)
            } else {
                String::new()
            };
            format!("not a single call was checked{observed}, so there is no evidence either way")
        }
        _ => {
            let lowest = s
                .metrics
                .map(|m| format!(" (lowest cosine {})", text::cosine(m.cosine_min)))
                .unwrap_or_default();
            let checked = if s.sites_observed_only > 0 { "checked sites" } else { "sites" };
            let mut reason = format!("all {} {checked} within thresholds{lowest}", s.sites_checked);
            if s.sites_observed_only > 0 {
                reason.push_str(&format!(
                    "; {} only observed",
                    text::count(s.sites_observed_only, "site was", "sites were")
                ));
            }
            if let Some(policy) = &config.policy {
                let undecided = if policy.undecided.is_empty() {
                    String::new()
                } else {
                    format!(
                        " ({} could not be decided)",
                        text::count(policy.undecided.len(), "rule", "rules")
                    )
                };
                reason.push_str(&format!("; the backend policy holds{undecided}"));
            }
            reason
        }
    }
}

/// The failing site to name in the reason: NaN/Inf first, then the lowest cosine (NaN lowest),
/// then program order.
fn worst_failing_site(config: &ConfigurationReport) -> Option<&SiteReport> {
    let key = |s: &SiteReport| {
        let cosine = s.worst_call.as_ref().map_or(f64::INFINITY, |c| c.metrics.cosine);
        (s.nonfinite_calls == 0, if cosine.is_nan() { f64::NEG_INFINITY } else { cosine })
    };
    // `min_by` keeps the first of equal elements: program order breaks ties.
    config.failing_sites().min_by(|a, b| {
        let (ka, kb) = (key(a), key(b));
        ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1))
    })
}

fn nonfinite(config: &ConfigurationReport) -> Option<String> {
    let sites = sites_with(config, FailurePattern::NonFinite);
    if sites.is_empty() {
        return None;
    }
    let calls: u64 = sites.iter().map(|s| s.nonfinite_calls).sum();
    let checked: Vec<&SessionSummary> = config.sessions.iter().filter(|s| s.calls_checked > 0).collect();
    let affected: Vec<String> =
        checked.iter().filter(|s| s.nonfinite_calls > 0).map(|s| s.short_name()).collect();
    let ranks = if affected.len() < checked.len() {
        format!(
            " Only {} of {} sessions are affected ({}): compare what differs for them (parallel \
             layout, shard sizes, communication buffers).",
            affected.len(),
            checked.len(),
            text::list_some(&affected, SITES_NAMED)
        )
    } else {
        String::new()
    };
    Some(format!(
        "{} produce NaN/Inf that the reference does not have ({calls} calls). Look for an \
         uninitialised output or workspace buffer, an FP8 conversion without saturation (e4m3fn \
         has no Inf: values above 448 become NaN), and zero or Inf scales.{ranks}",
        names(&sites)
    ))
}

fn reference_nonfinite(config: &ConfigurationReport) -> Option<String> {
    let sites: Vec<&SiteReport> = config.sites.iter().filter(|s| s.reference_nonfinite_calls > 0).collect();
    if sites.is_empty() {
        return None;
    }
    Some(format!(
        "At {} the reference itself has NaN/Inf: the inputs were already broken before the GEMM. \
         Start from the earliest of these sites (ordinal {}) and look upstream: the previous layer, \
         or the quantization kernel that produced the inputs or their scales.",
        names(&sites),
        sites[0].ordinal
    ))
}

fn zero_output(config: &ConfigurationReport) -> Option<String> {
    let sites = sites_with(config, FailurePattern::ZeroOutput);
    if sites.is_empty() {
        return None;
    }
    let checked: Vec<&SiteReport> =
        config.sites.iter().filter(|s| s.status != SiteStatus::Observed).collect();
    let all_but_first = checked.len() >= 3
        && checked[0].status == SiteStatus::Pass
        && checked[1..].iter().all(|s| s.pattern == Some(FailurePattern::ZeroOutput));
    let signature = if all_but_first {
        " This happens in every layer but the first: the signature of scale aliasing (one scale \
         buffer shared or reused across layers, valid only for the first)."
    } else {
        ""
    };
    Some(format!(
        "The output of {} is (nearly) all zero (norm ratio {}).{signature} Check that the kernel \
         actually ran, that output and scale buffers of different layers are not aliased, and that \
         alpha and the output scale are not zero.",
        names(&sites),
        text::ratio(first_metrics(&sites).norm_ratio)
    ))
}

fn garbage_output(config: &ConfigurationReport) -> Option<String> {
    let sites = sites_with(config, FailurePattern::Garbage);
    if sites.is_empty() {
        return None;
    }
    let mut backends: Vec<String> = sites.iter().flat_map(|s| s.backends.iter().cloned()).collect();
    backends.sort();
    backends.dedup();
    let on = if backends.is_empty() {
        String::new()
    } else {
        let items: Vec<String> = backends.iter().map(|b| text::code(b)).collect();
        format!(" on backend {}", text::list_some(&items, SITES_NAMED))
    };
    Some(format!(
        "The output of {}{on} is unrelated to the reference (cosine {}): the backend computes \
         garbage for these problems, as the ASM GEMM on gfx950 did. Route these shapes to another \
         backend (Triton, hipBLASLt, CK) and report the kernel upstream with the shapes in the \
         layer table.",
        names(&sites),
        text::cosine(first_metrics(&sites).cosine)
    ))
}

fn fp8_variant(config: &ConfigurationReport) -> Option<String> {
    let sites = sites_with(config, FailurePattern::PowerOfTwo);
    if sites.is_empty() {
        return None;
    }
    let metrics = first_metrics(&sites);
    let factor = power_of_two_factor(metrics.norm_ratio).expect("classified as a power of two");
    let reading = if factor < 1.0 {
        "e4m3fn bytes read as e4m3fnuz halve every value (exponent bias 8 instead of 7)"
    } else {
        "e4m3fnuz bytes read as e4m3fn double every value (exponent bias 7 instead of 8)"
    };
    let both = if factor == 0.25 || factor == 4.0 { "; a factor of 4 means both operands" } else { "" };
    Some(format!(
        "{} are off by an exact factor of {factor} (norm ratio {}) with the right direction (cosine \
         {}): an FP8 variant mix-up: {reading}{both}. Check that the declared FP8 type matches the \
         bytes (e4m3fnuz on gfx942, e4m3fn on gfx950 and NVIDIA), that \
         `normalize_e4m3fn_to_e4m3fnuz` is applied on gfx942 and only there, and that weights are \
         reinterpreted, not converted. A scale exponent off by one (ue8m0) gives the same factor.",
        names(&sites),
        text::ratio(metrics.norm_ratio),
        text::cosine(metrics.cosine)
    ))
}

fn magnitude(config: &ConfigurationReport) -> Option<String> {
    let sites = sites_with(config, FailurePattern::Magnitude);
    if sites.is_empty() {
        return None;
    }
    let metrics = first_metrics(&sites);
    Some(format!(
        "{} have the right direction (cosine {}) but the wrong magnitude (norm ratio {}): a scale \
         is missing, applied twice or read in the wrong format. Check alpha, the A and B scales, \
         the output scale, and per-row versus per-tensor scale handling.",
        names(&sites),
        text::cosine(metrics.cosine),
        text::ratio(metrics.norm_ratio)
    ))
}

fn few_rows(config: &ConfigurationReport) -> Option<String> {
    // Passing sites count too: whole-output metrics are exactly what misses a few bad rows.
    let sites: Vec<&SiteReport> = config
        .sites
        .iter()
        .filter(|s| {
            (s.pattern == Some(FailurePattern::FewRows) && s.explanation().is_none())
                || (s.status == SiteStatus::Pass && s.worst_row.as_ref().is_some_and(|r| r.concentrated))
        })
        .collect();
    let row = sites.first()?.worst_row.as_ref()?;
    let passing = sites.iter().filter(|s| s.status == SiteStatus::Pass).count();
    let hidden = if passing > 0 {
        format!(
            " {} of these still pass on whole-output metrics, so the verdict does not show them.",
            text::count(passing, "site", "sites")
        )
    } else {
        String::new()
    };
    Some(format!(
        "Errors concentrate in a few rows at {}: in {} row {} (M = {}) has cosine {} while the \
         whole output has {}. Wrong rows for some M only are the signature of a tile-boundary bug: \
         check the M-dependent kernel and tile selection and the handling of the last, partial tile \
         (padding, masking).{hidden}",
        names(&sites),
        text::code(&sites[0].key.to_string()),
        row.index,
        row.m,
        text::cosine(row.cosine),
        text::cosine(row.call_cosine)
    ))
}

fn m_dependent(config: &ConfigurationReport) -> Option<String> {
    // A site a diagnosis explains has its cause named already: no guess about tiles for it.
    let sites: Vec<&SiteReport> =
        config.sites.iter().filter(|s| s.m_dependence.is_some() && s.explanation().is_none()).collect();
    let first = sites.first()?;
    let dependence = match &first.onset {
        Some(onset) => onset.describe(),
        None => first.m_dependence.expect("filtered on m_dependence").describe(),
    };
    Some(format!(
        "Failures depend on M at {}: {} {}. The kernel or tile configuration chosen for those M is \
         wrong: check the M-dependent selection (tuned configs, heuristics, padding of M) and \
         reproduce with the failing M alone.",
        names(&sites),
        text::code(&first.key.to_string()),
        dependence
    ))
}

fn scale_layout(config: &ConfigurationReport) -> Option<String> {
    let sites = sites_with(config, FailurePattern::ScaleLayout);
    if sites.is_empty() {
        return None;
    }
    Some(format!(
        "The output of {} is only partly correlated with the reference (cosine {}) and they use \
         {} scales: typical of scales applied to the wrong blocks. Compare the scale layout the \
         kernel expects with the one produced (row- vs column-major, pre-shuffled vs plain), check \
         that fallback paths honour `shuffle_scale`/`transpose_scale` and that a partial transpose \
         really transposes; a rows-mode diagnosis run names the reading that matches.",
        names(&sites),
        text::cosine(first_metrics(&sites).cosine),
        text::code(&sites[0].scale_scheme)
    ))
}

fn precision(config: &ConfigurationReport) -> Option<String> {
    let sites = sites_with(config, FailurePattern::Precision);
    if sites.is_empty() {
        return None;
    }
    let metrics = first_metrics(&sites);
    let fast: Vec<&SiteReport> = sites.iter().copied().filter(|s| s.fast_accum).collect();
    let fast_note = if fast.is_empty() {
        String::new()
    } else {
        format!(" Fast accumulation is on at {}: retry without it.", names(&fast))
    };
    Some(format!(
        "{} are below the {} bound (cosine {}, NMSE {}) without a magnitude, layout or row \
         signature: a loss of precision.{fast_note} Compare with another backend on the same \
         shapes; if every backend shows it, the quantization is too coarse for these layers (finer \
         scale granularity, or keep them in a wider format).",
        names(&sites),
        sites[0].class.name(),
        text::cosine(metrics.cosine),
        text::sci(metrics.nmse)
    ))
}

fn unclassified(config: &ConfigurationReport) -> Option<String> {
    let sites = sites_with(config, FailurePattern::Unclassified);
    if sites.is_empty() {
        return None;
    }
    let reasons = sites[0].worst_call.as_ref().map(|c| c.reasons.join("; ")).unwrap_or_default();
    Some(format!(
        "{} fail in a way no known pattern explains ({reasons}). Check them in rows mode for \
         per-row errors and a diagnosis of the contract, and compare with another backend.",
        names(&sites)
    ))
}

fn unchecked_sites(config: &ConfigurationReport) -> Option<String> {
    if config.verdict == Verdict::NoData {
        return None;
    }
    let sites: Vec<&SiteReport> = config.sites.iter().filter(|s| s.status == SiteStatus::Observed).collect();
    if sites.is_empty() {
        return None;
    }
    Some(format!(
        "{} were observed but never checked: this verdict does not cover them. Raise the sampling \
         rate or run longer; if they are always skipped, the skip reasons say why.",
        names(&sites)
    ))
}

/// Skipped calls that make a recommendation: at least this share of the sampled calls, and at
/// least [`SKIPPED_CALLS_NOTED`] of them (a few skips while kernels compile are expected).
const SKIPPED_SHARE_NOTED: f64 = 0.10;
const SKIPPED_CALLS_NOTED: u64 = 10;
/// Skip reasons named in the advice.
const REASONS_NAMED: usize = 3;

/// Whether the closing records count enough skipped calls to say so ([`SKIPPED_SHARE_NOTED`]).
fn many_skipped(config: &ConfigurationReport) -> bool {
    let c = &config.counters;
    let skipped = c.skipped_total();
    skipped >= SKIPPED_CALLS_NOTED && skipped as f64 >= SKIPPED_SHARE_NOTED * c.sampled as f64
}

fn skipped_calls(config: &ConfigurationReport) -> Option<String> {
    if config.verdict == Verdict::NoData || !many_skipped(config) {
        return None;
    }
    let c = &config.counters;
    let skipped = c.skipped_total();
    let share = 100.0 * skipped as f64 / c.sampled.max(1) as f64;
    let reasons: Vec<String> = c
        .skipped
        .iter()
        .take(REASONS_NAMED)
        .map(|s| format!("{} ({})", text::code(&s.reason), s.count))
        .collect();
    let more = c.skipped.len().saturating_sub(REASONS_NAMED);
    let mut advice = format!(
        "{skipped} of {} sampled calls ({share:.0}%) were not checked, so the verdict covers the other \
         calls only. Most skipped: {}{}.",
        c.sampled,
        reasons.join(", "),
        if more > 0 { format!(" and {more} more reasons (see the run's context)") } else { String::new() }
    );
    // What the user can do about the commonest causes, once each.
    let any = |needle: &str| c.skipped.iter().any(|s| s.reason.contains(needle));
    if any("pool") {
        let pool =
            config.settings.iter().find(|kv| kv.key == "pool_mib").map(|kv| format!(" ({} MiB)", kv.value));
        advice.push_str(&format!(
            " The shim's device pool{} was full: raise `QUANTSHADOW_POOL_MB` (every site needs its \
             weight projection, and sizes checked with state of their own need more).",
            pool.unwrap_or_default()
        ));
    }
    if any("still running") || any("still in use") {
        advice.push_str(
            " Checks are shed, never waited for, while earlier checks still run: sample fewer calls \
             (`QUANTSHADOW_SAMPLE=1/N`) to check a steady share of them.",
        );
    }
    if c.skipped
        .iter()
        .any(|s| s.reason.starts_with("graph capture:") && !s.reason.contains("shared check scratch"))
    {
        advice.push_str(
            " A captured call is checked only if its site and batch size ran outside a capture \
             first (set-up cannot happen while capturing): warm each captured size up eagerly, as \
             PyTorch's and vLLM's warm-up runs do.",
        );
    }
    if any("compiling") {
        advice.push_str(
            " Calls made while the check kernels compile pass unchecked: `QUANTSHADOW_COMPILE=sync` \
             checks them (the first calls wait for the compile).",
        );
    }
    Some(advice)
}

fn incomplete_run(config: &ConfigurationReport) -> Option<String> {
    let c = &config.counters;
    let unclosed = c.sessions - c.sessions_closed;
    let mut facts = Vec::new();
    if unclosed > 0 {
        facts.push(format!("{} ended without closing record", text::count(unclosed, "session", "sessions")));
    }
    if c.dropped > 0 {
        facts.push(format!("{} records dropped", c.dropped));
    }
    if c.checked_missing > 0 {
        facts.push(format!("{} checked results missing", c.checked_missing));
    }
    if facts.is_empty() {
        return None;
    }
    Some(format!(
        "This run is incomplete ({}). A crashed session may itself be the bug: read its log (a \
         fault in a kernel, out of memory). Missing results may hide failures: re-run (with a \
         larger transport queue, or spooling to a file, if records were dropped) before trusting \
         the verdict.",
        facts.join(", ")
    ))
}

fn pass(config: &ConfigurationReport) -> Option<String> {
    if config.verdict != Verdict::Pass {
        return None;
    }
    let s = &config.summary;
    let c = &config.counters;
    // Records known to be missing may have held failures: the verdict stands (missing data is a
    // warning), but the sentence must not vouch for what was not seen.
    let partial = s.sites_observed_only > 0
        || c.sessions_closed < c.sessions
        || c.dropped > 0
        || c.checked_missing > 0
        || many_skipped(config);
    Some(format!(
        "All {} ({} calls) are within the thresholds{}.",
        text::count(s.sites_checked, "checked site", "checked sites"),
        s.calls_checked,
        if partial {
            "; see the notes above on what was not covered"
        } else {
            ": this configuration is good to use"
        }
    ))
}
