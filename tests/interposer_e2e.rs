//! libquantshadow.so beside another interposer of the same symbol (a call tracer), preloaded
//! in either order: each call must pass through both and reach the vendor library exactly
//! once. The tracer forwards with dlsym(RTLD_NEXT); preloaded before the shim, its "next" is
//! our export, so our real function must be looked up after our own object, not from the
//! start of the load order (that finds the tracer again: endless recursion, a stack overflow).

use quantshadow_cli::report::load_run_file;
use quantshadow_runtime::record::Record;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const FIXTURE_HOST: &str = env!("QUANTSHADOW_FIXTURE_HOST");
const FIXTURE_TRACER: &str = env!("QUANTSHADOW_FIXTURE_TRACER");

/// libquantshadow.so built beside this test (the shim is a dependency for that reason).
fn shim() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().join("libquantshadow.so");
    assert!(p.is_file(), "{} missing: build with cargo test", p.display());
    p
}

/// Runs the fixture host's `sgemm` scenario with `preload`, the shim's records going to `run`.
fn sgemm(preload: &[&Path], run: &Path) -> Output {
    let preload: Vec<String> = preload.iter().map(|p| p.display().to_string()).collect();
    let mut cmd = Command::new(FIXTURE_HOST);
    cmd.arg("sgemm");
    for k in ["QUANTSHADOW_MODE", "QUANTSHADOW_SAMPLE", "FIXTURE_VENDOR_FAULT", "FIXTURE_VENDOR_TRACE"] {
        cmd.env_remove(k);
    }
    cmd.env("LD_PRELOAD", preload.join(":"))
        .env("QUANTSHADOW_DEVICE", "host")
        .env("QUANTSHADOW_COLLECTOR", format!("file:{}", run.display()));
    cmd.output().expect("fixture_host runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs the fixture under `order` (tracer and shim, in that preload order) and checks that
/// results are unchanged and that the shim and the tracer saw the same calls.
fn traced_run(label: &str, tracer_first: bool) {
    let dir = tempfile::tempdir().unwrap();
    let plain = sgemm(&[], &dir.path().join("plain.qsr"));
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    let (shim, tracer) = (shim(), PathBuf::from(FIXTURE_TRACER));
    let order: Vec<&Path> = if tracer_first { vec![&tracer, &shim] } else { vec![&shim, &tracer] };
    let run = dir.path().join("traced.qsr");
    let out = sgemm(&order, &run);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{label}: {:?}\n{err}", out.status);
    assert_eq!(text(&out.stdout), text(&plain.stdout), "{label}: results changed");
    let traced: u64 = err
        .lines()
        .find_map(|l| l.strip_prefix("fixture_tracer: ")?.strip_suffix(" cublasSgemm_v2 calls")?.parse().ok())
        .unwrap_or_else(|| panic!("{label}: no tracer count in\n{err}"));
    let records = load_run_file(&run).unwrap().records;
    let seen: u64 = records
        .iter()
        .filter_map(|r| match r {
            Record::Closing(c) => Some(c.calls_seen),
            _ => None,
        })
        .sum();
    let checked = records
        .iter()
        .filter(|r| matches!(r, Record::Observation(o) if o.entry_point == "cublasSgemm_v2"))
        .count();
    assert!(traced > 0, "{label}: the tracer saw no call");
    assert_eq!(seen, traced, "{label}: the shim and the tracer saw different calls\n{err}");
    assert!(checked > 0, "{label}: nothing checked\n{err}");
}

#[test]
fn a_tracer_preloaded_after_the_shim_sees_every_call_once() {
    traced_run("shim first", false);
}

/// The shim must not take the tracer's wrapper, which forwards to the shim's export, for the
/// real function: the two would call each other until the stack runs out (session 27 review,
/// reproduced on an H100 with real cuBLAS).
#[test]
fn a_tracer_preloaded_before_the_shim_sees_every_call_once() {
    traced_run("tracer first", true);
}
