//! The known-bug catalog on the CPU (issue 6): every `QUANTSHADOW_INJECT` class planted into
//! real calls of the fixture program under the real shim (host backend), then: flagged at the
//! planted site and nowhere else, the other sites' outputs unchanged, and the diagnosis names
//! the planted reading (scale-transpose, scale-ignore, fn-as-fnuz, no-transpose) or locates
//! the bad rows (tile-rows). Honest runs pass with no diagnosis.

use quantshadow_cli::collect::Collector;
use quantshadow_cli::report::load_run_file;
use quantshadow_runtime::problem::ScaleStorage;
use quantshadow_runtime::record::{flags, DiagnosisRecord, GemmObservation, Record};
use quantshadow_runtime::thresholds::Thresholds;
use quantshadow_runtime::transport::Address;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Output};

const FIXTURE_HOST: &str = env!("QUANTSHADOW_FIXTURE_HOST");
const QUANTSHADOW: &str = env!("CARGO_BIN_EXE_quantshadow");

/// Sites by first appearance: 0-2 bf16 GemmEx (33 tokens), 3 FP8 tensor-wise, 4 FP8 row-wise,
/// 5 FP8 DeepSeek block scales, 6 a square bf16 cuBLASLt layer, 7-9 bf16 GemmEx with 300 tokens.
const SCENARIO: &str = "linear,fp8_tensor,fp8_row,fp8_block,square,big";
const SITES: u32 = 10;

fn shim() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().join("libquantshadow.so");
    assert!(p.is_file(), "{} missing: build with cargo test", p.display());
    p
}

fn fixture(env: &[(&str, &str)], preload: bool) -> Output {
    let mut cmd = Command::new(FIXTURE_HOST);
    cmd.arg(SCENARIO).env_remove("LD_PRELOAD");
    for (k, _) in std::env::vars() {
        if k.starts_with("QUANTSHADOW_") || k == "FIXTURE_VENDOR_FAULT" {
            cmd.env_remove(k);
        }
    }
    if preload {
        cmd.env("LD_PRELOAD", shim());
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().expect("fixture_host runs");
    assert!(out.status.success(), "fixture_host failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

/// Per call line of the fixture: (site ordinal = call number here, output hash).
fn call_hashes(out: &Output) -> BTreeMap<u32, String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&"call")).then(|| (f[1].parse().unwrap(), f[5].to_string()))
        })
        .collect()
}

struct Run {
    out: Output,
    records: Vec<Record>,
    dir: tempfile::TempDir,
}

impl Run {
    fn observations(&self) -> Vec<&GemmObservation> {
        self.records
            .iter()
            .filter_map(|r| match r {
                Record::Observation(o) => Some(o),
                _ => None,
            })
            .collect()
    }

    fn diagnoses(&self) -> Vec<&DiagnosisRecord> {
        self.records
            .iter()
            .filter_map(|r| match r {
                Record::Diagnosis(d) => Some(d),
                _ => None,
            })
            .collect()
    }

    fn failing_sites(&self) -> BTreeSet<u32> {
        let t = Thresholds::default();
        self.observations()
            .into_iter()
            .filter(|o| o.metrics.as_ref().is_some_and(|m| !t.judge(o.problem.class(), m).is_empty()))
            .map(|o| o.site_ordinal)
            .collect()
    }

    fn diagnosis_of(&self, site: u32) -> &DiagnosisRecord {
        let d = self.diagnoses();
        assert_eq!(d.len(), 1, "one diagnosis expected, got {d:#?}");
        assert_eq!(d[0].site_ordinal, site);
        d[0]
    }

    fn skip_reasons(&self) -> Vec<String> {
        self.records
            .iter()
            .filter_map(|r| match r {
                Record::Closing(c) => Some(c.skipped.iter().map(|s| s.reason.clone()).collect::<Vec<_>>()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    /// `quantshadow report` over the run: its exit code and markdown.
    fn report(&self) -> (i32, String) {
        let md = self.dir.path().join("report.md");
        let out = Command::new(QUANTSHADOW)
            .arg("report")
            .arg(self.dir.path().join("run.qsr"))
            .arg("--out")
            .arg(&md)
            .output()
            .unwrap();
        (out.status.code().unwrap_or(-1), std::fs::read_to_string(md).unwrap_or_default())
    }
}

fn run(mode: &str, inject: Option<&str>, extra: &[(&str, &str)]) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("c.sock");
    let file = dir.path().join("run.qsr");
    let collector = Collector::start(&Address::Unix(sock.clone()), &file).unwrap();
    let address = format!("unix:{}", sock.display());
    let mut env: Vec<(&str, &str)> =
        vec![("QUANTSHADOW_COLLECTOR", &address), ("QUANTSHADOW_DEVICE", "host"), ("QUANTSHADOW_MODE", mode)];
    if let Some(spec) = inject {
        env.push(("QUANTSHADOW_INJECT", spec));
    }
    env.extend_from_slice(extra);
    let out = fixture(&env, true);
    collector.shutdown();
    let records = load_run_file(&file).unwrap().records;
    Run { out, records, dir }
}

fn plain() -> BTreeMap<u32, String> {
    call_hashes(&fixture(&[], false))
}

/// Runs one planted class; asserts it fails exactly `expected` and leaves the other sites'
/// outputs as a run without the shim has them.
fn planted(mode: &str, inject: &str, expected: &[u32]) -> Run {
    let r = run(mode, Some(inject), &[]);
    let expected: BTreeSet<u32> = expected.iter().copied().collect();
    assert_eq!(r.failing_sites(), expected, "{inject} in {mode} mode");
    let (plain, faulted) = (plain(), call_hashes(&r.out));
    for site in 0..SITES {
        let changed = plain[&site] != faulted[&site];
        assert_eq!(changed, expected.contains(&site), "{inject}: output of site {site} changed: {changed}");
    }
    let injected: BTreeSet<u32> =
        r.observations().iter().filter(|o| o.flags & flags::INJECTED != 0).map(|o| o.site_ordinal).collect();
    assert_eq!(injected, expected, "{inject}: observations flagged INJECTED");
    let (code, md) = r.report();
    assert_eq!(code, 1, "{inject}: the report fails\n{md}");
    r
}

fn setting<'a>(r: &'a Run, key: &str) -> Option<&'a str> {
    r.records.iter().find_map(|rec| match rec {
        Record::Session(s) => s.settings.iter().find(|kv| kv.key == key).map(|kv| kv.value.as_str()),
        _ => None,
    })
}

#[test]
fn honest_runs_pass_with_no_diagnosis() {
    for mode in ["full", "rows", "sketch"] {
        let r = run(mode, None, &[]);
        assert_eq!(r.observations().len(), SITES as usize, "{mode}");
        assert!(r.failing_sites().is_empty(), "{mode}: {:?}", r.failing_sites());
        assert!(r.diagnoses().is_empty(), "{mode}");
        assert_eq!(call_hashes(&r.out), plain(), "{mode}: results unchanged");
        assert_eq!(setting(&r, "inject"), Some("none"));
        assert_eq!(r.report().0, 0, "{mode}");
    }
}

#[test]
fn scale_transpose_is_flagged_and_diagnosed_as_the_transposed_scales() {
    for mode in ["full", "sketch"] {
        let r = planted(mode, "scale-transpose@5", &[5]);
        let d = r.diagnosis_of(5);
        // The activations' 1x128 group scales (A in the row-major view) were handed over in
        // the other storage order: the reading that reads them that way explains production.
        let obs = r.observations().into_iter().find(|o| o.site_ordinal == 5).unwrap();
        let flipped = match obs.problem.a_scale.unwrap().storage {
            ScaleStorage::InnerMajor => "a-scales-outer-major",
            _ => "a-scales-inner-major",
        };
        assert_eq!(d.explanation.as_deref(), Some(flipped), "{mode}: {}", d.text);
        let best = d.explaining().unwrap();
        assert!(best.cosine > 0.9999 && (best.norm_ratio - 1.0).abs() < 1e-3, "{best:?}");
        assert!(d.declared().unwrap().cosine < 0.999, "{:?}", d.declared());
        assert!(d.text.contains("A scales read"), "{}", d.text);
        assert!(d.recommendation.as_deref().unwrap().contains("scale layout"), "{:?}", d.recommendation);
        assert!(
            d.scale_layout.iter().any(|l| l.starts_with("A scales: 1x128 blocks, grid 64x3")),
            "{:?}",
            d.scale_layout
        );
        assert_eq!(setting(&r, "inject"), Some("scale-transpose@5"));
    }
}

#[test]
fn scale_ignore_is_diagnosed_as_ignored_scales() {
    let r = planted("full", "scale-ignore@4", &[4]);
    let d = r.diagnosis_of(4);
    assert_eq!(d.explanation.as_deref(), Some("a-scales-ignored"), "{}", d.text);
    assert!(
        d.recommendation.as_deref().unwrap().contains("scale argument is dropped"),
        "{:?}",
        d.recommendation
    );
}

#[test]
fn fn_as_fnuz_is_exactly_half_and_diagnosed_as_fnuz() {
    let r = planted("full", "fn-as-fnuz@3", &[3]);
    let obs = r.observations().into_iter().find(|o| o.site_ordinal == 3).unwrap();
    let m = obs.metrics.unwrap();
    // Cosine stays 1; only the magnitude shows it.
    assert!(m.cosine > 0.99999 && (m.norm_ratio - 0.5).abs() < 1e-3, "{m:?}");
    let d = r.diagnosis_of(3);
    let id = d.explanation.as_deref().unwrap_or_default();
    assert!(id == "a-as-e4m3fnuz" || id == "b-as-e4m3fnuz", "{id}: {}", d.text);
    assert!(d.text.contains("read as e4m3fnuz"), "{}", d.text);
    // Reading either operand as fnuz gives the same output: the other is named as equivalent.
    assert!(d.equivalent.iter().any(|e| e.contains("read as e4m3fnuz")), "{:?}", d.equivalent);
}

#[test]
fn no_transpose_is_diagnosed_as_the_flipped_transpose() {
    let r = planted("full", "no-transpose@6", &[6]);
    let d = r.diagnosis_of(6);
    assert_eq!(d.explanation.as_deref(), Some("b-transpose-flipped"), "{}", d.text);
    assert!(d.text.contains("B transpose not applied"), "{}", d.text);
}

#[test]
fn tile_rows_are_located_every_16th_row() {
    let r = planted("full", "tile-rows@7", &[7]);
    let d = r.diagnosis_of(7);
    let map = d.error_map.as_ref().unwrap();
    let period = map.row_period.unwrap();
    // A 256-row sample of the 300: exactly its rows i % 16 == 15 are bad. The sample is an affine
    // permutation seeded by the site id, which folds the weight pointer (ASLR), so its rows vary
    // per run: over every multiplier coprime with 300 and every offset, a 256-row window holds
    // between 7 and 18 of the 18 tile rows (brute force), hence the bound of 7.
    assert_eq!((period.period, period.offset), (16, 15), "{}", map.summary);
    assert_eq!(period.first_row, map.bad_rows[0]);
    assert!(map.bad_rows.iter().all(|i| i % 16 == 15) && map.bad_rows_total >= 7, "{map:?}");
    assert_eq!((map.m, map.rows_checked), (300, 256));
    assert!(map.summary.contains("every 16th row"), "{}", map.summary);
    // No reading of the contract explains wrong rows.
    assert!(d.explanation.is_none(), "{}", d.text);
    // Below M = 56 the class leaves the output alone: the 33-token sites are not targeted, so
    // plant it at one to see it pass.
    let small = run("full", Some("tile-rows@0"), &[]);
    assert!(small.failing_sites().is_empty());
    assert_eq!(call_hashes(&small.out), plain());
}

#[test]
fn garbage_nan_and_zero_are_flagged_where_planted() {
    let g = planted("full", "garbage@0", &[0]);
    let d = g.diagnosis_of(0);
    assert!(
        d.explanation.is_none() && d.text.starts_with("no reading of the contract explains"),
        "{}",
        d.text
    );
    let n = planted("rows", "nan@1", &[1]);
    let m = n.observations().into_iter().find(|o| o.site_ordinal == 1).unwrap().metrics.unwrap();
    assert_eq!((m.nan_prod, m.nan_ref), (1, 0), "{m:?}");
    // Every site but the first one the plan saw.
    let z = planted("full", "zero-after-first", &(1..SITES).collect::<Vec<_>>());
    for o in z.observations().into_iter().filter(|o| o.site_ordinal > 0) {
        assert_eq!(o.metrics.unwrap().norm_ratio, 0.0, "site {}", o.site_ordinal);
    }
    // One diagnosis per failing site, not per call.
    assert_eq!(z.diagnoses().len(), SITES as usize - 1);
}

#[test]
fn a_class_that_does_not_fit_the_call_is_counted_not_applied() {
    // bf16 GemmEx has no scales to transpose: nothing changes, the run says why.
    let r = run("full", Some("scale-transpose@0"), &[]);
    assert!(r.failing_sites().is_empty());
    assert_eq!(call_hashes(&r.out), plain());
    let reasons = r.skip_reasons();
    assert!(
        reasons.iter().any(|s| s.starts_with("fault injection not applied: scale-transpose") && s.contains("no scales")),
        "{reasons:?}"
    );
    let stderr = String::from_utf8_lossy(&r.out.stderr);
    assert!(stderr.contains("FAULT INJECTION ACTIVE"), "{stderr}");
    assert!(stderr.contains("fault injection not applied"), "{stderr}");
}

#[test]
fn an_invalid_inject_value_is_one_clear_line_and_injects_nothing() {
    let r = run("full", Some("garbage@1,bogus"), &[]);
    assert!(r.failing_sites().is_empty());
    assert_eq!(call_hashes(&r.out), plain());
    let stderr = String::from_utf8_lossy(&r.out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("QUANTSHADOW_INJECT")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("unknown fault class 'bogus'") && lines[0].contains("no fault is injected"),
        "{stderr}"
    );
    assert_eq!(setting(&r, "inject"), Some("none"));
}

#[test]
fn unsampled_calls_are_injected_too() {
    // With sampling that checks nothing, the fault is still planted: a real fault does not
    // wait for the sampler.
    let r = run("full", Some("garbage@3"), &[("QUANTSHADOW_SAMPLE", "first:0")]);
    assert!(r.observations().is_empty());
    let (plain, faulted) = (plain(), call_hashes(&r.out));
    let changed: Vec<u32> = (0..SITES).filter(|s| plain[s] != faulted[s]).collect();
    assert_eq!(changed, vec![3]);
}

#[test]
fn every_site_mode_diagnoses_passing_sites_with_the_declared_reading_best() {
    let r = run("full", None, &[("QUANTSHADOW_DIAGNOSE", "every-site")]);
    assert!(r.failing_sites().is_empty());
    let d = r.diagnoses();
    assert_eq!(d.len(), SITES as usize);
    for d in d {
        assert!(d.explanation.is_none(), "site {}: {}", d.site_ordinal, d.text);
        assert!(d.text.starts_with("the declared contract is the best reading"), "{}", d.text);
        assert_eq!(d.error_map.as_ref().unwrap().bad_rows_total, 0);
    }
}

const POLICY: &str = r#"
[[rule]]
name = "no elementwise GEMMs in CK-free mode"
why = "an example rule: the fixture's BLAS launches an elementwise kernel"
when = { env = { FIXTURE_CK_FREE = "1" } }
sites = { a_format = "e4m3*" }
deny = { kernel = "*elementwise*" }
"#;

#[test]
fn blas_calls_name_the_kernel_that_served_them_and_the_policy_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, POLICY).unwrap();
    let policy_path = policy.display().to_string();
    let launch = env!("QUANTSHADOW_FIXTURE_LAUNCH");
    let r = run(
        "full",
        None,
        &[("QUANTSHADOW_POLICY", &policy_path), ("FIXTURE_CK_FREE", "1"), ("FIXTURE_VENDOR_LAUNCH", launch)],
    );
    assert_eq!(call_hashes(&r.out), plain(), "results unchanged");
    for o in r.observations() {
        // cuBLASLt calls launch the fixture kernel inside; cuBLAS GemmEx calls launch none.
        let expected = (o.entry_point == "cublasLtMatmul").then_some("qs_fixture_elementwise");
        assert_eq!(o.backend.as_deref(), expected, "site {} via {}", o.site_ordinal, o.entry_point);
    }
    assert_eq!(setting(&r, "policy"), Some(policy_path.as_str()));
    assert_eq!(setting(&r, "policy.text"), Some(POLICY));
    assert_eq!(setting(&r, "policy.env"), Some("FIXTURE_CK_FREE"));
    assert_eq!(setting(&r, "env.FIXTURE_CK_FREE"), Some("1"));
    // The shim says each violation once as it sees it (the three FP8 cuBLASLt sites).
    let stderr = String::from_utf8_lossy(&r.out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("backend policy:")).collect();
    assert_eq!(lines.len(), 3, "{stderr}");
    assert!(
        lines.iter().all(|l| l.contains("kernel `qs_fixture_elementwise` via `cublasLtMatmul`")
            && l.contains("rule \"no elementwise GEMMs in CK-free mode\" denies")),
        "{stderr}"
    );

    // A policy that does not parse: one line saying so, nothing recorded, nothing else changes.
    std::fs::write(&policy, "[[rule]]\nname = \"x\"\n").unwrap();
    let bad = run("full", None, &[("QUANTSHADOW_POLICY", &policy_path)]);
    let stderr = String::from_utf8_lossy(&bad.out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("policy")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("neither `deny` nor `require`") && lines[0].contains("no backend policy"),
        "{stderr}"
    );
    assert_eq!(setting(&bad, "policy"), None);
    assert!(bad.failing_sites().is_empty());
}
