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
    let config = only_config(&report_of(records)).clone();
    assert_eq!(config.sites[0].status, SiteStatus::Pass);
    assert_eq!(config.sites[1].status, SiteStatus::Fail);
    assert_eq!(config.sites[1].pattern, Some(FailurePattern::Precision));
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
    assert!(advice(config, "m-dependent").contains("fails only for M >= 64 (passes for M <= 48)"));
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
fn every_rule_is_exercised_by_a_scenario() {
    // Keeps the table and the scenarios above in step: a new rule needs a scenario.
    let exercised = [
        "no-data",
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
