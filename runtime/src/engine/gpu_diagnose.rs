//! Diagnosis of a site on the GPU ([`crate::diagnosis`]): every alternative reading of the
//! call's contract evaluated by the rows reference and the compare kernel on one row sample
//! (all rows up to [`DIAG_ROWS`], else a seeded [`RowSample`] of that many, fewer for very long
//! rows: [`diag_rows`]), ranked on the host when the results come back. A call that
//! accumulated into C in place is diagnosed only when `before_call` saved C for that very call
//! (a checked call); otherwise it declines and the engine asks again.
//!
//! Stream order, outside captures only (a capture declines; the engine asks on a later call):
//! 1. with the side stream: on the call's stream, copies of the per-call inputs (A, D, A's
//!    scales, C; weights stay put) into this diagnosis's scratch, an event, and the side
//!    stream waits for it (the caller's stream never waits); without one, everything below
//!    runs on the call's stream over the caller's buffers;
//! 2. on the run stream: the sampled production rows of D into mapped host memory, then per
//!    reading (the declared one first): the rows reference into one f32 buffer, for the
//!    declared reading a copy of its reference rows into mapped host memory, and a compare of
//!    D's rows with it that writes a ring slot tagged (site, [`diag_tag2`]: a marker bit, the
//!    diagnosis id and the reading's index);
//! 3. an event after the last compare (the diagnosis's "done").
//!
//! The poller routes tagged slots to their diagnosis; when every launched reading's slot is in
//! (stream order: the mapped copies are complete too), it ranks them ([`diagnosis::rank`]),
//! builds the error map of the declared reading from the mapped rows and pushes
//! [`Polled::Diagnosis`]. At most [`DIAG_SLOTS`] diagnoses run at once (each owns a region of
//! mapped memory, two events and its scratch); one not back within [`DIAG_TIMEOUT`] fails, and
//! its scratch is kept until its done event says the device is through with it.
//!
//! A reading is evaluated only on memory the declared call justifies: one that would read more
//! of any buffer than the declared problem's extent of it ([`reading_obstacle`]) is skipped
//! with the reason, as is one whose kernels failed to compile.

use super::{pool_reason, short, status_reason, GpuBackend, ProgramWait, RelaxedCapture};
use crate::device::abi::{self, DeviceGate, KernelBuild, QsGemmDesc, QsResultSlot, QsRowSel};
use crate::device::gpu::{CompareRequest, CompareScratch, DeviceBuffer};
use crate::device::{Event, GpuRuntime, MappedHost, Stream};
use crate::diagnosis::{self, Reading, ReadingKind, ReadingResult};
use crate::engine::backend::{CheckRequest, Polled};
use crate::intercept::Skip;
use crate::problem::{GemmBuffers, GemmProblem, MatrixLayout, Order, ScaleSpec};
use crate::record::DiagnosisRecord;
use crate::sketch::{self, RowSample};
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Rows compared under every reading (all rows when the call has fewer)...
pub(super) const DIAG_ROWS: u64 = 256;
/// ...unless their reference (f32) would exceed this many elements (an LM head's rows).
pub(super) const DIAG_ELEMENTS: u64 = 1 << 24;

/// Rows a diagnosis samples for rows of `n` columns: [`DIAG_ROWS`], fewer for very long rows.
pub(super) fn diag_rows(n: u64) -> u64 {
    (DIAG_ELEMENTS / n.max(1)).clamp(1, DIAG_ROWS)
}
/// Diagnoses running at once; further ones are declined (the engine asks again later).
pub(super) const DIAG_SLOTS: usize = 4;
/// A diagnosis whose results are not all back by then is given up.
pub(super) const DIAG_TIMEOUT: Duration = Duration::from_secs(60);
/// Mapped host memory per diagnosis for the error map: the declared reading's reference rows
/// (f32) and production's rows of D. Rows beyond it are ranked but left out of the map.
pub(super) const MAP_BYTES: usize = 8 << 20;

/// Marks a ring slot as a diagnosis result (check results carry the call sequence number).
const TAG_MARK: u64 = 1 << 63;
const READING_BITS: u32 = 12;

/// `tag2` of reading `reading` of diagnosis `id`.
pub(super) fn diag_tag2(id: u64, reading: usize) -> u64 {
    TAG_MARK | ((id & ((1 << (63 - READING_BITS)) - 1)) << READING_BITS) | (reading as u64 & 0xfff)
}

/// (diagnosis id, reading index) of a diagnosis slot's `tag2`.
pub(super) fn parse_tag2(tag2: u64) -> Option<(u64, usize)> {
    (tag2 & TAG_MARK != 0).then_some(((tag2 & !TAG_MARK) >> READING_BITS, (tag2 & 0xfff) as usize))
}

// ---------------------------------------------------------------------------------------------
// Extents: what a reading may read
// ---------------------------------------------------------------------------------------------

fn bytes_of(format: crate::formats::Format, elements: u64) -> u128 {
    (elements as u128 * format.bits() as u128).div_ceil(8)
}

fn operand_bytes(layout: &MatrixLayout, (rows, cols): (u64, u64), batch: u64) -> u128 {
    bytes_of(layout.format, layout.required_elements(rows, cols, batch))
}

fn scale_bytes(spec: Option<&ScaleSpec>, outer: u64, k: u64, batch: u64) -> u128 {
    spec.map_or(0, |s| bytes_of(s.format, s.required_entries(outer, k, batch)))
}

/// Why reading `alt` of the `declared` call would read memory the declared call does not
/// justify (more of a buffer than the declared problem's extent of it), or None. With
/// `swap_scales` the A scales are read from B's scale buffer and the reverse.
pub(super) fn reading_obstacle(
    declared: &GemmProblem,
    alt: &GemmProblem,
    swap_scales: bool,
) -> Option<String> {
    let p = declared;
    if (alt.m, alt.n, alt.k, alt.batch) != (p.m, p.n, p.k, p.batch) {
        return Some("changes the problem's shape".into());
    }
    if alt.c != p.c || alt.d != p.d || alt.epilogue != p.epilogue {
        return Some("changes C, D or the epilogue".into());
    }
    if operand_bytes(&alt.a, alt.a_stored_dims(), p.batch) > operand_bytes(&p.a, p.a_stored_dims(), p.batch) {
        return Some("reads more of A than the declared call holds".into());
    }
    if operand_bytes(&alt.b, alt.b_stored_dims(), p.batch) > operand_bytes(&p.b, p.b_stored_dims(), p.batch) {
        return Some("reads more of B than the declared call holds".into());
    }
    let have_a = scale_bytes(p.a_scale.as_ref(), p.m, p.k, p.batch);
    let have_b = scale_bytes(p.b_scale.as_ref(), p.n, p.k, p.batch);
    let need_a = scale_bytes(alt.a_scale.as_ref(), p.m, p.k, p.batch);
    let need_b = scale_bytes(alt.b_scale.as_ref(), p.n, p.k, p.batch);
    let (from_a, from_b) = if swap_scales { (have_b, have_a) } else { (have_a, have_b) };
    if need_a > from_a {
        return Some(if swap_scales {
            "A scales read from the B scale buffer need more entries than it holds".into()
        } else {
            "needs more A scale entries than the declared call holds".into()
        });
    }
    if need_b > from_b {
        return Some(if swap_scales {
            "B scales read from the A scale buffer need more entries than it holds".into()
        } else {
            "needs more B scale entries than the declared call holds".into()
        });
    }
    None
}

// ---------------------------------------------------------------------------------------------
// The error map's rows in mapped memory
// ---------------------------------------------------------------------------------------------

/// How production's rows of D sit in the mapped region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MapD {
    /// Row t of the map packed at `d_offset + t * N` elements (D row-major).
    Rows,
    /// The whole of D in its own layout at `d_offset` (D column-major and small).
    Whole,
}

/// What the error map copies into a mapped region of [`MAP_BYTES`]: the declared reading's
/// reference rows (f32, `rows x n`, at offset 0) and production's rows of D.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MapPlan {
    /// The map covers the first `rows` rows of the sample.
    pub rows: usize,
    pub n: usize,
    pub d_offset: usize,
    pub d: MapD,
    /// (element offset in D, byte offset in the region, bytes), contiguous runs merged.
    pub copies: Vec<(u64, usize, usize)>,
}

/// The mapped copies for the sampled `rows` (global rows over batch * M) of `p`, or None when
/// no row fits (or D is packed 4-bit).
pub(super) fn map_plan(p: &GemmProblem, rows: &[u64], region: usize) -> Option<MapPlan> {
    let f = p.d.format;
    if f.bits() < 8 || rows.is_empty() {
        return None;
    }
    let (eb, n) = ((f.bits() / 8) as usize, p.n as usize);
    let align = |x: usize| x.div_ceil(8) * 8;
    match p.d.order {
        Order::RowMajor => {
            let per_row = n.checked_mul(4 + eb)?;
            let fit = region.saturating_sub(8) / per_row.max(1);
            let count = rows.len().min(fit);
            if count == 0 {
                return None;
            }
            let d_offset = align(count * n * 4);
            let mut copies: Vec<(u64, usize, usize)> = vec![];
            for (t, &r) in rows[..count].iter().enumerate() {
                let src = GemmProblem::out_offset(&p.d, r / p.m, r % p.m, 0);
                let dst = d_offset + t * n * eb;
                match copies.last_mut() {
                    Some(last) if last.0 + (last.2 / eb) as u64 == src && last.1 + last.2 == dst => {
                        last.2 += n * eb
                    }
                    _ => copies.push((src, dst, n * eb)),
                }
            }
            Some(MapPlan { rows: count, n, d_offset, d: MapD::Rows, copies })
        }
        Order::ColMajor => {
            let whole = f.bytes_for(p.d.required_elements(p.m, p.n, p.batch) as usize);
            let fit = region.saturating_sub(whole + 8) / n.checked_mul(4)?.max(1);
            let count = rows.len().min(fit);
            if count == 0 {
                return None;
            }
            let d_offset = align(count * n * 4);
            Some(MapPlan { rows: count, n, d_offset, d: MapD::Whole, copies: vec![(0, d_offset, whole)] })
        }
    }
}

/// Production and reference values of the map's rows (`rows x n`, row-major) from a region
/// filled as `plan` says.
pub(super) fn decode_map(
    plan: &MapPlan,
    p: &GemmProblem,
    rows: &[u64],
    region: &[u8],
) -> Option<(Vec<f64>, Vec<f64>)> {
    let (n, count) = (plan.n, plan.rows);
    let f = p.d.format;
    let ref_bytes = region.get(..count * n * 4)?;
    let reference: Vec<f64> =
        ref_bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect();
    let d = region.get(plan.d_offset..)?;
    let mut prod = Vec::with_capacity(count * n);
    for (t, &r) in rows.get(..count)?.iter().enumerate() {
        for j in 0..n as u64 {
            let index = match plan.d {
                MapD::Rows => t * n + j as usize,
                MapD::Whole => GemmProblem::out_offset(&p.d, r / p.m, r % p.m, j) as usize,
            };
            if f.bytes_for(index + 1) > d.len() {
                return None;
            }
            prod.push(f.load(d, index));
        }
    }
    Some((prod, reference))
}

// ---------------------------------------------------------------------------------------------
// Assembling the readings' slots
// ---------------------------------------------------------------------------------------------

/// The readings of one diagnosis and the slots that came back for them.
#[derive(Debug, Clone)]
pub(super) struct Assembly {
    pub readings: Vec<Reading>,
    slots: Vec<Option<QsResultSlot>>,
    /// Readings not evaluated, with the reason.
    pub skipped: Vec<(Reading, String)>,
    arrived: usize,
}

impl Assembly {
    pub fn new(readings: Vec<Reading>, skipped: Vec<(Reading, String)>) -> Assembly {
        Assembly { slots: vec![None; readings.len()], readings, skipped, arrived: 0 }
    }

    /// Only the first `launched` readings were enqueued: the others come back as skipped.
    pub fn launched_only(&mut self, launched: usize, reason: &str) {
        while self.readings.len() > launched {
            let r = self.readings.pop().expect("longer than launched");
            if self.slots.pop().flatten().is_some() {
                self.arrived -= 1;
            }
            self.skipped.push((r, reason.to_string()));
        }
    }

    /// Takes reading `index`'s slot (a repeat or an unknown index is ignored).
    pub fn accept(&mut self, index: usize, slot: QsResultSlot) {
        if let Some(s @ None) = self.slots.get_mut(index) {
            *s = Some(slot);
            self.arrived += 1;
        }
    }

    pub fn complete(&self) -> bool {
        self.arrived == self.readings.len()
    }

    /// Every arrived reading's result; readings whose slot is invalid are skipped with the
    /// device's reason.
    pub fn results(&self) -> (Vec<ReadingResult>, Vec<(Reading, String)>) {
        let mut results = vec![];
        let mut skipped = self.skipped.clone();
        for (reading, slot) in self.readings.iter().zip(&self.slots) {
            match slot {
                Some(s) if sketch::slot_is_valid(s) => results.push(ReadingResult {
                    reading: reading.clone(),
                    metrics: sketch::slot_metrics(s),
                    // The host counts the pairs where exactly one side is finite; a slot only
                    // has each side's count of NaN/Inf, so their difference stands in for it: a
                    // lower bound, exact when one side's non-finite values sit where the other
                    // is finite (a reading that invents or hides NaN/Inf, the case it ranks).
                    nonfinite_mismatch: (s.nan_prod + s.inf_prod).abs_diff(s.nan_ref + s.inf_ref),
                    // Likewise: what the reference has beyond production.
                    invented: (s.nan_ref + s.inf_ref).saturating_sub(s.nan_prod + s.inf_prod),
                }),
                Some(s) => skipped.push((reading.clone(), status_reason(s.status))),
                None => skipped.push((reading.clone(), "result not received".into())),
            }
        }
        (results, skipped)
    }
}

/// What one diagnosis is about.
#[derive(Debug, Clone)]
pub(super) struct Subject {
    pub site_id: u64,
    pub site_ordinal: u32,
    pub call_seq: u64,
    pub problem: GemmProblem,
    /// Global rows (over batch * M) of the sample, in compare order.
    pub rows: Vec<u64>,
}

/// The record of a finished diagnosis: ranking, and the error map when `map` holds the
/// declared reading's values (`rows x N`, production then reference) of the sample's first rows.
pub(super) fn finish(
    subject: &Subject,
    assembly: &Assembly,
    map: Option<(Vec<f64>, Vec<f64>)>,
) -> Result<DiagnosisRecord, String> {
    let (results, skipped) = assembly.results();
    let d = diagnosis::rank(results, skipped).ok_or("the declared reading could not be evaluated")?;
    let p = &subject.problem;
    let n = p.n as usize;
    let map = map.and_then(|(prod, reference)| {
        let count = prod.len() / n.max(1);
        let rows: Vec<u64> = subject.rows.get(..count)?.iter().map(|r| r % p.m).collect();
        // error_map asserts these sizes: never hand it anything else.
        (count > 0 && prod.len() == count * n && reference.len() == count * n)
            .then(|| diagnosis::error_map(&prod, &reference, &rows, n, p))
    });
    Ok(diagnosis::to_record(
        &d,
        (subject.site_id, subject.site_ordinal),
        subject.call_seq,
        subject.rows.len() as u64,
        map.as_ref(),
        p,
    ))
}

// ---------------------------------------------------------------------------------------------
// Regions: what one running diagnosis owns
// ---------------------------------------------------------------------------------------------

/// Pinned host memory mapped into the device, freed on drop.
struct MappedRegion {
    runtime: Arc<dyn GpuRuntime>,
    mapped: MappedHost,
}

impl Drop for MappedRegion {
    fn drop(&mut self) {
        // SAFETY: allocated by alloc_mapped of this runtime and owned by this region alone; the
        // region is dropped with the backend, after its diagnoses.
        let _ = unsafe { self.runtime.free_mapped(&self.mapped) };
    }
}

/// Device buffers one diagnosis reads and writes (pool blocks, returned on drop).
#[derive(Default)]
struct Scratch {
    buffers: Vec<DeviceBuffer>,
    compare: Option<CompareScratch>,
}

struct Pending {
    id: u64,
    subject: Subject,
    assembly: Assembly,
    map: Option<MapPlan>,
    started: Instant,
    /// Set while `diagnose` is still enqueueing (the poller neither finishes nor times it out).
    launching: bool,
    /// The region's done event follows this diagnosis's work (else the region is not reused
    /// after a time-out).
    recorded: bool,
    /// Some launch failed after its reference was enqueued: work may follow the last compare,
    /// so the scratch waits for the done event even when every slot is back.
    partial: bool,
    scratch: Scratch,
}

enum Use {
    Free,
    /// Taken by a `diagnose` call setting up (no work enqueued yet).
    Reserved,
    Busy(Box<Pending>),
    /// Given up or failed after work was enqueued: reusable once `done` has completed. The
    /// scratch is held (never read) so that no one else gets its blocks meanwhile.
    Draining(#[allow(dead_code)] Scratch),
    /// Its done event could not be recorded: never reused (the scratch stays with it).
    Dead(#[allow(dead_code)] Scratch),
}

struct Region {
    mapped: Option<MappedRegion>,
    inputs_ready: Event,
    done: Event,
    state: Use,
}

/// The backend's diagnoses.
pub(super) struct Diagnoses {
    /// Regions not Free (cheap test for the poller).
    active: AtomicUsize,
    state: Mutex<DiagState>,
}

#[derive(Default)]
struct DiagState {
    regions: Vec<Region>,
    next_id: u64,
}

impl Default for Diagnoses {
    fn default() -> Diagnoses {
        Diagnoses { active: AtomicUsize::new(0), state: Mutex::new(DiagState::default()) }
    }
}

/// A region taken for a new diagnosis.
struct Reserved {
    index: usize,
    /// (host, device) addresses of its mapped memory, when asked for and available.
    mapped: Option<(*mut u8, u64)>,
    inputs_ready: Event,
    done: Event,
}

/// What a diagnosis will run: the readings to evaluate (declared first), those skipped
/// already, the row sample and the error map's copies.
struct Work {
    readings: Vec<(Reading, GemmProblem)>,
    skipped: Vec<(Reading, String)>,
    sample: RowSample,
    rows: Vec<u64>,
    plan: Option<MapPlan>,
}

const BUSY: &str = "busy: other diagnoses still running";

/// A launch of one reading: its reference descriptor.
struct ReadingLaunch {
    reading: Reading,
    g: QsGemmDesc,
}

impl GpuBackend {
    /// Takes a region for a new diagnosis (outside capture): a free one, a draining one whose
    /// work is done, or a new one; with its mapped memory when `want_map`.
    fn reserve_region(&self, want_map: bool) -> Result<Reserved, Skip> {
        let rt = &self.runtime;
        let mut st = self.diagnoses.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut index = None;
        for (i, r) in st.regions.iter_mut().enumerate() {
            match r.state {
                Use::Free => {}
                Use::Draining(_) if rt.event_done(r.done).unwrap_or(false) => {}
                _ => continue,
            }
            if matches!(r.state, Use::Draining(_)) {
                self.diagnoses.active.fetch_sub(1, Ordering::Relaxed);
            }
            r.state = Use::Free; // a drained region's scratch goes back to the pool here
            index = Some(i);
            break;
        }
        let index = match index {
            Some(i) => i,
            None if st.regions.len() < DIAG_SLOTS => {
                let fail = |e: crate::device::DeviceError| {
                    Skip::new(format!("diagnosis event: {}", short(&e.to_string())))
                };
                let inputs_ready = rt.create_sync_event().map_err(fail)?;
                let done = rt.create_sync_event().map_err(fail)?;
                st.regions.push(Region { mapped: None, inputs_ready, done, state: Use::Free });
                st.regions.len() - 1
            }
            None => return Err(Skip::new(BUSY)),
        };
        let region = &mut st.regions[index];
        if want_map && region.mapped.is_none() {
            // Without it the diagnosis still ranks the readings; only the error map is left out.
            if let Ok(mapped) = rt.alloc_mapped(MAP_BYTES) {
                region.mapped = Some(MappedRegion { runtime: rt.clone(), mapped });
            }
        }
        region.state = Use::Reserved;
        self.diagnoses.active.fetch_add(1, Ordering::Relaxed);
        let mapped = region.mapped.as_ref().filter(|_| want_map).map(|m| (m.mapped.host, m.mapped.device));
        Ok(Reserved { index, mapped, inputs_ready: region.inputs_ready, done: region.done })
    }

    /// Gives a reserved region back with nothing enqueued.
    fn release_region(&self, index: usize) {
        let mut st = self.diagnoses.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = st.regions.get_mut(index) {
            if matches!(r.state, Use::Reserved) {
                r.state = Use::Free;
                self.diagnoses.active.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// The copy of C `before_call` took for this very call, when it did.
    fn saved_c(&self, req: &CheckRequest) -> Option<u64> {
        let sites = self.sites.lock().unwrap_or_else(|e| e.into_inner());
        sites.get(&req.site_id)?.c_saved.filter(|(seq, _)| *seq == req.call_seq).map(|(_, ptr)| ptr)
    }

    pub(super) fn diagnose_impl(&self, req: &CheckRequest) -> Result<(), Skip> {
        self.same_device()?;
        if req.call.pointer_arrays.is_some() {
            return Err(Skip::new("batched pointer arrays are not diagnosed on the GPU"));
        }
        let stream = Stream(req.call.stream);
        let capturing = self
            .runtime
            .is_capturing(stream)
            .map_err(|e| Skip::new(format!("stream capture query: {}", short(&e.to_string()))))?;
        if capturing {
            return Err(Skip::new("graph capture"));
        }
        if self.diagnoses.active.load(Ordering::Relaxed) >= DIAG_SLOTS {
            return Err(Skip::new(BUSY));
        }
        let _relaxed = RelaxedCapture::new(self.runtime.as_ref());
        let p = &req.call.problem;
        let mut buffers = req.call.buffers;
        let in_place = p.c.is_some() && buffers.c == buffers.d && p.beta != crate::problem::Scalar::Host(0.0);
        if in_place {
            // The call overwrote C: only a copy taken before it (a checked call) can serve.
            buffers.c = self.saved_c(req).ok_or_else(|| Skip::new("C accumulated in place and not saved"))?;
        }
        QsGemmDesc::from_problem(p, &buffers)
            .map_err(|e| Skip::new(format!("descriptor: {}", short(&e.to_string()))))?;

        // Readings the declared buffers can serve, and their programs.
        let mut skipped: Vec<(Reading, String)> = vec![];
        let mut planned: Vec<(Reading, GemmProblem, KernelBuild)> = vec![];
        for (reading, alt) in diagnosis::alternatives(p) {
            let declared = reading.kind == ReadingKind::Declared;
            if !declared {
                if let Some(why) = reading_obstacle(p, &alt, reading.swap_scale_buffers) {
                    skipped.push((reading, why));
                    continue;
                }
            }
            match KernelBuild::gemm_ref(alt.a.format, alt.b.format) {
                Ok(build) => planned.push((reading, alt, build)),
                Err(e) if declared => return Err(Skip::new(format!("reference: {}", short(&e.to_string())))),
                Err(e) => skipped.push((reading, short(&e.to_string()))),
            }
        }
        let compare = KernelBuild::compare(p.d.format).map_err(|e| Skip::new(format!("compare: {e}")))?;
        self.ensure_program(&compare, false)?;
        // Every program is asked for before declining, so they all compile in one wait.
        let mut waiting = None;
        let mut failed: HashSet<KernelBuild> = HashSet::new();
        let declared_build = planned.first().map(|x| x.2.clone());
        let mut seen: HashSet<KernelBuild> = HashSet::new();
        for (_, _, build) in &planned {
            if !seen.insert(build.clone()) {
                continue;
            }
            match self.program_ready(build, false) {
                Ok(()) => {}
                Err(ProgramWait::NotReady(s)) => {
                    waiting.get_or_insert(s);
                }
                Err(ProgramWait::Failed(s)) if Some(build) == declared_build.as_ref() => return Err(s),
                Err(ProgramWait::Failed(_)) => {
                    failed.insert(build.clone());
                }
            }
        }
        if let Some(s) = waiting {
            return Err(s);
        }
        let mut kept = vec![];
        for (reading, alt, build) in planned {
            if failed.contains(&build) {
                skipped.push((reading, "kernel compile failed".into()));
            } else {
                kept.push((reading, alt));
            }
        }

        let total_rows = p.batch * p.m;
        let seed = crate::rng::mix64(req.sketch.seed ^ 0xd1a6_0515);
        let sample = RowSample::new(seed, total_rows, diag_rows(p.n));
        let epoch = req.site_epoch;
        let rows = sample.rows(epoch);
        let plan = map_plan(p, &rows, MAP_BYTES);
        let region = self.reserve_region(plan.is_some())?;
        let plan = plan.filter(|_| region.mapped.is_some());
        let work = Work { readings: kept, skipped, sample, rows, plan };
        self.launch_diagnosis(req, &buffers, work, &region).map_err(|(e, enqueued)| {
            if !enqueued {
                self.release_region(region.index);
            }
            e
        })
    }

    /// Allocates the scratch, registers the diagnosis and enqueues its work. Err((why, whether
    /// anything was enqueued)): when something was, the region is left draining (or dead).
    fn launch_diagnosis(
        &self,
        req: &CheckRequest,
        buffers: &GemmBuffers,
        work: Work,
        region: &Reserved,
    ) -> Result<(), (Skip, bool)> {
        let Work { readings, mut skipped, sample, rows, mut plan } = work;
        let sample = &sample;
        let (index, mapped, inputs_ready, done) =
            (region.index, region.mapped, region.inputs_ready, region.done);
        let rt = &self.runtime;
        let p = &req.call.problem;
        let stream = Stream(req.call.stream);
        let not_enqueued = |s: Skip| (s, false);
        let pool = |what: &str, e: crate::device::DeviceError| {
            (Skip::new(format!("diagnosis {what}: {}", pool_reason(&e))), false)
        };
        let mut scratch = Scratch::default();
        let count = sample.count;
        let reference = self.checker.alloc((count as usize).saturating_mul(p.n as usize).saturating_mul(4));
        let reference = reference.map_err(|e| pool("reference", e))?;
        let reference_ptr = reference.ptr;
        scratch.buffers.push(reference);
        let compare_scratch =
            self.checker.compare_scratch(count, p.n, false).map_err(|e| pool("compare", e))?;
        // Per-call inputs copied for the side stream (weights stay put), as rows checks do.
        let side = self.side_stream;
        let mut bufs = *buffers;
        let mut copies = vec![];
        if side.is_some() {
            let weights = self.weights_rewritten(req.site_id);
            for (src, bytes, dst) in input_copies(p, buffers, &mut bufs, weights) {
                let copy = self.checker.alloc(bytes).map_err(|e| pool("inputs", e))?;
                *dst = copy.ptr;
                copies.push((copy.ptr, src, bytes));
                scratch.buffers.push(copy);
            }
        }
        // Descriptors of every reading over the buffers it runs on.
        let mut launches = vec![];
        for (reading, alt) in readings {
            let mut b = bufs;
            if reading.swap_scale_buffers {
                std::mem::swap(&mut b.a_scale, &mut b.b_scale);
            }
            match QsGemmDesc::from_problem(&alt, &b) {
                Ok(g) => launches.push(ReadingLaunch { reading, g }),
                Err(e) if reading.kind == ReadingKind::Declared => {
                    return Err(not_enqueued(Skip::new(format!("descriptor: {}", short(&e.to_string())))))
                }
                Err(e) => skipped.push((reading, short(&e.to_string()))),
            }
        }
        let d_desc =
            launches.first().map(|l| l.g.d).ok_or_else(|| not_enqueued(Skip::new("no declared reading")))?;
        // Every compare resolved before anything is enqueued.
        let id = {
            let mut st = self.diagnoses.state.lock().unwrap_or_else(|e| e.into_inner());
            st.next_id += 1;
            st.next_id
        };
        let mut prepared = vec![];
        for i in 0..launches.len() {
            let request = CompareRequest {
                d: d_desc,
                m: p.m,
                n: p.n,
                rows: QsRowSel::sample(sample, 0, req.site_epoch, false),
                reference: reference_ptr,
                ref_ld: p.n,
                logits_topk: None,
                kind: abi::CHECK_ROWS,
                tag: (req.site_id, diag_tag2(id, i)),
            };
            let c = self
                .checker
                .prepare_compare(&request, &compare_scratch)
                .map_err(|e| not_enqueued(Skip::new(format!("compare: {}", short(&e.to_string())))))?;
            prepared.push(c);
        }
        scratch.compare = Some(compare_scratch);

        // Registered before the first launch: its slots may come back at once.
        let subject = Subject {
            site_id: req.site_id,
            site_ordinal: req.site_ordinal,
            call_seq: req.call_seq,
            problem: p.clone(),
            rows: rows.clone(),
        };
        let readings: Vec<Reading> = launches.iter().map(|l| l.reading.clone()).collect();
        {
            let mut st = self.diagnoses.state.lock().unwrap_or_else(|e| e.into_inner());
            let Some(region) = st.regions.get_mut(index) else {
                return Err(not_enqueued(Skip::new("diagnosis region lost")));
            };
            region.state = Use::Busy(Box::new(Pending {
                id,
                subject,
                assembly: Assembly::new(readings, skipped),
                map: None,
                started: Instant::now(),
                launching: true,
                recorded: false,
                partial: false,
                scratch: Scratch::default(),
            }));
        }

        // Enqueue. `launched`: readings whose compare is enqueued (their slots will come).
        let mut launched = 0;
        let mut error: Option<Skip> = None;
        let fail = |what: &str, e: crate::device::DeviceError| {
            Skip::new(format!("{what}: {}", short(&e.to_string())))
        };
        let mut run_on = stream;
        let mut enqueued = false;
        let mut copied = Ok(());
        for &(dst, src, bytes) in &copies {
            copied = rt.copy_async(dst, src, bytes, stream).map_err(|e| fail("diagnosis input copy", e));
            enqueued = true;
            if copied.is_err() {
                break;
            }
        }
        if let (Some(side), Ok(())) = (side, &copied) {
            copied = rt
                .record_event(inputs_ready, stream)
                .and_then(|()| rt.wait_event(side, inputs_ready))
                .map_err(|e| fail("side stream event", e));
            if copied.is_ok() {
                run_on = side;
            }
        }
        if let Err(e) = copied {
            error = Some(e);
        } else {
            let sel = QsRowSel::sample(sample, 0, req.site_epoch, false);
            // Production's rows of D into the mapped region first (from the copy when there is one).
            if let (Some(pl), Some((_, device))) = (&plan, mapped) {
                let eb = (p.d.format.bits() / 8) as u64;
                let ok = pl.copies.iter().all(|&(src, dst, bytes)| {
                    rt.copy_async(device + dst as u64, bufs.d + src * eb, bytes, run_on).is_ok()
                });
                enqueued = true;
                if !ok {
                    plan = None;
                }
            }
            for (i, (l, c)) in launches.iter().zip(&prepared).enumerate() {
                let out = &scratch.buffers[0];
                if let Err(e) =
                    self.checker.reference_sel(&l.g, sel, out, p.n, true, DeviceGate::default(), run_on)
                {
                    error = Some(fail("reference launch", e));
                    break;
                }
                enqueued = true;
                if i == 0 {
                    if let (Some(pl), Some((_, device))) = (&plan, mapped) {
                        let bytes = pl.rows * pl.n * 4;
                        if rt.copy_async(device, out.ptr, bytes, run_on).is_err() {
                            plan = None;
                        }
                    }
                }
                if let Err(e) = self.checker.launch_prepared(c, run_on) {
                    error = Some(fail("compare launch", e));
                    break;
                }
                launched += 1;
            }
        }
        let recorded = !enqueued || rt.record_event(done, run_on).is_ok();

        // Hand the scratch to the region; the poller takes it from here.
        let mut st = self.diagnoses.state.lock().unwrap_or_else(|e| e.into_inner());
        let Some(region) = st.regions.get_mut(index) else {
            // Cannot happen (regions are never removed); keep the scratch alive regardless.
            std::mem::forget(scratch);
            return Err((error.unwrap_or_else(|| Skip::new("diagnosis region lost")), true));
        };
        if launched == 0 {
            region.state = match (enqueued, recorded) {
                (false, _) => Use::Reserved, // released by the caller
                (true, true) => Use::Draining(scratch),
                (true, false) => Use::Dead(scratch),
            };
            return Err((error.unwrap_or_else(|| Skip::new("nothing launched")), enqueued));
        }
        if let Use::Busy(pending) = &mut region.state {
            if launched < pending.assembly.readings.len() {
                pending.assembly.launched_only(launched, "launch failed");
                pending.partial = true;
            }
            pending.map = plan;
            pending.scratch = scratch;
            pending.launching = false;
            pending.recorded = recorded;
        }
        Ok(())
    }

    /// The poller's part: routes diagnosis slots, finishes complete diagnoses, gives up old
    /// ones. `slots` are ring slots whose tag2 carries the diagnosis marker.
    pub(super) fn poll_diagnoses(&self, slots: Vec<QsResultSlot>, out: &mut Vec<Polled>) {
        if slots.is_empty() && self.diagnoses.active.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut st = self.diagnoses.state.lock().unwrap_or_else(|e| e.into_inner());
        for slot in slots {
            let Some((id, reading)) = parse_tag2(slot.tag2) else { continue };
            for r in st.regions.iter_mut() {
                if let Use::Busy(pending) = &mut r.state {
                    if pending.id == id {
                        pending.assembly.accept(reading, slot);
                    }
                }
            }
        }
        let now = Instant::now();
        for r in st.regions.iter_mut() {
            let Use::Busy(pending) = &mut r.state else { continue };
            if pending.launching {
                continue;
            }
            if pending.assembly.complete() {
                let map = match (&pending.map, &r.mapped) {
                    (Some(plan), Some(m)) => {
                        // SAFETY: the region's mapping holds MAP_BYTES and belongs to this
                        // diagnosis; the device wrote it before the compares whose slots all
                        // arrived (stream order), and nothing writes it until the region is
                        // reused.
                        let bytes = unsafe { std::slice::from_raw_parts(m.mapped.host, MAP_BYTES) };
                        std::sync::atomic::fence(Ordering::Acquire);
                        decode_map(plan, &pending.subject.problem, &pending.subject.rows, bytes)
                    }
                    _ => None,
                };
                out.push(match finish(&pending.subject, &pending.assembly, map) {
                    Ok(record) => Polled::Diagnosis(Box::new(record)),
                    Err(reason) => Polled::DiagnosisFailed { site_id: pending.subject.site_id, reason },
                });
                if pending.partial {
                    let scratch = std::mem::take(&mut pending.scratch);
                    r.state = if pending.recorded { Use::Draining(scratch) } else { Use::Dead(scratch) };
                } else {
                    // Every launch of it has finished: its scratch goes back to the pool.
                    r.state = Use::Free;
                    self.diagnoses.active.fetch_sub(1, Ordering::Relaxed);
                }
            } else if now.duration_since(pending.started) >= DIAG_TIMEOUT {
                out.push(Polled::DiagnosisFailed {
                    site_id: pending.subject.site_id,
                    reason: "results did not come back in time".into(),
                });
                let scratch = std::mem::take(&mut pending.scratch);
                // Still running, maybe: the scratch waits for the done event (or forever).
                r.state = if pending.recorded { Use::Draining(scratch) } else { Use::Dead(scratch) };
            }
        }
    }
}

/// The per-call inputs a side-stream diagnosis copies ([`super::per_call_inputs`]), present ones.
fn input_copies<'b>(
    p: &GemmProblem,
    src: &GemmBuffers,
    out: &'b mut GemmBuffers,
    weights: bool,
) -> Vec<(u64, usize, &'b mut u64)> {
    super::per_call_inputs(p, src, out, weights)
        .into_iter()
        .filter(|(ptr, bytes, _)| *ptr != 0 && *bytes != 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formats::Format;
    use crate::problem::{ScaleGranularity, Transpose};

    fn fp8(m: u64, n: u64, k: u64) -> GemmProblem {
        let mut p = GemmProblem::row_major(m, n, k, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
        p.trans_b = Transpose::T;
        p.b = MatrixLayout::packed(Format::E4m3fn, Order::RowMajor, n, k);
        p.a_scale = Some(ScaleSpec::new(ScaleGranularity::Block { outer: 1, inner: 128 }, Format::F32));
        p.b_scale = Some(ScaleSpec::new(ScaleGranularity::Block { outer: 128, inner: 128 }, Format::F32));
        p
    }

    #[test]
    fn row_sample_shrinks_for_long_rows() {
        assert_eq!(diag_rows(4096), 256);
        assert_eq!(diag_rows(152_064), 110);
        assert_eq!(diag_rows(u64::MAX), 1);
    }

    #[test]
    fn tags_round_trip_and_never_look_like_a_call() {
        for (id, r) in [(1u64, 0usize), (7, 31), ((1 << 51) - 1, 4095)] {
            let t = diag_tag2(id, r);
            assert_eq!(parse_tag2(t), Some((id, r)));
        }
        for call_seq in [0u64, 1, 1 << 40, (1 << 63) - 1] {
            assert_eq!(parse_tag2(call_seq), None);
        }
    }

    #[test]
    fn readings_that_read_past_the_declared_buffers_are_skipped() {
        let p = fp8(64, 96, 512); // A scales 64 x 4 entries, B scales 1 x 4
        let mut why = std::collections::HashMap::new();
        for (reading, alt) in diagnosis::alternatives(&p) {
            why.insert(reading.id.clone(), reading_obstacle(&p, &alt, reading.swap_scale_buffers));
        }
        assert_eq!(why["declared"], None);
        assert_eq!(why["a-scales-ignored"], None);
        assert_eq!(why["a-as-e4m3fnuz"], None);
        // 1x32 blocks: a 64 x 16 grid, four times the entries the buffer holds.
        assert!(why["a-scale-block-1x32"].as_deref().unwrap().contains("A scale entries"));
        // 1x256 blocks: a 64 x 2 grid fits.
        assert_eq!(why["a-scale-block-1x256"], None);
        // 256 entries of A's layout cannot come out of B's 4.
        assert!(why["ab-scales-swapped"].as_deref().unwrap().contains("B scale buffer"));

        // Square grids swap freely; a square A re-read transposed fits.
        let mut q = GemmProblem::row_major(128, 128, 128, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
        q.a_scale = Some(ScaleSpec::new(ScaleGranularity::Block { outer: 128, inner: 128 }, Format::F32));
        q.b_scale = q.a_scale;
        let alts = diagnosis::alternatives(&q);
        let (swap, alt) = alts.iter().find(|(r, _)| r.id == "ab-scales-swapped").unwrap();
        assert_eq!(reading_obstacle(&q, alt, swap.swap_scale_buffers), None);
        let (flip, alt) = alts.iter().find(|(r, _)| r.id == "a-transpose-flipped").unwrap();
        assert_eq!(reading_obstacle(&q, alt, flip.swap_scale_buffers), None);
        // A reading that grows A itself, or touches D, is refused.
        let mut wide = q.clone();
        wide.a.ld = 256;
        assert!(reading_obstacle(&q, &wide, false).unwrap().contains("more of A"));
        let mut other_d = q.clone();
        other_d.d.ld = 256;
        assert!(reading_obstacle(&q, &other_d, false).is_some());
        // A reading with scales the declared call does not pass.
        let mut none = q.clone();
        none.b_scale = None;
        assert!(reading_obstacle(&none, &q, false).unwrap().contains("B scale"));
    }

    fn fill_region(plan: &MapPlan, p: &GemmProblem, d: &[u8], reference: &[f32], region: &mut [u8]) {
        for (i, v) in reference.iter().enumerate() {
            region[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        let eb = (p.d.format.bits() / 8) as usize;
        for &(src, dst, bytes) in &plan.copies {
            let src = src as usize * eb;
            region[dst..dst + bytes].copy_from_slice(&d[src..src + bytes]);
        }
    }

    #[test]
    fn map_rows_copied_and_decoded() {
        // Row-major D with padding, two batch items; sampled rows out of order.
        let mut p = GemmProblem::row_major(10, 6, 8, Format::Bf16, Format::Bf16, Format::Bf16);
        p.batch = 2;
        p.d.ld = 8;
        p.d.batch_stride = 90;
        let f = p.d.format;
        let elements = p.d.required_elements(p.m, p.n, p.batch) as usize;
        let mut d = vec![0u8; f.bytes_for(elements)];
        let value = |b: u64, i: u64, j: u64| (b * 100 + i * 10 + j) as f64;
        for b in 0..2 {
            for i in 0..10 {
                for j in 0..6 {
                    let at = GemmProblem::out_offset(&p.d, b, i, j) as usize;
                    f.store_code(&mut d, at, f.encode(value(b, i, j)));
                }
            }
        }
        let rows = vec![3u64, 4, 5, 17, 0];
        let plan = map_plan(&p, &rows, MAP_BYTES).unwrap();
        assert_eq!((plan.rows, plan.d, plan.d_offset), (5, MapD::Rows, 5 * 6 * 4));
        // Rows 3 and 4 are not adjacent in D (ld 8 > N 6): one copy per row.
        assert_eq!(plan.copies.len(), 5);
        let reference: Vec<f32> = (0..rows.len() * 6).map(|x| x as f32 * 0.5).collect();
        let mut region = vec![0u8; MAP_BYTES];
        fill_region(&plan, &p, &d, &reference, &mut region);
        let (prod, refs) = decode_map(&plan, &p, &rows, &region).unwrap();
        for (t, &r) in rows.iter().enumerate() {
            for j in 0..6 {
                assert_eq!(prod[t * 6 + j as usize], value(r / 10, r % 10, j));
            }
        }
        assert_eq!(refs, reference.iter().map(|&x| x as f64).collect::<Vec<_>>());
        // Packed rows taken in order are one copy.
        let packed = GemmProblem::row_major(10, 6, 8, Format::Bf16, Format::Bf16, Format::Bf16);
        let all: Vec<u64> = (0..10).collect();
        let plan = map_plan(&packed, &all, MAP_BYTES).unwrap();
        assert_eq!(plan.copies, vec![(0, plan.d_offset, 10 * 6 * 2)]);
        // A small region holds fewer rows; none at all gives no map.
        let plan = map_plan(&packed, &all, 8 + 3 * 6 * 6).unwrap();
        assert_eq!(plan.rows, 3);
        assert_eq!(map_plan(&packed, &all, 16), None);
        // Column-major D: the whole of it, decoded through its own layout.
        let mut cm = packed.clone();
        cm.d = MatrixLayout::packed(Format::F32, Order::ColMajor, 10, 6);
        let mut dcm = vec![0u8; 10 * 6 * 4];
        for i in 0..10 {
            for j in 0..6 {
                Format::F32.store_code(&mut dcm, (j * 10 + i) as usize, Format::F32.encode(value(0, i, j)));
            }
        }
        let rows = vec![9u64, 2];
        let plan = map_plan(&cm, &rows, MAP_BYTES).unwrap();
        assert_eq!((plan.d, plan.copies.len()), (MapD::Whole, 1));
        let mut region = vec![0u8; MAP_BYTES];
        fill_region(&plan, &cm, &dcm, &[0.0; 12], &mut region);
        let (prod, _) = decode_map(&plan, &cm, &rows, &region).unwrap();
        assert_eq!(prod[6 + 5], value(0, 2, 5));
        // Packed 4-bit D: no map.
        let mut p4 = packed.clone();
        p4.d = MatrixLayout::packed(Format::E2m1, Order::RowMajor, 10, 6);
        assert_eq!(map_plan(&p4, &all, MAP_BYTES), None);
    }

    /// A slot whose metrics are cosine `cos`, norm ratio 1, over 1000 pairs.
    fn slot(cos: f64) -> QsResultSlot {
        QsResultSlot {
            dot: 100.0 * cos,
            prod_sq: 100.0,
            ref_sq: 100.0,
            diff_sq: 200.0 * (1.0 - cos),
            finite: 1000,
            pairs: 1000,
            ..Default::default()
        }
    }

    #[test]
    fn assembled_slots_are_ranked_into_a_record() {
        let p = fp8(64, 96, 512);
        let all = diagnosis::alternatives(&p);
        let pick = |id: &str| all.iter().find(|(r, _)| r.id == id).unwrap().0.clone();
        let readings =
            vec![pick("declared"), pick("a-scales-ignored"), pick("a-as-e4m3fnuz"), pick("b-as-e5m2")];
        let skipped = vec![(pick("ab-scales-swapped"), "A scales read from the B scale buffer".to_string())];
        let mut a = Assembly::new(readings, skipped);
        assert!(!a.complete());
        a.accept(0, slot(0.41));
        a.accept(0, slot(0.99)); // a repeat is ignored
        a.accept(1, slot(0.999_99));
        a.accept(9, slot(1.0)); // not a reading of this diagnosis
        a.accept(2, slot(0.5));
        assert!(!a.complete());
        a.accept(3, QsResultSlot { status: abi::status::OUT_OF_BOUNDS, ..slot(1.0) });
        assert!(a.complete());
        let subject = Subject {
            site_id: 9,
            site_ordinal: 3,
            call_seq: 77,
            problem: p.clone(),
            rows: (0..64).collect(),
        };
        // Error map over the first 4 rows: row 2 is bad.
        let n = 96;
        let reference: Vec<f64> = (0..4 * n).map(|x| (x % 7) as f64 - 3.0).collect();
        let mut prod = reference.clone();
        for v in &mut prod[2 * n..3 * n] {
            *v = -*v;
        }
        let r = finish(&subject, &a, Some((prod, reference))).unwrap();
        assert_eq!((r.site_id, r.site_ordinal, r.call_seq, r.rows), (9, 3, 77, 64));
        assert_eq!(r.explanation.as_deref(), Some("a-scales-ignored"));
        assert_eq!(r.readings.len(), 3);
        assert!(r.readings.iter().any(|x| x.declared && (x.cosine - 0.41).abs() < 1e-12));
        assert!(r.skipped.iter().any(|kv| kv.value.contains("out of bounds")));
        assert!(r.skipped.iter().any(|kv| kv.value.contains("B scale buffer")));
        let map = r.error_map.unwrap();
        assert_eq!((map.rows_checked, map.bad_rows.clone()), (4, vec![2]));
        // A map of the wrong size is left out rather than trusted.
        assert!(finish(&subject, &a, Some((vec![0.0; 5], vec![0.0; 5]))).unwrap().error_map.is_none());

        // Readings never launched come back as skipped; the declared one must be evaluated.
        let mut b = Assembly::new(vec![pick("declared"), pick("a-scales-ignored")], vec![]);
        b.accept(1, slot(1.0));
        b.launched_only(1, "launch failed");
        assert!(!b.complete());
        b.accept(0, QsResultSlot { status: abi::status::BAD_DESCRIPTOR, ..slot(1.0) });
        assert!(b.complete());
        assert!(finish(&subject, &b, None).is_err());
        let (_, skipped) = b.results();
        assert!(skipped.iter().any(|(r, why)| r.id == "a-scales-ignored" && why == "launch failed"));
    }

    #[test]
    fn nonfinite_disagreement_from_the_counts() {
        let readings = vec![Reading {
            id: "declared".into(),
            kind: ReadingKind::Declared,
            description: "the declared contract".into(),
            swap_scale_buffers: false,
        }];
        let mut a = Assembly::new(readings, vec![]);
        a.accept(0, QsResultSlot { nan_prod: 3, inf_ref: 1, ..slot(1.0) });
        let (results, _) = a.results();
        assert_eq!(results[0].nonfinite_mismatch, 2);
    }
}
