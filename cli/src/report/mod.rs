//! `quantshadow report`: run files -> a self-contained markdown pass/fail report per
//! configuration and per site, a layers x configurations heatmap (SVG) and, on request, JSON.
//!
//! ```text
//! quantshadow report FILE.qsr [FILE.qsr ...] [--out report.md] [--json report.json] [--thresholds FILE]
//!                    [--policy FILE]
//! ```
//!
//! Pipeline: [`load`] (files -> records, problems counted) -> [`aggregate`] (streaming
//! aggregation into the [`model`], verdicts) -> [`rules`] (recommendations) -> renderers
//! ([`markdown`], [`heatmap`], JSON via serde). The pieces are public so that the demo and
//! the benchmark drive the same code.
//!
//! Decisions (the "why" the tables do not say):
//! - **Configuration** = session label (QUANTSHADOW_LABEL). Any number of sessions (processes,
//!   ranks) and files may share one; they are merged. Configurations are listed in the order
//!   their first session appears in the input. Observations whose session record is in none
//!   of the files form the configuration `(no session record)`, with a warning.
//! - **Site identity** across sessions and configurations: the site name when known, else
//!   (entry point, ordinal). The same key in several configurations is one heatmap row.
//! - **Site verdict**: FAIL when any checked call breaks the thresholds of the call's class
//!   (`Thresholds::judge`; introduced NaN/Inf always fails). The worst call shown is the
//!   failing call with the largest NMSE (NaN/Inf first): NMSE sees direction and magnitude.
//!   Observe-only records make a site OBSERVED, never PASS. A worst row far below the whole
//!   output (a few bad rows) is reported and recommended on but does not by itself fail a
//!   site: the thresholds have no per-row bound yet, and the worst of thousands of rows of a
//!   healthy FP8 GEMM can dip below the whole-output bound.
//! - **Configuration verdict**: FAIL when any site fails or a backend policy rule is broken;
//!   NO DATA when not a single call was checked (and no rule is broken); else PASS. NO DATA is
//!   not a pass: a gate that passes when nothing was checked hides a broken setup (a shim that
//!   intercepts nothing, sampling off). The reason is one sentence under the configuration's
//!   heading and in the summary table.
//! - **Fault injection** (`inject` setting of the session records): a banner at the top of the
//!   report per configuration, with what each planted class does; the closing records' "fault
//!   injection not applied" counts are listed under it and are not counted as skips.
//! - **Diagnoses** (schema 1.1 records) attach to their site (site id, else ordinal, within the
//!   session); the one shown is the most recent with an explanation, else the most recent. A
//!   failing site's details give the diagnosis sentence, the top readings, the error map, the
//!   scale layout analysis (the diagnosis', else computed from the recorded problem) and what
//!   to check; the diagnosis' advice leads the recommendations and replaces the pattern guess
//!   for the sites it explains. Passing sites' diagnoses (`QUANTSHADOW_DIAGNOSE=every-site`)
//!   are listed compactly.
//! - **Backend policy** (see [`policy`]): the policy each session recorded, and `--policy FILE`
//!   *in addition* (not instead: a run's own policy is part of what it promised), evaluated per
//!   session with the architecture and the environment the session recorded. A broken rule
//!   fails the configuration; a `--policy` rule that needs a variable the run did not record
//!   cannot be decided: a warning, never a failure. A bad `--policy` file is bad input (exit 2).
//! - **Exit code**: 0 when every configuration passes; 1 when any fails or has no data; 2 for
//!   bad usage or input (missing file, not a run file, unsupported version, empty run,
//!   undecodable file, bad thresholds file, unwritable output), with the message on stderr.
//!   A torn tail is not bad input: the intact records are reported, with a warning in the
//!   report and on stderr.
//! - **Counters** come from closing records; a session without one is reported as ended
//!   without closing record (crashed or killed?), and dropped records are a warning. Neither
//!   changes the verdict of what was checked.
//! - **Heatmap**: written as `<report stem>.heatmap.svg` next to `--out` and linked with a
//!   relative path; without `--out` (markdown on stdout) no file is written, and the heatmap's
//!   data is in the markdown either way.
//! - **JSON**: the same [`Report`] serialized; non-finite numbers (a NaN cosine, an infinite
//!   NMSE) are `null`, and the violations' text says what they were.
//! - **Speed**: per record, two hash lookups and one judgement; medians by selection. The
//!   binary decodes each payload straight into the builder: decoded records are never all in
//!   memory, only the payloads of the file being read (the run-file API reads whole files).
//! - A file given twice is bad usage: its records would silently count twice.

pub mod aggregate;
pub mod heatmap;
mod injection;
pub mod load;
pub mod markdown;
pub mod model;
mod policy;
pub mod rules;
mod text;

#[cfg(test)]
mod tests;

pub use aggregate::{build_report, ReportBuilder};
pub use heatmap::render_heatmap_svg;
pub use load::{decode_payloads, load_run_file, stream_run_file, LoadError, LoadedRun, RunSource};
pub use markdown::render_markdown;
pub use model::{ConfigurationReport, PolicyViolation, Report, SiteKey, SiteReport, SiteStatus, Verdict};
pub use rules::{FailurePattern, Recommendation};

use crate::exit;
use quantshadow_runtime::policy::{Policy, PolicyError};
use quantshadow_runtime::thresholds::{ThresholdError, Thresholds};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run files written by `quantshadow collect`; several files may hold one configuration.
    #[arg(required = true, value_name = "FILE.qsr")]
    pub files: Vec<PathBuf>,
    /// Write the markdown report here (and the heatmap SVG next to it) instead of to stdout.
    #[arg(long, value_name = "report.md")]
    pub out: Option<PathBuf>,
    /// Also write the report as JSON.
    #[arg(long, value_name = "report.json")]
    pub json: Option<PathBuf>,
    /// TOML file overriding the default thresholds (sections [wide], [fp8], [fp4]).
    #[arg(long, value_name = "FILE")]
    pub thresholds: Option<PathBuf>,
}

/// The `report` subcommand's arguments: [`Args`] (what other commands pass to [`run`]) and the
/// options only the command line has.
#[derive(Debug, clap::Args)]
pub struct CommandArgs {
    #[command(flatten)]
    pub args: Args,
    /// Backend policy (TOML, the QUANTSHADOW_POLICY format) to evaluate against every
    /// configuration, in addition to the policies the runs recorded. Rules that need an
    /// environment variable a run did not record are reported as undecided, not failed.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Thresholds(#[from] ThresholdError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error("cannot write {path}: {source}")]
    Write { path: String, source: std::io::Error },
    #[error("{0}")]
    Usage(String),
    #[error("{path} is given more than once: its records would be counted twice")]
    DuplicateFile { path: String },
}

pub fn main(args: CommandArgs) -> ExitCode {
    match run_with_policy(&args.args, args.policy.as_deref()) {
        Ok(report) => {
            let code = if report.verdict == Verdict::Pass { exit::OK } else { exit::FAILED };
            ExitCode::from(code)
        }
        Err(error) => {
            eprintln!("quantshadow report: error: {error}");
            ExitCode::from(exit::BAD_INPUT)
        }
    }
}

/// Loads, judges, writes every requested output and says on stderr what happened.
pub fn run(args: &Args) -> Result<Report, ReportError> {
    run_with_policy(args, None)
}

/// [`run`], also evaluating the backend policy in `policy` against every configuration.
pub fn run_with_policy(args: &Args, policy: Option<&Path>) -> Result<Report, ReportError> {
    check_outputs_do_not_clobber(args)?;
    // Thresholds and policy first: a typo in them must fail before minutes spent reading
    // large files.
    let thresholds = match &args.thresholds {
        Some(path) => Thresholds::from_file(path)?,
        None => Thresholds::default(),
    };
    let policy = policy.map(Policy::load).transpose()?;
    refuse_duplicates(&args.files)?;
    let mut builder = ReportBuilder::new(&thresholds);
    if let Some(policy) = policy {
        builder.set_policy(policy);
    }
    for path in &args.files {
        let source = stream_run_file(path, |record| builder.add_record(&record))?;
        for warning in source.warnings() {
            eprintln!("quantshadow report: warning: {warning}");
        }
        builder.add_source(source);
    }
    let mut report = builder.finish();
    report.thresholds_file = args.thresholds.as_ref().map(|p| p.display().to_string());

    match &args.out {
        Some(out) => {
            let svg_path = heatmap_path_for(out);
            let link = svg_path.file_name().map(|name| name.to_string_lossy().into_owned());
            write_file(&svg_path, &render_heatmap_svg(&report))?;
            write_file(out, &render_markdown(&report, link.as_deref()))?;
            eprintln!("quantshadow report: wrote {} and {}", out.display(), svg_path.display());
        }
        None => print!("{}", render_markdown(&report, None)),
    }
    if let Some(json) = &args.json {
        write_file(json, &render_json(&report))?;
        eprintln!("quantshadow report: wrote {}", json.display());
    }
    // Per-configuration warnings (sessions that ended without a closing record, dropped
    // records, injected faults) go to stderr too, where CI logs show them.
    for config in &report.configurations {
        if let Some(injection) = &config.injection {
            eprintln!("quantshadow report: warning: {}: {}", config.label, injection.summary());
        }
        for warning in &config.warnings {
            eprintln!("quantshadow report: warning: {}: {warning}", config.label);
        }
    }
    eprintln!("quantshadow report: {}", verdict_line(&report));
    Ok(report)
}

/// Where a path will point once written: canonical when it exists, else its canonical parent
/// joined with its name (so `./x.md` and `x.md` compare equal).
fn resolved(path: &Path) -> PathBuf {
    if let Ok(p) = std::fs::canonicalize(path) {
        return p;
    }
    let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    match (std::fs::canonicalize(parent), path.file_name()) {
        (Ok(dir), Some(name)) => dir.join(name),
        _ => path.to_path_buf(),
    }
}

/// Refuses outputs that would overwrite an input run file or each other: a report must never
/// destroy the data it reports on.
fn check_outputs_do_not_clobber(args: &Args) -> Result<(), ReportError> {
    let inputs: Vec<PathBuf> = args.files.iter().map(|f| resolved(f)).collect();
    let mut outputs: Vec<(&str, PathBuf)> = Vec::new();
    if let Some(out) = &args.out {
        outputs.push(("--out", resolved(out)));
        outputs.push(("the heatmap next to --out", resolved(&heatmap_path_for(out))));
    }
    if let Some(json) = &args.json {
        outputs.push(("--json", resolved(json)));
    }
    for (i, (what, path)) in outputs.iter().enumerate() {
        if inputs.contains(path) {
            return Err(ReportError::Usage(format!(
                "{what} ({}) is one of the input run files",
                path.display()
            )));
        }
        if let Some((other, _)) = outputs[..i].iter().find(|(_, p)| p == path) {
            return Err(ReportError::Usage(format!(
                "{what} and {other} are the same file ({})",
                path.display()
            )));
        }
    }
    Ok(())
}

/// `report.md` -> `report.heatmap.svg`, in the same directory.
pub fn heatmap_path_for(out: &Path) -> PathBuf {
    let stem = out.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "report".into());
    out.with_file_name(format!("{stem}.heatmap.svg"))
}

pub fn render_json(report: &Report) -> String {
    let mut json = serde_json::to_string_pretty(report).expect("the report holds only serializable data");
    json.push('\n');
    json
}

/// One line for logs and CI output: the verdict and which configurations did not pass.
pub fn verdict_line(report: &Report) -> String {
    let not_passing: Vec<String> =
        report.not_passing().map(|c| format!("{} ({})", c.label, c.verdict.name())).collect();
    if not_passing.is_empty() {
        format!("{}: all {} configurations pass", report.verdict.name(), report.configurations.len())
    } else {
        format!(
            "{}: {} of {} configurations do not pass: {}",
            report.verdict.name(),
            not_passing.len(),
            report.configurations.len(),
            not_passing.join(", ")
        )
    }
}

/// The same file under two spellings (`a.qsr`, `./a.qsr`) is still the same file. Paths that
/// do not resolve are left to the loader, which names the problem.
fn refuse_duplicates(files: &[PathBuf]) -> Result<(), ReportError> {
    let mut seen = std::collections::HashSet::new();
    for path in files {
        if let Ok(canonical) = path.canonicalize() {
            if !seen.insert(canonical) {
                return Err(ReportError::DuplicateFile { path: path.display().to_string() });
            }
        }
    }
    Ok(())
}

fn write_file(path: &Path, contents: &str) -> Result<(), ReportError> {
    std::fs::write(path, contents)
        .map_err(|source| ReportError::Write { path: path.display().to_string(), source })
}
