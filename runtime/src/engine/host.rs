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

use super::backend::{
    Backend, CheckOutcome, CheckRequest, Diagnose, InjectRequest, Injected, Polled, PreCall,
};
use crate::diagnosis;
use crate::formats::Format;
use crate::inject::{self, CallRewrite, FaultClass, Operand, ScaleRewrite};
use crate::intercept::{InterceptedGemm, Skip};
use crate::metrics::{compare_logits, compare_matrix, top_k, LogitsMetrics, Metrics};
use crate::oracle::{self, OracleOptions, OracleOutput};
use crate::problem::{BiasAxis, GemmProblem, HostInputs, MatrixLayout, Scalar};
use crate::record::DiagnosisRecord;
use crate::record::{flags, CheckMode, LogitsRow};
use crate::sketch::{self, DenseGemm, RowSample, SketchConfig};
use crossbeam_queue::ArrayQueue;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Results kept for `poll` by default.
pub const DEFAULT_QUEUE_CAPACITY: usize = 1024;
/// Largest single host copy a check makes (one operand, scales or D), in bytes.
pub const MAX_COPY_BYTES: u64 = 1 << 30;

/// Rows a diagnosis compares (all rows of smaller calls).
pub const DIAGNOSIS_ROWS: u64 = 256;

/// The host backend (see the module doc).
pub struct HostBackend {
    results: ArrayQueue<Polled>,
    dropped: AtomicU64,
    /// Diagnoses made per site on failing checks ([`Diagnose::IfFailing`]): one each.
    diagnosed: Mutex<HashMap<u64, u32>>,
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
        HostBackend {
            results: ArrayQueue::new(capacity.max(1)),
            dropped: AtomicU64::new(0),
            diagnosed: Mutex::new(HashMap::new()),
        }
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
            Ok(mut outcome) => {
                if request.diagnose == Diagnose::IfFailing
                    && !request.thresholds.judge(problem.class(), &outcome.metrics).is_empty()
                    && self.first_diagnosis(request.site_id)
                {
                    // Diagnosed with the failing call itself; a diagnosis that cannot be made
                    // is counted with the skips and the check still reported.
                    match diagnose_call(request, &problem, &inputs, &d) {
                        Ok(record) => outcome.diagnosis = Some(Box::new(record)),
                        Err(reason) => {
                            self.push(Polled::DiagnosisFailed { site_id: request.site_id, reason: reason.0 })
                        }
                    }
                }
                Polled::Done(Box::new(outcome))
            }
            Err(reason) => Polled::Failed {
                site_ordinal: request.site_ordinal,
                call_seq: request.call_seq,
                reason: reason.0,
            },
        };
        self.push(result);
        Ok(())
    }

    fn inject_before(&self, request: &InjectRequest) -> Result<Injected, Skip> {
        let call = request.call;
        let p = &call.problem;
        if call.pointer_arrays.is_some() {
            return Err(skip("fault injection into array-of-pointers calls"));
        }
        p.validate().map_err(|_| skip("invalid problem"))?;
        // Every rewrite is computed before the first byte is written: all or nothing.
        let mut planned: Vec<(u64, Vec<u8>, Vec<u8>)> = Vec::new();
        for rewrite in &request.before {
            // SAFETY (reads and writes here and in inject_after): the host backend runs only
            // without a GPU runtime, where the intercepted library works on host memory; the
            // extents come from the validated problem, as for the checks.
            let (addr, original, faulted) = match rewrite {
                CallRewrite::Nothing => continue,
                CallRewrite::ReplaceScale { operand, rewrite, spec, entries } => {
                    let addr = match operand {
                        Operand::A => call.buffers.a_scale,
                        Operand::B => call.buffers.b_scale,
                    };
                    let bytes = bytes_of(spec.format, *entries as u128)?;
                    let original = unsafe { read_bytes(addr, bytes, "scale")? };
                    let class = match rewrite {
                        ScaleRewrite::Transposed => FaultClass::ScaleTranspose,
                        ScaleRewrite::Ones => FaultClass::ScaleIgnore,
                    };
                    let faulted = inject::prepare_scale_fault(p, class, *operand, &original)
                        .map_err(|e| Skip(format!("host: {e}")))?;
                    (addr, original, faulted)
                }
                CallRewrite::FlipTranspose { operand, problem: flipped } => {
                    let (addr, layout, (rows, cols)) = match operand {
                        Operand::A => (call.buffers.a, p.a, p.a_stored_dims()),
                        Operand::B => (call.buffers.b, p.b, p.b_stored_dims()),
                    };
                    let original =
                        unsafe { read_bytes(addr, matrix_bytes(&layout, rows, cols, p.batch)?, "operand")? };
                    let faulted = inject::prepare_transpose_fault(p, *operand, flipped, &original)
                        .map_err(|e| Skip(format!("host: {e}")))?;
                    (addr, original, faulted)
                }
            };
            planned.push((addr, original, faulted));
        }
        let mut saved = Vec::with_capacity(planned.len());
        for (addr, original, faulted) in planned {
            unsafe { write_bytes(addr, &faulted) };
            saved.push((addr, original));
        }
        Ok(Injected(Some(Box::new(SavedInputs(saved)))))
    }

    fn inject_after(&self, request: &InjectRequest, saved: Injected) -> Result<(), Skip> {
        // The caller's inputs first: they are restored whatever happens to the output faults.
        if let Some(saved) = saved.0.and_then(|b| b.downcast::<SavedInputs>().ok()) {
            for (addr, original) in saved.0.iter().rev() {
                // SAFETY: see inject_before; the same range it read and wrote.
                unsafe { write_bytes(*addr, original) };
            }
        }
        if request.after.is_empty() {
            return Ok(());
        }
        let call = request.call;
        let p = &call.problem;
        if call.pointer_arrays.is_some() {
            return Err(skip("fault injection into array-of-pointers calls"));
        }
        let bytes = matrix_bytes(&p.d, p.m, p.n, p.batch)?;
        // SAFETY: see inject_before; D's declared extent.
        let mut d = unsafe { read_bytes(call.buffers.d, bytes, "d")? };
        for class in &request.after {
            inject::apply_output_fault(p, *class, &mut d, request.seed)
                .map_err(|e| Skip(format!("host: {e}")))?;
        }
        // SAFETY: as above.
        unsafe { write_bytes(call.buffers.d, &d) };
        Ok(())
    }

    fn diagnose(&self, request: &CheckRequest) -> Result<(), Skip> {
        // SAFETY: see before_call.
        let (problem, inputs, d) = unsafe { read_call(request.call, None)? };
        let record = diagnose_call(request, &problem, &inputs, &d)?;
        self.push(Polled::Diagnosis(Box::new(record)));
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

impl HostBackend {
    /// Whether `site_id` has not been diagnosed on a failing check yet (and now counts as done).
    fn first_diagnosis(&self, site_id: u64) -> bool {
        let mut m = self.diagnosed.lock().unwrap_or_else(|e| e.into_inner());
        if m.len() >= 4096 && !m.contains_key(&site_id) {
            return false;
        }
        let n = m.entry(site_id).or_insert(0);
        *n += 1;
        *n == 1
    }
}

/// (address, original bytes) of inputs a fault rewrote, to put back after the call.
struct SavedInputs(Vec<(u64, Vec<u8>)>);

/// Writes `bytes` at host address `addr`.
///
/// # Safety
/// `addr..addr + bytes.len()` must be writable host memory that nothing else is using.
unsafe fn write_bytes(addr: u64, bytes: &[u8]) {
    if addr == 0 || bytes.is_empty() {
        return;
    }
    // SAFETY: the caller guarantees the range is writable.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) };
}

/// The diagnosis of one call: every reading of the contract on a row sample (all rows of a
/// small call), ranked, with the error map of the declared reading.
fn diagnose_call(
    request: &CheckRequest,
    p: &GemmProblem,
    inputs: &HostInputs,
    d: &[u8],
) -> Result<DiagnosisRecord, Skip> {
    let total = p.batch * p.m;
    let sample = RowSample::new(crate::rng::mix64(request.sketch.seed ^ 0xd1a6), total, DIAGNOSIS_ROWS);
    let rows = sample.rows(request.site_epoch);
    let (prod, reference) = exact_rows(p, inputs, d, &rows)?;
    let n = p.n as usize;
    let prod_rows: Vec<(u64, Vec<f64>)> =
        rows.iter().zip(prod.chunks_exact(n.max(1))).map(|(r, v)| (*r, v.to_vec())).collect();
    let found =
        diagnosis::diagnose(p, inputs, &prod_rows).map_err(|e| Skip(format!("host: diagnosis: {e}")))?;
    let map = diagnosis::error_map(&prod, &reference, &rows, n, p);
    Ok(diagnosis::to_record(
        &found,
        (request.site_id, request.site_ordinal),
        request.call_seq,
        rows.len() as u64,
        Some(&map),
        p,
    ))
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
