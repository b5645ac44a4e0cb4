//! `quantshadow kernels`: which kernels a program launches, so a user can write specs for them.
//!
//! Runs the program under the shim in observe mode with `QUANTSHADOW_KERNELS_OUT` set; the shim
//! writes a [`KernelListing`] there at exit. The listing is printed as a table sorted by calls;
//! `--suggest` adds a spec skeleton for each GEMM-looking kernel without a spec.
//! `--from FILE.json` prints an existing listing without running anything.
//! Exit code: the program's when it failed, otherwise 0; 2 for bad input or a missing,
//! truncated or malformed listing.

use crate::exit;
use quantshadow_runtime::specs::suggest::{looks_like_gemm, skeleton};
use quantshadow_runtime::specs::{KernelListing, KernelStat};
use std::ffi::OsString;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print a spec skeleton for every GEMM-looking kernel that no spec matched
    #[arg(long)]
    pub suggest: bool,
    /// Directory for kernels.json (created)
    #[arg(long, value_name = "DIR", default_value = "quantshadow-kernels")]
    pub out: PathBuf,
    /// The shim library [default: libquantshadow.so next to this executable]
    #[arg(long, value_name = "FILE")]
    pub shim: Option<PathBuf>,
    /// Print an existing listing (kernels.json) instead of running a program
    #[arg(long, value_name = "FILE.json", conflicts_with = "command")]
    pub from: Option<PathBuf>,
    /// The program and its arguments
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

pub fn main(args: Args) -> ExitCode {
    match run(&args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("quantshadow kernels: error: {e}");
            ExitCode::from(exit::BAD_INPUT)
        }
    }
}

/// Runs (or reads) and prints; returns the exit code to use.
pub fn run(args: &Args) -> Result<u8, String> {
    if let Some(file) = &args.from {
        let listing = read_listing(file)?;
        print!("{}", render(&listing, args.suggest));
        return Ok(exit::OK);
    }
    if args.command.is_empty() {
        return Err("give a program to run (quantshadow kernels -- CMD ARGS...) or --from FILE.json".into());
    }
    let shim = match &args.shim {
        Some(p) => p.clone(),
        None => crate::run::default_shim()
            .ok_or("libquantshadow.so not found next to quantshadow; pass --shim")?,
    };
    if !shim.is_file() {
        return Err(format!("shim {} does not exist", shim.display()));
    }
    let shim = shim.canonicalize().map_err(|e| format!("{}: {e}", shim.display()))?;
    std::fs::create_dir_all(&args.out).map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let listing_file = args.out.join("kernels.json");
    // A listing left by an earlier run would be read as this run's.
    match std::fs::remove_file(&listing_file) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot replace {}: {e}", listing_file.display())),
    }
    let listing_abs = std::path::absolute(&listing_file).unwrap_or(listing_file.clone());

    let mut preload = OsString::from(shim.as_os_str());
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let status = Command::new(&args.command[0])
        .args(&args.command[1..])
        .env("LD_PRELOAD", preload)
        .env("QUANTSHADOW_MODE", "observe")
        .env("QUANTSHADOW_KERNELS_OUT", &listing_abs)
        .status()
        .map_err(|e| format!("cannot run {}: {e}", args.command[0].to_string_lossy()))?;
    let listing = read_listing(&listing_file);
    if !status.success() {
        eprintln!("quantshadow kernels: the program failed ({status})");
    }
    match listing {
        Ok(l) => {
            print!("{}", render(&l, args.suggest));
            eprintln!("quantshadow kernels: listing in {}", listing_file.display());
        }
        Err(e) if status.success() => return Err(e),
        Err(e) => eprintln!("quantshadow kernels: {e}"),
    }
    Ok(if status.success() {
        exit::OK
    } else {
        status.code().map_or(exit::FAILED, |c| (c & 0xff) as u8).max(1)
    })
}

/// Reads a listing file with an error that says what is wrong with it.
pub fn read_listing(path: &Path) -> Result<KernelListing, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "{}: no kernel listing (the shim writes it at exit: did the program exit normally, \
                 and did the shim load?)",
                path.display()
            ))
        }
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    if text.trim().is_empty() {
        return Err(format!("{}: empty kernel listing", path.display()));
    }
    KernelListing::from_json(&text).map_err(|e| format!("{}: {e}", path.display()))
}

fn dims(d: [u32; 3]) -> String {
    format!("{}x{}x{}", d[0], d[1], d[2])
}

fn args_column(k: &KernelStat) -> String {
    match (&k.param_sizes, k.packed_bytes) {
        (Some(s), _) => {
            let sizes: Vec<String> = s.iter().map(|v| v.to_string()).collect();
            format!("{} params [{}]", s.len(), sizes.join(","))
        }
        (None, Some(b)) => format!("packed {b} B"),
        (None, None) => "unknown".into(),
    }
}

/// The table (and skeletons) for a listing.
pub fn render(listing: &KernelListing, suggest: bool) -> String {
    let mut kernels: Vec<&KernelStat> = listing.kernels.iter().collect();
    kernels.sort_by(|a, b| b.calls.cmp(&a.calls).then_with(|| a.name.cmp(&b.name)));
    let mut out = String::new();
    if kernels.is_empty() {
        out.push_str("no kernel launches were seen\n");
    } else {
        let rows: Vec<[String; 7]> = kernels
            .iter()
            .map(|k| {
                let grid =
                    if k.shapes > 1 { format!("{} (+{})", dims(k.grid), k.shapes - 1) } else { dims(k.grid) };
                [
                    k.calls.to_string(),
                    k.entry.clone(),
                    grid,
                    dims(k.block),
                    args_column(k),
                    k.spec.clone().unwrap_or_else(|| "-".into()),
                    k.name.clone(),
                ]
            })
            .collect();
        let head = ["calls", "entry", "grid", "block", "args", "spec", "kernel"];
        let mut widths: Vec<usize> = head.iter().map(|h| h.len()).collect();
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(r.iter()) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut l = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i + 1 == cells.len() {
                    l.push_str(c);
                } else if i == 0 {
                    let _ = write!(l, "{:>w$}  ", c, w = widths[i]);
                } else {
                    let _ = write!(l, "{:<w$}  ", c, w = widths[i]);
                }
            }
            l.trim_end().to_string() + "\n"
        };
        out.push_str(&line(&head.map(String::from)));
        for r in &rows {
            out.push_str(&line(r));
        }
        let total: u64 = kernels.iter().map(|k| k.calls).sum();
        let matched = kernels.iter().filter(|k| k.spec.is_some()).count();
        let _ = writeln!(out, "{} kernels, {total} launches, {matched} matched a spec", kernels.len());
    }
    if suggest {
        let candidates: Vec<&&KernelStat> =
            kernels.iter().filter(|k| k.spec.is_none() && looks_like_gemm(&k.name)).collect();
        out.push('\n');
        if candidates.is_empty() {
            out.push_str("# no GEMM-looking kernel without a spec: nothing to suggest\n");
        } else {
            let _ = writeln!(
                out,
                "# Suggested spec skeletons ({}): save as a .toml file, correct every guess against the\n\
                 # kernel's source (docs/kernel-specs.md), and point QUANTSHADOW_SPECS at it.",
                candidates.len()
            );
            for k in candidates {
                out.push('\n');
                out.push_str(&skeleton(k));
            }
        }
    }
    out
}
