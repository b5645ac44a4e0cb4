//! Report tests over in-memory records: aggregation, verdicts, every recommendation rule, the
//! renderers, and the speed bound.

use super::*;
use quantshadow_runtime::formats::Format;
use quantshadow_runtime::metrics::{sqnr_db, LogitsMetrics, Metrics, WorstRow};
use quantshadow_runtime::problem::{GemmProblem, ScaleGranularity, ScaleSpec};
use quantshadow_runtime::record::{
    flags, CheckMode, ClosingRecord, GemmObservation, KeyValue, ProblemSummary, Record, SessionRecord,
    SkipCount,
};
use quantshadow_runtime::thresholds::Thresholds;

fn session(id: u64, label: &str, rank: i32) -> Record {
    Record::Session(SessionRecord {
        session_id: id,
        host: "gpu7".into(),
        pid: 1000 + id as u32,
        rank,
        device_name: "MI355X".into(),
        device_arch: "gfx950".into(),
        library_versions: vec![KeyValue { key: "hipblaslt".into(), value: "1.0".into() }],
        label: label.into(),
        start_time_ns: 1,
        settings: vec![KeyValue { key: "mode".into(), value: "rows".into() }],
    })
}

fn closing(id: u64, checked: u64) -> Record {
    Record::Closing(ClosingRecord {
        session_id: id,
        calls_seen: checked * 10,
        sampled: checked + 2,
        checked,
        skipped: vec![SkipCount { reason: "no_workspace".into(), count: 2 }],
        dropped: 0,
        end_time_ns: 2,
    })
}

fn fp8_problem(m: u64) -> ProblemSummary {
    let mut p = GemmProblem::row_major(m, 4096, 4096, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
    p.a_scale = Some(ScaleSpec::new(ScaleGranularity::Block { outer: 1, inner: 128 }, Format::F32));
    p.b_scale = Some(ScaleSpec::new(ScaleGranularity::Block { outer: 128, inner: 128 }, Format::F32));
    ProblemSummary::from(&p)
}

fn fp8_tensor_scaled_problem(m: u64) -> ProblemSummary {
    let mut p = GemmProblem::row_major(m, 4096, 4096, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
    p.a_scale = Some(ScaleSpec::new(ScaleGranularity::Tensor, Format::F32));
    p.b_scale = Some(ScaleSpec::new(ScaleGranularity::Tensor, Format::F32));
    ProblemSummary::from(&p)
}

fn bf16_problem(m: u64) -> ProblemSummary {
    ProblemSummary::from(&GemmProblem::row_major(m, 1024, 1024, Format::Bf16, Format::Bf16, Format::Bf16))
}

fn metrics(cosine: f64, nmse: f64, norm_ratio: f64) -> Metrics {
    Metrics {
        cosine,
        nmse,
        sqnr_db: sqnr_db(nmse),
        norm_ratio,
        max_abs_err: 0.5,
        worst_row: None,
        nan_prod: 0,
        inf_prod: 0,
        nan_ref: 0,
        inf_ref: 0,
        count: 4096,
    }
}

/// A healthy FP8 check: well inside cosine >= 0.999, NMSE <= 2e-3, |1 - ratio| <= 0.01.
fn fp8_ok() -> Metrics {
    metrics(0.99995, 1e-4, 1.0002)
}

fn bf16_ok() -> Metrics {
    metrics(0.9999995, 1e-6, 1.0)
}

fn obs(session: u64, ordinal: u32, problem: ProblemSummary, metrics: Option<Metrics>) -> GemmObservation {
    GemmObservation {
        session_id: session,
        site_id: 0x5eed_0000 + ordinal as u64,
        site_ordinal: ordinal,
        site_name: Some(format!("model.layers.{ordinal}.mlp.down_proj")),
        call_seq: ordinal as u64,
        entry_point: "hipblasLtMatmul".into(),
        backend: Some("hipblaslt".into()),
        mode: if metrics.is_some() { CheckMode::Rows } else { CheckMode::Observe },
        rows_checked: problem.m,
        problem,
        metrics,
        sketch_seed: 7,
        sketch_prod: Vec::new(),
        sketch_ref: Vec::new(),
        logits: None,
        logits_rows: Vec::new(),
        flags: 0,
        timestamp_ns: 3,
    }
}

/// One session labelled `label` whose `layers` sites each get one call with `metrics_for(i)`.
fn configuration(
    id: u64,
    label: &str,
    layers: u32,
    problem: fn(u64) -> ProblemSummary,
    metrics_for: impl Fn(u32) -> Metrics,
) -> Vec<Record> {
    let mut records = vec![session(id, label, 0)];
    for i in 0..layers {
        records.push(Record::Observation(obs(id, i, problem(64), Some(metrics_for(i)))));
    }
    records.push(closing(id, layers as u64));
    records
}

fn report_of(records: Vec<Record>) -> Report {
    build_report(&[LoadedRun::from_records("test.qsr", records)], &Thresholds::default())
}

fn only_config(report: &Report) -> &ConfigurationReport {
    assert_eq!(report.configurations.len(), 1, "expected one configuration");
    &report.configurations[0]
}

fn rule_ids(config: &ConfigurationReport) -> Vec<&'static str> {
    config.recommendations.iter().map(|r| r.rule).collect()
}

fn advice<'a>(config: &'a ConfigurationReport, rule: &str) -> &'a str {
    &config
        .recommendations
        .iter()
        .find(|r| r.rule == rule)
        .unwrap_or_else(|| panic!("no {rule} advice"))
        .advice
}

#[test]
fn healthy_configuration_passes_with_its_numbers() {
    let report = report_of(configuration(1, "fp8-ck", 4, fp8_problem, |_| fp8_ok()));
    let config = only_config(&report);
    assert_eq!(report.verdict, Verdict::Pass);
    assert_eq!(config.verdict, Verdict::Pass);
    assert_eq!(config.summary.sites_checked, 4);
    assert_eq!(config.summary.calls_checked, 4);
    let spread = config.summary.metrics.expect("checked calls have metrics");
    assert_eq!(spread.cosine_min, 0.99995);
    assert_eq!(spread.nmse_max, 1e-4);
    assert_eq!(config.counters.calls_seen, 40);
    assert_eq!(config.counters.skipped_total(), 2);
    assert_eq!(rule_ids(config), ["pass"]);
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}

#[test]
fn a_failing_call_fails_its_site_and_configuration() {
    let report = report_of(configuration(1, "fp8-asm", 4, fp8_problem, |i| {
        if i == 2 {
            metrics(0.006, 1.7, 1.3)
        } else {
            fp8_ok()
        }
    }));
    let config = only_config(&report);
    assert_eq!(report.verdict, Verdict::Fail);
    assert_eq!(config.verdict, Verdict::Fail);
    let failing: Vec<String> = config.failing_sites().map(|s| s.key.to_string()).collect();
    assert_eq!(failing, ["model.layers.2.mlp.down_proj"]);
    let call = config.sites[2].worst_call.as_ref().unwrap();
    assert!(call.reasons.iter().any(|r| r.contains("cosine 0.006000 is below 0.999")), "{:?}", call.reasons);
    assert_eq!(config.sites[2].pattern, Some(FailurePattern::Garbage));
    assert_eq!(rule_ids(config), ["garbage-output"]);
    assert!(advice(config, "garbage-output").contains("`hipblaslt`"));
}

#[test]
fn nan_metrics_and_introduced_nan_fail() {
    let mut nan_values = fp8_ok();
    nan_values.nan_prod = 3;
    let report = report_of(configuration(1, "nan", 3, fp8_problem, |i| match i {
        0 => metrics(f64::NAN, 1e-4, 1.0),
        1 => nan_values,
        _ => fp8_ok(),
    }));
    let config = only_config(&report);
    assert_eq!(config.verdict, Verdict::Fail);
    assert_eq!(config.sites[0].status, SiteStatus::Fail);
    assert!(config.sites[0].metrics.unwrap().cosine_min.is_nan(), "a NaN cosine must stay visible");
    assert!(config.summary.metrics.unwrap().cosine_min.is_nan());
    assert_eq!(config.sites[1].status, SiteStatus::Fail);
    assert_eq!(config.sites[1].nonfinite_calls, 1);
    assert_eq!(config.sites[1].pattern, Some(FailurePattern::NonFinite));
    assert!(config.sites[1].worst_call.as_ref().unwrap().reasons[0].contains("3 NaN"));
    assert_eq!(config.sites[2].status, SiteStatus::Pass);
}

#[test]
fn thresholds_override_changes_the_verdict() {
    let records = configuration(1, "fp8", 2, fp8_problem, |_| metrics(0.9993, 1e-3, 1.0));
    let run = [LoadedRun::from_records("t.qsr", records)];
    assert_eq!(build_report(&run, &Thresholds::default()).verdict, Verdict::Pass);
    let strict = Thresholds::from_toml_str("[fp8]\ncosine_min = 0.9999\n", "strict.toml").unwrap();
    let report = build_report(&run, &strict);
    assert_eq!(report.verdict, Verdict::Fail);
    let reasons = &report.configurations[0].sites[0].worst_call.as_ref().unwrap().reasons;
    assert!(reasons.iter().any(|r| r.contains("below 0.9999")), "{reasons:?}");
}

#[test]
fn each_call_is_judged_by_its_own_class() {
    // Cosine 0.9995 passes the FP8 bound (0.999) and fails the BF16 one (0.99999).
    let mut records = vec![session(1, "mixed", 0)];
    records.push(Record::Observation(obs(1, 0, fp8_problem(8), Some(metrics(0.9995, 1e-3, 1.0)))));
    records.push(Record::Observation(obs(1, 1, bf16_problem(8), Some(metrics(0.9995, 1e-3, 1.0)))));
    records.push(closing(1, 2));
    let report = report_of(records);
    let config = only_config(&report).clone();
    assert_eq!(config.sites[0].status, SiteStatus::Pass);
    assert_eq!(config.sites[1].status, SiteStatus::Fail);
    assert_eq!(config.sites[1].pattern, Some(FailurePattern::Precision));
    // A failing site without scales has no scale layout to analyse.
    assert!(config.sites[1].scale_layout.is_empty(), "{:?}", config.sites[1].scale_layout);
    assert!(!render_markdown(&report, None).contains("Scale layout analysis"));
}

#[test]
fn sessions_sharing_a_label_are_one_configuration_in_input_order() {
    // The observation of session 2 arrives before its session record (another file first).
    let mut records = vec![Record::Observation(obs(2, 0, fp8_problem(16), Some(metrics(0.9991, 1e-3, 1.0))))];
    records.extend(configuration(1, "fp8", 2, fp8_problem, |_| fp8_ok()));
    records.push(session(2, "fp8", 1));
    records.push(closing(2, 1));
    records.extend(configuration(3, "bf16", 2, bf16_problem, |_| bf16_ok()));
    let report = report_of(records);
    let labels: Vec<&str> = report.configurations.iter().map(|c| c.label.as_str()).collect();
    // Session 2 appeared first (its observation), so "fp8" comes first.
    assert_eq!(labels, ["fp8", "bf16"]);
    let fp8 = &report.configurations[0];
    assert_eq!(fp8.counters.sessions, 2);
    assert_eq!(fp8.sites.len(), 2, "site 0 of both sessions merges by name");
    let site = &fp8.sites[0];
    assert_eq!(site.calls_checked, 2);
    assert_eq!(site.metrics.unwrap().cosine_min, 0.9991);
    assert_eq!((site.m_min, site.m_max), (16, 64));
    assert_eq!(site.shape, "(16..64)x4096x4096");
    // Lower median of [0.9991, 0.99995].
    assert_eq!(site.metrics.unwrap().cosine_median, 0.9991);
    assert_eq!(fp8.counters.checked, 3);
    assert_eq!(fp8.counters.checked_missing, 0);
}

#[test]
fn unnamed_sites_are_keyed_by_entry_point_and_ordinal_and_adopt_late_names() {
    let mut records = vec![session(1, "a", 0), session(2, "b", 0)];
    let mut unnamed = obs(1, 5, fp8_problem(8), Some(fp8_ok()));
    unnamed.site_name = None;
    records.push(Record::Observation(unnamed.clone()));
    let mut other = unnamed.clone();
    other.session_id = 2;
    records.push(Record::Observation(other));
    // Session 1 learns the name of a second site only on its second call.
    let mut late = obs(1, 6, fp8_problem(8), Some(fp8_ok()));
    late.site_name = None;
    records.push(Record::Observation(late.clone()));
    late.site_name = Some("lm_head".into());
    records.push(Record::Observation(late));
    let report = report_of(records);
    let a = &report.configurations[0];
    assert_eq!(a.sites[0].key, SiteKey::Unnamed { entry_point: "hipblasLtMatmul".into(), ordinal: 5 });
    assert_eq!(a.sites[0].name, None);
    assert_eq!(a.sites[1].key, SiteKey::Named("lm_head".into()));
    assert_eq!(a.sites[1].calls_checked, 2);
    let rows: Vec<&str> = report.heatmap.rows.iter().map(|r| r.site.as_str()).collect();
    assert_eq!(rows, ["hipblasLtMatmul #5", "lm_head"]);
    assert!(report.heatmap.rows[0].cells.iter().all(Option::is_some), "both configurations saw #5");
    assert!(report.heatmap.rows[1].cells[1].is_none(), "b never saw lm_head");
    let svg = render_heatmap_svg(&report);
    assert!(svg.contains(">hipblasLtMatmul #5<") && svg.contains(">#6 lm_head<"), "{svg}");
}

#[test]
fn observe_only_is_listed_not_checked_and_no_data_is_not_a_pass() {
    let mut records = vec![session(1, "observe", 0)];
    records.push(Record::Observation(obs(1, 0, fp8_problem(8), None)));
    records.push(closing(1, 0));
    let report = report_of(records);
    let config = only_config(&report);
    assert_eq!(config.sites[0].status, SiteStatus::Observed);
    assert_eq!(config.verdict, Verdict::NoData);
    assert_eq!(report.verdict, Verdict::NoData);
    assert_eq!(rule_ids(config), ["no-data"]);
    let text = advice(config, "no-data");
    assert!(text.contains("no_workspace (2)") && text.contains("1 calls observed only"), "{text}");
}

#[test]
fn crashed_sessions_dropped_records_and_missing_results_are_warned() {
    let mut records = configuration(1, "fp8", 2, fp8_problem, |_| fp8_ok());
    records.pop(); // no closing record: crashed
    records.extend(configuration(2, "fp8", 2, fp8_problem, |_| fp8_ok()));
    if let Some(Record::Closing(c)) = records.last_mut() {
        c.dropped = 5;
        c.checked = 4; // two more than the file holds
    }
    let report = report_of(records);
    let config = only_config(&report);
    assert_eq!(config.verdict, Verdict::Pass, "warnings do not change what was checked");
    assert_eq!(config.counters.sessions_closed, 1);
    let warnings = config.warnings.join("\n");
    assert!(warnings.contains("ended without closing record (crashed or killed?)"), "{warnings}");
    assert!(warnings.contains("pid 1001, rank 0"), "{warnings}");
    assert!(warnings.contains("5 records were dropped"), "{warnings}");
    assert!(warnings.contains("closing records count 2 checked calls"), "{warnings}");
    assert_eq!(rule_ids(config), ["incomplete-run", "pass"]);
}

#[test]
fn dropped_records_or_missing_results_keep_the_pass_but_do_not_vouch_for_the_configuration() {
    let healthy = report_of(configuration(1, "fp8", 2, fp8_problem, |_| fp8_ok()));
    assert!(advice(only_config(&healthy), "pass").ends_with("this configuration is good to use."));
    let with_closing = |change: fn(&mut ClosingRecord)| {
        let mut records = configuration(1, "fp8", 2, fp8_problem, |_| fp8_ok());
        if let Some(Record::Closing(c)) = records.last_mut() {
            change(c);
        }
        report_of(records)
    };
    for (what, report) in
        [("dropped", with_closing(|c| c.dropped = 3)), ("checked missing", with_closing(|c| c.checked = 5))]
    {
        let config = only_config(&report);
        assert_eq!(config.verdict, Verdict::Pass, "{what}: missing data is a warning, not a failure");
        assert_eq!(rule_ids(config), ["incomplete-run", "pass"], "{what}");
        let pass = advice(config, "pass");
        assert!(pass.contains("see the notes above on what was not covered"), "{what}: {pass}");
        assert!(!pass.contains("good to use"), "{what}: {pass}");
    }
}

#[test]
fn observations_without_session_record_are_grouped_and_warned() {
    let records = vec![Record::Observation(obs(9, 0, fp8_problem(8), Some(fp8_ok())))];
    let report = report_of(records);
    let config = only_config(&report);
    assert_eq!(config.label, model::NO_SESSION_LABEL);
    assert!(config.warnings.iter().any(|w| w.contains("without session record")));
    assert!(config.warnings.iter().any(|w| w.contains("crashed or killed")));
    let md = render_markdown(&report, None);
    assert!(md.contains("- Calls: counters unknown (no closing record); 1 observation records"), "{md}");
}

#[test]
fn violations_read_like_the_tables() {
    use quantshadow_runtime::thresholds::Violation;
    let cases = [
        (Violation::Cosine { value: 0.41, min: 0.999 }, "cosine 0.410000 is below 0.999"),
        (Violation::Nmse { value: 0.25, max: 2e-3 }, "NMSE 2.50e-01 is above 2.00e-03"),
        (
            Violation::NormRatio { value: 2.0001, tol: 0.01 },
            "norm ratio 2.0001 is off by more than 0.01: an exact factor of 2",
        ),
        (Violation::NormRatio { value: 0.8, tol: 0.01 }, "norm ratio 0.8000 is off by more than 0.01"),
        (
            Violation::NonFinite { nan: 3, inf: 0 },
            "production has 3 NaN and 0 Inf values the reference does not have",
        ),
    ];
    for (violation, words) in cases {
        assert_eq!(rules::describe_violation(&violation), words);
    }
}

// ---- one scenario per recommendation rule -------------------------------------------------

#[test]
fn rule_fp8_variant_on_an_exact_factor_of_two() {
    for (ratio, reading) in [(0.5, "e4m3fn bytes read as e4m3fnuz"), (2.0, "e4m3fnuz bytes read as e4m3fn")] {
        let nmse = (ratio - 1.0f64).powi(2);
        let report = report_of(configuration(1, "fnuz", 3, fp8_problem, |_| metrics(1.0, nmse, ratio)));
        let config = only_config(&report);
        assert_eq!(config.summary.sites_failing, 3);
        assert!(config.sites.iter().all(|s| s.pattern == Some(FailurePattern::PowerOfTwo)));
        assert_eq!(rule_ids(config), ["fp8-variant"]);
        assert!(advice(config, "fp8-variant").contains(reading));
    }
    assert_eq!(rules::power_of_two_factor(0.2501), Some(0.25));
    assert_eq!(rules::power_of_two_factor(0.6), None);
}

#[test]
fn rule_magnitude_on_another_factor() {
    let report = report_of(configuration(1, "scale", 2, fp8_problem, |_| metrics(0.99999, 0.04, 0.8)));
    assert_eq!(rule_ids(only_config(&report)), ["magnitude"]);
}

#[test]
fn rule_zero_output_names_scale_aliasing_when_only_the_first_layer_works() {
    let report = report_of(configuration(1, "alias", 4, fp8_problem, |i| {
        if i == 0 {
            fp8_ok()
        } else {
            metrics(0.0, 1.0, 0.0)
        }
    }));
    let config = only_config(&report);
    assert_eq!(rule_ids(config), ["zero-output"]);
    assert!(advice(config, "zero-output").contains("every layer but the first"));
}

#[test]
fn rule_nonfinite_names_the_affected_ranks() {
    let mut records = configuration(1, "tp2", 2, fp8_problem, |_| fp8_ok());
    let mut nan = fp8_ok();
    nan.nan_prod = 10;
    let mut rank1 = configuration(2, "tp2", 2, fp8_problem, |_| nan);
    if let Record::Session(s) = &mut rank1[0] {
        s.rank = 1;
    }
    records.extend(rank1);
    let config = only_config(&report_of(records)).clone();
    assert_eq!(rule_ids(&config), ["nonfinite"]);
    let text = advice(&config, "nonfinite");
    assert!(text.contains("Only 1 of 2 sessions") && text.contains("rank 1"), "{text}");
}

#[test]
fn rule_reference_nonfinite_points_upstream() {
    let mut records = configuration(1, "upstream", 2, fp8_problem, |_| fp8_ok());
    if let Record::Observation(o) = &mut records[2] {
        o.flags |= flags::REFERENCE_NONFINITE;
    }
    let config = only_config(&report_of(records)).clone();
    assert_eq!(rule_ids(&config), ["reference-nonfinite", "pass"]);
    assert!(advice(&config, "reference-nonfinite").contains("ordinal 1"));
}

/// Rows-mode calls of one site at several M: M < 56 is right, larger M has a few bad rows.
fn tile_boundary_records(bad_rows_fail: bool) -> Vec<Record> {
    let mut records = vec![session(1, "tile", 0)];
    for (seq, m) in [32u64, 48, 64, 128].into_iter().enumerate() {
        let mut metrics = fp8_ok();
        metrics.worst_row = Some(WorstRow { index: m - 3, cosine: 0.9998 });
        if m >= 56 {
            // One row of M is garbage: the whole output stays above 0.9 but the row is at 0.02.
            metrics.cosine = if bad_rows_fail { 0.95 } else { 0.99935 };
            metrics.nmse = if bad_rows_fail { 0.1 } else { 1.2e-3 };
            metrics.worst_row = Some(WorstRow { index: 60, cosine: 0.02 });
        }
        let mut o = obs(1, 0, fp8_problem(m), Some(metrics));
        o.call_seq = seq as u64;
        records.push(Record::Observation(o));
    }
    records.push(closing(1, 4));
    records
}

#[test]
fn rule_few_rows_and_m_dependence_on_a_tile_boundary_bug() {
    let report = report_of(tile_boundary_records(true));
    let config = only_config(&report);
    let site = &config.sites[0];
    assert_eq!(site.calls_failed, 2);
    assert_eq!(site.pattern, Some(FailurePattern::FewRows));
    let row = site.worst_row.as_ref().unwrap();
    assert!(row.concentrated);
    assert_eq!((row.index, row.m), (60, 64));
    assert_eq!(
        site.m_dependence,
        Some(model::MDependence::FailsFromM { first_failing: 64, last_passing: 48 })
    );
    assert_eq!(rule_ids(config), ["few-rows", "m-dependent"]);
    assert!(advice(config, "m-dependent").contains("fails only from M >= 64 (calls with M in {32, 48} pass)"));
}

#[test]
fn one_bad_row_fails_the_site_even_when_whole_output_metrics_pass() {
    // Whole-output cosine 0.99935 and NMSE 1.2e-3 are within the FP8 bounds; the row at cosine
    // 0.02 is not: the per-row bound fails the site and the few-rows rule explains it.
    let report = report_of(tile_boundary_records(false));
    let config = only_config(&report);
    assert_eq!(config.verdict, Verdict::Fail);
    let site = &config.sites[0];
    assert_eq!(site.calls_failed, 2);
    assert_eq!(site.pattern, Some(FailurePattern::FewRows));
    let worst = site.worst_call.as_ref().unwrap();
    assert!(
        worst.reasons.iter().any(|r| r.contains("row 60 has cosine 0.020000, below the per-row bound")),
        "{:?}",
        worst.reasons
    );
    assert!(rule_ids(config).contains(&"few-rows"));
}

#[test]
fn rule_scale_layout_on_partly_correlated_block_scaled_output() {
    let report = report_of(configuration(1, "shuffle", 2, fp8_problem, |_| metrics(0.71, 0.6, 0.93)));
    let config = only_config(&report);
    assert_eq!(rule_ids(config), ["scale-layout"]);
    assert!(advice(config, "scale-layout").contains("shuffle_scale"));
}

#[test]
fn rule_precision_mentions_fast_accumulation() {
    let fast = |m| {
        let mut p = bf16_problem(m);
        p.fast_accum = true;
        p
    };
    let report = report_of(configuration(1, "bf16-fast", 2, fast, |_| metrics(0.9999, 2e-4, 1.0)));
    let config = only_config(&report);
    assert_eq!(rule_ids(config), ["precision"]);
    assert!(advice(config, "precision").contains("Fast accumulation is on"));
}

#[test]
fn rule_unclassified_when_no_pattern_fits() {
    let report = report_of(configuration(1, "odd", 1, fp8_tensor_scaled_problem, |_| metrics(0.9, 0.3, 0.7)));
    let config = only_config(&report);
    assert_eq!(config.sites[0].pattern, Some(FailurePattern::Unclassified));
    assert_eq!(rule_ids(config), ["unclassified"]);
}

#[test]
fn rule_unchecked_sites_lists_observed_only_sites() {
    let mut records = configuration(1, "partial", 1, fp8_problem, |_| fp8_ok());
    records.insert(2, Record::Observation(obs(1, 1, fp8_problem(8), None)));
    let config = only_config(&report_of(records)).clone();
    assert_eq!(config.verdict, Verdict::Pass);
    assert_eq!(rule_ids(&config), ["unchecked-sites", "pass"]);
    assert!(advice(&config, "unchecked-sites").contains("model.layers.1.mlp.down_proj"));
}

#[test]
fn rule_skipped_calls_when_a_tenth_of_the_sampled_calls_went_unchecked() {
    // 40 checked, 60 skipped: a pass that covers less than half of the sampled calls.
    let run = |skips: Vec<SkipCount>, pool: Option<&str>| {
        let mut records = configuration(1, "canary", 2, fp8_problem, |_| fp8_ok());
        if let (Some(p), Record::Session(s)) = (pool, &mut records[0]) {
            s.settings.push(KeyValue { key: "pool_mib".into(), value: p.into() });
        }
        if let Some(Record::Closing(c)) = records.last_mut() {
            c.checked = 2;
            c.sampled = 2 + skips.iter().map(|s| s.count).sum::<u64>();
            c.skipped = skips;
        }
        report_of(records)
    };
    let skip = |reason: &str, count| SkipCount { reason: reason.into(), count };
    let report = run(
        vec![
            skip("sketch set-up: device pool exhausted (raise QUANTSHADOW_POOL_MB)", 30),
            skip("graph capture: first call of this site was captured", 15),
            skip("sketch: earlier detached checks are still running", 10),
            skip("warming up: kernels compiling", 4),
            skip("no_workspace", 1),
        ],
        Some("512"),
    );
    let config = only_config(&report);
    assert_eq!(config.verdict, Verdict::Pass, "skips lower coverage, they are not failures");
    assert_eq!(rule_ids(config), ["skipped-calls", "pass"]);
    let text = advice(config, "skipped-calls");
    for wanted in [
        "60 of 62 sampled calls (97%)",
        "(30)",
        "and 2 more reasons",
        "device pool (512 MiB) was full: raise `QUANTSHADOW_POOL_MB`",
        "`QUANTSHADOW_SAMPLE=1/N`",
        "warm each captured size up eagerly",
        "`QUANTSHADOW_COMPILE=sync`",
    ] {
        assert!(text.contains(wanted), "{wanted:?} missing from {text}");
    }
    let pass = advice(config, "pass");
    assert!(pass.contains("see the notes above") && !pass.contains("good to use"), "{pass}");
    // Only the hints that apply, and no pool size where the sessions did not record one.
    let config =
        run(vec![skip("sketch set-up: device pool exhausted (raise QUANTSHADOW_POOL_MB)", 30)], None)
            .configurations[0]
            .clone();
    let text = advice(&config, "skipped-calls");
    assert!(text.contains("device pool was full") && !text.contains("MiB"), "{text}");
    assert!(
        !text.contains("QUANTSHADOW_SAMPLE") && !text.contains("COMPILE") && !text.contains("warm"),
        "{text}"
    );
    // Below a tenth of the sampled calls, or fewer than ten calls: no advice, and the pass vouches.
    for skips in [vec![skip("no_workspace", 9)], vec![skip("no_workspace", 3)]] {
        let mut records = configuration(1, "canary", 2, fp8_problem, |_| fp8_ok());
        if let Some(Record::Closing(c)) = records.last_mut() {
            c.checked = if skips[0].count == 9 { 90 } else { 2 };
            c.sampled = c.checked + skips[0].count;
            c.skipped = skips;
        }
        let report = report_of(records);
        let config = only_config(&report);
        assert!(!rule_ids(config).contains(&"skipped-calls"), "{:?}", config.counters);
    }
}

#[test]
fn every_rule_is_exercised_by_a_scenario() {
    // Keeps the table and the scenarios above in step: a new rule needs a scenario.
    let exercised = [
        "no-data",
        "diagnosis",
        "policy",
        "nonfinite",
        "reference-nonfinite",
        "zero-output",
        "garbage-output",
        "fp8-variant",
        "magnitude",
        "few-rows",
        "m-dependent",
        "scale-layout",
        "precision",
        "unclassified",
        "unchecked-sites",
        "skipped-calls",
        "incomplete-run",
        "pass",
    ];
    let ids: Vec<&str> = rules::RULES.iter().map(|r| r.id).collect();
    assert_eq!(ids, exercised);
}

// ---- renderers ------------------------------------------------------------------------------

/// Three configurations: a passing baseline, the fn/fnuz mix-up, and a garbage backend.
fn three_configurations() -> Report {
    report_of(three_configurations_records())
}

fn three_configurations_records() -> Vec<Record> {
    let mut records = configuration(1, "bf16", 3, bf16_problem, |_| bf16_ok());
    records.extend(configuration(2, "fp8-fnuz", 3, fp8_problem, |_| metrics(1.0, 0.25, 0.5)));
    records.extend(configuration(3, "fp8|asm", 3, fp8_problem, |i| {
        if i == 1 {
            metrics(0.006, 1.7, 1.3)
        } else {
            fp8_ok()
        }
    }));
    if let Some(Record::Observation(o)) =
        records.iter_mut().rev().find(|r| matches!(r, Record::Observation(_)))
    {
        o.logits = Some(LogitsMetrics { kl: 0.02, top1_agree: false, topk_overlap: 0.8, k: 5 });
    }
    records
}

#[test]
fn markdown_has_the_summary_failures_reasons_and_heatmap_link() {
    let report = three_configurations();
    let md = render_markdown(&report, Some("out.heatmap.svg"));
    assert!(md.starts_with("# quantshadow report\n"));
    assert!(
        md.contains("**Verdict: ❌ FAIL**: 2 of 3 configurations do not pass: `fp8-fnuz`, `fp8\\|asm`."),
        "{md}"
    );
    assert!(
        md.contains("| `bf16` | ✅ PASS | 3 | 3 | 1.000000 | 1.000000 | 1.00e-06 | 1.0000 | 0 |"),
        "{md}"
    );
    assert!(
        md.contains("| `fp8-fnuz` | ❌ FAIL | 3 | 3 | 1.000000 | 1.000000 | 2.50e-01 | 0.5000 | 3 |"),
        "{md}"
    );
    assert!(md.contains("![Heatmap: minimum cosine per site and configuration](<out.heatmap.svg>)"));
    assert!(md.contains("## `fp8\\|asm`: ❌ FAIL"));
    assert!(md.contains("cosine 0.006000 is below 0.999"));
    assert!(md.contains("NMSE 2.50e-01 is above 2.00e-03; norm ratio 0.5000 is off by more than 0.01: an exact factor of 0.5."), "{md}");
    assert!(md.contains("Worst call (M = 64, call 1 of rank 0, rows mode, backend `hipblaslt`)"), "{md}");
    assert!(md.contains("**Exact power-of-two factor: FP8 variant mix-up**"));
    assert!(md.contains("**Backend returns garbage**"));
    assert!(md.contains("| 1 | `model.layers.1.mlp.down_proj` | `hipblasLtMatmul` (`hipblaslt`) | 64x4096x4096 | `e4m3fn*e4m3fn->bf16` | `A block1x128:f32 / B block128x128:f32` | 1 | 0.006000 | 0.006000 | 1.70e+00 | 1.3000 | – | ❌ FAIL |"), "{md}");
    assert!(
        md.contains("### Logits")
            && md.contains(
                "| 2 | `model.layers.2.mlp.down_proj` | 1 | 2.00e-02 | 2.00e-02 | 0.0% | 80.0% (k = 5) |"
            ),
        "{md}"
    );
    // Every table row has as many cells as its header.
    for table in md.split("\n\n").filter(|block| block.starts_with('|')) {
        let widths: Vec<usize> = table.lines().map(|l| l.replace("\\|", "").matches('|').count()).collect();
        assert!(widths.iter().all(|w| *w == widths[0]), "ragged table:\n{table}");
    }
}

#[test]
fn markdown_without_svg_says_so_and_keeps_the_data() {
    let md = render_markdown(&three_configurations(), None);
    assert!(md.contains("No heatmap SVG was written"));
    assert!(
        md.contains("| 1 | `model.layers.1.mlp.down_proj` | 1.000000 | 1.000000 ❌ | 0.006000 ❌ |"),
        "{md}"
    );
}

#[test]
fn svg_heatmap_has_a_cell_with_tooltip_per_site_and_configuration_and_no_script() {
    let report = three_configurations();
    let svg = render_heatmap_svg(&report);
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert!(svg.trim_end().ends_with("</svg>"));
    assert!(!svg.contains("<script") && !svg.contains("href=\"http"));
    assert_eq!(svg.matches("<g><title>").count(), 3 * 3);
    assert!(svg.contains("model.layers.1.mlp.down_proj | fp8|asm: min cosine 0.006000, max NMSE 1.70e+00, 1 checked calls, 1 failing: FAIL"));
    assert!(svg.contains("0.006000 ✗"));
    assert!(svg.contains("1 − cosine (log scale)") && svg.contains(">1e-7<") && svg.contains(">1e0<"));
    // Balanced elements: every opened group is closed.
    assert_eq!(svg.matches("<g>").count(), svg.matches("</g>").count());
}

#[test]
fn json_holds_the_same_verdicts() {
    let report = three_configurations();
    let value: serde_json::Value = serde_json::from_str(&render_json(&report)).expect("valid JSON");
    assert_eq!(value["verdict"], "FAIL");
    let verdicts: Vec<(&str, &str)> = value["configurations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["label"].as_str().unwrap(), c["verdict"].as_str().unwrap()))
        .collect();
    assert_eq!(verdicts, [("bf16", "PASS"), ("fp8-fnuz", "FAIL"), ("fp8|asm", "FAIL")]);
    let site = &value["configurations"][2]["sites"][1];
    assert_eq!(site["status"], "FAIL");
    assert_eq!(site["pattern"], "garbage");
    assert_eq!(value["configurations"][1]["recommendations"][0]["rule"], "fp8-variant");
}

#[test]
fn json_writes_non_finite_numbers_as_null() {
    let report =
        report_of(configuration(1, "nan", 1, fp8_problem, |_| metrics(f64::NAN, f64::INFINITY, 1.0)));
    let value: serde_json::Value = serde_json::from_str(&render_json(&report)).unwrap();
    assert!(value["configurations"][0]["sites"][0]["metrics"]["cosine_min"].is_null());
    assert_eq!(value["verdict"], "FAIL");
}

#[test]
fn heatmap_file_sits_next_to_the_report() {
    assert_eq!(heatmap_path_for(Path::new("/tmp/x/report.md")), Path::new("/tmp/x/report.heatmap.svg"));
    assert_eq!(heatmap_path_for(Path::new("out")), Path::new("out.heatmap.svg"));
}

// ---- loading --------------------------------------------------------------------------------

#[test]
fn payloads_decode_into_the_same_report() {
    let records = configuration(1, "fp8", 2, fp8_problem, |_| fp8_ok());
    let payloads: Vec<Vec<u8>> = records.iter().map(quantshadow_runtime::record::encode).collect();
    let mut decoded = Vec::new();
    let source = decode_payloads("a.qsr".into(), payloads, None, |r| decoded.push(r)).unwrap();
    assert_eq!(source.records, 4);
    assert_eq!(decoded, records);
}

#[test]
fn undecodable_and_torn_input_is_counted_or_refused() {
    let good = quantshadow_runtime::record::encode(&session(1, "x", 0));
    let torn = quantshadow_runtime::runfile::TornTail { offset: 4242, reason: "frame cut short".into() };
    let source =
        decode_payloads("a.qsr".into(), vec![good, vec![1, 2, 3]], Some(torn.clone()), |_| {}).unwrap();
    assert_eq!((source.records, source.undecodable), (1, 1));
    let warnings = source.warnings().join("\n");
    assert!(warnings.contains("a.qsr: torn tail at byte 4242 (frame cut short)"), "{warnings}");
    assert!(warnings.contains("1 records could not be decoded"), "{warnings}");

    let empty = decode_payloads("e.qsr".into(), Vec::new(), Some(torn), |_| {}).unwrap_err();
    assert_eq!(
        empty.to_string(),
        "e.qsr: empty run: the file holds no intact record (torn at byte 4242: frame cut short)"
    );
    let garbage = decode_payloads("g.qsr".into(), vec![vec![0; 16]], None, |_| {}).unwrap_err();
    assert!(matches!(garbage, LoadError::Undecodable { count: 1, .. }), "{garbage}");
}

#[test]
fn missing_file_and_directory_are_refused_with_their_path() {
    let missing = load_run_file(Path::new("/nonexistent/run.qsr")).unwrap_err();
    assert_eq!(missing.to_string(), "/nonexistent/run.qsr: no such file");
    let dir = std::env::temp_dir();
    assert!(load_run_file(&dir).unwrap_err().to_string().ends_with("is a directory, not a run file"));
}

// ---- speed ----------------------------------------------------------------------------------

/// 1M observations (100 sites x 8 sessions) through the builder. The bound holds for debug
/// builds on a loaded 2-core machine; release is about 10x faster.
#[test]
fn a_million_observations_aggregate_quickly() {
    let thresholds = Thresholds::default();
    let start = std::time::Instant::now();
    let mut builder = ReportBuilder::new(&thresholds);
    let sessions = 8u64;
    for id in 0..sessions {
        builder.add_record(&session(id, if id % 2 == 0 { "even" } else { "odd" }, id as i32));
    }
    let mut record = Record::Observation(obs(0, 0, fp8_problem(64), Some(fp8_ok())));
    for i in 0..1_000_000u64 {
        if let Record::Observation(o) = &mut record {
            o.session_id = i % sessions;
            o.site_name = None;
            o.site_ordinal = ((i / sessions) % 100) as u32;
            o.site_id = o.site_ordinal as u64;
            o.call_seq = i;
            let m = o.metrics.as_mut().unwrap();
            m.cosine = 0.9999 - (i % 997) as f64 * 1e-7;
        }
        builder.add_record(&record);
    }
    let report = builder.finish();
    let markdown = render_markdown(&report, Some("r.svg"));
    let elapsed = start.elapsed();
    assert_eq!(report.configurations.len(), 2);
    assert_eq!(report.configurations[0].summary.calls_checked, 500_000);
    assert!(markdown.len() > 1000);
    assert!(elapsed.as_secs_f64() < 5.0, "1M observations took {elapsed:?}");
}

// ---- issue 6: fault injection, diagnosis, backend policy, verdict reasons ---------------------

use quantshadow_runtime::policy::Policy;
use quantshadow_runtime::record::{DiagnosisRecord, ErrorMapSummary, ReadingSummary, RowPeriodSummary};

/// A session record of `label` with extra settings (after `mode=rows`).
fn session_with(id: u64, label: &str, settings: &[(&str, &str)]) -> Record {
    let mut record = session(id, label, 0);
    if let Record::Session(s) = &mut record {
        s.settings
            .extend(settings.iter().map(|(k, v)| KeyValue { key: k.to_string(), value: v.to_string() }));
    }
    record
}

fn md_of(report: &Report) -> String {
    render_markdown(report, None)
}

fn reading(id: &str, description: &str, cosine: f64, norm_ratio: f64, explains: bool) -> ReadingSummary {
    ReadingSummary {
        id: id.into(),
        description: description.into(),
        declared: id == "declared",
        cosine,
        nmse: (1.0 - cosine) * 2.0,
        norm_ratio,
        nonfinite_mismatch: 0,
        explains,
    }
}

const INNER_MAJOR: &str = "A scales read column-major (inner-major)";
const LAYOUT_ADVICE: &str = "scale layout mismatch: check that the quantization kernel writes the scales in the order the GEMM is told (row- vs column-major, a transpose_scale flag, a fallback path that ignores it)";

/// The diagnosis of a failing block-scaled site whose A scales were read column-major.
fn layout_diagnosis(session_id: u64, ordinal: u32, call_seq: u64, timestamp_ns: u64) -> DiagnosisRecord {
    DiagnosisRecord {
        session_id,
        site_id: 0x5eed_0000 + ordinal as u64,
        site_ordinal: ordinal,
        call_seq,
        rows: 64,
        readings: vec![
            reading("a-scales-inner-major", INNER_MAJOR, 0.99998, 1.0, true),
            reading("a-scales-swizzled", "A scales read pre-shuffled (128x4 swizzled)", 0.62, 0.98, false),
            reading("a-scales-ignored", "A scales ignored (all 1)", 0.55, 3.1, false),
            reading("b-scales-inner-major", "B scales read column-major (inner-major)", 0.43, 1.0, false),
            reading("a-fnuz", "A read as e4m3fnuz", 0.42, 0.5, false),
            reading("b-fnuz", "B read as e4m3fnuz", 0.415, 0.5, false),
            reading("declared", "the declared contract", 0.41, 1.0, false),
        ],
        skipped: vec![KeyValue {
            key: "A and B scales swapped".into(),
            value: "B's scale buffer is smaller than A's grid".into(),
        }],
        explanation: Some("a-scales-inner-major".into()),
        equivalent: Vec::new(),
        text: format!(
            "production matches the reference with {INNER_MAJOR}: cosine 0.99998, norm ratio 1.000; declared layout gives cosine 0.41, norm ratio 1.000"
        ),
        recommendation: Some(LAYOUT_ADVICE.into()),
        error_map: Some(ErrorMapSummary {
            m: 64,
            rows_checked: 64,
            bad_rows: vec![15, 31, 47, 63],
            bad_rows_total: 4,
            row_period: Some(RowPeriodSummary { period: 16, offset: 15, first_row: 15 }),
            col_block: 128,
            col_blocks: 32,
            bad_col_blocks: (0..32).collect(),
            bad_a_scale_blocks: Some(vec![15, 31, 47, 63]),
            bad_b_scale_blocks: None,
            summary: "bad rows: every 16th row (i = 15 mod 16) from row 15 (4 of 64 checked, M = 64); bad column blocks (128 wide): all 32; A scale blocks along M: 15, 31, 47, 63".into(),
        }),
        scale_layout: vec![
            "A scales: 1x128 blocks, grid 64x32, f32, OuterMajor, ld 32, 2048 entries".into(),
            "B scales: 128x128 blocks, grid 32x32, f32, OuterMajor, ld 32, 1024 entries".into(),
        ],
        timestamp_ns,
    }
}

/// Three FP8 block-scaled sites, site 1 failing at cosine 0.41 with a diagnosis record.
fn diagnosed_records() -> Vec<Record> {
    let mut records = configuration(1, "fp8-block", 3, fp8_problem, |i| {
        if i == 1 {
            metrics(0.41, 1.2, 1.0)
        } else {
            fp8_ok()
        }
    });
    // An older diagnosis with the explanation, and a newer one without: the explained one shows.
    let mut unexplained = layout_diagnosis(1, 1, 9, 900);
    unexplained.explanation = None;
    unexplained.text =
        "no reading of the contract explains production: declared gives cosine 0.4100, norm ratio 1.000"
            .into();
    unexplained.recommendation = None;
    records.push(Record::Diagnosis(layout_diagnosis(1, 1, 5, 500)));
    records.push(Record::Diagnosis(unexplained));
    records
}

#[test]
fn injection_banner_lists_each_class_and_the_notes_that_were_not_applied() {
    let mut records = vec![session_with(1, "fp8-inject", &[("inject", "garbage@0,nan@*mlp*")])];
    let mut garbage = obs(1, 0, fp8_problem(64), Some(metrics(0.006, 1.7, 1.0)));
    garbage.flags |= flags::INJECTED;
    records.push(Record::Observation(garbage));
    records.push(Record::Observation(obs(1, 1, fp8_problem(64), Some(fp8_ok()))));
    records.push(Record::Closing(ClosingRecord {
        session_id: 1,
        calls_seen: 20,
        sampled: 4,
        checked: 2,
        skipped: vec![
            SkipCount { reason: "no_workspace".into(), count: 2 },
            SkipCount {
                reason: "fault injection not applied: scale-transpose cannot be applied to this call: A has no scales".into(),
                count: 3,
            },
        ],
        dropped: 0,
        end_time_ns: 2,
    }));
    let report = report_of(records);
    let config = only_config(&report);
    let injection = config.injection.as_ref().expect("injection recorded");
    assert_eq!(injection.specs, ["garbage@0,nan@*mlp*"]);
    assert_eq!(injection.injected_calls, 1);
    assert_eq!(injection.faults.len(), 2);
    assert_eq!(injection.faults[1].target, "sites matching '*mlp*'");
    assert_eq!(injection.not_applied.len(), 1);
    assert_eq!(
        injection.not_applied[0].reason,
        "scale-transpose cannot be applied to this call: A has no scales"
    );
    // Not an ordinary skip.
    assert_eq!(config.counters.skipped, [SkipCount { reason: "no_workspace".into(), count: 2 }]);

    let md = md_of(&report);
    let banner = "## 🧪 Fault injection active\n\n\
        > **Bugs were planted on purpose** (`QUANTSHADOW_INJECT`): failures at the targeted sites are expected and say nothing about the libraries under test.\n\
        >\n\
        > **`fp8-inject`**: `QUANTSHADOW_INJECT=garbage@0,nan@*mlp*`; 1 call faulted.\n\
        > - `garbage` at site 0: output replaced by noise of the same RMS per row\n\
        > - `nan` at sites matching '\\*mlp\\*': a single NaN in the output\n\
        >\n\
        > ⚠️ **Not applied**: these calls ran without the planted fault, so they do not test it:\n\
        > - scale-transpose cannot be applied to this call: A has no scales (3 times)\n";
    assert!(md.contains(banner), "{md}");
    assert!(md.find(banner).unwrap() < md.find("Run files:").unwrap(), "the banner comes first");
    assert!(md.contains("🧪 **Fault injection active** (`garbage@0,nan@*mlp*`): 1 call faulted on purpose; see the banner at the top."), "{md}");
    assert!(
        md.contains(
            "; skipped 2 (no\\_workspace 2); 3 fault injections not applied (see the banner); 0 dropped"
        ),
        "{md}"
    );
    // The banner says it all: no warning repeats it (stderr gets the summary line).
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    assert_eq!(
        injection.summary(),
        "FAULT INJECTION ACTIVE (QUANTSHADOW_INJECT=garbage@0,nan@*mlp*): 1 calls faulted on purpose, their failures are expected; 3 injections could not be applied"
    );
}

#[test]
fn an_unknown_fault_class_is_shown_not_hidden() {
    let mut records = configuration(1, "demo", 1, fp8_problem, |_| fp8_ok());
    records[0] = session_with(1, "demo", &[("inject", "zero@model.layers.3.mlp.down_proj,tile-rows@2")]);
    let md = md_of(&report_of(records));
    assert!(md.contains("> - `zero` at sites matching 'model.layers.3.mlp.down\\_proj': not a fault class this build knows\n"), "{md}");
    assert!(
        md.contains(
            "> - `tile-rows` at site 2: rows i % 16 == 15 wrong (copy of the row above) when M \\>= 56\n"
        ),
        "{md}"
    );
}

#[test]
fn a_diagnosed_failing_site_shows_explanation_readings_error_map_layout_and_advice() {
    let report = report_of(diagnosed_records());
    let config = only_config(&report);
    let site = &config.sites[1];
    assert_eq!(site.diagnoses, 2);
    let shown = site.diagnosis.as_ref().unwrap();
    assert_eq!((shown.call_seq, shown.explanation.as_deref()), (5, Some("a-scales-inner-major")));
    assert_eq!(site.explanation().map(|r| r.description.as_str()), Some(INNER_MAJOR));
    assert_eq!(site.pattern, Some(FailurePattern::ScaleLayout), "the pattern is kept for scripts");
    // The diagnosis' advice replaces the pattern's guess for this site, and comes first.
    assert_eq!(rule_ids(config), ["diagnosis"]);
    assert_eq!(
        advice(config, "diagnosis"),
        format!(
            "At 1 site (`model.layers.1.mlp.down_proj`) production matches the reference with {INNER_MAJOR} (cosine 0.999980, norm ratio 1.0000; the declared contract gives cosine 0.410000). Check: {}.",
            LAYOUT_ADVICE.replace('_', "\\_")
        )
    );
    assert_eq!(
        config.reason,
        format!("1 of 3 sites fails their fp8 thresholds; the failing site, `model.layers.1.mlp.down_proj` (cosine 0.410000), is explained by {INNER_MAJOR}")
    );

    let md = md_of(&report);
    assert!(md.contains(&format!("## `fp8-block`: ❌ FAIL\n\n❌ FAIL: {}.\n", config.reason)), "{md}");
    assert!(md.contains(&format!("| 1 | {} |\n", config.reason)), "summary reason column: {md}");
    assert!(md.contains(&format!("Explained by {INNER_MAJOR} (diagnosis).")), "{md}");
    let details = format!(
        "### Failing site details\n\n\
         #### `model.layers.1.mlp.down_proj` (#1)\n\n\
         - **Diagnosis** (call 5 of rank 0, 64 rows compared, the one shown of 2 diagnoses): production matches the reference with {INNER_MAJOR}: cosine 0.99998, norm ratio 1.000; declared layout gives cosine 0.41, norm ratio 1.000.\n\
         - **What to check**: Scale layout mismatch: check that the quantization kernel writes the scales in the order the GEMM is told (row- vs column-major, a transpose\\_scale flag, a fallback path that ignores it).\n\n\
         | Reading | Cosine | NMSE | Norm ratio | Explains? |\n\
         |---|--:|--:|--:|:-:|\n\
         | {INNER_MAJOR} (`a-scales-inner-major`) | 0.999980 | 4.00e-05 | 1.0000 | ✅ best explanation |\n\
         | A scales read pre-shuffled (128x4 swizzled) (`a-scales-swizzled`) | 0.620000 | 7.60e-01 | 0.9800 | – |\n\
         | A scales ignored (all 1) (`a-scales-ignored`) | 0.550000 | 9.00e-01 | 3.1000 | – |\n\
         | B scales read column-major (inner-major) (`b-scales-inner-major`) | 0.430000 | 1.14e+00 | 1.0000 | – |\n\
         | A read as e4m3fnuz (`a-fnuz`) | 0.420000 | 1.16e+00 | 0.5000 | – |\n\
         | **the declared contract** (declared) | 0.410000 | 1.18e+00 | 1.0000 | – |\n\n\
         2 more readings were evaluated (all in the JSON report).\n\n\
         Not evaluated: A and B scales swapped (B's scale buffer is smaller than A's grid).\n\n\
         **Error map** (call with M = 64, 64 rows checked):\n\n\
         - bad rows: every 16th row (i = 15 mod 16) from row 15 (4 of 64 checked, M = 64)\n\
         - bad column blocks (128 wide): all 32\n\
         - A scale blocks along M: 15, 31, 47, 63\n\n\
         **Scale layout analysis** (as the diagnosed call declared them):\n\n\
         - A scales: 1x128 blocks, grid 64x32, f32, OuterMajor, ld 32, 2048 entries\n\
         - B scales: 128x128 blocks, grid 32x32, f32, OuterMajor, ld 32, 1024 entries\n"
    );
    assert!(md.contains(&details), "{md}");
    assert!(md.find("### Failing site details").unwrap() < md.find("### Recommendations").unwrap());
    assert!(md.contains("1. **Diagnosis names the bug**: At 1 site"), "{md}");
    assert!(!md.contains("Scale layout mismatch suspected"), "no contradicting guess: {md}");
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
}

#[test]
fn the_most_recent_explained_diagnosis_wins_and_orphans_are_warned() {
    let mut records = diagnosed_records();
    records.push(Record::Diagnosis(layout_diagnosis(1, 1, 12, 1200)));
    let mut orphan = layout_diagnosis(1, 99, 3, 100);
    orphan.site_id = 0xdead;
    records.push(Record::Diagnosis(orphan));
    let report = report_of(records);
    let config = only_config(&report);
    assert_eq!(config.sites[1].diagnoses, 3);
    assert_eq!(config.sites[1].diagnosis.as_ref().unwrap().call_seq, 12);
    assert_eq!(
        config.warnings,
        ["1 diagnosis record is about sites with no observation in the given run files: not shown"]
    );
}

#[test]
fn a_failing_site_without_diagnosis_gets_its_onset_m_and_a_computed_scale_layout() {
    let mut records = vec![session(1, "tile", 0)];
    for (seq, (m, cosine)) in [(1u64, 0.9999), (55, 0.9999), (56, 0.94), (128, 0.93)].into_iter().enumerate()
    {
        let mut o =
            obs(1, 0, fp8_problem(m), Some(metrics(cosine, if cosine < 0.99 { 0.1 } else { 1e-4 }, 1.0)));
        o.call_seq = seq as u64;
        records.push(Record::Observation(o));
    }
    // A second site fails at M = 8 and 128 but passes at 64: no onset.
    for (seq, (m, cosine)) in [(8u64, 0.5), (64, 0.9999), (128, 0.5)].into_iter().enumerate() {
        let mut o =
            obs(1, 1, fp8_problem(m), Some(metrics(cosine, if cosine < 0.99 { 0.5 } else { 1e-4 }, 1.0)));
        o.call_seq = 10 + seq as u64;
        records.push(Record::Observation(o));
    }
    records.push(closing(1, 7));
    let report = report_of(records);
    let config = only_config(&report);
    let onset = config.sites[0].onset.as_ref().expect("fails from M = 56 on");
    assert_eq!((onset.first_failing_m, onset.passing_m.as_slice()), (56, &[1u64, 55][..]));
    assert_eq!(onset.describe(), "fails only from M >= 56 (calls with M in {1, 55} pass)");
    assert_eq!(config.sites[1].onset, None);
    // The worst call of site 0 is M = 56 (largest NMSE among failing calls: both 0.1, first kept).
    let md = md_of(&report);
    assert!(md.contains("rows mode, backend `hipblaslt`): cosine 0.940000 is below 0.999; NMSE 1.00e-01 is above 2.00e-03. Fails only from M \\>= 56 (calls with M in {1, 55} pass).\n"), "{md}");
    let worst_m = config.sites[0].worst_call.as_ref().unwrap().m;
    let details = format!(
        "#### `model.layers.0.mlp.down_proj` (#0)\n\n\
         - **Diagnosis**: none recorded for this site (`QUANTSHADOW_DIAGNOSE=on-fail` diagnoses failing sites).\n\
         - **M onset**: Fails only from M \\>= 56 (calls with M in {{1, 55}} pass).\n\
         - **What to check**: see **Scale layout mismatch suspected** under Recommendations.\n\n\
         **Scale layout analysis** (as declared, at the worst call's M = {worst_m}):\n\n\
         - A scales: 1x128 blocks, grid {worst_m}x32, f32, OuterMajor, ld 32, {} entries\n\
         - B scales: 128x128 blocks, grid 32x32, f32, OuterMajor, ld 32, 1024 entries\n",
        worst_m * 32
    );
    assert!(md.contains(&details), "{md}");
    assert_eq!(
        config.reason,
        "2 of 2 sites fail their fp8 thresholds; the worst, `model.layers.1.mlp.down_proj` (cosine 0.500000), looks like a scale layout mismatch"
    );
}

#[test]
fn a_passing_sites_diagnosis_is_listed_compactly() {
    let mut records = configuration(1, "every-site", 2, fp8_problem, |_| fp8_ok());
    let mut d = layout_diagnosis(1, 0, 0, 10);
    d.readings = vec![
        reading("declared", "the declared contract", 0.99999, 1.0, true),
        reading("a-scales-inner-major", INNER_MAJOR, 0.41, 1.0, false),
    ];
    d.explanation = None;
    d.recommendation = None;
    d.error_map = None;
    d.text = "the declared contract is the best reading (cosine 0.99999, norm ratio 1.000); no alternative reading explains production better".into();
    records.push(Record::Diagnosis(d));
    let report = report_of(records);
    let config = only_config(&report);
    assert_eq!(config.verdict, Verdict::Pass);
    assert_eq!(rule_ids(config), ["pass"]);
    assert_eq!(config.reason, "all 2 sites within thresholds (lowest cosine 0.999950)");
    let md = md_of(&report);
    assert!(md.contains(
        "### Diagnoses of passing sites\n\n\
         - `model.layers.0.mlp.down_proj` (#0, ✅ PASS): the declared contract is the best reading (cosine 0.99999, norm ratio 1.000); no alternative reading explains production better. Scales: A scales: 1x128 blocks, grid 64x32, f32, OuterMajor, ld 32, 2048 entries; B scales: 128x128 blocks, grid 32x32, f32, OuterMajor, ld 32, 1024 entries.\n"
    ), "{md}");
    assert!(!md.contains("### Failing site") && !md.contains("Diagnosis names the bug"), "{md}");
    assert!(md.contains("✅ PASS: all 2 sites within thresholds (lowest cosine 0.999950).\n"), "{md}");
}

const POLICY: &str = r#"
[[rule]]
name = "no ASM GEMM on gfx950 in CK-free mode"
why = "aiter's ASM a8w8 GEMM returned garbage (cosine 0.006) on gfx950"
when = { arch = "gfx950*", env = { ATOM_CK_FREE = "1" } }
sites = { a_format = "e4m3*" }
deny = { kernel = "*asm*gemm*" }

[[rule]]
name = "CK-free: every FP8 GEMM by Triton"
when = { env = { ATOM_CK_FREE = "1" } }
sites = { a_format = "e4m3*" }
require = { kernel = "*triton*" }
"#;

const ASM: &str = "_ZN5aiter17asm_a8w8_gemm_128";
const TRITON: &str = "_gemm_a8w8_blockscale_triton_kernel";

/// A CK-free run on gfx950 (every metric healthy): site 0 served by the ASM kernel, site 1 by
/// Triton, site 2 by Triton twice and the ASM kernel once.
fn policy_records(ck_free: Option<&str>) -> Vec<Record> {
    let mut settings =
        vec![("policy", "/etc/qs/ck-free.toml"), ("policy.text", POLICY), ("policy.env", "ATOM_CK_FREE")];
    if let Some(value) = ck_free {
        settings.push(("env.ATOM_CK_FREE", value));
    }
    let mut records = vec![session_with(1, "ck-free", &settings)];
    let served = [(0u32, ASM), (1, TRITON), (2, TRITON), (2, TRITON), (2, ASM)];
    for (seq, (ordinal, kernel)) in served.into_iter().enumerate() {
        let mut o = obs(1, ordinal, fp8_problem(64), Some(fp8_ok()));
        o.entry_point = "hipModuleLaunchKernel".into();
        o.backend = Some(kernel.into());
        o.call_seq = seq as u64;
        records.push(Record::Observation(o));
    }
    records.push(closing(1, 5));
    records
}

#[test]
fn a_recorded_policy_fails_the_configuration_and_quotes_the_rule() {
    let report = report_of(policy_records(Some("1")));
    let config = only_config(&report);
    assert_eq!(config.verdict, Verdict::Fail);
    assert_eq!(config.summary.sites_failing, 0, "every metric is healthy");
    let violations = config.policy_violations();
    let found: Vec<(u32, &str, Option<&str>)> =
        violations.iter().map(|v| (v.ordinal, v.rule.as_str(), v.kernel.as_deref())).collect();
    assert_eq!(
        found,
        [
            (0, "no ASM GEMM on gfx950 in CK-free mode", Some(ASM)),
            (0, "CK-free: every FP8 GEMM by Triton", Some(ASM)),
            (2, "no ASM GEMM on gfx950 in CK-free mode", Some(ASM)),
            (2, "CK-free: every FP8 GEMM by Triton", Some(ASM)),
        ]
    );
    assert_eq!(
        config.reason,
        "rules \"no ASM GEMM on gfx950 in CK-free mode\" and \"CK-free: every FP8 GEMM by Triton\" are broken at 2 sites"
    );
    assert_eq!(rule_ids(config), ["policy"]);
    let policy_advice = advice(config, "policy");
    assert!(policy_advice.starts_with(
        "Rule \"no ASM GEMM on gfx950 in CK-free mode\" of policy `/etc/qs/ck-free.toml` is broken at 2 sites (`model.layers.0.mlp.down_proj`, `model.layers.2.mlp.down_proj`), served by `_ZN5aiter17asm_a8w8_gemm_128`. The rule exists because: aiter's ASM a8w8 GEMM returned garbage (cosine 0.006) on gfx950."
    ), "{policy_advice}");

    let md = md_of(&report);
    assert!(md.contains(&format!("❌ FAIL: {}.\n", config.reason)), "{md}");
    assert!(md.contains(
        "### Backend policy\n\n\
         - Policies: `/etc/qs/ck-free.toml` (recorded by the run, 2 rules)\n\
         - Environment the rules name: `ATOM_CK_FREE=1`\n\n\
         ❌ 2 rules broken, at 4 sites and kernels:\n\n\
         1. site 0 was served by kernel `_ZN5aiter17asm_a8w8_gemm_128` via `hipModuleLaunchKernel`, which rule \"no ASM GEMM on gfx950 in CK-free mode\" denies (kernel = \"\\*asm\\*gemm\\*\") (`model.layers.0.mlp.down_proj`). Why: aiter's ASM a8w8 GEMM returned garbage (cosine 0.006) on gfx950.\n\
         2. site 0 was served by kernel `_ZN5aiter17asm_a8w8_gemm_128` via `hipModuleLaunchKernel`; rule \"CK-free: every FP8 GEMM by Triton\" requires kernel = \"\\*triton\\*\" (`model.layers.0.mlp.down_proj`).\n"
    ), "{md}");
    assert!(md.contains(
        "| # | Site | Entry point | Serving kernel (calls) | Formats | Policy |\n|--:|---|---|---|---|:-:|\n"
    ), "{md}");
    assert!(md.contains(&format!(
        "| 1 | `model.layers.1.mlp.down_proj` | `hipModuleLaunchKernel` | `{TRITON}` (1) | `e4m3fn*e4m3fn->bf16` | ✅ |\n\
         | 2 | `model.layers.2.mlp.down_proj` | `hipModuleLaunchKernel` | `{TRITON}` (2), `{ASM}` (1) | `e4m3fn*e4m3fn->bf16` | ❌ \"no ASM GEMM on gfx950 in CK-free mode\", \"CK-free: every FP8 GEMM by Triton\" |\n"
    )), "{md}");
    // The policy's TOML is not dumped into the settings line.
    assert!(md.contains("- Settings: `env.ATOM_CK_FREE=1`, `mode=rows`, `policy=/etc/qs/ck-free.toml`, `policy.env=ATOM_CK_FREE`\n"), "{md}");
}

#[test]
fn a_recorded_policy_out_of_force_passes_and_says_so() {
    // ATOM_CK_FREE is named by the policy and was unset: neither rule is in force.
    let report = report_of(policy_records(None));
    let config = only_config(&report);
    assert_eq!(config.verdict, Verdict::Pass);
    assert!(config.policy_violations().is_empty());
    assert_eq!(
        config.reason,
        "all 3 sites within thresholds (lowest cosine 0.999950); the backend policy holds"
    );
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    let md = md_of(&report);
    assert!(md.contains("- Environment the rules name: `ATOM_CK_FREE` unset\n\n✅ No rule is broken at any of the 3 sites.\n"), "{md}");
}

#[test]
fn an_unreadable_recorded_policy_is_a_warning() {
    let mut records = policy_records(Some("1"));
    records[0] =
        session_with(1, "ck-free", &[("policy", "p.toml"), ("policy.text", "[[rule]\n"), ("policy.env", "")]);
    let report = report_of(records);
    let config = only_config(&report);
    assert_eq!(config.verdict, Verdict::Pass);
    assert_eq!(config.warnings.len(), 1);
    assert!(
        config.warnings[0]
            .starts_with("the backend policy the run recorded could not be read (policy p.toml: "),
        "{:?}",
        config.warnings
    );
}

fn report_with_policy(records: Vec<Record>, policy: &str) -> Report {
    let thresholds = Thresholds::default();
    let mut builder = ReportBuilder::new(&thresholds);
    builder.set_policy(Policy::parse(policy, "strict.toml").unwrap());
    builder.add_source(LoadedRun::from_records("test.qsr", Vec::new()).source);
    for record in &records {
        builder.add_record(record);
    }
    builder.finish()
}

#[test]
fn a_report_time_policy_needing_an_unrecorded_variable_warns_and_does_not_fail() {
    // An older run: no policy recorded, so no environment either.
    let mut records = policy_records(None);
    records[0] = session(1, "ck-free", 0);
    let undecidable = r#"
[[rule]]
name = "CK-free: every FP8 GEMM by Triton"
when = { env = { ATOM_CK_FREE = "1" } }
require = { kernel = "*triton*" }

[[rule]]
name = "no ASM on NVIDIA"
when = { arch = "sm_*", env = { SOME_FLAG = "1" } }
deny = { kernel = "*asm*" }
"#;
    let report = report_with_policy(records.clone(), undecidable);
    assert_eq!(report.policy_file.as_deref(), Some("strict.toml"));
    let config = only_config(&report);
    assert_eq!(config.verdict, Verdict::Pass);
    let expected = "policy strict.toml: rule \"CK-free: every FP8 GEMM by Triton\" cannot be decided: the run did not record ATOM_CK_FREE (a run records the variables its own QUANTSHADOW_POLICY names: run with this policy to have them recorded); it is not held against this configuration";
    // The arch rule is out of force on gfx950 whatever SOME_FLAG was: no warning for it.
    assert_eq!(config.warnings, [expected]);
    assert_eq!(config.policy.as_ref().unwrap().undecided, [expected]);
    assert_eq!(config.reason, "all 3 sites within thresholds (lowest cosine 0.999950); the backend policy holds (1 rule could not be decided)");
    let md = md_of(&report);
    assert!(
        md.contains(
            "- Policies: `strict.toml` (`--policy`, 2 rules)\n- ⚠️ Undecided: policy strict.toml: rule"
        ),
        "{md}"
    );
    assert!(
        md.contains("Backend policy `strict.toml` (`--policy`) is evaluated against every configuration"),
        "{md}"
    );

    // A rule the run's facts decide is held against it.
    let decidable = format!("{undecidable}\n[[rule]]\nname = \"no ASM on gfx950\"\nwhen = {{ arch = \"gfx950\" }}\ndeny = {{ kernel = \"*asm*\" }}\n");
    let report = report_with_policy(records, &decidable);
    let config = only_config(&report);
    assert_eq!(config.verdict, Verdict::Fail);
    let v = config.policy_violations();
    assert_eq!(
        v.iter().map(|v| (v.ordinal, v.source)).collect::<Vec<_>>(),
        [(0, model::PolicySource::Report), (2, model::PolicySource::Report)]
    );
    assert_eq!(config.reason, "rule \"no ASM on gfx950\" is broken at 2 sites");
}

#[test]
fn a_policy_given_twice_counts_each_violation_once() {
    let report = report_with_policy(policy_records(Some("1")), POLICY);
    let config = only_config(&report);
    assert_eq!(config.policy_violations().len(), 4);
    let sources: Vec<_> =
        config.policy.as_ref().unwrap().policies.iter().map(|p| (p.origin.as_str(), p.source)).collect();
    assert_eq!(
        sources,
        [
            ("/etc/qs/ck-free.toml", model::PolicySource::Recorded),
            ("strict.toml", model::PolicySource::Report)
        ]
    );
}

#[test]
fn json_carries_injection_diagnosis_policy_backends_and_reasons() {
    let mut records = diagnosed_records();
    records[0] = session_with(
        1,
        "fp8-block",
        &[
            ("inject", "scale-transpose@1"),
            ("policy", "p.toml"),
            ("policy.text", "[[rule]]\nname = \"no hipBLASLt\"\ndeny = { kernel = \"hipblaslt\" }\n"),
            ("policy.env", ""),
        ],
    );
    let report = report_of(records);
    let value: serde_json::Value = serde_json::from_str(&render_json(&report)).unwrap();
    let config = &value["configurations"][0];
    assert_eq!(config["verdict"], "FAIL");
    assert_eq!(config["reason"], only_config(&report).reason.as_str());
    assert!(config["reason"].as_str().unwrap().starts_with("1 of 3 sites fails their fp8 thresholds and rule \"no hipBLASLt\" is broken at 3 sites; the failing site"));
    assert_eq!(config["injection"]["specs"][0], "scale-transpose@1");
    assert_eq!(
        config["injection"]["faults"][0]["effect"],
        "one operand's scales passed in the other storage order"
    );
    assert_eq!(config["policy"]["violations"][0]["rule"], "no hipBLASLt");
    assert_eq!(config["policy"]["violations"][0]["kernel"], "hipblaslt");
    assert_eq!(config["policy"]["violations"][0]["site"], "model.layers.0.mlp.down_proj");
    let site = &config["sites"][1];
    assert_eq!(site["diagnosis"]["explanation"], "a-scales-inner-major");
    assert_eq!(site["diagnosis"]["error_map"]["row_period"]["period"], 16);
    assert_eq!(site["diagnoses"], 2);
    assert_eq!(site["serving"][0]["kernel"], "hipblaslt");
    assert_eq!(site["serving"][0]["calls"], 1);
    assert_eq!(
        site["scale_layout"][0],
        "A scales: 1x128 blocks, grid 64x32, f32, OuterMajor, ld 32, 2048 entries"
    );
    assert_eq!(config["recommendations"][0]["rule"], "diagnosis");
    assert_eq!(config["recommendations"][1]["rule"], "policy");
}

#[test]
fn old_records_get_nothing_new_but_the_reason_and_backend_table() {
    let report = three_configurations();
    for config in &report.configurations {
        assert!(config.injection.is_none() && config.policy.is_none());
        assert!(config.sites.iter().all(|s| s.diagnosis.is_none() && s.diagnoses == 0));
        assert!(config.warnings.is_empty(), "{}: {:?}", config.label, config.warnings);
    }
    let md = md_of(&report);
    for absent in [
        "🧪",
        "Fault injection",
        "### Backend policy",
        "Diagnoses of passing sites",
        "Undecided",
        "Diagnosis names",
    ] {
        assert!(!md.contains(absent), "{absent}: {md}");
    }
    assert_eq!(report.configurations[0].reason, "all 3 sites within thresholds (lowest cosine 1.000000)");
    assert_eq!(
        report.configurations[1].reason,
        "3 of 3 sites fail their fp8 thresholds; the worst, `model.layers.0.mlp.down_proj` (cosine 1.000000, norm ratio 0.5000), is off by an exact factor of 0.5"
    );
    assert_eq!(
        report.configurations[2].reason,
        "2 of 3 sites fail their fp8 thresholds; the worst, `model.layers.1.mlp.down_proj` (cosine 0.006000), returns output unrelated to the reference"
    );
    // Backend selection is collapsed without a policy.
    assert!(md.contains("### Backend selection\n\n<details><summary>Kernels serving the 3 sites: 1 distinct</summary>\n\n| # | Site | Entry point | Serving kernel (calls) | Formats |\n"), "{md}");
    assert!(md.contains("| 0 | `model.layers.0.mlp.down_proj` | `hipblasLtMatmul` | `hipblaslt` (1) | `bf16*bf16->bf16` |\n"), "{md}");
    // A failing site of an old run still gets its scale layout analysis.
    assert!(
        md.contains("#### `model.layers.1.mlp.down_proj` (#1)\n\n- **Diagnosis**: none recorded"),
        "{md}"
    );
    let value: serde_json::Value = serde_json::from_str(&render_json(&report)).unwrap();
    assert!(
        value["configurations"][0]["injection"].is_null() && value["configurations"][0]["policy"].is_null()
    );
}
