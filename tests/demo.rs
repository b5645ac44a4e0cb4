//! End to end on the CPU: `quantshadow demo` runs the fixture vendor BLAS with planted faults,
//! streams records to a collector, and the report must fail exactly the planted sites.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn quantshadow() -> Command {
    Command::new(env!("CARGO_BIN_EXE_quantshadow"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn demo_fails_exactly_the_planted_sites() {
    let dir = tempfile::tempdir().unwrap();
    let out = quantshadow().args(["demo", "--out"]).arg(dir.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "demo failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("the report fails exactly the planted sites"), "{stdout}");

    let report = read(&dir.path().join("report.md"));
    for (config, verdict) in [
        ("bf16", "PASS"),
        ("fp8-tensorwise", "PASS"),
        ("nvfp4", "PASS"),
        ("fp8-rowwise", "FAIL"),
        ("fp8-block128", "FAIL"),
        ("mxfp4", "FAIL"),
        ("w4a16-int4", "FAIL"),
    ] {
        assert!(
            report.contains(&format!(
                "## `{config}`: {} {verdict}",
                if verdict == "PASS" { "✅" } else { "❌" }
            )),
            "{config}"
        );
    }
    // Each planted fault shows up with the symptom that identifies it.
    assert!(report.contains("norm ratio 0.5000"), "fn-as-fnuz is an exact factor of 2");
    assert!(report.contains("production has 1 NaN"), "the NaN fault");
    assert!(report.contains("A few bad rows: tile-boundary bug"), "tile-rows");
    assert!(report.contains("Output is zero"), "zero output");
    assert!(dir.path().join("report.heatmap.svg").exists());
    let json: serde_json::Value = serde_json::from_str(&read(&dir.path().join("report.json"))).unwrap();
    assert_eq!(json["verdict"], "FAIL");

    // The run file stands on its own: `quantshadow report` on it gives the same verdict (exit 1).
    let again = quantshadow().arg("report").arg(dir.path().join("run.qsr")).output().unwrap();
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stdout).contains("model.layers.2.mlp.down_proj"));
}

#[test]
fn demo_streams_to_an_external_collector() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("c.sock");
    let run_file = dir.path().join("ext.qsr");
    let mut collector = quantshadow()
        .args(["collect", "--quiet", "--listen"])
        .arg(format!("unix:{}", socket.display()))
        .arg("--out")
        .arg(&run_file)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let demo = quantshadow()
        .args(["demo", "--out"])
        .arg(dir.path().join("demo"))
        .arg("--collector")
        .arg(format!("unix:{}", socket.display()))
        .output()
        .unwrap();
    // SIGTERM: the collector flushes and exits 0.
    unsafe { libc::kill(collector.id() as i32, libc::SIGTERM) };
    let status = collector.wait().unwrap();
    assert!(demo.status.success(), "{}", String::from_utf8_lossy(&demo.stderr));
    assert!(status.success());
    let report = quantshadow().arg("report").arg(&run_file).output().unwrap();
    assert_eq!(report.status.code(), Some(1), "{}", String::from_utf8_lossy(&report.stderr));
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(text.contains("4 of 7 configurations do not pass"), "{text}");
}

#[test]
fn demo_rejects_a_bad_collector_address() {
    let out = quantshadow().args(["demo", "--collector", "carrier-pigeon:x"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad --collector address"));
}

#[test]
fn demo_fails_when_no_collector_receives_the_records() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nobody-listens.sock");
    let out = quantshadow()
        .args(["demo", "--out"])
        .arg(dir.path().join("out"))
        .arg("--collector")
        .arg(format!("unix:{}", socket.display()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("records were dropped"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn demo_keeps_an_existing_run_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("run.qsr"), b"somebody's run").unwrap();
    let out = quantshadow().args(["demo", "--out"]).arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(dir.path().join("run.qsr.prev")).unwrap(), b"somebody's run");
}
