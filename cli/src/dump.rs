//! `quantshadow dump`: the records of run files as JSON lines, or a one-line summary, for
//! scripts (GPU verification, CI pipelines) that want the facts without parsing a report.
//!
//! The summary judges every check with the given (or default) thresholds, as the report does:
//! `sessions 1 observations 120 checked 118 failing_calls 0 failing_sites [] failing_names []
//! diagnoses 0 explained [] injected 0 dropped 0 undecodable 0 damaged 0 torn 0`. `explained`
//! lists `site:reading` for every diagnosis that names a reading other than the declared
//! contract. The last three count what the files lost (records that did not decode, damaged
//! regions, files with a torn tail); the details go to stderr, as the report's warnings do.
//! Fields are only ever added at the end, so scripts that read them by position keep working.

use crate::exit;
use crate::report::{load_run_file, RunSource};
use quantshadow_runtime::record::Record;
use quantshadow_runtime::thresholds::Thresholds;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run files written by `quantshadow collect` (or a shim's `file:` collector).
    #[arg(required = true, value_name = "FILE.qsr")]
    pub files: Vec<PathBuf>,
    /// One summary line instead of the records.
    #[arg(long)]
    pub summary: bool,
    /// Thresholds for the summary's verdicts (default: the built-in ones).
    #[arg(long, value_name = "FILE")]
    pub thresholds: Option<PathBuf>,
}

/// Counts of a set of records.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Summary {
    pub sessions: u64,
    pub observations: u64,
    pub checked: u64,
    pub failing_calls: u64,
    /// (label, site ordinal) of failing checks.
    pub failing_sites: BTreeSet<(String, u32)>,
    /// Names of the failing sites (the entry point where a site has none).
    pub failing_names: BTreeSet<String>,
    pub diagnoses: u64,
    /// (label, site ordinal, reading id) of diagnoses that name a reading.
    pub explained: BTreeSet<(String, u32, String)>,
    pub injected: u64,
    pub dropped: u64,
    /// Intact records of the files that did not decode (not in the other counts).
    pub undecodable: u64,
    /// Damaged regions in the files: their records are lost.
    pub damaged: u64,
    /// Files that end in a torn tail: whatever was written after it is lost.
    pub torn: u64,
}

impl Summary {
    pub fn of(records: &[Record], thresholds: &Thresholds) -> Summary {
        let mut s = Summary::default();
        let mut labels = std::collections::HashMap::new();
        for r in records {
            if let Record::Session(x) = r {
                labels.entry(x.session_id).or_insert_with(|| x.label.clone());
            }
        }
        let label = |id: u64| labels.get(&id).cloned().unwrap_or_default();
        for r in records {
            match r {
                Record::Session(_) => s.sessions += 1,
                Record::Observation(o) => {
                    s.observations += 1;
                    s.injected += (o.flags & quantshadow_runtime::record::flags::INJECTED != 0) as u64;
                    let Some(m) = &o.metrics else { continue };
                    s.checked += 1;
                    let mut failing = !thresholds.judge(o.problem.class(), m).is_empty();
                    if let Some(l) = &o.logits {
                        failing |= thresholds.judge_logits(o.problem.class(), l).is_some();
                    }
                    if failing {
                        s.failing_calls += 1;
                        s.failing_sites.insert((label(o.session_id), o.site_ordinal));
                        s.failing_names.insert(o.site_name.clone().unwrap_or_else(|| o.entry_point.clone()));
                    }
                }
                Record::Diagnosis(d) => {
                    s.diagnoses += 1;
                    if let Some(id) = &d.explanation {
                        s.explained.insert((label(d.session_id), d.site_ordinal, id.clone()));
                    }
                }
                Record::Closing(c) => s.dropped += c.dropped,
            }
        }
        s.sessions = labels.len() as u64;
        s
    }

    /// Adds what a file lost on the way (its records are counted by [`Self::of`]).
    pub fn add_losses(&mut self, source: &RunSource) {
        self.undecodable += source.undecodable;
        self.damaged += source.damaged.len() as u64;
        self.torn += source.torn_tail.is_some() as u64;
    }

    /// One line, `key value` pairs; lists as `[a,b]` (label omitted when there is one session).
    pub fn line(&self) -> String {
        let one = self.sessions <= 1;
        let site = |l: &str, o: u32| if one { o.to_string() } else { format!("{l}/{o}") };
        let sites: Vec<String> = self.failing_sites.iter().map(|(l, o)| site(l, *o)).collect();
        let explained: Vec<String> =
            self.explained.iter().map(|(l, o, id)| format!("{}:{id}", site(l, *o))).collect();
        format!(
            "sessions {} observations {} checked {} failing_calls {} failing_sites [{}] failing_names [{}] diagnoses {} explained [{}] injected {} dropped {} undecodable {} damaged {} torn {}",
            self.sessions,
            self.observations,
            self.checked,
            self.failing_calls,
            sites.join(","),
            self.failing_names.iter().cloned().collect::<Vec<_>>().join(","),
            self.diagnoses,
            explained.join(","),
            self.injected,
            self.dropped,
            self.undecodable,
            self.damaged,
            self.torn
        )
    }
}

pub fn main(args: Args) -> ExitCode {
    let thresholds = match &args.thresholds {
        None => Thresholds::default(),
        Some(p) => match Thresholds::from_file(p) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("quantshadow dump: {e}");
                return ExitCode::from(exit::BAD_INPUT);
            }
        },
    };
    let mut records = Vec::new();
    let mut sources = Vec::new();
    for f in &args.files {
        match load_run_file(f) {
            Ok(run) => {
                // Lost data is not fatal (the intact records are still dumped) but never silent.
                for warning in run.source.warnings() {
                    eprintln!("quantshadow dump: warning: {warning}");
                }
                records.extend(run.records);
                sources.push(run.source);
            }
            Err(e) => {
                eprintln!("quantshadow dump: {}: {e}", f.display());
                return ExitCode::from(exit::BAD_INPUT);
            }
        }
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.summary {
        let mut summary = Summary::of(&records, &thresholds);
        for source in &sources {
            summary.add_losses(source);
        }
        let _ = writeln!(out, "{}", summary.line());
        return ExitCode::from(exit::OK);
    }
    for r in &records {
        match serde_json::to_string(r) {
            Ok(line) => {
                if writeln!(out, "{line}").is_err() {
                    break; // a closed pipe (head): nothing more to say
                }
            }
            Err(e) => {
                eprintln!("quantshadow dump: {e}");
                return ExitCode::from(exit::BAD_INPUT);
            }
        }
    }
    ExitCode::from(exit::OK)
}
