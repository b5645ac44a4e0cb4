//! The real shim end to end on the CPU: the fixture host program loads the fixture app
//! RTLD_LOCAL (like a Python extension module), whose vendor calls go through its PLT into
//! libquantshadow.so (LD_PRELOAD), which checks them with the host backend and streams
//! records to a real collector. Results must be unchanged, records right, faults flagged.

use quantshadow_cli::collect::Collector;
use quantshadow_cli::report::{self, load_run_file, Verdict};
use quantshadow_runtime::record::Record;
use quantshadow_runtime::transport::Address;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const FIXTURE_HOST: &str = env!("QUANTSHADOW_FIXTURE_HOST");

/// libquantshadow.so built beside this test (the shim is a dev-dependency for that reason).
fn shim() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let p = deps.join("libquantshadow.so");
    assert!(p.is_file(), "{} missing: build with cargo test", p.display());
    p
}

fn fixture(scenario: &str, env: &[(&str, &str)], preload: bool) -> Output {
    let mut cmd = Command::new(FIXTURE_HOST);
    cmd.arg(scenario).env_remove("LD_PRELOAD");
    for k in ["QUANTSHADOW_MODE", "QUANTSHADOW_SAMPLE", "QUANTSHADOW_COLLECTOR", "FIXTURE_VENDOR_FAULT"] {
        cmd.env_remove(k);
    }
    if preload {
        cmd.env("LD_PRELOAD", shim());
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().expect("fixture_host runs");
    assert!(
        out.status.success(),
        "fixture_host {scenario} failed: {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs a scenario under the shim with a real collector; returns (fixture output, records).
fn checked_run(dir: &Path, scenario: &str, env: &[(&str, &str)]) -> (Output, Vec<Record>) {
    let sock = dir.join("c.sock");
    let run = dir.join("run.qsr");
    let collector = Collector::start(&Address::Unix(sock.clone()), &run).unwrap();
    let address = format!("unix:{}", sock.display());
    let mut all: Vec<(&str, &str)> =
        vec![("QUANTSHADOW_COLLECTOR", &address), ("QUANTSHADOW_DEVICE", "host")];
    all.extend_from_slice(env);
    let out = fixture(scenario, &all, true);
    collector.shutdown();
    let records = load_run_file(&run).unwrap().records;
    (out, records)
}

fn observations(records: &[Record]) -> Vec<&quantshadow_runtime::record::GemmObservation> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Observation(o) => Some(o),
            _ => None,
        })
        .collect()
}

fn closing(records: &[Record]) -> Vec<&quantshadow_runtime::record::ClosingRecord> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Closing(c) => Some(c),
            _ => None,
        })
        .collect()
}

fn report_of(dir: &Path) -> report::Report {
    report::run(&report::Args {
        files: vec![dir.join("run.qsr")],
        out: Some(dir.join("report.md")),
        json: None,
        thresholds: None,
    })
    .unwrap()
}

#[test]
fn exports_are_exactly_the_hook_list() {
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(shim()).output().expect("nm runs");
    assert!(out.status.success());
    let mut exported: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect();
    exported.sort();
    let mut expected: Vec<String> =
        quantshadow_runtime::intercept::HOOK_NAMES.iter().map(|s| s.to_string()).collect();
    expected.push("quantshadow_version".into());
    expected.push("quantshadow_pause".into());
    expected.push("dlsym".into());
    expected.sort();
    assert_eq!(exported, expected);
}

#[test]
fn every_mode_leaves_results_unchanged_and_checks_every_supported_call() {
    let plain = fixture("model", &[], false);
    for mode in ["sketch", "rows", "full"] {
        let dir = tempfile::tempdir().unwrap();
        let (out, records) = checked_run(dir.path(), "model", &[("QUANTSHADOW_MODE", mode)]);
        assert_eq!(stdout(&out), stdout(&plain), "mode {mode}: results changed under the shim");
        let obs = observations(&records);
        let close = closing(&records);
        assert_eq!(close.len(), 1, "one closing record");
        let c = close[0];
        let skipped: u64 = c.skipped.iter().map(|s| s.count).sum();
        assert_eq!(c.calls_seen, 16, "{mode}");
        assert_eq!(c.checked + skipped, c.sampled, "{mode}: {:?}", c.skipped);
        assert_eq!(obs.len() as u64, c.checked, "{mode}");
        assert_eq!(c.checked, 16, "{mode}: skipped {:?}", c.skipped);
        for o in &obs {
            // A sketch cannot see through a non-linear epilogue: those calls are checked by rows.
            let nonlinear = o.problem.activation != quantshadow_runtime::problem::Activation::None;
            let expected = if mode == "sketch" && nonlinear { "rows" } else { mode };
            assert_eq!(o.mode.name(), expected, "{}", o.entry_point);
            assert!(o.metrics.is_some());
        }
        let r = report_of(dir.path());
        assert_eq!(
            r.verdict,
            Verdict::Pass,
            "{mode}: {}",
            std::fs::read_to_string(dir.path().join("report.md")).unwrap()
        );
    }
}

#[test]
fn paused_calls_pass_through_and_are_counted_as_skipped() {
    // "linear" is three calls; the middle three run while paused (quantshadow_pause(1)).
    let scenario = "linear,pause,linear,resume,linear";
    let plain = fixture(scenario, &[], false);
    let dir = tempfile::tempdir().unwrap();
    let (out, records) = checked_run(dir.path(), scenario, &[]);
    assert_eq!(stdout(&out), stdout(&plain), "results changed under the shim");
    let c = closing(&records)[0];
    assert_eq!((c.calls_seen, c.sampled, c.checked), (9, 9, 6), "{:?}", c.skipped);
    let paused: Vec<_> =
        c.skipped.iter().filter(|s| s.reason == quantshadow_runtime::engine::PAUSED_SKIP).collect();
    assert_eq!(paused.len(), 1, "{:?}", c.skipped);
    assert_eq!(paused[0].count, 3);
    // Paused calls take no sequence number (like calls the sampling passes over).
    let mut seqs: Vec<u64> = observations(&records).iter().map(|o| o.call_seq).collect();
    seqs.sort();
    assert_eq!(seqs, (0..6).collect::<Vec<u64>>());
}

#[test]
fn a_planted_fault_fails_exactly_its_site() {
    let dir = tempfile::tempdir().unwrap();
    // Call 4 is the second layer of "mlp" (bf16 cublasGemmEx).
    let (_, records) = checked_run(dir.path(), "model", &[("FIXTURE_VENDOR_FAULT", "4:alpha2x")]);
    let r = report_of(dir.path());
    assert_eq!(r.verdict, Verdict::Fail);
    let obs = observations(&records);
    let th = quantshadow_runtime::thresholds::Thresholds::default();
    let failing: Vec<u64> = obs
        .iter()
        .filter(|o| !th.judge(o.problem.class(), o.metrics.as_ref().unwrap()).is_empty())
        .map(|o| o.call_seq)
        .collect();
    assert_eq!(failing, vec![4], "only the planted call fails");
}

#[test]
fn sampling_counts_calls_per_site() {
    let dir = tempfile::tempdir().unwrap();
    // "linear*3": the same 3 layers (same weights) three times; first:1 checks each site once.
    let (_, records) = checked_run(dir.path(), "linear*3", &[("QUANTSHADOW_SAMPLE", "first:1")]);
    let c = closing(&records)[0];
    assert_eq!(c.calls_seen, 9);
    assert_eq!(c.sampled, 3, "one call per site (3 sites)");
    assert_eq!(observations(&records).len(), 3);
}

#[test]
fn observe_mode_records_without_checking() {
    let dir = tempfile::tempdir().unwrap();
    let (_, records) = checked_run(dir.path(), "linear", &[("QUANTSHADOW_MODE", "observe")]);
    let obs = observations(&records);
    assert_eq!(obs.len(), 3);
    assert!(obs.iter().all(|o| o.metrics.is_none() && o.mode.name() == "observe"));
}

#[test]
fn missing_collector_neither_hangs_nor_fails_the_program() {
    let plain = fixture("model", &[], false);
    let t0 = Instant::now();
    let out = fixture(
        "model",
        &[("QUANTSHADOW_COLLECTOR", "unix:/nonexistent/dir/c.sock"), ("QUANTSHADOW_LOG", "info")],
        true,
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "took {:?}", t0.elapsed());
    assert_eq!(stdout(&out), stdout(&plain));
    let err = stderr(&out);
    assert!(err.contains("dropped"), "the closing line counts drops: {err}");
}

#[test]
fn a_run_file_held_by_another_process_is_named_and_nothing_is_lost() {
    use quantshadow_runtime::transport::{Client, ClientOptions};
    let dir = tempfile::tempdir().unwrap();
    let shared = dir.path().join("shared.qsr");
    // This test process holds the file first (a rank or worker given the same path).
    let holder = Client::start(Address::File(shared.clone()), ClientOptions::default());
    assert!(holder.send(b"from the holder".to_vec()));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !shared.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    let plain = fixture("linear", &[], false);
    let address = format!("file:{}", shared.display());
    let out = fixture("linear", &[("QUANTSHADOW_COLLECTOR", address.as_str())], true);
    assert_eq!(stdout(&out), stdout(&plain));
    // The shim has no tracing subscriber: the transport's warning must reach its own log.
    let err = stderr(&out);
    assert!(err.contains("is held by another process; this process writes"), "{err}");
    holder.close(|_| b"closing".to_vec(), Duration::from_secs(5));
    let own: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p != &shared && p.to_string_lossy().starts_with(&*shared.to_string_lossy()))
        .collect();
    assert_eq!(own.len(), 1, "one per-process file: {own:?}");
    let run = load_run_file(&own[0]).unwrap();
    assert_eq!(closing(&run.records).len(), 1, "the shim's run, closing record included, is in {own:?}");
}

#[test]
fn invalid_environment_gives_one_line_and_safe_defaults() {
    let plain = fixture("linear", &[], false);
    let out = fixture("linear", &[("QUANTSHADOW_MODE", "fastest"), ("QUANTSHADOW_SAMPLE", "often")], true);
    assert_eq!(stdout(&out), stdout(&plain));
    let err = stderr(&out);
    assert_eq!(err.matches("QUANTSHADOW_MODE=\"fastest\"").count(), 1, "{err}");
    assert_eq!(err.matches("QUANTSHADOW_SAMPLE=\"often\"").count(), 1, "{err}");
}

#[test]
fn kernel_choices_are_validated_and_early_starts_reported() {
    let plain = fixture("linear", &[], false);
    // A typo is named once and changes nothing the program sees.
    let out =
        fixture("linear", &[("QUANTSHADOW_SKETCH_LEAN", "graph"), ("QUANTSHADOW_EARLY_START", "yes")], true);
    assert_eq!(stdout(&out), stdout(&plain));
    let err = stderr(&out);
    assert_eq!(err.matches("QUANTSHADOW_SKETCH_LEAN=\"graph\" is not 0, 1 or graphs").count(), 1, "{err}");
    assert_eq!(err.matches("QUANTSHADOW_EARLY_START=\"yes\" is not 0 or 1").count(), 1, "{err}");
    assert!(!err.contains("early start:"), "off: no early-start line: {err}");
    // Asked for where it cannot happen (the host device): the closing lines say none started.
    let out = fixture("linear", &[("QUANTSHADOW_EARLY_START", "1"), ("QUANTSHADOW_LOG", "info")], true);
    assert_eq!(stdout(&out), stdout(&plain));
    let err = stderr(&out);
    assert!(err.contains("early start: 0 launches started early (none: not supported here"), "{err}");
}

#[test]
fn mode_off_is_inert() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("never.qsr");
    let address = format!("file:{}", run.display());
    let out = fixture("linear", &[("QUANTSHADOW_MODE", "off"), ("QUANTSHADOW_COLLECTOR", &address)], true);
    assert_eq!(stdout(&out), stdout(&fixture("linear", &[], false)));
    assert!(!run.exists() && std::fs::read_dir(dir.path()).unwrap().next().is_none(), "nothing written");
}

#[test]
fn a_program_without_gemms_starts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("never.qsr");
    let out = Command::new("/bin/sh")
        .args(["-c", "echo hello"])
        .env("LD_PRELOAD", shim())
        .env("QUANTSHADOW_COLLECTOR", format!("file:{}", run.display()))
        .env("QUANTSHADOW_LOG", "debug")
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n");
    assert!(out.stderr.is_empty(), "no log line: {}", String::from_utf8_lossy(&out.stderr));
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "no file");
}

#[test]
fn two_threads_and_a_child_process_are_all_checked() {
    let dir = tempfile::tempdir().unwrap();
    let plain = fixture("threads", &[], false);
    let (out, records) = checked_run(dir.path(), "threads", &[]);
    assert_eq!(stdout(&out), stdout(&plain));
    let c = closing(&records)[0];
    assert_eq!(c.calls_seen, 32, "both threads' calls");

    let dir = tempfile::tempdir().unwrap();
    let plain = fixture("fork", &[], false);
    let (out, records) = checked_run(dir.path(), "fork", &[]);
    assert_eq!(stdout(&out), stdout(&plain));
    let sessions = records.iter().filter(|r| matches!(r, Record::Session(_))).count();
    assert_eq!(closing(&records).len(), 2, "parent and exec'd child each close their session");
    assert!(sessions >= 2);

    // fork() without exec: the child passes through (its engine's threads did not survive).
    let dir = tempfile::tempdir().unwrap();
    let plain = fixture("forkonly", &[], false);
    let (out, records) = checked_run(dir.path(), "forkonly", &[]);
    assert_eq!(stdout(&out), stdout(&plain));
    assert_eq!(closing(&records).len(), 1);
}
