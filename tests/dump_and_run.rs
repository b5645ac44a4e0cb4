//! `quantshadow dump` and `quantshadow run` through the binary: what a run file lost is said on
//! stderr and counted in the summary line; `run` refuses a bad thresholds file before starting
//! the program, and says why there is no report even when the program failed.

use quantshadow_runtime::record::{encode, ClosingRecord, Record, SessionRecord};
use quantshadow_runtime::runfile::{RunWriter, FRAME_HEADER_LEN, HEADER_LEN};
use std::ffi::OsStr;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output};

fn quantshadow<S: AsRef<OsStr>>(args: &[S]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_quantshadow")).args(args).output().expect("the binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn session(id: u64) -> Record {
    Record::Session(SessionRecord {
        session_id: id,
        host: "testhost".into(),
        pid: 1000 + id as u32,
        rank: -1,
        device_name: "host".into(),
        device_arch: "x86_64".into(),
        library_versions: vec![],
        label: "lossy".into(),
        start_time_ns: 1,
        settings: vec![],
    })
}

fn closing(id: u64, end_time_ns: u64) -> Record {
    Record::Closing(ClosingRecord {
        session_id: id,
        calls_seen: 0,
        sampled: 0,
        checked: 0,
        skipped: vec![],
        dropped: 0,
        end_time_ns,
    })
}

/// A run file that lost data three ways: a payload that is not a record, a damaged frame in
/// the middle, and a torn tail. Two records survive intact.
fn lossy_run_file(path: &Path) {
    let payloads =
        [encode(&session(1)), b"not a record".to_vec(), encode(&closing(1, 2)), encode(&closing(1, 3))];
    let (mut w, _) = RunWriter::open_append(path).unwrap();
    for p in &payloads {
        w.append(p).unwrap();
    }
    w.finish().unwrap();
    let mut bytes = std::fs::read(path).unwrap();
    let third_payload = HEADER_LEN as usize
        + payloads[..2].iter().map(|p| FRAME_HEADER_LEN + p.len()).sum::<usize>()
        + FRAME_HEADER_LEN;
    bytes[third_payload + 4] ^= 0xff; // its CRC no longer matches
    bytes.extend_from_slice(&[200, 0, 0, 0, 1, 2, 3]); // half a frame, as a crash leaves it
    std::fs::File::create(path).unwrap().write_all(&bytes).unwrap();
}

#[test]
fn dump_says_what_the_files_lost_and_counts_it_at_the_end_of_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run.qsr");
    lossy_run_file(&run);

    let output = quantshadow(&[OsStr::new("dump"), OsStr::new("--summary"), run.as_os_str()]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        "sessions 1 observations 0 checked 0 failing_calls 0 failing_sites [] failing_names [] diagnoses 0 \
         explained [] injected 0 dropped 0 undecodable 1 damaged 1 torn 1\n"
    );
    let err = stderr(&output);
    assert!(err.contains("quantshadow dump: warning: ") && err.contains("torn tail at byte"), "{err}");
    assert!(err.contains("damaged data at byte"), "{err}");
    assert!(err.contains("1 records could not be decoded"), "{err}");

    // The records themselves: the same warnings, the two intact records.
    let output = quantshadow(&[OsStr::new("dump"), run.as_os_str()]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(stdout(&output).lines().count(), 2, "{}", stdout(&output));
    assert!(stderr(&output).contains("torn tail at byte"), "{}", stderr(&output));
}

#[test]
fn run_refuses_a_bad_thresholds_file_before_starting_the_program() {
    let dir = tempfile::tempdir().unwrap();
    let thresholds = dir.path().join("thresholds.toml");
    std::fs::write(&thresholds, "[fp9]\ncosine_min = 0.99\n").unwrap();
    // Any file passes the shim check; an empty one is ignored by the dynamic loader.
    let shim = dir.path().join("shim.so");
    std::fs::write(&shim, b"").unwrap();
    let ran = dir.path().join("ran");
    let out = dir.path().join("out");
    let output = quantshadow(&[
        OsStr::new("run"),
        OsStr::new("--thresholds"),
        thresholds.as_os_str(),
        OsStr::new("--shim"),
        shim.as_os_str(),
        OsStr::new("--out"),
        out.as_os_str(),
        OsStr::new("--"),
        OsStr::new("touch"),
        ran.as_os_str(),
    ]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(err.contains("quantshadow run: error: ") && err.contains("[fp9]"), "{err}");
    assert!(!ran.exists(), "the program ran before the thresholds were checked");
    assert!(!out.exists(), "{} was created for a run that never started", out.display());
}

#[test]
fn run_says_why_there_is_no_report_when_the_program_failed_too() {
    let dir = tempfile::tempdir().unwrap();
    let shim = dir.path().join("shim.so");
    std::fs::write(&shim, b"").unwrap();
    let out = dir.path().join("out");
    let output = quantshadow(&[
        OsStr::new("run"),
        OsStr::new("--shim"),
        shim.as_os_str(),
        OsStr::new("--out"),
        out.as_os_str(),
        OsStr::new("--"),
        OsStr::new("sh"),
        OsStr::new("-c"),
        OsStr::new("exit 3"),
    ]);
    // The program's exit code wins; the report (of a run without records) could not be made.
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(err.contains("the program failed"), "{err}");
    assert!(err.contains("quantshadow run: error: report: ") && err.contains("empty run"), "{err}");
}
