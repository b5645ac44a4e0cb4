//! The shadow engine: configuration, sampling, sites, the check backends and the poller.
//!
//! Inert until the first intercepted GEMM: no thread, socket, file or device work before it
//! (compilers that inherit LD_PRELOAD stay untouched). The first GEMM starts the engine once
//! per process; a failure to start is logged once and leaves every call a passthrough. A
//! child made by fork() without exec inherits a dead engine: it passes everything through.

pub mod backend;
pub mod config;
mod copy_beside;
pub mod gpu;
pub mod graph_select;
pub mod host;
pub mod log;
mod outstanding;
pub mod per_device;
mod retired;
pub mod sites;

use crate::inject::{self, CallRewrite};
use crate::intercept::{GemmArgs, InterceptedGemm, RealCall};
use crate::record::{
    self, CheckMode, ClosingRecord, DiagnosisRecord, GemmObservation, ProblemSummary, Record, SessionRecord,
};
use crate::transport::{Client, ClientOptions};
use backend::{Backend, CheckRequest, Diagnose, InjectRequest, Polled, SketchSettings};
use config::{Config, DeviceChoice, DiagnoseMode, Mode};
use rustc_hash::FxHashMap;
use sites::{Sampler, Sites};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Per-process engine state.
pub struct Engine {
    pub config: Config,
    session_id: u64,
    backend: Option<Box<dyn Backend>>,
    client: Option<Client>,
    sampler: Sampler,
    sites: Sites,
    stats: Stats,
    call_seq: AtomicU64,
    /// call_seq -> what the record of that call needs (bounded; captured calls replay theirs).
    pending: Mutex<PendingCalls>,
    /// Eager calls whose check was enqueued and whose one result (or failure) has not arrived,
    /// with when: the exit waits for them (captured calls give a result per replay: not
    /// tracked). Entries older than [`OUTSTANDING_STALE`] are let go: their results were
    /// dropped (full ring or queue, counted in the closing record's `dropped`).
    outstanding: Mutex<outstanding::Outstanding>,
    poller: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The poller was started (checked calls skip the lock above once it is).
    poller_started: AtomicBool,
    stop: AtomicBool,
    closed: AtomicBool,
    /// Diagnosis state per site (bounded by DIAGNOSED_SITES_CAP).
    diagnoses: Mutex<HashMap<u64, DiagState>>,
    /// Sites waiting for a diagnosis on their next call: while non-zero, calls the sampling
    /// passes over are still decoded far enough to know their site.
    diagnoses_wanted: AtomicUsize,
    /// Diagnosis passes started whose result has not come back (shutdown waits for them).
    diagnoses_running: AtomicUsize,
    /// Process facts the backend policy is evaluated against, and the (site, rule) pairs
    /// already reported (each violation is logged once; the report fails the run).
    policy_facts: crate::policy::ProcessFacts,
    policy_seen: Mutex<std::collections::HashSet<(u32, String)>>,
}

/// Where a site's diagnosis stands.
#[derive(Debug, Default, Clone, Copy)]
struct DiagState {
    /// Its next call should be diagnosed.
    wanted: bool,
    /// A call of it was handed to the backend for diagnosis and no answer has come back yet
    /// (no second request while one is on its way).
    in_flight: bool,
    /// Passes started (`Backend::diagnose` accepted) and results received.
    started: u32,
    done: u32,
    /// Times `Backend::diagnose` declined for a reason that will not pass by itself, or a
    /// started pass failed.
    declined: u32,
}

impl DiagState {
    /// Whether a failing check of the site should ask for (another) diagnosis.
    fn may_want(&self) -> bool {
        !self.wanted
            && !self.in_flight
            && self.done == 0
            && self.started < DIAGNOSIS_PASSES_MAX
            && self.declined < DIAGNOSIS_DECLINES_MAX
    }
}

/// Sites whose diagnosis state is kept; further sites are not diagnosed.
const DIAGNOSED_SITES_CAP: usize = 4096;
/// A site whose diagnosis the backend keeps declining is given up after this many calls
/// (declines while kernels compile or a graph is being captured are not counted).
const DIAGNOSIS_DECLINES_MAX: u32 = 64;
/// Passes started per site at most (a pass that fails after starting may be retried once).
const DIAGNOSIS_PASSES_MAX: u32 = 2;
/// Longest the process exit waits for diagnosis passes still running.
const DIAGNOSIS_EXIT_GRACE: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Stats {
    calls_seen: AtomicU64,
    sampled: AtomicU64,
    checked: AtomicU64,
    skipped: Mutex<BTreeMap<String, u64>>,
    /// Calls the sampling picked while paused: skipped with [`PAUSED_SKIP`].
    paused: AtomicU64,
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct CallMeta {
    entry: &'static str,
    problem: ProblemSummary,
    site_name: Option<std::sync::Arc<str>>,
    /// A fault was planted into this call (`QUANTSHADOW_INJECT`).
    injected: bool,
    /// The kernel that served the call, when the interposer knows it.
    kernel: Option<std::sync::Arc<str>>,
}

/// What results need of the calls they check, eager and captured kept apart: eager entries
/// come and go with each checked call, while a captured call's entry must outlive them for as
/// long as its graph replays (kept together, 8192 later eager calls pushed every graph's
/// entries out, and their replays' results were dropped as calls no longer remembered).
/// Captured entries are shared between calls that say the same (a server captures each layer's
/// GEMMs once per batch size, often twice: ~30 bytes a call beside one shared entry).
#[derive(Default)]
struct PendingCalls {
    eager: MetaBook<CallMeta>,
    captured: MetaBook<Arc<CallMeta>>,
    /// The distinct entries of `captured`.
    shared: rustc_hash::FxHashSet<Arc<CallMeta>>,
    /// Captured calls forgotten for room (logged once).
    captured_forgotten: u64,
}

impl PendingCalls {
    fn remember_captured(&mut self, call_seq: u64, meta: CallMeta) {
        let meta = match self.shared.get(&meta) {
            Some(same) => same.clone(),
            None => {
                let meta = Arc::new(meta);
                self.shared.insert(meta.clone());
                meta
            }
        };
        if let Some(old) = self.captured.insert(call_seq, meta, CAPTURED_CAP) {
            // Held by `shared` and `old` alone: no other call says the same any more.
            if Arc::strong_count(&old) == 2 {
                self.shared.remove(&old);
            }
            self.captured_forgotten += 1;
            if self.captured_forgotten == 1 {
                log::warn(&format!(
                    "more than {CAPTURED_CAP} captured calls checked: the oldest graphs' results go unreported"
                ));
            }
        }
    }
}

/// Call entries by sequence number, the oldest forgotten beyond a bound.
struct MetaBook<M> {
    map: FxHashMap<u64, M>,
    order: VecDeque<u64>,
}

impl<M> Default for MetaBook<M> {
    fn default() -> Self {
        MetaBook { map: FxHashMap::default(), order: VecDeque::new() }
    }
}

impl<M> MetaBook<M> {
    /// Returns the last entry forgotten for room, if one was still there.
    fn insert(&mut self, call_seq: u64, meta: M, cap: usize) -> Option<M> {
        let mut forgotten = None;
        while self.order.len() >= cap {
            if let Some(old) = self.order.pop_front() {
                forgotten = self.map.remove(&old).or(forgotten);
            }
        }
        self.order.push_back(call_seq);
        self.map.insert(call_seq, meta);
        forgotten
    }
}

/// Eager calls remembered at most (their results normally come within milliseconds).
const PENDING_CAP: usize = 8192;
/// Captured calls remembered at most: every checked GEMM of every graph a server captures
/// (vLLM: ~67 batch sizes x 7 GEMMs x layers, twice with piecewise and full graphs: ~75k for
/// 80 layers), with room for graphs captured again later.
const CAPTURED_CAP: usize = 1 << 18;
/// Longest the process exit waits for checks still on the device.
const EXIT_GRACE: Duration = Duration::from_millis(500);
/// Skip reason of a call whose check had not reported when the exit's grace ran out.
pub const LATE_AT_EXIT: &str = "no result before exit (the check was still running)";
/// A check not reported this long after its call: its result was dropped (counted there).
const OUTSTANDING_STALE: Duration = Duration::from_secs(10);

static ENGINE: StartOnce<Engine> = StartOnce::new();

/// Calls that passed straight through because another thread was starting the engine (added
/// to the closing record's calls and skips once it runs).
static PASSED_WHILE_STARTING: AtomicU64 = AtomicU64::new(0);

/// The skip reason of calls made while another thread started the engine.
pub const STARTING_SKIP: &str = "passed through while another thread started the shim";

/// A value made once, by the first caller. Unlike `OnceLock::get_or_init`, callers that arrive
/// while another thread makes it get None at once instead of waiting: the engine's start reads
/// files, starts the first device (pool, kernels) and a thread, and the host's other threads
/// must not wait for that. A start that panics leaves None (never retried, never stuck).
pub struct StartOnce<T> {
    starting: AtomicBool,
    value: OnceLock<Option<T>>,
}

impl<T> StartOnce<T> {
    pub const fn new() -> Self {
        StartOnce { starting: AtomicBool::new(false), value: OnceLock::new() }
    }

    /// The outcome of the start, once there is one (`Some(None)`: started, but nothing came).
    pub fn get(&self) -> Option<&Option<T>> {
        self.value.get()
    }

    /// The value, made here by `start` if no thread has begun to; `Err(StillStarting)` while
    /// another thread is making it.
    pub fn get_or_start(&self, start: impl FnOnce() -> Option<T>) -> Result<Option<&T>, StillStarting> {
        if let Some(v) = self.value.get() {
            return Ok(v.as_ref());
        }
        if self.starting.swap(true, Ordering::AcqRel) {
            // Another thread starts it, or has just finished.
            return self.value.get().map(Option::as_ref).ok_or(StillStarting);
        }
        let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(start)).unwrap_or(None);
        Ok(self.value.get_or_init(|| made).as_ref())
    }
}

/// [`StartOnce::get_or_start`] found another thread making the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StillStarting;

impl<T> Default for StartOnce<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Set in a child made by fork() (pthread_atfork handler): the engine's threads did not
/// survive the fork, so the child passes everything through. An atomic load per call instead
/// of a getpid() system call.
static FORKED_CHILD: AtomicBool = AtomicBool::new(false);

extern "C" fn after_fork_in_child() {
    FORKED_CHILD.store(true, Ordering::Relaxed);
}

/// Set through the shim's `quantshadow_pause` export: every intercepted call passes straight
/// through (no check, no fault injection, nothing recorded into a capture); calls the sampling
/// rule picks meanwhile are counted as skipped with [`PAUSED_SKIP`].
static PAUSED: AtomicBool = AtomicBool::new(false);

/// The skip reason of calls picked while paused.
pub const PAUSED_SKIP: &str = "paused by quantshadow_pause";

/// Pauses (`true`) or resumes checking in this process; returns whether it was paused. Never
/// starts the engine. Checks already recorded into a CUDA graph still run at its replays.
pub fn set_paused(paused: bool) -> bool {
    PAUSED.swap(paused, Ordering::Relaxed)
}

/// Whether this process is a fork() child of one whose engine was starting or started: every
/// hook passes straight through there (the parent's threads, and any lock they held, are gone).
pub fn in_forked_child() -> bool {
    FORKED_CHILD.load(Ordering::Relaxed)
}

/// Whether the fork handler is registered (before the engine starts, not after: a child forked
/// while another thread is inside the start would otherwise wait forever for a start that no
/// thread of it runs).
static ATFORK_REGISTERED: AtomicBool = AtomicBool::new(false);

/// The engine, started on first use; None when off, failed to start, or in a forked child.
pub fn engine() -> Option<&'static Engine> {
    if !ATFORK_REGISTERED.swap(true, Ordering::AcqRel) {
        // SAFETY: registers a plain extern "C" function that stores one atomic.
        unsafe { libc::pthread_atfork(None, None, Some(after_fork_in_child)) };
    }
    if FORKED_CHILD.load(Ordering::Relaxed) {
        return None;
    }
    match ENGINE.get_or_start(Engine::start) {
        Ok(engine) => engine,
        Err(StillStarting) => {
            PASSED_WHILE_STARTING.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Every skip the backends noted in a unit-test process, engine or not (tests read them).
#[cfg(test)]
pub(crate) static TEST_SKIPS: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

/// Counts a skip reason in the running engine's closing record (work outside a GEMM call:
/// graph launch selection). Never starts the engine.
pub fn note_skip(reason: &str) {
    #[cfg(test)]
    {
        *TEST_SKIPS.lock().unwrap_or_else(|e| e.into_inner()).entry(reason.to_string()).or_insert(0) += 1;
    }
    if let Some(Some(e)) = ENGINE.get() {
        if !FORKED_CHILD.load(Ordering::Relaxed) {
            e.skip(reason);
        }
    }
}

/// A capture on `stream` is about to end: the backend adds the checks it deferred to the end
/// of that capture. Returns (graph, capture id) where the backend knows them. Never starts
/// the engine.
pub fn on_capture_end(stream: u64) -> Option<(u64, u64)> {
    lifetime_backend().and_then(|b| b.capture_ending(stream))
}

/// The started engine's backend, for the hooks of object lifetimes: None before the start,
/// without a backend, or in a forked child. Never starts the engine.
fn lifetime_backend() -> Option<&'static dyn Backend> {
    let Some(Some(e)) = ENGINE.get() else { return None };
    if FORKED_CHILD.load(Ordering::Relaxed) {
        return None;
    }
    e.backend.as_deref()
}

/// A context went away with the executables and clones the graph selection knows; a later
/// graph may get one of their handles.
fn forget_graph_executables() {
    if let Some(select) = graph_select::get() {
        select.forget_all();
    }
}

/// `stream` is about to be destroyed: the backends forget it, so that no later work (a
/// replaced projection's retirement) passes the dead handle to the driver.
pub fn on_stream_destroy(stream: u64) {
    if let Some(b) = lifetime_backend() {
        b.stream_destroyed(stream);
    }
}

/// The host is about to record an event on `stream`: a snapshot copy pending on a capturing
/// stream is captured first, so that work of other streams waiting for that event is ordered
/// after it. One atomic load when no copy is pending.
pub fn on_event_record(stream: u64) {
    if !copy_beside::any_pending() {
        return;
    }
    if let Some(b) = lifetime_backend() {
        b.event_recording(stream);
    }
}

/// The host is about to reset `device` (None: the current one): the backend made in its
/// context is retired, and the device's next call starts a new one.
/// Returns whether one was (the hook then tells [`on_device_reset_failed`] if the reset fails).
pub fn on_device_reset(device: Option<i32>) -> bool {
    let Some(b) = lifetime_backend() else { return false };
    forget_graph_executables();
    b.device_reset(device)
}

/// The host is about to destroy context `ctx` (`cuCtxDestroy`): backends made in it are
/// retired, as after a device reset.
/// Returns whether one was (the hook then tells [`on_context_destroy_returned`] how the
/// destroy went).
pub fn on_context_destroy(ctx: u64) -> bool {
    let retired = lifetime_backend().is_some_and(|b| b.context_destroyed(ctx));
    if retired {
        forget_graph_executables();
    }
    retired
}

/// The destroy of `ctx` announced by [`on_context_destroy`] returned: if it failed (`ok`
/// false), what it retired serves again.
pub fn on_context_destroy_returned(ctx: u64, ok: bool) {
    if let Some(b) = lifetime_backend() {
        b.context_destroy_returned(ctx, ok);
    }
}

/// The reset announced by [`on_device_reset`] failed: the backend it retired serves again.
pub fn on_device_reset_failed(device: Option<i32>) {
    if let Some(b) = lifetime_backend() {
        b.device_reset_failed(device);
    }
}

/// The host released `device`'s primary context (after the call): if it is gone, backends
/// made in it are retired. One read-only driver query.
pub fn on_primary_context_release(device: i32) {
    if lifetime_backend().is_some_and(|b| b.primary_context_released(device)) {
        forget_graph_executables();
    }
}

/// Whether the engine has been started in this process (for tests of inertness).
pub fn started() -> bool {
    ENGINE.get().is_some()
}

/// Entry of every intercepted GEMM: decide, run the real call, enqueue the check.
pub fn on_gemm<A: GemmArgs>(args: &A, real: &RealCall) -> i32 {
    let Some(engine) = engine() else {
        return real.call();
    };
    engine.gemm(args, real)
}

/// Runs the real function; a BLAS call's kernel is learnt from the launches it makes.
fn call_watching_launches<A: GemmArgs>(args: &A, real: &RealCall) -> (i32, Option<std::sync::Arc<str>>) {
    if let Some(kernel) = args.kernel() {
        return (real.call(), Some(kernel.into()));
    }
    let watch = crate::intercept::LaunchWatch::arm();
    let status = real.call();
    (status, crate::intercept::launch::served_by(&watch.seen()))
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its length; gethostname NUL-terminates on success.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) } == 0;
    if !ok {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Picks the backend: CUDA when a CUDA context is current, else HIP, else the host.
fn start_backend(config: &Config) -> Result<Box<dyn Backend>, String> {
    let gpu_settings = gpu::GpuSettings {
        pool_bytes: config.pool_bytes,
        ring_capacity: 4096,
        sync_compile: config.sync_compile,
        sketch_detach: config.sketch_detach,
        graph_select: config.graph_select,
        side_stream: config.side_stream.enabled_for(config.sampling, config.mode),
        kernels: config.kernels,
    };
    match config.device {
        DeviceChoice::Cuda => {
            gpu::start_cuda_per_device(&gpu_settings).map(|b| Box::new(b) as Box<dyn Backend>)
        }
        DeviceChoice::Hip => {
            gpu::start_hip_per_device(&gpu_settings).map(|b| Box::new(b) as Box<dyn Backend>)
        }
        DeviceChoice::Host => start_host(),
        DeviceChoice::Auto => {
            let cuda = gpu::start_cuda_per_device(&gpu_settings);
            if let Ok(b) = cuda {
                return Ok(Box::new(b));
            }
            let hip = gpu::start_hip_per_device(&gpu_settings);
            if let Ok(b) = hip {
                return Ok(Box::new(b));
            }
            // Host code cannot read device pointers: only without any GPU runtime.
            if gpu::gpu_runtime_present() {
                return Err(format!(
                    "a GPU runtime is loaded but no backend started ({}; {})",
                    cuda.err().unwrap_or_default(),
                    hip.err().unwrap_or_default()
                ));
            }
            start_host()
        }
    }
}

fn start_host() -> Result<Box<dyn Backend>, String> {
    Ok(Box::new(host::HostBackend::new(HOST_QUEUE)))
}

/// Finished host checks held for the poller; beyond, results are dropped and counted.
const HOST_QUEUE: usize = 4096;

impl Engine {
    fn start() -> Option<Engine> {
        let config = Config::from_env();
        log::set_level(config.log);
        for w in &config.warnings {
            log::warn(w);
        }
        if config.mode == Mode::Off {
            return None;
        }
        if let Some(plan) = &config.inject {
            // Loud on purpose: results of a faulted run are wrong by design.
            log::error(&plan.banner());
            if !matches!(config.mode, Mode::Check(_)) {
                log::error("fault injection needs a check mode (QUANTSHADOW_MODE=sketch, rows or full): nothing is injected");
            }
        }
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() } as u32;
        let session_id = crate::rng::mix64(now_ns() ^ ((pid as u64) << 32) ^ (&config as *const _ as u64));
        let backend = match config.mode {
            Mode::Check(_) => match start_backend(&config) {
                Ok(b) => Some(b),
                Err(e) => {
                    log::error(&format!("no check backend ({e}); calls pass through unchecked"));
                    return None;
                }
            },
            _ => None,
        };
        let engine = Engine::assemble(config, backend, session_id, pid);
        // SAFETY: registers a plain extern "C" function (run once at exit). The fork handler is
        // registered before the start (`engine`).
        unsafe {
            libc::atexit(at_exit);
        }
        Some(engine)
    }

    /// The engine of `config` around a started `backend` (None: observe mode or none).
    fn assemble(config: Config, backend: Option<Box<dyn Backend>>, session_id: u64, pid: u32) -> Engine {
        let (device_name, device_arch) = backend.as_ref().map(|b| b.device()).unwrap_or_default();
        let mut settings: Vec<record::KeyValue> =
            config.settings().into_iter().map(|(key, value)| record::KeyValue { key, value }).collect();
        settings.push(record::KeyValue {
            key: "backend".into(),
            value: backend.as_ref().map_or("none", |b| b.name()).into(),
        });
        if let Some((policy, text)) = &config.policy {
            // The report evaluates the rules per site; it needs the process facts they name.
            settings.push(record::KeyValue { key: "policy".into(), value: policy.origin.clone() });
            settings.push(record::KeyValue { key: "policy.text".into(), value: text.clone() });
            let names = policy.env_vars();
            settings.push(record::KeyValue { key: "policy.env".into(), value: names.join(",") });
            for name in names {
                if let Ok(value) = std::env::var(&name) {
                    settings.push(record::KeyValue { key: format!("env.{name}"), value });
                }
            }
        }
        let session_arch = device_arch.clone();
        let session = SessionRecord {
            session_id,
            host: hostname(),
            pid,
            rank: std::env::var("RANK").ok().and_then(|r| r.parse().ok()).unwrap_or(-1),
            device_name,
            device_arch,
            library_versions: vec![record::KeyValue {
                key: "quantshadow".into(),
                value: env!("CARGO_PKG_VERSION").into(),
            }],
            label: config.label.clone(),
            start_time_ns: now_ns(),
            settings,
        };
        let client = config.collector.clone().map(|address| {
            let options = ClientOptions {
                preamble: Some(record::encode(&Record::Session(session))),
                ..Default::default()
            };
            Client::start(address, options)
        });
        if client.is_none() {
            log::warn("QUANTSHADOW_COLLECTOR is not set: results are counted, not recorded");
        }
        let sites = Sites::new(config.names.as_deref());
        let policy_facts = crate::policy::ProcessFacts {
            arch: session_arch.clone(),
            env: config
                .policy
                .as_ref()
                .map(|(p, _)| {
                    p.env_vars().into_iter().filter_map(|k| std::env::var(&k).ok().map(|v| (k, v))).collect()
                })
                .unwrap_or_default(),
        };
        log::info(&format!(
            "started: mode {}, sampling {}, backend {}",
            config.mode.name(),
            config.sampling.describe(),
            backend.as_ref().map_or("none", |b| b.name())
        ));
        Engine {
            sampler: Sampler::new(config.sampling),
            config,
            session_id,
            backend,
            client,
            sites,
            stats: Stats::default(),
            call_seq: AtomicU64::new(0),
            pending: Mutex::new(PendingCalls::default()),
            outstanding: Mutex::new(outstanding::Outstanding::new(PENDING_CAP, OUTSTANDING_STALE)),
            poller: Mutex::new(None),
            poller_started: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            diagnoses: Mutex::new(HashMap::new()),
            diagnoses_wanted: AtomicUsize::new(0),
            diagnoses_running: AtomicUsize::new(0),
            policy_facts,
            policy_seen: Mutex::new(Default::default()),
        }
    }

    fn skip(&self, reason: &str) {
        let mut m = self.stats.skipped.lock().unwrap_or_else(|e| e.into_inner());
        match m.get_mut(reason) {
            Some(c) => *c += 1,
            None => {
                log::debug(&format!("skip: {reason}"));
                // Bounded: reasons are short stable strings, but never let them grow unboundedly.
                let key = if m.len() < 256 { reason.to_string() } else { "other".to_string() };
                *m.entry(key).or_insert(0) += 1;
            }
        }
    }

    fn gemm<A: GemmArgs>(&'static self, args: &A, real: &RealCall) -> i32 {
        self.stats.calls_seen.fetch_add(1, Ordering::Relaxed);
        if PAUSED.load(Ordering::Relaxed) {
            if self.sampler.take(args.quick_key()) {
                // Atomics only (no lock on this path): folded into the skip counts when read.
                self.stats.sampled.fetch_add(1, Ordering::Relaxed);
                self.stats.paused.fetch_add(1, Ordering::Relaxed);
            }
            return real.call();
        }
        // Inside a graph capture a host-side decision would be frozen into every replay: checks
        // (sketch, rows, full) are recorded with the rule instead, and the device decides at
        // each replay.
        // Whether the call's stream is capturing a graph: asked of the driver at most once.
        let capture = std::cell::OnceCell::new();
        let capturing = || {
            *capture.get_or_init(|| {
                self.backend
                    .as_ref()
                    .is_some_and(|b| args.stream().is_some_and(|s| s != 0 && b.is_capturing(s)))
            })
        };
        let gated = self.config.sampling != config::Sampling::ALL
            && matches!(self.config.mode, Mode::Check(_))
            && capturing();
        // A captured call leaves the host's counts alone: its replays are sampled on the
        // device, and warm-up captures would otherwise use up `first:K` before any eager call.
        let sampled = !gated && self.sampler.take(args.quick_key());
        // Fault injection and pending diagnoses act on calls the sampling passes over too.
        let extra = self.config.inject.is_some() || self.diagnoses_wanted.load(Ordering::Relaxed) > 0;
        if !sampled && !gated && !extra {
            return real.call();
        }
        let checking = sampled || gated;
        if checking {
            self.stats.sampled.fetch_add(1, Ordering::Relaxed);
        }
        let call = match args.decode() {
            Ok(c) => c,
            Err(skip) => {
                if checking {
                    self.skip(&skip.0);
                }
                return real.call();
            }
        };
        self.ensure_poller();
        let mut site = self.sites.site_of(&call);
        if site.name.is_none() {
            // A launched kernel's sites are named after the kernel unless the names map knows better.
            site.name = args.label().map(std::sync::Arc::from);
        }
        let call_seq = self.call_seq.fetch_add(1, Ordering::Relaxed);
        let mode = match self.config.mode {
            Mode::Check(m) => m,
            _ => {
                let (status, kernel) = call_watching_launches(args, real);
                if status == 0 && checking {
                    self.send_observation(&call, &site, call_seq, kernel.map(|k| k.to_string()));
                }
                return status;
            }
        };
        let Some(backend) = self.backend.as_ref() else {
            return real.call();
        };
        let faults = self.plan_faults(&call, &site, call_seq);
        let diagnose_now = self.take_diagnosis(site.id, checking);
        if !checking && faults.is_none() && !diagnose_now {
            return real.call();
        }
        let request = CheckRequest {
            call: &call,
            mode,
            site_ordinal: site.ordinal,
            site_id: site.id,
            call_seq,
            site_epoch: site.epoch,
            sketch: SketchSettings {
                seed: crate::rng::mix64(self.config.seed ^ site.id),
                probes: self.config.probes,
                rows_per_call: self.config.sketch_rows,
            },
            rows_per_call: self.config.check_rows,
            logits_topk: (mode != CheckMode::Sketch && call.problem.n >= LOGITS_MIN_N).then_some(LOGITS_TOPK),
            device_gate: gated.then_some(self.config.sampling),
            diagnose: if !diagnose_now && self.diagnose_if_failing(site.id) {
                Diagnose::IfFailing
            } else {
                Diagnose::No
            },
            thresholds: &self.config.thresholds,
            rewrites_inputs: faults.as_ref().is_some_and(|f| !f.before.is_empty()),
            scratch: args.scratch(),
        };
        let pre = if checking {
            match backend.before_call(&request) {
                Ok(p) => Some(p),
                Err(skip) => {
                    self.skip(&skip.0);
                    None
                }
            }
        } else {
            None
        };
        let saved = faults.as_ref().and_then(|f| match backend.inject_before(f) {
            Ok(saved) => Some(saved),
            Err(skip) => {
                self.inject_note(&format!("fault injection not applied: {}", skip.0));
                None
            }
        });
        let (status, kernel) = call_watching_launches(args, real);
        let mut injected = false;
        if let Some(f) = &faults {
            // Always after a successful inject_before (it restores the caller's inputs); the
            // output classes alone also when inject_before was not needed.
            let run_after = saved.is_some() || f.before.is_empty();
            if run_after {
                match backend.inject_after(f, saved.unwrap_or_default()) {
                    Ok(()) => injected = true,
                    Err(skip) => self.inject_note(&format!("fault injection not applied: {}", skip.0)),
                }
            }
        }
        if status != 0 {
            if checking {
                self.skip("the library returned an error status");
            }
            return status;
        }
        let captured_check = pre.is_some() && capturing();
        let eager_check = pre.is_some() && !captured_check;
        if pre.is_some() || diagnose_now {
            self.remember(call_seq, &call, site.name.clone(), injected, kernel, captured_check);
        }
        if let Some(pre) = pre {
            // Tracked before the check is enqueued: its result may be polled before after_call
            // returns (the host backend's is ready at once).
            let tracked = eager_check && self.track_outstanding(call_seq);
            if let Err(skip) = backend.after_call(&request, pre) {
                if tracked {
                    self.settled(call_seq);
                }
                self.forget_once(call_seq);
                self.skip(&skip.0);
            }
        }
        if diagnose_now {
            // Counted as started before the backend runs it: the poller may receive its result
            // (the host backend's at once) before `diagnose` returns, and a result counted first
            // would leave the running count at 1 and hold the exit for the whole grace period.
            self.diagnosis_started(site.id);
            if let Err(skip) = backend.diagnose(&request) {
                self.diagnosis_not_started(site.id);
                // Compiles and captures pass by themselves: those declines are not counted.
                let passing = skip.0.starts_with("warming up") || skip.0.starts_with("graph capture");
                self.skip(&format!("diagnosis: {}", skip.0));
                self.diagnosis_declined(site.id, !passing);
            }
        }
        status
    }

    /// The faults `QUANTSHADOW_INJECT` plants into this call, or None. A class that cannot be
    /// applied to the call is logged once and counted.
    fn plan_faults<'c>(
        &self,
        call: &'c InterceptedGemm,
        site: &sites::SiteRef,
        call_seq: u64,
    ) -> Option<InjectRequest<'c>> {
        let plan = self.config.inject.as_ref()?;
        let ordinal = site.ordinal as u64;
        let set = plan.applies(ordinal, site.name.as_deref().unwrap_or(""), call_seq);
        if set.is_empty() {
            return None;
        }
        let (mut before, mut after) = (Vec::new(), Vec::new());
        for class in set.iter() {
            match inject::plan_call(&call.problem, class) {
                Ok(CallRewrite::Nothing) => after.push(class),
                Ok(rewrite) => before.push(rewrite),
                Err(na) => self.inject_note(&format!("fault injection not applied: {na}")),
            }
        }
        if before.is_empty() && after.is_empty() {
            return None;
        }
        Some(InjectRequest { call, site_id: site.id, before, after, seed: plan.seed(ordinal, call_seq) })
    }

    /// Counts an injection that did not happen (shown with the skips); warns the first time.
    fn inject_note(&self, reason: &str) {
        let first = {
            let m = self.stats.skipped.lock().unwrap_or_else(|e| e.into_inner());
            !m.contains_key(reason)
        };
        if first {
            log::warn(reason);
        }
        self.skip(reason);
    }

    /// Whether this call should be diagnosed now (its site is waiting for it, or every site
    /// is diagnosed once and this is its first checked call).
    fn take_diagnosis(&self, site_id: u64, checking: bool) -> bool {
        if self.config.diagnose == DiagnoseMode::Off {
            return false;
        }
        let every_site = self.config.diagnose == DiagnoseMode::EverySite && checking;
        if !every_site && self.diagnoses_wanted.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let mut map = self.diagnoses.lock().unwrap_or_else(|e| e.into_inner());
        if !map.contains_key(&site_id) && map.len() >= DIAGNOSED_SITES_CAP {
            return false;
        }
        let state = map.entry(site_id).or_default();
        if state.wanted {
            state.wanted = false;
            state.in_flight = true;
            self.diagnoses_wanted.fetch_sub(1, Ordering::Relaxed);
            return true;
        }
        let first =
            every_site && !state.in_flight && state.started == 0 && state.done == 0 && state.declined == 0;
        state.in_flight |= first;
        first
    }

    /// Whether a backend that judges its own checks should diagnose this call if it fails.
    fn diagnose_if_failing(&self, site_id: u64) -> bool {
        if self.config.diagnose == DiagnoseMode::Off {
            return false;
        }
        let map = self.diagnoses.lock().unwrap_or_else(|e| e.into_inner());
        match map.get(&site_id) {
            None => map.len() < DIAGNOSED_SITES_CAP,
            Some(s) => s.started == 0 && s.done == 0 && !s.wanted && !s.in_flight,
        }
    }

    fn diagnosis_started(&self, site_id: u64) {
        self.diagnoses_running.fetch_add(1, Ordering::Relaxed);
        let mut map = self.diagnoses.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(site_id).or_default().started += 1;
    }

    /// One diagnosis pass fewer running (never below zero).
    fn diagnosis_ended(&self) {
        let _ =
            self.diagnoses_running.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Undoes [`Self::diagnosis_started`] for a pass the backend declined to start.
    fn diagnosis_not_started(&self, site_id: u64) {
        self.diagnosis_ended();
        let mut map = self.diagnoses.lock().unwrap_or_else(|e| e.into_inner());
        let state = map.entry(site_id).or_default();
        state.started = state.started.saturating_sub(1);
    }

    /// The backend declined this call's diagnosis (`counts`: for a reason that will not pass by
    /// itself) or a started pass failed: ask again on a later call, a bounded number of times.
    fn diagnosis_declined(&self, site_id: u64, counts: bool) {
        let mut map = self.diagnoses.lock().unwrap_or_else(|e| e.into_inner());
        let state = map.entry(site_id).or_default();
        state.in_flight = false;
        state.declined += counts as u32;
        if state.may_want() {
            state.wanted = true;
            self.diagnoses_wanted.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A check of `site_id` failed: diagnose the site on its next call, once.
    fn want_diagnosis(&self, site_id: u64) {
        if self.config.diagnose == DiagnoseMode::Off {
            return;
        }
        let mut map = self.diagnoses.lock().unwrap_or_else(|e| e.into_inner());
        if !map.contains_key(&site_id) && map.len() >= DIAGNOSED_SITES_CAP {
            return;
        }
        let state = map.entry(site_id).or_default();
        if state.may_want() && state.started == 0 {
            state.wanted = true;
            self.diagnoses_wanted.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn diagnosis_received(&self, site_id: u64, started_here: bool) {
        if started_here {
            self.diagnosis_ended();
        }
        let mut map = self.diagnoses.lock().unwrap_or_else(|e| e.into_inner());
        let state = map.entry(site_id).or_default();
        state.done += 1;
        state.in_flight = false;
        if state.wanted {
            state.wanted = false;
            self.diagnoses_wanted.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn send_diagnosis(&self, mut d: DiagnosisRecord) {
        d.session_id = self.session_id;
        d.timestamp_ns = now_ns();
        self.send(&Record::Diagnosis(d));
    }

    /// Keeps what the results of call `call_seq` need: the one result of an eager call, or
    /// every replay's of a `captured` one ([`PendingCalls`]).
    fn remember(
        &self,
        call_seq: u64,
        call: &InterceptedGemm,
        site_name: Option<std::sync::Arc<str>>,
        injected: bool,
        kernel: Option<std::sync::Arc<str>>,
        captured: bool,
    ) {
        let meta = CallMeta {
            entry: call.entry,
            problem: ProblemSummary::from(&call.problem),
            site_name,
            injected,
            kernel,
        };
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        match captured {
            false => {
                p.eager.insert(call_seq, meta, PENDING_CAP);
            }
            true => p.remember_captured(call_seq, meta),
        }
    }

    /// What the record of call `call_seq`'s result needs: taken for an eager call (its one
    /// result), copied for a captured one (every replay reports).
    fn call_meta(&self, call_seq: u64) -> Option<CallMeta> {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        match p.eager.map.remove(&call_seq) {
            Some(m) => Some(m),
            None => p.captured.map.get(&call_seq).map(|m| CallMeta::clone(m)),
        }
    }

    /// An eager call's check failed on the device: its entry goes (no result will come).
    fn forget_once(&self, call_seq: u64) {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).eager.map.remove(&call_seq);
    }

    fn send(&self, record: &Record) {
        if let Some(c) = &self.client {
            c.send(record::encode(record));
        }
    }

    fn send_observation(
        &self,
        call: &InterceptedGemm,
        site: &sites::SiteRef,
        call_seq: u64,
        kernel: Option<String>,
    ) {
        let o = GemmObservation {
            session_id: self.session_id,
            site_id: site.id,
            site_ordinal: site.ordinal,
            site_name: site.name.as_deref().map(str::to_string),
            call_seq,
            entry_point: call.entry.to_string(),
            backend: kernel,
            problem: ProblemSummary::from(&call.problem),
            mode: CheckMode::Observe,
            metrics: None,
            rows_checked: 0,
            sketch_seed: 0,
            sketch_prod: vec![],
            sketch_ref: vec![],
            logits: None,
            logits_rows: vec![],
            flags: 0,
            timestamp_ns: now_ns(),
        };
        self.check_policy(&o);
        self.send(&Record::Observation(o));
    }

    /// Logs each backend-policy violation once per site and rule, as it is first seen; the
    /// report evaluates the recorded policy again and fails the configuration.
    fn check_policy(&self, o: &GemmObservation) {
        let Some((policy, _)) = &self.config.policy else { return };
        let site = crate::policy::SiteFacts {
            ordinal: o.site_ordinal,
            entry: o.entry_point.clone(),
            kernel: o.backend.clone(),
            name: o.site_name.clone(),
            a_format: o.problem.a_format.name().to_string(),
            b_format: o.problem.b_format.name().to_string(),
            d_format: o.problem.d_format.name().to_string(),
        };
        for v in policy.evaluate(&self.policy_facts, &site) {
            let mut seen = self.policy_seen.lock().unwrap_or_else(|e| e.into_inner());
            if seen.len() < 4096 && seen.insert((v.site, v.rule.clone())) {
                drop(seen);
                let why = v.why.as_deref().map_or(String::new(), |w| format!(" ({w})"));
                log::error(&format!("backend policy: {v}{why}"));
            }
        }
    }

    /// Turns finished checks into records; returns how many it handled.
    /// Starts waiting for call `call_seq`'s one result; false when the set is full even after
    /// letting go of stale entries (the call is then not waited for at exit).
    fn track_outstanding(&self, call_seq: u64) -> bool {
        self.outstanding.lock().unwrap_or_else(|e| e.into_inner()).track(call_seq, Instant::now())
    }

    /// The result (or failure) of call `call_seq`'s check arrived.
    fn settled(&self, call_seq: u64) {
        self.outstanding.lock().unwrap_or_else(|e| e.into_inner()).settle(call_seq);
    }

    /// Calls still waited for (not stale).
    fn outstanding_now(&self) -> usize {
        self.outstanding.lock().unwrap_or_else(|e| e.into_inner()).live(Instant::now())
    }

    fn drain(&self) -> usize {
        let Some(backend) = self.backend.as_ref() else {
            return 0;
        };
        let mut out = Vec::new();
        backend.poll(&mut out);
        let n = out.len();
        for polled in out {
            match polled {
                Polled::Failed { reason, call_seq, .. } => {
                    self.settled(call_seq);
                    self.forget_once(call_seq);
                    self.skip(&reason);
                }
                Polled::Diagnosis(d) => {
                    self.diagnosis_received(d.site_id, true);
                    self.send_diagnosis(*d);
                }
                Polled::DiagnosisFailed { site_id, reason } => {
                    self.diagnosis_ended();
                    self.skip(&format!("diagnosis: {reason}"));
                    self.diagnosis_declined(site_id, true);
                }
                Polled::Done(mut o) => {
                    self.settled(o.call_seq);
                    let Some(CallMeta { entry, problem, site_name, injected, kernel, .. }) =
                        self.call_meta(o.call_seq)
                    else {
                        self.skip("result of a call no longer remembered");
                        continue;
                    };
                    // Counted with its record: a result without one is a skip, not a check.
                    self.stats.checked.fetch_add(1, Ordering::Relaxed);
                    let diagnosis = o.diagnosis.take();
                    let failing = !self.config.thresholds.judge(problem.class(), &o.metrics).is_empty();
                    let obs = GemmObservation {
                        session_id: self.session_id,
                        site_id: o.site_id,
                        site_ordinal: o.site_ordinal,
                        site_name: site_name.as_deref().map(str::to_string),
                        call_seq: o.call_seq,
                        entry_point: entry.to_string(),
                        backend: kernel.map(|k| k.to_string()),
                        problem,
                        mode: o.mode,
                        metrics: Some(o.metrics),
                        rows_checked: o.rows_checked,
                        sketch_seed: o.sketch_seed,
                        sketch_prod: o.sketch_prod,
                        sketch_ref: o.sketch_ref,
                        logits: o.logits,
                        logits_rows: o.logits_rows,
                        flags: o.flags | if injected { record::flags::INJECTED } else { 0 },
                        timestamp_ns: now_ns(),
                    };
                    self.check_policy(&obs);
                    self.send(&Record::Observation(obs));
                    match diagnosis {
                        Some(d) => {
                            self.diagnosis_received(d.site_id, false);
                            self.send_diagnosis(*d);
                        }
                        None if failing => self.want_diagnosis(o.site_id),
                        None => {}
                    }
                }
            }
        }
        n
    }

    fn ensure_poller(&'static self) {
        if self.backend.is_none() || self.poller_started.load(Ordering::Acquire) {
            return;
        }
        let mut slot = self.poller.lock().unwrap_or_else(|e| e.into_inner());
        if slot.is_some() || self.stop.load(Ordering::Acquire) {
            return;
        }
        let spawned = std::thread::Builder::new().name("quantshadow-poll".into()).spawn(move || {
            while !self.stop.load(Ordering::Acquire) {
                if self.drain() == 0 {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        });
        match spawned {
            Ok(h) => {
                *slot = Some(h);
                self.poller_started.store(true, Ordering::Release);
            }
            Err(e) => log::error(&format!("cannot start the poller thread: {e}")),
        }
    }

    /// Counters so far (for the closing record and tests).
    pub fn closing_record(&self, dropped: u64) -> ClosingRecord {
        ClosingRecord {
            session_id: self.session_id,
            calls_seen: self.stats.calls_seen.load(Ordering::Relaxed)
                + PASSED_WHILE_STARTING.load(Ordering::Relaxed),
            sampled: self.stats.sampled.load(Ordering::Relaxed),
            checked: self.stats.checked.load(Ordering::Relaxed),
            skipped: self
                .skip_counts()
                .into_iter()
                .map(|(reason, count)| record::SkipCount { reason, count })
                .collect(),
            dropped: dropped + self.backend.as_ref().map_or(0, |b| b.dropped()),
            end_time_ns: now_ns(),
        }
    }

    /// Stops the poller, collects what finishes within a short grace period, sends the
    /// closing record and closes the transport. Idempotent.
    pub fn shutdown(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.poller.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
        let t0 = Instant::now();
        let expected = self.stats.sampled.load(Ordering::Relaxed);
        loop {
            let n = self.drain();
            let checked = self.stats.checked.load(Ordering::Relaxed);
            // Results of graph replays count too, so the totals alone can be reached while an
            // eager call's check is still on the device: those are waited for by name.
            let checks_done = self.outstanding_now() == 0 && checked + self.skipped_total() >= expected;
            let diagnosing = self.diagnoses_running.load(Ordering::Relaxed) > 0;
            if n == 0 && checks_done && !diagnosing {
                break;
            }
            // Checks get a short grace; a diagnosis pass (rare, asked for) a longer one.
            let limit = if checks_done { DIAGNOSIS_EXIT_GRACE } else { EXIT_GRACE };
            if t0.elapsed() >= limit {
                break;
            }
            if n == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        // Calls whose check did not report within the grace: counted, never lost silently.
        for _ in 0..self.outstanding_now() {
            self.skip(LATE_AT_EXIT);
        }
        let closing = |dropped| record::encode(&Record::Closing(self.closing_record(dropped)));
        let summary = match &self.client {
            Some(c) => {
                let s = c.close(closing, Duration::from_secs(2));
                format!(", {} records sent, {} dropped", s.sent, s.dropped)
            }
            None => String::new(),
        };
        let c = self.closing_record(0);
        log::info(&format!(
            "closing: {} calls, {} sampled, {} checked, {} skipped{summary}",
            c.calls_seen,
            c.sampled,
            c.checked,
            c.skipped.iter().map(|s| s.count).sum::<u64>()
        ));
        if !c.skipped.is_empty() {
            // The most frequent reasons (the record has them all).
            let mut reasons: Vec<_> = c.skipped.iter().collect();
            reasons.sort_by_key(|s| std::cmp::Reverse(s.count));
            let shown: Vec<String> =
                reasons.iter().take(6).map(|s| format!("{} ({})", s.reason, s.count)).collect();
            let more = reasons.len().saturating_sub(6);
            let more = if more > 0 { format!(", and {more} more reasons") } else { String::new() };
            log::info(&format!("skipped: {}{more}", shown.join(", ")));
        }
        if self.config.kernels.early_start {
            let early = self.backend.as_ref().map_or(0, |b| b.early_launches());
            log::info(&format!(
                "early start: {early} launches started early{}",
                if early == 0 {
                    " (none: not supported here, or the driver refused the first one)"
                } else {
                    ""
                }
            ));
        }
        if let Some(sel) = graph_select::get() {
            let st = &sel.stats;
            let n = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
            if n(&st.graphs_selected) > 0 {
                log::info(&format!(
                    "graph launch selection: {} graphs, {} replays checked, {} plain, {} dropped on a change",
                    n(&st.graphs_selected),
                    n(&st.replays_checked),
                    n(&st.replays_plain),
                    n(&st.dropped_on_update)
                ));
            }
        }
    }

    fn skipped_total(&self) -> u64 {
        self.skip_counts().values().sum()
    }

    /// Skips by reason, the paused ones included.
    fn skip_counts(&self) -> BTreeMap<String, u64> {
        let mut counts = self.stats.skipped.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let paused = self.stats.paused.load(Ordering::Relaxed);
        if paused > 0 {
            *counts.entry(PAUSED_SKIP.to_string()).or_insert(0) += paused;
        }
        let starting = PASSED_WHILE_STARTING.load(Ordering::Relaxed);
        if starting > 0 {
            *counts.entry(STARTING_SKIP.to_string()).or_insert(0) += starting;
        }
        counts
    }
}

/// Sites with N at least this large are treated as LM heads (logits metrics) in rows/full mode.
pub const LOGITS_MIN_N: u64 = 32_000;
pub const LOGITS_TOPK: u32 = 5;

extern "C" fn at_exit() {
    let _ = std::panic::catch_unwind(|| {
        if let Some(Some(e)) = ENGINE.get() {
            if !FORKED_CHILD.load(Ordering::Relaxed) {
                e.shutdown();
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::{StartOnce, StillStarting};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    /// A decoded call handed to the engine as an interposer would (its sampling key fixed).
    struct TestCall(crate::intercept::InterceptedGemm);

    impl crate::intercept::GemmArgs for TestCall {
        const ENTRY: &'static str = "cublasGemmEx";
        fn quick_key(&self) -> u64 {
            0x5eed
        }
        fn decode(&self) -> Result<crate::intercept::InterceptedGemm, crate::intercept::Skip> {
            Ok(self.0.clone())
        }
        fn stream(&self) -> Option<u64> {
            Some(self.0.stream)
        }
    }

    /// Sketch mode with sampling `sample`, the rest as the environment's defaults.
    fn sketch_config(sample: &str) -> super::config::Config {
        super::config::Config::from_lookup(|k| match k {
            "QUANTSHADOW_MODE" => Some("sketch".into()),
            "QUANTSHADOW_SAMPLE" => Some(sample.into()),
            _ => None,
        })
    }

    #[test]
    fn threads_arriving_during_a_start_pass_instead_of_waiting() {
        let once = Arc::new(StartOnce::<u32>::new());
        let (entered_tx, entered_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let starter = {
            let once = once.clone();
            std::thread::spawn(move || {
                once.get_or_start(|| {
                    entered_tx.send(()).unwrap();
                    release_rx.recv().unwrap();
                    Some(7)
                })
                .map(|v| v.copied())
            })
        };
        entered_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        // The start is in progress and blocked: another caller gets an answer at once.
        let ran = AtomicBool::new(false);
        assert_eq!(
            once.get_or_start(|| {
                ran.store(true, Ordering::Relaxed);
                Some(1)
            }),
            Err(StillStarting)
        );
        assert!(!ran.load(Ordering::Relaxed), "a second start must never run");
        assert!(once.get().is_none());
        release_tx.send(()).unwrap();
        assert_eq!(starter.join().unwrap(), Ok(Some(7)));
        assert_eq!(once.get_or_start(|| Some(2)), Ok(Some(&7)));
        assert_eq!(once.get(), Some(&Some(7)));
    }

    #[test]
    fn captured_calls_keep_their_entries_and_leave_the_host_sampling_alone() {
        // Results of graph replays find their call's entry however many eager calls were
        // checked since the capture (kept with them, 8192 later eager calls pushed it out and
        // every later replay's result was dropped as "no longer remembered").
        use super::backend::{Backend, CheckRequest, Polled, PreCall};
        use super::{Engine, PENDING_CAP};
        use crate::formats::Format;
        use crate::intercept::{InterceptedGemm, RealCall, Skip};
        use crate::problem::{GemmBuffers, GemmProblem};
        use std::cell::Cell;
        use std::sync::atomic::AtomicBool;
        struct Capturing(Arc<AtomicBool>);
        impl Backend for Capturing {
            fn name(&self) -> &'static str {
                "capturing"
            }
            fn device(&self) -> (String, String) {
                ("gpu0".into(), "sm_test".into())
            }
            fn before_call(&self, _: &CheckRequest) -> Result<PreCall, Skip> {
                Ok(PreCall::default())
            }
            fn after_call(&self, _: &CheckRequest, _: PreCall) -> Result<(), Skip> {
                Ok(())
            }
            fn poll(&self, _: &mut Vec<Polled>) {}
            fn is_capturing(&self, _: u64) -> bool {
                self.0.load(Ordering::Relaxed)
            }
        }
        let capturing = Arc::new(AtomicBool::new(true));
        let config = sketch_config("all");
        let backend = Box::new(Capturing(capturing.clone()));
        let engine: &'static Engine = Box::leak(Box::new(Engine::assemble(config, Some(backend), 1, 1)));
        let call = TestCall(InterceptedGemm {
            entry: "cublasGemmEx",
            problem: GemmProblem::row_major(8, 16, 32, Format::Bf16, Format::Bf16, Format::Bf16),
            buffers: GemmBuffers { a: 0x10000, b: 0x20000, d: 0x30000, ..Default::default() },
            stream: 7,
            pointer_arrays: None,
        });
        let real = || 0;
        let run = || {
            let status = Cell::new(None);
            assert_eq!(engine.gemm(&call, &RealCall::for_test(&real, &status)), 0);
            engine.call_seq.load(Ordering::Relaxed) - 1
        };
        let captured = run();
        capturing.store(false, Ordering::Relaxed);
        let mut eager = 0;
        for _ in 0..PENDING_CAP + 100 {
            eager = run();
        }
        for replay in 0..3 {
            assert!(engine.call_meta(captured).is_some(), "replay {replay}");
        }
        assert!(engine.call_meta(eager).is_some(), "an eager call's one result");
        assert!(engine.call_meta(eager).is_none(), "taken by it");
        assert!(engine.call_meta(eager - PENDING_CAP as u64 - 50).is_none(), "eager entries stay bounded");
        engine.stop.store(true, Ordering::Release);

        // `first:K`: captures (sampled on the device at each replay) leave the host's count
        // alone, so the first K eager calls are still checked.
        let config = sketch_config("first:2,1/100");
        capturing.store(true, Ordering::Relaxed);
        let backend = Box::new(Capturing(capturing.clone()));
        let engine: &'static Engine = Box::leak(Box::new(Engine::assemble(config, Some(backend), 1, 1)));
        let run = || {
            let status = Cell::new(None);
            assert_eq!(engine.gemm(&call, &RealCall::for_test(&real, &status)), 0);
        };
        for _ in 0..5 {
            run();
        }
        assert_eq!(engine.stats.sampled.load(Ordering::Relaxed), 5, "every captured call, gated");
        capturing.store(false, Ordering::Relaxed);
        for _ in 0..3 {
            run();
        }
        // Calls 0 and 1 (the first 2), then call 2 (the first of each 100 after them).
        assert_eq!(engine.stats.sampled.load(Ordering::Relaxed), 8, "then the first eager calls");
        engine.stop.store(true, Ordering::Release);
    }

    #[test]
    fn captured_calls_that_say_the_same_share_one_entry_and_the_oldest_go_for_room() {
        use super::{CallMeta, PendingCalls, CAPTURED_CAP};
        use crate::formats::Format;
        use crate::problem::GemmProblem;
        let meta = |m: u64| CallMeta {
            entry: "cublasLtMatmul",
            problem: (&GemmProblem::row_major(m, 4096, 4096, Format::Bf16, Format::Bf16, Format::Bf16))
                .into(),
            site_name: Some("model.layers.0.mlp.up_proj".into()),
            injected: false,
            kernel: Some("sm90_xmma_gemm".into()),
        };
        let mut p = PendingCalls::default();
        // Two graphs per batch size (piecewise, full) of one layer: two distinct entries.
        for seq in 0..100 {
            p.remember_captured(seq, meta(if seq % 2 == 0 { 1 } else { 8 }));
        }
        assert_eq!(p.shared.len(), 2);
        assert!(p.captured.map.get(&3).is_some_and(|m| m.problem.m == 8));
        // Beyond the bound the oldest calls go; an entry no call says any more goes with them.
        for seq in 100..CAPTURED_CAP as u64 + 100 {
            p.remember_captured(seq, meta(16));
        }
        assert_eq!((p.captured.map.len(), p.captured_forgotten), (CAPTURED_CAP, 100));
        assert!(!p.captured.map.contains_key(&99));
        assert_eq!(p.shared.len(), 1, "only m = 16 is still said");
    }

    #[test]
    fn a_start_that_panics_leaves_none_for_good() {
        let once = StartOnce::<u32>::new();
        assert_eq!(once.get_or_start(|| panic!("start failed")), Ok(None));
        assert_eq!(once.get_or_start(|| Some(3)), Ok(None));
        assert_eq!(once.get(), Some(&None));
    }

    /// Host time of the engine's whole part of one eager sketch check under `sample all` (the
    /// sampling, the site, the bookkeeping of the call and the backend's part over a fake
    /// runtime whose launches do nothing; the poller thread runs as in a process). A benchmark,
    /// not a timed test: `cargo test --release -p quantshadow-runtime bench_engine_eager_sketch
    /// -- --ignored --nocapture`. On the GPU the decode and the driver's launch come on top.
    #[test]
    #[ignore]
    fn bench_engine_eager_sketch() {
        use super::{gpu, Engine};
        use crate::device::fake::FakeRuntime;
        use crate::device::GpuRuntime;
        use crate::formats::Format;
        use crate::intercept::{InterceptedGemm, RealCall};
        use crate::problem::{GemmBuffers, GemmProblem};
        use std::cell::Cell;
        let rt = Arc::new(FakeRuntime::with_kernels());
        let settings = gpu::GpuSettings {
            pool_bytes: 64 << 20,
            ring_capacity: 4096,
            sync_compile: true,
            sketch_detach: super::config::SketchDetach::Graphs,
            graph_select: false,
            side_stream: true,
            kernels: Default::default(),
        };
        let backend = gpu::GpuBackend::new(rt.clone(), "fake", &settings).unwrap();
        let config = sketch_config("all");
        let engine: &'static Engine =
            Box::leak(Box::new(Engine::assemble(config, Some(Box::new(backend)), 1, 1)));
        let (m, n, k) = (1024u64, 1024u64, 1024u64);
        let alloc = |elems: u64| rt.malloc(elems as usize * 2).unwrap();
        // Seven sites, as a Llama layer's projections: the same shape, distinct weights.
        let calls: Vec<TestCall> = (0..7)
            .map(|_| {
                TestCall(InterceptedGemm {
                    entry: "cublasGemmEx",
                    problem: GemmProblem::row_major(m, n, k, Format::Bf16, Format::Bf16, Format::Bf16),
                    buffers: GemmBuffers {
                        a: alloc(m * k),
                        b: alloc(k * n),
                        d: alloc(m * n),
                        ..Default::default()
                    },
                    stream: 7,
                    pointer_arrays: None,
                })
            })
            .collect();
        let real = || 0;
        let run = |c: &TestCall| {
            let status = Cell::new(None);
            assert_eq!(engine.gemm(c, &RealCall::for_test(&real, &status)), 0);
        };
        // What the poller does with a result (the fake writes none): untimed.
        let result_arrives = || {
            let seq = engine.call_seq.load(Ordering::Relaxed) - 1;
            engine.settled(seq);
            assert!(engine.call_meta(seq).is_some());
        };
        for c in &calls {
            run(c); // set-up: projections, programs
        }
        rt.quiet.store(true, Ordering::Relaxed);
        let warm_rounds = if std::env::var_os("QS_BENCH_COLD_ONLY").is_some() { 0 } else { 5 };
        for _ in 0..warm_rounds {
            let rounds = 20_000;
            let t = std::time::Instant::now();
            for _ in 0..rounds {
                for c in &calls {
                    run(c);
                    result_arrives();
                }
            }
            let per_call = t.elapsed().as_nanos() as f64 / (rounds * calls.len()) as f64;
            println!("engine eager sketch: {per_call:.0} ns per checked call");
        }
        // Cold caches, as in a host whose own code (Python, PyTorch's dispatcher, cuBLAS) runs
        // between two checked calls: 32 MiB (QS_BENCH_EVICT_MB) are walked before each timed call.
        let evict_mb: usize =
            std::env::var("QS_BENCH_EVICT_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(32);
        let mut evict = vec![0u64; evict_mb << 17];
        for round in 0..3 {
            let calls_timed = 3_000;
            let mut times = Vec::with_capacity(calls_timed);
            for i in 0..calls_timed {
                for (j, w) in evict.iter_mut().enumerate().step_by(8) {
                    *w = w.wrapping_add((i + j + round) as u64);
                }
                let t = std::time::Instant::now();
                run(&calls[i % calls.len()]);
                times.push(t.elapsed().as_nanos() as u64);
                result_arrives();
            }
            std::hint::black_box(&evict);
            times.sort_unstable();
            let mean = times.iter().sum::<u64>() as f64 / calls_timed as f64;
            println!(
                "engine eager sketch, cold caches ({evict_mb} MiB walked): median {} ns, mean {mean:.0} ns per checked call",
                times[calls_timed / 2]
            );
        }
        let skips = engine.skip_counts();
        println!("skips: {skips:?}");
        engine.stop.store(true, Ordering::Release);
    }
}
