//! `quantshadow report` end to end: run files on disk -> the binary -> markdown, SVG, JSON and
//! the exit code.
//!
//! Run files are written here frame by frame in the documented layout (runtime/src/runfile.rs:
//! a 12-byte header `QSHADOW\x1a` + format version u32 LE, then frames of payload length u32
//! LE, CRC-32 u32 LE, payload) so that a torn tail can be made byte-exactly, and so that the
//! reader is checked against the layout rather than against its own writer.

use quantshadow_runtime::formats::Format;
use quantshadow_runtime::metrics::{sqnr_db, Metrics, WorstRow};
use quantshadow_runtime::problem::{GemmProblem, ScaleGranularity, ScaleSpec};
use quantshadow_runtime::record::{
    encode, CheckMode, ClosingRecord, GemmObservation, KeyValue, ProblemSummary, Record, SessionRecord,
};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MAGIC: &[u8; 8] = b"QSHADOW\x1a";
const FORMAT_VERSION: u32 = 1;

/// CRC-32 (IEEE 802.3, reflected, as crc32fast computes it), bit by bit: test data is small.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= byte as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

#[test]
fn crc32_matches_the_standard_check_value() {
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
}

fn run_file_bytes(version: u32, records: &[Record]) -> Vec<u8> {
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&version.to_le_bytes());
    for record in records {
        let payload = encode(record);
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&crc32(&payload).to_le_bytes());
        bytes.extend_from_slice(&payload);
    }
    bytes
}

fn write_run_file(dir: &Path, name: &str, records: &[Record]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, run_file_bytes(FORMAT_VERSION, records)).unwrap();
    path
}

fn session(id: u64, label: &str, rank: i32) -> Record {
    Record::Session(SessionRecord {
        session_id: id,
        host: "node3".into(),
        pid: 4000 + id as u32,
        rank,
        device_name: "MI355X".into(),
        device_arch: "gfx950".into(),
        library_versions: vec![KeyValue { key: "torch".into(), value: "2.11.0".into() }],
        label: label.into(),
        start_time_ns: 10,
        settings: vec![KeyValue { key: "mode".into(), value: "rows".into() }],
    })
}

fn closing(id: u64, checked: u64) -> Record {
    Record::Closing(ClosingRecord {
        session_id: id,
        calls_seen: 100,
        sampled: checked,
        checked,
        skipped: Vec::new(),
        dropped: 0,
        end_time_ns: 20,
    })
}

fn fp8_problem(m: u64) -> ProblemSummary {
    let mut p = GemmProblem::row_major(m, 2048, 2048, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
    p.a_scale = Some(ScaleSpec::new(ScaleGranularity::Block { outer: 1, inner: 128 }, Format::F32));
    p.b_scale = Some(ScaleSpec::new(ScaleGranularity::Block { outer: 128, inner: 128 }, Format::F32));
    ProblemSummary::from(&p)
}

fn metrics(cosine: f64, nmse: f64, norm_ratio: f64) -> Metrics {
    Metrics {
        cosine,
        nmse,
        sqnr_db: sqnr_db(nmse),
        norm_ratio,
        max_abs_err: 0.25,
        worst_row: Some(WorstRow { index: 3, cosine: cosine.min(0.9999) }),
        nan_prod: 0,
        inf_prod: 0,
        nan_ref: 0,
        inf_ref: 0,
        count: 64 * 2048,
    }
}

fn healthy() -> Metrics {
    metrics(0.99996, 8e-5, 1.0001)
}

const LAYERS: u32 = 4;

fn site_name(layer: u32) -> String {
    format!("model.layers.{layer}.self_attn.o_proj")
}

/// One process of configuration `label`: a call per layer with `metrics_for(layer)`.
fn process(id: u64, label: &str, rank: i32, metrics_for: impl Fn(u32) -> Metrics) -> Vec<Record> {
    let mut records = vec![session(id, label, rank)];
    for layer in 0..LAYERS {
        records.push(Record::Observation(GemmObservation {
            session_id: id,
            site_id: 0xa000 + layer as u64,
            site_ordinal: layer,
            site_name: Some(site_name(layer)),
            call_seq: 10 + layer as u64,
            entry_point: "hipblasLtMatmul".into(),
            backend: Some(if label.contains("asm") { "asm_a8w8_gfx950".into() } else { "hipblaslt".into() }),
            problem: fp8_problem(64),
            mode: CheckMode::Rows,
            metrics: Some(metrics_for(layer)),
            rows_checked: 64,
            sketch_seed: 1,
            sketch_prod: Vec::new(),
            sketch_ref: Vec::new(),
            logits: None,
            logits_rows: Vec::new(),
            flags: 0,
            timestamp_ns: 15,
        }));
    }
    records.push(closing(id, LAYERS as u64));
    records
}

fn quantshadow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_quantshadow")).args(args).output().expect("the binary runs")
}

fn code(output: &Output) -> i32 {
    output.status.code().expect("exited, not killed")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn arg(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}

// ---- bad usage and bad input: exit 2 with a message --------------------------------------------

#[test]
fn no_run_file_is_a_usage_error() {
    let output = quantshadow(&["report"]);
    assert_eq!(code(&output), 2, "{}", stderr(&output));
    assert!(stderr(&output).contains("FILE.qsr"), "{}", stderr(&output));
}

#[test]
fn a_missing_file_exits_2_and_names_it() {
    let output = quantshadow(&["report", "/nonexistent/run.qsr"]);
    assert_eq!(code(&output), 2);
    assert!(stderr(&output).contains("/nonexistent/run.qsr: no such file"), "{}", stderr(&output));
}

#[test]
fn a_file_that_is_not_a_run_file_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, "these are notes, not records\n").unwrap();
    let output = quantshadow(&["report", arg(&path)]);
    assert_eq!(code(&output), 2);
    assert!(stderr(&output).contains("not a quantshadow run file"), "{}", stderr(&output));
}

#[test]
fn a_bad_thresholds_file_exits_2_before_reading_runs() {
    let dir = tempfile::tempdir().unwrap();
    let thresholds = dir.path().join("t.toml");
    std::fs::write(&thresholds, "[fp8]\ncosin_min = 0.9\n").unwrap();
    // The run file does not even exist: thresholds are checked first.
    let output = quantshadow(&["report", "/nonexistent/run.qsr", "--thresholds", arg(&thresholds)]);
    assert_eq!(code(&output), 2);
    assert!(stderr(&output).contains("unknown key cosin_min"), "{}", stderr(&output));
}

#[test]
fn the_same_file_twice_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let run = write_run_file(dir.path(), "a.qsr", &process(1, "fp8", 0, |_| healthy()));
    let same = dir.path().join(".").join("a.qsr");
    let output = quantshadow(&["report", arg(&run), arg(&same)]);
    assert_eq!(code(&output), 2);
    assert!(stderr(&output).contains("is given more than once"), "{}", stderr(&output));
}

#[test]
fn an_unsupported_run_file_version_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("future.qsr");
    std::fs::write(&path, run_file_bytes(99, &process(1, "fp8", 0, |_| healthy()))).unwrap();
    let output = quantshadow(&["report", arg(&path)]);
    assert_eq!(code(&output), 2);
    assert!(stderr(&output).contains("version 99"), "{}", stderr(&output));
}

#[test]
fn an_empty_run_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_run_file(dir.path(), "empty.qsr", &[]);
    let output = quantshadow(&["report", arg(&path)]);
    assert_eq!(code(&output), 2);
    assert!(stderr(&output).contains("empty run"), "{}", stderr(&output));
}

#[test]
fn an_unwritable_output_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let run = write_run_file(dir.path(), "a.qsr", &process(1, "fp8", 0, |_| healthy()));
    let output = quantshadow(&["report", arg(&run), "--out", "/nonexistent/dir/report.md"]);
    assert_eq!(code(&output), 2);
    assert!(stderr(&output).contains("cannot write /nonexistent/dir/"), "{}", stderr(&output));
}

// ---- verdicts and content ----------------------------------------------------------------------

#[test]
fn all_passing_configurations_exit_0() {
    let dir = tempfile::tempdir().unwrap();
    let mut records = process(1, "fp8-ck", 0, |_| healthy());
    records.extend(process(2, "fp8-ck", 1, |_| healthy()));
    let run = write_run_file(dir.path(), "pass.qsr", &records);
    let out = dir.path().join("report.md");
    let output = quantshadow(&["report", arg(&run), "--out", arg(&out)]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let md = std::fs::read_to_string(&out).unwrap();
    assert!(md.contains("**Verdict: ✅ PASS**: all 1 configuration pass."), "{md}");
    assert!(stderr(&output).contains("PASS: all 1 configurations pass"), "{}", stderr(&output));
}

/// Three configurations over two files: a good one, the fn/fnuz factor of 2 on every layer,
/// and a garbage backend on layer 2; the good one has a second rank in the other file.
fn mixed_runs(dir: &Path) -> Vec<PathBuf> {
    let mut first = process(1, "fp8-hipblaslt", 0, |_| healthy());
    first.extend(process(2, "fp8-fnuz-mixup", 0, |_| metrics(1.0, 0.25, 0.5)));
    let mut second =
        process(3, "fp8-asm", 0, |layer| if layer == 2 { metrics(0.006, 1.7, 1.3) } else { healthy() });
    second.extend(process(4, "fp8-hipblaslt", 1, |_| healthy()));
    vec![write_run_file(dir, "run-a.qsr", &first), write_run_file(dir, "run-b.qsr", &second)]
}

#[test]
fn report_names_failing_sites_with_reasons_and_links_its_heatmap() {
    let dir = tempfile::tempdir().unwrap();
    let runs = mixed_runs(dir.path());
    let out = dir.path().join("report.md");
    let json = dir.path().join("report.json");
    let output =
        quantshadow(&["report", arg(&runs[0]), arg(&runs[1]), "--out", arg(&out), "--json", arg(&json)]);
    assert_eq!(code(&output), 1, "{}", stderr(&output));
    assert!(
        stderr(&output)
            .contains("FAIL: 2 of 3 configurations do not pass: fp8-fnuz-mixup (FAIL), fp8-asm (FAIL)"),
        "{}",
        stderr(&output)
    );

    let md = std::fs::read_to_string(&out).unwrap();
    assert!(md.contains("| `fp8-hipblaslt` | ✅ PASS | 4 | 8 |"), "{md}");
    assert!(
        md.contains("| `fp8-fnuz-mixup` | ❌ FAIL | 4 | 4 | 1.000000 | 1.000000 | 2.50e-01 | 0.5000 | 4 |"),
        "{md}"
    );
    assert!(md.contains("| `fp8-asm` | ❌ FAIL | 4 | 4 | 0.006000 |"), "{md}");
    // The failing site, its reason in words, and the advice for each failure pattern.
    assert!(md.contains(&format!("**`{}`** (#2, `hipblasLtMatmul`", site_name(2))), "{md}");
    assert!(md.contains("cosine 0.006000 is below 0.999"), "{md}");
    assert!(md.contains("norm ratio 0.5000 is off by more than 0.01: an exact factor of 0.5"), "{md}");
    assert!(md.contains("**Backend returns garbage**") && md.contains("`asm_a8w8_gfx950`"), "{md}");
    assert!(md.contains("**Exact power-of-two factor: FP8 variant mix-up**"), "{md}");

    // The heatmap: next to the report, linked relatively, one cell per site and configuration.
    let svg_path = dir.path().join("report.heatmap.svg");
    assert!(md.contains("](<report.heatmap.svg>)"), "{md}");
    let svg = std::fs::read_to_string(&svg_path).expect("heatmap written next to the report");
    assert!(svg.starts_with("<svg") && !svg.contains("<script"));
    assert_eq!(svg.matches("<g><title>").count(), (LAYERS * 3) as usize);

    // JSON: parseable, with the same verdicts.
    let value: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(value["verdict"], "FAIL");
    let verdicts: Vec<(String, String)> = value["configurations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["label"].as_str().unwrap().to_string(), c["verdict"].as_str().unwrap().to_string()))
        .collect();
    let expected = [("fp8-hipblaslt", "PASS"), ("fp8-fnuz-mixup", "FAIL"), ("fp8-asm", "FAIL")];
    assert_eq!(verdicts, expected.map(|(l, v)| (l.to_string(), v.to_string())));
    assert_eq!(value["configurations"][0]["counters"]["sessions"], 2);
}

#[test]
fn markdown_goes_to_stdout_without_out() {
    let dir = tempfile::tempdir().unwrap();
    let runs = mixed_runs(dir.path());
    let output = quantshadow(&["report", arg(&runs[0])]);
    assert_eq!(code(&output), 1, "{}", stderr(&output));
    let md = String::from_utf8(output.stdout).unwrap();
    assert!(md.starts_with("# quantshadow report"), "{md}");
    assert!(md.contains("No heatmap SVG was written"), "{md}");
    assert!(!dir.path().join("report.heatmap.svg").exists());
}

#[test]
fn a_thresholds_override_changes_the_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let run = write_run_file(dir.path(), "a.qsr", &process(1, "fp8", 0, |_| metrics(0.9993, 1e-3, 1.0)));
    assert_eq!(code(&quantshadow(&["report", arg(&run)])), 0);
    let strict = dir.path().join("strict.toml");
    std::fs::write(&strict, "[fp8]\ncosine_min = 0.9999\n").unwrap();
    let output = quantshadow(&["report", arg(&run), "--thresholds", arg(&strict)]);
    assert_eq!(code(&output), 1, "{}", stderr(&output));
    let md = String::from_utf8(output.stdout).unwrap();
    assert!(md.contains("cosine 0.999300 is below 0.9999"), "{md}");
    assert!(md.contains("Thresholds (from `"), "{md}");
}

#[test]
fn introduced_nan_fails() {
    let dir = tempfile::tempdir().unwrap();
    let run = write_run_file(
        dir.path(),
        "nan.qsr",
        &process(1, "fp8-tp2", 0, |layer| {
            let mut m = healthy();
            if layer == 1 {
                m.nan_prod = 7;
            }
            m
        }),
    );
    let output = quantshadow(&["report", arg(&run)]);
    assert_eq!(code(&output), 1, "{}", stderr(&output));
    let md = String::from_utf8(output.stdout).unwrap();
    assert!(md.contains("production has 7 NaN and 0 Inf values the reference does not have"), "{md}");
    assert!(md.contains("**NaN/Inf introduced**"), "{md}");
}

#[test]
fn a_configuration_without_checks_is_no_data_and_exits_1() {
    let dir = tempfile::tempdir().unwrap();
    let run = write_run_file(dir.path(), "idle.qsr", &[session(1, "idle", 0), closing(1, 0)]);
    let output = quantshadow(&["report", arg(&run)]);
    assert_eq!(code(&output), 1, "{}", stderr(&output));
    let md = String::from_utf8(output.stdout).unwrap();
    assert!(md.contains("| `idle` | ⚠️ NO DATA | 0 | 0 |"), "{md}");
}

#[test]
fn a_torn_run_file_is_reported_and_its_intact_records_used() {
    let dir = tempfile::tempdir().unwrap();
    let records = process(1, "fp8", 0, |_| healthy());
    let mut bytes = run_file_bytes(FORMAT_VERSION, &records);
    let intact = bytes.len() as u64;
    // A writer killed mid-frame: a header announcing 500 bytes, and only 10 of them.
    bytes.extend_from_slice(&500u32.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.extend_from_slice(&[0u8; 10]);
    let path = dir.path().join("torn.qsr");
    std::fs::write(&path, bytes).unwrap();

    let output = quantshadow(&["report", arg(&path)]);
    assert_eq!(code(&output), 0, "what was intact passes: {}", stderr(&output));
    let warning = format!("torn tail at byte {intact}");
    assert!(stderr(&output).contains(&warning), "{}", stderr(&output));
    let md = String::from_utf8(output.stdout).unwrap();
    assert!(md.contains(&warning) && md.contains("the 6 intact records before it are reported"), "{md}");
    assert!(md.contains("| `fp8` | ✅ PASS | 4 | 4 |"), "{md}");
}

#[test]
fn a_session_cut_off_before_its_closing_record_is_called_out() {
    let dir = tempfile::tempdir().unwrap();
    let mut records = process(1, "fp8", 0, |_| healthy());
    records.pop();
    let run = write_run_file(dir.path(), "crash.qsr", &records);
    let output = quantshadow(&["report", arg(&run)]);
    assert_eq!(code(&output), 0, "{}", stderr(&output));
    let md = String::from_utf8(output.stdout).unwrap();
    assert!(md.contains("ended without closing record (crashed or killed?)"), "{md}");
    assert!(md.contains("**Incomplete run**"), "{md}");
}

#[test]
fn outputs_never_overwrite_inputs_or_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run.qsr");
    let demo = Command::new(env!("CARGO_BIN_EXE_quantshadow"))
        .args(["demo", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(demo.status.success());
    let before = std::fs::read(&run).unwrap();
    for extra in [
        vec!["--out".to_string(), run.display().to_string()],
        vec!["--json".to_string(), run.display().to_string()],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_quantshadow"))
            .arg("report")
            .arg(&run)
            .args(&extra)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("is one of the input run files"));
    }
    let same = dir.path().join("same.md");
    let out = Command::new(env!("CARGO_BIN_EXE_quantshadow"))
        .arg("report")
        .arg(&run)
        .arg("--out")
        .arg(&same)
        .arg("--json")
        .arg(dir.path().join(".").join("same.md"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("are the same file"));
    assert_eq!(std::fs::read(&run).unwrap(), before, "the run file is untouched");
}

// ---- issue 6: backend policy at report time, diagnoses through the run file -----------------------

const CK_FREE_POLICY: &str = r#"
[[rule]]
name = "CK-free: every FP8 GEMM by Triton"
when = { env = { ATOM_CK_FREE = "1" } }
sites = { a_format = "e4m3*" }
require = { kernel = "*triton*" }
"#;

const NO_ASM_POLICY: &str = r#"
[[rule]]
name = "no ASM GEMM on gfx950"
why = "the ASM a8w8 GEMM returned garbage on gfx950"
when = { arch = "gfx950*" }
deny = { kernel = "*asm*" }
"#;

#[test]
fn a_bad_policy_file_exits_2_before_reading_runs() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, "[[rule]]\nname = \"x\"\n").unwrap();
    let output = quantshadow(&["report", "/nonexistent/run.qsr", "--policy", arg(&policy)]);
    assert_eq!(code(&output), 2, "{}", stderr(&output));
    assert!(
        stderr(&output)
            .contains(&format!("policy {}: rule \"x\" has neither `deny` nor `require`", policy.display())),
        "{}",
        stderr(&output)
    );
}

#[test]
fn a_report_time_policy_fails_on_decided_rules_and_warns_on_undecided_ones() {
    let dir = tempfile::tempdir().unwrap();
    // The fp8-asm configuration's layers are served by `asm_a8w8_gfx950` on gfx950; the run
    // recorded no policy, hence no environment.
    let run = write_run_file(dir.path(), "asm.qsr", &process(1, "fp8-asm", 0, |_| healthy()));
    let undecided = dir.path().join("ck-free.toml");
    std::fs::write(&undecided, CK_FREE_POLICY).unwrap();
    let output = quantshadow(&["report", arg(&run), "--policy", arg(&undecided)]);
    assert_eq!(code(&output), 0, "an undecided rule never fails: {}", stderr(&output));
    assert!(
        stderr(&output).contains(&format!(
            "warning: fp8-asm: policy {}: rule \"CK-free: every FP8 GEMM by Triton\" cannot be decided: the run did not record ATOM_CK_FREE",
            undecided.display()
        )),
        "{}",
        stderr(&output)
    );

    let deny = dir.path().join("no-asm.toml");
    std::fs::write(&deny, NO_ASM_POLICY).unwrap();
    let out = dir.path().join("report.md");
    let json = dir.path().join("report.json");
    let output =
        quantshadow(&["report", arg(&run), "--policy", arg(&deny), "--out", arg(&out), "--json", arg(&json)]);
    assert_eq!(code(&output), 1, "{}", stderr(&output));
    let md = std::fs::read_to_string(&out).unwrap();
    assert!(md.contains("❌ FAIL: rule \"no ASM GEMM on gfx950\" is broken at 4 sites.\n"), "{md}");
    assert!(
        md.contains(&format!(
            "1. site 0 was served by kernel `asm_a8w8_gfx950` via `hipblasLtMatmul`, which rule \"no ASM GEMM on gfx950\" denies (kernel = \"\\*asm\\*\") (`{}`). Why: the ASM a8w8 GEMM returned garbage on gfx950.\n",
            site_name(0)
        )),
        "{md}"
    );
    let value: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(value["policy_file"], deny.display().to_string());
    assert_eq!(value["configurations"][0]["policy"]["violations"].as_array().unwrap().len(), LAYERS as usize);
    assert_eq!(value["configurations"][0]["policy"]["violations"][0]["source"], "report");
}

#[test]
fn a_diagnosis_record_in_a_run_file_reaches_the_report() {
    use quantshadow_runtime::record::{DiagnosisRecord, ReadingSummary};
    let dir = tempfile::tempdir().unwrap();
    let mut records =
        process(1, "fp8-shuffle", 0, |layer| if layer == 3 { metrics(0.41, 1.2, 1.0) } else { healthy() });
    let reading = |id: &str, description: &str, cosine: f64, explains: bool| ReadingSummary {
        id: id.into(),
        description: description.into(),
        declared: id == "declared",
        cosine,
        nmse: 1.0 - cosine,
        norm_ratio: 1.0,
        nonfinite_mismatch: 0,
        explains,
    };
    records.push(Record::Diagnosis(DiagnosisRecord {
        session_id: 1,
        site_id: 0xa003,
        site_ordinal: 3,
        call_seq: 13,
        rows: 64,
        readings: vec![
            reading("a-scales-swizzled", "A scales read pre-shuffled (128x4 swizzled)", 0.99997, true),
            reading("declared", "the declared contract", 0.41, false),
        ],
        skipped: Vec::new(),
        explanation: Some("a-scales-swizzled".into()),
        equivalent: Vec::new(),
        text: "production matches the reference with A scales read pre-shuffled (128x4 swizzled): cosine 0.99997, norm ratio 1.000; declared layout gives cosine 0.41, norm ratio 1.000".into(),
        recommendation: Some("pre-shuffled vs plain scales: check the shuffle_scale / swizzle step".into()),
        error_map: None,
        scale_layout: vec!["A scales: 1x128 blocks, grid 64x16, f32, OuterMajor, ld 16, 1024 entries".into()],
        timestamp_ns: 30,
    }));
    let run = write_run_file(dir.path(), "diag.qsr", &records);
    let output = quantshadow(&["report", arg(&run)]);
    assert_eq!(code(&output), 1, "{}", stderr(&output));
    let md = String::from_utf8(output.stdout.clone()).unwrap();
    assert!(
        md.contains(&format!(
            "❌ FAIL: 1 of 4 sites fails their fp8 thresholds; the failing site, `{}` (cosine 0.410000), is explained by A scales read pre-shuffled (128x4 swizzled).\n",
            site_name(3)
        )),
        "{md}"
    );
    assert!(
        md.contains(
            "- **What to check**: Pre-shuffled vs plain scales: check the shuffle\\_scale / swizzle step.\n"
        ),
        "{md}"
    );
    assert!(md.contains("| A scales read pre-shuffled (128x4 swizzled) (`a-scales-swizzled`) | 0.999970 | 3.00e-05 | 1.0000 | ✅ best explanation |\n"), "{md}");
    assert!(
        md.contains("- A scales: 1x128 blocks, grid 64x16, f32, OuterMajor, ld 16, 1024 entries\n"),
        "{md}"
    );
    assert!(!stderr(&output).contains("warning"), "{}", stderr(&output));
}
