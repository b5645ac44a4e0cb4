//! The reference side on a GPU: kernel programs, device buffers, the results ring, and the
//! launches of one check (reference GEMM, compare, sketch), over any [`GpuRuntime`].
//!
//! Per-call launches here allocate nothing when given scratch from a pool, never synchronise,
//! and write results into the ring in mapped host memory: they can be enqueued on a capturing
//! stream and replayed. Set-up (programs, weights' projections, buffers) happens outside.

use super::abi::{
    self, CompareGeometry, DeviceGate, KernelBuild, KernelParams, LaunchConfig, QsCompareParams, QsGemmDesc,
    QsMatrixDesc, QsPrepParams, QsRefParams, QsResultSlot, QsRingCtl, QsRingDesc, QsRingHeader, QsRowSel,
    QsSketchParams, QsWprojParams, SketchGeometry,
};
use super::pool::{DevicePool, PoolBlock};
use super::registry::{KernelRegistry, LoadedProgram};
use super::{
    DeviceError, DeviceInfo, DevicePtr, Event, Function, GpuRuntime, LaunchOrder, MappedHost, Stream,
};
use crate::formats::Format;
use rustc_hash::FxHashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Device memory: freed on drop, or returned to its pool.
pub struct DeviceBuffer {
    runtime: Arc<dyn GpuRuntime>,
    pub ptr: DevicePtr,
    pub bytes: usize,
    /// Some: a block of the checker's pool (returned by its own drop), not a driver allocation.
    block: Option<PoolBlock>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({:#x}, {} bytes)", self.ptr, self.bytes)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.block.is_none() {
            // SAFETY: allocated by this runtime's malloc and owned by this buffer alone.
            let _ = unsafe { self.runtime.free(self.ptr) };
        }
    }
}

impl DeviceBuffer {
    pub fn read(&self) -> Result<Vec<u8>, DeviceError> {
        let mut out = vec![0u8; self.bytes];
        self.runtime.copy_to_host_sync(&mut out, self.ptr)?;
        Ok(out)
    }
}

/// The results ring: header and slots in mapped host memory, the ticket counter in device
/// memory (atomics on mapped memory are not atomic across the bus).
pub struct ResultRing {
    runtime: Arc<dyn GpuRuntime>,
    mapped: MappedHost,
    ctl: DeviceBuffer,
    capacity: u32,
    consumed: u64,
    /// When the slot at `consumed` was first seen ready but not yet whole (hash mismatch).
    incomplete_since: Option<Instant>,
    /// Slots given up on: ready but never whole within [`INCOMPLETE_SLOT_TIMEOUT`].
    torn: u64,
}

/// How long a ready slot may stay incomplete before the poller skips it. The device writes a
/// slot's words without a fence, so they may arrive in any order, but all within microseconds
/// of each other; only a corrupted slot stays incomplete.
pub const INCOMPLETE_SLOT_TIMEOUT: Duration = Duration::from_secs(1);

// SAFETY: the mapped pointers are owned by the ring; access goes through &mut self.
unsafe impl Send for ResultRing {}

impl Drop for ResultRing {
    fn drop(&mut self) {
        // SAFETY: allocated by alloc_mapped of this runtime and owned by the ring alone.
        let _ = unsafe { self.runtime.free_mapped(&self.mapped) };
    }
}

const SLOT_BYTES: usize = std::mem::size_of::<QsResultSlot>();
const HEADER_BYTES: usize = std::mem::size_of::<QsRingHeader>();

impl ResultRing {
    pub fn new(runtime: Arc<dyn GpuRuntime>, capacity: u32) -> Result<ResultRing, DeviceError> {
        let capacity = capacity.max(1);
        let mapped = runtime.alloc_mapped(HEADER_BYTES + capacity as usize * SLOT_BYTES)?;
        let header = QsRingHeader {
            magic: abi::RING_MAGIC,
            abi_version: abi::ABI_VERSION,
            slot_size: SLOT_BYTES as u32,
            capacity,
            ..Default::default()
        };
        // SAFETY: the mapping holds HEADER_BYTES + capacity slots; QsRingHeader is plain data.
        // The slots start zeroed (pinned memory may be recycled): `ready` 0 is "not written".
        unsafe {
            std::ptr::write_bytes(mapped.host.add(HEADER_BYTES), 0, capacity as usize * SLOT_BYTES);
            std::ptr::write_unaligned(mapped.host as *mut QsRingHeader, header);
        }
        let ctl_bytes = std::mem::size_of::<QsRingCtl>();
        let ctl = runtime.malloc(ctl_bytes).and_then(|ptr| {
            let ctl = DeviceBuffer { ptr, bytes: ctl_bytes, runtime: runtime.clone(), block: None };
            runtime.copy_to_device_sync(ctl.ptr, &[0u8; std::mem::size_of::<QsRingCtl>()]).map(|()| ctl)
        });
        let ctl = match ctl {
            Ok(ctl) => ctl,
            Err(e) => {
                // SAFETY: allocated above by this runtime and not shared yet.
                let _ = unsafe { runtime.free_mapped(&mapped) };
                return Err(e);
            }
        };
        Ok(ResultRing { runtime, mapped, ctl, capacity, consumed: 0, incomplete_since: None, torn: 0 })
    }

    pub fn desc(&self) -> QsRingDesc {
        QsRingDesc {
            header_ptr: self.mapped.device,
            slots_ptr: self.mapped.device + HEADER_BYTES as u64,
            ctl_ptr: self.ctl.ptr,
            capacity: self.capacity,
            reserved: 0,
        }
    }

    /// The next completed slot, if any; publishes it as consumed so the device may reuse it.
    pub fn poll(&mut self) -> Option<QsResultSlot> {
        loop {
            let index = (self.consumed % self.capacity as u64) as usize;
            // SAFETY: the slot lies inside the mapping; volatile because the device writes it.
            let slot_ptr = unsafe { self.mapped.host.add(HEADER_BYTES + index * SLOT_BYTES) };
            // SAFETY: `ready` is the first u64 of the slot (abi pins the layout).
            let ready = unsafe { std::ptr::read_volatile(slot_ptr as *const u64) };
            if ready < self.consumed + 1 {
                return None; // not written yet (a previous lap's, or zero)
            }
            std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
            // SAFETY: the slot lies inside the mapping and is plain data.
            let slot = unsafe { std::ptr::read_volatile(slot_ptr as *const QsResultSlot) };
            // Whose result this is, from the slot as read (its first word may have changed).
            let now = Instant::now();
            let read = if slot.ready == self.consumed + 1 && slot.ticket == self.consumed {
                take_whole_slot(&slot, &mut self.incomplete_since, now)
            } else if lapped(&slot, self.consumed, self.capacity) {
                // A later lap's result took the slot: this ticket's was overwritten.
                SlotRead::GiveUp
            } else {
                // Words of two writers, or a later lap still arriving: waited for like a
                // slot that is not whole yet, then given up.
                incomplete_wait(&mut self.incomplete_since, now)
            };
            match read {
                SlotRead::Whole => {
                    self.publish_consumed();
                    return Some(slot);
                }
                SlotRead::NotYet => return None,
                SlotRead::GiveUp => {
                    self.torn += 1;
                    self.incomplete_since = None;
                    self.publish_consumed();
                }
            }
        }
    }

    fn publish_consumed(&mut self) {
        self.consumed += 1;
        // SAFETY: `consumed` is a u64 field of the header inside the mapping.
        unsafe {
            let header = self.mapped.host as *mut QsRingHeader;
            std::ptr::write_volatile(std::ptr::addr_of_mut!((*header).consumed), self.consumed);
        }
    }

    /// Results lost: not written because the ring was full, or written but never whole.
    pub fn dropped(&self) -> u64 {
        // SAFETY: `dropped` is a u64 field of the header inside the mapping.
        let full = unsafe {
            let header = self.mapped.host as *const QsRingHeader;
            std::ptr::read_volatile(std::ptr::addr_of!((*header).dropped))
        };
        full + self.torn
    }
}

/// What the poller makes of a slot whose `ready` word says it is written.
#[derive(Debug, PartialEq)]
enum SlotRead {
    Whole,
    /// Some words are still on their way: read it again later.
    NotYet,
    /// Incomplete for longer than [`INCOMPLETE_SLOT_TIMEOUT`]: skip it (counted as dropped).
    GiveUp,
}

/// Whether the slot of ticket `consumed` holds, whole, the result of a later ticket of the same
/// slot (`ticket` = `consumed` + laps * `capacity`): the result of `consumed` was overwritten.
/// Only a device claim past its margin (qs_ring_claim) can do that. The poller then counts the
/// lost result and goes on; what it cannot tell from "not written yet" is the reverse order
/// (the older result landing over the newer one), which would still stop it at the newer ticket.
fn lapped(slot: &QsResultSlot, consumed: u64, capacity: u32) -> bool {
    let cap = capacity.max(1) as u64;
    slot.ready == slot.ticket.wrapping_add(1)
        && slot.ticket > consumed
        && slot.ticket % cap == consumed % cap
        && slot.check == slot.expected_check()
}

fn take_whole_slot(slot: &QsResultSlot, incomplete_since: &mut Option<Instant>, now: Instant) -> SlotRead {
    if slot.check == slot.expected_check() {
        *incomplete_since = None;
        return SlotRead::Whole;
    }
    incomplete_wait(incomplete_since, now)
}

/// A slot that is ready but not (yet) whole: read again until [`INCOMPLETE_SLOT_TIMEOUT`] has
/// passed since it was first seen so, then given up.
fn incomplete_wait(incomplete_since: &mut Option<Instant>, now: Instant) -> SlotRead {
    let since = *incomplete_since.get_or_insert(now);
    if now.duration_since(since) < INCOMPLETE_SLOT_TIMEOUT {
        return SlotRead::NotYet;
    }
    *incomplete_since = None;
    SlotRead::GiveUp
}

/// What a graph branch is added after.
#[derive(Debug, Clone, Copy)]
pub enum BranchDeps<'a> {
    /// The capture's current dependencies on the stream, and this node as well.
    Frontier(Option<super::GraphNode>),
    /// Exactly these nodes of the capture.
    Exactly(&'a [super::GraphNode]),
}

/// A sketch program: A, B and D formats and the padded probe count ([`KernelBuild::sketch_kp`]).
type SketchProgramKey = (Format, Format, Format, u32);

/// The entries of one loaded sketch program, resolved once per program: a checked call then
/// builds no program key and looks no entry up by name (together ~9 us of host time per checked
/// call, measured inside PyTorch on an H100 host, docs/measurements/2026-11-27-h100-host-cost.md).
#[derive(Debug, Clone, Copy)]
pub struct SketchEntries {
    check: super::Function,
    /// Only where the formats have a lean check ([`abi::lean_sketch_formats`]): the lean check,
    /// and the two kernels of the split check (projections, finishing).
    lean: Option<super::Function>,
    split: Option<(super::Function, super::Function)>,
    snap: super::Function,
    snap_rows: super::Function,
    snap_all: super::Function,
}

impl SketchEntries {
    fn resolve(program: &LoadedProgram, a: Format, d: Format) -> Result<SketchEntries, DeviceError> {
        let entry = |stem: &str| program.function(&format!("{stem}_{}_{}", a.name(), d.name()));
        Ok(SketchEntries {
            check: entry("qs_sketch_check")?,
            lean: if abi::lean_sketch_formats(a, d) { Some(entry("qs_sketch_lean")?) } else { None },
            // Optional: a program without them still serves every other check.
            split: if abi::lean_sketch_formats(a, d) {
                entry("qs_sketch_proj").and_then(|p| Ok((p, entry("qs_sketch_fin")?))).ok()
            } else {
                None
            },
            snap: entry("qs_sketch_snap")?,
            snap_rows: entry("qs_sketch_snap_rows")?,
            snap_all: program.function("qs_sketch_snap_all")?,
        })
    }
}

/// One device's programs, ring and launch helpers.
pub struct GpuChecker {
    runtime: Arc<dyn GpuRuntime>,
    pub info: DeviceInfo,
    registry: KernelRegistry,
    /// Replaced only through [`GpuChecker::replace_ring_with`], which keeps `ring_desc` in step.
    ring: Mutex<ResultRing>,
    /// When set, every buffer comes from this reservation (no driver allocation per site).
    pool: Option<Arc<DevicePool>>,
    /// Sketch checks take `qs_sketch_lean` where the call allows ([`lean_sketch_device`];
    /// `QUANTSHADOW_SKETCH_LEAN=0` turns it off; benchmarks switch it to compare).
    lean_sketch: AtomicBool,
    /// Captured checks (CUDA graphs) may take it too: `QUANTSHADOW_SKETCH_LEAN=graphs`, off by
    /// default until the lean kernel's clusters have run inside graphs on a GPU.
    lean_in_graphs: AtomicBool,
    /// Checks and snapshot copies that follow the production GEMM on its stream start early
    /// (programmatic dependent launch) where the device allows ([`early_start_device`] and the
    /// runtime's `early_launch`). Off unless `QUANTSHADOW_EARLY_START=1`: correct on an H100
    /// (`selftest --only early`) and 2-5 us faster per fused check on the stream, but blocks
    /// that start early hold SMs behind the kernel ahead (docs/measurements/
    /// 2026-11-26-h100-early-start.md). Split checks' projections never start early (measured
    /// slower, [`Self::prepare_split_check`]).
    early_start: AtomicBool,
    /// Launches that started early (the selftest shows that the path ran).
    early_launches: AtomicU64,
    /// Which eager checks that take the lean kernel are split (`qs_sketch_proj` on the caller's
    /// stream, `qs_sketch_fin` on a side stream; the shim decides per call), a [`SplitUse`] as
    /// u8: where the lean check runs, `QUANTSHADOW_SKETCH_SPLIT` (default `auto`: GEMMs of at
    /// least [`SPLIT_AUTO_MIN_FLOPS`]). On an H100 it took 1-7 points off an FP8 4096^3 GEMM's
    /// check and 3-6 off bf16's, and cost the host-bound prefill of a 1024-wide Llama 10-50
    /// points more than the fused check: its host pays four more driver calls per check
    /// (docs/measurements/2026-11-27-h100-split-in-turn.md).
    split_sketch: AtomicU8,
    /// The result ring's descriptor, apart from the ring: the poller holds the ring's lock while
    /// it reads slots, and every check's parameters need the descriptor.
    ring_desc: Mutex<abi::QsRingDesc>,
    /// The entries of each sketch program, resolved once (see [`SketchEntries`]).
    sketch_entries: Mutex<FxHashMap<SketchProgramKey, SketchEntries>>,
    /// Buffers that work already queued may still write after the set-up that made them failed
    /// (see [`HeldBuffers`]).
    held: Mutex<HeldBuffers>,
}

/// Buffers a failed set-up leaves to work it had already queued on a stream: each set goes back
/// to the pool once an event recorded behind that work is done, found by a query at a later
/// hold or set-up, never by waiting (the stream is the caller's).
#[derive(Default)]
struct HeldBuffers {
    pending: Vec<(Event, Vec<DeviceBuffer>)>,
    /// Events whose buffers went back, for the next hold.
    spare: Vec<Event>,
}

/// Sets held at most; past it (a device that refuses launch after launch) a set is never
/// returned to the pool, which stays bounded by its reservation.
const HELD_MAX: usize = 64;

impl HeldBuffers {
    /// Returns the sets whose work has run to the pool.
    fn release_done(&mut self, runtime: &dyn GpuRuntime) {
        let mut i = 0;
        while i < self.pending.len() {
            if runtime.event_done(self.pending[i].0).unwrap_or(false) {
                let (event, _buffers) = self.pending.swap_remove(i);
                self.spare.push(event);
            } else {
                i += 1;
            }
        }
    }

    /// Keeps `buffers` until the work queued on `stream` so far has run.
    fn hold(&mut self, runtime: &dyn GpuRuntime, stream: Stream, buffers: Vec<DeviceBuffer>) {
        self.release_done(runtime);
        if self.pending.len() < HELD_MAX {
            let event = self.spare.pop().map_or_else(|| runtime.create_sync_event(), Ok);
            if let Ok(e) = event.and_then(|e| runtime.record_event(e, stream).map(|()| e)) {
                self.pending.push((e, buffers));
                return;
            }
        }
        // No way to tell when that work has run: these blocks are never reused.
        std::mem::forget(buffers);
    }
}

/// Where sketch checks may take the lean kernel (`QUANTSHADOW_SKETCH_LEAN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeanUse {
    /// `0`: always the general kernel.
    Off,
    /// `1` (default): outside CUDA graphs.
    Eager,
    /// `graphs`: captured checks too (correct in a 64-row decode graph on an H100; speed unmeasured).
    Graphs,
}

/// The kernel choices the environment may change, read and validated in one place for the
/// shim (`engine::config`) and the GPU tools (`GpuChecker::new`); the device decides what
/// it supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelChoices {
    pub lean: LeanUse,
    /// `QUANTSHADOW_EARLY_START=1` (default `0`): see [`GpuChecker`]'s `early_start`.
    pub early_start: bool,
    /// `QUANTSHADOW_SKETCH_SPLIT=0|1|auto` (default `auto`): see [`GpuChecker`]'s `split_sketch`.
    pub split: SplitUse,
}

impl Default for KernelChoices {
    fn default() -> Self {
        KernelChoices { lean: LeanUse::Eager, early_start: false, split: SplitUse::Large }
    }
}

/// Which eager sketch checks are split (`QUANTSHADOW_SKETCH_SPLIT`; see [`GpuChecker`]'s
/// `split_sketch`). Among calls that can be split at all (64 or more sampled rows, the lean
/// check, a side stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SplitUse {
    /// `0`: none.
    Off = 0,
    /// `auto` (default): GEMMs of at least [`SPLIT_AUTO_MIN_FLOPS`], long enough on the GPU
    /// that the check's time there, not the host's four extra driver calls, is what a caller
    /// waits for.
    Large = 1,
    /// `1`: every one.
    On = 2,
}

impl SplitUse {
    fn from_u8(v: u8) -> SplitUse {
        match v {
            1 => SplitUse::Large,
            2 => SplitUse::On,
            _ => SplitUse::Off,
        }
    }
    /// The setting's value of `QUANTSHADOW_SKETCH_SPLIT`, as recorded.
    pub fn name(self) -> &'static str {
        match self {
            SplitUse::Off => "0",
            SplitUse::Large => "auto",
            SplitUse::On => "1",
        }
    }
    /// Whether a GEMM of `flops` (2 M N K over its batch) is split under this setting.
    pub fn splits(self, flops: f64) -> bool {
        match self {
            SplitUse::Off => false,
            SplitUse::Large => flops >= SPLIT_AUTO_MIN_FLOPS,
            SplitUse::On => true,
        }
    }
}

/// Smallest GEMM (2 M N K) a split check is taken for under `auto`: 2^35, ~25 us of FP8 or
/// ~45 us of bf16 on an H100. An FP8 4096^3 GEMM (2^37) and Llama-8B's 1024-token attention
/// projections q and o (2^35) are at or above it; its k and v projections (2^33) and every GEMM
/// of a 1024-wide model's prefill are below. Session 26 (H100, 8b-width prefill of 1024 tokens):
/// every eager check split put 137 us less per prefill on the caller's stream than 2^36 did
/// (docs/measurements/2026-11-27-h100-probes-and-units.md); 2^35 keeps the fused check where the
/// host, not the GPU, bounds the caller.
pub const SPLIT_AUTO_MIN_FLOPS: f64 = 34_359_738_368.0;

use crate::engine::config::on_off;

impl KernelChoices {
    /// Reads both settings through `get`; a value that is not one of the documented ones is
    /// named in the returned warnings and the default is used.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> (KernelChoices, Vec<String>) {
        let mut warnings = Vec::new();
        let mut choices = KernelChoices::default();
        if let Some(v) = get("QUANTSHADOW_SKETCH_LEAN").filter(|v| !v.trim().is_empty()) {
            if v.trim().eq_ignore_ascii_case("graphs") {
                choices.lean = LeanUse::Graphs;
            } else {
                match on_off(&v) {
                    Some(on) => choices.lean = if on { LeanUse::Eager } else { LeanUse::Off },
                    None => {
                        warnings.push(format!("QUANTSHADOW_SKETCH_LEAN={v:?} is not 0, 1 or graphs; using 1"))
                    }
                }
            }
        }
        if let Some(v) = get("QUANTSHADOW_EARLY_START").filter(|v| !v.trim().is_empty()) {
            match on_off(&v) {
                Some(on) => choices.early_start = on,
                None => warnings.push(format!("QUANTSHADOW_EARLY_START={v:?} is not 0 or 1; using 0")),
            }
        }
        if let Some(v) = get("QUANTSHADOW_SKETCH_SPLIT").filter(|v| !v.trim().is_empty()) {
            if v.trim().eq_ignore_ascii_case("auto") {
                choices.split = SplitUse::Large;
            } else {
                match on_off(&v) {
                    Some(on) => choices.split = if on { SplitUse::On } else { SplitUse::Off },
                    None => warnings
                        .push(format!("QUANTSHADOW_SKETCH_SPLIT={v:?} is not 0, 1 or auto; using auto")),
                }
            }
        }
        (choices, warnings)
    }

    /// For the session record: `sketch_lean`, `early_start` and `sketch_split` as set (the
    /// device may not support them; the backend's start line says what it runs).
    pub fn settings(&self) -> [(&'static str, &'static str); 3] {
        let lean = match self.lean {
            LeanUse::Off => "0",
            LeanUse::Eager => "1",
            LeanUse::Graphs => "graphs",
        };
        let flag = |on: bool| if on { "1" } else { "0" };
        [("sketch_lean", lean), ("early_start", flag(self.early_start)), ("sketch_split", self.split.name())]
    }
}

/// Whether the device can start a kernel before the grid ahead of it finishes: CUDA sm_90 or
/// newer (programmatic dependent launch).
pub fn early_start_device(info: &DeviceInfo) -> bool {
    lean_sketch_device(info)
}

/// Whether the device runs the lean sketch check: CUDA sm_90 or newer (thread-block clusters).
pub fn lean_sketch_device(info: &DeviceInfo) -> bool {
    let digits: String =
        info.arch.strip_prefix("sm_").unwrap_or("").chars().take_while(|c| c.is_ascii_digit()).collect();
    info.vendor == super::Vendor::Nvidia && digits.parse::<u32>().is_ok_and(|cc| cc >= 90)
}

/// A launch resolved once (function, geometry, parameters) and enqueued many times: the
/// per-call cost is one driver launch, nothing else.
pub struct PreparedLaunch<P: KernelParams> {
    function: super::Function,
    config: LaunchConfig,
    pub params: P,
    /// Launched to start before the grid ahead of it on its stream finishes (the kernel waits
    /// for that grid before reading its memory: `qs_wait_prior_grid`). Only for kernels whose
    /// work before that wait reads nothing the stream's earlier work may still be writing.
    pub early_start: bool,
}

/// A detached check's snapshot copy: the copy of every row (`qs_sketch_snap_all`, decode) or
/// the copy kernels of sampled rows and of every layout (`qs_sketch_snap_rows_{a}_{d}`,
/// `qs_sketch_snap_{a}_{d}`). Not boxed: one is prepared per checked call, without allocating.
#[allow(clippy::large_enum_variant)]
pub enum SnapCopy {
    EveryRow(PreparedLaunch<abi::QsSnapAllParams>),
    Rows(PreparedLaunch<abi::QsSnapParams>),
}

impl SnapCopy {
    /// The next eager epoch (the host counts eager epochs): the next rows of a sampled copy.
    pub fn advance_epoch(&mut self) {
        match self {
            SnapCopy::EveryRow(c) => c.params.epoch += 1,
            SnapCopy::Rows(c) => c.params.rows.next_epoch(),
        }
    }
}

impl PreparedLaunch<QsSketchParams> {
    /// The same check over at most `splits` K/N splits per group (fewer, wider blocks; the
    /// scratch sized for more serves fewer): for many checks launched at once, which would
    /// otherwise queue behind each other's blocks.
    pub fn narrow_splits(&mut self, splits: u32) {
        if self.is_lean() {
            return; // one cluster of LEAN_SPLITS blocks per group, whatever the others get
        }
        let s = splits.clamp(1, self.params.splits);
        self.params.splits = s;
        self.config.grid[1] = s;
    }

    /// Row groups of the launch (its blocks per split).
    pub fn groups(&self) -> u64 {
        self.config.grid[0] as u64
    }

    /// Whether this is the lean check (`qs_sketch_lean`: only it reads W_R in fragment order).
    pub fn is_lean(&self) -> bool {
        self.params.wfrag_ptr != 0
    }

    /// What [`abi::plan_shared_splits`] needs of this check: its groups, the splits it can run
    /// with (at most those it was prepared with, its scratch's; a lean check exactly those), and
    /// the bytes one group reads over all its splits: W_R (K x kp, 4 bytes each, once per block)
    /// and its rows of A and D.
    pub fn split_demand(&self) -> abi::SplitDemand {
        let p = &self.params;
        // A row's bytes (4-bit formats packed); 2 per element where the code is not a format.
        let row_bytes = |code: u32, len: u64| {
            format_of(code).map_or(len.saturating_mul(2), |f| f.bytes_for(len as usize) as u64)
        };
        let rows = (p.rows_per_group as u64).min(p.rows.count).max(1);
        abi::SplitDemand {
            groups: self.groups(),
            min_splits: if self.is_lean() { p.splits } else { 1 },
            max_splits: p.splits,
            block_slots: if self.is_lean() { abi::SKETCH_BLOCKS_PER_SM } else { 1 },
            bytes_per_group: (p.g.k.saturating_mul(p.kp as u64 * 4)).saturating_add(rows.saturating_mul(
                row_bytes(p.g.a.format, p.g.k).saturating_add(row_bytes(p.g.d.format, p.g.n)),
            )),
        }
    }
}

/// What one compare reads: rows of D and an f32 reference of the same rows.
#[derive(Debug, Clone, Copy)]
pub struct CompareRequest {
    pub d: QsMatrixDesc,
    /// Rows per batch item and columns of D.
    pub m: u64,
    pub n: u64,
    pub rows: QsRowSel,
    /// f32 reference: row t at `reference + 4 * t * ref_ld`.
    pub reference: DevicePtr,
    pub ref_ld: u64,
    /// Some(k): an LM head; per-row softmax KL, top-1 and top-k overlap as well.
    pub logits_topk: Option<u32>,
    /// abi::CHECK_ROWS or abi::CHECK_FULL (recorded in the slot).
    pub kind: u32,
    /// Host-chosen identity written into the slot (site, call).
    pub tag: (u64, u64),
}

/// Scratch of one compare (device memory), sized by its geometry.
pub struct CompareScratch {
    geometry: CompareGeometry,
    partials: DeviceBuffer,
    rowout: Option<DeviceBuffer>,
    counter: DeviceBuffer,
    status: DeviceBuffer,
}

/// Scratch of one sketch check (device memory), sized by its geometry.
pub struct SketchScratch {
    pub geometry: SketchGeometry,
    partials: DeviceBuffer,
    /// The check's totals: zero before the first launch, left zero by every launch (the
    /// finishing block resets what it reads).
    totals: DeviceBuffer,
    row_records: DeviceBuffer,
    counters: DeviceBuffer,
    status: DeviceBuffer,
    pub row_stats: Option<DeviceBuffer>,
}

impl SketchScratch {
    /// Where its partials are (tests: which scratch a launched check was given).
    #[cfg(test)]
    pub(crate) fn partials_ptr(&self) -> u64 {
        self.partials.ptr
    }

    /// Whether a check of `geometry` fits in these buffers (a check of the scratch's own
    /// geometry always does). The lean form of a check needs no more than its general one
    /// (its splits meet in distributed shared memory, not in the partials; its rows' records
    /// are the sampled rows'), so it fits too.
    pub fn fits(&self, geometry: &SketchGeometry) -> bool {
        let (partials, records, counters) = general_needs(geometry);
        partials <= self.partials.bytes as u64
            && records <= self.row_records.bytes as u64
            && counters <= self.counters.bytes as u64
    }
}

/// Bytes of partials, row records and counters a check of `geometry` needs.
fn general_needs(geometry: &SketchGeometry) -> (u64, u64, u64) {
    (geometry.partials_bytes(), geometry.row_record_bytes(), geometry.counters_bytes())
}

/// Per-weight sketch state: probe signs, their sums, the bias projection and W_R = B_ref R.
pub struct SketchWeight {
    pub seed: u64,
    pub k: u32,
    pub kp: u32,
    signs: DeviceBuffer,
    rsum: DeviceBuffer,
    bproj: DeviceBuffer,
    wr: DeviceBuffer,
    wr_batch_stride: u64,
    /// W_R in fragment order for the lean check (one W_R, K a multiple of 32, lean device).
    wfrag: Option<DeviceBuffer>,
    /// Samples of B at projection time (see `status::WEIGHT_CHANGED`).
    snapshot: DeviceBuffer,
    /// The prep kernel's scratch, kept until the weight is dropped (it may still be running).
    _prep: (DeviceBuffer, DeviceBuffer, DeviceBuffer),
}

impl GpuChecker {
    pub fn new(runtime: Arc<dyn GpuRuntime>, ring_capacity: u32) -> Result<GpuChecker, DeviceError> {
        let info = runtime.current_device()?;
        let registry = KernelRegistry::new(runtime.as_ref(), &info.arch)?;
        let ring = ResultRing::new(runtime.clone(), ring_capacity)?;
        // The environment's choices (the shim applies its validated copy again: `apply`).
        let (choices, warnings) = KernelChoices::from_lookup(|k| std::env::var(k).ok());
        for w in warnings {
            tracing::warn!("{w}");
        }
        let checker = GpuChecker {
            runtime,
            info,
            registry,
            pool: None,
            lean_sketch: AtomicBool::new(false),
            lean_in_graphs: AtomicBool::new(false),
            split_sketch: AtomicU8::new(SplitUse::Off as u8),
            early_start: AtomicBool::new(false),
            early_launches: AtomicU64::new(0),
            ring_desc: Mutex::new(ring.desc()),
            ring: Mutex::new(ring),
            sketch_entries: Mutex::new(FxHashMap::default()),
            held: Mutex::default(),
        };
        checker.apply(choices);
        Ok(checker)
    }

    /// Takes `choices` where the device supports them.
    pub fn apply(&self, choices: KernelChoices) {
        let lean = self.set_lean_sketch(choices.lean != LeanUse::Off);
        self.lean_in_graphs.store(lean && choices.lean == LeanUse::Graphs, Ordering::Relaxed);
        let split = if lean { choices.split } else { SplitUse::Off };
        self.split_sketch.store(split as u8, Ordering::Relaxed);
        self.set_early_start(choices.early_start);
    }

    /// Which eager checks that take the lean kernel are split (see `split_sketch`).
    pub fn split_sketch(&self) -> SplitUse {
        if !self.lean_sketch() {
            return SplitUse::Off;
        }
        SplitUse::from_u8(self.split_sketch.load(Ordering::Relaxed))
    }

    /// Whether sketch checks prepared from now on may take the lean kernel.
    pub fn lean_sketch(&self) -> bool {
        self.lean_sketch.load(Ordering::Relaxed)
    }

    /// Turns the lean sketch check on or off for checks prepared from now on (benchmarks and
    /// the selftest compare both); on only where the device supports it. Returns the setting.
    pub fn set_lean_sketch(&self, on: bool) -> bool {
        let on = on && lean_sketch_device(&self.info);
        self.lean_sketch.store(on, Ordering::Relaxed);
        on
    }

    /// Whether checks and copies prepared from now on start early (see [`GpuChecker`]).
    pub fn early_start(&self) -> bool {
        self.early_start.load(Ordering::Relaxed)
    }

    /// Launches so far that started early (launched with the programmatic-launch attribute).
    pub fn early_launches(&self) -> u64 {
        self.early_launches.load(Ordering::Relaxed)
    }

    /// Turns early starts on or off for launches prepared from now on; on only where the
    /// device and runtime support them. Returns the setting.
    pub fn set_early_start(&self, on: bool) -> bool {
        let on = on && early_start_device(&self.info) && self.runtime.early_launch();
        self.early_start.store(on, Ordering::Relaxed);
        on
    }

    /// Puts a new ring of `capacity` slots in place and returns the old one (selftests of the
    /// ring protocol; nothing may be running that writes into the old ring).
    pub fn replace_ring(&self, capacity: u32) -> Result<ResultRing, DeviceError> {
        let ring = ResultRing::new(self.runtime.clone(), capacity)?;
        Ok(self.replace_ring_with(ring))
    }

    /// Puts `ring` back in place; returns the one it replaces.
    pub fn replace_ring_with(&self, ring: ResultRing) -> ResultRing {
        let mut current = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        *self.ring_desc.lock().unwrap_or_else(|e| e.into_inner()) = ring.desc();
        std::mem::replace(&mut *current, ring)
    }

    /// The result ring's descriptor (never waits for the poller).
    pub fn ring_desc(&self) -> abi::QsRingDesc {
        *self.ring_desc.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` on the result ring under its lock (the poller's reads, the drop count).
    pub fn with_ring<R>(&self, f: impl FnOnce(&mut ResultRing) -> R) -> R {
        f(&mut self.ring.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The entries of the sketch program for (a, b, d, kp), compiling or loading it if needed.
    pub fn sketch_entries(
        &self,
        a: Format,
        b: Format,
        d: Format,
        kp: u32,
    ) -> Result<SketchEntries, DeviceError> {
        if let Some(e) = self.cached_sketch_entries((a, b, d, kp)) {
            return Ok(e);
        }
        let program = self.program(&KernelBuild::sketch_kp(a, b, d, kp).map_err(abi_err)?)?;
        self.remember_sketch_entries((a, b, d, kp), &program)
    }

    /// [`Self::sketch_entries`] where the program is loaded already; None otherwise (never
    /// compiles: the caller decides how a program gets loaded).
    pub fn loaded_sketch_entries(&self, a: Format, b: Format, d: Format, kp: u32) -> Option<SketchEntries> {
        if let Some(e) = self.cached_sketch_entries((a, b, d, kp)) {
            return Some(e);
        }
        let program = self.registry.loaded(&KernelBuild::sketch_kp(a, b, d, kp).ok()?)?;
        self.remember_sketch_entries((a, b, d, kp), &program).ok()
    }

    fn cached_sketch_entries(&self, key: SketchProgramKey) -> Option<SketchEntries> {
        self.sketch_entries.lock().unwrap_or_else(|e| e.into_inner()).get(&key).copied()
    }

    fn remember_sketch_entries(
        &self,
        key: SketchProgramKey,
        program: &LoadedProgram,
    ) -> Result<SketchEntries, DeviceError> {
        // Functions stay valid while the registry holds their program: for the checker's life.
        let entries = SketchEntries::resolve(program, key.0, key.2)?;
        self.sketch_entries.lock().unwrap_or_else(|e| e.into_inner()).insert(key, entries);
        Ok(entries)
    }

    /// Takes every later buffer from `pool` instead of the driver.
    pub fn with_pool(mut self, pool: Arc<DevicePool>) -> GpuChecker {
        self.pool = Some(pool);
        self
    }

    pub fn pool(&self) -> Option<&Arc<DevicePool>> {
        self.pool.as_ref()
    }

    /// Whether the pool has room for set-ups that only later calls may use (its last quarter is
    /// kept for what every new site needs: its weight projection). True without a pool.
    pub fn room_for_extras(&self) -> bool {
        // One relaxed load: asked at every eager call of a row count without state of its own.
        self.pool.as_ref().is_none_or(|p| p.in_use() <= p.capacity() / 4 * 3)
    }

    /// Gives `scratch` back to the pool once the work enqueued on `stream` so far has run (a
    /// check may still be using it); never waits.
    pub fn retire_scratch(&self, scratch: SketchScratch, stream: Stream) {
        let SketchScratch { partials, totals, row_records, counters, status, row_stats, .. } = scratch;
        let mut buffers = vec![partials, totals, row_records, counters, status];
        buffers.extend(row_stats);
        self.held.lock().unwrap_or_else(|e| e.into_inner()).hold(self.runtime.as_ref(), stream, buffers);
    }

    pub fn registry(&self) -> &KernelRegistry {
        &self.registry
    }

    pub fn runtime(&self) -> &Arc<dyn GpuRuntime> {
        &self.runtime
    }

    /// Buffer sets a failed set-up left held behind queued work ([`HeldBuffers`]).
    #[cfg(test)]
    pub(crate) fn held_sets(&self) -> usize {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).pending.len()
    }

    pub fn program(&self, build: &KernelBuild) -> Result<Arc<LoadedProgram>, DeviceError> {
        self.registry.program(self.runtime.as_ref(), build)
    }

    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, DeviceError> {
        if let Some(pool) = &self.pool {
            let block =
                pool.take(bytes.max(1)).map_err(|e| DeviceError::Unsupported(format!("device pool: {e}")))?;
            return Ok(DeviceBuffer {
                ptr: block.ptr(),
                bytes,
                runtime: self.runtime.clone(),
                block: Some(block),
            });
        }
        Ok(DeviceBuffer {
            ptr: self.runtime.malloc(bytes.max(1))?,
            bytes,
            runtime: self.runtime.clone(),
            block: None,
        })
    }

    pub fn alloc_zeroed(&self, bytes: usize) -> Result<DeviceBuffer, DeviceError> {
        let b = self.alloc(bytes)?;
        self.runtime.copy_to_device_sync(b.ptr, &vec![0u8; bytes])?;
        Ok(b)
    }

    pub fn upload(&self, data: &[u8]) -> Result<DeviceBuffer, DeviceError> {
        let b = self.alloc(data.len())?;
        self.runtime.copy_to_device_sync(b.ptr, data)?;
        Ok(b)
    }

    /// Launches `entry` of `build` with `params` as its single by-value parameter.
    pub fn launch<P: KernelParams>(
        &self,
        build: &KernelBuild,
        entry: &str,
        config: &LaunchConfig,
        params: &P,
        stream: Stream,
    ) -> Result<(), DeviceError> {
        let function = self.program(build)?.function(entry)?;
        self.launch_function(function, config, params, stream)
    }

    /// Launches `function`, an entry whose single by-value parameter is a `P`.
    fn launch_function<P: KernelParams>(
        &self,
        function: Function,
        config: &LaunchConfig,
        params: &P,
        stream: Stream,
    ) -> Result<(), DeviceError> {
        let mut param_ptrs = [params as *const P as *mut c_void];
        // SAFETY: every kernel of the ABI takes exactly one parameter of type P (abi.rs pins
        // the entry -> params pairing) and P is plain data the driver copies at launch.
        unsafe {
            self.runtime.launch(
                function,
                config.grid,
                config.block,
                config.shared_bytes,
                stream,
                &mut param_ptrs,
                LaunchOrder::InOrder,
            )
        }
    }

    /// Enqueues a prepared launch on `stream` (no allocation, no lookup, no synchronisation).
    pub fn launch_prepared<P: KernelParams>(
        &self,
        prepared: &PreparedLaunch<P>,
        stream: Stream,
    ) -> Result<(), DeviceError> {
        let mut param_ptrs = [&prepared.params as *const P as *mut c_void];
        let c = &prepared.config;
        let (rt, f, grid, block, shared) =
            (&self.runtime, prepared.function, c.grid, c.block, c.shared_bytes);
        // SAFETY: the function was resolved for exactly this parameter type when prepared; an
        // early start is set only for kernels that wait for the prior grid (PreparedLaunch).
        unsafe {
            if prepared.early_start && self.early_start() {
                match rt.launch(f, grid, block, shared, stream, &mut param_ptrs, LaunchOrder::Early) {
                    Ok(()) => {
                        self.early_launches.fetch_add(1, Ordering::Relaxed);
                        return Ok(());
                    }
                    // Nothing was launched: the ordinary launch below stands in, and so does
                    // every later one (a refusal would repeat: two driver calls per check).
                    Err(e) => {
                        if self.early_start.swap(false, Ordering::Relaxed) {
                            crate::engine::log::shared_warn(&format!(
                                "early start refused ({e}): checks launch in order from now on"
                            ));
                        }
                    }
                }
            }
            rt.launch(f, grid, block, shared, stream, &mut param_ptrs, LaunchOrder::InOrder)
        }
    }

    /// Enqueues a snapshot copy on `stream` ([`Self::launch_prepared`]).
    pub fn launch_copy(&self, copy: &SnapCopy, stream: Stream) -> Result<(), DeviceError> {
        match copy {
            SnapCopy::EveryRow(c) => self.launch_prepared(c, stream),
            SnapCopy::Rows(c) => self.launch_prepared(c, stream),
        }
    }

    /// A snapshot copy as a graph branch ([`Self::launch_prepared_branch`]).
    pub fn launch_copy_branch(
        &self,
        copy: &SnapCopy,
        stream: Stream,
        deps: BranchDeps<'_>,
    ) -> Result<super::GraphNode, DeviceError> {
        match copy {
            SnapCopy::EveryRow(c) => self.launch_prepared_branch(c, stream, deps),
            SnapCopy::Rows(c) => self.launch_prepared_branch(c, stream, deps),
        }
    }

    /// The same prepared launch as a graph branch of the capture in progress on `stream`, after
    /// `deps` (see [`GpuRuntime::launch_graph_branch`] and
    /// [`GpuRuntime::launch_graph_branch_from`]).
    pub fn launch_prepared_branch<P: KernelParams>(
        &self,
        prepared: &PreparedLaunch<P>,
        stream: Stream,
        deps: BranchDeps<'_>,
    ) -> Result<super::GraphNode, DeviceError> {
        let mut param_ptrs = [&prepared.params as *const P as *mut c_void];
        let c = &prepared.config;
        let (rt, f, grid, block, shared) =
            (&self.runtime, prepared.function, c.grid, c.block, c.shared_bytes);
        let params = &mut param_ptrs;
        // SAFETY: the function was resolved for exactly this parameter type when prepared; the
        // driver copies the parameter values into the node.
        unsafe {
            match deps {
                BranchDeps::Frontier(after) => {
                    rt.launch_graph_branch(f, grid, block, shared, stream, params, after)
                }
                BranchDeps::Exactly(nodes) => {
                    rt.launch_graph_branch_from(f, grid, block, shared, stream, params, nodes)
                }
            }
        }
    }

    /// A detached sketch check of the call `g` (`device::snapshot`): the copy ([`SnapCopy`]:
    /// `qs_sketch_snap_{a}_{d}`, or where `SnapshotLayout::lean_copy` allows its lean forms;
    /// launched on the caller's stream) of `rows` into the snapshot
    /// at `base`, and the check over that snapshot (launched after it, anywhere). The row epoch
    /// comes from `rows.epoch_value`, or from the device counter at `epoch_counter` when not 0
    /// (graph replays).
    #[allow(clippy::too_many_arguments)]
    pub fn prepare_detached(
        &self,
        g: &QsGemmDesc,
        layout: &super::snapshot::SnapshotLayout,
        rows: QsRowSel,
        base: DevicePtr,
        epoch_counter: DevicePtr,
        weight: &SketchWeight,
        scratch: &SketchScratch,
        tag: (u64, u64),
        captured: bool,
    ) -> Result<(SnapCopy, PreparedLaunch<QsSketchParams>), DeviceError> {
        let (a, b, d) = (format_of(g.a.format)?, format_of(g.b.format)?, format_of(g.d.format)?);
        let entries = self.sketch_entries(a, b, d, weight.kp)?;
        // The copy follows the production GEMM on its stream.
        let early_start = !captured && self.early_start();
        let copy = match layout.every_row_params(g, rows, base) {
            Some(params) => SnapCopy::EveryRow(PreparedLaunch {
                function: entries.snap_all,
                config: layout.launch,
                params,
                early_start,
            }),
            None => SnapCopy::Rows(PreparedLaunch {
                function: if super::snapshot::SnapshotLayout::lean_copy(g) {
                    entries.snap_rows
                } else {
                    entries.snap
                },
                config: layout.launch,
                params: layout.params(g, rows, base, epoch_counter),
                early_start,
            }),
        };
        let packed = layout.packed_desc(g, base);
        let mut check = self.prepare_sketch_check_with(
            entries,
            &packed,
            QsRowSel::all(layout.count),
            weight,
            scratch,
            tag,
            captured,
        )?;
        check.params.packed_ptr = base;
        // The check reads the copy's snapshot (its header epoch before any wait), so it keeps
        // the ordinary launch.
        check.early_start = false;
        Ok((copy, check))
    }

    /// `entry` of `build` resolved once with `params`, to launch with [`Self::launch_prepared`]
    /// (an early start only where the caller sets `early_start` and the kernel waits for the
    /// grid ahead before reading what it writes).
    pub fn prepare_kernel<P: KernelParams>(
        &self,
        build: &KernelBuild,
        entry: &str,
        config: LaunchConfig,
        params: P,
    ) -> Result<PreparedLaunch<P>, DeviceError> {
        Ok(PreparedLaunch {
            function: self.program(build)?.function(entry)?,
            config,
            params,
            early_start: false,
        })
    }

    /// Scratch for comparing `rows` rows of `n` columns (logits: with top-k rows).
    pub fn compare_scratch(&self, rows: u64, n: u64, logits: bool) -> Result<CompareScratch, DeviceError> {
        let geometry = CompareGeometry::new(rows, n, logits, self.info.multiprocessors, self.info.warp_size)
            .map_err(abi_err)?;
        Ok(CompareScratch {
            partials: self.alloc(geometry.partials_bytes() as usize)?,
            rowout: if logits {
                Some(self.alloc(rows as usize * std::mem::size_of::<abi::QsLogitsRow>())?)
            } else {
                None
            },
            counter: self.alloc_zeroed(4)?,
            status: self.alloc_zeroed(4)?,
            geometry,
        })
    }

    /// A compare of D rows against an f32 reference, resolved once; each launch writes a ring slot.
    pub fn prepare_compare(
        &self,
        request: &CompareRequest,
        scratch: &CompareScratch,
    ) -> Result<PreparedLaunch<QsCompareParams>, DeviceError> {
        let r = request;
        let d_format = format_of(r.d.format)?;
        let build = KernelBuild::compare(d_format).map_err(abi_err)?;
        let ring = self.ring_desc();
        let params = QsCompareParams {
            d: r.d,
            rows: r.rows,
            ring,
            tag: r.tag.0,
            tag2: r.tag.1,
            m: r.m,
            n: r.n,
            ref_ptr: r.reference,
            ref_ld: r.ref_ld,
            partials_ptr: scratch.partials.ptr,
            rowout_ptr: scratch.rowout.as_ref().map_or(0, |b| b.ptr),
            counter_ptr: scratch.counter.ptr,
            status_ptr: scratch.status.ptr,
            row_stats_ptr: 0,
            kind: if r.logits_topk.is_some() { abi::CHECK_LOGITS } else { r.kind },
            topk: r.logits_topk.unwrap_or(0),
            block_per_row: scratch.geometry.block_per_row as u32,
            reserved: 0,
            gate_ptr: 0,
            gate_first: 0,
            gate_every: 0,
        };
        let entry = match r.logits_topk {
            Some(_) => format!("qs_compare_logits_{}", d_format.name()),
            None => format!("qs_compare_{}", d_format.name()),
        };
        self.prepare_kernel(&build, &entry, scratch.geometry.launch, params)
    }

    /// Full or rows reference into `out` (f32, `out_ld` per row), rounded to D's format when
    /// `round_to_d`.
    pub fn reference(
        &self,
        g: &QsGemmDesc,
        rows: Option<(&DeviceBuffer, u64)>,
        out: &DeviceBuffer,
        out_ld: u64,
        round_to_d: bool,
        stream: Stream,
    ) -> Result<(), DeviceError> {
        match rows {
            None => self.reference_launch(g, None, out, out_ld, round_to_d, DeviceGate::default(), stream),
            Some((list, count)) => {
                let sel = QsRowSel::list(g.total_rows(), list.ptr, count);
                self.reference_launch(g, Some(sel), out, out_ld, round_to_d, DeviceGate::default(), stream)
            }
        }
    }

    /// Reference rows chosen by `rows` (any selection mode) into `out` (f32, `out_ld` per
    /// sampled row, in sample order), rounded to D's format when `round_to_d`, sampled on the
    /// device per launch by `gate` (graph replays; `DeviceGate::default()`: every launch).
    /// Needs the program loaded already when called from the shim (it is looked up, not
    /// compiled, then).
    #[allow(clippy::too_many_arguments)]
    pub fn reference_sel(
        &self,
        g: &QsGemmDesc,
        rows: QsRowSel,
        out: &DeviceBuffer,
        out_ld: u64,
        round_to_d: bool,
        gate: DeviceGate,
        stream: Stream,
    ) -> Result<(), DeviceError> {
        self.reference_launch(g, Some(rows), out, out_ld, round_to_d, gate, stream)
    }

    /// The full reference (`rows` None) or the rows kernel over a selection.
    #[allow(clippy::too_many_arguments)]
    fn reference_launch(
        &self,
        g: &QsGemmDesc,
        rows: Option<QsRowSel>,
        out: &DeviceBuffer,
        out_ld: u64,
        round_to_d: bool,
        gate: DeviceGate,
        stream: Stream,
    ) -> Result<(), DeviceError> {
        let (a, b) = (format_of(g.a.format)?, format_of(g.b.format)?);
        let build = KernelBuild::gemm_ref(a, b).map_err(abi_err)?;
        let (entry, sel, cfg) = match rows {
            None => (
                format!("qs_gemm_ref_{}_{}", a.name(), b.name()),
                QsRowSel::all(g.total_rows()),
                abi::gemm_ref_launch(g).map_err(abi_err)?,
            ),
            Some(sel) => (
                format!("qs_gemm_ref_rows_{}_{}", a.name(), b.name()),
                sel,
                abi::gemm_ref_rows_launch(g, sel.count).map_err(abi_err)?,
            ),
        };
        let params = QsRefParams {
            g: *g,
            rows: sel,
            out_ptr: out.ptr,
            out_ld,
            status_ptr: 0,
            round_to_d: round_to_d as u32,
            reserved: 0,
            gate_ptr: gate.ptr,
            gate_first: gate.first,
            gate_every: gate.every,
        };
        self.launch(&build, &entry, &cfg, &params, stream)
    }

    /// Compares rows of D with an f32 reference once (scratch allocated here, synchronises):
    /// for the selftest and tools; the shim prepares once and launches per call.
    pub fn compare(&self, request: &CompareRequest, stream: Stream) -> Result<(), DeviceError> {
        let scratch = self.compare_scratch(request.rows.count, request.n, request.logits_topk.is_some())?;
        let prepared = self.prepare_compare(request, &scratch)?;
        self.launch_prepared(&prepared, stream)?;
        self.runtime.synchronize(stream)
    }

    /// Probe signs, sums and W_R = B_ref R for one weight (set-up; synchronises).
    pub fn sketch_weight(
        &self,
        g: &QsGemmDesc,
        a: Format,
        d: Format,
        seed: u64,
        k: u32,
    ) -> Result<SketchWeight, DeviceError> {
        let w = self.sketch_weight_on(g, a, d, seed, k, Stream::default())?;
        self.runtime.synchronize(Stream::default())?;
        Ok(w)
    }

    /// [`Self::sketch_weight`] enqueued on `stream` without waiting: checks enqueued after it
    /// on the same stream see its results (the shim's path; never on a capturing stream,
    /// since its scratch counters are zeroed with a synchronous copy).
    pub fn sketch_weight_on(
        &self,
        g: &QsGemmDesc,
        a: Format,
        d: Format,
        seed: u64,
        k: u32,
        stream: Stream,
    ) -> Result<SketchWeight, DeviceError> {
        let b = format_of(g.b.format)?;
        let kp = abi::padded_probes(k).map_err(abi_err)?;
        let build = KernelBuild::sketch_kp(a, b, d, kp).map_err(abi_err)?;
        self.held.lock().unwrap_or_else(|e| e.into_inner()).release_done(self.runtime.as_ref());
        // Both kernels resolved before the first launch: once the prep kernel is queued, only the
        // driver can still refuse the second.
        let program = self.program(&build)?;
        let prep_fn = program.function("qs_sketch_prep")?;
        let wproj_fn = program.function(&format!("qs_sketch_wproj_{}", b.name()))?;
        let signs = self.alloc(g.n as usize * 4)?;
        let rsum = self.alloc(abi::MAX_PROBES * 8)?;
        let bproj = self.alloc(abi::MAX_PROBES * 8)?;
        let prep_cfg = abi::sketch_prep_launch(g.n, self.info.multiprocessors).map_err(abi_err)?;
        let partials = self.alloc(abi::sketch_prep_partials_bytes(&prep_cfg) as usize)?;
        let counter = self.alloc_zeroed(4)?;
        let status = self.alloc_zeroed(4)?;
        // Every allocation and geometry before the first launch: a block dropped on an error
        // after a launch would go back to the pool while the kernel may still write it.
        let items = if g.b_batched() { g.batch } else { 1 };
        let wr_batch_stride = if items > 1 { g.k * kp as u64 } else { 0 };
        // A batched B of absurd batch x K must not wrap into a small W_R the kernel overruns.
        let wr_bytes = items
            .checked_mul(g.k)
            .and_then(|x| x.checked_mul(kp as u64 * 4))
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| DeviceError::Unsupported(format!("W_R of {items} x {} x {kp} floats", g.k)))?;
        let wr = self.alloc(wr_bytes)?;
        let snapshot = self.alloc(abi::WEIGHT_SAMPLES * 4)?;
        // Only while the lean check is on (a weight made with it off never takes it) and for
        // weights some call of which can take it. Zeroed where kp is not a whole number of
        // 16-probe tiles (kp = 8): the padding probes are never written.
        let wfrag = if self.lean_sketch() && items == 1 && abi::lean_sketch_weight(a, d, g.k, g.n) {
            let bytes = abi::wfrag_bytes(g.k, kp) as usize;
            Some(if kp.is_multiple_of(16) { self.alloc(bytes)? } else { self.alloc_zeroed(bytes)? })
        } else {
            None
        };
        let cfg = abi::sketch_wproj_launch(&g.b, g.k, items, self.info.warp_size).map_err(abi_err)?;
        let prep = QsPrepParams {
            n: g.n,
            seed,
            signs_ptr: signs.ptr,
            rsum_ptr: rsum.ptr,
            bproj_ptr: bproj.ptr,
            partials_ptr: partials.ptr,
            counter_ptr: counter.ptr,
            status_ptr: status.ptr,
            bias: g.bias,
            k,
            reserved: 0,
        };
        self.launch_function(prep_fn, &prep_cfg, &prep, stream)?;
        let wproj = QsWprojParams {
            b: g.b,
            b_scale: g.b_scale,
            k_dim: g.k,
            n_dim: g.n,
            items,
            signs_ptr: signs.ptr,
            out_ptr: wr.ptr,
            status_ptr: status.ptr,
            kp,
            reserved: 0,
            snapshot_ptr: snapshot.ptr,
            frag_ptr: wfrag.as_ref().map_or(0, |b| b.ptr),
        };
        if let Err(e) = self.launch_function(wproj_fn, &cfg, &wproj, stream) {
            // The prep kernel is queued and writes the signs, sums and its scratch: they go back
            // to the pool only once it has run, found later without waiting on the caller's
            // stream. W_R and the rest were never written.
            let queued = vec![signs, rsum, bproj, partials, counter, status];
            self.held.lock().unwrap_or_else(|e| e.into_inner()).hold(self.runtime.as_ref(), stream, queued);
            return Err(e);
        }
        Ok(SketchWeight {
            seed,
            k,
            kp,
            signs,
            rsum,
            bproj,
            wr,
            wr_batch_stride,
            wfrag,
            snapshot,
            _prep: (partials, counter, status),
        })
    }

    /// Scratch for sketch checks of `rows` rows of a K x N problem.
    pub fn sketch_scratch(
        &self,
        rows: u64,
        k_dim: u64,
        n_dim: u64,
        k: u32,
        row_stats: bool,
    ) -> Result<SketchScratch, DeviceError> {
        let geometry =
            SketchGeometry::new(rows, k_dim, n_dim, k, self.info.multiprocessors, self.info.warp_size)
                .map_err(abi_err)?;
        Ok(SketchScratch {
            partials: self.alloc(geometry.partials_bytes() as usize)?,
            totals: self.alloc_zeroed(geometry.totals_bytes() as usize)?,
            row_records: self.alloc(geometry.row_record_bytes() as usize)?,
            counters: self.alloc_zeroed(geometry.counters_bytes() as usize)?,
            status: self.alloc_zeroed(4)?,
            row_stats: if row_stats { Some(self.alloc(rows as usize * 24)?) } else { None },
            geometry,
        })
    }

    /// Scratch that any sketch check of up to `max_rows` sampled rows and `k` probes fits (any
    /// K and N, general or lean kernel: [`SketchScratch::fits`]), for checks that run one after
    /// another on one stream.
    pub fn sketch_scratch_up_to(&self, max_rows: u64, k: u32) -> Result<SketchScratch, DeviceError> {
        let wide = u64::MAX >> 16; // K and N at their widest: the most splits
        let (sms, warp) = (self.info.multiprocessors, self.info.warp_size);
        let mut most = (0u64, 0u64, 0u64);
        let mut largest = SketchGeometry::new(1, wide, wide, k, sms, warp).map_err(abi_err)?;
        for rows in 1..=max_rows.max(1) {
            let geometry = SketchGeometry::new(rows, wide, wide, k, sms, warp).map_err(abi_err)?;
            let general = general_needs(&geometry);
            if general.0 > most.0 {
                largest = geometry;
            }
            most = (most.0.max(general.0), most.1.max(general.1), most.2.max(general.2));
        }
        let bytes = |b: u64| {
            usize::try_from(b).map_err(|_| DeviceError::Unsupported(format!("{b} bytes of scratch")))
        };
        Ok(SketchScratch {
            partials: self.alloc(bytes(most.0)?)?,
            totals: self.alloc_zeroed(largest.totals_bytes() as usize)?,
            row_records: self.alloc(bytes(most.1)?)?,
            counters: self.alloc_zeroed(bytes(most.2)?)?,
            status: self.alloc_zeroed(4)?,
            row_stats: None,
            // Of the largest partials only (not what each buffer was sized by): its checks
            // name their own geometry (`prepare_sketch_check_in`).
            geometry: largest,
        })
    }

    /// One fused sketch check resolved once: every launch of it is one driver call, writes a
    /// fresh ring slot and advances the row epoch on the device (so graph replays rotate rows).
    #[allow(clippy::too_many_arguments)]
    pub fn prepare_sketch_check(
        &self,
        g: &QsGemmDesc,
        rows: QsRowSel,
        weight: &SketchWeight,
        scratch: &SketchScratch,
        a: Format,
        d: Format,
        tag: (u64, u64),
        captured: bool,
    ) -> Result<PreparedLaunch<QsSketchParams>, DeviceError> {
        let entries = self.sketch_entries(a, format_of(g.b.format)?, d, weight.kp)?;
        self.prepare_sketch_check_with(entries, g, rows, weight, scratch, tag, captured)
    }

    /// [`Self::prepare_sketch_check`] with the program's entries already at hand (the shim's
    /// per-call path looks them up once).
    #[allow(clippy::too_many_arguments)]
    pub fn prepare_sketch_check_with(
        &self,
        entries: SketchEntries,
        g: &QsGemmDesc,
        rows: QsRowSel,
        weight: &SketchWeight,
        scratch: &SketchScratch,
        tag: (u64, u64),
        captured: bool,
    ) -> Result<PreparedLaunch<QsSketchParams>, DeviceError> {
        self.prepare_sketch_check_in(entries, g, rows, weight, scratch, &scratch.geometry, tag, captured)
    }

    /// [`Self::prepare_sketch_check_with`] in `scratch` with the launch of `geometry`, which
    /// the scratch must fit ([`SketchScratch::fits`]): a scratch shared by checks of several
    /// sizes that run one after another.
    #[allow(clippy::too_many_arguments)]
    pub fn prepare_sketch_check_in(
        &self,
        entries: SketchEntries,
        g: &QsGemmDesc,
        rows: QsRowSel,
        weight: &SketchWeight,
        scratch: &SketchScratch,
        geometry: &SketchGeometry,
        tag: (u64, u64),
        captured: bool,
    ) -> Result<PreparedLaunch<QsSketchParams>, DeviceError> {
        if !scratch.fits(geometry) {
            return Err(DeviceError::Unsupported("sketch scratch smaller than the check".into()));
        }
        let mut params = self.sketch_params(g, rows, weight, scratch, geometry, tag);
        let (function, config) = match (weight.wfrag.as_ref(), entries.lean) {
            (Some(wfrag), Some(lean)) if self.sketch_takes_lean(g, weight, rows.count, captured) => {
                params.wfrag_ptr = wfrag.ptr;
                params.splits = abi::LEAN_SPLITS as u32;
                params.rows_per_group = abi::LEAN_ROWS as u32;
                (lean, abi::lean_sketch_launch(rows.count).map_err(abi_err)?)
            }
            _ => (entries.check, geometry.launch),
        };
        Ok(PreparedLaunch { function, config, params, early_start: !captured && self.early_start() })
    }

    /// Whether a sketch check of `rows` rows of the call `g` prepared now takes `qs_sketch_lean`.
    /// `captured`: the check goes into a CUDA graph (stream capture or a graph branch), where it
    /// keeps the general kernel unless `QUANTSHADOW_SKETCH_LEAN=graphs`: the lean kernel's
    /// thread-block clusters inside graphs are not verified on a GPU yet (session 14 ran it
    /// eagerly only).
    pub fn sketch_takes_lean(
        &self,
        g: &QsGemmDesc,
        weight: &SketchWeight,
        rows: u64,
        captured: bool,
    ) -> bool {
        (!captured || self.lean_in_graphs.load(Ordering::Relaxed))
            && self.lean_sketch()
            && weight.wfrag.is_some()
            && abi::lean_sketch_worthwhile(rows, g.n)
            && g.sketch_view().lean_sketch_eligible()
    }

    fn sketch_params(
        &self,
        g: &QsGemmDesc,
        rows: QsRowSel,
        weight: &SketchWeight,
        scratch: &SketchScratch,
        geo: &SketchGeometry,
        tag: (u64, u64),
    ) -> QsSketchParams {
        let ring = self.ring_desc();
        QsSketchParams {
            g: g.sketch_view(),
            rows,
            ring,
            tag: tag.0,
            tag2: tag.1,
            signs_ptr: weight.signs.ptr,
            wr_ptr: weight.wr.ptr,
            wr_batch_stride: weight.wr_batch_stride,
            rsum_ptr: weight.rsum.ptr,
            bproj_ptr: weight.bproj.ptr,
            partials_ptr: scratch.partials.ptr,
            totals_ptr: scratch.totals.ptr,
            rowrec_ptr: scratch.row_records.ptr,
            counters_ptr: scratch.counters.ptr,
            status_ptr: scratch.status.ptr,
            row_stats_ptr: scratch.row_stats.as_ref().map_or(0, |b| b.ptr),
            k: weight.k,
            kp: weight.kp,
            splits: geo.splits,
            rows_per_group: geo.rows_per_group,
            gate_ptr: 0,
            gate_first: 0,
            gate_every: 0,
            snapshot_ptr: weight.snapshot.ptr,
            packed_ptr: 0,
            wfrag_ptr: 0,
            split_ptr: 0,
        }
    }

    /// The split check of an eager call (see qs_abi.h QsSplitHeader): the projections for the
    /// caller's stream, writing into `buffer` ([`abi::SplitLayout`] of `rows.count` rows and the
    /// weight's kp, zero when first used), and the finishing over that buffer for a stream that
    /// runs after them. Only for checks that take the lean kernel outside captures
    /// ([`Self::sketch_takes_lean`]); `Unsupported` otherwise.
    #[allow(clippy::too_many_arguments)]
    pub fn prepare_split_check(
        &self,
        entries: SketchEntries,
        g: &QsGemmDesc,
        rows: QsRowSel,
        weight: &SketchWeight,
        scratch: &SketchScratch,
        buffer: DevicePtr,
        tag: (u64, u64),
    ) -> Result<(PreparedLaunch<QsSketchParams>, PreparedLaunch<QsSketchParams>), DeviceError> {
        let (Some(wfrag), Some((proj, fin))) = (weight.wfrag.as_ref(), entries.split) else {
            return Err(DeviceError::Unsupported(
                "split sketch check: no lean form for these formats".into(),
            ));
        };
        if !self.sketch_takes_lean(g, weight, rows.count, false) {
            return Err(DeviceError::Unsupported(
                "split sketch check: the call does not take the lean check".into(),
            ));
        }
        let config = abi::lean_sketch_launch(rows.count).map_err(abi_err)?;
        let layout = abi::SplitLayout::new(rows.count, weight.kp);
        let mut finish = self.sketch_params(g, rows, weight, scratch, &scratch.geometry, tag);
        finish.wfrag_ptr = wfrag.ptr;
        finish.splits = abi::LEAN_SPLITS as u32;
        finish.rows_per_group = abi::LEAN_ROWS as u32;
        finish.split_ptr = buffer;
        // The projections touch nothing of the check's scratch: the finishing of the site's
        // previous call may still be reading it on the other stream.
        let project = QsSketchParams {
            totals_ptr: buffer,
            status_ptr: buffer + layout.status_offset(),
            partials_ptr: 0,
            rowrec_ptr: 0,
            counters_ptr: 0,
            row_stats_ptr: 0,
            ..finish
        };
        Ok((
            // In order even under QUANTSHADOW_EARLY_START=1: started early they were 2.1-4.8 us
            // slower in 5 of 6 pairs (H100, docs/measurements/2026-11-27-h100-probes-and-units.md).
            PreparedLaunch { function: proj, config, params: project, early_start: false },
            PreparedLaunch { function: fin, config, params: finish, early_start: false },
        ))
    }

    /// One fused sketch check; the result lands in the ring tagged `tag`. No allocation, no
    /// synchronisation: safe to enqueue on a capturing stream.
    #[allow(clippy::too_many_arguments)]
    pub fn sketch_check(
        &self,
        g: &QsGemmDesc,
        rows: QsRowSel,
        weight: &SketchWeight,
        scratch: &SketchScratch,
        a: Format,
        d: Format,
        tag: (u64, u64),
        stream: Stream,
    ) -> Result<(), DeviceError> {
        let prepared = self.prepare_sketch_check(g, rows, weight, scratch, a, d, tag, false)?;
        self.launch_prepared(&prepared, stream)
    }
}

fn format_of(code: u32) -> Result<Format, DeviceError> {
    Format::from_u8(code as u8).ok_or_else(|| DeviceError::Unsupported(format!("format code {code}")))
}

fn abi_err(e: abi::AbiError) -> DeviceError {
    DeviceError::Unsupported(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::abi::SLOT_WORDS;

    fn written_slot() -> QsResultSlot {
        let mut slot =
            QsResultSlot { ready: 8, ticket: 7, tag: 3, dot: 0.25, rows_checked: 256, ..Default::default() };
        slot.sketch_prod[5] = -1.5;
        slot.check = slot.expected_check();
        slot
    }

    #[test]
    fn a_whole_slot_is_taken_at_once() {
        let mut since = None;
        let slot = written_slot();
        assert_eq!(take_whole_slot(&slot, &mut since, Instant::now()), SlotRead::Whole);
        assert_eq!(since, None);
    }

    #[test]
    fn a_slot_with_a_word_still_in_flight_is_read_again_then_given_up() {
        let mut stale = written_slot();
        stale.sketch_prod[5] = 0.0; // the previous lap's word
        let t0 = Instant::now();
        let mut since = None;
        assert_eq!(take_whole_slot(&stale, &mut since, t0), SlotRead::NotYet);
        assert_eq!(since, Some(t0));
        let later = t0 + INCOMPLETE_SLOT_TIMEOUT / 2;
        assert_eq!(take_whole_slot(&stale, &mut since, later), SlotRead::NotYet);
        // The word arrives: taken, and the wait is over.
        assert_eq!(take_whole_slot(&written_slot(), &mut since, later), SlotRead::Whole);
        assert_eq!(since, None);
        // A slot that never completes is skipped after the timeout.
        assert_eq!(take_whole_slot(&stale, &mut since, t0), SlotRead::NotYet);
        assert_eq!(take_whole_slot(&stale, &mut since, t0 + INCOMPLETE_SLOT_TIMEOUT), SlotRead::GiveUp);
        assert_eq!(since, None);
    }

    #[test]
    fn a_slot_taken_by_a_later_lap_is_counted_lost_never_waited_for() {
        let runtime: Arc<dyn GpuRuntime> = Arc::new(crate::device::fake::FakeRuntime::default());
        let mut ring = ResultRing::new(runtime, 4).unwrap();
        let write = |ring: &ResultRing, ticket: u64, whole: bool| {
            let mut slot =
                QsResultSlot { ready: ticket + 1, ticket, tag: 100 + ticket, ..Default::default() };
            slot.check = slot.expected_check() ^ u64::from(!whole);
            let at = HEADER_BYTES + (ticket % 4) as usize * SLOT_BYTES;
            // SAFETY: inside the ring's mapping (fake runtime: host memory); plain data.
            unsafe { std::ptr::write_volatile(ring.mapped.host.add(at) as *mut QsResultSlot, slot) };
        };
        write(&ring, 0, true);
        // Ticket 5 lands in slot 1 before ticket 1 was written or read.
        write(&ring, 5, true);
        write(&ring, 2, true);
        assert_eq!(ring.poll().map(|s| s.tag), Some(100));
        assert_eq!(ring.poll().map(|s| s.tag), Some(102), "ticket 1 lost, passed over");
        assert_eq!(ring.dropped(), 1);
        assert_eq!(ring.poll(), None, "ticket 3 not written yet");
        write(&ring, 3, true);
        write(&ring, 4, true);
        let tags: Vec<u64> = std::iter::from_fn(|| ring.poll()).map(|s| s.tag).collect();
        assert_eq!(tags, [103, 104, 105], "the later lap's result is read in its turn");
        // A later ticket that is not whole yet, or garbage in the ready word, is waited for.
        write(&ring, 10, false);
        assert_eq!(ring.poll(), None);
        assert_eq!(ring.dropped(), 1);
        // Words of two writers (this ticket's ready word, a later one's ticket): not this
        // ticket's result, whatever the hash says.
        let mut mixed = QsResultSlot { ready: 7, ticket: 10, tag: 7, ..Default::default() };
        mixed.check = mixed.expected_check();
        // SAFETY: slot 2 of the ring's mapping (fake runtime: host memory); plain data.
        unsafe {
            let at = ring.mapped.host.add(HEADER_BYTES + 2 * SLOT_BYTES);
            std::ptr::write_volatile(at as *mut QsResultSlot, mixed);
        }
        assert_eq!(ring.poll(), None);
        let garbage = QsResultSlot { ready: 99, ticket: 3, ..Default::default() };
        assert!(!lapped(&garbage, 6, 4));
    }

    #[test]
    fn every_word_but_check_is_covered_by_the_hash() {
        let slot = written_slot();
        for i in 0..SLOT_WORDS - 1 {
            let mut words = *slot.words();
            words[i] ^= 1 << (i % 64);
            // SAFETY: same size and alignment as asserted in abi; plain data.
            let changed: QsResultSlot = unsafe { std::mem::transmute(words) };
            assert_ne!(changed.expected_check(), slot.check, "word {i}");
        }
    }
}
