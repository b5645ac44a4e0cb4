//! The markdown report: GitHub-flavoured, self-contained apart from the heatmap SVG it links.
//!
//! Order: verdict, the fault-injection banner (when bugs were planted on purpose), inputs and
//! thresholds, warnings, the summary table, the heatmap, then one section per configuration
//! (the verdict's reason, backend policy, failing sites with their reasons and details,
//! recommendations, backend selection, the site table, diagnoses of passing sites, logits,
//! sessions). Everything a reader needs to act comes before the big tables.

use super::model::{
    ConfigurationReport, MetricSpread, PolicySource, Report, SessionSummary, SiteReport, SiteStatus, Verdict,
};
use super::rules;
use super::text::{self, code, code_aware, plain};
use quantshadow_runtime::formats::FormatClass;
use quantshadow_runtime::record::{DiagnosisRecord, ErrorMapSummary};
use std::fmt::Write;

fn verdict_badge(verdict: Verdict) -> String {
    let icon = match verdict {
        Verdict::Pass => "✅",
        Verdict::Fail => "❌",
        Verdict::NoData => "⚠️",
    };
    format!("{icon} {}", verdict.name())
}

fn status_badge(status: SiteStatus) -> String {
    let icon = match status {
        SiteStatus::Pass => "✅",
        SiteStatus::Fail => "❌",
        SiteStatus::Observed => "👁",
    };
    format!("{icon} {}", status.name())
}

fn norm_range(min: f64, max: f64) -> String {
    let (lo, hi) = (text::ratio(min), text::ratio(max));
    if lo == hi {
        lo
    } else {
        format!("{lo} – {hi}")
    }
}

/// `writeln!` into a String cannot fail; this keeps the renderer free of `unwrap` noise.
macro_rules! line {
    ($out:expr) => { $out.push('\n') };
    ($out:expr, $($arg:tt)*) => {{ let _ = writeln!($out, $($arg)*); }};
}

/// Renders the report. `heatmap_link` is the SVG's path relative to the markdown file, or None
/// when no SVG was written (the heatmap data is in the report either way).
pub fn render_markdown(report: &Report, heatmap_link: Option<&str>) -> String {
    let mut out = String::new();
    line!(out, "# quantshadow report");
    line!(out);
    write_verdict(&mut out, report);
    write_injection_banner(&mut out, report);
    write_inputs(&mut out, report);
    write_warnings(&mut out, report);
    write_summary(&mut out, report);
    write_heatmap(&mut out, report, heatmap_link);
    for config in &report.configurations {
        write_configuration(&mut out, config);
    }
    out
}

fn write_verdict(out: &mut String, report: &Report) {
    let total = report.configurations.len();
    let not_passing: Vec<String> = report.not_passing().map(|c| code(&c.label)).collect();
    let detail = match report.verdict {
        Verdict::Pass => format!("all {} pass.", text::count(total, "configuration", "configurations")),
        _ if total == 0 => "no configuration in the input.".to_string(),
        _ => format!(
            "{} of {total} configurations do not pass: {}.",
            not_passing.len(),
            not_passing.join(", ")
        ),
    };
    line!(out, "**Verdict: {}**: {detail}", verdict_badge(report.verdict));
    line!(out);
}

/// Failing sites given a details block before "and N more" (the JSON has them all).
const DETAILS_LISTED: usize = 20;
/// Readings shown per diagnosis (the declared one is added when not among them).
const READINGS_SHOWN: usize = 5;
/// Policy violations listed one by one before "N more".
const VIOLATIONS_LISTED: usize = 20;
/// Passing sites' diagnoses listed before "and N more".
const PASSING_DIAGNOSES_LISTED: usize = 50;

/// One loud banner for every configuration with faults planted on purpose, before anything
/// else: a reader must not take a planted failure for a real one.
fn write_injection_banner(out: &mut String, report: &Report) {
    let injected: Vec<&ConfigurationReport> =
        report.configurations.iter().filter(|c| c.injection.is_some()).collect();
    if injected.is_empty() {
        return;
    }
    line!(out, "## 🧪 Fault injection active");
    line!(out);
    line!(
        out,
        "> **Bugs were planted on purpose** (`QUANTSHADOW_INJECT`): failures at the targeted sites are \
         expected and say nothing about the libraries under test."
    );
    for config in injected {
        let injection = config.injection.as_ref().expect("filtered on injection");
        line!(out, ">");
        let spec = if injection.specs.is_empty() {
            "no spec recorded".to_string()
        } else {
            injection
                .specs
                .iter()
                .map(|s| code(&format!("QUANTSHADOW_INJECT={s}")))
                .collect::<Vec<_>>()
                .join(", ")
        };
        line!(
            out,
            "> **{}**: {spec}; {} faulted.",
            code(&config.label),
            text::count(injection.injected_calls as usize, "call", "calls")
        );
        for fault in &injection.faults {
            let effect = match &fault.effect {
                Some(effect) => plain(effect),
                None => "not a fault class this build knows".to_string(),
            };
            line!(out, "> - {} at {}: {effect}", code(&fault.class), plain(&fault.target));
        }
        if !injection.not_applied.is_empty() {
            line!(out, ">");
            line!(
                out,
                "> ⚠️ **Not applied**: these calls ran without the planted fault, so they do not test it:"
            );
            for note in &injection.not_applied {
                line!(
                    out,
                    "> - {} ({})",
                    plain(&note.reason),
                    text::count(note.count as usize, "time", "times")
                );
            }
        }
    }
    line!(out);
}

fn write_inputs(out: &mut String, report: &Report) {
    let files: Vec<String> = report
        .sources
        .iter()
        .map(|s| {
            let mut notes = vec![format!("{} records", s.records)];
            if s.torn_tail.is_some() {
                notes.push("torn tail".into());
            }
            if s.undecodable > 0 {
                notes.push(format!("{} undecodable", s.undecodable));
            }
            format!("{} ({})", code(&s.path), notes.join(", "))
        })
        .collect();
    line!(out, "Run files: {}.", if files.is_empty() { "none".to_string() } else { files.join(", ") });
    line!(out);
    if let Some(policy) = &report.policy_file {
        line!(
            out,
            "Backend policy {} (`--policy`) is evaluated against every configuration, besides the policies \
             the runs recorded.",
            code(policy)
        );
        line!(out);
    }
    let origin = match &report.thresholds_file {
        Some(path) => format!("from {}", code(path)),
        None => "built-in defaults".to_string(),
    };
    line!(out, "Thresholds ({origin}); a call fails when it breaks any of them or introduces NaN/Inf:");
    line!(out);
    line!(
        out,
        "| Class | Inputs | Cosine ≥ | NMSE ≤ | \\|1 − norm ratio\\| ≤ | Worst row cosine ≥ | Logits KL ≤ |"
    );
    line!(out, "|---|---|--:|--:|--:|--:|--:|");
    for class in FormatClass::ALL {
        let t = report.thresholds.for_class(class);
        let inputs = match class {
            FormatClass::Wide => "bf16, fp16, fp32",
            FormatClass::Fp8 => "FP8, INT8",
            FormatClass::Fp4 => "FP4, INT4, MXFP4, NVFP4",
        };
        line!(
            out,
            "| {} | {inputs} | {} | {} | {} | {} | {} |",
            class.name(),
            t.cosine_min,
            text::sci(t.nmse_max),
            t.norm_ratio_tol,
            t.row_cosine_min,
            text::sci(t.logits_kl_max)
        );
    }
    line!(out);
}

fn write_warnings(out: &mut String, report: &Report) {
    let config_warnings = report.configurations.iter().flat_map(|c| c.warnings.iter().map(move |w| (c, w)));
    if report.warnings.is_empty() && config_warnings.clone().next().is_none() {
        return;
    }
    line!(out, "## Warnings");
    line!(out);
    for warning in &report.warnings {
        line!(out, "- ⚠️ {}", plain(warning));
    }
    for (config, warning) in config_warnings {
        line!(out, "- ⚠️ {}: {}", code(&config.label), plain(warning));
    }
    line!(out);
}

fn write_summary(out: &mut String, report: &Report) {
    line!(out, "## Summary");
    line!(out);
    line!(
        out,
        "| Configuration | Verdict | Sites checked | Calls checked | Min cosine | Median cosine | Worst NMSE | Norm ratio | Failing sites | Reason |"
    );
    line!(out, "|---|---|--:|--:|--:|--:|--:|:-:|--:|---|");
    for config in &report.configurations {
        let s = &config.summary;
        let (min, median, nmse, norm) = spread_cells(s.metrics.as_ref());
        line!(
            out,
            "| {} | {} | {} | {} | {min} | {median} | {nmse} | {norm} | {} | {} |",
            code(&config.label),
            verdict_badge(config.verdict),
            s.sites_checked,
            s.calls_checked,
            s.sites_failing,
            config.reason
        );
    }
    line!(out);
}

fn spread_cells(spread: Option<&MetricSpread>) -> (String, String, String, String) {
    match spread {
        None => ("–".into(), "–".into(), "–".into(), "–".into()),
        Some(m) => (
            text::cosine(m.cosine_min),
            text::cosine(m.cosine_median),
            text::sci(m.nmse_max),
            norm_range(m.norm_ratio_min, m.norm_ratio_max),
        ),
    }
}

fn write_heatmap(out: &mut String, report: &Report, heatmap_link: Option<&str>) {
    let heatmap = &report.heatmap;
    if heatmap.rows.is_empty() {
        return;
    }
    line!(out, "## Heatmap");
    line!(out);
    match heatmap_link {
        Some(link) => {
            line!(out, "Minimum cosine per site (rows) and configuration (columns); colour on a log scale of 1 − cosine, failing cells outlined.");
            line!(out);
            // Angle brackets let the link hold spaces; the alt text doubles as a caption.
            line!(out, "![Heatmap: minimum cosine per site and configuration](<{link}>)");
        }
        None => line!(
            out,
            "No heatmap SVG was written (it is written next to the report with `--out`); its data:"
        ),
    }
    line!(out);
    line!(out, "<details><summary>Heatmap data: minimum cosine (❌ failing, obs: observed only, –: not seen)</summary>");
    line!(out);
    let mut header = "| # | Site |".to_string();
    let mut rule = "|--:|---|".to_string();
    for column in &heatmap.columns {
        let _ = write!(header, " {} |", code(column));
        rule.push_str("--:|");
    }
    line!(out, "{header}");
    line!(out, "{rule}");
    for row in &heatmap.rows {
        let mut line = format!("| {} | {} |", row.ordinal, code(&row.site));
        for cell in &row.cells {
            let value = match cell {
                None => "–".to_string(),
                Some(c) => match (c.status, c.cosine_min) {
                    (SiteStatus::Observed, _) | (_, None) => "obs".to_string(),
                    (SiteStatus::Fail, Some(cos)) => format!("{} ❌", text::cosine(cos)),
                    (_, Some(cos)) => text::cosine(cos),
                },
            };
            let _ = write!(line, " {value} |");
        }
        line!(out, "{line}");
    }
    line!(out);
    line!(out, "</details>");
    line!(out);
}

fn write_configuration(out: &mut String, config: &ConfigurationReport) {
    line!(out, "## {}: {}", code(&config.label), verdict_badge(config.verdict));
    line!(out);
    line!(out, "{}: {}.", verdict_badge(config.verdict), config.reason);
    line!(out);
    if let Some(injection) = &config.injection {
        let spec = if injection.specs.is_empty() {
            "(no spec recorded)".to_string()
        } else {
            code(&injection.specs.join(" / "))
        };
        line!(
            out,
            "🧪 **Fault injection active** ({spec}): {} faulted on purpose; see the banner at the top.",
            text::count(injection.injected_calls as usize, "call", "calls")
        );
        line!(out);
    }
    write_context(out, config);
    write_policy(out, config);
    let failing: Vec<&SiteReport> = config.failing_sites().collect();
    if !failing.is_empty() {
        line!(out, "### Failing sites");
        line!(out);
        for (i, site) in failing.iter().enumerate() {
            line!(out, "{}. {}", i + 1, failure_in_words(site, &config.sessions));
        }
        line!(out);
        write_failing_details(out, config, &failing);
    }
    if !config.recommendations.is_empty() {
        line!(out, "### Recommendations");
        line!(out);
        for (i, r) in config.recommendations.iter().enumerate() {
            // Advice is written in markdown by the rules (names already in code spans).
            line!(out, "{}. **{}**: {}", i + 1, r.title, r.advice);
        }
        line!(out);
    }
    if !config.sites.is_empty() {
        write_backend_selection(out, config);
        write_site_table(out, config);
    }
    write_passing_diagnoses(out, config);
    write_logits(out, config);
    write_sessions(out, config);
}

fn write_context(out: &mut String, config: &ConfigurationReport) {
    let c = &config.counters;
    let unclosed = c.sessions - c.sessions_closed;
    let mut sessions = text::count(c.sessions, "session", "sessions");
    if unclosed > 0 {
        let _ = write!(sessions, " ({unclosed} without closing record)");
    }
    let mut devices: Vec<String> = config
        .sessions
        .iter()
        .filter(|s| s.has_session_record)
        .map(|s| format!("{} ({})", s.device_name, s.device_arch))
        .collect();
    devices.sort();
    devices.dedup();
    if !devices.is_empty() {
        let _ = write!(sessions, " on {}", plain(&devices.join(", ")));
    }
    line!(out, "- Sessions: {sessions}");
    let mut calls = if c.sessions_closed == 0 {
        format!("counters unknown (no closing record); {} observation records", c.observations_received)
    } else {
        format!(
            "{} seen, {} sampled, {} checked (closing records); {} observation records",
            c.calls_seen, c.sampled, c.checked, c.observations_received
        )
    };
    if !c.skipped.is_empty() {
        let reasons: Vec<String> =
            c.skipped.iter().map(|s| format!("{} {}", plain(&s.reason), s.count)).collect();
        let _ = write!(calls, "; skipped {} ({})", c.skipped_total(), reasons.join(", "));
    }
    if let Some(injection) = config.injection.as_ref().filter(|i| !i.not_applied.is_empty()) {
        let total: u64 = injection.not_applied.iter().map(|s| s.count).sum();
        let _ = write!(calls, "; {total} fault injections not applied (see the banner)");
    }
    let _ = write!(calls, "; {} dropped", c.dropped);
    line!(out, "- Calls: {calls}");
    for (what, pairs) in [("Libraries", &config.library_versions), ("Settings", &config.settings)] {
        // The policy's text is many lines of TOML: the policy section names its origin instead.
        let items: Vec<String> = pairs
            .iter()
            .filter(|kv| kv.key != "policy.text")
            .map(|kv| code(&format!("{}={}", kv.key, kv.value)))
            .collect();
        if !items.is_empty() {
            line!(out, "- {what}: {}", items.join(", "));
        }
    }
    line!(out);
}

/// One failing site in words: where it is, how often it fails, the worst call's violations,
/// and the row and M patterns that point at a cause.
fn failure_in_words(site: &SiteReport, sessions: &[SessionSummary]) -> String {
    let mut s = format!(
        "**{}** (#{}, {}, {}, {}, scales {}): {} of {} checked calls fail.",
        code(&site.key.to_string()),
        site.ordinal,
        code(&site.entry_point),
        site.shape,
        code(&site.formats),
        code(&site.scale_scheme),
        site.calls_failed,
        site.calls_checked
    );
    if let Some(call) = &site.worst_call {
        let backend = call.backend.as_deref().map(|b| format!(", backend {}", code(b))).unwrap_or_default();
        let who = match sessions.iter().find(|s| s.session_id == call.session_id) {
            Some(session) => session.short_name(),
            None => format!("session {:016x}", call.session_id),
        };
        let _ = write!(
            s,
            " Worst call (M = {}, call {} of {who}, {} mode{backend}): {}.",
            call.m,
            call.call_seq,
            call.mode.name(),
            plain(&call.reasons.join("; "))
        );
    }
    if let Some(row) = &site.worst_row {
        if row.concentrated {
            let _ = write!(
                s,
                " Worst row {} (M = {}) has cosine {} while the whole output has {}: the error \
                 concentrates in a few rows.",
                row.index,
                row.m,
                text::cosine(row.cosine),
                text::cosine(row.call_cosine)
            );
        }
    }
    if let Some(onset) = &site.onset {
        let _ = write!(s, " {}.", capitalized(&plain(&onset.describe())));
    } else if let Some(dependence) = &site.m_dependence {
        let _ = write!(s, " {}.", capitalized(&plain(&dependence.describe())));
    }
    if let Some(reading) = site.explanation() {
        let _ = write!(s, " Explained by {} (diagnosis).", plain(&reading.description));
    }
    if site.injected_calls > 0 {
        let _ = write!(s, " {} calls had a fault injected on purpose.", site.injected_calls);
    }
    s
}

fn write_site_table(out: &mut String, config: &ConfigurationReport) {
    line!(out, "### Sites");
    line!(out);
    line!(
        out,
        "| # | Name | Entry point | Shape | Formats | Scales | Checked | Cosine min | Cosine median | NMSE max | Norm ratio | Worst row | Status |"
    );
    line!(out, "|--:|---|---|---|---|---|--:|--:|--:|--:|:-:|---|---|");
    for site in &config.sites {
        let name = site.name.as_deref().map(code).unwrap_or_else(|| "–".into());
        let mut entry = code(&site.entry_point);
        if !site.backends.is_empty() {
            let backends: Vec<String> = site.backends.iter().map(|b| code(b)).collect();
            let _ = write!(entry, " ({})", backends.join(", "));
        }
        let mut checked = site.calls_checked.to_string();
        let observed_only = site.calls_observed - site.calls_checked;
        if observed_only > 0 {
            let _ = write!(checked, " (+{observed_only} obs)");
        }
        let (min, median, nmse, norm) = spread_cells(site.metrics.as_ref());
        let worst_row = match &site.worst_row {
            None => "–".to_string(),
            Some(r) => {
                let few = if r.concentrated { " (few rows)" } else { "" };
                format!("{}: {}{few}", r.index, text::cosine(r.cosine))
            }
        };
        line!(
            out,
            "| {} | {name} | {entry} | {} | {} | {} | {checked} | {min} | {median} | {nmse} | {norm} | {worst_row} | {} |",
            site.ordinal,
            site.shape,
            code(&site.formats),
            code(&site.scale_scheme),
            status_badge(site.status)
        );
    }
    line!(out);
}

fn write_logits(out: &mut String, config: &ConfigurationReport) {
    let sites: Vec<&SiteReport> = config.sites.iter().filter(|s| s.logits.is_some()).collect();
    if sites.is_empty() {
        return;
    }
    line!(out, "### Logits");
    line!(out);
    line!(out, "| # | Site | Calls | KL mean (nats) | KL max | Top-1 agreement | Top-k overlap |");
    line!(out, "|--:|---|--:|--:|--:|--:|--:|");
    for site in sites {
        let l = site.logits.expect("filtered on logits");
        line!(
            out,
            "| {} | {} | {} | {} | {} | {:.1}% | {:.1}% (k = {}) |",
            site.ordinal,
            code(&site.key.to_string()),
            l.calls,
            text::sci(l.kl_mean),
            text::sci(l.kl_max),
            100.0 * l.top1_agreement,
            100.0 * l.topk_overlap_mean,
            l.k
        );
    }
    line!(out);
}

fn write_sessions(out: &mut String, config: &ConfigurationReport) {
    line!(out, "### Sessions");
    line!(out);
    line!(out, "| Session | Host | PID | Rank | Device | Closing record | Checked | Failing calls |");
    line!(out, "|---|---|--:|--:|---|---|--:|--:|");
    for s in &config.sessions {
        line!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            code(&format!("{:016x}", s.session_id)),
            if s.has_session_record { plain(&s.host) } else { "(no session record)".into() },
            s.pid,
            if s.rank >= 0 { s.rank.to_string() } else { "–".into() },
            plain(format!("{} {}", s.device_name, s.device_arch).trim()),
            closing_cell(s),
            s.calls_checked,
            s.calls_failed
        );
    }
    line!(out);
}

fn closing_cell(s: &SessionSummary) -> String {
    match &s.closing {
        None => "⚠️ missing (crashed or killed?)".into(),
        Some(c) if c.dropped > 0 => format!("yes, {} dropped", c.dropped),
        Some(_) => "yes".into(),
    }
}

fn capitalized(text: &str) -> String {
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

fn session_name(sessions: &[SessionSummary], session_id: u64) -> String {
    match sessions.iter().find(|s| s.session_id == session_id) {
        Some(session) => session.short_name(),
        None => format!("session {session_id:016x}"),
    }
}

/// The configuration's backend policies: what was evaluated, with which facts, and every
/// broken rule quoted.
fn write_policy(out: &mut String, config: &ConfigurationReport) {
    let Some(policy) = &config.policy else { return };
    line!(out, "### Backend policy");
    line!(out);
    let policies: Vec<String> = policy
        .policies
        .iter()
        .map(|p| {
            let from = match p.source {
                PolicySource::Recorded => "recorded by the run",
                PolicySource::Report => "`--policy`",
            };
            format!("{} ({from}, {})", code(&p.origin), text::count(p.rules, "rule", "rules"))
        })
        .collect();
    line!(out, "- Policies: {}", policies.join(", "));
    if !policy.env.is_empty() {
        let env: Vec<String> = policy
            .env
            .iter()
            .map(|e| match &e.value {
                Some(value) => code(&format!("{}={value}", e.name)),
                None => format!("{} unset", code(&e.name)),
            })
            .collect();
        line!(out, "- Environment the rules name: {}", env.join(", "));
    }
    for undecided in &policy.undecided {
        line!(out, "- ⚠️ Undecided: {}", plain(undecided));
    }
    line!(out);
    if policy.violations.is_empty() {
        line!(out, "✅ No rule is broken at any of the {} sites.", config.sites.len());
        line!(out);
        return;
    }
    let rules = super::policy::broken_rules(&policy.violations);
    line!(
        out,
        "❌ {} broken, at {}:",
        text::count(rules.len(), "rule", "rules"),
        text::count(policy.violations.len(), "site and kernel", "sites and kernels")
    );
    line!(out);
    for (i, v) in policy.violations.iter().take(VIOLATIONS_LISTED).enumerate() {
        let why = v
            .why
            .as_deref()
            .map(|w| format!(" Why: {}.", plain(w.trim_end_matches('.'))))
            .unwrap_or_default();
        line!(out, "{}. {} ({}).{why}", i + 1, code_aware(&v.text), code(&v.site.to_string()));
    }
    if policy.violations.len() > VIOLATIONS_LISTED {
        line!(out);
        line!(
            out,
            "{} more violations are in the JSON report (`--json`).",
            policy.violations.len() - VIOLATIONS_LISTED
        );
    }
    line!(out);
}

/// Per failing site: the diagnosis beside the declared contract, the top readings, the error
/// map, the scale layout analysis and what to check.
fn write_failing_details(out: &mut String, config: &ConfigurationReport, failing: &[&SiteReport]) {
    let detailed: Vec<&&SiteReport> = failing
        .iter()
        .filter(|s| s.diagnosis.is_some() || s.onset.is_some() || !s.scale_layout.is_empty())
        .collect();
    if detailed.is_empty() {
        return;
    }
    line!(out, "### Failing site details");
    line!(out);
    for site in detailed.iter().take(DETAILS_LISTED) {
        line!(out, "#### {} (#{})", code(&site.key.to_string()), site.ordinal);
        line!(out);
        match &site.diagnosis {
            Some(d) => {
                let more = if site.diagnoses > 1 {
                    format!(", the one shown of {} diagnoses", site.diagnoses)
                } else {
                    String::new()
                };
                line!(
                    out,
                    "- **Diagnosis** (call {} of {}, {} rows compared{more}): {}.",
                    d.call_seq,
                    session_name(&config.sessions, d.session_id),
                    d.rows,
                    plain(d.text.trim_end_matches('.'))
                );
            }
            None => line!(
                out,
                "- **Diagnosis**: none recorded for this site (`QUANTSHADOW_DIAGNOSE=on-fail` diagnoses failing sites)."
            ),
        }
        if let Some(onset) = &site.onset {
            line!(out, "- **M onset**: {}.", capitalized(&plain(&onset.describe())));
        }
        let check =
            match (site.explanation(), site.diagnosis.as_ref().and_then(|d| d.recommendation.as_ref())) {
                (Some(_), Some(recommendation)) => {
                    capitalized(&plain(recommendation.trim_end_matches('.'))) + "."
                }
                _ => match site.pattern.and_then(|p| rules::RULES.iter().find(|r| r.id == p.rule_id())) {
                    Some(rule) => format!("see **{}** under Recommendations.", rule.title),
                    None => "see the Recommendations.".to_string(),
                },
            };
        line!(out, "- **What to check**: {check}");
        line!(out);
        if let Some(d) = &site.diagnosis {
            write_readings(out, d);
            if let Some(map) = &d.error_map {
                write_error_map(out, map);
            }
        }
        if !site.scale_layout.is_empty() {
            let source = match &site.diagnosis {
                Some(d) if !d.scale_layout.is_empty() => "as the diagnosed call declared them".to_string(),
                _ => match &site.worst_call {
                    Some(call) => format!("as declared, at the worst call's M = {}", call.m),
                    None => "as declared".to_string(),
                },
            };
            line!(out, "**Scale layout analysis** ({source}):");
            line!(out);
            for layout in &site.scale_layout {
                line!(out, "- {}", plain(layout));
            }
            line!(out);
        }
    }
    if detailed.len() > DETAILS_LISTED {
        line!(
            out,
            "{} more failing sites have details: they are in the JSON report (`--json`).",
            detailed.len() - DETAILS_LISTED
        );
        line!(out);
    }
}

fn write_readings(out: &mut String, d: &DiagnosisRecord) {
    if d.readings.is_empty() {
        return;
    }
    let mut shown: Vec<_> = d.readings.iter().take(READINGS_SHOWN).collect();
    if let Some(declared) = d.declared() {
        if !shown.iter().any(|r| r.declared) {
            shown.push(declared);
        }
    }
    line!(out, "| Reading | Cosine | NMSE | Norm ratio | Explains? |");
    line!(out, "|---|--:|--:|--:|:-:|");
    for r in shown {
        let name = if r.declared {
            format!("**{}** (declared)", plain(&r.description))
        } else {
            format!("{} ({})", plain(&r.description), code(&r.id))
        };
        let explains = if d.explanation.as_deref() == Some(r.id.as_str()) {
            "✅ best explanation"
        } else if r.explains {
            "✅"
        } else {
            "–"
        };
        let nonfinite = if r.nonfinite_mismatch > 0 {
            format!(" ({} NaN/Inf disagree)", r.nonfinite_mismatch)
        } else {
            String::new()
        };
        line!(
            out,
            "| {name} | {}{nonfinite} | {} | {} | {explains} |",
            text::cosine(r.cosine),
            text::sci(r.nmse),
            text::ratio(r.norm_ratio)
        );
    }
    line!(out);
    if d.readings.len() > READINGS_SHOWN {
        line!(
            out,
            "{} more readings were evaluated (all in the JSON report).",
            d.readings.len() - READINGS_SHOWN
        );
        line!(out);
    }
    if !d.skipped.is_empty() {
        let skipped: Vec<String> =
            d.skipped.iter().map(|kv| format!("{} ({})", plain(&kv.key), plain(&kv.value))).collect();
        line!(out, "Not evaluated: {}.", text::list_some(&skipped, 3));
        line!(out);
    }
}

fn write_error_map(out: &mut String, map: &ErrorMapSummary) {
    line!(out, "**Error map** (call with M = {}, {} rows checked):", map.m, map.rows_checked);
    line!(out);
    if !map.summary.trim().is_empty() {
        for part in map.summary.split("; ") {
            line!(out, "- {}", plain(part));
        }
    } else {
        let rows = match &map.row_period {
            Some(p) => format!(
                "every {} row (i = {} mod {}) from row {} ({} of {} checked)",
                text::ordinal(p.period),
                p.offset,
                p.period,
                p.first_row,
                map.bad_rows_total,
                map.rows_checked
            ),
            None => format!("{} of {} checked", map.bad_rows_total, map.rows_checked),
        };
        line!(out, "- bad rows: {rows}");
        let blocks: Vec<String> = map.bad_col_blocks.iter().map(u64::to_string).collect();
        line!(
            out,
            "- bad column blocks ({} wide): {}",
            map.col_block,
            if blocks.is_empty() { "none".to_string() } else { text::list_some(&blocks, 12) }
        );
    }
    line!(out);
}

/// Serving kernels per site, with the policy's verdict per site when a policy was evaluated.
fn write_backend_selection(out: &mut String, config: &ConfigurationReport) {
    let with_policy = config.policy.is_some();
    let mut kernels: Vec<&str> =
        config.sites.iter().flat_map(|s| s.serving.iter().filter_map(|k| k.kernel.as_deref())).collect();
    kernels.sort();
    kernels.dedup();
    line!(out, "### Backend selection");
    line!(out);
    if !with_policy {
        line!(
            out,
            "<details><summary>Kernels serving the {}: {} distinct</summary>",
            text::count(config.sites.len(), "site", "sites"),
            kernels.len()
        );
        line!(out);
    }
    let policy_header = if with_policy { " Policy |" } else { "" };
    let policy_rule = if with_policy { ":-:|" } else { "" };
    line!(out, "| # | Site | Entry point | Serving kernel (calls) | Formats |{policy_header}");
    line!(out, "|--:|---|---|---|---|{policy_rule}");
    for site in &config.sites {
        let served: Vec<String> = site
            .serving
            .iter()
            .map(|k| match &k.kernel {
                Some(kernel) => format!("{} ({})", code(kernel), k.calls),
                None => format!("unknown ({})", k.calls),
            })
            .collect();
        let policy_cell = if with_policy {
            let broken: Vec<String> = super::policy::broken_rules(config.policy_violations())
                .into_iter()
                .filter(|(_, sites)| sites.contains(&&site.key))
                .map(|(rule, _)| format!("\"{}\"", plain(rule)))
                .collect();
            if broken.is_empty() {
                " ✅ |".to_string()
            } else {
                format!(" ❌ {} |", broken.join(", "))
            }
        } else {
            String::new()
        };
        line!(
            out,
            "| {} | {} | {} | {} | {} |{policy_cell}",
            site.ordinal,
            code(&site.key.to_string()),
            code(&site.entry_point),
            if served.is_empty() { "–".to_string() } else { text::list_some(&served, 4) },
            code(&site.formats)
        );
    }
    line!(out);
    if !with_policy {
        line!(out, "</details>");
        line!(out);
    }
}

/// Diagnoses of sites that do not fail (`QUANTSHADOW_DIAGNOSE=every-site`): one line each.
fn write_passing_diagnoses(out: &mut String, config: &ConfigurationReport) {
    let sites: Vec<&SiteReport> =
        config.sites.iter().filter(|s| s.status != SiteStatus::Fail && s.diagnosis.is_some()).collect();
    if sites.is_empty() {
        return;
    }
    line!(out, "### Diagnoses of passing sites");
    line!(out);
    for site in sites.iter().take(PASSING_DIAGNOSES_LISTED) {
        let d = site.diagnosis.as_ref().expect("filtered on diagnosis");
        let layout = if site.scale_layout.is_empty() {
            String::new()
        } else {
            format!(" Scales: {}.", plain(&site.scale_layout.join("; ")))
        };
        line!(
            out,
            "- {} (#{}, {}): {}.{layout}",
            code(&site.key.to_string()),
            site.ordinal,
            status_badge(site.status),
            plain(d.text.trim_end_matches('.'))
        );
    }
    if sites.len() > PASSING_DIAGNOSES_LISTED {
        line!(out, "- and {} more (in the JSON report)", sites.len() - PASSING_DIAGNOSES_LISTED);
    }
    line!(out);
}
