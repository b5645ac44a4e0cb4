//! FlatBuffers encoding of [`Record`]: the schema is `runtime/schema/quantshadow.fbs`, the
//! generated accessors live in `generated.rs`, and this file is the only code that maps
//! between them and the Rust types, in both directions.
//!
//! Every record is a `QSR1` buffer whose root `Envelope` carries the schema version and a
//! union of the record kinds. [`decode`] never trusts its input: it checks the identifier,
//! reads the version through the `EnvelopeHeader` view (so a future major is reported as a
//! version error even when its union no longer verifies), runs the FlatBuffers verifier, and
//! only then reads fields, turning enum values this build does not know into errors.

use super::generated::quantshadow::schema as fb;
use super::{
    CheckMode, ClosingRecord, DiagnosisRecord, ErrorMapSummary, GemmObservation, KeyValue, LogitsRow,
    ProblemSummary, ReadingSummary, Record, RecordError, RowPeriodSummary, SessionRecord, SkipCount,
    SCHEMA_MAJOR, SCHEMA_MINOR,
};
use crate::formats::Format;
use crate::metrics::{LogitsMetrics, Metrics, WorstRow};
use crate::problem::{Activation, ComputeType, Order, ScaleGranularity, ScaleSpec, ScaleStorage, Transpose};
use flatbuffers::{FlatBufferBuilder, ForwardsUOffset, Vector, WIPOffset};

/// Starting size of an encoder's buffer: an observation with sketch vectors of a few dozen
/// probes fits, so the common record never makes the builder grow.
const INITIAL_CAPACITY: usize = 1024;

/// Encodes one record into a new buffer. Hot paths that encode many records should keep an
/// [`Encoder`], which reuses its buffer.
pub fn encode(record: &Record) -> Vec<u8> {
    Encoder::new().encode(record).to_vec()
}

/// Encodes records one after another into a single reused FlatBuffers builder. Once its
/// buffer has grown to the records' size (it keeps the size of the largest record seen), an
/// observation encodes without allocating; only the rare lists of tables (logits rows, session
/// key-values, skip counts) need a small temporary vector.
pub struct Encoder {
    fbb: FlatBufferBuilder<'static>,
}

// FlatBufferBuilder's Debug needs its allocator to be Debug, which the default one is not.
impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder").finish_non_exhaustive()
    }
}

impl Default for Encoder {
    fn default() -> Self {
        Encoder::new()
    }
}

impl Encoder {
    pub fn new() -> Encoder {
        Encoder { fbb: FlatBufferBuilder::with_capacity(INITIAL_CAPACITY) }
    }

    /// Encodes `record`; the bytes stay valid until the next call. Panics only if the record
    /// exceeds FlatBuffers' 2 GiB limit, which no record of bounded vectors comes near.
    pub fn encode(&mut self, record: &Record) -> &[u8] {
        let fbb = &mut self.fbb;
        fbb.reset();
        let (record_type, offset) = match record {
            Record::Session(s) => (fb::Record::Session, encode_session(fbb, s).as_union_value()),
            Record::Observation(o) => (fb::Record::Observation, encode_observation(fbb, o).as_union_value()),
            Record::Closing(c) => (fb::Record::Closing, encode_closing(fbb, c).as_union_value()),
            Record::Diagnosis(d) => (fb::Record::Diagnosis, encode_diagnosis(fbb, d).as_union_value()),
        };
        let envelope = fb::Envelope::create(
            fbb,
            &fb::EnvelopeArgs {
                version_major: SCHEMA_MAJOR,
                version_minor: SCHEMA_MINOR,
                record_type,
                record: Some(offset),
            },
        );
        fb::finish_envelope_buffer(fbb, envelope);
        fbb.finished_data()
    }
}

/// Verifier bounds tied to the record's size. The decoder copies a shared sub-object once per
/// reference, and the verifier's defaults (2 GiB of apparent size, 10^6 tables) would let a
/// record of under 1 MiB whose offsets all point at one large vector decode into gigabytes.
/// The encoder shares nothing but vtables, so a real record's apparent size is within ~2x of
/// its bytes.
fn verifier_options(len: usize) -> flatbuffers::VerifierOptions {
    flatbuffers::VerifierOptions {
        max_apparent_size: len.saturating_mul(8).saturating_add(4096),
        max_tables: len / 4 + 16,
        ..Default::default()
    }
}

/// Decodes one record. Never panics: malformed bytes give [`RecordError::Malformed`], an enum
/// value (or record kind) this build does not know gives [`RecordError::UnknownEnum`], and a
/// record of another schema major gives [`RecordError::UnsupportedVersion`]. Records of a
/// newer minor version are read; the fields this build does not know are ignored. `bytes`
/// need not be aligned.
pub fn decode(bytes: &[u8]) -> Result<Record, RecordError> {
    // The identifier sits after the 4-byte root offset.
    match bytes.get(4..8) {
        None => {
            return Err(RecordError::Malformed(format!(
                "{} bytes is too short for a record (at least 8 are needed)",
                bytes.len()
            )))
        }
        Some(id) if id != fb::ENVELOPE_IDENTIFIER.as_bytes() => {
            return Err(RecordError::Malformed(format!(
                "not a quantshadow record: file identifier \"{}\", expected \"{}\"",
                id.escape_ascii(),
                fb::ENVELOPE_IDENTIFIER
            )))
        }
        Some(_) => {}
    }
    // Only the two version fields are verified here: the union of another major may not
    // verify under this build's schema, and that must not hide the version mismatch.
    let opts = verifier_options(bytes.len());
    let header = flatbuffers::root_with_opts::<fb::EnvelopeHeader>(&opts, bytes)
        .map_err(|e| invalid("envelope header", &e))?;
    if header.version_major() != SCHEMA_MAJOR {
        return Err(RecordError::UnsupportedVersion {
            found_major: header.version_major(),
            found_minor: header.version_minor(),
            supported_major: SCHEMA_MAJOR,
        });
    }
    let envelope =
        flatbuffers::root_with_opts::<fb::Envelope>(&opts, bytes).map_err(|e| invalid("record", &e))?;
    // The verifier guarantees the union value is present when its type is; a None below would
    // mean a verifier bug, reported as a malformed record rather than a panic.
    let missing = || RecordError::Malformed("record union has a type but no value".into());
    match envelope.record_type() {
        fb::Record::Session => {
            Ok(Record::Session(decode_session(&envelope.record_as_session().ok_or_else(missing)?)))
        }
        fb::Record::Observation => Ok(Record::Observation(decode_observation(
            &envelope.record_as_observation().ok_or_else(missing)?,
        )?)),
        fb::Record::Closing => {
            Ok(Record::Closing(decode_closing(&envelope.record_as_closing().ok_or_else(missing)?)))
        }
        fb::Record::Diagnosis => {
            Ok(Record::Diagnosis(decode_diagnosis(&envelope.record_as_diagnosis().ok_or_else(missing)?)))
        }
        fb::Record::NONE => Err(RecordError::Malformed("envelope holds no record".into())),
        other => Err(unknown("Record", other.0)),
    }
}

/// The verifier's message spans several lines (error, then the path that led to it); records
/// are reported in one-line log entries and report tables, so it is flattened.
fn invalid(what: &str, e: &flatbuffers::InvalidFlatbuffer) -> RecordError {
    let text = e.to_string();
    RecordError::Malformed(format!(
        "{what} failed verification: {}",
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    ))
}

fn unknown(what: &'static str, value: u8) -> RecordError {
    RecordError::UnknownEnum { what, value: value.into() }
}

/// One list per enum, used for both directions, so the two cannot drift apart. Variant names
/// are the same in the schema and in Rust. Encoding matches exhaustively: a new Rust variant
/// does not compile until the schema has it.
macro_rules! enum_codec {
    ($rust:ident, $to_fb:ident, $from_fb:ident { $($variant:ident),+ $(,)? }) => {
        fn $to_fb(v: $rust) -> fb::$rust {
            match v {
                $($rust::$variant => fb::$rust::$variant,)+
            }
        }

        fn $from_fb(v: fb::$rust) -> Result<$rust, RecordError> {
            match v {
                $(fb::$rust::$variant => Ok($rust::$variant),)+
                _ => Err(unknown(stringify!($rust), v.0)),
            }
        }
    };
}

enum_codec!(CheckMode, check_mode_to_fb, check_mode_from_fb { Observe, Sketch, Rows, Full });
enum_codec!(Transpose, transpose_to_fb, transpose_from_fb { N, T });
enum_codec!(Order, order_to_fb, order_from_fb { RowMajor, ColMajor });
enum_codec!(Activation, activation_to_fb, activation_from_fb { None, Relu, GeluTanh });
enum_codec!(
    ComputeType,
    compute_to_fb,
    compute_from_fb { F32, F32FastF16, F32FastBf16, F32FastTf32, F16, F64, I32 }
);
enum_codec!(ScaleStorage, storage_to_fb, storage_from_fb { OuterMajor, InnerMajor, Swizzled128x4 });

// Format's discriminants are the schema's numbers by contract (formats.rs), so it converts by
// value; tests/record.rs checks the names of both tables agree.
fn format_to_fb(f: Format) -> fb::Format {
    fb::Format(f as u8)
}

fn format_from_fb(f: fb::Format) -> Result<Format, RecordError> {
    Format::from_u8(f.0).ok_or_else(|| unknown("Format", f.0))
}

// ---- encoding: children first (FlatBuffers builds back to front), then the table ----

type KeyValues<'a> = WIPOffset<Vector<'a, ForwardsUOffset<fb::KeyValue<'a>>>>;

fn encode_key_values<'a>(fbb: &mut FlatBufferBuilder<'a>, items: &[KeyValue]) -> Option<KeyValues<'a>> {
    // An absent vector reads back as empty: nothing to write for an empty one.
    if items.is_empty() {
        return None;
    }
    let offsets: Vec<_> = items
        .iter()
        .map(|kv| {
            let key = fbb.create_string(&kv.key);
            let value = fbb.create_string(&kv.value);
            fb::KeyValue::create(fbb, &fb::KeyValueArgs { key: Some(key), value: Some(value) })
        })
        .collect();
    Some(fbb.create_vector(&offsets))
}

fn encode_session<'a>(fbb: &mut FlatBufferBuilder<'a>, s: &SessionRecord) -> WIPOffset<fb::Session<'a>> {
    let host = fbb.create_string(&s.host);
    let device_name = fbb.create_string(&s.device_name);
    let device_arch = fbb.create_string(&s.device_arch);
    let library_versions = encode_key_values(fbb, &s.library_versions);
    let label = fbb.create_string(&s.label);
    let settings = encode_key_values(fbb, &s.settings);
    fb::Session::create(
        fbb,
        &fb::SessionArgs {
            session_id: s.session_id,
            host: Some(host),
            pid: s.pid,
            rank: s.rank,
            device_name: Some(device_name),
            device_arch: Some(device_arch),
            library_versions,
            label: Some(label),
            start_time_ns: s.start_time_ns,
            settings,
        },
    )
}

fn encode_scale<'a>(fbb: &mut FlatBufferBuilder<'a>, s: &ScaleSpec) -> WIPOffset<fb::ScaleSpec<'a>> {
    use fb::ScaleGranularityKind as Kind;
    let (granularity, block_outer, block_inner) = match s.granularity {
        ScaleGranularity::Tensor => (Kind::Tensor, 0, 0),
        ScaleGranularity::PerOuter => (Kind::PerOuter, 0, 0),
        ScaleGranularity::PerInner => (Kind::PerInner, 0, 0),
        ScaleGranularity::Block { outer, inner } => (Kind::Block, outer, inner),
        ScaleGranularity::Mx32 => (Kind::Mx32, 0, 0),
        ScaleGranularity::Nvfp4 => (Kind::Nvfp4, 0, 0),
    };
    fb::ScaleSpec::create(
        fbb,
        &fb::ScaleSpecArgs {
            granularity,
            block_outer,
            block_inner,
            format: format_to_fb(s.format),
            storage: storage_to_fb(s.storage),
            ld: s.ld,
            batch_stride: s.batch_stride,
        },
    )
}

fn encode_problem<'a>(fbb: &mut FlatBufferBuilder<'a>, p: &ProblemSummary) -> WIPOffset<fb::Problem<'a>> {
    let a_scale = p.a_scale.as_ref().map(|s| encode_scale(fbb, s));
    let b_scale = p.b_scale.as_ref().map(|s| encode_scale(fbb, s));
    fb::Problem::create(
        fbb,
        &fb::ProblemArgs {
            m: p.m,
            n: p.n,
            k: p.k,
            batch: p.batch,
            trans_a: transpose_to_fb(p.trans_a),
            trans_b: transpose_to_fb(p.trans_b),
            a_format: format_to_fb(p.a_format),
            b_format: format_to_fb(p.b_format),
            d_format: format_to_fb(p.d_format),
            a_order: order_to_fb(p.a_order),
            b_order: order_to_fb(p.b_order),
            d_order: order_to_fb(p.d_order),
            a_scale,
            b_scale,
            has_bias: p.has_bias,
            activation: activation_to_fb(p.activation),
            compute: compute_to_fb(p.compute),
            fast_accum: p.fast_accum,
            has_d_scale: p.has_d_scale,
        },
    )
}

fn encode_metrics<'a>(fbb: &mut FlatBufferBuilder<'a>, m: &Metrics) -> WIPOffset<fb::Metrics<'a>> {
    let worst_row = m.worst_row.map(|w| fb::WorstRow::new(w.index, w.cosine));
    fb::Metrics::create(
        fbb,
        &fb::MetricsArgs {
            cosine: m.cosine,
            nmse: m.nmse,
            sqnr_db: m.sqnr_db,
            norm_ratio: m.norm_ratio,
            max_abs_err: m.max_abs_err,
            worst_row: worst_row.as_ref(),
            nan_prod: m.nan_prod,
            inf_prod: m.inf_prod,
            nan_ref: m.nan_ref,
            inf_ref: m.inf_ref,
            count: m.count,
        },
    )
}

fn encode_floats<'a>(fbb: &mut FlatBufferBuilder<'a>, v: &[f32]) -> Option<WIPOffset<Vector<'a, f32>>> {
    (!v.is_empty()).then(|| fbb.create_vector(v))
}

fn encode_top<'a>(
    fbb: &mut FlatBufferBuilder<'a>,
    top: &[(u32, f32)],
) -> Option<WIPOffset<Vector<'a, fb::TopEntry>>> {
    (!top.is_empty()).then(|| {
        fbb.create_vector_from_iter(top.iter().map(|&(index, value)| fb::TopEntry::new(index, value)))
    })
}

fn encode_logits_row<'a>(fbb: &mut FlatBufferBuilder<'a>, r: &LogitsRow) -> WIPOffset<fb::LogitsRow<'a>> {
    let prod_top = encode_top(fbb, &r.prod_top);
    let ref_top = encode_top(fbb, &r.ref_top);
    fb::LogitsRow::create(fbb, &fb::LogitsRowArgs { row: r.row, prod_top, ref_top })
}

fn encode_observation<'a>(
    fbb: &mut FlatBufferBuilder<'a>,
    o: &GemmObservation,
) -> WIPOffset<fb::Observation<'a>> {
    let site_name = o.site_name.as_deref().map(|s| fbb.create_string(s));
    let entry_point = fbb.create_string(&o.entry_point);
    let backend = o.backend.as_deref().map(|s| fbb.create_string(s));
    let problem = encode_problem(fbb, &o.problem);
    let metrics = o.metrics.as_ref().map(|m| encode_metrics(fbb, m));
    let sketch_prod = encode_floats(fbb, &o.sketch_prod);
    let sketch_ref = encode_floats(fbb, &o.sketch_ref);
    let logits = o.logits.as_ref().map(|l| {
        fb::LogitsMetrics::create(
            fbb,
            &fb::LogitsMetricsArgs {
                kl: l.kl,
                top1_agree: l.top1_agree,
                topk_overlap: l.topk_overlap,
                k: l.k,
            },
        )
    });
    let logits_rows = if o.logits_rows.is_empty() {
        None
    } else {
        // Rows are only sent for LM-head checks in rows mode: rare enough that this
        // allocation is not worth a scratch buffer in the encoder.
        let rows: Vec<_> = o.logits_rows.iter().map(|r| encode_logits_row(fbb, r)).collect();
        Some(fbb.create_vector(&rows))
    };
    fb::Observation::create(
        fbb,
        &fb::ObservationArgs {
            session_id: o.session_id,
            site_id: o.site_id,
            site_ordinal: o.site_ordinal,
            site_name,
            call_seq: o.call_seq,
            entry_point: Some(entry_point),
            backend,
            problem: Some(problem),
            mode: check_mode_to_fb(o.mode),
            metrics,
            rows_checked: o.rows_checked,
            sketch_seed: o.sketch_seed,
            sketch_prod,
            sketch_ref,
            logits,
            logits_rows,
            flags: o.flags,
            timestamp_ns: o.timestamp_ns,
        },
    )
}

fn encode_closing<'a>(fbb: &mut FlatBufferBuilder<'a>, c: &ClosingRecord) -> WIPOffset<fb::Closing<'a>> {
    let skipped = if c.skipped.is_empty() {
        None
    } else {
        let items: Vec<_> = c
            .skipped
            .iter()
            .map(|s| {
                let reason = fbb.create_string(&s.reason);
                fb::SkipCount::create(fbb, &fb::SkipCountArgs { reason: Some(reason), count: s.count })
            })
            .collect();
        Some(fbb.create_vector(&items))
    };
    fb::Closing::create(
        fbb,
        &fb::ClosingArgs {
            session_id: c.session_id,
            calls_seen: c.calls_seen,
            sampled: c.sampled,
            checked: c.checked,
            skipped,
            dropped: c.dropped,
            end_time_ns: c.end_time_ns,
        },
    )
}

fn encode_u64s<'a>(fbb: &mut FlatBufferBuilder<'a>, v: &[u64]) -> Option<WIPOffset<Vector<'a, u64>>> {
    (!v.is_empty()).then(|| fbb.create_vector(v))
}

fn encode_error_map<'a>(fbb: &mut FlatBufferBuilder<'a>, e: &ErrorMapSummary) -> WIPOffset<fb::ErrorMap<'a>> {
    let listed = &e.bad_rows[..e.bad_rows.len().min(ErrorMapSummary::MAX_ROWS)];
    let bad_rows = encode_u64s(fbb, listed);
    let bad_col_blocks = encode_u64s(fbb, &e.bad_col_blocks);
    let bad_a_scale_blocks = e.bad_a_scale_blocks.as_deref().and_then(|v| encode_u64s(fbb, v));
    let bad_b_scale_blocks = e.bad_b_scale_blocks.as_deref().and_then(|v| encode_u64s(fbb, v));
    let summary = fbb.create_string(&e.summary);
    let period = e.row_period.unwrap_or(RowPeriodSummary { period: 0, offset: 0, first_row: 0 });
    fb::ErrorMap::create(
        fbb,
        &fb::ErrorMapArgs {
            m: e.m,
            rows_checked: e.rows_checked,
            bad_rows,
            bad_rows_total: e.bad_rows_total.max(e.bad_rows.len() as u64),
            row_period: period.period,
            row_offset: period.offset,
            row_first: period.first_row,
            col_block: e.col_block,
            col_blocks: e.col_blocks,
            bad_col_blocks,
            has_a_scale_blocks: e.bad_a_scale_blocks.is_some(),
            bad_a_scale_blocks,
            has_b_scale_blocks: e.bad_b_scale_blocks.is_some(),
            bad_b_scale_blocks,
            summary: Some(summary),
        },
    )
}

fn encode_diagnosis<'a>(
    fbb: &mut FlatBufferBuilder<'a>,
    d: &DiagnosisRecord,
) -> WIPOffset<fb::Diagnosis<'a>> {
    let readings: Vec<_> = d
        .readings
        .iter()
        .map(|r| {
            let id = fbb.create_string(&r.id);
            let description = fbb.create_string(&r.description);
            fb::ReadingResult::create(
                fbb,
                &fb::ReadingResultArgs {
                    id: Some(id),
                    description: Some(description),
                    declared: r.declared,
                    cosine: r.cosine,
                    nmse: r.nmse,
                    norm_ratio: r.norm_ratio,
                    nonfinite_mismatch: r.nonfinite_mismatch,
                    explains: r.explains,
                },
            )
        })
        .collect();
    let readings = (!readings.is_empty()).then(|| fbb.create_vector(&readings));
    let skipped = encode_key_values(fbb, &d.skipped);
    let explanation = d.explanation.as_deref().map(|s| fbb.create_string(s));
    let strings = |fbb: &mut FlatBufferBuilder<'a>, v: &[String]| {
        (!v.is_empty()).then(|| {
            let items: Vec<_> = v.iter().map(|s| fbb.create_string(s)).collect();
            fbb.create_vector(&items)
        })
    };
    let equivalent = strings(fbb, &d.equivalent);
    let text = fbb.create_string(&d.text);
    let recommendation = d.recommendation.as_deref().map(|s| fbb.create_string(s));
    let error_map = d.error_map.as_ref().map(|e| encode_error_map(fbb, e));
    let scale_layout = strings(fbb, &d.scale_layout);
    fb::Diagnosis::create(
        fbb,
        &fb::DiagnosisArgs {
            session_id: d.session_id,
            site_id: d.site_id,
            site_ordinal: d.site_ordinal,
            call_seq: d.call_seq,
            rows: d.rows,
            readings,
            skipped,
            explanation,
            equivalent,
            text: Some(text),
            recommendation,
            error_map,
            scale_layout,
            timestamp_ns: d.timestamp_ns,
        },
    )
}

// ---- decoding: input already verified, so accessors cannot read out of bounds ----

/// Non-optional strings may be absent (another writer, or a field it did not fill): "".
fn string(s: Option<&str>) -> String {
    s.unwrap_or_default().to_owned()
}

fn decode_key_values(v: Option<Vector<'_, ForwardsUOffset<fb::KeyValue<'_>>>>) -> Vec<KeyValue> {
    v.map(|v| v.iter().map(|kv| KeyValue { key: string(kv.key()), value: string(kv.value()) }).collect())
        .unwrap_or_default()
}

fn decode_session(s: &fb::Session<'_>) -> SessionRecord {
    SessionRecord {
        session_id: s.session_id(),
        host: string(s.host()),
        pid: s.pid(),
        rank: s.rank(),
        device_name: string(s.device_name()),
        device_arch: string(s.device_arch()),
        library_versions: decode_key_values(s.library_versions()),
        label: string(s.label()),
        start_time_ns: s.start_time_ns(),
        settings: decode_key_values(s.settings()),
    }
}

fn decode_scale(s: &fb::ScaleSpec<'_>) -> Result<ScaleSpec, RecordError> {
    use fb::ScaleGranularityKind as Kind;
    // Block sizes are only meaningful for Block; elsewhere they are ignored, not checked, so
    // a writer that leaves stale sizes in them loses nothing.
    let granularity = match s.granularity() {
        Kind::Tensor => ScaleGranularity::Tensor,
        Kind::PerOuter => ScaleGranularity::PerOuter,
        Kind::PerInner => ScaleGranularity::PerInner,
        Kind::Block => ScaleGranularity::Block { outer: s.block_outer(), inner: s.block_inner() },
        Kind::Mx32 => ScaleGranularity::Mx32,
        Kind::Nvfp4 => ScaleGranularity::Nvfp4,
        other => return Err(unknown("ScaleGranularityKind", other.0)),
    };
    Ok(ScaleSpec {
        granularity,
        format: format_from_fb(s.format())?,
        storage: storage_from_fb(s.storage())?,
        ld: s.ld(),
        batch_stride: s.batch_stride(),
    })
}

fn decode_problem(p: &fb::Problem<'_>) -> Result<ProblemSummary, RecordError> {
    Ok(ProblemSummary {
        m: p.m(),
        n: p.n(),
        k: p.k(),
        batch: p.batch(),
        trans_a: transpose_from_fb(p.trans_a())?,
        trans_b: transpose_from_fb(p.trans_b())?,
        a_format: format_from_fb(p.a_format())?,
        b_format: format_from_fb(p.b_format())?,
        d_format: format_from_fb(p.d_format())?,
        a_order: order_from_fb(p.a_order())?,
        b_order: order_from_fb(p.b_order())?,
        d_order: order_from_fb(p.d_order())?,
        a_scale: p.a_scale().map(|s| decode_scale(&s)).transpose()?,
        b_scale: p.b_scale().map(|s| decode_scale(&s)).transpose()?,
        has_bias: p.has_bias(),
        activation: activation_from_fb(p.activation())?,
        compute: compute_from_fb(p.compute())?,
        fast_accum: p.fast_accum(),
        has_d_scale: p.has_d_scale(),
    })
}

fn decode_metrics(m: &fb::Metrics<'_>) -> Metrics {
    Metrics {
        cosine: m.cosine(),
        nmse: m.nmse(),
        sqnr_db: m.sqnr_db(),
        norm_ratio: m.norm_ratio(),
        max_abs_err: m.max_abs_err(),
        worst_row: m.worst_row().map(|w| WorstRow { index: w.index(), cosine: w.cosine() }),
        nan_prod: m.nan_prod(),
        inf_prod: m.inf_prod(),
        nan_ref: m.nan_ref(),
        inf_ref: m.inf_ref(),
        count: m.count(),
    }
}

fn decode_top(v: Option<Vector<'_, fb::TopEntry>>) -> Vec<(u32, f32)> {
    v.map(|v| v.iter().map(|e| (e.index(), e.value())).collect()).unwrap_or_default()
}

fn decode_observation(o: &fb::Observation<'_>) -> Result<GemmObservation, RecordError> {
    let problem =
        o.problem().ok_or_else(|| RecordError::Malformed("observation has no problem summary".into()))?;
    Ok(GemmObservation {
        session_id: o.session_id(),
        site_id: o.site_id(),
        site_ordinal: o.site_ordinal(),
        site_name: o.site_name().map(str::to_owned),
        call_seq: o.call_seq(),
        entry_point: string(o.entry_point()),
        backend: o.backend().map(str::to_owned),
        problem: decode_problem(&problem)?,
        mode: check_mode_from_fb(o.mode())?,
        metrics: o.metrics().map(|m| decode_metrics(&m)),
        rows_checked: o.rows_checked(),
        sketch_seed: o.sketch_seed(),
        sketch_prod: o.sketch_prod().map(|v| v.iter().collect()).unwrap_or_default(),
        sketch_ref: o.sketch_ref().map(|v| v.iter().collect()).unwrap_or_default(),
        logits: o.logits().map(|l| LogitsMetrics {
            kl: l.kl(),
            top1_agree: l.top1_agree(),
            topk_overlap: l.topk_overlap(),
            k: l.k(),
        }),
        logits_rows: o
            .logits_rows()
            .map(|rows| {
                rows.iter()
                    .map(|r| LogitsRow {
                        row: r.row(),
                        prod_top: decode_top(r.prod_top()),
                        ref_top: decode_top(r.ref_top()),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        flags: o.flags(),
        timestamp_ns: o.timestamp_ns(),
    })
}

fn decode_closing(c: &fb::Closing<'_>) -> ClosingRecord {
    ClosingRecord {
        session_id: c.session_id(),
        calls_seen: c.calls_seen(),
        sampled: c.sampled(),
        checked: c.checked(),
        skipped: c
            .skipped()
            .map(|v| v.iter().map(|s| SkipCount { reason: string(s.reason()), count: s.count() }).collect())
            .unwrap_or_default(),
        dropped: c.dropped(),
        end_time_ns: c.end_time_ns(),
    }
}

fn decode_u64s(v: Option<Vector<'_, u64>>) -> Vec<u64> {
    v.map(|v| v.iter().collect()).unwrap_or_default()
}

fn decode_strings(v: Option<Vector<'_, ForwardsUOffset<&str>>>) -> Vec<String> {
    v.map(|v| v.iter().map(str::to_owned).collect()).unwrap_or_default()
}

fn decode_error_map(e: &fb::ErrorMap<'_>) -> ErrorMapSummary {
    let bad_rows = decode_u64s(e.bad_rows());
    ErrorMapSummary {
        m: e.m(),
        rows_checked: e.rows_checked(),
        bad_rows_total: e.bad_rows_total().max(bad_rows.len() as u64),
        bad_rows,
        row_period: (e.row_period() != 0).then(|| RowPeriodSummary {
            period: e.row_period(),
            offset: e.row_offset(),
            first_row: e.row_first(),
        }),
        col_block: e.col_block(),
        col_blocks: e.col_blocks(),
        bad_col_blocks: decode_u64s(e.bad_col_blocks()),
        bad_a_scale_blocks: e.has_a_scale_blocks().then(|| decode_u64s(e.bad_a_scale_blocks())),
        bad_b_scale_blocks: e.has_b_scale_blocks().then(|| decode_u64s(e.bad_b_scale_blocks())),
        summary: string(e.summary()),
    }
}

fn decode_diagnosis(d: &fb::Diagnosis<'_>) -> DiagnosisRecord {
    DiagnosisRecord {
        session_id: d.session_id(),
        site_id: d.site_id(),
        site_ordinal: d.site_ordinal(),
        call_seq: d.call_seq(),
        rows: d.rows(),
        readings: d
            .readings()
            .map(|v| {
                v.iter()
                    .map(|r| ReadingSummary {
                        id: string(r.id()),
                        description: string(r.description()),
                        declared: r.declared(),
                        cosine: r.cosine(),
                        nmse: r.nmse(),
                        norm_ratio: r.norm_ratio(),
                        nonfinite_mismatch: r.nonfinite_mismatch(),
                        explains: r.explains(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        skipped: decode_key_values(d.skipped()),
        explanation: d.explanation().filter(|s| !s.is_empty()).map(str::to_owned),
        equivalent: decode_strings(d.equivalent()),
        text: string(d.text()),
        recommendation: d.recommendation().filter(|s| !s.is_empty()).map(str::to_owned),
        error_map: d.error_map().map(|e| decode_error_map(&e)),
        scale_layout: decode_strings(d.scale_layout()),
        timestamp_ns: d.timestamp_ns(),
    }
}
