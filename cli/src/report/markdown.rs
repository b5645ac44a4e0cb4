//! The markdown report: GitHub-flavoured, self-contained apart from the heatmap SVG it links.
//!
//! Order: verdict, inputs and thresholds, warnings, the summary table, the heatmap, then one
//! section per configuration (failing sites with their reasons, recommendations, the site
//! table, logits, sessions). Everything a reader needs to act comes before the big tables.

use super::model::{
    ConfigurationReport, MetricSpread, Report, SessionSummary, SiteReport, SiteStatus, Verdict,
};
use super::text::{self, code, plain};
use quantshadow_runtime::formats::FormatClass;
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
        "| Configuration | Verdict | Sites checked | Calls checked | Min cosine | Median cosine | Worst NMSE | Norm ratio | Failing sites |"
    );
    line!(out, "|---|---|--:|--:|--:|--:|--:|:-:|--:|");
    for config in &report.configurations {
        let s = &config.summary;
        let (min, median, nmse, norm) = spread_cells(s.metrics.as_ref());
        line!(
            out,
            "| {} | {} | {} | {} | {min} | {median} | {nmse} | {norm} | {} |",
            code(&config.label),
            verdict_badge(config.verdict),
            s.sites_checked,
            s.calls_checked,
            s.sites_failing
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
    write_context(out, config);
    let failing: Vec<&SiteReport> = config.failing_sites().collect();
    if !failing.is_empty() {
        line!(out, "### Failing sites");
        line!(out);
        for (i, site) in failing.iter().enumerate() {
            line!(out, "{}. {}", i + 1, failure_in_words(site, &config.sessions));
        }
        line!(out);
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
        write_site_table(out, config);
    }
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
    let _ = write!(calls, "; {} dropped", c.dropped);
    line!(out, "- Calls: {calls}");
    for (what, pairs) in [("Libraries", &config.library_versions), ("Settings", &config.settings)] {
        if !pairs.is_empty() {
            let items: Vec<String> =
                pairs.iter().map(|kv| code(&format!("{}={}", kv.key, kv.value))).collect();
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
    if let Some(dependence) = &site.m_dependence {
        let description = dependence.describe();
        let _ = write!(s, " {}{}.", description[..1].to_uppercase(), plain(&description[1..]));
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
