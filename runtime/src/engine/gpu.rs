//! The GPU backend: checks enqueued on the caller's stream with the run-time compiled kernels,
//! results read back from the mapped ring by the poller.
//!
//! Rules (DESIGN.md "Runtime rules in someone else's process"):
//! - the caller's current context, never a new one;
//! - one pool reserved at start; per-site state (probe projections of the weight, scratch,
//!   the row epoch) is set up on the first non-capturing call of the site, never while the
//!   stream captures: a capture of a site not seen before is a counted skip;
//! - kernels are compiled on a background thread (run-time compilers only, no context) and
//!   installed by a later non-capturing call; until then calls are skipped as "warming up";
//! - per call: a few launches on the caller's stream, no allocation, no synchronisation, no
//!   event query; inside a capture the same launches are recorded and run at every replay,
//!   each replay writing a fresh ring slot (device-side ticket) and rotating the sampled rows.
//!
//! Fault injection (`gpu_inject.rs`) and diagnosis passes (`gpu_diagnose.rs`) follow the same
//! rules; their module docs give the stream order of each.

#[path = "gpu_diagnose.rs"]
mod gpu_diagnose;
#[path = "gpu_inject.rs"]
mod gpu_inject;

use super::backend::{Backend, CheckOutcome, CheckRequest, InjectRequest, Injected, Polled, PreCall};
use super::config::SketchDetach;
use super::copy_beside::{PendingCopies, PendingCopy, Settle, Span};
use crate::device::abi::{self, KernelBuild, QsGemmDesc, QsRowSel};
use crate::device::gpu::{BranchDeps, CompareRequest, DeviceBuffer, GpuChecker, SketchScratch, SketchWeight};
use crate::device::pool::DevicePool;
use crate::device::{Event, GpuRuntime, Stream};
use crate::intercept::Skip;
use crate::problem::GemmBuffers;
use crate::record::{flags, CheckMode};
use crate::sketch::{self, RowSample};
use rustc_hash::FxHashMap;
use std::collections::{HashMap, HashSet};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

#[derive(Debug, Clone)]
pub struct GpuSettings {
    pub pool_bytes: usize,
    pub ring_capacity: u32,
    /// Compile missing kernels in the calling thread (blocking it) instead of in the background.
    pub sync_compile: bool,
    /// Detached sketch checks (`QUANTSHADOW_SKETCH_DETACH`, see [`DetachedState`]).
    pub sketch_detach: SketchDetach,
    /// Graph launch selection (`QUANTSHADOW_GRAPH_SELECT`, see `engine::graph_select`).
    pub graph_select: bool,
    /// Eager checks may run off the caller's stream (`QUANTSHADOW_SIDE_STREAM` decided for the
    /// sampling rule, see `config::SideStreamUse`). Without it the backend has no side stream.
    pub side_stream: bool,
    /// Lean kernel and early starts (`QUANTSHADOW_SKETCH_LEAN`, `QUANTSHADOW_EARLY_START`).
    pub kernels: crate::device::gpu::KernelChoices,
}

/// Whether a GPU runtime library is mapped into this process.
pub fn gpu_runtime_present() -> bool {
    crate::intercept::resolve::loaded_objects().iter().any(|p| {
        let s = p.to_string_lossy();
        s.contains("libcuda.so") || s.contains("libamdhip64.so")
    })
}

fn library_loaded(fragment: &str) -> bool {
    crate::intercept::resolve::loaded_objects().iter().any(|p| p.to_string_lossy().contains(fragment))
}

/// The CUDA backends, one per device of the process (`per_device`): the current device's now,
/// the others on their first calls.
pub fn start_cuda_per_device(
    settings: &GpuSettings,
) -> Result<super::per_device::PerDevice<GpuBackend>, String> {
    if !library_loaded("libcuda.so") {
        return Err("libcuda is not loaded in this process".into());
    }
    let rt: Arc<dyn GpuRuntime> =
        Arc::new(crate::device::cuda::CudaRuntime::load().map_err(|e| e.to_string())?);
    if settings.graph_select {
        match crate::device::cuda_graph::CudaGraphDriver::load() {
            Some(d) => {
                super::graph_select::install(Arc::new(d));
            }
            None => {
                super::log::info("graph launch selection off: the driver lacks graph calls (CUDA < 12.3)")
            }
        }
    }
    per_device(rt, "cuda", settings)
}

/// The HIP backends, one per device (as [`start_cuda_per_device`]).
pub fn start_hip_per_device(
    settings: &GpuSettings,
) -> Result<super::per_device::PerDevice<GpuBackend>, String> {
    if !library_loaded("libamdhip64.so") {
        return Err("libamdhip64 is not loaded in this process".into());
    }
    let rt: Arc<dyn GpuRuntime> =
        Arc::new(crate::device::hip::HipRuntime::load().map_err(|e| e.to_string())?);
    per_device(rt, "hip", settings)
}

struct RuntimeProbe(Arc<dyn GpuRuntime>);

impl super::per_device::DeviceProbe for RuntimeProbe {
    fn current_ordinal(&self) -> Result<i32, String> {
        self.0.current_ordinal().map_err(|e| e.to_string())
    }
    fn primary_context_active(&self, device: i32) -> Option<bool> {
        self.0.primary_context_active(device)
    }
    fn is_capturing(&self, stream: u64) -> bool {
        // Unknown counts as capturing: set-up (allocations) waits for a call that is sure.
        self.0.is_capturing(Stream(stream)).unwrap_or(true)
    }
}

fn per_device(
    rt: Arc<dyn GpuRuntime>,
    name: &'static str,
    settings: &GpuSettings,
) -> Result<super::per_device::PerDevice<GpuBackend>, String> {
    let settings = settings.clone();
    let start_rt = rt.clone();
    super::per_device::PerDevice::start(
        name,
        Box::new(RuntimeProbe(rt)),
        Box::new(move |_ordinal| {
            // The calling thread's current context is the device's: set-up happens in it.
            let _relaxed = RelaxedCapture::new(start_rt.as_ref());
            GpuBackend::new(start_rt.clone(), name, &settings)
        }),
    )
}

/// This thread in relaxed capture mode until dropped (see `GpuRuntime::exchange_capture_mode`).
struct RelaxedCapture<'a> {
    runtime: &'a dyn GpuRuntime,
    previous: Option<u32>,
}

impl<'a> RelaxedCapture<'a> {
    const RELAXED: u32 = 2;

    fn new(runtime: &'a dyn GpuRuntime) -> RelaxedCapture<'a> {
        RelaxedCapture { runtime, previous: runtime.exchange_capture_mode(Self::RELAXED).ok() }
    }
}

impl Drop for RelaxedCapture<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.previous {
            let _ = self.runtime.exchange_capture_mode(p);
        }
    }
}

/// A weight's probe projections and the scratch of its checks.
struct SiteGpu {
    weight_ptr: u64,
    weight: Option<SketchWeight>,
    /// Sketch scratch and gate counters per sampled-row count ([`SketchRowState`]). Shared by
    /// the site's streams: a graph captured on its own stream must find the scratch set up by
    /// eager warm-up calls on another one. Two streams running the same site at the same moment
    /// would share it (not seen in PyTorch or vLLM, where one layer's calls are stream-ordered).
    sketch_rows: FxHashMap<u64, SketchRowState>,
    /// Per-site row epoch (device u64) of captured checks (each replay draws the next rows),
    /// and of rows/full checks: advanced by the last kernel of each check.
    epoch: DeviceBuffer,
    /// Row epoch of the site's next eager sketch check of sampled rows on its stream, counted
    /// here: the check then draws its rows without first loading a device counter, and adds
    /// nothing at its end.
    eager_epoch: u64,
    /// Rows/full: reference rows (f32) and compare scratch per (rows, logits), shared by
    /// streams like the sketch scratch.
    rows_state: FxHashMap<(u64, bool), RowsState>,
    /// Copies of C taken before calls that accumulate into it in place, per size.
    c_copies: FxHashMap<usize, DeviceBuffer>,
    /// Detached sketch checks per sampled-row count (None: such calls cannot be detached).
    detached: FxHashMap<u64, Option<DetachedState>>,
    /// (call_seq, copy) of the last C copy `before_call` took: a diagnosis of that same call
    /// reads C from it (the call overwrote C in place).
    c_saved: Option<(u64, u64)>,
    /// Streams with checks of the current projection enqueued: once replaced, it waits for
    /// events on each ([`super::retired`]). None: it is kept instead, because a check of it was
    /// captured into a graph (replays read it for as long as the graph lives) or it was used
    /// from more than [`WEIGHT_STREAMS_MAX`] streams.
    weight_streams: Option<Vec<Stream>>,
    /// The largest call sequence number of a check of this site enqueued so far. Threads take
    /// their numbers before the site's lock, so a call that re-projects may come after checks
    /// of higher numbers that still read the old projection ([`WeightChanges::projected_from`]).
    latest_call: Option<u64>,
    /// Row counts whose eager checks ran in their stream's scratch (bounded), with their
    /// check's geometry, and the scratch of the stream last used: later calls of such a count
    /// on that stream take neither a lock nor a set-up.
    shared_counts: FxHashMap<u64, crate::device::abi::SketchGeometry>,
    stream_cache: Option<(Stream, Arc<SketchScratch>)>,
    /// Gates of the row counts set up with gates only.
    gate_slabs: GateSlabs,
}

/// The warning about released kept projections is given once.
static KEPT_OVERFLOW_LOGGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// (stream, padded probes).
type StreamScratchKey = (u64, u32);

/// Row counts of a site with scratch of their own (eager checks set them up while the pool has
/// room, [`crate::device::gpu::GpuChecker::room_for_extras`]; later captures of those sizes use
/// them); eager checks of further counts use their stream's scratch. Above the ~35 row counts
/// a server's captured batch sizes come to (counts stop at the sampled rows, 256).
const ROW_STATES_PER_SITE: usize = 64;
/// Row counts a site remembers having checked in a stream's scratch, and row counts set up with
/// gates only (captured in a [`GraphScratch`]); past it, a capture of such a count is skipped
/// ([`CAPTURE_NO_ROOM_FOR_ROW_COUNT`]).
const SHARED_COUNTS_MAX: usize = 1024;
/// Streams with a scratch for eager checks of any site ([`GpuBackend::stream_scratch`]).
const STREAM_SCRATCH_MAX: usize = 64;
/// Sampled rows a stream's scratch is made for (more: the site's own scratch, or a skip).
const STREAM_SCRATCH_ROWS: u64 = 1024;
/// Capturing streams with a [`GraphScratch`] of their own (per padded probe count).
const GRAPH_SCRATCH_STREAMS: usize = 4;
/// Spare [`GraphScratch`]es kept ready (a capture cannot make one); a capture that finds none
/// has the next eager check make another, for later captures.
const GRAPH_SCRATCH_SPARES: usize = 1;

/// Scratch of captured sketch checks whose row count has no scratch of its own (set up while
/// the pool was three quarters full: a server capturing ~35 batch sizes over hundreds of sites
/// would need ~1.5 MB per site and size). The checks captured on one stream are nodes in that
/// stream's order, so they run one after another at every replay and can share one scratch,
/// which every check leaves zeroed; a graph's branches forked to other streams get another.
/// Made and zeroed outside captures (spares), handed to a capturing stream at its first such
/// check, and kept for the backend's life (graphs may replay after their stream is gone).
/// Like every captured check's own state, it assumes graphs that check on one capture stream
/// are not replayed at the same moment on two streams (PyTorch and vLLM replay in turn).
#[derive(Default)]
struct GraphScratch {
    /// Made and not yet handed out, per padded probes.
    spare: FxHashMap<u32, Vec<Arc<SketchScratch>>>,
    /// Handed out, per (capturing stream, padded probes).
    taken: FxHashMap<StreamScratchKey, Arc<SketchScratch>>,
}

impl GraphScratch {
    fn made(&self, kp: u32) -> usize {
        self.spare.get(&kp).map_or(0, Vec::len) + self.taken.keys().filter(|(_, p)| *p == kp).count()
    }
}

/// Streams a site's projection remembers its checks on ([`SiteGpu::weight_streams`]).
const WEIGHT_STREAMS_MAX: usize = 8;

/// What an on-stream or captured sketch check of one sampled-row count needs besides the weight.
struct SketchRowState {
    /// None: set up while the pool had no room for the count's own scratch. Its eager checks
    /// run in their stream's scratch and its captured ones in their capturing stream's
    /// ([`GraphScratch`]); only the gates are its own. Never replaced once captured checks may
    /// read it (their nodes hold its gates).
    scratch: Option<SketchScratch>,
    /// Launch counters (device u64 [general kernel, lean kernel]) of the device-side sampling
    /// gate, per kernel (lean or not also depends on the call's pointer alignment).
    /// `qs_gate_take` divides the counter by the grid's blocks, so every launch on one counter
    /// must have the same grid. Graphs captured at several batch sizes put checks of different
    /// row counts (different grids) on one site: one shared counter let the blocks of one launch
    /// disagree (wrong results with the general kernel, a hang at a cluster barrier with the
    /// lean one). Device address: its own buffer (`_gates`), or two counters of the site's
    /// [`GateSlabs`] for a count with gates only.
    gates: u64,
    _gates: Option<DeviceBuffer>,
}

/// Gate counters of a site's row counts set up with gates only, carved from zeroed blocks of
/// [`GATE_SLAB_BYTES`] (one allocation and one zeroing per 256 counts, not per count).
#[derive(Default)]
struct GateSlabs {
    blocks: Vec<DeviceBuffer>,
    used: usize,
}

/// A block of gate counters: 256 counts x [general, lean] u64.
const GATE_SLAB_BYTES: usize = 4096;
const GATE_BYTES: usize = 16;

impl GateSlabs {
    /// The next free pair of zeroed counters; a new block when the last is full (None: the
    /// pool has no room for one).
    fn take(&mut self, checker: &crate::device::gpu::GpuChecker) -> Option<u64> {
        let per_block = GATE_SLAB_BYTES / GATE_BYTES;
        if self.used == self.blocks.len() * per_block {
            self.blocks.push(checker.alloc_zeroed(GATE_SLAB_BYTES).ok()?);
        }
        let block = &self.blocks[self.used / per_block];
        let ptr = block.ptr + ((self.used % per_block) * GATE_BYTES) as u64;
        self.used += 1;
        Some(ptr)
    }
}

struct RowsState {
    reference: DeviceBuffer,
    compare: crate::device::gpu::CompareScratch,
    /// u64 launch counters of the reference and the compare for per-replay sampling in graphs
    /// (each kernel counts its own launches and reaches the same decision).
    gates: DeviceBuffer,
    /// Side-stream checks: copies of the call's per-call inputs and output, and the events
    /// that order them (recorded after the copies on the caller's stream; after the check on
    /// the side stream).
    side: Option<SideCheck>,
}

/// Detached sketch checks of one site and sampled-row count (`device::snapshot`): the copy
/// kernel runs on the caller's stream right after the call, the check reads only the copy.
/// - Eager calls set the state up for the site's later captures (a capture cannot allocate).
///   They are detached themselves only under `SketchDetach::On` and from
///   `EAGER_DETACH_MIN_ROWS` sampled rows; otherwise they are checked on their stream. Detached,
///   the check runs on the side stream after an
///   event, over one of the device's few shared snapshot buffers ([`EagerSnapshots`]); a call
///   finding all of them still in use by running checks is skipped (counted), never waited
///   for. Under back-to-back large GEMMs the side stream only progresses between them, so most
///   calls are skipped that way (H100, 4096 x 4096 x 4096 called back to back: 25 of 110 calls
///   checked).
/// - Captured calls (CUDA): the copy is a node on the captured stream, or, for a deferred
///   check, a branch that the next captured GEMM may run beside ([`super::copy_beside`]). Each captured call of
///   the site within one capture gets its own snapshot buffer (buffers are reused by later
///   captures: graphs launched on one stream run one after the other). The check is added
///   when the capture ends, after its last work (a stream's last checked GEMM: right after
///   its copy), or beside a far larger GEMM captured later (a vocabulary projection,
///   [`BESIDE_GEMM_FACTOR`]) ([`DeferredChecks`]), with the site's own
///   scratch: the checks of a replay then run side by side after its production kernels
///   instead of beside them (a check beside a decode GEMV slowed it by ~2.5 us on an H100). A
///   site called again in the same capture (its own scratch taken) gets a graph branch right
///   after its copy instead, over scratch shared by all sites of one shape ([`GraphChain`]),
///   so the branches of one capture that use it are chained.
///
/// Eager and captured checks have separate scratch (a side-stream check may still run when a
/// replay starts). Eager copies take their row epoch from the host's count, captured copies
/// of sampled rows from a device counter that every replay advances (a lean copy of every row
/// needs no epoch and counts nothing).
struct DetachedState {
    layout: crate::device::snapshot::SnapshotLayout,
    /// u64 row epoch counter of the copy kernel in graphs, zero at set-up.
    epoch_counter: DeviceBuffer,
    /// Row epoch of the next eager check (counted here: no device atomic per copy).
    eager_epoch: u64,
    /// Shared by every site of this shape: eager checks run one after another on the one side
    /// stream, and each leaves its scratch ready for the next. None unless eager checks are
    /// detached (`SketchDetach::On`).
    eager_scratch: Option<Arc<SketchScratch>>,
    /// Key of the shared graph scratch and its branch chain (`GpuBackend::graph_chains`).
    shape: ShapeKey,
    graph_buffers: Vec<DeviceBuffer>,
    /// Capture id the graph buffers are being handed out for, and how many so far.
    graph_capture: u64,
    graph_used: usize,
    /// This site's own check scratch for its first captured call of each capture (zeroed at
    /// set-up, left zeroed by every check), and the capture id that last took it.
    own_scratch: Option<(SketchScratch, u64)>,
}

/// Captured checks waiting for the end of their capture (`Backend::capture_ending`), or for a
/// far larger GEMM to run beside ([`LargestWeights`]), per capture id, for the latest
/// [`DEFERRED_CAPTURES`] captures. A capture whose end the shim never sees (not ended through
/// `cuStreamEndCapture`) leaves its checks here until newer captures push them out, counted as
/// skipped then.
struct DeferredChecks<T = DeferredCheck> {
    captures: Vec<(u64, Vec<T>)>,
}

impl<T> Default for DeferredChecks<T> {
    fn default() -> Self {
        DeferredChecks { captures: Vec::new() }
    }
}

const DEFERRED_CAPTURES: usize = 8;

/// A deferred check's snapshot copy, prepared, and the check itself: both wait for the copy
/// to be added to the capture ([`super::copy_beside`]).
struct CopyWork {
    copy: crate::device::gpu::SnapCopy,
    check: crate::device::gpu::PreparedLaunch<abi::QsSketchParams>,
}

/// A check deferred to its capture's end, and its snapshot copy's node when that copy is a
/// branch ([`super::copy_beside`]): the check is added after it.
struct DeferredCheck {
    launch: crate::device::gpu::PreparedLaunch<abi::QsSketchParams>,
    copy: Option<crate::device::GraphNode>,
}

impl<T> DeferredChecks<T> {
    /// Adds a check for the end of capture `id`; returns how many checks of older captures
    /// were given up to make room.
    fn push(&mut self, id: u64, check: T) -> usize {
        if let Some((_, checks)) = self.captures.iter_mut().find(|(c, _)| *c == id) {
            checks.push(check);
            return 0;
        }
        let mut given_up = 0;
        if self.captures.len() == DEFERRED_CAPTURES {
            given_up = self.captures.remove(0).1.len();
        }
        self.captures.push((id, vec![check]));
        given_up
    }

    /// The checks deferred to the end of capture `id`, removed.
    fn take(&mut self, id: u64) -> Vec<T> {
        match self.captures.iter().position(|(c, _)| *c == id) {
            Some(i) => self.captures.remove(i).1,
            None => Vec::new(),
        }
    }

    /// The checks of capture `id` that `movable` accepts, in order, removed, when there are at
    /// least `min` of them; none otherwise.
    fn take_movable(&mut self, id: u64, min: usize, movable: impl Fn(&T) -> bool) -> Vec<T> {
        let Some((_, checks)) = self.captures.iter_mut().find(|(c, _)| *c == id) else { return Vec::new() };
        if checks.iter().filter(|c| movable(c)).count() < min.max(1) {
            return Vec::new();
        }
        let (moved, stay): (Vec<T>, Vec<T>) = std::mem::take(checks).into_iter().partition(movable);
        *checks = stay;
        moved
    }
}

/// A captured GEMM whose weight has at least this many times the bytes of every earlier
/// detached-checked GEMM's weight in its capture gets the deferred checks beside it: a decode
/// step's vocabulary projection (Llama small: 65.5 MB against 5.8 MB at most before it; an 8B
/// model's: 1 GB against 117 MB, or 235 MB with a fused gate and up projection). Such a GEMV is
/// long, and the checks' blocks hide behind it instead of extending the replay after its last
/// kernel (H100, `exp88`/`exp89`: Llama small graph decode -13.6%/-12.9% -> -11.8%/-11.5%
/// tokens/s). Beside GEMMs of the usual sizes they cost more than at the end (48-GEMM stack,
/// beside every MLP projection: +13.7% instead of +9.9%), so the rule asks for a clear jump in
/// size and for [`BESIDE_MIN_CHECKS`].
const BESIDE_GEMM_FACTOR: u64 = 4;

/// Checks that must be waiting to move beside a far larger GEMM. A few moved early do not
/// shorten the end of the replay (the checks left there still take their latency) and cost
/// the GEMM they run beside: e.g. a fused QKV projection's checks before a fused gate and up
/// projection 4.7x its size, or one piecewise graph's output projection before its MLP.
const BESIDE_MIN_CHECKS: usize = 8;

/// Bytes of the largest weight among each capture's detached-checked GEMMs so far, for the
/// latest [`DEFERRED_CAPTURES`] captures. A capture's entry goes when it ends, or, when it ends
/// invalidated (its id no longer known), when a capture on the stream of its first GEMM ends:
/// while any entry is left, every checked call asks the driver whether it is captured.
#[derive(Default)]
struct LargestWeights {
    /// (capture id, stream of its first noted GEMM, largest weight bytes).
    captures: Vec<(u64, u64, u64)>,
}

impl LargestWeights {
    fn note(&mut self, id: u64, stream: u64, bytes: u64) {
        match self.captures.iter_mut().find(|(c, _, _)| *c == id) {
            Some((_, _, largest)) => *largest = (*largest).max(bytes),
            None => {
                if self.captures.len() == DEFERRED_CAPTURES {
                    self.captures.remove(0);
                }
                self.captures.push((id, stream, bytes));
            }
        }
    }

    /// Whether a GEMM with a weight of `bytes` is [`BESIDE_GEMM_FACTOR`] times larger than
    /// every earlier one of capture `id` (false for a capture's first).
    fn is_jump(&self, id: u64, bytes: u64) -> bool {
        self.captures
            .iter()
            .find(|(c, _, _)| *c == id)
            .is_some_and(|&(_, _, largest)| largest > 0 && bytes / BESIDE_GEMM_FACTOR >= largest)
    }

    /// A capture on `stream` ends: capture `id` (None: invalidated, id unknown) and any capture
    /// first noted on that stream are over (a stream captures one graph at a time).
    fn end(&mut self, id: Option<u64>, stream: u64) {
        self.captures.retain(|&(c, s, _)| Some(c) != id && s != stream);
    }

    fn is_empty(&self) -> bool {
        self.captures.is_empty()
    }
}

/// A GEMM's weight bytes for [`LargestWeights`]; None when B is batched (one B per batch item
/// is an activation, such as attention's keys, not a weight).
fn weight_bytes(p: &crate::problem::GemmProblem) -> Option<u64> {
    if p.batch > 1 && p.b.batch_stride != 0 {
        return None;
    }
    let elements = usize::try_from(p.n.saturating_mul(p.k)).unwrap_or(usize::MAX);
    Some(p.b.format.bytes_for(elements) as u64)
}

/// (sampled rows, K, N, probes): calls of this shape can share sketch scratch.
type ShapeKey = (u64, u64, u64, u32);

/// The scratch of captured detached checks of one shape, shared by its sites, and the last
/// branch of the current capture that uses it: the next branch waits for it, so the branches
/// of one graph that share the scratch run one after another. Graphs run one after the other
/// on a stream (a launch ends when all its branches have), so later captures reuse it. Two
/// graphs with calls of one shape replayed at the same moment on two streams would share it
/// (as two streams running one site always did; not seen in PyTorch or vLLM).
struct GraphChain {
    scratch: SketchScratch,
    branches: LastBranches,
}

/// (capture id, its last branch) of the latest captures: captures running at the same time on
/// two threads each chain within their own graph (a node of another graph would fail).
#[derive(Default)]
struct LastBranches {
    lasts: Vec<(u64, crate::device::GraphNode)>,
}

/// Captures [`LastBranches`] remembers.
const GRAPH_CHAIN_CAPTURES: usize = 8;

impl LastBranches {
    fn last(&self, capture: u64) -> Option<crate::device::GraphNode> {
        self.lasts.iter().find(|(id, _)| *id == capture).map(|(_, node)| *node)
    }
    fn set_last(&mut self, capture: u64, node: crate::device::GraphNode) {
        self.lasts.retain(|(id, _)| *id != capture);
        if self.lasts.len() == GRAPH_CHAIN_CAPTURES {
            self.lasts.remove(0);
        }
        self.lasts.push((capture, node));
    }
}

/// The snapshot buffers of eager detached checks, shared by all sites of the device: a
/// snapshot is needed only until its check has run on the side stream, so a handful serve any
/// number of sites (per-site pairs took 8-18 MB per Llama-8B-shaped site at 256 rows and ran
/// the default pool out after ~20 sites, whose later calls were then skipped).
#[derive(Default)]
struct EagerSnapshots {
    slots: Vec<EagerSnapshot>,
    /// Hand-outs so far (`EagerSnapshot::turn` orders the slots by their last one).
    handed: u64,
}

struct EagerSnapshot {
    /// Grown (re-taken from the pool) when a call needs more than it holds.
    buffer: Option<DeviceBuffer>,
    /// Recorded on the caller's stream after the copy; the side stream waits for it.
    copied: Event,
    /// Recorded on the side stream after the check.
    done: Event,
    pending: bool,
    /// Work on it was enqueued whose end no event marks (a failed record): never handed out
    /// again, since a later user could overwrite what that work still reads.
    lost: bool,
    /// When it was last handed out (`EagerSnapshots::handed`).
    turn: u64,
}

/// The caller streams whose events the side stream's work waits for. A split check makes its
/// caller's stream wait for a finishing on the side stream (`take_in_turn`); the side stream
/// runs in order, so that finishing may sit behind work waiting for another caller stream's
/// progress, a dependency the host never made (two streams that wait on each other through
/// memory, as spinning communication kernels do, would then deadlock). So split checks run
/// only while every wait on the side stream is for one caller stream, theirs; once the side
/// stream has waited for two, eager checks stay fused on their stream.
#[derive(Debug, Default)]
struct SideWaits {
    /// The one caller stream so far.
    stream: Option<Stream>,
    /// Two or more (or a per-thread default stream, which is a different stream per thread).
    mixed: bool,
}

/// `CU_STREAM_PER_THREAD` / `hipStreamPerThread`: one handle, a different stream per thread.
const PER_THREAD_STREAM: Stream = Stream(0x2);

impl SideWaits {
    /// Whether the side stream waits, and would wait, for `stream` alone.
    fn alone(&self, stream: Stream) -> bool {
        !self.mixed && stream != PER_THREAD_STREAM && self.stream.is_none_or(|s| s == stream)
    }

    /// Notes that side-stream work now waits for `stream`.
    fn side_waits_for(&mut self, stream: Stream) {
        self.mixed = !self.alone(stream);
        self.stream.get_or_insert(stream);
    }

    /// Whether `stream` may wait for side-stream work: while the side stream waits for no
    /// other caller stream. Notes `stream` then (its split finishing will wait for it); a
    /// refused stream puts nothing on the side stream and is not noted.
    fn may_wait_on_side(&mut self, stream: Stream) -> bool {
        let alone = self.alone(stream);
        if alone {
            self.side_waits_for(stream);
        }
        alone
    }
}

impl EagerSnapshots {
    /// A free snapshot of at least `bytes`: a used one whose check has finished, else a new one
    /// while there are fewer than `EAGER_SNAPSHOTS`; None when all are still in use. Errors:
    /// the pool cannot hold the buffer, or an event cannot be created.
    fn take(
        &mut self,
        runtime: &dyn GpuRuntime,
        checker: &GpuChecker,
        bytes: u64,
    ) -> Result<Option<&mut EagerSnapshot>, crate::device::DeviceError> {
        let free = self
            .slots
            .iter_mut()
            .position(|s| !s.lost && (!s.pending || runtime.event_done(s.done).unwrap_or(false)));
        let i = match free {
            Some(i) => i,
            None if self.slots.len() < EAGER_SNAPSHOTS => self.push_slot(runtime)?,
            None => return Ok(None),
        };
        self.slots[i].pending = false;
        self.prepare(i, checker, bytes, false)
    }

    /// A new slot, without a buffer yet; its index.
    fn push_slot(&mut self, runtime: &dyn GpuRuntime) -> Result<usize, crate::device::DeviceError> {
        self.slots.push(EagerSnapshot {
            buffer: None,
            copied: runtime.create_sync_event()?,
            done: runtime.create_sync_event()?,
            pending: false,
            lost: false,
            turn: 0,
        });
        Ok(self.slots.len() - 1)
    }

    /// For the split checks: slots are handed out in turn, so that one is never refused while
    /// the host runs ahead of the GPU (with `take`, a host 8 calls ahead found every slot's
    /// finishing still queued and fell back to the fused check). A new slot while there are
    /// fewer than `most`; then the one handed out longest ago, at once if its last finishing is
    /// known done, else after `stream` is made to wait for that finishing's `done` event
    /// (enqueued `most` checks earlier, it has almost always run by then; the host never
    /// waits). Lost slots are passed over. None: every slot is lost, or the oldest one's buffer
    /// is too small (growing it would free memory its work may still read; callers ask for the
    /// largest size they will need). One event query per call at most. Errors: an event cannot be created or
    /// waited for (the slot is left as it was), the pool cannot hold the buffer.
    fn take_in_turn(
        &mut self,
        runtime: &dyn GpuRuntime,
        checker: &GpuChecker,
        bytes: u64,
        most: usize,
        stream: Stream,
    ) -> Result<Option<&mut EagerSnapshot>, crate::device::DeviceError> {
        let i = if self.slots.len() < most {
            self.push_slot(runtime)?
        } else {
            let in_use = self.slots.iter().enumerate().filter(|(_, s)| !s.lost);
            let Some((i, oldest)) = in_use.min_by_key(|(_, s)| s.turn) else {
                return Ok(None);
            };
            // Without a buffer (its allocation failed), nothing reads it: one is allocated.
            if oldest.buffer.as_ref().is_some_and(|b| (b.bytes as u64) < bytes) {
                return Ok(None);
            }
            if oldest.pending && !runtime.event_done(oldest.done).unwrap_or(false) {
                runtime.wait_event(stream, oldest.done)?;
            }
            i
        };
        // `pending` stays as it was until the caller enqueues its own finishing and records
        // `done` again: if it enqueues nothing after all, the last finishing's `done` keeps
        // guarding the buffer for whoever takes it next, on whatever stream.
        self.prepare(i, checker, bytes, true)
    }

    /// Slot `i` handed out now, with a buffer of at least `bytes` (`zeroed`: a buffer allocated
    /// here is zeroed, as split buffers must be: their kernels leave them zero). `pending` is
    /// the caller's to set.
    fn prepare(
        &mut self,
        i: usize,
        checker: &GpuChecker,
        bytes: u64,
        zeroed: bool,
    ) -> Result<Option<&mut EagerSnapshot>, crate::device::DeviceError> {
        self.handed += 1;
        let snap = &mut self.slots[i];
        snap.turn = self.handed;
        if snap.buffer.as_ref().is_none_or(|b| (b.bytes as u64) < bytes) {
            snap.buffer = None; // back to the pool first, so growing can reuse its space
            snap.buffer = Some(if zeroed {
                checker.alloc_zeroed(bytes as usize)?
            } else {
                checker.alloc(bytes as usize)?
            });
        }
        Ok(Some(snap))
    }
}

/// What [`GpuBackend::sketch_detached`] did with a call.
enum Detach {
    Done,
    Skip(Skip),
    OnStream,
}

/// Snapshot buffers of one size (device bytes) at most: a call needing more is checked on its
/// own stream as before (LM heads at M >= 256: 65 MB of D rows).
const SNAPSHOT_MAX_BYTES: u64 = 32 << 20;
/// Eager calls with fewer sampled rows are checked on their stream (see `sketch_detached`).
const EAGER_DETACH_MIN_ROWS: u64 = 64;
/// Captured checks of at most this many sampled rows get a scratch of their own (deferred to
/// the capture's end); more share their shape's chain.
const OWN_SCRATCH_MAX_ROWS: u64 = 64;
/// Skip reason of a captured check deferred to a capture end that was never seen.
const NEVER_ADDED: &str = "graph capture: check deferred to the capture's end never added (end not seen)";
/// Skip reason of a pending snapshot copy dropped with its check: its capture ended or was
/// invalidated before the copy was settled, or it was pushed out by 64 newer ones of another
/// capture (see `PendingCopy::settles_in`).
const COPY_DROPPED: &str =
    "graph capture: pending snapshot copy dropped with its check (its capture ended unseen, or too many pending)";

// A captured call whose device state would need allocations, memsets or a weight projection
// first is skipped: a capture can do none of them. Each cause has its own reason, so that the
// report says what to warm up before capturing.
/// The site's first call is inside a capture: a weight seen only there, or a B operand that is
/// an activation (a new temporary every capture; Llama's rotary outer product is one).
const CAPTURE_NEW_SITE: &str =
    "graph capture: site first seen inside a capture (its B operand, e.g. an activation, was never seen outside one)";
/// The site's W_R is missing or was projected from another B.
const CAPTURE_STALE_WEIGHT: &str =
    "graph capture: the site's weight projection is missing or stale (B new or changed since its last call outside a capture)";
/// The site was seen outside captures, but not with this number of sampled rows (batch size).
const CAPTURE_NEW_ROW_COUNT: &str =
    "graph capture: this row count of the site was never seen outside a capture (run that batch size once first)";
/// A captured call of a row count whose eager calls ran in their stream's scratch.
const CAPTURE_NO_ROOM_FOR_ROW_COUNT: &str = "graph capture: this row count ran eagerly in its stream's scratch, and the device pool had no room for the gates and shared scratch its captures need";
/// A call made in a context the backend's handles do not belong to ([`GpuBackend::same_device`]).
const OTHER_CONTEXT: &str = "call in another context than the one the device's checks were set up in";
/// A captured check of a count with gates only, where no [`GraphScratch`] could be handed out.
const CAPTURE_NO_GRAPH_SCRATCH: &str = "graph capture: no shared check scratch for this capturing stream (four capturing streams have one, or none was spare yet), or more sampled rows than it holds";
const CAPTURE_PER_THREAD_STREAM: &str =
    "graph capture on a per-thread default stream: no shared check scratch there (one handle for every thread)";
/// In-place calls (D aliases C): no copy buffer of this size yet.
const CAPTURE_NEW_C_COPY: &str = "graph capture: no in-place C copy of this size set up outside a capture";
/// Eager snapshot buffers per device (all sites share them).
const EAGER_SNAPSHOTS: usize = 4;
/// Split check buffers per device (all sites share them; ~0.5 MB each at 256 rows, k = 32, the most).
/// More than snapshots: the finishing runs on the low-priority side stream, behind the GEMMs.
const SPLIT_BUFFERS: usize = 8;

struct SideCheck {
    /// Copies of A, D, A's scales and C, each with its size (reallocated when a call needs more).
    copies: [Option<DeviceBuffer>; 6],
    /// Copies of the call's device-pointer scalars (alpha, A's and B's tensor scales, beta,
    /// d_scale; 8 bytes each): `_scaled_mm`'s activation scale is a 4-byte tensor the caching
    /// allocator hands to the next layer long before a low-priority reference reads it.
    scalars: Option<DeviceBuffer>,
    inputs_ready: Event,
    done: Event,
    /// A check was enqueued and `done` recorded after it.
    pending: bool,
    /// A check was enqueued but `done` could not be recorded after it: the copies are never
    /// reused (calls of this site skip the side stream's check from then on, counted).
    lost: bool,
}

/// Finished compiles: the device image, or why it failed.
type CompiledImages = Arc<Mutex<HashMap<KernelBuild, Result<Vec<u8>, String>>>>;

struct Compiler {
    requests: Mutex<mpsc::Sender<KernelBuild>>,
    pending: Mutex<HashSet<KernelBuild>>,
    ready: CompiledImages,
}

pub struct GpuBackend {
    name: &'static str,
    runtime: Arc<dyn GpuRuntime>,
    /// The context current when the backend started (its kernels, pool and streams live there).
    context: Option<u64>,
    /// Whether that context is its device's primary context.
    primary: Option<bool>,
    checker: Arc<GpuChecker>,
    sites: Mutex<FxHashMap<u64, SiteGpu>>,
    /// site_id -> ordinal, for tagging results.
    ordinals: Mutex<FxHashMap<u64, u32>>,
    /// site_id -> what sketch results said of B changing under its projection (the poller
    /// notes it, the next call of the site re-projects; from WEIGHT_CHANGES_FOR_ROWS distinct
    /// changes on, rows mode).
    weight_changes: Mutex<FxHashMap<u64, WeightChanges>>,
    compiler: Compiler,
    sync_compile: bool,
    /// Low-priority stream for rows/full references outside graph captures.
    side_stream: Option<Stream>,
    /// Whose events the side stream's work waits for (see [`SideWaits`]).
    side_waits: Mutex<SideWaits>,
    /// Saved copies of the caller's buffers for fault injection.
    inject: Mutex<gpu_inject::InjectState>,
    /// Diagnosis passes running.
    diagnoses: gpu_diagnose::Diagnoses,
    sketch_detach: SketchDetach,
    /// Pool bytes held by snapshot buffers of captured checks (bounded: a quarter of the pool).
    graph_snapshot_bytes: std::sync::atomic::AtomicU64,
    /// Snapshot buffers of eager detached checks (taken under the sites lock).
    eager_snapshots: Mutex<EagerSnapshots>,
    /// Buffers of split checks, the same way (`qs_sketch_proj` writes one on the caller's
    /// stream, `qs_sketch_fin` reads it on the side stream).
    split_buffers: Mutex<EagerSnapshots>,
    /// Scratch of eager detached checks per shape, shared by its sites.
    eager_scratch: Mutex<FxHashMap<ShapeKey, Arc<SketchScratch>>>,
    /// Scratch of eager checks on their caller's stream that have none of their own (past a
    /// site's first [`ROW_STATES_PER_SITE`] row counts, or with the pool near full), per
    /// (stream, padded probes): one stream's checks run one after another, so any site and row
    /// count can use it. A destroyed stream's goes back to the pool behind its last check.
    stream_scratch: Mutex<FxHashMap<StreamScratchKey, Arc<SketchScratch>>>,
    /// Scratch of captured checks of row counts set up without their own ([`GraphScratch`]).
    graph_scratch: Mutex<GraphScratch>,
    /// A capture found no spare [`GraphScratch`]: the next eager sketch check makes one (a
    /// relaxed load per eager check).
    graph_scratch_missed: std::sync::atomic::AtomicBool,
    /// Scratch and branch chain of captured detached checks per shape (taken under the sites
    /// lock).
    graph_chains: Mutex<HashMap<ShapeKey, GraphChain>>,
    /// Captured checks waiting for their capture's end.
    deferred: Mutex<DeferredChecks>,
    /// Per capture, the largest weight checked so far (the checks-beside rule).
    largest_weights: Mutex<LargestWeights>,
    /// Projections replaced while earlier checks may still read them.
    retired: Mutex<super::retired::Retired<SketchWeight, Event>>,
    /// Snapshot copies of deferred checks not yet ordered before later captured work.
    copies: Mutex<PendingCopies<CopyWork>>,
    pool_bytes: u64,
}

/// Why a program cannot be used yet.
enum ProgramWait {
    /// Compiling, or compiled and waiting for a call outside a capture to load it.
    NotReady(Skip),
    /// Its compile or load failed (for good).
    Failed(Skip),
}

impl ProgramWait {
    fn skip(self) -> Skip {
        match self {
            ProgramWait::NotReady(s) | ProgramWait::Failed(s) => s,
        }
    }
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl GpuBackend {
    pub fn new(
        runtime: Arc<dyn GpuRuntime>,
        name: &'static str,
        s: &GpuSettings,
    ) -> Result<GpuBackend, String> {
        let checker = GpuChecker::new(runtime.clone(), s.ring_capacity).map_err(err)?;
        checker.apply(s.kernels);
        let pool = DevicePool::reserve(runtime.clone(), s.pool_bytes).map_err(err)?;
        let checker = Arc::new(checker.with_pool(pool));
        let (tx, rx) = mpsc::channel::<KernelBuild>();
        let ready: CompiledImages = Arc::default();
        {
            let (checker, runtime, ready) = (checker.clone(), runtime.clone(), ready.clone());
            std::thread::Builder::new()
                .name("quantshadow-nvrtc".into())
                .spawn(move || {
                    for build in rx {
                        let image = checker.registry().image(runtime.as_ref(), &build).map_err(err);
                        if let Err(e) = &image {
                            super::log::error(&format!("kernel compile failed: {e}"));
                        }
                        ready.lock().unwrap_or_else(|e| e.into_inner()).insert(build, image);
                    }
                })
                .map_err(err)?;
        }
        super::log::info(&format!(
            "{name} backend on {} ({}, {}), pool {} MiB",
            checker.info.name,
            checker.info.arch,
            checker.registry().compiler(),
            s.pool_bytes >> 20
        ));
        let side_stream = if !s.side_stream {
            super::log::info(
                "side stream not used (QUANTSHADOW_SIDE_STREAM, sampling rule): every check runs on its caller's stream",
            );
            None
        } else {
            match runtime.create_side_stream() {
                Ok(st) => Some(st),
                Err(e) => {
                    super::log::warn(&format!(
                        "no side stream ({e}); rows/full checks run on the caller's stream"
                    ));
                    None
                }
            }
        };
        Ok(GpuBackend {
            name,
            context: runtime.current_context(),
            primary: runtime.current_context_is_primary(),
            runtime,
            checker,
            sites: Mutex::new(FxHashMap::default()),
            ordinals: Mutex::new(FxHashMap::default()),
            weight_changes: Mutex::new(FxHashMap::default()),
            compiler: Compiler { requests: Mutex::new(tx), pending: Mutex::new(HashSet::new()), ready },
            sync_compile: s.sync_compile,
            side_stream,
            side_waits: Mutex::default(),
            inject: Mutex::new(gpu_inject::InjectState::default()),
            diagnoses: gpu_diagnose::Diagnoses::default(),
            sketch_detach: s.sketch_detach,
            graph_snapshot_bytes: std::sync::atomic::AtomicU64::new(0),
            eager_snapshots: Mutex::default(),
            split_buffers: Mutex::default(),
            eager_scratch: Mutex::default(),
            stream_scratch: Mutex::default(),
            graph_scratch: Mutex::default(),
            graph_scratch_missed: std::sync::atomic::AtomicBool::new(false),
            graph_chains: Mutex::default(),
            deferred: Mutex::default(),
            largest_weights: Mutex::default(),
            retired: Mutex::default(),
            copies: Mutex::default(),
            pool_bytes: s.pool_bytes as u64,
        })
    }

    /// Ok when `build` is loaded; otherwise starts (or installs) it and says to skip this call.
    fn ensure_program(&self, build: &KernelBuild, capturing: bool) -> Result<(), Skip> {
        self.program_ready(build, capturing).map_err(ProgramWait::skip)
    }

    /// [`Self::ensure_program`], telling a program still on its way from one that failed.
    fn program_ready(&self, build: &KernelBuild, capturing: bool) -> Result<(), ProgramWait> {
        if self.checker.registry().loaded(build).is_some() {
            return Ok(());
        }
        if self.sync_compile && !capturing {
            let ready = || self.compiler.ready.lock().unwrap_or_else(|e| e.into_inner());
            let failed =
                |e: &str| ProgramWait::Failed(Skip::new(format!("kernel compile failed: {}", short(e))));
            if let Some(Err(e)) = ready().get(build) {
                // Failed before: compiling again would cost seconds on every call, for the same error.
                return Err(failed(e));
            }
            return self.checker.program(build).map(|_| ()).map_err(|e| {
                let e = e.to_string();
                ready().insert(build.clone(), Err(e.clone()));
                failed(&e)
            });
        }
        let done = self.compiler.ready.lock().unwrap_or_else(|e| e.into_inner()).remove(build);
        match done {
            Some(Ok(image)) if !capturing => {
                self.checker.registry().install(self.runtime.as_ref(), build, &image).map_err(|e| {
                    // Kept as the build's outcome: the image has left `ready` and the build
                    // stays in `pending`, so without it every later call would skip as still
                    // compiling, for good.
                    let e = format!("kernel load failed: {}", short(&e.to_string()));
                    self.compiler
                        .ready
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(build.clone(), Err(e.clone()));
                    ProgramWait::Failed(Skip::new(e))
                })?;
                Ok(())
            }
            Some(Ok(image)) => {
                // Module loads wait for a call outside the capture.
                self.compiler
                    .ready
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(build.clone(), Ok(image));
                Err(ProgramWait::NotReady(Skip::new("graph capture: kernels not loaded before the capture")))
            }
            Some(Err(e)) => {
                // Keep the failure: every later call of this build skips with it.
                self.compiler
                    .ready
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(build.clone(), Err(e.clone()));
                Err(ProgramWait::Failed(Skip::new("kernel compile failed")))
            }
            None => {
                let mut pending = self.compiler.pending.lock().unwrap_or_else(|e| e.into_inner());
                if pending.insert(build.clone()) {
                    let _ =
                        self.compiler.requests.lock().unwrap_or_else(|e| e.into_inner()).send(build.clone());
                }
                Err(ProgramWait::NotReady(Skip::new("warming up: kernels compiling")))
            }
        }
    }

    /// The site's device state, created on its first non-capturing call.
    fn site_state<'a>(
        &self,
        sites: &'a mut FxHashMap<u64, SiteGpu>,
        req: &CheckRequest,
        capturing: bool,
    ) -> Result<&'a mut SiteGpu, Skip> {
        #[allow(clippy::map_entry)] // the set-up may bail out before inserting
        if !sites.contains_key(&req.site_id) {
            if capturing {
                // Which call: a GEMM whose B is an activation has a new site in every capture.
                if super::log::enabled(super::config::LogLevel::Debug) {
                    let p = &req.call.problem;
                    super::log::debug(&format!(
                        "graph capture: site {} ({}, {}x{}x{} {}/{}, batch {}) not set up before the capture",
                        req.site_ordinal,
                        req.call.entry,
                        p.m,
                        p.n,
                        p.k,
                        p.a.format.name(),
                        p.b.format.name(),
                        p.batch
                    ));
                }
                return Err(Skip::new(CAPTURE_NEW_SITE));
            }
            // The row epoch (u64).
            let epoch = self.checker.alloc_zeroed(8).map_err(|e| Skip::new(pool_reason(&e)))?;
            // The poller tags results with the ordinal of their site.
            self.ordinals.lock().unwrap_or_else(|e| e.into_inner()).insert(req.site_id, req.site_ordinal);
            sites.insert(
                req.site_id,
                SiteGpu {
                    weight_ptr: req.call.buffers.b,
                    weight: None,
                    sketch_rows: FxHashMap::default(),
                    gate_slabs: GateSlabs::default(),
                    epoch,
                    eager_epoch: 0,
                    rows_state: FxHashMap::default(),
                    detached: FxHashMap::default(),
                    c_copies: FxHashMap::default(),
                    c_saved: None,
                    weight_streams: Some(Vec::new()),
                    latest_call: None,
                    shared_counts: Default::default(),
                    stream_cache: None,
                },
            );
        }
        Ok(sites.get_mut(&req.site_id).expect("inserted above"))
    }

    /// The backend's kernels, pool and ring belong to the context current when it started.
    /// `per_device` routes each call by its device's ordinal; this guard keeps a call from
    /// another device, or from another context of the same device (a host with contexts of its
    /// own), from launching foreign handles: it passes through, counted. Foreign handles in a
    /// capturing stream would invalidate the host's capture.
    fn same_device(&self) -> Result<(), Skip> {
        if let Some(ours) = self.context {
            // A context belongs to one device: the same context is the same device, and this
            // is one driver call (no ordinal query).
            return match self.runtime.current_context() {
                Some(current) if current == ours => Ok(()),
                Some(_) => Err(Skip::new(OTHER_CONTEXT)),
                None => Err(Skip::new("no current context")),
            };
        }
        match self.runtime.current_ordinal() {
            Ok(o) if o == self.checker.info.ordinal => Ok(()),
            Ok(_) => Err(Skip::new("call on another device than the backend's")),
            Err(e) => Err(Skip::new(format!("current device: {}", short(&e.to_string())))),
        }
    }

    fn ordinal_of(&self, site_id: u64) -> u32 {
        self.ordinals.lock().unwrap_or_else(|e| e.into_inner()).get(&site_id).copied().unwrap_or(u32::MAX)
    }

    fn sketch(
        &self,
        req: &CheckRequest,
        g: &QsGemmDesc,
        buffers: &GemmBuffers,
        stream: Stream,
        capturing: bool,
    ) -> Result<(), Skip> {
        let p = &req.call.problem;
        let (a, b, d) = (p.a.format, p.b.format, p.d.format);
        if !p.epilogue.is_linear() {
            // A projection cannot see through ReLU/GELU: check a row sample exactly instead.
            let rows = CheckRequest { mode: CheckMode::Rows, ..req.clone() };
            return self.rows_or_full(&rows, g, buffers, stream, capturing);
        }
        let changes =
            self.weight_changes.lock().unwrap_or_else(|e| e.into_inner()).get(&req.site_id).copied();
        if changes.is_some_and(|c| c.distinct >= WEIGHT_CHANGES_FOR_ROWS) {
            // B keeps changing under the same pointer: not a static weight (an activation in
            // the B slot, recycled memory). A per-weight projection cannot serve it; check a row
            // sample exactly instead.
            let rows = CheckRequest { mode: CheckMode::Rows, ..req.clone() };
            return self.rows_or_full(&rows, g, buffers, stream, capturing);
        }
        let kp = abi::padded_probes(req.sketch.probes).map_err(|e| Skip::new(format!("sketch: {e}")))?;
        let entries = match self.checker.loaded_sketch_entries(a, b, d, kp) {
            Some(entries) => entries,
            None => {
                // Until the program is loaded: compiled in the background, or here in sync mode.
                let build =
                    KernelBuild::sketch_kp(a, b, d, kp).map_err(|e| Skip::new(format!("sketch: {e}")))?;
                self.ensure_program(&build, capturing)?;
                self.checker
                    .sketch_entries(a, b, d, kp)
                    .map_err(|e| Skip::new(format!("sketch: {}", short(&e.to_string()))))?
            }
        };
        let total_rows = g.total_rows();
        let sample = RowSample::new(req.sketch.seed, total_rows, req.sketch.rows_per_call);
        if !capturing && self.graph_scratch_missed.load(std::sync::atomic::Ordering::Relaxed) {
            self.top_up_graph_scratch(req.sketch.probes, req.sketch.rows_per_call);
        }
        let mut sites = self.sites.lock().unwrap_or_else(|e| e.into_inner());
        let site = self.site_state(&mut sites, req, capturing)?;
        let changed = changes.is_some_and(|c| c.pending);
        // W_R projected by this call is written just ahead of the check on the stream: the
        // check then keeps the ordinary launch (an early start reads W_R before its wait).
        let mut projected_now = false;
        if changed || site.weight.is_none() || site.weight_ptr != req.call.buffers.b {
            if capturing {
                return Err(Skip::new(CAPTURE_STALE_WEIGHT));
            }
            // A projection being replaced may still be read by earlier checks: it waits for them.
            let retiring = site.weight.is_some();
            if retiring && site.weight_streams.is_some() && !self.retired_room() {
                return Err(Skip::new("sketch: replaced projections are still in use by earlier checks"));
            }
            let w = self
                .checker
                .sketch_weight_on(g, a, d, req.sketch.seed, req.sketch.probes, stream)
                .map_err(|e| Skip::new(format!("sketch set-up: {}", pool_reason(&e))))?;
            // Checks from this call on use the new projection; reports of the change from
            // checks of the old one are the change just handled. Checks of higher numbers
            // already enqueued (other threads) read the old one: their reports are too.
            if let Some(c) =
                self.weight_changes.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&req.site_id)
            {
                c.pending = false;
                c.projected_from = projected_from(req.call_seq, site.latest_call);
            }
            if let Some(old) = site.weight.replace(w) {
                self.retire_weight(old, stream, site.weight_streams.take());
            }
            site.weight_streams = Some(Vec::new());
            site.weight_ptr = req.call.buffers.b;
            projected_now = true;
        }
        site.latest_call = Some(site.latest_call.map_or(req.call_seq, |l| l.max(req.call_seq)));
        // This call's check (whatever path it takes) reads the projection from `stream`, or
        // from every replay of the graph being captured.
        if capturing {
            site.weight_streams = None;
        } else if let Some(streams) = site.weight_streams.as_mut() {
            if !streams.contains(&stream) {
                if streams.len() == WEIGHT_STREAMS_MAX {
                    site.weight_streams = None;
                } else {
                    streams.push(stream);
                }
            }
        }
        // Under `graphs` an eager call still sets detached checks up (outside any capture) for
        // the site's later captured calls, and is then checked on its stream.
        if self.sketch_detach != SketchDetach::Off && !self.weights_rewritten(req.site_id) {
            let weight = site.weight.as_ref().expect("set above");
            match self.sketch_detached(req, g, &sample, weight, &mut site.detached, stream, capturing) {
                Detach::Done => return Ok(()),
                Detach::Skip(s) => return Err(s),
                Detach::OnStream => {}
            }
        }
        if !capturing && req.device_gate.is_none() {
            match self.sketch_split(req, g, entries, &sample, site, stream) {
                Detach::Done => return Ok(()),
                Detach::Skip(s) => return Err(s),
                Detach::OnStream => {}
            }
        }
        let key = sample.count;
        // An eager check without a device gate needs no state of its own row count: beyond the
        // site's first few (which later captures of those sizes use), or where the pool holds
        // no more, it runs in its stream's scratch (a server's changing batch sizes would
        // otherwise set up ~1.5 MB per site and size, and soon find the pool full).
        let plain_eager = !capturing && req.device_gate.is_none();
        let mut in_stream = None;
        let own_state = site.sketch_rows.get(&key).is_some_and(|s| s.scratch.is_some());
        if plain_eager && !own_state {
            // A row count already checked in this stream's scratch: no set-up, no lock.
            if let (Some(geometry), Some((s, scratch))) = (site.shared_counts.get(&key), &site.stream_cache) {
                if *s == stream {
                    in_stream = Some((scratch.clone(), *geometry));
                }
            }
        }
        if in_stream.is_none() && !own_state {
            if capturing {
                if site.sketch_rows.contains_key(&key) {
                    return self.sketch_captured_shared(req, g, entries, &sample, site, stream);
                }
                return Err(Skip::new(match site.shared_counts.contains_key(&key) {
                    true => CAPTURE_NO_ROOM_FOR_ROW_COUNT,
                    false => CAPTURE_NEW_ROW_COUNT,
                }));
            }
            let set_up = || -> Result<SketchRowState, crate::device::DeviceError> {
                let scratch =
                    self.checker.sketch_scratch(sample.count, g.k, g.n, req.sketch.probes, false)?;
                let gates = self.checker.alloc_zeroed(GATE_BYTES)?;
                Ok(SketchRowState { scratch: Some(scratch), gates: gates.ptr, _gates: Some(gates) })
            };
            // A count set up with gates only keeps them (graphs may hold them): no own scratch.
            let gates_only = site.sketch_rows.contains_key(&key);
            let roomy = !gates_only
                && site.sketch_rows.values().filter(|s| s.scratch.is_some()).count() < ROW_STATES_PER_SITE
                && self.checker.room_for_extras();
            let shared = match plain_eager && !roomy {
                true => self.stream_scratch(stream, g, req, &sample).ok(),
                false => None,
            };
            match shared {
                Some(s) => in_stream = Some(s),
                // No stream scratch here (a per-thread default stream, too many streams): the
                // count gets scratch of its own, and keeps the gates its graphs hold.
                None if gates_only => {
                    match self.checker.sketch_scratch(sample.count, g.k, g.n, req.sketch.probes, false) {
                        Ok(scratch) => {
                            site.sketch_rows.get_mut(&key).expect("gates only").scratch = Some(scratch)
                        }
                        Err(e) => return Err(Skip::new(format!("sketch set-up: {}", pool_reason(&e)))),
                    }
                }
                None => match set_up() {
                    Ok(state) => {
                        site.sketch_rows.insert(key, state);
                    }
                    Err(e) => match plain_eager.then(|| self.stream_scratch(stream, g, req, &sample)) {
                        Some(Ok(s)) => in_stream = Some(s),
                        _ => return Err(Skip::new(format!("sketch set-up: {}", pool_reason(&e)))),
                    },
                },
            }
            if in_stream.is_some() && !gates_only && site.sketch_rows.len() < SHARED_COUNTS_MAX {
                // Later captures of this count: its gates, and a capturing stream's scratch.
                if self.top_up_graph_scratch(req.sketch.probes, req.sketch.rows_per_call) {
                    if let Some(gates) = site.gate_slabs.take(&self.checker) {
                        site.sketch_rows.insert(key, SketchRowState { scratch: None, gates, _gates: None });
                    }
                }
            }
            if let Some((scratch, geometry)) = &in_stream {
                if site.shared_counts.len() < SHARED_COUNTS_MAX {
                    site.shared_counts.insert(key, *geometry);
                }
                site.stream_cache = Some((stream, scratch.clone()));
            }
        }
        let weight = site.weight.as_ref().expect("set above");
        if let Some((scratch, geometry)) = &in_stream {
            let rows = eager_rows(&sample, &mut site.eager_epoch);
            let tag = (req.site_id, req.call_seq);
            let mut prepared = self
                .checker
                .prepare_sketch_check_in(entries, g, rows, weight, scratch, geometry, tag, false)
                .map_err(|e| Skip::new(format!("sketch: {}", short(&e.to_string()))))?;
            // An early start could overlap the stream's previous check, which used this scratch.
            prepared.early_start = false;
            self.checker
                .launch_prepared(&prepared, stream)
                .map_err(|e| Skip::new(format!("sketch launch: {}", short(&e.to_string()))))?;
            return Ok(());
        }
        let SketchRowState { scratch, gates, .. } = &site.sketch_rows[&key];
        let scratch = scratch.as_ref().expect("a count's own state (checked above)");
        let rows = if capturing || req.device_gate.is_some() {
            // Each replay draws new rows; a gated check advances the count only when it runs.
            QsRowSel::sample(&sample, site.epoch.ptr, 0, true)
        } else {
            eager_rows(&sample, &mut site.eager_epoch)
        };
        let mut prepared = self
            .checker
            .prepare_sketch_check_with(
                entries,
                g,
                rows,
                weight,
                scratch,
                (req.site_id, req.call_seq),
                capturing,
            )
            .map_err(|e| Skip::new(format!("sketch: {}", short(&e.to_string()))))?;
        // A gated check (captured only) may end without waiting for the GEMM: never early.
        prepared.early_start &= !projected_now && req.device_gate.is_none();
        set_sketch_gate(&mut prepared, *gates, req.device_gate);
        self.checker
            .launch_prepared(&prepared, stream)
            .map_err(|e| Skip::new(format!("sketch launch: {}", short(&e.to_string()))))?;
        self.note_check_node(req, stream, Some(gate_field!(abi::QsSketchParams)));
        Ok(())
    }

    /// The geometry of a check of `sample`'s rows in a shared scratch: the one its own scratch
    /// would have, so a count's launches keep one grid (its gate counters count by the grid).
    fn shared_check_geometry(
        &self,
        g: &QsGemmDesc,
        req: &CheckRequest,
        sample: &RowSample,
    ) -> Result<crate::device::abi::SketchGeometry, Skip> {
        let info = &self.checker.info;
        crate::device::abi::SketchGeometry::new(
            sample.count,
            g.k,
            g.n,
            req.sketch.probes,
            info.multiprocessors,
            info.warp_size,
        )
        .map_err(|e| Skip::new(format!("sketch: {e}")))
    }

    /// A captured check of a row count set up with gates only ([`SketchRowState::scratch`]):
    /// on the capturing stream, in that stream's [`GraphScratch`], gated like any captured
    /// check. A skip where no scratch is left for another capturing stream.
    fn sketch_captured_shared(
        &self,
        req: &CheckRequest,
        g: &QsGemmDesc,
        entries: crate::device::gpu::SketchEntries,
        sample: &RowSample,
        site: &mut SiteGpu,
        stream: Stream,
    ) -> Result<(), Skip> {
        let geometry = self.shared_check_geometry(g, req, sample)?;
        if stream == PER_THREAD_STREAM {
            // Several threads may capture on their per-thread default streams: one handle.
            return Err(Skip::new(CAPTURE_PER_THREAD_STREAM));
        }
        let scratch = {
            let mut shared = self.graph_scratch.lock().unwrap_or_else(|e| e.into_inner());
            let key = (stream.0, geometry.kp);
            match shared.taken.get(&key) {
                Some(s) => Some(s.clone()),
                None => {
                    let spares = shared.spare.entry(geometry.kp).or_default();
                    match spares.iter().rposition(|s| s.fits(&geometry)) {
                        Some(i) => {
                            let s = spares.remove(i);
                            shared.taken.insert(key, s.clone());
                            Some(s)
                        }
                        None => {
                            // The next eager check makes one, for later captures.
                            self.graph_scratch_missed.store(true, std::sync::atomic::Ordering::Relaxed);
                            None
                        }
                    }
                }
            }
        };
        let Some(scratch) = scratch.filter(|s| s.fits(&geometry)) else {
            return Err(Skip::new(CAPTURE_NO_GRAPH_SCRATCH));
        };
        let state = &site.sketch_rows[&sample.count];
        let weight = site.weight.as_ref().expect("set by the caller");
        let rows = QsRowSel::sample(sample, site.epoch.ptr, 0, true);
        let mut prepared = self
            .checker
            .prepare_sketch_check_in(
                entries,
                g,
                rows,
                weight,
                &scratch,
                &geometry,
                (req.site_id, req.call_seq),
                true,
            )
            .map_err(|e| Skip::new(format!("sketch: {}", short(&e.to_string()))))?;
        set_sketch_gate(&mut prepared, state.gates, req.device_gate);
        self.checker
            .launch_prepared(&prepared, stream)
            .map_err(|e| Skip::new(format!("sketch launch: {}", short(&e.to_string()))))?;
        self.note_check_node(req, stream, Some(gate_field!(abi::QsSketchParams)));
        Ok(())
    }

    /// Outside a capture: makes spare [`GraphScratch`]es up to [`GRAPH_SCRATCH_SPARES`] (up to
    /// [`GRAPH_SCRATCH_STREAMS`] made, fewer where the pool has no room). Whether one was ever
    /// made: without, no capture of a count set up with gates only could be checked.
    fn top_up_graph_scratch(&self, probes: u32, rows_per_call: u64) -> bool {
        let Ok(kp) = abi::padded_probes(probes) else { return false };
        self.graph_scratch_missed.store(false, std::sync::atomic::Ordering::Relaxed);
        let mut shared = self.graph_scratch.lock().unwrap_or_else(|e| e.into_inner());
        while shared.spare.get(&kp).map_or(0, Vec::len) < GRAPH_SCRATCH_SPARES
            && shared.made(kp) < GRAPH_SCRATCH_STREAMS
        {
            let max_rows = rows_per_call.min(STREAM_SCRATCH_ROWS);
            match self.checker.sketch_scratch_up_to(max_rows, probes) {
                Ok(s) => shared.spare.entry(kp).or_default().push(Arc::new(s)),
                Err(_) => break,
            }
        }
        shared.made(kp) > 0
    }

    /// The scratch of eager checks on `stream` that have none of their own, and the geometry of
    /// this call's check in it. Made on the stream's first such check, for up to the configured
    /// sampled rows a call; a check of more rows than that (or a pool that cannot hold it) is a
    /// skip.
    fn stream_scratch(
        &self,
        stream: Stream,
        g: &QsGemmDesc,
        req: &CheckRequest,
        sample: &RowSample,
    ) -> Result<(Arc<SketchScratch>, crate::device::abi::SketchGeometry), Skip> {
        let fail = |e: crate::device::DeviceError| Skip::new(format!("sketch set-up: {}", pool_reason(&e)));
        let geometry = self.shared_check_geometry(g, req, sample)?;
        // A per-thread default stream is another stream on every thread, and no hook tells
        // when one ends: its checks keep their own scratch.
        if stream == PER_THREAD_STREAM {
            return Err(Skip::new("sketch set-up: no shared scratch on a per-thread default stream"));
        }
        let key = (stream.0, geometry.kp);
        let mut shared = self.stream_scratch.lock().unwrap_or_else(|e| e.into_inner());
        let scratch = match shared.get(&key) {
            Some(s) => s.clone(),
            None => {
                if shared.len() >= STREAM_SCRATCH_MAX {
                    return Err(Skip::new("sketch set-up: scratch of too many streams"));
                }
                let max_rows = req.sketch.rows_per_call.min(STREAM_SCRATCH_ROWS);
                let s =
                    Arc::new(self.checker.sketch_scratch_up_to(max_rows, req.sketch.probes).map_err(fail)?);
                shared.insert(key, s.clone());
                s
            }
        };
        if !scratch.fits(&geometry) {
            return Err(Skip::new("sketch set-up: more sampled rows than a stream's scratch holds"));
        }
        Ok((scratch, geometry))
    }

    /// The scratch of eager checks off the caller's stream (detached, or split) of one shape,
    /// shared by its sites: made on first use. Only the side stream uses it.
    fn shared_eager_scratch(
        &self,
        shape: ShapeKey,
    ) -> Result<Arc<SketchScratch>, crate::device::DeviceError> {
        let mut shared = self.eager_scratch.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(scratch) = shared.get(&shape) {
            return Ok(scratch.clone());
        }
        let (count, k, n, probes) = shape;
        let scratch = Arc::new(self.checker.sketch_scratch(count, k, n, probes, false)?);
        shared.insert(shape, scratch.clone());
        Ok(scratch)
    }

    /// An eager check split in two (qs_abi.h QsSplitHeader): the projections on the caller's
    /// stream, the finishing on the side stream behind an event, into the shape's scratch that
    /// only the side stream uses. `OnStream` (the fused check on the caller's stream, nothing
    /// lost) where it does not apply: split checks off or not on this device, under `auto` a
    /// GEMM below [`crate::device::gpu::SPLIT_AUTO_MIN_FLOPS`], no side stream,
    /// fewer sampled rows than [`EAGER_DETACH_MIN_ROWS`] (there the host's launch rate binds, and
    /// this path makes four driver calls instead of one), a call the lean check does not take,
    /// no split buffer to take ([`EagerSnapshots::take_in_turn`]: the caller's stream may wait
    /// for the finishing that last used the one it takes), or a set-up the pool cannot hold.
    fn sketch_split(
        &self,
        req: &CheckRequest,
        g: &QsGemmDesc,
        entries: crate::device::gpu::SketchEntries,
        sample: &RowSample,
        site: &mut SiteGpu,
        stream: Stream,
    ) -> Detach {
        // A relaxed load and a product per eager check.
        let flops = 2.0 * g.m as f64 * g.n as f64 * g.k as f64 * g.batch.max(1) as f64;
        if !self.checker.split_sketch().splits(flops) || sample.count < EAGER_DETACH_MIN_ROWS {
            return Detach::OnStream;
        }
        let Some(side) = self.side_stream else { return Detach::OnStream };
        let Some(weight) = site.weight.as_ref() else { return Detach::OnStream };
        if !self.checker.sketch_takes_lean(g, weight, sample.count, false) {
            return Detach::OnStream;
        }
        if !self.side_waits.lock().unwrap_or_else(|e| e.into_inner()).may_wait_on_side(stream) {
            return Detach::OnStream;
        }
        let Ok(scratch) = self.shared_eager_scratch((sample.count, g.k, g.n, req.sketch.probes)) else {
            return Detach::OnStream;
        };
        // Every buffer of the size the largest sample needs: one taken in turn is never grown.
        let largest = abi::SplitLayout::new(req.sketch.rows_per_call.max(sample.count), weight.kp);
        let mut buffers = self.split_buffers.lock().unwrap_or_else(|e| e.into_inner());
        let buf = match buffers.take_in_turn(
            self.runtime.as_ref(),
            &self.checker,
            largest.bytes(),
            SPLIT_BUFFERS,
            stream,
        ) {
            Ok(Some(buf)) => buf,
            Ok(None) | Err(_) => return Detach::OnStream,
        };
        let buffer = buf.buffer.as_ref().expect("taken with a buffer").ptr;
        // The site's next rows, counted only once the projections are enqueued.
        let mut next_epoch = site.eager_epoch;
        let rows = eager_rows(sample, &mut next_epoch);
        let Ok((project, finish)) = self.checker.prepare_split_check(
            entries,
            g,
            rows,
            weight,
            &scratch,
            buffer,
            (req.site_id, req.call_seq),
        ) else {
            return Detach::OnStream;
        };
        if let Err(e) = self.checker.launch_prepared(&project, stream) {
            return Detach::Skip(Skip::new(format!("sketch launch: {}", short(&e.to_string()))));
        }
        site.eager_epoch = next_epoch;
        // From here the projections are enqueued: a failure leaves a buffer that is never handed
        // out again (work nobody waits for may still write it).
        let rt = &self.runtime;
        let queued = rt
            .record_event(buf.copied, stream)
            .and_then(|()| rt.wait_event(side, buf.copied))
            .and_then(|()| self.checker.launch_prepared(&finish, side));
        if let Err(e) = queued {
            buf.lost = true;
            return Detach::Skip(Skip::new(format!("split sketch finishing: {}", short(&e.to_string()))));
        }
        buf.pending = true;
        buf.lost = rt.record_event(buf.done, side).is_err();
        Detach::Done
    }

    /// A detached sketch check (see [`DetachedState`]), or `OnStream` when this call is not
    /// detached: an eager call under `SketchDetach::Graphs` (after the set-up its site's later
    /// captures need), no side stream, a capture on a runtime without graph branches, a
    /// batched B, a snapshot too large, snapshot memory used up.
    #[allow(clippy::too_many_arguments)]
    fn sketch_detached(
        &self,
        req: &CheckRequest,
        g: &QsGemmDesc,
        sample: &RowSample,
        weight: &SketchWeight,
        detached: &mut FxHashMap<u64, Option<DetachedState>>,
        stream: Stream,
        capturing: bool,
    ) -> Detach {
        if capturing && req.device_gate.is_some() {
            // Sampled per replay on the device: on the stream the gated-out check is one node
            // per GEMM; detached it would be two (the gated copy and the gated branch).
            return Detach::OnStream;
        }
        let capture = if capturing {
            match self.runtime.capture_id(stream) {
                Ok(Some(id)) => Some(id),
                Ok(None) => return Detach::OnStream,
                Err(e) => return Detach::Skip(Skip::new(format!("capture info: {}", short(&e.to_string())))),
            }
        } else {
            None
        };
        let Some(side) = self.side_stream else { return Detach::OnStream };
        #[allow(clippy::map_entry)] // the set-up may bail out before inserting
        if !detached.contains_key(&sample.count) {
            if capturing {
                // Set-up allocates zeroed scratch and events: only outside a capture.
                return Detach::OnStream;
            }
            if !self.sketch_detach.detaches_eager()
                && (detached.len() >= ROW_STATES_PER_SITE || !self.checker.room_for_extras())
            {
                // Only for later captures, which a pool near full cannot serve anyway: a
                // server's changing batch sizes must not take what new sites need.
                return Detach::OnStream;
            }
            match self.detached_setup(g, sample.count, req.sketch.probes) {
                Ok(state) => {
                    detached.insert(sample.count, state);
                }
                // Only for later captures (this call is checked on its stream either way):
                // not retried, and this call is not lost.
                Err(_) if !self.sketch_detach.detaches_eager() => {
                    detached.insert(sample.count, None);
                    return Detach::OnStream;
                }
                Err(s) => return Detach::Skip(s),
            }
        }
        let Some(st) = detached.get_mut(&sample.count).expect("inserted above") else {
            return Detach::OnStream;
        };
        if !st.layout.fits(g) {
            // A call with C, a row bias or A scales where the site's snapshot has none (or the
            // other way round): its snapshot would not hold it. Checked in place.
            return Detach::OnStream;
        }
        if capture.is_none() && !self.sketch_detach.detaches_eager() {
            // Eager checks stay on their stream (`SketchDetach::Graphs`); the set-up above
            // serves the site's later captures.
            return Detach::OnStream;
        }
        if capture.is_none() && sample.count < EAGER_DETACH_MIN_ROWS {
            // Few rows outside a graph: the caller is bound by its CPU launch rate, and the
            // detached path's extra driver calls (two launches, two records, a wait, a query)
            // cost more than the check's time on the stream (H100: +129% against +63% on a
            // 1 x 4096 x 4096 bf16 call). The set-up above still serves later captures.
            return Detach::OnStream;
        }
        let rows = QsRowSel::sample(sample, 0, 0, false);
        let tag = (req.site_id, req.call_seq);
        let launch_err = |what: &str, e: crate::device::DeviceError| {
            Detach::Skip(Skip::new(format!("detached sketch {what}: {}", short(&e.to_string()))))
        };
        // The snapshot copy on the caller's stream; gives the check to run over the snapshot.
        let layout = &st.layout;
        let copy_on_stream = |rows, base, epoch_counter, scratch: &SketchScratch| {
            let (copy, check) = self
                .checker
                .prepare_detached(g, layout, rows, base, epoch_counter, weight, scratch, tag, capturing)
                .map_err(|e| launch_err("set-up", e))?;
            self.checker.launch_copy(&copy, stream).map_err(|e| launch_err("copy launch", e))?;
            Ok(check)
        };
        match capture {
            None => {
                // Eager: a free snapshot buffer, the copy here, the check on the side stream.
                let Some(eager_scratch) = st.eager_scratch.as_ref() else {
                    return Detach::OnStream; // set up while eager checks stayed on their stream
                };
                let mut snapshots = self.eager_snapshots.lock().unwrap_or_else(|e| e.into_inner());
                let snap = match snapshots.take(self.runtime.as_ref(), &self.checker, st.layout.bytes) {
                    Ok(Some(snap)) => snap,
                    Ok(None) => {
                        return Detach::Skip(Skip::new("sketch: earlier detached checks are still running"));
                    }
                    Err(e) => {
                        return Detach::Skip(Skip::new(format!(
                            "detached sketch snapshot: {}",
                            pool_reason(&e)
                        )));
                    }
                };
                let buffer = snap.buffer.as_ref().expect("taken with a buffer").ptr;
                let rows = QsRowSel::eager(sample, st.eager_epoch);
                let check = match copy_on_stream(rows, buffer, 0, eager_scratch) {
                    Ok(check) => check,
                    Err(skip) => return skip,
                };
                // From here the copy is enqueued: a failure leaves a copy nobody reads, into a
                // buffer that is then never handed out again.
                let rt = &self.runtime;
                self.side_waits.lock().unwrap_or_else(|e| e.into_inner()).side_waits_for(stream);
                let queued = rt
                    .record_event(snap.copied, stream)
                    .and_then(|()| rt.wait_event(side, snap.copied))
                    .and_then(|()| self.checker.launch_prepared(&check, side));
                if let Err(e) = queued {
                    snap.lost = true;
                    return launch_err("side stream", e);
                }
                // The check is enqueued: its result will come, so the call is not a skip.
                snap.pending = true;
                snap.lost = rt.record_event(snap.done, side).is_err();
                st.eager_epoch += 1;
                Detach::Done
            }
            Some(id) => {
                // Captured: this capture's next snapshot buffer, the copy captured on the
                // stream, the check deferred to the capture's end (the site's own scratch) or
                // a branch after the copy (and after the capture's previous one).
                if let Some(bytes) = weight_bytes(&req.call.problem) {
                    self.largest_weights.lock().unwrap_or_else(|e| e.into_inner()).note(id, stream.0, bytes);
                }
                if st.graph_capture != id {
                    st.graph_capture = id;
                    st.graph_used = 0;
                }
                if st.graph_used == st.graph_buffers.len() {
                    use std::sync::atomic::Ordering;
                    let bytes = st.layout.bytes;
                    let held = self.graph_snapshot_bytes.fetch_add(bytes, Ordering::Relaxed);
                    if held + bytes > self.pool_bytes / 4 {
                        self.graph_snapshot_bytes.fetch_sub(bytes, Ordering::Relaxed);
                        return Detach::OnStream;
                    }
                    // A pool block: no driver call, legal while capturing.
                    match self.checker.alloc(bytes as usize) {
                        Ok(b) => st.graph_buffers.push(b),
                        Err(_) => {
                            self.graph_snapshot_bytes.fetch_sub(bytes, Ordering::Relaxed);
                            return Detach::OnStream;
                        }
                    }
                }
                let mut chains = self.graph_chains.lock().unwrap_or_else(|e| e.into_inner());
                let Some(chain) = chains.get_mut(&st.shape) else {
                    return Detach::OnStream; // set up with the state: not reached
                };
                let buffer = st.graph_buffers[st.graph_used].ptr;
                // The site's own scratch if this capture has not taken it yet: deferred.
                let own = match &mut st.own_scratch {
                    Some((scratch, capture)) if *capture != id => Some((scratch, capture)),
                    _ => None,
                };
                let scratch = own.as_ref().map_or(&chain.scratch, |(s, _)| &**s);
                // A deferred check's copy goes beside the next GEMM where the driver allows.
                let frontier = match own {
                    Some(_) => self.runtime.capture_frontier(stream).ok().flatten(),
                    None => None,
                };
                if let Some(after) = frontier {
                    let prepared = self
                        .checker
                        .prepare_detached(
                            g,
                            layout,
                            rows,
                            buffer,
                            st.epoch_counter.ptr,
                            weight,
                            scratch,
                            tag,
                            true,
                        )
                        .map_err(|e| launch_err("set-up", e));
                    let (copy, check) = match prepared {
                        Ok(p) => p,
                        Err(skip) => return skip,
                    };
                    let reads = snapshot_reads(g);
                    let work = CopyWork { copy, check };
                    let pending = PendingCopy {
                        capture: id,
                        stream: stream.0,
                        after,
                        reads,
                        beside: false,
                        thread: std::thread::current().id(),
                        work,
                    };
                    let mut copies = self.copies.lock().unwrap_or_else(|e| e.into_inner());
                    let earlier = copies.take(stream.0); // settled in after_call: not reached
                    let out = copies.push(pending);
                    drop(copies);
                    for old in earlier.into_iter().chain(out) {
                        if !old.settles_in(Some(id)) {
                            super::note_skip(COPY_DROPPED);
                            continue;
                        }
                        let into_stream = old.stream == stream.0;
                        self.add_copy(old, into_stream, true);
                    }
                    st.graph_used += 1;
                    if let Some((_, capture)) = own {
                        *capture = id;
                    }
                    return Detach::Done;
                }
                let check = match copy_on_stream(rows, buffer, st.epoch_counter.ptr, scratch) {
                    Ok(check) => check,
                    Err(skip) => return skip,
                };
                st.graph_used += 1;
                if let Some((_, capture)) = own {
                    *capture = id;
                    let check = DeferredCheck { launch: check, copy: None };
                    let given_up = self.deferred.lock().unwrap_or_else(|e| e.into_inner()).push(id, check);
                    for _ in 0..given_up {
                        super::note_skip(NEVER_ADDED);
                    }
                    return Detach::Done;
                }
                match self.checker.launch_prepared_branch(
                    &check,
                    stream,
                    BranchDeps::Frontier(chain.branches.last(id)),
                ) {
                    Ok(node) => {
                        chain.branches.set_last(id, node);
                        Detach::Done
                    }
                    Err(e) => launch_err("graph branch", e),
                }
            }
        }
    }

    /// Whether a replaced projection can wait for its checks ([`super::retired`]), after
    /// letting go of those whose checks have run.
    fn retired_room(&self) -> bool {
        let mut r = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        r.collect(|e| self.runtime.event_done(e).unwrap_or(false));
        r.has_room()
    }

    /// `old`, replaced by a new projection of its site, waits until the checks that may read
    /// it have run: events recorded now on every stream its checks were enqueued on
    /// (`streams`; `stream`, the replacing call's, is behind its own check and the new
    /// projection) and on the side stream (behind every detached check enqueued so far).
    /// Kept instead when `streams` is None ([`SiteGpu::weight_streams`]) or an event cannot be
    /// recorded.
    fn retire_weight(&self, old: SketchWeight, stream: Stream, streams: Option<Vec<Stream>>) {
        let mut r = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        let mut events = Vec::new();
        let mut recorded = streams.is_some();
        let mut on: Vec<Stream> = streams.unwrap_or_default();
        on.extend([Some(stream), self.side_stream].into_iter().flatten());
        on.sort_by_key(|s| s.0);
        on.dedup();
        for s in on {
            if !recorded {
                break;
            }
            let event = match r.spare.pop() {
                Some(e) => Ok(e),
                None => self.runtime.create_sync_event(),
            };
            match event {
                Ok(e) => {
                    events.push(e);
                    recorded = self.runtime.record_event(e, s).is_ok();
                }
                Err(_) => recorded = false,
            }
        }
        if recorded {
            r.wait(old, events);
        } else {
            r.spare.extend(events);
            if r.keep(old) && !KEPT_OVERFLOW_LOGGED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                super::log::warn(&format!(
                    "more than {} replaced sketch projections kept (sites with captured checks, or \
                     used from many streams): the oldest are released from now on (a graph still \
                     replaying their checks would read recycled memory)",
                    super::retired::KEPT_MAX
                ));
            }
        }
    }

    /// Layout, counters, scratch and eager buffers of detached checks of `count` rows; None
    /// when these calls cannot be detached (logged once per site and count; they are checked
    /// on their stream).
    fn detached_setup(&self, g: &QsGemmDesc, count: u64, probes: u32) -> Result<Option<DetachedState>, Skip> {
        use crate::device::snapshot::SnapshotLayout;
        let layout =
            match SnapshotLayout::new(g, count, self.checker.info.multiprocessors, SNAPSHOT_MAX_BYTES) {
                Ok(l) => l,
                Err(e) => {
                    super::log::info(&format!("sketch check on the caller's stream: {e}"));
                    return Ok(None);
                }
            };
        let fail =
            |e: crate::device::DeviceError| Skip::new(format!("detached sketch set-up: {}", pool_reason(&e)));
        let epoch_counter = self.checker.alloc_zeroed(8).map_err(fail)?;
        let shape: ShapeKey = (count, g.k, g.n, probes);
        let scratch = || self.checker.sketch_scratch(count, g.k, g.n, probes, false).map_err(fail);
        // Only where eager checks are detached (`SketchDetach::On`).
        let eager_scratch = if self.sketch_detach.detaches_eager() {
            Some(self.shared_eager_scratch(shape).map_err(fail)?)
        } else {
            None
        };
        if let std::collections::hash_map::Entry::Vacant(e) =
            self.graph_chains.lock().unwrap_or_else(|e| e.into_inner()).entry(shape)
        {
            e.insert(GraphChain { scratch: scratch()?, branches: LastBranches::default() });
        }
        // Decode-sized counts only: ~50 KB at one row, ~400 KB from 8 rows on (per site).
        let own_scratch = if count <= OWN_SCRATCH_MAX_ROWS { Some((scratch()?, u64::MAX)) } else { None };
        Ok(Some(DetachedState {
            layout,
            epoch_counter,
            eager_epoch: 0,
            eager_scratch,
            shape,
            graph_buffers: vec![],
            graph_capture: u64::MAX,
            graph_used: 0,
            own_scratch,
        }))
    }

    /// Rows or full check. Outside a capture it runs on the low-priority side stream: the
    /// per-call inputs (A, its scales, C) and D are copied on the caller's stream right after
    /// the call (the caller may overwrite them before the reference runs; weights are not
    /// copied, they stay put during inference), the side stream waits for those copies only,
    /// and the caller's stream never waits for the reference. A site whose previous check is
    /// still running skips the call (counted) instead of waiting. Inside a capture the check
    /// runs on the captured stream (a forked side stream would have to be joined back into
    /// the capture, which delays the caller the same way).
    fn rows_or_full(
        &self,
        req: &CheckRequest,
        g: &QsGemmDesc,
        buffers: &GemmBuffers,
        stream: Stream,
        capturing: bool,
    ) -> Result<(), Skip> {
        let p = &req.call.problem;
        let gemm = KernelBuild::gemm_ref(p.a.format, p.b.format)
            .map_err(|e| Skip::new(format!("reference: {e}")))?;
        let cmp = KernelBuild::compare(p.d.format).map_err(|e| Skip::new(format!("compare: {e}")))?;
        self.ensure_program(&gemm, capturing)?;
        self.ensure_program(&cmp, capturing)?;
        let total_rows = g.total_rows();
        let full = req.mode == CheckMode::Full;
        let per_call = if full { total_rows } else { req.rows_per_call };
        let sample = RowSample::new(crate::rng::mix64(req.sketch.seed ^ 0x7e57), total_rows, per_call);
        let logits = req.logits_topk.is_some();
        let mut sites = self.sites.lock().unwrap_or_else(|e| e.into_inner());
        let site = self.site_state(&mut sites, req, capturing)?;
        let key = (sample.count, logits);
        #[allow(clippy::map_entry)] // the set-up may bail out before inserting
        if !site.rows_state.contains_key(&key) {
            if capturing {
                return Err(Skip::new(CAPTURE_NEW_ROW_COUNT));
            }
            let bytes = (sample.count as usize).saturating_mul(g.n as usize).saturating_mul(4);
            let reference = self
                .checker
                .alloc(bytes)
                .map_err(|e| Skip::new(format!("{} reference: {}", req.mode.name(), pool_reason(&e))))?;
            let compare = self
                .checker
                .compare_scratch(sample.count, g.n, logits)
                .map_err(|e| Skip::new(format!("compare set-up: {}", pool_reason(&e))))?;
            let gates = self
                .checker
                .alloc_zeroed(16)
                .map_err(|e| Skip::new(format!("{} set-up: {}", req.mode.name(), pool_reason(&e))))?;
            site.rows_state.insert(key, RowsState { reference, compare, gates, side: None });
        }
        let state = site.rows_state.get_mut(&key).expect("inserted above");
        let side_stream = if capturing { None } else { self.side_stream };
        let (g_checked, run_on) = match side_stream {
            None => (*g, stream),
            Some(side) => (self.copy_inputs(req, buffers, state, stream, side)?, side),
        };
        let g = &g_checked;
        // Once copy_inputs has enqueued the copies, the side state must guard them whatever
        // happens below: a check that fails to launch still leaves copies (and maybe its
        // reference) queued, which the site's next call must wait for before it frees or
        // reuses a copy.
        let enqueued = (|| -> Result<(), Skip> {
            // The reference reads the epoch; the compare (last kernel of the check) advances it.
            let ref_rows = QsRowSel::sample(&sample, site.epoch.ptr, 0, false);
            let cmp_rows = QsRowSel::sample(&sample, site.epoch.ptr, 0, true);
            // In a capture with a sampling rule: decided on the device at every replay.
            let gate = |which: u64| match req.device_gate.filter(|_| capturing) {
                Some(rule) => abi::DeviceGate::new(state.gates.ptr + 8 * which, rule.first, rule.every),
                None => abi::DeviceGate::default(),
            };
            // The compare is prepared before the reference is enqueued: in a capture, a
            // reference node whose compare never came would advance its gate counter alone at
            // every replay, and the pair's counters are shared by the site's graphs.
            let request = CompareRequest {
                d: g.d,
                m: g.m,
                n: g.n,
                rows: cmp_rows,
                reference: state.reference.ptr,
                ref_ld: g.n,
                logits_topk: req.logits_topk,
                kind: if full { abi::CHECK_FULL } else { abi::CHECK_ROWS },
                tag: (req.site_id, req.call_seq),
            };
            let mut prepared = self
                .checker
                .prepare_compare(&request, &state.compare)
                .map_err(|e| Skip::new(format!("compare: {}", short(&e.to_string()))))?;
            self.checker
                .reference_sel(g, ref_rows, &state.reference, g.n, true, gate(0), run_on)
                .map_err(|e| Skip::new(format!("reference launch: {}", short(&e.to_string()))))?;
            if capturing {
                self.note_check_node(req, run_on, Some(gate_field!(abi::QsRefParams)));
            }
            let cmp_gate = gate(1);
            prepared.params.gate_ptr = cmp_gate.ptr;
            prepared.params.gate_first = cmp_gate.first;
            prepared.params.gate_every = cmp_gate.every;
            self.checker
                .launch_prepared(&prepared, run_on)
                .map_err(|e| Skip::new(format!("compare launch: {}", short(&e.to_string()))))?;
            if capturing {
                self.note_check_node(req, run_on, Some(gate_field!(abi::QsCompareParams)));
            }
            Ok(())
        })();
        if let Some(side) = state.side.as_mut().filter(|_| side_stream.is_some()) {
            // A failed record is not a skip when the compare is enqueued (its result will come),
            // but the copies are then never reused (their readers' end is unknown).
            side.pending = true;
            side.lost = self.runtime.record_event(side.done, run_on).is_err();
        }
        enqueued
    }

    /// Copies what the caller may overwrite into the site's buffers on `stream` and makes
    /// `side` wait for the copies; returns the descriptor over the copies.
    fn copy_inputs(
        &self,
        req: &CheckRequest,
        buffers: &GemmBuffers,
        state: &mut RowsState,
        stream: Stream,
        side: Stream,
    ) -> Result<QsGemmDesc, Skip> {
        let rt = &self.runtime;
        let fail = |what: &str, e: crate::device::DeviceError| {
            Skip::new(format!("{what}: {}", short(&e.to_string())))
        };
        if state.side.is_none() {
            let inputs_ready = rt.create_sync_event().map_err(|e| fail("side stream event", e))?;
            let done = rt.create_sync_event().map_err(|e| fail("side stream event", e))?;
            state.side = Some(SideCheck {
                copies: Default::default(),
                scalars: None,
                inputs_ready,
                done,
                pending: false,
                lost: false,
            });
        }
        let sc = state.side.as_mut().expect("set above");
        if sc.lost {
            return Err(Skip::new("rows/full side stream: an earlier check's end could not be recorded"));
        }
        if sc.pending {
            if !rt.event_done(sc.done).map_err(|e| fail("side stream event", e))? {
                return Err(Skip::new("previous rows/full check of this site still running"));
            }
            sc.pending = false;
        }
        let p = &req.call.problem;
        let mut out = *buffers;
        let targets = per_call_inputs(p, buffers, &mut out, self.weights_rewritten(req.site_id));
        // Every block and the descriptor first, nothing enqueued yet: a failure here leaves
        // no copy behind (the previous check of the site is done, so its blocks may go).
        let mut plan: Vec<(u64, u64, usize)> = Vec::with_capacity(11);
        for (slot, (src, bytes, dst)) in sc.copies.iter_mut().zip(targets) {
            if src == 0 || bytes == 0 {
                continue;
            }
            if slot.as_ref().is_none_or(|b| b.bytes < bytes) {
                *slot = None; // back to the pool before the larger block is taken
                *slot =
                    Some(self.checker.alloc(bytes).map_err(|e| {
                        Skip::new(format!("{} inputs: {}", req.mode.name(), pool_reason(&e)))
                    })?);
            }
            let copy = slot.as_ref().expect("allocated above");
            plan.push((copy.ptr, src, bytes));
            *dst = copy.ptr;
        }
        let mut g = QsGemmDesc::from_problem(p, &out)
            .map_err(|e| Skip::new(format!("descriptor: {}", short(&e.to_string()))))?;
        let scalars = g.scalars_mut();
        if scalars.iter().any(|x| x.device_ptr().is_some()) {
            if sc.scalars.is_none() {
                sc.scalars =
                    Some(self.checker.alloc(8 * scalars.len()).map_err(|e| {
                        Skip::new(format!("{} inputs: {}", req.mode.name(), pool_reason(&e)))
                    })?);
            }
            let base = sc.scalars.as_ref().expect("allocated above").ptr;
            for (i, x) in scalars.into_iter().enumerate() {
                let width = crate::formats::Format::from_u8(x.format as u8).map_or(0, |f| f.bytes_for(1));
                if let Some(src) = x.device_ptr().filter(|_| (1..=8).contains(&width)) {
                    plan.push((base + 8 * i as u64, src, width));
                    x.ptr = base + 8 * i as u64;
                }
            }
        }
        let mut enqueued = false;
        let mut copied = Ok(());
        for (dst, src, bytes) in plan {
            if let Err(e) = rt.copy_async(dst, src, bytes, stream) {
                copied = Err(fail("input copy", e));
                break;
            }
            enqueued = true;
        }
        let copied = copied.and_then(|()| {
            self.side_waits.lock().unwrap_or_else(|e| e.into_inner()).side_waits_for(stream);
            rt.record_event(sc.inputs_ready, stream)
                .and_then(|()| rt.wait_event(side, sc.inputs_ready))
                .map_err(|e| fail("side stream event", e))
        });
        if let Err(skip) = copied {
            // Copies already enqueued still write their slots: the next call waits for them
            // (as for a check) before it may free or reuse a slot.
            if enqueued {
                sc.pending = rt.record_event(sc.done, stream).is_ok();
                sc.lost = !sc.pending;
            }
            return Err(skip);
        }
        Ok(g)
    }
}

/// (source, bytes, where the copy's address goes) of the per-call inputs a side-stream check
/// copies before the caller may overwrite them: A, D, A's scales and C, in that order (absent
/// ones with 0 bytes). Weights and their scales stay put during inference and are not copied,
/// except with `weights` (B and its scales, last): fault injection rewrites them in place at
/// every call of the site, so side-stream work must read a copy taken right after the call.
fn per_call_inputs<'b>(
    p: &crate::problem::GemmProblem,
    src: &GemmBuffers,
    out: &'b mut GemmBuffers,
    weights: bool,
) -> [(u64, usize, &'b mut u64); 6] {
    let matrix = |layout: &crate::problem::MatrixLayout, (rows, cols): (u64, u64)| {
        layout.format.bytes_for(layout.required_elements(rows, cols, p.batch) as usize)
    };
    let scales = |spec: &Option<crate::problem::ScaleSpec>, ptr: u64, outer: u64| {
        spec.as_ref()
            .filter(|_| ptr != 0)
            .map_or(0, |s| s.format.bytes_for(s.required_entries(outer, p.k, p.batch) as usize))
    };
    let a_bytes = matrix(&p.a, p.a_stored_dims());
    let d_bytes = matrix(&p.d, (p.m, p.n));
    let s_bytes = scales(&p.a_scale, src.a_scale, p.m);
    let c_bytes = p.c.as_ref().filter(|_| src.c != 0).map_or(0, |c| matrix(c, (p.m, p.n)));
    let (b_bytes, bs_bytes) = if weights {
        (matrix(&p.b, p.b_stored_dims()), scales(&p.b_scale, src.b_scale, p.n))
    } else {
        (0, 0)
    };
    let GemmBuffers { a, b, d, a_scale, b_scale, c, .. } = out;
    [
        (src.a, a_bytes, a),
        (src.d, d_bytes, d),
        (src.a_scale, s_bytes, a_scale),
        (src.c, c_bytes, c),
        (src.b, b_bytes, b),
        (src.b_scale, bs_bytes, b_scale),
    ]
}

/// Where a check kernel's parameter struct keeps its device gate.
macro_rules! gate_field {
    ($params:ty) => {
        super::graph_select::GateField {
            params_size: std::mem::size_of::<$params>(),
            gate_offset: std::mem::offset_of!($params, gate_ptr),
        }
    };
}
use gate_field;

impl GpuBackend {
    /// Records the work just captured on `stream` for a check sampled per replay (a gated
    /// check kernel, or with `gate` None a node that only feeds one), so that the graph's
    /// unsampled replays can launch without it (`graph_select`). Nothing for ungated captures
    /// (`sample all`): every replay runs their checks.
    /// Before a GEMM on a stream with a pending snapshot copy: lets the GEMM run beside the
    /// copy when it comes straight after the copy's GEMM and writes nothing the copy reads,
    /// otherwise adds the copy in front of everything captured since ([`super::copy_beside`]).
    fn settle_copy_before(&self, req: &CheckRequest) {
        let stream = Stream(req.call.stream);
        let mut copies = self.copies.lock().unwrap_or_else(|e| e.into_inner());
        let Some(copy) = copies.take(stream.0) else { return };
        if !copy.settles_in(self.runtime.capture_id(stream).ok().flatten()) {
            super::note_skip(COPY_DROPPED); // its capture ended unseen: its check goes with it
            return;
        }
        match self.runtime.capture_frontier(stream) {
            Ok(Some(frontier)) if copy.settle(&frontier, call_writes(req).as_deref()) == Settle::Beside => {
                copies.put_back(PendingCopy { beside: true, ..copy })
            }
            _ => {
                drop(copies);
                self.add_copy(copy, true, true);
            }
        }
    }

    /// After a GEMM: a copy it ran beside is added now (a second dependent of the previous
    /// GEMM's nodes, so the executor keeps the production chain on its stream) and joins the
    /// stream, so that later work waits for it.
    fn settle_copy_after(&self, stream: Stream) {
        let copy = self.copies.lock().unwrap_or_else(|e| e.into_inner()).take(stream.0);
        let Some(copy) = copy else { return };
        if !copy.settles_in(self.runtime.capture_id(stream).ok().flatten()) {
            super::note_skip(COPY_DROPPED);
            return;
        }
        let retro = !copy.beside;
        self.add_copy(copy, true, retro);
    }

    /// Adds a pending copy after its GEMM's nodes; with `retro`, in front of everything
    /// captured after them; with `into_stream`, before the stream's next work too. Its check
    /// then waits for the capture's end. A copy that cannot be added and ordered takes its
    /// check with it (counted).
    fn add_copy(
        &self,
        copy: PendingCopy<CopyWork>,
        into_stream: bool,
        retro: bool,
    ) -> Option<crate::device::GraphNode> {
        let stream = Stream(copy.stream);
        let added = self
            .checker
            .launch_copy_branch(&copy.work.copy, stream, BranchDeps::Exactly(&copy.after))
            .and_then(|node| {
                let from: &[crate::device::GraphNode] = if retro { &copy.after } else { &[] };
                self.runtime.join_graph_branch(stream, node, from, into_stream).map(|()| node)
            });
        match added {
            Ok(node) => {
                let check = DeferredCheck { launch: copy.work.check, copy: Some(node) };
                let given_up =
                    self.deferred.lock().unwrap_or_else(|e| e.into_inner()).push(copy.capture, check);
                for _ in 0..given_up {
                    super::note_skip(NEVER_ADDED);
                }
                Some(node)
            }
            // The failing call and its status (a few distinct texts: skips are counted by reason).
            Err(e) => {
                let e = e.to_string();
                let why: String = e.split('(').next().unwrap_or("").trim().chars().take(120).collect();
                super::note_skip(&format!(
                    "graph capture: snapshot copy not added or not ordered (check dropped): {why}"
                ));
                None
            }
        }
    }

    /// Adds deferred checks as branches from the capture's current work on `stream` and from
    /// each check's own copy; a check whose copy is in `copy_only` branches from that copy
    /// alone. They run all at once: narrowed to share one resident wave of blocks (blocks
    /// beyond it would wait for earlier checks' slow finishing stages), split by the bytes each
    /// reads.
    fn add_deferred_checks(
        &self,
        mut checks: Vec<DeferredCheck>,
        stream: Stream,
        copy_only: &[crate::device::GraphNode],
    ) {
        let wave = abi::SKETCH_BLOCKS_PER_SM * self.checker.info.multiprocessors.max(1) as u64;
        let demands: Vec<abi::SplitDemand> = checks.iter().map(|c| c.launch.split_demand()).collect();
        for (check, splits) in checks.iter_mut().zip(abi::plan_shared_splits(&demands, wave)) {
            check.launch.narrow_splits(splits);
        }
        for check in &checks {
            let deps = match &check.copy {
                Some(copy) if copy_only.contains(copy) => BranchDeps::Exactly(std::slice::from_ref(copy)),
                _ => BranchDeps::Frontier(check.copy),
            };
            if let Err(e) = self.checker.launch_prepared_branch(&check.launch, stream, deps) {
                super::note_skip(&format!(
                    "graph capture: deferred check not added: {}",
                    short(&e.to_string())
                ));
            }
        }
    }

    /// Before a captured GEMM: the capture's deferred checks go beside it when its weight is
    /// far larger than every earlier one's ([`BESIDE_GEMM_FACTOR`], [`BESIDE_MIN_CHECKS`]).
    /// Only checks whose copy is a graph node move: a copy on a stream is ordered only on that
    /// stream. No driver call unless a capture has noted a weight (eager calls pay nothing).
    fn checks_beside_gemm(&self, req: &CheckRequest) {
        let Some(bytes) = weight_bytes(&req.call.problem) else { return };
        if self.largest_weights.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
            return;
        }
        let stream = Stream(req.call.stream);
        let Ok(Some(id)) = self.runtime.capture_id(stream) else { return };
        if !self.largest_weights.lock().unwrap_or_else(|e| e.into_inner()).is_jump(id, bytes) {
            return;
        }
        let checks = self.deferred.lock().unwrap_or_else(|e| e.into_inner()).take_movable(
            id,
            BESIDE_MIN_CHECKS,
            |c: &DeferredCheck| c.copy.is_some(),
        );
        if !checks.is_empty() {
            // Branches from the work captured before the GEMM: they start with it.
            self.add_deferred_checks(checks, stream, &[]);
        }
    }

    fn note_check_node(
        &self,
        req: &CheckRequest,
        stream: Stream,
        gate: Option<super::graph_select::GateField>,
    ) {
        let (Some(rule), Some(select)) = (req.device_gate, super::graph_select::get()) else {
            return;
        };
        // A node we cannot name stays in the plain clone too: gated, it only costs time there.
        if let Ok(Some((capture, graph, node))) = self.runtime.last_captured_node(stream) {
            select.record(graph, capture, super::graph_select::CheckNode { node: node.0, gate }, rule);
        }
    }

    /// Whether fault injection rewrites this site's B or B's scales in place.
    fn weights_rewritten(&self, site_id: u64) -> bool {
        self.inject.lock().unwrap_or_else(|e| e.into_inner()).rewrites_weights(site_id)
    }
}

/// Gates `prepared` by `rule` on the device: the count's counter pair at `gates`, the general
/// or the lean kernel's (each counts its own launches, whose grids agree).
fn set_sketch_gate(
    prepared: &mut crate::device::gpu::PreparedLaunch<abi::QsSketchParams>,
    gates: u64,
    rule: Option<super::config::Sampling>,
) {
    if let Some(rule) = rule {
        let gate = abi::DeviceGate::new(gates + 8 * prepared.is_lean() as u64, rule.first, rule.every);
        prepared.params.gate_ptr = gate.ptr;
        prepared.params.gate_first = gate.first;
        prepared.params.gate_every = gate.every;
    }
}

/// The rows of an eager check on the caller's stream, drawn by the site's host-counted epoch
/// `next`. Only checks of sampled rows move the count on, as they move the device counter: a
/// site's decode calls (every row) between two prefills must not make the prefills' windows
/// skip (M rows in windows of 256: a skip of a multiple of M / 256 draws the same rows again).
fn eager_rows(sample: &crate::sketch::RowSample, next: &mut u64) -> QsRowSel {
    let epoch = *next;
    *next += !sample.is_all() as u64;
    QsRowSel::eager(sample, epoch)
}

/// The bytes a call writes, for a pending copy deciding whether it may run beside the call:
/// D and its workspace, or None (unknown: never beside) for pointer arrays, inputs that fault injection rewrites in
/// place around the call, an amax output, and C overwritten in place (the shim first copies C
/// into a buffer of the site's own, which a pending copy of the same site may be reading).
fn call_writes(req: &CheckRequest) -> Option<Vec<Span>> {
    if req.call.pointer_arrays.is_some()
        || req.rewrites_inputs
        || req.call.buffers.amax_d != 0
        || overwrites_c_in_place(req)
    {
        return None;
    }
    let p = &req.call.problem;
    let bytes = p.d.format.bytes_for(p.d.required_elements(p.m, p.n, p.batch) as usize) as u64;
    Some(
        [(req.call.buffers.d, req.call.buffers.d.saturating_add(bytes))]
            .into_iter()
            .chain(req.scratch)
            .collect(),
    )
}

/// Whether the call reads C and writes D over it (beta may be non-zero): the shim copies C
/// first ([`Backend::before_call`]).
fn overwrites_c_in_place(req: &CheckRequest) -> bool {
    let p = &req.call.problem;
    p.c.is_some() && req.call.buffers.c == req.call.buffers.d && p.beta != crate::problem::Scalar::Host(0.0)
}

/// Byte ranges a check's snapshot copy reads: A, A's scales, C, D, the row bias and the
/// scalars kept in device memory (an unknown format counts 8 bytes per element).
fn snapshot_reads(g: &QsGemmDesc) -> Vec<Span> {
    let span = |ptr: u64, elements: u64, format: u32| {
        let bytes = match crate::formats::Format::from_u8(format as u8) {
            Some(f) if format <= u8::MAX as u32 => f.bytes_for(elements as usize) as u64,
            _ => elements.saturating_mul(8),
        };
        (ptr, ptr.saturating_add(bytes))
    };
    let mut reads = vec![
        span(g.a.ptr, g.a.extent, g.a.format),
        span(g.c.ptr, g.c.extent, g.c.format),
        span(g.d.ptr, g.d.extent, g.d.format),
        span(g.a_scale.ptr, g.a_scale.extent, g.a_scale.format),
        span(g.bias.ptr, g.bias.extent, g.bias.format),
    ];
    for s in [&g.alpha, &g.beta, &g.a_tensor_scale, &g.b_tensor_scale, &g.d_scale] {
        if s.on_device != 0 {
            reads.push((s.ptr, s.ptr.saturating_add(8)));
        }
    }
    reads.retain(|&(start, end)| start != 0 && end > start);
    reads
}

/// Error text without addresses or sizes (skip reasons are counted per string).
fn short(s: &str) -> String {
    s.split([':', '(']).next().unwrap_or(s).trim().to_string()
}

fn pool_reason(e: &crate::device::DeviceError) -> String {
    let s = e.to_string();
    if s.contains("device pool") {
        "device pool exhausted (raise QUANTSHADOW_POOL_MB)".into()
    } else {
        short(&s)
    }
}

impl Backend for GpuBackend {
    fn name(&self) -> &'static str {
        self.name
    }

    fn device(&self) -> (String, String) {
        (self.checker.info.name.clone(), self.checker.info.arch.clone())
    }

    fn is_capturing(&self, stream: u64) -> bool {
        self.runtime.is_capturing(Stream(stream)).unwrap_or(false)
    }

    fn context(&self) -> Option<u64> {
        self.context
    }

    fn in_primary_context(&self) -> Option<bool> {
        self.primary
    }

    fn before_call(&self, req: &CheckRequest) -> Result<PreCall, Skip> {
        self.same_device()?;
        self.settle_copy_before(req);
        self.checks_beside_gemm(req);
        if req.call.pointer_arrays.is_some() {
            return Err(Skip::new("batched pointer arrays are not checked on the GPU yet"));
        }
        if !overwrites_c_in_place(req) {
            return Ok(PreCall::default());
        }
        let p = &req.call.problem;
        let _relaxed = RelaxedCapture::new(self.runtime.as_ref());
        // The call overwrites C with D: copy C first (on the call's stream, so the copy is
        // ordered before the call and is recorded into a capture like the check itself).
        let stream = Stream(req.call.stream);
        let c = p.c.as_ref().expect("in_place implies C");
        let bytes = c.format.bytes_for(c.required_elements(p.m, p.n, p.batch) as usize);
        let capturing = self
            .runtime
            .is_capturing(stream)
            .map_err(|e| Skip::new(format!("stream capture query: {}", short(&e.to_string()))))?;
        let mut sites = self.sites.lock().unwrap_or_else(|e| e.into_inner());
        let site = self.site_state(&mut sites, req, capturing)?;
        let key = bytes;
        #[allow(clippy::map_entry)] // the set-up may bail out before inserting
        if !site.c_copies.contains_key(&key) {
            if capturing {
                return Err(Skip::new(CAPTURE_NEW_C_COPY));
            }
            let buf = self
                .checker
                .alloc(bytes)
                .map_err(|e| Skip::new(format!("copy of C: {}", pool_reason(&e))))?;
            site.c_copies.insert(key, buf);
        }
        let copy = site.c_copies[&key].ptr;
        site.c_saved = None;
        self.runtime
            .copy_async(copy, req.call.buffers.c, bytes, stream)
            .map_err(|e| Skip::new(format!("copy of C: {}", short(&e.to_string()))))?;
        if capturing {
            self.note_check_node(req, stream, None);
        }
        site.c_saved = Some((req.call_seq, copy));
        Ok(PreCall(Some(Box::new(copy))))
    }

    fn after_call(&self, req: &CheckRequest, pre: PreCall) -> Result<(), Skip> {
        self.same_device()?;
        let stream = Stream(req.call.stream);
        self.settle_copy_after(stream);
        let capturing = self
            .runtime
            .is_capturing(stream)
            .map_err(|e| Skip::new(format!("stream capture query: {}", short(&e.to_string()))))?;
        // Set-up (allocations, synchronous zeroing, module loads) happens only outside a capture
        // of this stream; relaxed mode keeps it from invalidating another thread's capture.
        let _relaxed = (!capturing).then(|| RelaxedCapture::new(self.runtime.as_ref()));
        let mut buffers = req.call.buffers;
        if let Some(copy) = pre.0.and_then(|b| b.downcast::<u64>().ok()) {
            buffers.c = *copy;
        }
        let g = QsGemmDesc::from_problem(&req.call.problem, &buffers)
            .map_err(|e| Skip::new(format!("descriptor: {}", short(&e.to_string()))))?;
        match req.mode {
            CheckMode::Sketch => self.sketch(req, &g, &buffers, stream, capturing),
            CheckMode::Rows | CheckMode::Full => self.rows_or_full(req, &g, &buffers, stream, capturing),
            CheckMode::Observe => Ok(()),
        }
    }

    fn poll(&self, out: &mut Vec<Polled>) {
        // The slots are taken under the ring's lock and handled after it: diagnosis results
        // among them too (a diagnosis being set up holds the diagnoses' lock while it prepares
        // compares, which take the ring's).
        let slots: Vec<_> = self.checker.with_ring(|ring| std::iter::from_fn(|| ring.poll()).collect());
        let mut diagnosis_slots = vec![];
        for slot in slots {
            if gpu_diagnose::parse_tag2(slot.tag2).is_some() {
                diagnosis_slots.push(slot);
                continue;
            }
            let site_ordinal = self.ordinal_of(slot.tag);
            if slot.status & abi::status::WEIGHT_CHANGED != 0 {
                self.weight_changes
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(slot.tag)
                    .or_default()
                    .found(slot.tag2);
            }
            if !sketch::slot_is_valid(&slot) {
                out.push(Polled::Failed {
                    site_ordinal,
                    call_seq: slot.tag2,
                    reason: status_reason(slot.status),
                });
                continue;
            }
            let mode = match slot.kind {
                abi::CHECK_SKETCH => CheckMode::Sketch,
                abi::CHECK_FULL => CheckMode::Full,
                _ => CheckMode::Rows,
            };
            let (sketch_prod, sketch_ref) =
                if mode == CheckMode::Sketch { sketch::slot_fingerprint(&slot) } else { (vec![], vec![]) };
            let mut f = 0;
            if slot.status & abi::status::REF_NONFINITE != 0 {
                f |= flags::REFERENCE_NONFINITE;
            }
            if mode != CheckMode::Full {
                f |= flags::ROW_SAMPLE;
            }
            out.push(Polled::Done(Box::new(CheckOutcome {
                site_ordinal,
                site_id: slot.tag,
                call_seq: slot.tag2,
                mode,
                metrics: sketch::slot_metrics(&slot),
                rows_checked: slot.rows_checked,
                sketch_seed: 0,
                sketch_prod,
                sketch_ref,
                logits: sketch::slot_logits(&slot),
                logits_rows: sketch::slot_logits_row(&slot).into_iter().collect(),
                flags: f,
                diagnosis: None,
            })));
        }
        self.poll_diagnoses(diagnosis_slots, out);
    }

    fn event_recording(&self, stream: u64) {
        // A copy pending after the stream's last checked GEMM joins the stream now, in front of
        // everything captured since its GEMM, so the event (and whatever waits for it on another
        // stream) comes after it. Another thread must not add nodes to the capture's graph:
        // there the copy and its check are dropped (counted), never left unordered.
        let stream = Stream(stream);
        let copy = self.copies.lock().unwrap_or_else(|e| e.into_inner()).take(stream.0);
        let Some(copy) = copy else { return };
        if copy.thread != std::thread::current().id()
            || !copy.settles_in(self.runtime.capture_id(stream).ok().flatten())
        {
            super::note_skip(COPY_DROPPED);
            return;
        }
        self.add_copy(copy, true, true);
    }

    fn stream_destroyed(&self, stream: u64) {
        let stream = Stream(stream);
        // Its scratch may not serve a later stream of the same handle while the last check
        // here still runs (their counters would mix): it goes once that check has run.
        for site in self.sites.lock().unwrap_or_else(|e| e.into_inner()).values_mut() {
            if site.stream_cache.as_ref().is_some_and(|(s, _)| *s == stream) {
                site.stream_cache = None;
            }
        }
        let scratches: Vec<Arc<SketchScratch>> = {
            let mut shared = self.stream_scratch.lock().unwrap_or_else(|e| e.into_inner());
            let keys: Vec<StreamScratchKey> = shared.keys().filter(|k| k.0 == stream.0).copied().collect();
            keys.iter().filter_map(|k| shared.remove(k)).collect()
        };
        // Given back behind an event recorded on the stream, which only this backend's context
        // and a stream not capturing allow (a capturing stream's record would be a graph node,
        // never done before the stream's last check ran). Otherwise kept for good.
        let here = self.context.is_some() && self.runtime.current_context() == self.context;
        let retirable = here && self.runtime.is_capturing(stream).ok() == Some(false);
        for scratch in scratches {
            match Arc::try_unwrap(scratch) {
                Ok(scratch) if retirable => self.checker.retire_scratch(scratch, stream),
                Ok(scratch) => std::mem::forget(scratch),
                // A check being prepared right now holds it too: never given back (its last
                // holder cannot know when the GPU is done with it).
                Err(shared) => std::mem::forget(shared),
            }
        }
        // Its graph scratch may serve another capturing stream: graphs checking in it are
        // replayed in turn with the new stream's (the assumption every captured check makes).
        {
            let mut shared = self.graph_scratch.lock().unwrap_or_else(|e| e.into_inner());
            let keys: Vec<StreamScratchKey> =
                shared.taken.keys().filter(|k| k.0 == stream.0).copied().collect();
            for key in keys {
                if let Some(s) = shared.taken.remove(&key) {
                    shared.spare.entry(key.1).or_default().push(s);
                }
            }
        }
        // A copy pending on it (a capture never ended) can never be added.
        if self.copies.lock().unwrap_or_else(|e| e.into_inner()).take(stream.0).is_some() {
            super::note_skip(COPY_DROPPED);
        }
        let mut sites = self.sites.lock().unwrap_or_else(|e| e.into_inner());
        for site in sites.values_mut() {
            // Its checks' events can no longer be recorded there: the projection is kept when
            // replaced instead (as for one used from too many streams).
            if site.weight_streams.as_ref().is_some_and(|s| s.contains(&stream)) {
                site.weight_streams = None;
            }
        }
    }

    fn capture_ending(&self, stream: u64) -> Option<(u64, u64)> {
        let stream = Stream(stream);
        let captured = self.runtime.capture_graph(stream);
        let ended = captured.as_ref().ok().and_then(|c| c.map(|(id, _)| id));
        self.largest_weights.lock().unwrap_or_else(|e| e.into_inner()).end(ended, stream.0);
        let Ok(Some((id, graph))) = captured else {
            // An invalidated capture ends with nothing to add to: its copy pending on this
            // stream goes, counted (its deferred checks are counted when pushed out).
            if self.copies.lock().unwrap_or_else(|e| e.into_inner()).take(stream.0).is_some() {
                super::note_skip(COPY_DROPPED);
            }
            return None;
        };
        // Copies still pending go in front of everything captured after their GEMMs. No later
        // GEMM of their streams reached before_call (which settles a pending copy), so theirs
        // are the last checked GEMMs: their checks start right after the copies, beside the
        // capture's last kernels (a decode step's argmax and token bookkeeping after the
        // vocabulary projection) instead of after them.
        let pending = self.copies.lock().unwrap_or_else(|e| e.into_inner()).take_capture(id);
        let last_copies: Vec<crate::device::GraphNode> = pending
            .into_iter()
            .filter_map(|copy| {
                let into_stream = copy.stream == stream.0;
                self.add_copy(copy, into_stream, true)
            })
            .collect();
        let checks = self.deferred.lock().unwrap_or_else(|e| e.into_inner()).take(id);
        // The others branch from the capture's last work: after every production kernel of a
        // replay.
        self.add_deferred_checks(checks, stream, &last_copies);
        Some((graph, id))
    }

    fn dropped(&self) -> u64 {
        self.checker.with_ring(|r| r.dropped())
    }

    fn early_launches(&self) -> u64 {
        self.checker.early_launches()
    }

    fn inject_before(&self, request: &InjectRequest) -> Result<Injected, Skip> {
        self.inject_before_impl(request)
    }

    fn inject_after(&self, request: &InjectRequest, saved: Injected) -> Result<(), Skip> {
        self.inject_after_impl(request, saved)
    }

    /// `CheckRequest::diagnose` is ignored here: results come back later, and the engine asks
    /// for a diagnosis on a later call of a failing site.
    fn diagnose(&self, request: &CheckRequest) -> Result<(), Skip> {
        self.diagnose_impl(request)
    }
}

/// The first call number whose check surely reads a projection made by call `call_seq`, given
/// the largest number of the site's checks enqueued before it: the higher of the two. A check
/// of a number between them may have read the new projection too; a change it finds is then
/// found again by a later check (a short delay, never a change counted twice).
fn projected_from(call_seq: u64, latest_call: Option<u64>) -> u64 {
    latest_call.map_or(call_seq, |l| call_seq.max(l.saturating_add(1)))
}

/// Distinct changes of B after which a site is checked in rows mode instead.
const WEIGHT_CHANGES_FOR_ROWS: u32 = 2;

/// What sketch results said of a site's B changing under the same pointer. Several checks of
/// one projection may all find the same change (the calls enqueued before the poller read the
/// first report): that is one change, and a weight reloaded once stays a weight. Only a change
/// found by a check of a projection made after the previous change counts again.
#[derive(Debug, Default, Clone, Copy)]
struct WeightChanges {
    /// Changes found, each by a check of a projection made after the previous one.
    distinct: u32,
    /// A change found that the site has not re-projected for yet.
    pending: bool,
    /// The call from which the site's checks use its current projection.
    projected_from: u64,
}

impl WeightChanges {
    /// The check of call `call_seq` found B changed since the projection it used.
    fn found(&mut self, call_seq: u64) {
        if call_seq >= self.projected_from && !self.pending {
            self.distinct += 1;
            self.pending = true;
        }
    }
}

fn status_reason(status: u32) -> String {
    let s = abi::status::OUT_OF_BOUNDS;
    if status & s != 0 {
        "device check: index out of bounds".into()
    } else if status & abi::status::BAD_DESCRIPTOR != 0 {
        "device check: bad descriptor".into()
    } else if status & abi::status::NONLINEAR != 0 {
        "device check: non-linear epilogue in a sketch".into()
    } else if status & abi::status::WEIGHT_CHANGED != 0 {
        "sketch: the weight (B) changed since its projection; re-projected at its next call outside a graph capture (checks captured before report this until captured again)".into()
    } else if status & abi::status::BAD_SCALAR != 0 {
        "device check: d_scale zero or non-finite".into()
    } else {
        format!("device check: status {status:#x}")
    }
}

#[cfg(test)]
#[path = "gpu_capture_tests.rs"]
mod gpu_capture_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::fake::FakeRuntime;
    use crate::device::GraphNode;
    use crate::formats::Format;
    use std::sync::atomic::Ordering;

    #[test]
    fn a_failed_compile_is_a_skip_and_is_not_tried_again() {
        // Synchronous compiles (QUANTSHADOW_COMPILE=sync) once retried on every call: seconds of
        // NVRTC per sampled GEMM in the host's thread when a program cannot compile.
        let rt = Arc::new(FakeRuntime::default()); // its compiler always fails
        for sync_compile in [true, false] {
            let settings = GpuSettings {
                pool_bytes: 1 << 20,
                ring_capacity: 16,
                sync_compile,
                sketch_detach: SketchDetach::Off,
                graph_select: false,
                side_stream: false,
                kernels: Default::default(),
            };
            let before = rt.compiles.load(Ordering::SeqCst);
            let backend = GpuBackend::new(rt.clone(), "fake", &settings).unwrap();
            let build = KernelBuild::sketch(Format::Bf16, Format::Bf16, Format::Bf16).unwrap();
            let mut reasons = vec![];
            for _ in 0..50 {
                match backend.program_ready(&build, false) {
                    Err(ProgramWait::Failed(s)) => reasons.push(s.0),
                    Err(ProgramWait::NotReady(_)) => std::thread::sleep(std::time::Duration::from_millis(2)),
                    Ok(()) => panic!("a program that cannot compile reported ready"),
                }
                if reasons.len() == 5 {
                    break;
                }
            }
            assert_eq!(reasons.len(), 5, "sync {sync_compile}: every call after the failure skips");
            assert!(reasons.iter().all(|r| r.starts_with("kernel compile failed")), "{reasons:?}");
            assert_eq!(rt.compiles.load(Ordering::SeqCst) - before, 1, "sync {sync_compile}: compiled once");
        }
    }

    #[test]
    fn eager_checks_cover_every_row_of_a_prefill_between_decode_calls() {
        use crate::sketch::RowSample;
        let (prefill, decode) = (RowSample::new(7, 1024, 256), RowSample::new(7, 1, 256));
        let mut next = 0;
        let mut seen = std::collections::HashSet::new();
        for _ in 0..4 {
            let rows = eager_rows(&prefill, &mut next);
            assert_eq!((rows.epoch_ptr, rows.advance_epoch, rows.mode), (0, 0, abi::ROWS_WINDOW));
            // The device's rows: the window at `stride`, which is the epoch's.
            let window: Vec<u64> =
                (0..rows.count).map(|t| prefill.perm.apply((rows.stride + t) % rows.total_rows)).collect();
            assert_eq!(window, prefill.rows(rows.epoch_value));
            seen.extend(window);
            // The request's other 127 tokens at the same site: every row, no epoch used up
            // (counted, the prefills' epochs would be 128 apart: the same window each time).
            for _ in 0..127 {
                assert_eq!(eager_rows(&decode, &mut next).mode, abi::ROWS_ALL);
            }
        }
        assert_eq!(next, 4);
        assert_eq!(seen.len(), 1024, "four prefill checks of 256 rows cover all 1024 rows");
    }

    /// A bf16 `F.linear`-shaped call of M x N x K on stream 7, its buffers in `rt`'s memory.
    fn bf16_call(rt: &FakeRuntime, (m, n, k): (u64, u64, u64)) -> crate::intercept::InterceptedGemm {
        use crate::problem::{GemmBuffers, GemmProblem};
        let alloc = |elems: u64| rt.malloc(elems as usize * 2).unwrap();
        crate::intercept::InterceptedGemm {
            entry: "cublasGemmEx",
            problem: GemmProblem::row_major(m, n, k, Format::Bf16, Format::Bf16, Format::Bf16),
            buffers: GemmBuffers { a: alloc(m * k), b: alloc(k * n), d: alloc(m * n), ..Default::default() },
            stream: 7,
            pointer_arrays: None,
        }
    }

    /// A backend over `rt` with a 64 MiB pool, otherwise [`fake_settings`].
    fn roomy_backend(rt: &Arc<FakeRuntime>) -> GpuBackend {
        let mut settings = fake_settings();
        settings.pool_bytes = 64 << 20;
        GpuBackend::new(rt.clone(), "fake", &settings).unwrap()
    }

    /// A small pool and ring, synchronous compiles, the default detach policy.
    fn fake_settings() -> GpuSettings {
        GpuSettings {
            pool_bytes: 1 << 20,
            ring_capacity: 16,
            sync_compile: true,
            sketch_detach: SketchDetach::Graphs,
            graph_select: false,
            side_stream: false,
            kernels: Default::default(),
        }
    }

    #[test]
    fn eager_checks_beyond_a_sites_first_row_counts_share_their_streams_scratch() {
        // A server's batch sizes change from step to step: past a site's first
        // ROW_STATES_PER_SITE row counts (or once the pool is three quarters full), its eager
        // checks run in their stream's scratch, which two sites on one stream share.
        // With the side stream, eager calls also set up detached state for later captures.
        for (pool_mib, side_stream) in [(256, false), (16, false), (256, true), (16, true)] {
            let rt = Arc::new(FakeRuntime::with_kernels());
            rt.context.store(0xc0de, Ordering::Relaxed);
            let mut settings = fake_settings();
            (settings.pool_bytes, settings.side_stream) = (pool_mib << 20, side_stream);
            let backend = GpuBackend::new(rt.clone(), "fake", &settings).unwrap();
            let thresholds = crate::thresholds::Thresholds::default();
            let (first, second) = (bf16_call(&rt, (80, 256, 512)), bf16_call(&rt, (80, 256, 512)));
            let site_of = |call: &crate::intercept::InterceptedGemm| crate::engine::sites::Sites::id_of(call);
            let check = |call: &crate::intercept::InterceptedGemm, m: u64, stream: u64| {
                let mut call = call.clone();
                (call.problem.m, call.stream) = (m, stream);
                let req = CheckRequest {
                    site_id: site_of(&call),
                    ..CheckRequest::sketch_for_test(&call, &thresholds)
                };
                rt.take_log();
                let checked = backend.after_call(&req, PreCall::default());
                let checks = |l: &String| {
                    l.starts_with("launch qs_sketch_check") || l.starts_with("launch qs_sketch_lean")
                };
                (checked, rt.take_log().into_iter().filter(checks).count())
            };
            for m in 1..=70 {
                for site in [&first, &second] {
                    let (checked, launched) = check(site, m, 7);
                    checked.unwrap_or_else(|s| panic!("{pool_mib} MiB, m = {m}: {}", s.0));
                    assert_eq!(launched, 1, "{pool_mib} MiB, m = {m}: one check launched");
                }
            }
            let (own, shared) = {
                let sites = backend.sites.lock().unwrap();
                let s = &sites[&site_of(&first)];
                (s.sketch_rows.values().filter(|s| s.scratch.is_some()).count(), s.shared_counts.len())
            };
            assert_eq!(own + shared, 70, "{pool_mib} MiB");
            assert!(own <= ROW_STATES_PER_SITE && shared > 0, "{pool_mib} MiB: {own} own, {shared} shared");
            let pool = backend.checker.pool().unwrap().stats();
            assert!(pool.in_use <= pool.capacity, "{pool:?}");
            assert_eq!(backend.stream_scratch.lock().unwrap().len(), 1, "one scratch for the stream");
            // Another stream has its own; a per-thread default stream's checks keep their own
            // scratch (no hook tells when one ends).
            check(&first, 75, 9).0.unwrap();
            let _ = check(&first, 76, PER_THREAD_STREAM.0);
            assert_eq!(backend.stream_scratch.lock().unwrap().len(), 2);
            // A capture of a row count checked in the stream's scratch is checked in the
            // capturing stream's graph scratch where the count got its gates, else says why
            // it is skipped.
            let (shared_count, gated) = {
                let sites = backend.sites.lock().unwrap();
                let s = &sites[&site_of(&first)];
                let count = *s.shared_counts.keys().next().unwrap();
                (count, s.sketch_rows.get(&count).is_some_and(|s| s.scratch.is_none()))
            };
            rt.begin_capture(Stream(7));
            // (With the side stream, a size whose detached state was set up while the pool had
            // room is captured detached.)
            match check(&first, shared_count, 7).0 {
                Err(skip) => assert_eq!(skip.0, CAPTURE_NO_ROOM_FOR_ROW_COUNT),
                Ok(()) => assert!(side_stream || gated, "{pool_mib} MiB: captured without state"),
            }
            rt.end_capture(Stream(7));
            // A destroyed stream's scratch goes back to the pool once its last check has run;
            // from another context, or while the stream captures, it is kept for good (no event
            // could tell when that check has run).
            check(&first, 75, 11).0.unwrap();
            check(&first, 75, 13).0.unwrap();
            let held = backend.checker.held_sets();
            backend.stream_destroyed(9);
            assert_eq!(backend.stream_scratch.lock().unwrap().len(), 3);
            assert_eq!(backend.checker.held_sets(), held + 1, "held behind the stream's work");
            rt.begin_capture(Stream(11));
            backend.stream_destroyed(11);
            rt.end_capture(Stream(11));
            rt.context.store(0xbad, Ordering::Relaxed);
            backend.stream_destroyed(13);
            rt.context.store(0xc0de, Ordering::Relaxed);
            assert_eq!(backend.stream_scratch.lock().unwrap().len(), 1);
            assert_eq!(backend.checker.held_sets(), held + 1, "neither given back");
            // Later calls of a row count checked in the stream's scratch take the cached scratch.
            let (_, launched) = check(&first, shared_count, 7);
            assert_eq!(launched, 1);
        }
    }

    #[test]
    fn captures_of_row_counts_without_scratch_of_their_own_share_their_streams_graph_scratch() {
        // A server warms up and captures many batch sizes over many sites: once the pool is
        // three quarters full, eager calls of a new size get gates only, and that size's
        // captured checks run in their capturing stream's graph scratch instead of being skipped.
        let rt = Arc::new(FakeRuntime::with_kernels());
        rt.context.store(0xc0de, Ordering::Relaxed);
        let mut settings = fake_settings();
        settings.pool_bytes = 24 << 20;
        let backend = GpuBackend::new(rt.clone(), "fake", &settings).unwrap();
        let thresholds = crate::thresholds::Thresholds::default();
        // Wide enough for the scratch of the first sizes to fill the pool (16 splits).
        let sites = [bf16_call(&rt, (80, 2048, 2048)), bf16_call(&rt, (80, 2048, 1024))];
        let gate = Some(crate::engine::config::Sampling { first: 0, every: 10 });
        let probes = CheckRequest::sketch_for_test(&sites[0], &thresholds).sketch.probes;
        let kp = abi::padded_probes(probes).unwrap();
        let site_id = |site: usize| crate::engine::sites::Sites::id_of(&sites[site]);
        let check = |site: usize, m: u64, stream: u64, captured: bool| {
            let mut call = sites[site].clone();
            (call.problem.m, call.stream) = (m, stream);
            let req = CheckRequest {
                site_id: crate::engine::sites::Sites::id_of(&call),
                device_gate: if captured { gate } else { None },
                ..CheckRequest::sketch_for_test(&call, &thresholds)
            };
            backend.after_call(&req, PreCall::default())
        };
        // (own scratch's partials, gates) of a site's row count.
        let state_of = |site: usize, m: u64| {
            let all = backend.sites.lock().unwrap();
            let state = &all[&site_id(site)].sketch_rows[&m];
            (state.scratch.as_ref().map(|s| s.partials_ptr()), state.gates)
        };
        // Warm-up: every size eagerly on stream 7 (the pool fills with the first sizes' scratch).
        for m in 1..=100 {
            for site in 0..2 {
                check(site, m, 7, false).unwrap_or_else(|s| panic!("m = {m}: {}", s.0));
            }
        }
        let own: Vec<u64> = (1..=100).filter(|&m| state_of(0, m).0.is_some()).collect();
        assert!(!own.is_empty() && own.len() < 100, "{} own", own.len());
        let pool = backend.checker.pool().unwrap();
        assert!(pool.stats().in_use <= pool.stats().capacity);
        assert_eq!(backend.graph_scratch.lock().unwrap().made(kp), GRAPH_SCRATCH_SPARES);
        // Capture every size on stream 21 (as vLLM's graph stream): each is checked in the graph,
        // and the capture allocates nothing.
        *rt.record_params.lock().unwrap() =
            Some(("qs_sketch_check".into(), size_of::<abi::QsSketchParams>()));
        let before = (pool.stats().in_use, pool.stats().blocks);
        let capture = rt.begin_capture(Stream(21));
        rt.take_log();
        for m in 1..=100 {
            for site in 0..2 {
                check(site, m, 21, true).unwrap_or_else(|s| panic!("captured m = {m}: {}", s.0));
            }
        }
        let launches: Vec<String> =
            rt.take_log().into_iter().filter(|l| l.contains("qs_sketch_check")).collect();
        let graph = rt.end_capture(Stream(21));
        assert_eq!(graph.capture, capture);
        assert_eq!(graph.labelled("qs_sketch_check").len(), 200, "one check node per captured call");
        assert_eq!((pool.stats().in_use, pool.stats().blocks), before, "nothing allocated while capturing");
        let shared = backend.graph_scratch.lock().unwrap().taken[&(21, kp)].partials_ptr();
        let params = std::mem::take(&mut *rt.params.lock().unwrap());
        assert_eq!((params.len(), launches.len()), (200, 200));
        for m in 1..=100u64 {
            for (site, call) in sites.iter().enumerate() {
                let n = 2 * (m as usize - 1) + site;
                // SAFETY: recorded from a qs_sketch_check launch, whose parameter is a QsSketchParams.
                let p: abi::QsSketchParams = unsafe { std::ptr::read_unaligned(params[n].2.as_ptr().cast()) };
                let (own_partials, gates) = state_of(site, m);
                // Each count's own gates (the general kernel's counter), and the scratch of its
                // own or else the stream's graph scratch.
                assert_eq!(p.gate_ptr, gates, "m = {m}, site {site}");
                assert_eq!(p.partials_ptr, own_partials.unwrap_or(shared), "m = {m}, site {site}");
                // The grid a check of this count has whichever scratch it runs in: one counter
                // never sees two grids.
                let (k, n_dim) = (call.problem.k, call.problem.n);
                let info = &backend.checker.info;
                let geometry =
                    abi::SketchGeometry::new(m, k, n_dim, probes, info.multiprocessors, info.warp_size)
                        .unwrap();
                let [x, y, z] = geometry.launch.grid;
                assert!(launches[n].contains(&format!(" {x}x{y}x{z} on 21")), "m = {m}: {}", launches[n]);
            }
        }
        // Every count of a site counts its own launches.
        for site in 0..2 {
            let mut gates: Vec<u64> = (1..=100).map(|m| state_of(site, m).1).collect();
            gates.sort_unstable();
            gates.dedup();
            assert_eq!(gates.len(), 100, "site {site}: one counter pair per count");
        }
        // A graph forking to another stream: its checks there need another spare, which only
        // an eager check after the capture makes; later forks have it.
        let fork = |expect_checked: bool| {
            rt.begin_capture(Stream(21));
            let e = rt.create_event().unwrap();
            rt.record_event(e, Stream(21)).unwrap();
            rt.wait_event(Stream(23), e).unwrap();
            check(0, 100, 21, true).unwrap();
            let forked = check(0, 100, 23, true);
            rt.end_capture(Stream(21));
            match expect_checked {
                true => forked.unwrap(),
                false => assert_eq!(forked.unwrap_err().0, CAPTURE_NO_GRAPH_SCRATCH),
            }
        };
        fork(false);
        check(0, 100, 7, false).unwrap();
        fork(true);
        {
            let shared = backend.graph_scratch.lock().unwrap();
            let (a, b) = (&shared.taken[&(21, kp)], &shared.taken[&(23, kp)]);
            assert_ne!(a.partials_ptr(), b.partials_ptr(), "forked branches never share scratch");
        }
        // A per-thread default stream is one handle for every thread: never shared.
        rt.begin_capture(PER_THREAD_STREAM);
        assert_eq!(check(0, 100, PER_THREAD_STREAM.0, true).unwrap_err().0, CAPTURE_PER_THREAD_STREAM);
        rt.end_capture(PER_THREAD_STREAM);
        // A destroyed capturing stream's scratch serves the next one.
        let forked = backend.graph_scratch.lock().unwrap().taken[&(23, kp)].partials_ptr();
        backend.stream_destroyed(23);
        rt.begin_capture(Stream(25));
        check(0, 100, 25, true).unwrap();
        rt.end_capture(Stream(25));
        assert_eq!(backend.graph_scratch.lock().unwrap().taken[&(25, kp)].partials_ptr(), forked);
        assert!(backend.graph_scratch.lock().unwrap().made(kp) <= GRAPH_SCRATCH_STREAMS);
        // A count set up with gates only keeps them: an eager call on another stream uses that
        // stream's scratch; one on a stream without (a per-thread default stream) gets scratch
        // of its own, still with the gates its graphs hold.
        let gated = 100;
        let (none, gates) = state_of(0, gated);
        assert!(none.is_none());
        check(0, gated, 9, false).unwrap();
        assert_eq!(state_of(0, gated), (None, gates));
        check(0, gated, PER_THREAD_STREAM.0, false).unwrap();
        let (own_now, gates_now) = state_of(0, gated);
        assert!(own_now.is_some() && gates_now == gates);
    }

    #[test]
    fn a_streams_scratch_holds_every_check_up_to_its_rows() {
        let rt = Arc::new(FakeRuntime::with_kernels());
        let mut settings = fake_settings();
        settings.pool_bytes = 64 << 20;
        let backend = GpuBackend::new(rt, "fake", &settings).unwrap();
        let info = &backend.checker.info;
        for probes in [8, 16, 32] {
            let scratch = backend.checker.sketch_scratch_up_to(256, probes).unwrap();
            for rows in 1..=256 {
                for (k, n) in [(1, 1), (64, 64), (512, 256), (4096, 4096), (4096, 14336), (1 << 20, 1 << 20)]
                {
                    let geometry = crate::device::abi::SketchGeometry::new(
                        rows,
                        k,
                        n,
                        probes,
                        info.multiprocessors,
                        info.warp_size,
                    )
                    .unwrap();
                    assert!(scratch.fits(&geometry), "{rows} rows of {k} x {n}, k = {probes}");
                    let own = backend.checker.sketch_scratch(rows, k, n, probes, false).unwrap();
                    assert!(own.fits(&geometry), "a check's own scratch holds it");
                }
            }
            let beyond = crate::device::abi::SketchGeometry::new(
                4096,
                64,
                64,
                probes,
                info.multiprocessors,
                info.warp_size,
            )
            .unwrap();
            assert!(!scratch.fits(&beyond), "more rows than it was made for");
        }
    }

    #[test]
    fn split_buffers_taken_in_turn_wait_for_their_last_finishing_and_are_never_grown() {
        // Two slots, both with a finishing still queued (no event done). Taking the oldest makes
        // the stream wait for its finishing; a taker that then enqueues nothing (a fallback to
        // the fused check) leaves it pending, so its next taker waits for that finishing too.
        let rt = Arc::new(FakeRuntime::with_kernels());
        let backend = roomy_backend(&rt);
        let mut buffers = EagerSnapshots::default();
        let st = Stream(7);
        let mut take = |bytes: u64| {
            buffers.take_in_turn(rt.as_ref(), &backend.checker, bytes, 2, st).unwrap().map(|slot| {
                let was = slot.pending;
                slot.pending = true; // as if its projections and finishing were enqueued
                was
            })
        };
        assert_eq!((take(4096), take(4096)), (Some(false), Some(false))); // new slots: events 1-4
        rt.take_log();
        assert_eq!(take(4096), Some(true)); // slot 0 (done = event 2)
        assert_eq!(take(4096), Some(true)); // slot 1 (done = event 4)
        assert_eq!(rt.take_log(), ["7 waits 2", "7 waits 4"]);
        // A larger request than the oldest slot holds: refused, never grown, no wait.
        assert_eq!(take(1 << 20), None);
        assert!(rt.take_log().is_empty());
        // Finishings seen done: no wait.
        rt.events_done.store(true, Ordering::SeqCst);
        assert_eq!(take(4096), Some(true));
        assert!(rt.take_log().is_empty());
        // A slot whose first allocation failed (more than the pool) gets a buffer on its turn.
        let mut one = EagerSnapshots::default();
        assert!(one.take_in_turn(rt.as_ref(), &backend.checker, 1 << 40, 1, st).is_err());
        let slot = one.take_in_turn(rt.as_ref(), &backend.checker, 4096, 1, st).unwrap().expect("its turn");
        assert!(slot.buffer.as_ref().is_some_and(|b| b.bytes >= 4096));
    }

    #[test]
    fn an_eager_check_of_many_rows_is_split_while_a_buffer_is_free() {
        // A 1024-row bf16 call (256 rows sampled) on a device with the lean check: with split
        // checks on, the projections go on the caller's stream and the finishing on the side
        // stream behind an event. The buffers are taken in turn: once all exist, the oldest, and
        // while its finishing may still run, the caller's stream first waits for it (never the
        // fused check for want of a buffer). With split checks off, the fused check always;
        // under `auto`, for GEMMs below SPLIT_AUTO_MIN_FLOPS.
        use crate::device::fake::SIDE_STREAM;
        use crate::device::gpu::SplitUse;
        use crate::problem::GemmProblem;
        const SMALL: (u64, u64, u64) = (1024, 256, 512);
        // `first_m`: the first SPLIT_BUFFERS calls with this many rows instead (same buffers).
        let run_with = |split: SplitUse,
                        (m, n, k): (u64, u64, u64),
                        calls: u64,
                        done_after: Option<u64>,
                        first_m: Option<u64>|
         -> Vec<String> {
            let rt = Arc::new(FakeRuntime::with_kernels());
            let mut settings = fake_settings();
            settings.pool_bytes = 64 << 20;
            settings.side_stream = true;
            settings.kernels.split = split;
            let backend = GpuBackend::new(rt.clone(), "fake", &settings).unwrap();
            let call = bf16_call(&rt, (m, n, k));
            let thresholds = crate::thresholds::Thresholds::default();
            let mut kernels = Vec::new();
            for seq in 0..calls {
                rt.events_done.store(done_after.is_some_and(|d| seq >= d), Ordering::SeqCst);
                let m_now = if (seq as usize) < SPLIT_BUFFERS { first_m.unwrap_or(m) } else { m };
                let call = crate::intercept::InterceptedGemm {
                    problem: GemmProblem::row_major(m_now, n, k, Format::Bf16, Format::Bf16, Format::Bf16),
                    ..call.clone()
                };
                let req = CheckRequest { call_seq: seq, ..CheckRequest::sketch_for_test(&call, &thresholds) };
                backend
                    .after_call(&req, PreCall::default())
                    .unwrap_or_else(|s| panic!("call {seq}: {}", s.0));
                // What this call enqueued after its set-up (the weight's projection on the first).
                let log = rt.take_log();
                let check: Vec<&String> = log
                    .iter()
                    .skip_while(|l| {
                        !l.contains("qs_sketch_lean")
                            && !l.contains("qs_sketch_proj")
                            && !l.starts_with("7 waits")
                    })
                    .collect();
                kernels.push(check.iter().map(|l| l.as_str()).collect::<Vec<_>>().join(" | "));
            }
            kernels
        };
        let run = |split, shape, calls, done_after| run_with(split, shape, calls, done_after, None);
        let side = SIDE_STREAM.0;
        let fused = "launch qs_sketch_lean_bf16_bf16 8x8x1 on 7";
        // 8 row groups of 8 splits each: the projections, the finishing and the fused check.
        // Buffer b has events copied = 2b + 1 and done = 2b + 2.
        let split_into = |b: usize| {
            format!(
                "launch qs_sketch_proj_bf16_bf16 8x8x1 on 7 | record {} on 7 | {side} waits {} | launch qs_sketch_fin_bf16_bf16 8x8x1 on {side} | record {} on {side}",
                2 * b + 1,
                2 * b + 1,
                2 * b + 2
            )
        };
        // No finishing ever seen done: SPLIT_BUFFERS new buffers, then the oldest again, each
        // behind a wait of the caller's stream for its last finishing.
        let calls = run(SplitUse::On, SMALL, SPLIT_BUFFERS as u64 + 2, None);
        assert_eq!(calls[0], split_into(0));
        for (b, call) in calls[..SPLIT_BUFFERS].iter().enumerate() {
            assert_eq!(*call, split_into(b));
        }
        assert_eq!(calls[SPLIT_BUFFERS], format!("7 waits 2 | {}", split_into(0)));
        assert_eq!(calls[SPLIT_BUFFERS + 1], format!("7 waits 4 | {}", split_into(1)));
        // Finishings seen done: the oldest buffer is taken again without a wait.
        let calls = run(SplitUse::On, SMALL, SPLIT_BUFFERS as u64 + 2, Some(SPLIT_BUFFERS as u64 + 1));
        assert_eq!(calls[SPLIT_BUFFERS], format!("7 waits 2 | {}", split_into(0)));
        assert_eq!(calls[SPLIT_BUFFERS + 1], split_into(1));
        // Buffers first taken by 64-row calls hold a whole sample: a later 256-row call still
        // splits into the oldest one (a grown buffer could free memory its finishing reads).
        let calls = run_with(SplitUse::On, SMALL, SPLIT_BUFFERS as u64 + 1, None, Some(64));
        assert!(calls[0].starts_with("launch qs_sketch_proj_bf16_bf16 2x8x1 on 7"), "{calls:?}");
        assert_eq!(calls[SPLIT_BUFFERS], format!("7 waits 2 | {}", split_into(0)));
        // Off: the fused check every time.
        assert_eq!(run(SplitUse::Off, SMALL, 3, None), [fused, fused, fused]);
        // Auto: GEMMs of 2^28 and 2^34 flops keep the fused check, one of 2^35 (4096 x 4096 x
        // 1024, 256 of its rows sampled: the same 8 groups) is split.
        assert_eq!(run(SplitUse::Large, SMALL, 2, None), [fused, fused]);
        let fused_2_34 = run(SplitUse::Large, (4096, 2048, 1024), 1, None);
        assert!(fused_2_34[0].starts_with("launch qs_sketch_lean_"), "{fused_2_34:?}");
        assert_eq!(run(SplitUse::Large, (4096, 4096, 1024), 1, None), [split_into(0)]);
    }

    #[test]
    fn a_call_from_another_context_of_the_device_passes_through_untouched() {
        // A host with a context of its own beside the primary one (same device ordinal): the
        // backend's handles belong to the context it started in, so calls made in the other
        // one are skipped before anything is enqueued, captured or not.
        let rt = Arc::new(FakeRuntime::with_kernels());
        rt.context.store(0xc0de, Ordering::Relaxed);
        let backend = roomy_backend(&rt);
        let thresholds = crate::thresholds::Thresholds::default();
        let call = bf16_call(&rt, (16, 256, 512));
        let req = CheckRequest::sketch_for_test(&call, &thresholds);
        backend.after_call(&req, PreCall::default()).unwrap();
        rt.take_log();
        rt.context.store(0xbeef, Ordering::Relaxed);
        let skip = backend.after_call(&req, PreCall::default()).unwrap_err();
        assert_eq!(skip.0, OTHER_CONTEXT);
        assert!(matches!(backend.before_call(&req), Err(s) if s.0 == OTHER_CONTEXT));
        let capture = rt.begin_capture(Stream(7));
        assert_eq!(backend.after_call(&req, PreCall::default()).unwrap_err().0, OTHER_CONTEXT);
        rt.end_capture(Stream(7));
        assert!(rt.captured_graph(capture).unwrap().nodes.is_empty(), "nothing captured");
        assert!(rt.take_log().is_empty(), "nothing enqueued");
        // No current context at all: skipped too. Back in its own context, checked again.
        rt.context.store(0, Ordering::Relaxed);
        assert!(backend.after_call(&req, PreCall::default()).is_err());
        rt.context.store(0xc0de, Ordering::Relaxed);
        backend.after_call(&req, PreCall::default()).unwrap();
        assert!(rt.take_log().iter().any(|l| l.starts_with("launch qs_sketch")));
    }

    #[test]
    fn a_destroyed_stream_is_never_handed_to_the_driver_again() {
        // A site checked on streams 7 and 9 remembers both for its projection's retirement.
        // Once stream 7 is destroyed, replacing the projection records no event there (the
        // handle is dead, or another stream's): the old projection is kept instead.
        let replace_after = |destroy: Option<u64>| -> Vec<String> {
            let rt = Arc::new(FakeRuntime::with_kernels());
            let mut settings = fake_settings();
            settings.pool_bytes = 64 << 20;
            let backend = GpuBackend::new(rt.clone(), "fake", &settings).unwrap();
            let mut call = bf16_call(&rt, (16, 256, 512));
            let thresholds = crate::thresholds::Thresholds::default();
            let mut check = |seq: u64, stream: u64| {
                call.stream = stream;
                let req = CheckRequest { call_seq: seq, ..CheckRequest::sketch_for_test(&call, &thresholds) };
                backend
                    .after_call(&req, PreCall::default())
                    .unwrap_or_else(|s| panic!("call {seq}: {}", s.0));
                req.site_id
            };
            check(0, 7);
            let site = check(1, 9);
            if let Some(s) = destroy {
                backend.stream_destroyed(s);
            }
            // The device reported B changed: the next call re-projects and retires the old one.
            backend.weight_changes.lock().unwrap().entry(site).or_default().found(1);
            rt.take_log();
            check(2, 9);
            rt.take_log().into_iter().filter(|l| l.starts_with("record")).collect()
        };
        let kept = replace_after(None);
        assert!(kept.iter().any(|l| l.ends_with(" on 7")), "retired behind both streams: {kept:?}");
        assert!(kept.iter().any(|l| l.ends_with(" on 9")), "{kept:?}");
        let after_destroy = replace_after(Some(7));
        assert!(!after_destroy.iter().any(|l| l.ends_with(" on 7")), "{after_destroy:?}");
        // Another stream's destruction changes nothing.
        assert_eq!(replace_after(Some(11)), kept);
    }

    #[test]
    fn a_weight_set_up_failing_after_its_first_launch_never_waits_on_the_stream() {
        // The prep kernel is queued when the W_R launch is refused: its buffers are held behind
        // an event on the caller's stream (no synchronisation there) and go back to the pool
        // once a later set-up finds that event done.
        let rt = Arc::new(FakeRuntime::with_kernels());
        let backend = roomy_backend(&rt);
        let call = bf16_call(&rt, (16, 256, 512));
        let thresholds = crate::thresholds::Thresholds::default();
        let req = CheckRequest::sketch_for_test(&call, &thresholds);
        // Compile and load first (a synchronous compile may synchronise; it is not the point).
        *rt.fail_launches_of.lock().unwrap() = Some("qs_sketch_wproj".into());
        let _ = backend.after_call(&req, PreCall::default());
        rt.take_log();
        let skip = backend.after_call(&req, PreCall::default()).expect_err("W_R launch refused");
        assert!(skip.0.contains("sketch set-up"), "{}", skip.0);
        let log = rt.take_log();
        assert!(!log.iter().any(|l| l.starts_with("synchronize")), "{log:?}");
        let prep = log.iter().position(|l| l.starts_with("launch qs_sketch_prep")).expect("prep queued");
        assert!(log[prep + 1..].iter().any(|l| l.starts_with("record") && l.ends_with(" on 7")), "{log:?}");
        assert_eq!(backend.checker.held_sets(), 2, "both failed set-ups hold their buffers");
        // The prep kernels have run: the next set-up returns their buffers, and checks go on.
        rt.events_done.store(true, Ordering::SeqCst);
        *rt.fail_launches_of.lock().unwrap() = None;
        backend.after_call(&req, PreCall::default()).unwrap_or_else(|s| panic!("{}", s.0));
        assert_eq!(backend.checker.held_sets(), 0);
        assert!(!rt.take_log().iter().any(|l| l.starts_with("synchronize")));
    }

    #[test]
    fn one_change_reported_by_several_checks_counts_once() {
        // Calls 1-3 were enqueued against the projection of call 0 before the poller read the
        // first report: three reports, one change. The site re-projects at call 4; late reports
        // of checks before it change nothing, a report of a check of the new projection is a
        // second change (rows mode from then on).
        let mut w = WeightChanges::default();
        for seq in 1..=3 {
            w.found(seq);
        }
        assert_eq!((w.distinct, w.pending), (1, true));
        (w.pending, w.projected_from) = (false, 4);
        w.found(2);
        w.found(3);
        assert_eq!((w.distinct, w.pending), (1, false), "the change just handled");
        w.found(5);
        w.found(6);
        assert_eq!((w.distinct, w.pending), (2, true));
        assert!(w.distinct >= WEIGHT_CHANGES_FOR_ROWS);
    }

    #[test]
    fn a_change_reported_by_another_threads_late_check_counts_once() {
        // Two threads call one site: call 10's check was enqueued (against the first projection)
        // before call 8 reached the site and re-projected for the change call 9 found. Call 10's
        // report of that same change is not a second change.
        let rt = Arc::new(FakeRuntime::with_kernels());
        let backend = roomy_backend(&rt);
        let call = bf16_call(&rt, (16, 256, 512));
        let thresholds = crate::thresholds::Thresholds::default();
        let check = |seq: u64| -> Vec<String> {
            let req = CheckRequest { call_seq: seq, ..CheckRequest::sketch_for_test(&call, &thresholds) };
            rt.take_log();
            backend.after_call(&req, PreCall::default()).unwrap_or_else(|s| panic!("call {seq}: {}", s.0));
            rt.take_log()
        };
        let site = CheckRequest::sketch_for_test(&call, &thresholds).site_id;
        let changes = || *backend.weight_changes.lock().unwrap().get(&site).unwrap();
        let projects = |log: &[String]| log.iter().any(|l| l.starts_with("launch qs_sketch_wproj"));
        assert!(projects(&check(0)));
        check(10);
        backend.weight_changes.lock().unwrap().entry(site).or_default().found(9);
        assert!(projects(&check(8)), "re-projected for the change");
        assert_eq!(changes().projected_from, 11);
        backend.weight_changes.lock().unwrap().get_mut(&site).unwrap().found(10);
        assert_eq!((changes().distinct, changes().pending), (1, false), "the change just handled");
        let log = check(11);
        assert!(!projects(&log), "{log:?}");
        assert!(log.iter().any(|l| l.starts_with("launch qs_sketch")), "still a sketch: {log:?}");
        // A check of the new projection finding B changed again is a second change.
        backend.weight_changes.lock().unwrap().get_mut(&site).unwrap().found(11);
        assert_eq!((changes().distinct, changes().pending), (2, true));
        let log = check(12);
        assert!(!log.iter().any(|l| l.starts_with("launch qs_sketch")), "rows from now on: {log:?}");
        // One thread: a call re-projects after every lower number was enqueued.
        assert_eq!(projected_from(4, Some(3)), 4);
        assert_eq!(projected_from(4, None), 4);
        assert_eq!(projected_from(8, Some(10)), 11);
        assert_eq!(projected_from(8, Some(u64::MAX)), u64::MAX);
    }

    #[test]
    fn side_waits_allow_one_caller_stream_only() {
        let mut w = SideWaits::default();
        assert!(w.may_wait_on_side(Stream(7)));
        assert!(w.may_wait_on_side(Stream(7)));
        // Another stream is refused and leaves the first one its split checks.
        assert!(!w.may_wait_on_side(Stream(9)));
        assert!(w.may_wait_on_side(Stream(7)));
        // Side work of the first stream's own (a detached check) changes nothing.
        w.side_waits_for(Stream(7));
        assert!(w.may_wait_on_side(Stream(7)));
        // Side work waiting for another stream ends it for every stream.
        w.side_waits_for(Stream(9));
        assert!(!w.may_wait_on_side(Stream(7)));
        assert!(!w.may_wait_on_side(Stream(9)));
        // The per-thread default stream is one handle for many streams: never.
        let mut w = SideWaits::default();
        assert!(!w.may_wait_on_side(PER_THREAD_STREAM));
        assert!(w.may_wait_on_side(Stream(0)));
        w.side_waits_for(PER_THREAD_STREAM);
        assert!(!w.may_wait_on_side(Stream(0)));
    }

    #[test]
    fn split_checks_stay_with_one_caller_stream() {
        // Calls of two caller streams (7, then 9): 7 splits; 9 gets the fused check, with no
        // wait on the side stream, whose work waits for 7 alone; 7 keeps splitting.
        use crate::device::gpu::SplitUse;
        use crate::problem::{GemmBuffers, GemmProblem};
        let rt = Arc::new(FakeRuntime::with_kernels());
        let mut settings = fake_settings();
        settings.pool_bytes = 64 << 20;
        settings.side_stream = true;
        settings.kernels.split = SplitUse::On;
        let backend = GpuBackend::new(rt.clone(), "fake", &settings).unwrap();
        let alloc = |elems: u64| rt.malloc(elems as usize * 2).unwrap();
        let (m, n, k) = (1024, 256, 512);
        let buffers = GemmBuffers { a: alloc(m * k), b: alloc(k * n), d: alloc(m * n), ..Default::default() };
        let thresholds = crate::thresholds::Thresholds::default();
        let mut launched = Vec::new();
        for (seq, stream) in [7u64, 9, 7, 9].into_iter().enumerate() {
            let call = crate::intercept::InterceptedGemm {
                entry: "cublasGemmEx",
                problem: GemmProblem::row_major(m, n, k, Format::Bf16, Format::Bf16, Format::Bf16),
                buffers,
                stream,
                pointer_arrays: None,
            };
            let req =
                CheckRequest { call_seq: seq as u64, ..CheckRequest::sketch_for_test(&call, &thresholds) };
            backend.after_call(&req, PreCall::default()).unwrap_or_else(|s| panic!("call {seq}: {}", s.0));
            let log = rt.take_log();
            let kernels: Vec<String> = log.iter().filter(|l| l.contains("qs_sketch_")).cloned().collect();
            assert!(!log.iter().any(|l| l.starts_with("9 waits")), "{log:?}");
            launched.push(kernels.join(" | "));
        }
        // (The first call also projects the weight.)
        let split = format!(
            "launch qs_sketch_proj_bf16_bf16 8x8x1 on 7 | launch qs_sketch_fin_bf16_bf16 8x8x1 on {}",
            crate::device::fake::SIDE_STREAM.0
        );
        for c in [0, 2] {
            assert!(launched[c].ends_with(&split), "{launched:?}");
        }
        assert_eq!(launched[1], "launch qs_sketch_lean_bf16_bf16 8x8x1 on 9", "{launched:?}");
        assert_eq!(launched[3], "launch qs_sketch_lean_bf16_bf16 8x8x1 on 9", "{launched:?}");
    }

    #[test]
    fn looking_up_loaded_sketch_entries_never_compiles() {
        // A checked call asks for the sketch program's entries without compiling: until the
        // program is loaded, the compile policy (background, or sync outside captures) decides.
        let rt = Arc::new(FakeRuntime::default()); // its compiler always fails
        let settings = fake_settings();
        let backend = GpuBackend::new(rt.clone(), "fake", &settings).unwrap();
        let before = rt.compiles.load(Ordering::SeqCst);
        let bf16 = Format::Bf16;
        for _ in 0..3 {
            assert!(backend.checker.loaded_sketch_entries(bf16, bf16, bf16, 32).is_none());
        }
        assert_eq!(rt.compiles.load(Ordering::SeqCst), before, "a lookup compiled");
        // The resolving call compiles (and fails here), and a failure is not remembered as entries.
        assert!(backend.checker.sketch_entries(bf16, bf16, bf16, 32).is_err());
        assert_eq!(rt.compiles.load(Ordering::SeqCst) - before, 1);
        assert!(backend.checker.loaded_sketch_entries(bf16, bf16, bf16, 32).is_none());
    }

    #[test]
    fn a_site_first_seen_inside_a_capture_is_skipped_with_its_own_reason() {
        // Llama's rotary outer product has a new B (a temporary) in every capture: the report
        // must say that, not a reason shared with a missing row count or weight projection.
        let rt = Arc::new(FakeRuntime::default());
        let settings = fake_settings();
        let backend = GpuBackend::new(rt, "fake", &settings).unwrap();
        let call = crate::intercept::InterceptedGemm {
            entry: "cublasSgemm_v2",
            problem: crate::problem::GemmProblem::row_major(1, 32, 1, Format::F32, Format::F32, Format::F32),
            buffers: crate::problem::GemmBuffers::default(),
            stream: 7,
            pointer_arrays: None,
        };
        let thresholds = crate::thresholds::Thresholds::default();
        let req = CheckRequest { site_ordinal: 60, ..CheckRequest::sketch_for_test(&call, &thresholds) };
        let mut sites = FxHashMap::default();
        let skip = backend.site_state(&mut sites, &req, true).err().expect("a capture cannot set a site up");
        assert_eq!(skip.0, CAPTURE_NEW_SITE);
        assert!(sites.is_empty(), "nothing half set up is kept");
        // The four capture reasons are distinct: the report counts skips by reason.
        let reasons = [CAPTURE_NEW_SITE, CAPTURE_STALE_WEIGHT, CAPTURE_NEW_ROW_COUNT, CAPTURE_NEW_C_COPY];
        let distinct: std::collections::HashSet<_> = reasons.iter().collect();
        assert_eq!(distinct.len(), reasons.len());
        assert!(reasons.iter().all(|r| r.starts_with("graph capture: ")));
    }

    #[test]
    fn a_copy_never_runs_beside_a_call_whose_writes_are_not_all_in_d() {
        let mut call = crate::intercept::InterceptedGemm {
            entry: "cublasLtMatmul",
            problem: crate::problem::GemmProblem::row_major(
                1,
                4096,
                4096,
                Format::Bf16,
                Format::Bf16,
                Format::Bf16,
            ),
            buffers: crate::problem::GemmBuffers { d: 0x10000, ..Default::default() },
            stream: 7,
            pointer_arrays: None,
        };
        let thresholds = crate::thresholds::Thresholds::default();
        let writes = |call: &crate::intercept::InterceptedGemm, rewrites_inputs| {
            call_writes(&CheckRequest { rewrites_inputs, ..CheckRequest::sketch_for_test(call, &thresholds) })
        };
        assert_eq!(writes(&call, false), Some(vec![(0x10000, 0x10000 + 4096 * 2)]), "D: one bf16 row");
        let with_workspace = call_writes(&CheckRequest {
            scratch: Some((0x50000, 0x60000)),
            ..CheckRequest::sketch_for_test(&call, &thresholds)
        });
        assert_eq!(
            with_workspace,
            Some(vec![(0x10000, 0x10000 + 4096 * 2), (0x50000, 0x60000)]),
            "and the workspace"
        );
        assert_eq!(writes(&call, true), None, "fault injection rewrites the inputs in place");
        call.buffers.amax_d = 0x20000;
        assert_eq!(writes(&call, false), None, "an amax output is written too");
        call.buffers.amax_d = 0;
        // D over C (beta 1): the shim's copy of C goes into a buffer a pending copy may read.
        call.problem.c = Some(call.problem.d);
        call.problem.beta = crate::problem::Scalar::Host(1.0);
        call.buffers.c = call.buffers.d;
        assert_eq!(writes(&call, false), None, "C copied first, in place");
        call.problem.beta = crate::problem::Scalar::Host(0.0);
        assert!(writes(&call, false).is_some(), "beta 0: C is not read, nothing copied");
        call.problem.beta = crate::problem::Scalar::Host(1.0);
        call.buffers.c = 0x30000;
        assert!(writes(&call, false).is_some(), "C apart from D: not overwritten");
    }

    #[test]
    fn a_replaced_ring_gives_its_descriptor_to_later_checks() {
        // Check parameters read the descriptor kept beside the ring (not under the poller's
        // lock): it must follow every replacement.
        let rt = Arc::new(FakeRuntime::default());
        let checker = crate::device::gpu::GpuChecker::new(rt, 8).unwrap();
        let first = checker.with_ring(|r| r.desc());
        let old = checker.replace_ring(4).unwrap();
        assert_eq!(old.desc(), first);
        let now = checker.with_ring(|r| r.desc());
        assert_ne!(now, first);
        assert_eq!(now.capacity, 4);
        assert_eq!(checker.ring_desc(), now);
        drop(checker.replace_ring_with(old));
        assert_eq!(checker.ring_desc(), first);
    }

    #[test]
    fn deferred_checks_wait_for_their_own_capture_end() {
        let mut d = DeferredChecks::<u32>::default();
        assert_eq!(d.push(7, 1), 0);
        assert_eq!(d.push(9, 2), 0);
        assert_eq!(d.push(7, 3), 0);
        assert_eq!(d.take(7), vec![1, 3], "in capture order, only capture 7's");
        assert!(d.take(7).is_empty(), "taken once");
        assert_eq!(d.take(9), vec![2]);
        // Captures whose end is never seen are given up, oldest first, and counted.
        for id in 0..DEFERRED_CAPTURES as u64 {
            assert_eq!(d.push(100 + id, 0), 0);
            assert_eq!(d.push(100 + id, 0), 0);
        }
        assert_eq!(d.push(1000, 5), 2, "the oldest capture's two checks make room");
        assert!(d.take(100).is_empty());
        assert_eq!(d.take(101).len(), 2);
        assert_eq!(d.take(1000), vec![5]);
    }

    #[test]
    fn checks_move_beside_a_far_larger_weight_only() {
        let mut w = LargestWeights::default();
        assert!(w.is_empty());
        assert!(!w.is_jump(3, u64::MAX), "a capture's first GEMM: nothing before it");
        // Llama small's decode step: q, k, v, o (2 MiB), gate, up, down (5.8 MB), vocab (65.5 MB).
        let (mib2, mlp, vocab) = (2u64 << 20, 5_767_168u64, 65_536_000u64);
        for b in [mib2, mib2, mib2, mib2, mlp, mlp, mlp] {
            assert!(!w.is_jump(3, b));
            w.note(3, 70, b);
        }
        assert!(w.is_jump(3, vocab));
        // Every earlier weight counts, not only the first: 450 is not 4x 300.
        for b in [100, 300] {
            w.note(4, 71, b);
        }
        assert!(!w.is_jump(4, 450));
        assert!(!w.is_jump(4, 4 * 300 - 1));
        assert!(w.is_jump(4, 4 * 300), "exactly the factor counts");
        assert!(!w.is_jump(5, 4 * 300), "sizes are per capture");
        // The same-sized layers of an 8B stack never jump.
        for b in [33_554_432u64, 33_554_432, 117_440_512, 117_440_512, 33_554_432] {
            assert!(!w.is_jump(6, b));
            w.note(6, 72, b);
        }
        w.end(Some(3), 99);
        assert!(!w.is_jump(3, vocab), "an ended capture forgets its sizes");
        assert!(w.is_jump(4, 4 * 300), "only its own");
        // An invalidated capture's id is unknown at its end: its stream tells.
        w.end(None, 72);
        assert!(!w.is_jump(6, u64::MAX), "capture 6 was first noted on stream 72");
        // Bounded: the oldest capture's sizes go first.
        for id in 100..100 + DEFERRED_CAPTURES as u64 {
            w.note(id, id, 1);
        }
        assert!(!w.is_jump(4, 4 * 300), "pushed out");
        assert!(w.is_jump(100 + DEFERRED_CAPTURES as u64 - 1, 4));
    }

    #[test]
    fn only_enough_movable_checks_move() {
        let mut d = DeferredChecks::<u32>::default();
        let odd = |c: &u32| c % 2 == 1;
        for c in 1..=5 {
            assert_eq!(d.push(3, c), 0);
        }
        assert_eq!(d.take_movable(3, 4, odd), Vec::<u32>::new(), "3 movable, 4 wanted: none move");
        assert_eq!(d.take_movable(3, 3, odd), vec![1, 3, 5], "in order");
        assert_eq!(d.take_movable(3, 1, odd), Vec::<u32>::new(), "moved once");
        assert_eq!(d.take(3), vec![2, 4], "the others wait for the end");
        assert_eq!(d.take_movable(9, 1, odd), Vec::<u32>::new(), "no such capture");
    }

    #[test]
    fn a_batched_b_is_no_weight() {
        use crate::formats::Format;
        use crate::problem::{GemmProblem, MatrixLayout, Order};
        let mut p = GemmProblem::row_major(2, 1000, 3000, Format::Bf16, Format::Bf16, Format::Bf16);
        assert_eq!(weight_bytes(&p), Some(6_000_000));
        p.batch = 4;
        p.b = MatrixLayout::packed(Format::Bf16, Order::RowMajor, 3000, 1000);
        assert_eq!(weight_bytes(&p), None, "one B per batch item: attention's keys, not a weight");
        p.b.batch_stride = 0;
        assert_eq!(weight_bytes(&p), Some(6_000_000), "one B for the batch is a weight");
    }

    #[test]
    fn last_branches_chain_within_each_capture() {
        let mut b = LastBranches::default();
        assert_eq!(b.last(1), None);
        b.set_last(1, GraphNode(10));
        // A second capture running at the same time starts its own chain.
        assert_eq!(b.last(2), None);
        b.set_last(2, GraphNode(20));
        b.set_last(1, GraphNode(11));
        assert_eq!((b.last(1), b.last(2)), (Some(GraphNode(11)), Some(GraphNode(20))));
        // The oldest capture is forgotten first; a later one starts afresh.
        for id in 3..3 + GRAPH_CHAIN_CAPTURES as u64 {
            b.set_last(id, GraphNode(id * 10));
        }
        assert_eq!(b.lasts.len(), GRAPH_CHAIN_CAPTURES);
        assert_eq!((b.last(1), b.last(2)), (None, None));
        assert_eq!(b.last(10), Some(GraphNode(100)));
    }

    /// Host time of the backend's part of one eager sketch check of a warmed site (before_call
    /// and after_call; the fake's launch does nothing). A benchmark, not a timed test: run with
    /// `cargo test --release -p quantshadow-runtime bench_backend_eager_sketch -- --ignored
    /// --nocapture`; on the GPU the driver's launch comes on top.
    #[test]
    #[ignore]
    fn bench_backend_eager_sketch() {
        let rt = Arc::new(FakeRuntime::with_kernels());
        let mut settings = fake_settings();
        settings.pool_bytes = 64 << 20;
        settings.side_stream = true;
        let backend = GpuBackend::new(rt.clone(), "fake", &settings).unwrap();
        let call = bf16_call(&rt, (1024, 1024, 1024));
        let thresholds = crate::thresholds::Thresholds::default();
        let run = |seq: u64| {
            let req = CheckRequest { call_seq: seq, ..CheckRequest::sketch_for_test(&call, &thresholds) };
            let pre = backend.before_call(&req).unwrap();
            backend.after_call(&req, pre).unwrap();
        };
        run(0); // set-up: the site's projection, programs
        rt.quiet.store(true, Ordering::Relaxed);
        let mut polled = Vec::new();
        for round in 0..5 {
            let calls = 200_000u64;
            let t = std::time::Instant::now();
            for seq in 0..calls {
                run(1 + round * calls + seq);
                if seq % 1024 == 1023 {
                    backend.poll(&mut polled); // the ring's slots come back (none written by the fake)
                    polled.clear();
                }
            }
            println!(
                "backend eager sketch: {:.0} ns per checked call",
                t.elapsed().as_nanos() as f64 / calls as f64
            );
        }
    }
}
