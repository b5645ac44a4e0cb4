//! The host check backend: checks intercepted GEMMs whose buffers live in host memory.
//!
//! Selected only when no GPU runtime is present (CI, and the fixture vendor library of
//! tests/fixtures, whose "device" pointers are host pointers), so every address in
//! [`InterceptedGemm::buffers`] can be read directly. Nothing is read past the extents the
//! problem declares: A, B, C and D by [`MatrixLayout::required_elements`], scales by
//! [`ScaleSpec::required_entries`], the bias by its axis, device-mode scalars one element each.
//!
//! The check runs synchronously inside `after_call` (the caller's thread): the host oracle in
//! f64 ([`crate::oracle`]) for `Full` and `Rows`, the host sketch mirror
//! ([`crate::sketch::sketch_check`]) for `Sketch`. Results wait in a bounded queue for
//! [`Backend::poll`]; when it is full the result is dropped and counted ([`Backend::dropped`]).
//!
//! Conventions shared with the device backend:
//! - full and rows compare D with the reference rounded to D's format (an honest library is
//!   off by accumulation-order rounding only); rows are indices over `batch * M` (row r is
//!   batch item r / M, row r % M) and are drawn by [`RowSample`] with the site's sketch seed,
//!   rotating by `site_epoch`;
//! - a sketch with a non-linear epilogue (ReLU, GELU) cannot be estimated from projections: it
//!   is checked in rows mode instead (the outcome says `Rows`);
//! - logits (an LM head): per compared row KL(ref || prod), top-1 and top-k overlap, reported
//!   as the device does ([`crate::sketch::slot_logits`]): mean KL (NaN when any row has
//!   non-finite logits), top-1 only when every row agrees, mean overlap, and the top-k lists of
//!   the row with the largest KL. A sketch check of an LM head also computes its sampled rows
//!   exactly for the logits.
//!
//! Skip reasons (before a check runs) and `Polled::Failed` reasons (the check could not
//! finish) are short, stable strings starting with "host: ".

use super::backend::{Backend, CheckOutcome, CheckRequest, Polled, PreCall};
use crate::formats::Format;
use crate::intercept::{InterceptedGemm, Skip};
use crate::metrics::{compare_logits, compare_matrix, top_k, LogitsMetrics, Metrics};
use crate::oracle::{self, OracleOptions, OracleOutput};
use crate::problem::{BiasAxis, GemmProblem, HostInputs, MatrixLayout, Scalar};
use crate::record::{flags, CheckMode, LogitsRow};
use crate::sketch::{self, DenseGemm, RowSample, SketchConfig};
use crossbeam_queue::ArrayQueue;
use std::sync::atomic::{AtomicU64, Ordering};

/// Results kept for `poll` by default.
pub const DEFAULT_QUEUE_CAPACITY: usize = 1024;
/// Largest single host copy a check makes (one operand, scales or D), in bytes.
pub const MAX_COPY_BYTES: u64 = 1 << 30;

/// The host backend (see the module doc).
pub struct HostBackend {
    results: ArrayQueue<Polled>,
    dropped: AtomicU64,
}

impl Default for HostBackend {
    fn default() -> HostBackend {
        HostBackend::new(DEFAULT_QUEUE_CAPACITY)
    }
}

/// What `before_call` keeps: C's bytes when the call is about to overwrite them.
struct SavedC(Vec<u8>);

impl HostBackend {
    /// A backend whose result queue holds `capacity` results (at least 1).
    pub fn new(capacity: usize) -> HostBackend {
        HostBackend { results: ArrayQueue::new(capacity.max(1)), dropped: AtomicU64::new(0) }
    }

    fn push(&self, result: Polled) {
        if self.results.push(result).is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl Backend for HostBackend {
    fn name(&self) -> &'static str {
        "host"
    }

    fn device(&self) -> (String, String) {
        ("host CPU".to_string(), std::env::consts::ARCH.to_string())
    }

    fn before_call(&self, request: &CheckRequest) -> Result<PreCall, Skip> {
        let call = request.call;
        let p = &call.problem;
        let Some(c_layout) = p.c else { return Ok(PreCall::default()) };
        p.validate().map_err(|_| skip("invalid problem"))?;
        // SAFETY (all reads below): the host backend runs only without a GPU runtime, where the
        // intercepted library works on host memory; extents come from the validated problem.
        let beta = unsafe { read_scalar(&p.beta)? };
        if beta == 0.0 {
            return Ok(PreCall::default());
        }
        let c_bytes = matrix_bytes(&c_layout, p.m, p.n, p.batch)?;
        if let Some(arrays) = call.pointer_arrays {
            // Array-of-pointers calls compute in place: C is D, item by item.
            let item = matrix_bytes(&c_layout, p.m, p.n, 1)?;
            let c = unsafe { gather(arrays.d, p.batch, item)? };
            return Ok(PreCall(Some(Box::new(SavedC(c)))));
        }
        let d_bytes = matrix_bytes(&p.d, p.m, p.n, p.batch)?;
        if !overlaps(call.buffers.c, c_bytes, call.buffers.d, d_bytes) {
            return Ok(PreCall::default());
        }
        let c = unsafe { read_bytes(call.buffers.c, c_bytes, "c")? };
        Ok(PreCall(Some(Box::new(SavedC(c)))))
    }

    fn after_call(&self, request: &CheckRequest, pre: PreCall) -> Result<(), Skip> {
        if request.mode == CheckMode::Observe {
            return Err(skip("observe mode"));
        }
        let saved_c = pre.0.and_then(|b| b.downcast::<SavedC>().ok()).map(|s| s.0);
        // SAFETY: see before_call.
        let (problem, inputs, d) = unsafe { read_call(request.call, saved_c)? };
        let result = match check(request, &problem, &inputs, &d) {
            Ok(outcome) => Polled::Done(Box::new(outcome)),
            Err(reason) => Polled::Failed { site_ordinal: request.site_ordinal, reason: reason.0 },
        };
        self.push(result);
        Ok(())
    }

    fn poll(&self, out: &mut Vec<Polled>) {
        while let Some(r) = self.results.pop() {
            out.push(r);
        }
    }

    fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

fn skip(reason: &str) -> Skip {
    Skip(format!("host: {reason}"))
}

// ---------------------------------------------------------------------------------------------
// Reading the call's inputs from host memory
// ---------------------------------------------------------------------------------------------

/// Bytes of `batch` items of a `rows x cols` matrix in `layout`.
fn matrix_bytes(layout: &MatrixLayout, rows: u64, cols: u64, batch: u64) -> Result<u64, Skip> {
    let elements = layout.required_elements(rows, cols, batch) as u128;
    bytes_of(layout.format, elements)
}

fn bytes_of(format: Format, elements: u128) -> Result<u64, Skip> {
    let bytes = (elements * format.bits() as u128).div_ceil(8);
    if bytes > MAX_COPY_BYTES as u128 {
        return Err(skip("buffer too large"));
    }
    Ok(bytes as u64)
}

fn overlaps(a: u64, a_len: u64, b: u64, b_len: u64) -> bool {
    a_len != 0
        && b_len != 0
        && (a as u128) < b as u128 + b_len as u128
        && (b as u128) < a as u128 + a_len as u128
}

/// Copies `len` bytes at host address `addr`.
///
/// # Safety
/// `addr..addr + len` must be readable host memory.
unsafe fn read_bytes(addr: u64, len: u64, what: &str) -> Result<Vec<u8>, Skip> {
    if len == 0 {
        return Ok(Vec::new());
    }
    if addr == 0 {
        return Err(Skip(format!("host: null {what} pointer")));
    }
    if len > MAX_COPY_BYTES {
        return Err(skip("buffer too large"));
    }
    // SAFETY: the caller guarantees the range is readable.
    Ok(unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) }.to_vec())
}

/// Concatenates `batch` items of `item` bytes whose addresses are listed at `array`.
///
/// # Safety
/// `array` must hold `batch` readable host addresses, each of `item` readable bytes.
unsafe fn gather(array: u64, batch: u64, item: u64) -> Result<Vec<u8>, Skip> {
    let total = (batch as u128) * (item as u128);
    if total > MAX_COPY_BYTES as u128 || batch.saturating_mul(8) > MAX_COPY_BYTES {
        return Err(skip("buffer too large"));
    }
    let table = unsafe { read_bytes(array, batch * 8, "pointer array")? };
    let mut out = Vec::with_capacity(total as usize);
    for chunk in table.chunks_exact(8) {
        let addr = u64::from_ne_bytes(chunk.try_into().expect("8-byte chunk"));
        out.extend(unsafe { read_bytes(addr, item, "batch item")? });
    }
    Ok(out)
}

/// The value of a scalar argument (a device-mode scalar is read from its address).
///
/// # Safety
/// A device scalar's address must hold one readable element of its format.
unsafe fn read_scalar(s: &Scalar) -> Result<f64, Skip> {
    match *s {
        Scalar::Host(v) => Ok(v),
        Scalar::Device { ptr, format } => {
            let bytes = unsafe { read_bytes(ptr, format.bytes_for(1) as u64, "scalar")? };
            Ok(format.load(&bytes, 0))
        }
    }
}

unsafe fn read_optional(s: &Option<Scalar>) -> Result<Option<f64>, Skip> {
    match s {
        Some(s @ Scalar::Device { .. }) => Ok(Some(unsafe { read_scalar(s)? })),
        _ => Ok(None),
    }
}

/// Host copies of everything the problem reads, and D. For array-of-pointers calls the items
/// are gathered back to back and the returned problem's batch strides say so.
///
/// # Safety
/// The call's addresses must be readable host memory of the extents the problem declares.
unsafe fn read_call(
    call: &InterceptedGemm,
    saved_c: Option<Vec<u8>>,
) -> Result<(GemmProblem, HostInputs, Vec<u8>), Skip> {
    let mut p = call.problem.clone();
    p.validate().map_err(|_| skip("invalid problem"))?;
    let buf = &call.buffers;
    let (ar, ac) = p.a_stored_dims();
    let (br, bc) = p.b_stored_dims();
    let mut inputs = HostInputs::default();
    let d;
    if let Some(arrays) = call.pointer_arrays {
        // Each item packed; 4-bit items rounded to an even element count.
        let packed = |layout: &mut MatrixLayout, rows: u64, cols: u64| -> Result<u64, Skip> {
            let elements = layout.required_elements(rows, cols, 1);
            layout.batch_stride = elements + (layout.format.bits() == 4 && elements % 2 == 1) as u64;
            bytes_of(layout.format, layout.batch_stride as u128)
        };
        let a_item = packed(&mut p.a, ar, ac)?;
        let b_item = packed(&mut p.b, br, bc)?;
        let d_item = packed(&mut p.d, p.m, p.n)?;
        if let Some(c) = p.c.as_mut() {
            packed(c, p.m, p.n)?;
        }
        inputs.a = unsafe { gather(arrays.a, p.batch, a_item)? };
        inputs.b = unsafe { gather(arrays.b, p.batch, b_item)? };
        d = unsafe { gather(arrays.d, p.batch, d_item)? };
    } else {
        inputs.a = unsafe { read_bytes(buf.a, matrix_bytes(&p.a, ar, ac, p.batch)?, "a")? };
        inputs.b = unsafe { read_bytes(buf.b, matrix_bytes(&p.b, br, bc, p.batch)?, "b")? };
        d = unsafe { read_bytes(buf.d, matrix_bytes(&p.d, p.m, p.n, p.batch)?, "d")? };
    }
    let scalars = &mut inputs.device_scalars;
    scalars.alpha = unsafe { read_optional(&Some(p.alpha))? };
    scalars.beta = unsafe { read_optional(&Some(p.beta))? };
    scalars.a_tensor_scale = unsafe { read_optional(&p.a_tensor_scale)? };
    scalars.b_tensor_scale = unsafe { read_optional(&p.b_tensor_scale)? };
    scalars.d_scale = unsafe { read_optional(&p.d_scale)? };
    let beta = scalars.beta.or(p.beta.host_value()).unwrap_or(0.0);
    if let (Some(c), true) = (p.c, beta != 0.0) {
        inputs.c = Some(match saved_c {
            Some(saved) => saved,
            None if call.pointer_arrays.is_some() => return Err(skip("in-place C was not saved")),
            None => unsafe { read_bytes(buf.c, matrix_bytes(&c, p.m, p.n, p.batch)?, "c")? },
        });
    }
    for (spec, outer, addr, slot, what) in [
        (p.a_scale, p.m, buf.a_scale, &mut inputs.a_scale, "a scale"),
        (p.b_scale, p.n, buf.b_scale, &mut inputs.b_scale, "b scale"),
    ] {
        if let Some(spec) = spec {
            let entries = spec.required_entries(outer, p.k, p.batch) as u128;
            *slot = Some(unsafe { read_bytes(addr, bytes_of(spec.format, entries)?, what)? });
        }
    }
    if let Some(bias) = p.epilogue.bias {
        let len = if bias.axis == BiasAxis::Rows { p.m } else { p.n };
        inputs.bias = Some(unsafe { read_bytes(buf.bias, bytes_of(bias.format, len as u128)?, "bias")? });
    }
    Ok((p, inputs, d))
}

// ---------------------------------------------------------------------------------------------
// The checks
// ---------------------------------------------------------------------------------------------

fn check(
    request: &CheckRequest,
    p: &GemmProblem,
    inputs: &HostInputs,
    d: &[u8],
) -> Result<CheckOutcome, Skip> {
    let mut outcome = CheckOutcome {
        site_ordinal: request.site_ordinal,
        site_id: request.site_id,
        call_seq: request.call_seq,
        mode: request.mode,
        metrics: Metrics {
            cosine: 1.0,
            nmse: 0.0,
            sqnr_db: f64::INFINITY,
            norm_ratio: 1.0,
            max_abs_err: 0.0,
            worst_row: None,
            nan_prod: 0,
            inf_prod: 0,
            nan_ref: 0,
            inf_ref: 0,
            count: 0,
        },
        rows_checked: 0,
        sketch_seed: request.sketch.seed,
        sketch_prod: Vec::new(),
        sketch_ref: Vec::new(),
        logits: None,
        logits_rows: Vec::new(),
        flags: 0,
        diagnosis: None,
    };
    let total = p.batch * p.m;
    let logits_rows = match request.mode {
        CheckMode::Full => {
            let reference = oracle::reference_gemm(p, inputs, &OracleOptions::default())
                .map_err(|_| skip("reference failed"))?;
            let prod = oracle::decode_output(p, d).map_err(|_| skip("decoding d failed"))?;
            outcome.metrics = compare_matrix(&prod.values, &reference.values, total as usize, p.n as usize);
            outcome.rows_checked = total;
            let all: Vec<u64> = (0..total).collect();
            request.logits_topk.map(|k| (all, prod.values, reference.values, k))
        }
        CheckMode::Sketch if p.epilogue.is_linear() => {
            let cfg = SketchConfig {
                seed: request.sketch.seed,
                probes: request.sketch.probes,
                rows_per_call: request.sketch.rows_per_call,
            };
            let s = sketch_outcome(p, inputs, d, &cfg, request.site_epoch)?;
            outcome.metrics = s.metrics();
            outcome.rows_checked = s.rows.len() as u64;
            outcome.sketch_prod = s.y_sum.iter().map(|v| *v as f32).collect();
            outcome.sketch_ref = s.x_sum.iter().map(|v| *v as f32).collect();
            if (s.rows.len() as u64) < total {
                outcome.flags |= flags::ROW_SAMPLE;
            }
            match request.logits_topk {
                Some(k) => {
                    let (prod, reference) = exact_rows(p, inputs, d, &s.rows)?;
                    Some((s.rows, prod, reference, k))
                }
                None => None,
            }
        }
        CheckMode::Sketch | CheckMode::Rows => {
            let per_call = if request.mode == CheckMode::Rows {
                request.rows_per_call
            } else {
                request.sketch.rows_per_call
            };
            let sample = RowSample::new(request.sketch.seed, total, per_call);
            let rows = sample.rows(request.site_epoch);
            let (prod, reference) = exact_rows(p, inputs, d, &rows)?;
            let mut m = compare_matrix(&prod, &reference, rows.len(), p.n as usize);
            if let Some(w) = m.worst_row.as_mut() {
                w.index = rows[w.index as usize];
            }
            outcome.metrics = m;
            outcome.mode = CheckMode::Rows;
            outcome.rows_checked = rows.len() as u64;
            if !sample.is_all() {
                outcome.flags |= flags::ROW_SAMPLE;
            }
            request.logits_topk.map(|k| (rows, prod, reference, k))
        }
        CheckMode::Observe => return Err(skip("observe mode")),
    };
    if outcome.metrics.nan_ref + outcome.metrics.inf_ref > 0 {
        outcome.flags |= flags::REFERENCE_NONFINITE;
    }
    if let Some((rows, prod, reference, k)) = logits_rows {
        let (metrics, row) = logits(&rows, &prod, &reference, p.n as usize, k);
        outcome.logits = metrics;
        outcome.logits_rows = row.into_iter().collect();
    }
    Ok(outcome)
}

/// Production and reference values of the global rows `rows` (over `batch * M`), row after
/// row in that order: `rows.len() x N` each.
fn exact_rows(
    p: &GemmProblem,
    inputs: &HostInputs,
    d: &[u8],
    rows: &[u64],
) -> Result<(Vec<f64>, Vec<f64>), Skip> {
    // The oracle computes the same rows of every batch item: ask for the distinct in-item rows.
    let mut local: Vec<u64> = rows.iter().map(|r| r % p.m).collect();
    local.sort_unstable();
    local.dedup();
    let options = OracleOptions { round_output: true, rows: Some(local.clone()) };
    let reference = oracle::reference_gemm(p, inputs, &options).map_err(|_| skip("reference failed"))?;
    let prod = oracle::decode_output_rows(p, d, &local).map_err(|_| skip("decoding d failed"))?;
    let pick = |out: &OracleOutput, dst: &mut Vec<f64>| -> Result<(), Skip> {
        for &r in rows {
            let position = local.binary_search(&(r % p.m)).map_err(|_| skip("row selection"))?;
            dst.extend_from_slice(out.row(r / p.m, position).ok_or_else(|| skip("row selection"))?);
        }
        Ok(())
    };
    let n = p.n as usize;
    let (mut pv, mut rv) = (Vec::with_capacity(rows.len() * n), Vec::with_capacity(rows.len() * n));
    pick(&prod, &mut pv)?;
    pick(&reference, &mut rv)?;
    Ok((pv, rv))
}

/// The host sketch of one call from the oracle's decoded operands.
fn sketch_outcome(
    p: &GemmProblem,
    inputs: &HostInputs,
    d: &[u8],
    cfg: &SketchConfig,
    epoch: u64,
) -> Result<sketch::SketchOutcome, Skip> {
    let scalars = p.resolve_scalars(&inputs.device_scalars).map_err(|_| skip("unresolved scalar"))?;
    let mut a = Vec::new();
    for item in 0..p.batch {
        a.extend(oracle::decode_operand_a(p, inputs, item).map_err(|_| skip("decoding a failed"))?);
    }
    let b_shared = p.batch == 1 || (p.b.batch_stride == 0 && p.b_scale.is_none_or(|s| s.batch_stride == 0));
    let mut b = Vec::new();
    for item in 0..if b_shared { 1 } else { p.batch } {
        b.extend(oracle::decode_operand_b(p, inputs, item).map_err(|_| skip("decoding b failed"))?);
    }
    let c = match (p.c, &inputs.c) {
        (Some(layout), Some(bytes)) if scalars.beta != 0.0 => {
            let mut as_c = p.clone();
            as_c.d = layout;
            Some(oracle::decode_output(&as_c, bytes).map_err(|_| skip("decoding c failed"))?.values)
        }
        _ => None,
    };
    let bias = match (p.epilogue.bias, &inputs.bias) {
        (Some(bias), Some(bytes)) => {
            let len = if bias.axis == BiasAxis::Rows { p.m } else { p.n } as usize;
            if bias.format.bytes_for(len) > bytes.len() {
                return Err(skip("bias too short"));
            }
            Some(((0..len).map(|i| bias.format.load(bytes, i)).collect::<Vec<f64>>(), bias.axis))
        }
        _ => None,
    };
    let prod = oracle::decode_output(p, d).map_err(|_| skip("decoding d failed"))?.values;
    let dense = DenseGemm {
        m: p.m as usize,
        n: p.n as usize,
        k: p.k as usize,
        batch: p.batch as usize,
        a: &a,
        b: &b,
        c: c.as_deref(),
        bias: bias.as_ref().map(|(v, axis)| (v.as_slice(), *axis)),
        alpha: scalars.alpha,
        beta: scalars.beta,
        d_scale: scalars.d_scale,
    };
    sketch::sketch_check(&dense, &prod, cfg, epoch).map_err(|_| skip("sketch failed"))
}

/// Logits metrics over the compared rows, as the device reports them, and the top-k lists of
/// the row with the largest KL (a NaN KL ranks largest).
fn logits(
    rows: &[u64],
    prod: &[f64],
    reference: &[f64],
    n: usize,
    k: u32,
) -> (Option<LogitsMetrics>, Option<LogitsRow>) {
    if rows.is_empty() || n == 0 {
        return (None, None);
    }
    let k_used = (k as usize).min(n).max(1);
    let (mut kl_sum, mut nonfinite, mut top1, mut overlap) = (0.0, false, true, 0.0);
    let mut worst: Option<(usize, f64)> = None;
    for (t, (p, r)) in prod.chunks_exact(n).zip(reference.chunks_exact(n)).enumerate() {
        let m = compare_logits(p, r, k_used);
        if m.kl.is_nan() {
            nonfinite = true;
        } else {
            kl_sum += m.kl;
        }
        top1 &= m.top1_agree;
        overlap += m.topk_overlap;
        // Negated so that a NaN KL always counts as the largest.
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        if worst.is_none_or(|(_, w)| !(m.kl <= w) && !w.is_nan()) {
            worst = Some((t, m.kl));
        }
    }
    let count = rows.len() as f64;
    let metrics = LogitsMetrics {
        kl: if nonfinite { f64::NAN } else { kl_sum / count },
        top1_agree: top1,
        topk_overlap: overlap / count,
        k: k_used as u32,
    };
    let row = worst.map(|(t, _)| {
        let (p, r) = (&prod[t * n..(t + 1) * n], &reference[t * n..(t + 1) * n]);
        let top = |v: &[f64]| top_k(v, k_used).into_iter().map(|i| (i as u32, v[i] as f32)).collect();
        LogitsRow { row: rows[t], prod_top: top(p), ref_top: top(r) }
    });
    (Some(metrics), row)
}
