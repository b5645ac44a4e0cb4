//! `quantshadow run`: one command for a checked run of a program.
//!
//! Starts a collector on a private unix socket, runs the program with LD_PRELOAD set to the
//! shim and the engine's environment, waits for it, then writes DIR/run.qsr and DIR/report.md.
//! Exit code: the program's failure if it failed, otherwise the report's (0 pass, 1 fail).

use crate::collect::Collector;
use crate::exit;
use quantshadow_runtime::thresholds::Thresholds;
use quantshadow_runtime::transport::Address;
use std::ffi::OsString;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Configuration name shown in the report (QUANTSHADOW_LABEL)
    #[arg(long, default_value = "default")]
    pub label: String,
    /// Directory for run.qsr and report.md (created; an existing run.qsr is never overwritten)
    #[arg(long, value_name = "DIR", default_value = "quantshadow-run")]
    pub out: PathBuf,
    /// off | observe | sketch | rows | full (QUANTSHADOW_MODE)
    #[arg(long, value_parser = ["off", "observe", "sketch", "rows", "full"])]
    pub mode: Option<String>,
    /// all | 1/N | first:K | first:K,1/N (QUANTSHADOW_SAMPLE)
    #[arg(long)]
    pub sample: Option<String>,
    /// Map file of weight pointer -> parameter name (QUANTSHADOW_NAMES)
    #[arg(long, value_name = "FILE")]
    pub names: Option<PathBuf>,
    /// TOML thresholds for the report
    #[arg(long, value_name = "FILE")]
    pub thresholds: Option<PathBuf>,
    /// The shim library [default: libquantshadow.so next to this executable]
    #[arg(long, value_name = "FILE")]
    pub shim: Option<PathBuf>,
    /// The program and its arguments
    #[arg(required = true, last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
    /// Extra environment of the program (for callers such as the demo; not a flag).
    #[arg(skip)]
    pub env: Vec<(String, String)>,
}

/// The shim next to the running executable (or in deps/ or ../lib), if it exists; of several,
/// the newest: a build tree can hold a stale copy next to the executable (cargo builds the shim
/// into deps/ as the CLI's dependency and refreshes the copy beside it only when the shim
/// itself is built as a workspace member).
pub fn default_shim() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    let modified = |p: &PathBuf| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    [dir.join("libquantshadow.so"), dir.join("deps/libquantshadow.so"), dir.join("../lib/libquantshadow.so")]
        .into_iter()
        .filter(|p| p.is_file())
        .max_by_key(modified)
}

pub fn main(args: Args) -> ExitCode {
    match run(&args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("quantshadow run: error: {e}");
            ExitCode::from(exit::BAD_INPUT)
        }
    }
}

/// Runs the program under the shim; returns the exit code to use.
pub fn run(args: &Args) -> Result<u8, String> {
    if let Some(s) = &args.sample {
        if quantshadow_runtime::engine::config::Sampling::parse(s).is_none() {
            return Err(format!("--sample {s:?}: expected all, 1/N, first:K or first:K,1/N"));
        }
    }
    // The report reads it after the program, which may run for hours: a typo must fail now.
    if let Some(t) = &args.thresholds {
        Thresholds::from_file(t).map_err(|e| e.to_string())?;
    }
    let shim = match &args.shim {
        Some(p) => p.clone(),
        None => default_shim().ok_or("libquantshadow.so not found next to quantshadow; pass --shim")?,
    };
    if !shim.is_file() {
        return Err(format!("shim {} does not exist", shim.display()));
    }
    let shim = shim.canonicalize().map_err(|e| format!("{}: {e}", shim.display()))?;
    std::fs::create_dir_all(&args.out).map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let run_file = args.out.join("run.qsr");
    if run_file.exists() {
        return Err(format!(
            "{} exists; choose another --out (runs are never overwritten)",
            run_file.display()
        ));
    }
    let private = private_dir()?;
    let socket = private.join("collector.sock");
    let collector =
        Collector::start(&Address::Unix(socket.clone()), &run_file).map_err(|e| format!("collector: {e}"))?;

    let mut preload = OsString::from(shim.as_os_str());
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut cmd = Command::new(&args.command[0]);
    cmd.args(&args.command[1..])
        .env("LD_PRELOAD", preload)
        .env("QUANTSHADOW_COLLECTOR", format!("unix:{}", socket.display()))
        .env("QUANTSHADOW_LABEL", &args.label);
    if let Some(m) = &args.mode {
        cmd.env("QUANTSHADOW_MODE", m);
    }
    if let Some(s) = &args.sample {
        cmd.env("QUANTSHADOW_SAMPLE", s);
    }
    if let Some(n) = &args.names {
        cmd.env("QUANTSHADOW_NAMES", n);
    }
    cmd.envs(args.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let status = cmd.status();
    let summary = collector.shutdown();
    let _ = std::fs::remove_dir_all(&private);
    let status = status.map_err(|e| format!("cannot run {}: {e}", args.command[0].to_string_lossy()))?;
    eprintln!("quantshadow run: {} records in {}", summary.stats.records, run_file.display());

    let report_args = crate::report::Args {
        files: vec![run_file],
        out: Some(args.out.join("report.md")),
        json: None,
        thresholds: args.thresholds.clone(),
    };
    let verdict = crate::report::run(&report_args).map_err(|e| format!("report: {e}"));
    if !status.success() {
        eprintln!("quantshadow run: the program failed ({status})");
        // The program's failure decides the exit code, but a missing report must still be
        // explained.
        if let Err(e) = &verdict {
            eprintln!("quantshadow run: error: {e}");
        }
        return Ok(status.code().map_or(exit::FAILED, |c| (c & 0xff) as u8).max(1));
    }
    let report = verdict?;
    Ok(if report.verdict == crate::report::Verdict::Pass { exit::OK } else { exit::FAILED })
}

/// A new 0700 directory for the socket.
fn private_dir() -> Result<PathBuf, String> {
    let base = std::env::temp_dir();
    for attempt in 0..100u32 {
        let p = base.join(format!("quantshadow-run-{}-{attempt}", std::process::id()));
        match std::fs::create_dir(&p) {
            Ok(()) => {
                std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700))
                    .map_err(|e| format!("{}: {e}", p.display()))?;
                return Ok(p);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("cannot create {}: {e}", p.display())),
        }
    }
    Err(format!("no private directory could be made under {}", Path::new(&base).display()))
}
