//! Record encoding: round trips of every record kind and enum value, the wire layout seen
//! through the generated accessors, schema versioning, hostile input, and the committed
//! generated code against flatc.

use flatbuffers::{FlatBufferBuilder, UnionWIPOffset, WIPOffset};
use quantshadow_runtime::formats::Format;
use quantshadow_runtime::metrics::{LogitsMetrics, Metrics, WorstRow};
use quantshadow_runtime::problem::{
    Activation, ComputeType, Order, ScaleGranularity, ScaleSpec, ScaleStorage, Transpose,
};
use quantshadow_runtime::record::{
    decode, encode, flags, CheckMode, ClosingRecord, DiagnosisRecord, Encoder, ErrorMapSummary,
    GemmObservation, KeyValue, LogitsRow, ProblemSummary, ReadingSummary, Record, RecordError,
    RowPeriodSummary, SessionRecord, SkipCount, SCHEMA_MAJOR, SCHEMA_MINOR,
};
use quantshadow_runtime::rng::SplitMix64;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

// The generated code is private to the crate; tests compile their own copy to read encoded
// bytes independently of codec.rs and to build records the encoder never writes (other
// versions, unknown enum values, fields of a future minor).
#[allow(
    unused_imports,
    dead_code,
    non_snake_case,
    unsafe_op_in_unsafe_fn,
    mismatched_lifetime_syntaxes,
    clippy::all
)]
#[rustfmt::skip]
#[path = "../src/record/generated.rs"]
mod generated;
use generated::quantshadow::schema as fb;

// ---------------------------------------------------------------------------------------------
// Sample records

/// All variants of a Rust enum, with an exhaustive match so that a new variant breaks the
/// build here until it is listed, and therefore tested.
macro_rules! all_variants {
    ($t:ident: $($v:ident),+ $(,)?) => {{
        let _exhaustive = |x: $t| match x {
            $($t::$v)|+ => (),
        };
        [$($t::$v),+]
    }};
}

fn check_modes() -> [CheckMode; 4] {
    all_variants!(CheckMode: Observe, Sketch, Rows, Full)
}
fn transposes() -> [Transpose; 2] {
    all_variants!(Transpose: N, T)
}
fn orders() -> [Order; 2] {
    all_variants!(Order: RowMajor, ColMajor)
}
fn activations() -> [Activation; 3] {
    all_variants!(Activation: None, Relu, GeluTanh)
}
fn compute_types() -> [ComputeType; 7] {
    all_variants!(ComputeType: F32, F32FastF16, F32FastBf16, F32FastTf32, F16, F64, I32)
}
fn scale_storages() -> [ScaleStorage; 3] {
    all_variants!(ScaleStorage: OuterMajor, InnerMajor, Swizzled128x4)
}
fn granularities() -> Vec<ScaleGranularity> {
    let _exhaustive = |g: ScaleGranularity| match g {
        ScaleGranularity::Tensor
        | ScaleGranularity::PerOuter
        | ScaleGranularity::PerInner
        | ScaleGranularity::Block { .. }
        | ScaleGranularity::Mx32
        | ScaleGranularity::Nvfp4 => (),
    };
    vec![
        ScaleGranularity::Tensor,
        ScaleGranularity::PerOuter,
        ScaleGranularity::PerInner,
        ScaleGranularity::Block { outer: 1, inner: 128 },
        ScaleGranularity::Block { outer: 128, inner: 128 },
        ScaleGranularity::Block { outer: 0, inner: 0 },
        ScaleGranularity::Block { outer: u32::MAX, inner: 7 },
        ScaleGranularity::Mx32,
        ScaleGranularity::Nvfp4,
    ]
}

fn kv(key: &str, value: &str) -> KeyValue {
    KeyValue { key: key.into(), value: value.into() }
}

fn session_full() -> SessionRecord {
    SessionRecord {
        session_id: 0xDEAD_BEEF_0123_4567,
        host: "gpu-node-17".into(),
        pid: 4_000_001,
        rank: 7,
        device_name: "NVIDIA H200".into(),
        device_arch: "sm_90a".into(),
        library_versions: vec![kv("cublasLt", "130000"), kv("torch", "2.11.0"), kv("", "")],
        label: "fp8 run (ünïcödé)".into(),
        start_time_ns: u64::MAX,
        settings: vec![kv("mode", "sketch"), kv("sample", "0.01")],
    }
}

fn session_minimal() -> SessionRecord {
    SessionRecord {
        session_id: 0,
        host: String::new(),
        pid: 0,
        rank: -1,
        device_name: String::new(),
        device_arch: String::new(),
        library_versions: vec![],
        label: String::new(),
        start_time_ns: 0,
        settings: vec![],
    }
}

fn problem_full() -> ProblemSummary {
    ProblemSummary {
        m: 4096,
        n: 14336,
        k: 4096,
        batch: 3,
        trans_a: Transpose::T,
        trans_b: Transpose::N,
        a_format: Format::E4m3fn,
        b_format: Format::E4m3fnuz,
        d_format: Format::Bf16,
        a_order: Order::ColMajor,
        b_order: Order::RowMajor,
        d_order: Order::ColMajor,
        a_scale: Some(ScaleSpec {
            granularity: ScaleGranularity::Block { outer: 1, inner: 128 },
            format: Format::F32,
            storage: ScaleStorage::InnerMajor,
            ld: 4096,
            batch_stride: 1 << 40,
        }),
        b_scale: Some(ScaleSpec {
            granularity: ScaleGranularity::Mx32,
            format: Format::Ue8m0,
            storage: ScaleStorage::Swizzled128x4,
            ld: 0,
            batch_stride: 0,
        }),
        has_bias: true,
        activation: Activation::GeluTanh,
        compute: ComputeType::F32FastTf32,
        fast_accum: true,
        has_d_scale: true,
    }
}

/// Every field at its zero value: nothing that FlatBuffers omits may come back different.
fn problem_minimal() -> ProblemSummary {
    ProblemSummary {
        m: 0,
        n: 0,
        k: 0,
        batch: 0,
        trans_a: Transpose::N,
        trans_b: Transpose::N,
        a_format: Format::F32,
        b_format: Format::F32,
        d_format: Format::F32,
        a_order: Order::RowMajor,
        b_order: Order::RowMajor,
        d_order: Order::RowMajor,
        a_scale: None,
        b_scale: None,
        has_bias: false,
        activation: Activation::None,
        compute: ComputeType::F32,
        fast_accum: false,
        has_d_scale: false,
    }
}

fn metrics_full() -> Metrics {
    Metrics {
        cosine: 0.999_871_234,
        nmse: 2.5e-4,
        sqnr_db: 36.02,
        norm_ratio: 0.5,
        max_abs_err: 1.0e300,
        worst_row: Some(WorstRow { index: 55, cosine: -0.25 }),
        nan_prod: 1,
        inf_prod: 2,
        nan_ref: 3,
        inf_ref: u64::MAX,
        count: 1 << 33,
    }
}

fn observation_full() -> GemmObservation {
    GemmObservation {
        session_id: 0xDEAD_BEEF_0123_4567,
        site_id: 0x0123_4567_89AB_CDEF,
        site_ordinal: 311,
        site_name: Some("model.layers.3.mlp.down_proj".into()),
        call_seq: 1 << 50,
        entry_point: "cublasLtMatmul".into(),
        backend: Some("sm90_xmma_gemm_e4m3e4m3_bf16".into()),
        problem: problem_full(),
        mode: CheckMode::Rows,
        metrics: Some(metrics_full()),
        rows_checked: 256,
        sketch_seed: u64::MAX - 1,
        sketch_prod: vec![1.0, -2.5, 3.25e-20, f32::MAX],
        sketch_ref: vec![1.0, -2.5, 3.25e-20, f32::MIN_POSITIVE, 0.0],
        logits: Some(LogitsMetrics { kl: 1.5e-3, top1_agree: true, topk_overlap: 0.8, k: 5 }),
        logits_rows: vec![
            LogitsRow { row: 0, prod_top: vec![(17, 9.5), (3, 8.25)], ref_top: vec![(17, 9.75)] },
            LogitsRow { row: 1 << 40, prod_top: vec![], ref_top: vec![(u32::MAX, -1.0)] },
        ],
        flags: flags::GRAPH_REPLAY | flags::INJECTED | flags::ROW_SAMPLE | flags::REFERENCE_NONFINITE,
        timestamp_ns: 1_750_000_000_000_000_000,
    }
}

fn observation_minimal() -> GemmObservation {
    GemmObservation {
        session_id: 0,
        site_id: 0,
        site_ordinal: 0,
        site_name: None,
        call_seq: 0,
        entry_point: String::new(),
        backend: None,
        problem: problem_minimal(),
        mode: CheckMode::Observe,
        metrics: None,
        rows_checked: 0,
        sketch_seed: 0,
        sketch_prod: vec![],
        sketch_ref: vec![],
        logits: None,
        logits_rows: vec![],
        flags: 0,
        timestamp_ns: 0,
    }
}

fn closing_full() -> ClosingRecord {
    ClosingRecord {
        session_id: 0xDEAD_BEEF_0123_4567,
        calls_seen: 1_000_000,
        sampled: 10_000,
        checked: 9_990,
        skipped: vec![
            SkipCount { reason: "capturing stream".into(), count: 7 },
            SkipCount { reason: "unsupported format".into(), count: 3 },
            SkipCount { reason: String::new(), count: 0 },
        ],
        dropped: 42,
        end_time_ns: u64::MAX,
    }
}

fn closing_minimal() -> ClosingRecord {
    ClosingRecord {
        session_id: 0,
        calls_seen: 0,
        sampled: 0,
        checked: 0,
        skipped: vec![],
        dropped: 0,
        end_time_ns: 0,
    }
}

/// Some of each kind, with optional fields set and unset.
fn sample_records() -> Vec<Record> {
    let mut some_options = observation_full();
    some_options.site_name = Some(String::new());
    some_options.backend = None;
    some_options.metrics = Some(Metrics { worst_row: None, ..metrics_full() });
    some_options.logits = None;
    some_options.problem.a_scale = None;
    let mut negative_rank = session_full();
    negative_rank.rank = i32::MIN;
    let mut rank_zero = session_minimal();
    rank_zero.rank = 0; // 0 differs from the schema default (-1): must be written
    vec![
        Record::Session(session_full()),
        Record::Session(session_minimal()),
        Record::Session(negative_rank),
        Record::Session(rank_zero),
        Record::Observation(observation_full()),
        Record::Observation(observation_minimal()),
        Record::Observation(some_options),
        Record::Closing(closing_full()),
        Record::Closing(closing_minimal()),
        Record::Diagnosis(diagnosis_full()),
        Record::Diagnosis(diagnosis_minimal()),
    ]
}

fn diagnosis_full() -> DiagnosisRecord {
    let reading = |id: &str, declared: bool, cosine: f64, explains: bool| ReadingSummary {
        id: id.into(),
        description: format!("reading {id}"),
        declared,
        cosine,
        nmse: -0.0,
        norm_ratio: 1.0,
        nonfinite_mismatch: u64::MAX,
        explains,
    };
    DiagnosisRecord {
        session_id: 7,
        site_id: u64::MAX,
        site_ordinal: u32::MAX,
        call_seq: 42,
        rows: 256,
        readings: vec![
            reading("a-scales-inner-major", false, 0.99999, true),
            reading("declared", true, 0.41, false),
        ],
        skipped: vec![KeyValue { key: "B scales ignored".into(), value: "no B scales".into() }],
        explanation: Some("a-scales-inner-major".into()),
        equivalent: vec!["A and B scales swapped".into()],
        text: "production matches the reference with A scales read column-major".into(),
        recommendation: Some("check the scale layout".into()),
        error_map: Some(ErrorMapSummary {
            m: 4096,
            rows_checked: 256,
            bad_rows: vec![15, 31, 47],
            bad_rows_total: 3,
            row_period: Some(RowPeriodSummary { period: 16, offset: 15, first_row: 15 }),
            col_block: 128,
            col_blocks: 32,
            bad_col_blocks: vec![0, 31],
            bad_a_scale_blocks: Some(vec![]),
            bad_b_scale_blocks: None,
            summary: "bad rows: every 16th row".into(),
        }),
        scale_layout: vec!["A scales: none".into(), "B scales: per-tensor".into()],
        timestamp_ns: 1,
    }
}

fn diagnosis_minimal() -> DiagnosisRecord {
    DiagnosisRecord {
        session_id: 0,
        site_id: 0,
        site_ordinal: 0,
        call_seq: 0,
        rows: 0,
        readings: vec![],
        skipped: vec![],
        explanation: None,
        equivalent: vec![],
        text: String::new(),
        recommendation: None,
        error_map: None,
        scale_layout: vec![],
        timestamp_ns: 0,
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// Bit patterns of every floating-point value in a record, in a fixed order: NaN != NaN and
/// -0.0 == 0.0, so float fields are compared as bits.
fn float_bits(record: &Record) -> Vec<u64> {
    let mut out = Vec::new();
    if let Record::Observation(o) = record {
        if let Some(m) = &o.metrics {
            out.extend([m.cosine, m.nmse, m.sqnr_db, m.norm_ratio, m.max_abs_err].map(f64::to_bits));
            out.extend(m.worst_row.map(|w| w.cosine.to_bits()));
        }
        if let Some(l) = &o.logits {
            out.extend([l.kl.to_bits(), l.topk_overlap.to_bits()]);
        }
        out.extend(o.sketch_prod.iter().chain(&o.sketch_ref).map(|v| v.to_bits() as u64));
        for r in &o.logits_rows {
            out.extend(r.prod_top.iter().chain(&r.ref_top).map(|e| e.1.to_bits() as u64));
        }
    }
    out
}

/// Equality that holds for NaN fields too: bit-exact floats, and Debug output for the rest
/// (Debug prints every field, and prints floats so they round-trip).
fn assert_same(decoded: &Record, original: &Record) {
    assert_eq!(float_bits(decoded), float_bits(original), "float bits differ for {original:?}");
    assert_eq!(format!("{decoded:?}"), format!("{original:?}"));
}

fn round_trip(record: &Record) -> Record {
    let bytes = encode(record);
    match decode(&bytes) {
        Ok(decoded) => decoded,
        Err(e) => panic!("decoding {record:?} failed: {e}"),
    }
}

fn observation_with(change: impl FnOnce(&mut GemmObservation)) -> Record {
    let mut o = observation_full();
    change(&mut o);
    Record::Observation(o)
}

/// The observation of an encoded record, read through the generated accessors alone.
fn wire_observation(bytes: &[u8]) -> fb::Observation<'_> {
    let envelope = fb::root_as_envelope(bytes).expect("encoder output verifies");
    envelope.record_as_observation().expect("an observation")
}

/// Builds an envelope the encoder would not write, through the generated builder.
fn envelope_with(
    major: u16,
    minor: u16,
    build: impl FnOnce(&mut FlatBufferBuilder) -> (fb::Record, WIPOffset<UnionWIPOffset>),
) -> Vec<u8> {
    let mut fbb = FlatBufferBuilder::new();
    let (record_type, record) = build(&mut fbb);
    let envelope = fb::Envelope::create(
        &mut fbb,
        &fb::EnvelopeArgs { version_major: major, version_minor: minor, record_type, record: Some(record) },
    );
    fb::finish_envelope_buffer(&mut fbb, envelope);
    fbb.finished_data().to_vec()
}

fn session_payload(fbb: &mut FlatBufferBuilder) -> (fb::Record, WIPOffset<UnionWIPOffset>) {
    let host = fbb.create_string("h");
    let s =
        fb::Session::create(fbb, &fb::SessionArgs { session_id: 9, host: Some(host), ..Default::default() });
    (fb::Record::Session, s.as_union_value())
}

/// An observation with the given mode and problem fields, for enum values the encoder never
/// writes.
fn observation_payload(
    fbb: &mut FlatBufferBuilder,
    mode: fb::CheckMode,
    problem: fb::ProblemArgs,
) -> (fb::Record, WIPOffset<UnionWIPOffset>) {
    let problem = fb::Problem::create(fbb, &problem);
    let o = fb::Observation::create(
        fbb,
        &fb::ObservationArgs { problem: Some(problem), mode, ..Default::default() },
    );
    (fb::Record::Observation, o.as_union_value())
}

/// Decodes hostile bytes, turning a panic into a test failure that names the input.
fn decode_without_panic(bytes: &[u8], what: &str) -> Result<Record, RecordError> {
    match catch_unwind(AssertUnwindSafe(|| decode(bytes))) {
        Ok(result) => result,
        Err(_) => panic!("decode panicked on {what}: {bytes:02x?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Round trips

#[test]
fn every_record_kind_round_trips_with_options_set_and_unset() {
    for record in sample_records() {
        assert_eq!(round_trip(&record), record);
    }
}

#[test]
fn every_enum_value_round_trips() {
    let mut cases = Vec::new();
    for f in Format::ALL {
        cases.push(observation_with(|o| o.problem.a_format = f));
        cases.push(observation_with(|o| o.problem.b_format = f));
        cases.push(observation_with(|o| o.problem.d_format = f));
        cases.push(observation_with(|o| o.problem.a_scale.as_mut().unwrap().format = f));
        cases.push(observation_with(|o| o.problem.b_scale.as_mut().unwrap().format = f));
    }
    for m in check_modes() {
        cases.push(observation_with(|o| o.mode = m));
    }
    for t in transposes() {
        cases.push(observation_with(|o| o.problem.trans_a = t));
        cases.push(observation_with(|o| o.problem.trans_b = t));
    }
    for order in orders() {
        cases.push(observation_with(|o| o.problem.a_order = order));
        cases.push(observation_with(|o| o.problem.b_order = order));
        cases.push(observation_with(|o| o.problem.d_order = order));
    }
    for a in activations() {
        cases.push(observation_with(|o| o.problem.activation = a));
    }
    for c in compute_types() {
        cases.push(observation_with(|o| o.problem.compute = c));
    }
    for g in granularities() {
        cases.push(observation_with(|o| o.problem.a_scale.as_mut().unwrap().granularity = g));
        cases.push(observation_with(|o| o.problem.b_scale.as_mut().unwrap().granularity = g));
    }
    for s in scale_storages() {
        cases.push(observation_with(|o| o.problem.a_scale.as_mut().unwrap().storage = s));
        cases.push(observation_with(|o| o.problem.b_scale.as_mut().unwrap().storage = s));
    }
    for bit in 0..32 {
        cases.push(observation_with(|o| o.flags = 1 << bit));
    }
    for record in cases {
        assert_eq!(round_trip(&record), record);
    }
}

#[test]
fn non_finite_and_signed_zero_floats_keep_their_bits() {
    let payload_nan = f64::from_bits(0x7FF8_0000_DEAD_BEEF);
    let specials = [
        f64::NAN,
        -f64::NAN,
        payload_nan,
        f64::INFINITY,
        f64::NEG_INFINITY,
        -0.0,
        0.0,
        f64::MIN_POSITIVE / 4.0,
    ];
    for v in specials {
        let record = observation_with(|o| {
            o.metrics = Some(Metrics {
                cosine: v,
                nmse: v,
                sqnr_db: v,
                norm_ratio: v,
                max_abs_err: v,
                worst_row: Some(WorstRow { index: 1, cosine: v }),
                ..metrics_full()
            });
            o.logits = Some(LogitsMetrics { kl: v, top1_agree: false, topk_overlap: v, k: 0 });
            o.sketch_prod = vec![v as f32, f32::from_bits(0x7FC0_1234), -0.0];
            o.sketch_ref = vec![v as f32];
            o.logits_rows =
                vec![LogitsRow { row: 3, prod_top: vec![(1, v as f32)], ref_top: vec![(2, -v as f32)] }];
        });
        let decoded = round_trip(&record);
        assert_same(&decoded, &record);
        // assert_same must itself see a sign change of zero (Debug would too, but be explicit).
        if v == 0.0 {
            let Record::Observation(o) = &decoded else { panic!("not an observation") };
            assert_eq!(o.metrics.unwrap().cosine.is_sign_negative(), v.is_sign_negative());
        }
    }
}

#[test]
fn encoder_reuse_matches_one_shot_encoding() {
    let mut encoder = Encoder::new();
    // Large first, then small, then large again: a stale tail must not leak into the output.
    let mut records = sample_records();
    records.insert(0, observation_with(|o| o.sketch_prod = (0..10_000).map(|i| i as f32).collect()));
    records.extend(sample_records().into_iter().rev());
    for record in &records {
        let reused = encoder.encode(record).to_vec();
        assert_eq!(reused, encode(record));
        assert_eq!(&decode(&reused).unwrap(), record);
    }
}

#[test]
fn decodes_from_unaligned_slices() {
    // Run files and network frames place records at arbitrary offsets.
    for record in sample_records() {
        let bytes = encode(&record);
        for shift in 1..8 {
            let mut shifted = vec![0u8; shift];
            shifted.extend_from_slice(&bytes);
            assert_eq!(decode(&shifted[shift..]).unwrap(), record);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Wire layout, read through the generated accessors rather than codec.rs

#[test]
fn envelope_carries_identifier_and_current_version() {
    for record in sample_records() {
        let bytes = encode(&record);
        assert!(fb::envelope_buffer_has_identifier(&bytes));
        assert_eq!(&bytes[4..8], b"QSR1");
        let envelope = fb::root_as_envelope(&bytes).unwrap();
        assert_eq!((envelope.version_major(), envelope.version_minor()), (SCHEMA_MAJOR, SCHEMA_MINOR));
        let expected = match record {
            Record::Session(_) => fb::Record::Session,
            Record::Observation(_) => fb::Record::Observation,
            Record::Closing(_) => fb::Record::Closing,
            Record::Diagnosis(_) => fb::Record::Diagnosis,
        };
        assert_eq!(envelope.record_type(), expected);
    }
}

#[test]
fn enum_numbers_on_the_wire_match_the_schema_names() {
    // A mapping that swapped two values in both directions would still round-trip; this reads
    // the schema's own name of the value written.
    let debug_name = |s: String| s.split([' ', '{']).next().unwrap().to_string();
    for f in Format::ALL {
        let bytes = encode(&observation_with(|o| o.problem.a_format = f));
        let wire = wire_observation(&bytes).problem().unwrap().a_format();
        assert_eq!(wire.0, f as u8);
        assert_eq!(wire.variant_name().map(str::to_ascii_lowercase).as_deref(), Some(f.name()));
    }
    for m in check_modes() {
        let bytes = encode(&observation_with(|o| o.mode = m));
        assert_eq!(
            wire_observation(&bytes).mode().variant_name(),
            Some(debug_name(format!("{m:?}")).as_str())
        );
    }
    for t in transposes() {
        let bytes = encode(&observation_with(|o| o.problem.trans_b = t));
        let wire = wire_observation(&bytes).problem().unwrap().trans_b();
        assert_eq!(wire.variant_name(), Some(debug_name(format!("{t:?}")).as_str()));
    }
    for order in orders() {
        let bytes = encode(&observation_with(|o| o.problem.d_order = order));
        let wire = wire_observation(&bytes).problem().unwrap().d_order();
        assert_eq!(wire.variant_name(), Some(debug_name(format!("{order:?}")).as_str()));
    }
    for a in activations() {
        let bytes = encode(&observation_with(|o| o.problem.activation = a));
        let wire = wire_observation(&bytes).problem().unwrap().activation();
        assert_eq!(wire.variant_name(), Some(debug_name(format!("{a:?}")).as_str()));
    }
    for c in compute_types() {
        let bytes = encode(&observation_with(|o| o.problem.compute = c));
        let wire = wire_observation(&bytes).problem().unwrap().compute();
        assert_eq!(wire.variant_name(), Some(debug_name(format!("{c:?}")).as_str()));
    }
    for g in granularities() {
        let bytes = encode(&observation_with(|o| o.problem.a_scale.as_mut().unwrap().granularity = g));
        let wire = wire_observation(&bytes).problem().unwrap().a_scale().unwrap();
        assert_eq!(wire.granularity().variant_name(), Some(debug_name(format!("{g:?}")).as_str()));
        let dims = match g {
            ScaleGranularity::Block { outer, inner } => (outer, inner),
            _ => (0, 0),
        };
        assert_eq!((wire.block_outer(), wire.block_inner()), dims);
    }
    for s in scale_storages() {
        let bytes = encode(&observation_with(|o| o.problem.b_scale.as_mut().unwrap().storage = s));
        let wire = wire_observation(&bytes).problem().unwrap().b_scale().unwrap().storage();
        assert_eq!(wire.variant_name(), Some(debug_name(format!("{s:?}")).as_str()));
    }
}

#[test]
fn absent_fields_read_as_unknown() {
    // What another writer (or one from before a field existed) leaves out: empty tables.
    let bytes = envelope_with(SCHEMA_MAJOR, SCHEMA_MINOR, |fbb| {
        let s = fb::Session::create(fbb, &fb::SessionArgs::default());
        (fb::Record::Session, s.as_union_value())
    });
    let fbb_default_session = SessionRecord { rank: -1, ..session_minimal() };
    assert_eq!(decode(&bytes).unwrap(), Record::Session(fbb_default_session));

    let bytes = envelope_with(SCHEMA_MAJOR, SCHEMA_MINOR, |fbb| {
        let metrics = fb::Metrics::create(fbb, &fb::MetricsArgs::default());
        let problem = fb::Problem::create(fbb, &fb::ProblemArgs::default());
        let o = fb::Observation::create(
            fbb,
            &fb::ObservationArgs {
                problem: Some(problem),
                metrics: Some(metrics),
                mode: fb::CheckMode::Sketch,
                ..Default::default()
            },
        );
        (fb::Record::Observation, o.as_union_value())
    });
    let Record::Observation(o) = decode(&bytes).unwrap() else { panic!("not an observation") };
    let m = o.metrics.expect("metrics table present");
    // A metric nobody wrote must never read as a perfect score.
    assert!(m.cosine.is_nan() && m.nmse.is_nan() && m.sqnr_db.is_nan());
    assert!(m.norm_ratio.is_nan() && m.max_abs_err.is_nan() && m.worst_row.is_none());
    assert_eq!(o.entry_point, "");
    assert_eq!(o.problem, problem_minimal());
}

// ---------------------------------------------------------------------------------------------
// Versions and unknown values

#[test]
fn another_major_version_is_refused_naming_both_versions() {
    for (major, minor) in [(2u16, 0u16), (2, 7), (0, 3), (u16::MAX, u16::MAX)] {
        let bytes = envelope_with(major, minor, session_payload);
        let err = decode(&bytes).unwrap_err();
        assert_eq!(
            err,
            RecordError::UnsupportedVersion {
                found_major: major,
                found_minor: minor,
                supported_major: SCHEMA_MAJOR
            }
        );
        let message = err.to_string();
        assert!(message.contains(&format!("{major}.{minor}")), "{message}");
        assert!(message.contains(&format!("{SCHEMA_MAJOR}.x")), "{message}");
    }
}

#[test]
fn version_is_checked_before_the_union_is_interpreted() {
    // A future major may reuse union slot 1 for a different table. Here the "Session" holds,
    // where this schema has the host string, a u32 that is no valid offset.
    let bogus_session = |fbb: &mut FlatBufferBuilder| {
        let start = fbb.start_table();
        fbb.push_slot_always::<u32>(fb::Session::VT_HOST, 0x7FFF_FFF0);
        let t = fbb.end_table(start);
        (fb::Record::Session, WIPOffset::<UnionWIPOffset>::new(t.value()))
    };
    let current = envelope_with(SCHEMA_MAJOR, SCHEMA_MINOR, bogus_session);
    assert!(matches!(decode(&current), Err(RecordError::Malformed(_))), "{:?}", decode(&current));
    let future = envelope_with(SCHEMA_MAJOR + 1, 0, bogus_session);
    assert!(
        matches!(decode(&future), Err(RecordError::UnsupportedVersion { found_major, .. }) if found_major == SCHEMA_MAJOR + 1)
    );
    // Also a union type this build has never heard of.
    let future = envelope_with(SCHEMA_MAJOR + 1, 0, |fbb| {
        let (_, v) = bogus_session(fbb);
        (fb::Record(200), v)
    });
    assert!(matches!(decode(&future), Err(RecordError::UnsupportedVersion { .. })));
}

#[test]
fn newer_minor_version_with_appended_fields_is_read() {
    // A writer one minor ahead: an extra field at the end of Session and of Envelope.
    const FUTURE_SESSION_FIELD: u16 = 4 + 2 * 10; // vtable slot of field id 10
    const FUTURE_ENVELOPE_FIELD: u16 = 4 + 2 * 4; // field id 4 (record is ids 2 and 3)
    let mut fbb = FlatBufferBuilder::new();
    let host = fbb.create_string("node-3");
    let future_text = fbb.create_string("a field from the future");
    let start = fbb.start_table();
    fbb.push_slot::<u64>(fb::Session::VT_SESSION_ID, 77, 0);
    fbb.push_slot_always(fb::Session::VT_HOST, host);
    fbb.push_slot::<i32>(fb::Session::VT_RANK, 2, -1);
    fbb.push_slot_always(FUTURE_SESSION_FIELD, future_text);
    let session = fbb.end_table(start);
    let start = fbb.start_table();
    fbb.push_slot::<u64>(FUTURE_ENVELOPE_FIELD, 0xFEED_FACE, 0);
    fbb.push_slot_always(fb::Envelope::VT_RECORD, WIPOffset::<UnionWIPOffset>::new(session.value()));
    fbb.push_slot::<u16>(fb::Envelope::VT_VERSION_MAJOR, SCHEMA_MAJOR, 0);
    fbb.push_slot::<u16>(fb::Envelope::VT_VERSION_MINOR, SCHEMA_MINOR + 1, 0);
    fbb.push_slot::<fb::Record>(fb::Envelope::VT_RECORD_TYPE, fb::Record::Session, fb::Record::NONE);
    let envelope = fbb.end_table(start);
    fbb.finish(WIPOffset::<fb::Envelope>::new(envelope.value()), Some("QSR1"));

    let expected = SessionRecord { session_id: 77, host: "node-3".into(), rank: 2, ..session_minimal() };
    assert_eq!(decode(fbb.finished_data()).unwrap(), Record::Session(expected));
}

#[test]
fn unknown_enum_values_are_reported_by_type() {
    let problem_case = |f: fn(&mut fb::ProblemArgs)| {
        envelope_with(SCHEMA_MAJOR, 0, |b| {
            let mut args = fb::ProblemArgs::default();
            f(&mut args);
            observation_payload(b, fb::CheckMode::Full, args)
        })
    };
    // Scale specs are child tables of the problem: built first.
    let scale_case = |f: fn(&mut fb::ScaleSpecArgs)| {
        envelope_with(SCHEMA_MAJOR, 0, |b| {
            let mut args = fb::ScaleSpecArgs::default();
            f(&mut args);
            let scale = fb::ScaleSpec::create(b, &args);
            let problem = fb::ProblemArgs { b_scale: Some(scale), ..Default::default() };
            observation_payload(b, fb::CheckMode::Full, problem)
        })
    };
    let cases: Vec<(Vec<u8>, &str, i64)> = vec![
        (envelope_with(SCHEMA_MAJOR, 0, |b| (fb::Record(5), session_payload(b).1)), "Record", 5),
        (envelope_with(SCHEMA_MAJOR, 0, |b| (fb::Record(255), session_payload(b).1)), "Record", 255),
        (
            envelope_with(SCHEMA_MAJOR, 0, |b| observation_payload(b, fb::CheckMode(4), Default::default())),
            "CheckMode",
            4,
        ),
        (problem_case(|p| p.b_format = fb::Format(13)), "Format", 13),
        (problem_case(|p| p.d_format = fb::Format(255)), "Format", 255),
        (problem_case(|p| p.trans_a = fb::Transpose(2)), "Transpose", 2),
        (problem_case(|p| p.a_order = fb::Order(9)), "Order", 9),
        (problem_case(|p| p.activation = fb::Activation(3)), "Activation", 3),
        (problem_case(|p| p.compute = fb::ComputeType(7)), "ComputeType", 7),
        (scale_case(|s| s.granularity = fb::ScaleGranularityKind(6)), "ScaleGranularityKind", 6),
        (scale_case(|s| s.storage = fb::ScaleStorage(3)), "ScaleStorage", 3),
        (scale_case(|s| s.format = fb::Format(200)), "Format", 200),
    ];
    for (bytes, what, value) in cases {
        let err = decode(&bytes).unwrap_err();
        assert_eq!(err, RecordError::UnknownEnum { what, value });
        assert!(err.to_string().contains(&value.to_string()), "{err}");
    }
}

// ---------------------------------------------------------------------------------------------
// Malformed input: errors with useful messages, never a panic

#[test]
fn empty_short_and_foreign_input_is_malformed() {
    for bytes in [&b""[..], b"\0", b"QSR1", b"\x08\0\0\0QSR"] {
        match decode(bytes) {
            Err(RecordError::Malformed(m)) => assert!(m.contains("too short"), "{m}"),
            other => panic!("{bytes:?}: {other:?}"),
        }
    }
    let mut bytes = encode(&Record::Closing(closing_full()));
    bytes[4..8].copy_from_slice(b"PK\x03\x04");
    match decode(&bytes) {
        Err(RecordError::Malformed(m)) => assert!(m.contains("identifier") && m.contains("QSR1"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn structural_errors_are_malformed_with_the_reason() {
    // Envelope without a record.
    let mut fbb = FlatBufferBuilder::new();
    let e = fb::Envelope::create(
        &mut fbb,
        &fb::EnvelopeArgs { version_major: SCHEMA_MAJOR, ..Default::default() },
    );
    fb::finish_envelope_buffer(&mut fbb, e);
    match decode(fbb.finished_data()) {
        Err(RecordError::Malformed(m)) => assert!(m.contains("no record"), "{m}"),
        other => panic!("{other:?}"),
    }
    // Observation without its problem.
    let bytes = envelope_with(SCHEMA_MAJOR, 0, |fbb| {
        let o = fb::Observation::create(fbb, &fb::ObservationArgs::default());
        (fb::Record::Observation, o.as_union_value())
    });
    match decode(&bytes) {
        Err(RecordError::Malformed(m)) => assert!(m.contains("problem"), "{m}"),
        other => panic!("{other:?}"),
    }
    // A string that is not UTF-8: the verifier names the field, on one line.
    let bytes = encode(&Record::Session(SessionRecord { host: "HOSTNAME".into(), ..session_minimal() }));
    let at = bytes.windows(8).position(|w| w == b"HOSTNAME").unwrap();
    let mut bad = bytes.clone();
    bad[at] = 0xFF;
    match decode(&bad) {
        Err(RecordError::Malformed(m)) => {
            assert!(m.contains("host") && m.contains("tf8") && !m.contains('\n'), "{m}")
        }
        other => panic!("{other:?}"),
    }
}

/// An observation whose `logits_rows` holds `refs` offsets to one shared row, whose two top
/// lists are one shared vector of `entries` entries: small on the wire, huge once expanded.
fn shared_logits_bomb(entries: u32, refs: usize) -> Vec<u8> {
    envelope_with(SCHEMA_MAJOR, 0, |fbb| {
        let top: Vec<fb::TopEntry> = (0..entries).map(|i| fb::TopEntry::new(i, 1.0)).collect();
        let top = fbb.create_vector(&top);
        let row = fb::LogitsRow::create(
            fbb,
            &fb::LogitsRowArgs { row: 0, prod_top: Some(top), ref_top: Some(top) },
        );
        let rows = fbb.create_vector(&vec![row; refs]);
        let problem = fb::Problem::create(fbb, &fb::ProblemArgs::default());
        let o = fb::Observation::create(
            fbb,
            &fb::ObservationArgs { problem: Some(problem), logits_rows: Some(rows), ..Default::default() },
        );
        (fb::Record::Observation, o.as_union_value())
    })
}

#[test]
fn shared_sub_objects_cannot_expand_a_small_record_into_gigabytes() {
    // 128 KiB of top entries referenced 2 x 1000 times: 256 MB of entries once decoded (the
    // verifier's defaults allow 2 GiB). Refused before anything is copied.
    let bomb = shared_logits_bomb(16384, 1000);
    assert!(bomb.len() < 140 << 10, "{} bytes", bomb.len());
    let started = std::time::Instant::now();
    match decode_without_panic(&bomb, "a shared-offset bomb") {
        Err(RecordError::Malformed(m)) => assert!(m.contains("apparent size") || m.contains("size"), "{m}"),
        other => panic!("expected a malformed record, got {:?}", other.map(|_| "a decoded record")),
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    // The same row referenced once decodes: the bound is on expansion, not on size.
    match decode(&shared_logits_bomb(16384, 1)) {
        Ok(Record::Observation(o)) => {
            assert_eq!(o.logits_rows.len(), 1);
            assert_eq!(o.logits_rows[0].prod_top.len(), 16384);
            assert_eq!(o.logits_rows[0].ref_top.len(), 16384);
        }
        other => panic!("{other:?}"),
    }
    // A large honest record (distinct rows, as the encoder writes them) still decodes.
    let rows: Vec<LogitsRow> = (0..64u64)
        .map(|r| LogitsRow {
            row: r,
            prod_top: (0..1000).map(|i| (i, i as f32)).collect(),
            ref_top: (0..1000).map(|i| (i + 1, i as f32)).collect(),
        })
        .collect();
    let honest = observation_with(|o| o.logits_rows = rows);
    assert_eq!(round_trip(&honest), honest);
}

#[test]
fn every_truncation_of_a_valid_record_fails_or_loses_only_padding() {
    // The builder writes back to front, so the tail of a buffer belongs to the first object
    // written, which something references: cutting into it must fail verification. Only the
    // alignment padding after that object (e.g. behind an empty string) can go unnoticed, and
    // then the record must come back unchanged.
    let mut accepted = 0;
    for record in sample_records() {
        let bytes = encode(&record);
        for len in 0..bytes.len() {
            match decode_without_panic(&bytes[..len], &format!("{len}-byte prefix of {record:?}")) {
                Err(RecordError::Malformed(_)) => {}
                Ok(decoded) if decoded == record && bytes.len() - len < 4 => accepted += 1,
                other => panic!("{len}-byte prefix of {} bytes: {other:?}", bytes.len()),
            }
        }
    }
    assert!(accepted < sample_records().len() * 3, "{accepted} prefixes accepted");
}

#[test]
fn single_bit_flips_never_panic() {
    let mut outcomes = [0usize; 2];
    for record in sample_records() {
        let bytes = encode(&record);
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            let result = decode_without_panic(&flipped, &format!("bit {bit} flipped"));
            outcomes[result.is_ok() as usize] += 1;
            // What decodes must also re-encode: the decoder hands out only well-formed values.
            if let Ok(r) = result {
                let _ = encode(&r);
            }
        }
    }
    // Both outcomes occur: flips in payload bytes decode to other values, flips in offsets fail.
    assert!(outcomes[0] > 0 && outcomes[1] > 0, "{outcomes:?}");
}

#[test]
fn random_bytes_never_panic() {
    let valid: Vec<Vec<u8>> = sample_records().iter().map(encode).collect();
    for seed in 0..4000u64 {
        let mut rng = SplitMix64::new(seed);
        let len = rng.below(600) as usize;
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        match seed % 4 {
            // Pure noise: almost always stopped by the identifier check.
            0 => {}
            // Past the identifier check, with a root offset anywhere.
            1 if len >= 8 => bytes[4..8].copy_from_slice(b"QSR1"),
            // Past the identifier, with a small, aligned root offset: exercises the verifier.
            2 if len >= 8 => {
                let root = (8 + 4 * rng.below(len as u64 / 4)) as u32;
                bytes[..4].copy_from_slice(&root.to_le_bytes());
                bytes[4..8].copy_from_slice(b"QSR1");
            }
            // A valid record with a run of random bytes written over it.
            _ => {
                bytes = valid[rng.below(valid.len() as u64) as usize].clone();
                let start = rng.below(bytes.len() as u64) as usize;
                let run = 1 + rng.below(16) as usize;
                for b in bytes.iter_mut().skip(start).take(run) {
                    *b = rng.next_u64() as u8;
                }
            }
        }
        let _ = decode_without_panic(&bytes, &format!("random input, seed {seed}"));
    }
}

// ---------------------------------------------------------------------------------------------
// Schema and generated code

#[test]
fn schema_header_states_the_current_version() {
    let schema =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("schema/quantshadow.fbs"))
            .expect("schema readable");
    let line = format!("// Schema version: {SCHEMA_MAJOR}.{SCHEMA_MINOR}\n");
    assert!(schema.contains(&line), "quantshadow.fbs must contain {line:?}: bump it with SCHEMA_MAJOR/MINOR");
}

#[test]
fn committed_generated_code_is_flatc_output() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let flatc = std::env::var("FLATC").unwrap_or_else(|_| "flatc".into());
    match std::process::Command::new(&flatc).arg("--version").output() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!(
                "NOTE: `{flatc}` is not on PATH: generated.rs not compared with flatc output (skipped)"
            );
            return;
        }
        Err(e) => panic!("cannot run {flatc}: {e}"),
        Ok(_) => {}
    }
    let dir = tempfile::tempdir().unwrap();
    let fresh = dir.path().join("generated.rs");
    let out = std::process::Command::new("sh")
        .arg(root.join("schema/regen.sh"))
        .arg(&fresh)
        .env("FLATC", &flatc)
        .output()
        .expect("sh runs");
    assert!(out.status.success(), "regen.sh failed: {}", String::from_utf8_lossy(&out.stderr));
    let fresh = std::fs::read(&fresh).unwrap();
    let committed = std::fs::read(root.join("src/record/generated.rs")).unwrap();
    assert!(
        fresh == committed,
        "src/record/generated.rs is not what flatc generates from schema/quantshadow.fbs: \
         run runtime/schema/regen.sh and commit the result (never edit generated.rs by hand)"
    );
}

// ---------------------------------------------------------------------------------------------
// Speed (informal): cargo test --release -p quantshadow-runtime --test record -- --ignored --nocapture

#[test]
#[ignore = "informal benchmark; run in release with --ignored --nocapture"]
fn decode_one_million_observations() {
    let mut record = observation_full();
    record.sketch_prod = (0..16).map(|i| i as f32 * 0.5).collect();
    record.sketch_ref = (0..16).map(|i| i as f32 * 0.25).collect();
    record.logits = None;
    record.logits_rows.clear();
    let record = Record::Observation(record);
    let mut encoder = Encoder::new();
    const N: usize = 1_000_000;
    let bytes = encoder.encode(&record).to_vec();

    let t = std::time::Instant::now();
    let mut total = 0usize;
    for _ in 0..N {
        total += encoder.encode(&record).len();
    }
    let encode_s = t.elapsed().as_secs_f64();

    let t = std::time::Instant::now();
    let mut checked = 0u64;
    for _ in 0..N {
        let decoded = decode(std::hint::black_box(&bytes)).unwrap();
        checked = checked.wrapping_add(decoded.session_id());
    }
    let decode_s = t.elapsed().as_secs_f64();
    assert_eq!(total, N * bytes.len());
    assert_eq!(checked, record.session_id().wrapping_mul(N as u64));
    assert_eq!(decode(&bytes).unwrap(), record);
    println!(
        "{N} observations of {} bytes: encode {encode_s:.3} s ({:.0} ns each), decode {decode_s:.3} s ({:.0} ns each)",
        bytes.len(),
        encode_s * 1e9 / N as f64,
        decode_s * 1e9 / N as f64
    );
}
