//! The binary interface with the device kernels (`kernels/qs_abi.h`): `#[repr(C)]` mirrors of
//! every struct passed to a kernel or written by one, with their sizes and field offsets
//! asserted at compile time against the same numbers `qs_abi.h` static-asserts; builders that
//! turn a [`GemmProblem`] plus buffer addresses into kernel descriptors; launch geometry and
//! scratch sizes; and the kernel registry: for a problem, which source to compile with which
//! `-D` defines, and which entry points it exports.
//!
//! Kernels take one parameter struct by value (launch with a single kernel-parameter pointer to
//! it). Layout rules shared with C: fixed-width fields only, 8-byte fields first, explicit
//! `reserved` padding, no implicit padding anywhere, so [`KernelParams::as_bytes`] is the exact
//! byte image the kernel reads.

use crate::formats::Format;
use crate::problem::{
    Activation, BiasAxis, GemmBuffers, GemmProblem, MatrixLayout, Order, ProblemError, Scalar,
    ScaleGranularity, ScaleSpec, ScaleStorage, Transpose,
};
use std::mem::{offset_of, size_of};

pub const ABI_VERSION: u32 = 2;
/// 4-byte samples of B kept with a weight's projection (qs_abi.h QS_WEIGHT_SAMPLES).
pub const WEIGHT_SAMPLES: usize = 64;
pub const MAX_PROBES: usize = 32;
pub const MAX_TOPK: usize = 16;
/// Most K/N splits (grid.y) of one sketch check (`QS_MAX_SPLITS`).
pub const MAX_SPLITS: u32 = 64;
/// "QSRG", little-endian.
pub const RING_MAGIC: u32 = 0x4752_5351;

pub const ORDER_ROW: u32 = 0;
pub const ORDER_COL: u32 = 1;
pub const TRANS_N: u32 = 0;
pub const TRANS_T: u32 = 1;

pub const GRAN_NONE: u32 = 0;
pub const GRAN_TENSOR: u32 = 1;
pub const GRAN_PER_OUTER: u32 = 2;
pub const GRAN_PER_INNER: u32 = 3;
pub const GRAN_BLOCK: u32 = 4;
pub const GRAN_MX32: u32 = 5;
pub const GRAN_NVFP4: u32 = 6;

pub const SCALE_OUTER_MAJOR: u32 = 0;
pub const SCALE_INNER_MAJOR: u32 = 1;
pub const SCALE_SWIZZLED_128X4: u32 = 2;

pub const ACT_NONE: u32 = 0;
pub const ACT_RELU: u32 = 1;
pub const ACT_GELU_TANH: u32 = 2;

pub const BIAS_ROWS: u32 = 0;
pub const BIAS_COLS: u32 = 1;

pub const ROWS_ALL: u32 = 0;
pub const ROWS_LIST: u32 = 1;
pub const ROWS_PERM: u32 = 2;
/// [`ROWS_PERM`]'s window of a host-counted epoch, its start in `stride` ([`QsRowSel::eager`]).
pub const ROWS_WINDOW: u32 = 3;

pub const CHECK_SKETCH: u32 = 1;
pub const CHECK_ROWS: u32 = 2;
pub const CHECK_FULL: u32 = 3;
pub const CHECK_LOGITS: u32 = 4;

/// Bits of [`QsResultSlot::status`].
pub mod status {
    /// An index fell outside a descriptor's extent; it was read as 0 and the result is void.
    pub const OUT_OF_BOUNDS: u32 = 1;
    /// Format differs from the compiled specialisation, bad grid, bad probe count...
    pub const BAD_DESCRIPTOR: u32 = 2;
    /// A sketch of a non-linear epilogue: the metrics mean nothing.
    pub const NONLINEAR: u32 = 4;
    /// d_scale was zero or non-finite; the production projections were not rescaled.
    pub const BAD_SCALAR: u32 = 8;
    /// The reference side has NaN/Inf (inputs broken upstream of the GEMM).
    pub const REF_NONFINITE: u32 = 16;
    /// Sketch: B no longer holds what its projection W_R was computed from (memory reused for
    /// another tensor, or B is not a static weight).
    pub const WEIGHT_CHANGED: u32 = 32;
    /// Bits after which a result must not be judged.
    pub const INVALID: u32 = OUT_OF_BOUNDS | BAD_DESCRIPTOR | NONLINEAR | BAD_SCALAR | WEIGHT_CHANGED;
}

/// Threads per block of the bandwidth kernels (sketch, compare): `QS_BLOCK`.
pub const BLOCK_THREADS: u32 = 256;
/// Threads per block of the reference GEMM and its tile (`QS_GEMM_THREADS`, `QS_BM`, `QS_BN`).
pub const GEMM_THREADS: u32 = 256;
pub const GEMM_TILE_M: u64 = 128;
pub const GEMM_TILE_N: u64 = 128;

// ---------------------------------------------------------------------------------------------
// Structs (qs_abi.h, field for field)
// ---------------------------------------------------------------------------------------------

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsMatrixDesc {
    pub ptr: u64,
    pub ld: u64,
    pub batch_stride: u64,
    /// Elements the buffer holds; nothing at or past it is touched.
    pub extent: u64,
    pub format: u32,
    pub order: u32,
    pub trans: u32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsScaleDesc {
    pub ptr: u64,
    /// Resolved leading dimension (never 0).
    pub ld: u64,
    pub batch_stride: u64,
    pub extent: u64,
    pub format: u32,
    pub storage: u32,
    pub granularity: u32,
    pub block_outer: u32,
    pub block_inner: u32,
    pub grid_outer: u32,
    pub grid_inner: u32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsScalar {
    pub value: f64,
    pub ptr: u64,
    pub format: u32,
    pub on_device: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsBiasDesc {
    pub ptr: u64,
    pub extent: u64,
    pub format: u32,
    pub axis: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsGemmDesc {
    pub m: u64,
    pub n: u64,
    pub k: u64,
    pub batch: u64,
    pub a: QsMatrixDesc,
    pub b: QsMatrixDesc,
    pub c: QsMatrixDesc,
    pub d: QsMatrixDesc,
    pub a_scale: QsScaleDesc,
    pub b_scale: QsScaleDesc,
    pub alpha: QsScalar,
    pub beta: QsScalar,
    pub a_tensor_scale: QsScalar,
    pub b_tensor_scale: QsScalar,
    pub d_scale: QsScalar,
    pub bias: QsBiasDesc,
    pub activation: u32,
    pub reserved0: u32,
    pub reserved1: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsRowSel {
    pub total_rows: u64,
    pub count: u64,
    pub stride: u64,
    pub perm_a: u64,
    pub perm_b: u64,
    pub list_ptr: u64,
    pub epoch_ptr: u64,
    pub epoch_value: u64,
    pub mode: u32,
    pub advance_epoch: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsRingHeader {
    pub magic: u32,
    pub abi_version: u32,
    pub slot_size: u32,
    pub capacity: u32,
    pub consumed: u64,
    pub dropped: u64,
    pub reserved: [u64; 4],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsRingCtl {
    pub head: u64,
    pub dropped: u64,
    /// The device's copy of `QsRingHeader::consumed` (a lower bound).
    pub consumed_seen: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsRingDesc {
    pub header_ptr: u64,
    pub slots_ptr: u64,
    pub ctl_ptr: u64,
    pub capacity: u32,
    pub reserved: u32,
}

/// One result in the ring. See `qs_abi.h` for the protocol; [`crate::sketch::slot_metrics`]
/// turns it into [`crate::metrics::Metrics`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QsResultSlot {
    pub ready: u64,
    pub ticket: u64,
    pub tag: u64,
    pub tag2: u64,
    pub epoch: u64,
    pub kind: u32,
    pub status: u32,
    pub probes: u32,
    pub topk: u32,
    pub rows_checked: u64,
    pub dot: f64,
    pub prod_sq: f64,
    pub ref_sq: f64,
    pub diff_sq: f64,
    pub max_abs_err: f64,
    pub finite: u64,
    pub pairs: u64,
    pub nan_prod: u64,
    pub inf_prod: u64,
    pub nan_ref: u64,
    pub inf_ref: u64,
    pub worst_row: u64,
    pub worst_cosine: f64,
    pub worst_dot: f64,
    pub worst_prod_sq: f64,
    pub worst_ref_sq: f64,
    pub elem_nan_prod: u64,
    pub elem_inf_prod: u64,
    pub logits_rows: u64,
    pub top1_agree: u64,
    pub topk_hits: u64,
    pub kl_nonfinite_rows: u64,
    pub kl_sum: f64,
    pub kl_max: f64,
    pub kl_max_row: u64,
    pub prod_top_idx: [u32; MAX_TOPK],
    pub prod_top_val: [f32; MAX_TOPK],
    pub ref_top_idx: [u32; MAX_TOPK],
    pub ref_top_val: [f32; MAX_TOPK],
    pub sketch_prod: [f64; MAX_PROBES],
    pub sketch_ref: [f64; MAX_PROBES],
    pub reserved: [u64; 14],
    /// XOR of `slot_word_hash` over every other word (the device writes it without a fence).
    pub check: u64,
}

/// Seed of the slot hash (qs_device.h QS_SLOT_CHECK_SEED, "QSLOTCK1").
pub const SLOT_CHECK_SEED: u64 = 0x5153_4C4F_5443_4B31;
/// Words of a result slot; the last one is `check`.
pub const SLOT_WORDS: usize = size_of::<QsResultSlot>() / 8;

/// Hash of word `i` of a result slot (qs_device.h qs_slot_word_hash).
pub fn slot_word_hash(i: usize, word: u64) -> u64 {
    crate::rng::hash3(SLOT_CHECK_SEED, i as u64, word)
}

impl QsResultSlot {
    /// The slot as its words, in memory order.
    pub fn words(&self) -> &[u64; SLOT_WORDS] {
        // SAFETY: repr(C), 8-byte aligned, size SLOT_WORDS * 8 (asserted below), plain data
        // with no padding (every field pair fills whole words).
        unsafe { &*(self as *const QsResultSlot as *const [u64; SLOT_WORDS]) }
    }

    /// What `check` must be: the XOR of every other word's hash.
    pub fn expected_check(&self) -> u64 {
        self.words()[..SLOT_WORDS - 1].iter().enumerate().fold(0, |h, (i, &w)| h ^ slot_word_hash(i, w))
    }
}

impl Default for QsResultSlot {
    fn default() -> Self {
        // All-zero is a valid (empty) slot; worst_row ~0 means "no row".
        QsResultSlot {
            ready: 0,
            ticket: 0,
            tag: 0,
            tag2: 0,
            epoch: 0,
            kind: 0,
            status: 0,
            probes: 0,
            topk: 0,
            rows_checked: 0,
            dot: 0.0,
            prod_sq: 0.0,
            ref_sq: 0.0,
            diff_sq: 0.0,
            max_abs_err: 0.0,
            finite: 0,
            pairs: 0,
            nan_prod: 0,
            inf_prod: 0,
            nan_ref: 0,
            inf_ref: 0,
            worst_row: u64::MAX,
            worst_cosine: 0.0,
            worst_dot: 0.0,
            worst_prod_sq: 0.0,
            worst_ref_sq: 0.0,
            elem_nan_prod: 0,
            elem_inf_prod: 0,
            logits_rows: 0,
            top1_agree: 0,
            topk_hits: 0,
            kl_nonfinite_rows: 0,
            kl_sum: 0.0,
            kl_max: 0.0,
            kl_max_row: u64::MAX,
            prod_top_idx: [0; MAX_TOPK],
            prod_top_val: [0.0; MAX_TOPK],
            ref_top_idx: [0; MAX_TOPK],
            ref_top_val: [0.0; MAX_TOPK],
            sketch_prod: [0.0; MAX_PROBES],
            sketch_ref: [0.0; MAX_PROBES],
            reserved: [0; 14],
            check: 0,
        }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsRefParams {
    pub g: QsGemmDesc,
    pub rows: QsRowSel,
    pub out_ptr: u64,
    pub out_ld: u64,
    pub status_ptr: u64,
    pub round_to_d: u32,
    pub reserved: u32,
    /// Sampling decided on the device per launch (graph replays): 0 = every launch runs; else
    /// this launch's u64 counter, with the rule of [`DeviceGate`].
    pub gate_ptr: u64,
    pub gate_first: u32,
    pub gate_every: u32,
}

/// A launch sampled on the device at every graph replay (qs_device.h `qs_gate_take`): launch L
/// of the counter at `ptr` runs when L < first or (every != 0 and (L - first) % every == 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceGate {
    pub ptr: u64,
    pub first: u32,
    pub every: u32,
}

impl DeviceGate {
    pub fn new(ptr: u64, first: u64, every: u64) -> DeviceGate {
        DeviceGate { ptr, first: first.min(u32::MAX as u64) as u32, every: every.min(u32::MAX as u64) as u32 }
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsPrepParams {
    pub n: u64,
    pub seed: u64,
    pub signs_ptr: u64,
    pub rsum_ptr: u64,
    pub bproj_ptr: u64,
    pub partials_ptr: u64,
    pub counter_ptr: u64,
    pub status_ptr: u64,
    pub bias: QsBiasDesc,
    pub k: u32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsWprojParams {
    pub b: QsMatrixDesc,
    pub b_scale: QsScaleDesc,
    pub k_dim: u64,
    pub n_dim: u64,
    pub items: u64,
    pub signs_ptr: u64,
    pub out_ptr: u64,
    pub status_ptr: u64,
    pub kp: u32,
    pub reserved: u32,
    /// u32[WEIGHT_SAMPLES]: samples of B taken with W_R; 0 = none.
    pub snapshot_ptr: u64,
    /// W_R again in mma fragment order, bf16 hi + lo ([`wfrag_bytes`]), for the lean check;
    /// 0 = not written.
    pub frag_ptr: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsSketchParams {
    pub g: QsGemmDesc,
    pub rows: QsRowSel,
    pub ring: QsRingDesc,
    pub tag: u64,
    pub tag2: u64,
    pub signs_ptr: u64,
    pub wr_ptr: u64,
    pub wr_batch_stride: u64,
    pub rsum_ptr: u64,
    pub bproj_ptr: u64,
    /// f64[groups][splits][rows_per_group][3][kp]: each block's projections of its rows.
    pub partials_ptr: u64,
    /// QsSketchTotals, zero between launches.
    pub totals_ptr: u64,
    /// QsSketchRow[groups * rows_per_group].
    pub rowrec_ptr: u64,
    pub counters_ptr: u64,
    pub status_ptr: u64,
    pub row_stats_ptr: u64,
    pub k: u32,
    pub kp: u32,
    pub splits: u32,
    pub rows_per_group: u32,
    /// Per-launch sampling on the device (graph replays): 0 = every launch checks; else the
    /// u64 launch counter of the site, with the rule below (`engine::config::Sampling`).
    pub gate_ptr: u64,
    pub gate_first: u32,
    pub gate_every: u32,
    /// The weight's samples (QsWprojParams::snapshot_ptr): a changed B flags
    /// `status::WEIGHT_CHANGED` instead of being judged against a stale projection. 0 = none.
    pub snapshot_ptr: u64,
    /// Detached check: the [`QsSnapHeader`] of the snapshot `g` describes; 0 = `g` is the call.
    pub packed_ptr: u64,
    /// `qs_sketch_lean` and the split check: W_R in fragment order ([`QsWprojParams::frag_ptr`]).
    pub wfrag_ptr: u64,
    /// The split check (`qs_sketch_proj` / `qs_sketch_fin`) only: its buffer ([`SplitLayout`]).
    pub split_ptr: u64,
}

/// Head of a detached check's snapshot buffer (qs_abi.h), followed by u64 rows[count].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsSnapHeader {
    /// Launch tag, (epoch mod 2^31) + 1: never 0 (1 from a lean copy of every row).
    pub tag: u64,
    pub epoch: u64,
    /// Codes of the device-pointer scalars: alpha, a_ts, b_ts, beta, d_scale.
    pub scalars: [u64; 5],
    /// (tag << 32) | status bits of the copy.
    pub status: u64,
}

/// A packed row region of a snapshot: row t at `off + t * row_bytes`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QsSnapRegion {
    pub off: u64,
    pub row_bytes: u64,
}

/// `qs_sketch_snap_{a}_{d}`: grid (count, chunks).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsSnapParams {
    pub g: QsGemmDesc,
    pub rows: QsRowSel,
    pub out_ptr: u64,
    pub a: QsSnapRegion,
    pub a_scale: QsSnapRegion,
    pub c: QsSnapRegion,
    pub d: QsSnapRegion,
    pub bias_off: u64,
    /// u64 launch counter of graph replays (zero at set-up, never reset); 0: the epoch is
    /// `rows.epoch_value`.
    pub epoch_counter_ptr: u64,
}

/// `qs_sketch_snap_all`: the copy of every row for the calls the lean copy serves (format-free,
/// whole 16-byte vectors), grid (rows, chunks); the host computes the header but for the
/// device-pointer scalars.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsSnapAllParams {
    /// op(A) row 0 and the bytes from one op(A) row to the next.
    pub a_ptr: u64,
    pub a_ld_bytes: u64,
    pub d_ptr: u64,
    pub d_ld_bytes: u64,
    pub out_ptr: u64,
    pub a: QsSnapRegion,
    pub d: QsSnapRegion,
    /// The header's epoch and status word ((1 << 32) | status bits).
    pub epoch: u64,
    pub status: u64,
    /// Device-pointer scalars (alpha, a_ts, b_ts, beta, d_scale; 0: none) and their widths.
    pub scalar_ptr: [u64; 5],
    pub scalar_bits: [u32; 5],
    /// Rows to copy (blocks t >= rows do nothing).
    pub rows: u32,
    /// Bytes of one op(A) row and of one D row, multiples of 16.
    pub a_bytes: u32,
    pub d_bytes: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsCompareParams {
    pub d: QsMatrixDesc,
    pub rows: QsRowSel,
    pub ring: QsRingDesc,
    pub tag: u64,
    pub tag2: u64,
    pub m: u64,
    pub n: u64,
    pub ref_ptr: u64,
    pub ref_ld: u64,
    pub partials_ptr: u64,
    pub rowout_ptr: u64,
    pub counter_ptr: u64,
    pub status_ptr: u64,
    pub row_stats_ptr: u64,
    pub kind: u32,
    pub topk: u32,
    pub block_per_row: u32,
    pub reserved: u32,
    /// Sampling decided on the device per launch (graph replays): 0 = every launch runs; else
    /// this launch's u64 counter, with the rule of [`DeviceGate`].
    pub gate_ptr: u64,
    pub gate_first: u32,
    pub gate_every: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsSelftestParams {
    pub in_ptr: u64,
    pub out_ptr: u64,
    pub n: u64,
    pub seed: u64,
    pub stream: u64,
    pub perm_a: u64,
    pub perm_b: u64,
    pub total: u64,
    pub stride: u64,
    pub epoch: u64,
    pub scale: QsScaleDesc,
    pub format: u32,
    pub reserved: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsSums {
    pub dot: f64,
    pub prod_sq: f64,
    pub ref_sq: f64,
    pub diff_sq: f64,
    pub max_abs_err: f64,
    pub finite: u64,
    pub pairs: u64,
    pub nan_prod: u64,
    pub inf_prod: u64,
    pub nan_ref: u64,
    pub inf_ref: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsWorst {
    pub t: u64,
    pub row: u64,
    pub cosine: f64,
    pub dot: f64,
    pub prod_sq: f64,
    pub ref_sq: f64,
}

/// qs_abi.h QsSketchTotals: a sketch check's accumulators (atomics of the group finishers).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsSketchTotals {
    pub sums: [f64; 4],
    pub max_abs_err: u64,
    pub counts: [u64; 6],
    pub elem_nonfinite: [u64; 2],
    pub worst: u64,
    /// Lean check: the ring ticket + 1 its block (0, 0) claimed early; 0 = none.
    pub ticket: u64,
    pub reserved: u64,
    pub y_sum: [f64; MAX_PROBES],
    pub x_sum: [f64; MAX_PROBES],
}

/// qs_abi.h QsSketchRow: one sampled row's estimate.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsSketchRow {
    pub row: u64,
    pub cosine: f64,
    pub dot: f64,
    pub prod_sq: f64,
    pub ref_sq: f64,
}

/// qs_abi.h QsSplitHeader: head of a split check's buffer ([`SplitLayout`]). The projections
/// add their D counts to `totals.elem_nonfinite` and flag `status`; the finishing folds both
/// into the check's and leaves them zero.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct QsSplitHeader {
    pub totals: QsSketchTotals,
    pub status: u64,
    pub scalar: [f64; 5],
    pub reserved: [u64; 2],
}

/// qs_abi.h QsSplitRow: a split check's sampled row (`u64::MAX`: not checked) and row bias.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsSplitRow {
    pub row: u64,
    pub rowbias: f64,
}

/// Byte layout of a split check's buffer (qs_abi.h QsSplitHeader): the header, a
/// [`QsSplitRow`] per row of the lean grid's groups, then f32 partials [groups][LEAN_SPLITS]
/// [2][LEAN_ROWS][kp]. Zero when first handed out: the kernels leave the header's counts zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitLayout {
    pub groups: u64,
    pub kp: u32,
}

impl SplitLayout {
    pub fn new(rows: u64, kp: u32) -> SplitLayout {
        SplitLayout { groups: rows.max(1).div_ceil(LEAN_ROWS), kp }
    }
    pub fn status_offset(&self) -> u64 {
        offset_of!(QsSplitHeader, status) as u64
    }
    pub fn rows_offset(&self) -> u64 {
        size_of::<QsSplitHeader>() as u64
    }
    pub fn partials_offset(&self) -> u64 {
        self.rows_offset() + self.groups * LEAN_ROWS * size_of::<QsSplitRow>() as u64
    }
    pub fn bytes(&self) -> u64 {
        self.partials_offset() + self.groups * LEAN_SPLITS * 2 * LEAN_ROWS * self.kp as u64 * 4
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsComparePartial {
    pub sums: QsSums,
    pub worst: QsWorst,
    pub logits_rows: u64,
    pub top1_agree: u64,
    pub topk_hits: u64,
    pub kl_nonfinite_rows: u64,
    pub kl_sum: f64,
    pub kl_max: f64,
    pub kl_max_t: u64,
    pub reserved: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsLogitsRow {
    pub kl: f64,
    pub top1: u32,
    pub hits: u32,
    pub prod_idx: [u32; MAX_TOPK],
    pub prod_val: [f32; MAX_TOPK],
    pub ref_idx: [u32; MAX_TOPK],
    pub ref_val: [f32; MAX_TOPK],
}

// ---- layout pins: the same numbers qs_abi.h static-asserts ----------------------------------
const _: () = {
    assert!(size_of::<QsMatrixDesc>() == 48);
    assert!(size_of::<QsScaleDesc>() == 64);
    assert!(size_of::<QsScalar>() == 24);
    assert!(size_of::<QsBiasDesc>() == 24);
    assert!(size_of::<QsGemmDesc>() == 512);
    assert!(offset_of!(QsGemmDesc, a) == 32 && offset_of!(QsGemmDesc, d) == 176);
    assert!(offset_of!(QsGemmDesc, a_scale) == 224 && offset_of!(QsGemmDesc, alpha) == 352);
    assert!(offset_of!(QsGemmDesc, d_scale) == 448 && offset_of!(QsGemmDesc, bias) == 472);
    assert!(offset_of!(QsGemmDesc, activation) == 496);
    assert!(size_of::<QsRowSel>() == 72);
    assert!(size_of::<QsRingHeader>() == 64);
    assert!(offset_of!(QsRingHeader, consumed) == 16 && offset_of!(QsRingHeader, dropped) == 24);
    assert!(size_of::<QsRingCtl>() == 24);
    assert!(size_of::<QsRingDesc>() == 32);
    assert!(size_of::<QsResultSlot>() == 1152);
    assert!(offset_of!(QsResultSlot, kind) == 40 && offset_of!(QsResultSlot, rows_checked) == 56);
    assert!(offset_of!(QsResultSlot, dot) == 64 && offset_of!(QsResultSlot, inf_ref) == 144);
    assert!(offset_of!(QsResultSlot, worst_row) == 152 && offset_of!(QsResultSlot, elem_nan_prod) == 192);
    assert!(offset_of!(QsResultSlot, logits_rows) == 208 && offset_of!(QsResultSlot, kl_max_row) == 256);
    assert!(offset_of!(QsResultSlot, prod_top_idx) == 264 && offset_of!(QsResultSlot, ref_top_val) == 456);
    assert!(offset_of!(QsResultSlot, sketch_prod) == 520 && offset_of!(QsResultSlot, sketch_ref) == 776);
    assert!(offset_of!(QsResultSlot, check) == 1144 && std::mem::align_of::<QsResultSlot>() == 8);
    assert!(offset_of!(QsResultSlot, reserved) == 1032);
    assert!(size_of::<QsRefParams>() == 632);
    assert!(offset_of!(QsRefParams, rows) == 512 && offset_of!(QsRefParams, out_ptr) == 584);
    assert!(size_of::<QsPrepParams>() == 96);
    assert!(offset_of!(QsPrepParams, bias) == 64 && offset_of!(QsPrepParams, k) == 88);
    assert!(size_of::<QsWprojParams>() == 184);
    assert!(offset_of!(QsWprojParams, k_dim) == 112 && offset_of!(QsWprojParams, kp) == 160);
    assert!(size_of::<QsSketchParams>() == 784);
    assert!(size_of::<QsSplitHeader>() == 704 && offset_of!(QsSplitHeader, scalar) == 648);
    assert!(size_of::<QsSplitRow>() == 16);
    assert!(size_of::<QsSnapHeader>() == 64);
    assert!(size_of::<QsSnapParams>() == 672);
    assert!(size_of::<QsSnapAllParams>() == 160);
    assert!(offset_of!(QsSnapAllParams, epoch) == 72 && offset_of!(QsSnapAllParams, scalar_bits) == 128);
    assert!(offset_of!(QsSnapAllParams, rows) == 148 && offset_of!(QsSnapAllParams, d_bytes) == 156);
    assert!(offset_of!(QsSketchParams, ring) == 584 && offset_of!(QsSketchParams, tag) == 616);
    assert!(offset_of!(QsSketchParams, row_stats_ptr) == 712 && offset_of!(QsSketchParams, k) == 720);
    assert!(size_of::<QsCompareParams>() == 272);
    assert!(offset_of!(QsCompareParams, rows) == 48 && offset_of!(QsCompareParams, ring) == 120);
    assert!(offset_of!(QsCompareParams, m) == 168 && offset_of!(QsCompareParams, kind) == 240);
    assert!(offset_of!(QsCompareParams, block_per_row) == 248);
    assert!(size_of::<QsSelftestParams>() == 152);
    assert!(offset_of!(QsSelftestParams, scale) == 80 && offset_of!(QsSelftestParams, format) == 144);
    assert!(size_of::<QsSums>() == 88);
    assert!(size_of::<QsWorst>() == 48);
    assert!(size_of::<QsSketchTotals>() == 640);
    assert!(size_of::<QsSketchRow>() == 40);
    assert!(size_of::<QsComparePartial>() == 200);
    assert!(size_of::<QsLogitsRow>() == 272);
    // CUDA's kernel parameter limit (4 KiB before 12.1; HIP's is similar).
    assert!(size_of::<QsSketchParams>() <= 4096);
};

/// A struct a kernel takes by value, or a record the device writes.
///
/// # Safety
/// Implementors are `#[repr(C)]`, made only of integers, floats and arrays of them, with no
/// padding bytes (pinned by the assertions above), so every byte is initialised.
pub unsafe trait KernelParams: Copy + 'static {
    /// The exact bytes the kernel reads.
    fn as_bytes(&self) -> &[u8] {
        // SAFETY: the trait's contract: plain data with no padding, so all size_of bytes are
        // initialised; the slice borrows self.
        unsafe { std::slice::from_raw_parts((self as *const Self).cast::<u8>(), size_of::<Self>()) }
    }
}

macro_rules! plain_data {
    ($($t:ty),*) => { $(
        // SAFETY: #[repr(C)], plain numeric fields, no padding (size pinned above).
        unsafe impl KernelParams for $t {}
    )* };
}
plain_data!(
    QsMatrixDesc,
    QsScaleDesc,
    QsScalar,
    QsBiasDesc,
    QsGemmDesc,
    QsRowSel,
    QsRingHeader,
    QsRingCtl,
    QsRingDesc,
    QsResultSlot,
    QsRefParams,
    QsPrepParams,
    QsWprojParams,
    QsSketchParams,
    QsSnapHeader,
    QsSnapRegion,
    QsSnapParams,
    QsSnapAllParams,
    QsCompareParams,
    QsSelftestParams,
    QsSums,
    QsWorst,
    QsSketchTotals,
    QsSketchRow,
    QsSplitHeader,
    QsSplitRow,
    QsComparePartial,
    QsLogitsRow
);

/// Reads a device-written record back from raw bytes (a ring slot, a scratch entry).
pub fn read_record<T: KernelParams + Default>(bytes: &[u8]) -> Option<T> {
    if bytes.len() < size_of::<T>() {
        return None;
    }
    let mut out = T::default();
    // SAFETY: T is plain data (KernelParams), so any byte pattern is a valid T; the source
    // holds at least size_of::<T>() bytes and cannot overlap the local `out`.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), (&mut out as *mut T).cast::<u8>(), size_of::<T>())
    };
    Some(out)
}

// ---------------------------------------------------------------------------------------------
// Builders
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AbiError {
    #[error(transparent)]
    Problem(#[from] ProblemError),
    #[error("{what}: address {ptr:#x} is not aligned to {align} bytes")]
    Misaligned { what: &'static str, ptr: u64, align: u64 },
    #[error("{what} is required but its address is 0")]
    MissingBuffer { what: &'static str },
    #[error("{what}: {value} does not fit the kernel's {limit}")]
    TooLarge { what: &'static str, value: u64, limit: u64 },
    #[error("sketch probes must be 1..={max}, got {k}")]
    Probes { k: u32, max: usize },
    #[error("the sketch needs a linear epilogue, this call applies {activation:?}")]
    NonLinearEpilogue { activation: Activation },
    #[error("{slot} format {format} cannot be a GEMM operand")]
    NotElementFormat { slot: &'static str, format: Format },
    /// Fault injection (see the inject section at the end of this file).
    #[error("fault injection: {reason}")]
    Inject { reason: String },
}

fn element_bytes_align(format: Format) -> u64 {
    (format.bits() as u64 / 8).max(1)
}

fn check_aligned(what: &'static str, ptr: u64, format: Format) -> Result<(), AbiError> {
    let align = element_bytes_align(format); // 1, 2 or 4: a power of two
    if ptr & (align - 1) != 0 {
        return Err(AbiError::Misaligned { what, ptr, align });
    }
    Ok(())
}

fn order_code(o: Order) -> u32 {
    match o {
        Order::RowMajor => ORDER_ROW,
        Order::ColMajor => ORDER_COL,
    }
}

fn trans_code(t: Transpose) -> u32 {
    match t {
        Transpose::N => TRANS_N,
        Transpose::T => TRANS_T,
    }
}

impl QsMatrixDesc {
    /// Descriptor of a stored `rows x cols` matrix (stored dimensions) holding `batch` items.
    pub fn new(
        layout: &MatrixLayout,
        ptr: u64,
        trans: Transpose,
        rows: u64,
        cols: u64,
        batch: u64,
    ) -> QsMatrixDesc {
        QsMatrixDesc {
            ptr,
            ld: layout.ld,
            batch_stride: layout.batch_stride,
            extent: layout.required_elements(rows, cols, batch),
            format: layout.format as u32,
            order: order_code(layout.order),
            trans: trans_code(trans),
            reserved: 0,
        }
    }

    /// Strides (row, column) of op(X) in elements, as `qs_op_strides` computes them.
    pub fn op_strides(&self) -> (u64, u64) {
        let row_major = self.order == ORDER_ROW;
        let t = self.trans == TRANS_T;
        if row_major != t {
            (self.ld, 1)
        } else {
            (1, self.ld)
        }
    }
}

fn granularity_code(g: ScaleGranularity) -> u32 {
    match g {
        ScaleGranularity::Tensor => GRAN_TENSOR,
        ScaleGranularity::PerOuter => GRAN_PER_OUTER,
        ScaleGranularity::PerInner => GRAN_PER_INNER,
        ScaleGranularity::Block { .. } => GRAN_BLOCK,
        ScaleGranularity::Mx32 => GRAN_MX32,
        ScaleGranularity::Nvfp4 => GRAN_NVFP4,
    }
}

fn to_u32(what: &'static str, v: u64) -> Result<u32, AbiError> {
    u32::try_from(v).map_err(|_| AbiError::TooLarge { what, value: v, limit: u32::MAX as u64 })
}

impl QsScaleDesc {
    /// Descriptor of `spec` for an operand of logical size `outer x inner` with `batch` items:
    /// block shape and grid resolved as problem.rs does, ld 0 replaced by the packed value.
    pub fn from_spec(
        spec: &ScaleSpec,
        ptr: u64,
        outer: u64,
        inner: u64,
        batch: u64,
    ) -> Result<QsScaleDesc, AbiError> {
        let (bo, bi) = spec.granularity.block_shape(outer, inner);
        let (go, gi) = spec.granularity.grid(outer, inner);
        let ld = match (spec.storage, spec.ld) {
            (ScaleStorage::OuterMajor, 0) => gi,
            (ScaleStorage::InnerMajor, 0) => go,
            (_, ld) => ld,
        };
        let storage = match spec.storage {
            ScaleStorage::OuterMajor => SCALE_OUTER_MAJOR,
            ScaleStorage::InnerMajor => SCALE_INNER_MAJOR,
            ScaleStorage::Swizzled128x4 => SCALE_SWIZZLED_128X4,
        };
        Ok(QsScaleDesc {
            ptr,
            ld,
            batch_stride: spec.batch_stride,
            extent: spec.required_entries(outer, inner, batch),
            format: spec.format as u32,
            storage,
            granularity: granularity_code(spec.granularity),
            block_outer: to_u32("scale block (outer)", bo)?,
            block_inner: to_u32("scale block (inner)", bi)?,
            grid_outer: to_u32("scale grid (outer)", go)?,
            grid_inner: to_u32("scale grid (inner)", gi)?,
            reserved: 0,
        })
    }

    /// Host copy of the device's entry mapping (`qs_scale_entry`), for tests and selftests.
    pub fn entry(&self, batch: u64, outer: u64, inner: u64) -> u64 {
        let ob = outer / self.block_outer.max(1) as u64;
        let ib = inner / self.block_inner.max(1) as u64;
        let idx = match self.storage {
            SCALE_INNER_MAJOR => ib * self.ld + ob,
            SCALE_SWIZZLED_128X4 => {
                let inner_tiles = (self.grid_inner as u64).div_ceil(4);
                let tile = (ob / 128) * inner_tiles + ib / 4;
                tile * 512 + (ob % 32) * 16 + (ob % 128) / 32 * 4 + ib % 4
            }
            _ => ob * self.ld + ib,
        };
        batch * self.batch_stride + idx
    }
}

impl QsScalar {
    pub fn from_scalar(s: &Scalar) -> QsScalar {
        match *s {
            Scalar::Host(value) => QsScalar { value, ptr: 0, format: Format::F32 as u32, on_device: 0 },
            Scalar::Device { ptr, format } => {
                QsScalar { value: 0.0, ptr, format: format as u32, on_device: 1 }
            }
        }
    }

    /// An optional scale: absent means the host value 1.
    pub fn from_optional(s: Option<&Scalar>) -> QsScalar {
        s.map(QsScalar::from_scalar).unwrap_or(QsScalar {
            value: 1.0,
            ptr: 0,
            format: Format::F32 as u32,
            on_device: 0,
        })
    }

    /// The device address the value is read from, if it is read from the device.
    pub fn device_ptr(&self) -> Option<u64> {
        (self.on_device != 0 && self.ptr != 0).then_some(self.ptr)
    }
}

impl QsGemmDesc {
    /// The call's scalars in the order of a snapshot header's (`QsSnapHeader::scalars`): alpha,
    /// A's and B's tensor scales, beta, d_scale.
    pub fn scalars(&self) -> [&QsScalar; 5] {
        [&self.alpha, &self.a_tensor_scale, &self.b_tensor_scale, &self.beta, &self.d_scale]
    }

    /// [`Self::scalars`], to rewrite.
    pub fn scalars_mut(&mut self) -> [&mut QsScalar; 5] {
        [
            &mut self.alpha,
            &mut self.a_tensor_scale,
            &mut self.b_tensor_scale,
            &mut self.beta,
            &mut self.d_scale,
        ]
    }

    /// The sketch check's view of the call: a tensor-wise f32 A scale (FP8 `_scaled_mm`) becomes
    /// the A tensor scalar, applied once to the projection instead of to every element of A. The
    /// product is the same; the per-element path costs a scale lookup per 8 elements and a split
    /// tensor-core pass (~2.5 us of a 256-row FP8 check on an H100). Unchanged when A already has
    /// a tensor scalar, the scale is batched or not f32.
    pub fn sketch_view(&self) -> QsGemmDesc {
        let s = &self.a_scale;
        let unit_scalar = self.a_tensor_scale.on_device == 0 && self.a_tensor_scale.value == 1.0;
        let foldable = s.granularity == GRAN_TENSOR
            && s.ptr != 0
            && s.format == Format::F32 as u32
            && (s.batch_stride == 0 || self.batch <= 1)
            && unit_scalar;
        if !foldable {
            return *self;
        }
        QsGemmDesc {
            a_tensor_scale: QsScalar { value: 0.0, ptr: s.ptr, format: s.format, on_device: 1 },
            a_scale: QsScaleDesc::default(),
            ..*self
        }
    }

    /// Whether `qs_sketch_lean_{a}_{d}` can check this (sketch view of a) call; its kernel
    /// validates the same (qs_sketch.cu). Formats ([`lean_sketch_formats`]); no C and no A scales;
    /// op(A) rows and D rows contiguous, 16-byte aligned (base, row and batch strides), so
    /// that every 32-element unit of a row is one aligned vector; K and N multiples of 32.
    pub fn lean_sketch_eligible(&self) -> bool {
        let (Some(a), Some(d)) = (Format::from_u8(self.a.format as u8), Format::from_u8(self.d.format as u8))
        else {
            return false;
        };
        let aligned = |ptr: u64, strides: &[u64], bytes: u64| {
            ptr.is_multiple_of(16)
                && strides.iter().all(|s| s.checked_mul(bytes).is_some_and(|b| b.is_multiple_of(16)))
        };
        let (a_rs, a_cs) = self.a.op_strides();
        let (ab, db) = (a.bits() as u64 / 8, d.bits() as u64 / 8);
        lean_sketch_formats(a, d)
            && self.c.ptr == 0
            && self.a_scale.ptr == 0
            && a_cs == 1
            && self.d.order == ORDER_ROW
            && aligned(self.a.ptr, &[a_rs, self.a.batch_stride], ab)
            && aligned(self.d.ptr, &[self.d.ld, self.d.batch_stride], db)
            && self.k.is_multiple_of(LEAN_UNIT)
            && self.n.is_multiple_of(LEAN_UNIT)
            && self.m > 0
    }

    /// Kernel descriptor of a call: validates the problem, checks buffer alignment and fills
    /// every extent from the problem's own geometry (the device never reads past them).
    pub fn from_problem(p: &GemmProblem, bufs: &GemmBuffers) -> Result<QsGemmDesc, AbiError> {
        p.validate()?;
        for (slot, f) in [("a", p.a.format), ("b", p.b.format), ("d", p.d.format)] {
            if f.is_scale_only() {
                return Err(AbiError::NotElementFormat { slot, format: f });
            }
        }
        for (what, ptr) in [("a", bufs.a), ("b", bufs.b), ("d", bufs.d)] {
            if ptr == 0 {
                return Err(AbiError::MissingBuffer { what });
            }
        }
        check_aligned("a", bufs.a, p.a.format)?;
        check_aligned("b", bufs.b, p.b.format)?;
        check_aligned("d", bufs.d, p.d.format)?;
        let (ar, ac) = p.a_stored_dims();
        let (br, bc) = p.b_stored_dims();
        let a = QsMatrixDesc::new(&p.a, bufs.a, p.trans_a, ar, ac, p.batch);
        let b = QsMatrixDesc::new(&p.b, bufs.b, p.trans_b, br, bc, p.batch);
        let d = QsMatrixDesc::new(&p.d, bufs.d, Transpose::N, p.m, p.n, p.batch);
        let c = match &p.c {
            Some(layout) => {
                if bufs.c == 0 {
                    return Err(AbiError::MissingBuffer { what: "c" });
                }
                check_aligned("c", bufs.c, layout.format)?;
                QsMatrixDesc::new(layout, bufs.c, Transpose::N, p.m, p.n, p.batch)
            }
            None => QsMatrixDesc::default(),
        };
        let scale =
            |spec: &Option<ScaleSpec>, ptr: u64, outer: u64, what: &'static str| -> Result<_, AbiError> {
                match spec {
                    None => Ok(QsScaleDesc::default()),
                    Some(s) => {
                        if ptr == 0 {
                            return Err(AbiError::MissingBuffer { what });
                        }
                        check_aligned(what, ptr, s.format)?;
                        QsScaleDesc::from_spec(s, ptr, outer, p.k, p.batch)
                    }
                }
            };
        let a_scale = scale(&p.a_scale, bufs.a_scale, p.m, "a_scale")?;
        let b_scale = scale(&p.b_scale, bufs.b_scale, p.n, "b_scale")?;
        let bias = match p.epilogue.bias {
            None => QsBiasDesc::default(),
            Some(b) => {
                if bufs.bias == 0 {
                    return Err(AbiError::MissingBuffer { what: "bias" });
                }
                check_aligned("bias", bufs.bias, b.format)?;
                let (extent, axis) = match b.axis {
                    BiasAxis::Rows => (p.m, BIAS_ROWS),
                    BiasAxis::Cols => (p.n, BIAS_COLS),
                };
                QsBiasDesc { ptr: bufs.bias, extent, format: b.format as u32, axis }
            }
        };
        let activation = match p.epilogue.activation {
            Activation::None => ACT_NONE,
            Activation::Relu => ACT_RELU,
            Activation::GeluTanh => ACT_GELU_TANH,
        };
        Ok(QsGemmDesc {
            m: p.m,
            n: p.n,
            k: p.k,
            batch: p.batch,
            a,
            b,
            c,
            d,
            a_scale,
            b_scale,
            alpha: QsScalar::from_scalar(&p.alpha),
            beta: QsScalar::from_scalar(&p.beta),
            a_tensor_scale: QsScalar::from_optional(p.a_tensor_scale.as_ref()),
            b_tensor_scale: QsScalar::from_optional(p.b_tensor_scale.as_ref()),
            d_scale: QsScalar::from_optional(p.d_scale.as_ref()),
            bias,
            activation,
            reserved0: 0,
            reserved1: 0,
        })
    }

    /// Rows of D across the batch: the space row samples are drawn from.
    pub fn total_rows(&self) -> u64 {
        self.batch * self.m
    }

    /// Whether B (or its scales) differ per batch item: W_R and the rows GEMM go per item.
    pub fn b_batched(&self) -> bool {
        self.b.batch_stride != 0 || (self.b_scale.ptr != 0 && self.b_scale.batch_stride != 0)
    }
}

impl QsRowSel {
    /// Every row t -> t for t < count (the full reference, or all rows of a small call).
    pub fn all(total_rows: u64) -> QsRowSel {
        QsRowSel { total_rows, count: total_rows, mode: ROWS_ALL, ..QsRowSel::default() }
    }

    /// Explicit global row indices (`u64[count]` at `list_ptr`).
    pub fn list(total_rows: u64, list_ptr: u64, count: u64) -> QsRowSel {
        QsRowSel { total_rows, count, list_ptr, mode: ROWS_LIST, ..QsRowSel::default() }
    }

    /// The rotating sample of [`crate::sketch::RowSample`]: all rows when they fit in one call,
    /// else the affine permutation with the per-site epoch counter at `epoch_ptr` (0: use
    /// `epoch_value`). `advance` goes on the last kernel of a check only.
    pub fn sample(s: &crate::sketch::RowSample, epoch_ptr: u64, epoch_value: u64, advance: bool) -> QsRowSel {
        if s.is_all() {
            return QsRowSel { advance_epoch: 0, ..QsRowSel::all(s.total) };
        }
        QsRowSel {
            total_rows: s.total,
            count: s.count,
            stride: s.count,
            perm_a: s.perm.a,
            perm_b: s.perm.b,
            list_ptr: 0,
            epoch_ptr,
            epoch_value,
            mode: ROWS_PERM,
            advance_epoch: advance as u32,
        }
    }

    /// The rotating sample of an eager call whose epoch the host counts: [`Self::sample`] with
    /// `epoch`, its window's start computed here ([`ROWS_WINDOW`]) so that the device draws a row
    /// in a few instructions; with 2^32 rows or more, the device computes it ([`ROWS_PERM`]).
    pub fn eager(s: &crate::sketch::RowSample, epoch: u64) -> QsRowSel {
        let sel = QsRowSel::sample(s, 0, epoch, false);
        if sel.mode != ROWS_PERM || s.total > u32::MAX as u64 {
            return sel;
        }
        QsRowSel { stride: s.perm.window_start(s.count, epoch), mode: ROWS_WINDOW, ..sel }
    }

    /// The same selection in the next host-counted epoch (`epoch_value`; a window moves on by
    /// `count` rows).
    pub fn next_epoch(&mut self) {
        self.epoch_value = self.epoch_value.wrapping_add(1);
        if self.mode == ROWS_WINDOW {
            self.stride =
                ((self.stride as u128 + self.count as u128) % self.total_rows.max(1) as u128) as u64;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Launch geometry and scratch
// ---------------------------------------------------------------------------------------------

/// Grid, block and dynamic shared memory of one launch (all kernels use static shared memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_bytes: u32,
}

impl LaunchConfig {
    pub(crate) fn new(grid: [u64; 3], block: u32) -> Result<LaunchConfig, AbiError> {
        let g = |what, v: u64, limit: u64| {
            if v == 0 || v > limit {
                Err(AbiError::TooLarge { what, value: v, limit })
            } else {
                Ok(v as u32)
            }
        };
        Ok(LaunchConfig {
            grid: [
                g("grid.x", grid[0], u32::MAX as u64)?,
                g("grid.y", grid[1], 65535)?,
                g("grid.z", grid[2], 65535)?,
            ],
            block: [block, 1, 1],
            shared_bytes: 0,
        })
    }
}

/// `qs_gemm_ref_{a}_{b}`: the whole reference, output rows t = item * M + i.
pub fn gemm_ref_launch(g: &QsGemmDesc) -> Result<LaunchConfig, AbiError> {
    LaunchConfig::new([g.n.div_ceil(GEMM_TILE_N), g.m.div_ceil(GEMM_TILE_M), g.batch], GEMM_THREADS)
}

/// `qs_gemm_ref_rows_{a}_{b}` for `count` selected rows; with a batched B each block of
/// grid.z takes the rows of its batch item (the others idle), so rows of every item are right.
pub fn gemm_ref_rows_launch(g: &QsGemmDesc, count: u64) -> Result<LaunchConfig, AbiError> {
    let z = if g.b_batched() { g.batch } else { 1 };
    LaunchConfig::new([g.n.div_ceil(GEMM_TILE_N), count.div_ceil(GEMM_TILE_M), z], GEMM_THREADS)
}

/// Padded probe count of the compiled variants (W_R row stride).
pub fn padded_probes(k: u32) -> Result<u32, AbiError> {
    match k {
        1..=8 => Ok(8),
        9..=16 => Ok(16),
        17..=32 => Ok(32),
        _ => Err(AbiError::Probes { k, max: MAX_PROBES }),
    }
}

/// `qs_sketch_prep`: blocks over N (grid-stride); partials hold `grid.x` entries.
pub fn sketch_prep_launch(n: u64, sm_count: u32) -> Result<LaunchConfig, AbiError> {
    let blocks = n.div_ceil(BLOCK_THREADS as u64).clamp(1, 2 * sm_count.max(1) as u64);
    LaunchConfig::new([blocks, 1, 1], BLOCK_THREADS)
}

/// Bytes of `QsPrepParams::partials_ptr` for a prep launch.
pub fn sketch_prep_partials_bytes(cfg: &LaunchConfig) -> u64 {
    cfg.grid[0] as u64 * 2 * MAX_PROBES as u64 * 8
}

/// `qs_sketch_wproj_{b}`: the kernel grid-strides over K either way; this sizes the grid for
/// its mapping (one warp per k when op(B) rows are contiguous, 32 k per block otherwise).
pub fn sketch_wproj_launch(
    b: &QsMatrixDesc,
    k_dim: u64,
    items: u64,
    warp_size: u32,
) -> Result<LaunchConfig, AbiError> {
    let (_, cs) = b.op_strides(); // op(B)(kk, j): stride along j
    let per_block = if cs == 1 { (BLOCK_THREADS / warp_size) as u64 } else { warp_size as u64 };
    LaunchConfig::new([k_dim.div_ceil(per_block).clamp(1, 65535 * 64), 1, items], BLOCK_THREADS)
}

/// Blocks per SM the sketch check grid aims at (it is sized for 2 resident blocks per SM).
pub const SKETCH_BLOCKS_PER_SM: u64 = 2;
/// Narrowest K/N slice of one sketch split: the kernel's slices are whole multiples of 128
/// elements (`qs_slice`), so narrower requests would only leave splits empty.
pub const SKETCH_MIN_SLICE: u64 = 128;

/// The lean sketch check (`qs_sketch_lean_{a}_{d}`, CUDA sm_90+): rows per block (group),
/// splits per group (one thread-block cluster) and the element unit of its K / N slices
/// (qs_sketch.cu QS_LEAN_ROWS, QS_LEAN_SPLITS).
pub const LEAN_ROWS: u64 = 32;
pub const LEAN_SPLITS: u64 = 8;
pub const LEAN_UNIT: u64 = 32;

/// A and D formats the lean check is compiled for (qs_sketch.cu QS_LEAN_FORMATS).
pub fn lean_sketch_formats(a: Format, d: Format) -> bool {
    matches!(a, Format::Bf16 | Format::E4m3fn) && matches!(d, Format::Bf16 | Format::F16)
}

/// Whether the lean check projects A with W_R's bf16 hi part only (qs_sketch.cu PASSES): for
/// e4m3fn A, whose fp8 class bound (NMSE 2e-3) is ~1500x the resulting reference noise; 16-bit
/// A keeps hi + lo. The selftest mirrors it (`sketch::WeightRounding::Bf16Hi`).
pub fn lean_sketch_hi_only(a: Format) -> bool {
    a == Format::E4m3fn
}

/// Bytes of W_R in fragment order (qs_sketch.cu qs_wfrag_index): bf16 hi and lo of every
/// element, probes padded to whole 16-probe tiles.
pub fn wfrag_bytes(k_dim: u64, kp: u32) -> u64 {
    k_dim * (kp as u64).div_ceil(16) * 16 * 2 * 2
}

/// Whether the lean check is the faster one for `rows` sampled rows of an `n`-wide output. Its
/// grid has only [`LEAN_SPLITS`] blocks per 32 rows, each with a whole N / 8 slice: measured on
/// an H100 (docs/measurements/2026-11-26-h100-lean-sketch.md, k = 32) it is 2-9 us faster from
/// 16 rows up at N <= 14336, equal at one row of 4096 x 4096, 1-2 us slower at one row of the
/// 14336-wide shapes and ~30 us slower at the 128256-wide LM head, where the general kernel
/// spreads one row over many narrow splits.
pub fn lean_sketch_worthwhile(rows: u64, n: u64) -> bool {
    rows >= LEAN_ROWS / 2 && n <= LEAN_MAX_N
}

/// Widest output the lean check is taken for ([`lean_sketch_worthwhile`]).
pub const LEAN_MAX_N: u64 = 16384;

/// Whether some call of a weight of this shape and formats can take the lean check (the part of
/// [`QsGemmDesc::lean_sketch_eligible`] and [`lean_sketch_worthwhile`] fixed per weight): only
/// such weights get W_R in fragment order.
pub fn lean_sketch_weight(a: Format, d: Format, k: u64, n: u64) -> bool {
    lean_sketch_formats(a, d) && k.is_multiple_of(LEAN_UNIT) && n.is_multiple_of(LEAN_UNIT) && n <= LEAN_MAX_N
}

/// Grid of a lean check of `rows` rows: (groups of [`LEAN_ROWS`], [`LEAN_SPLITS`]).
pub fn lean_sketch_launch(rows: u64) -> Result<LaunchConfig, AbiError> {
    LaunchConfig::new([rows.max(1).div_ceil(LEAN_ROWS), LEAN_SPLITS, 1], BLOCK_THREADS)
}

/// One of several sketch checks launched at once (a capture's deferred checks), for
/// [`plan_shared_splits`]: its row groups, the fewest and most splits it can run with (the
/// most: what its scratch holds; a lean check's cluster fixes both), the wave slots one of its
/// blocks takes (a lean block occupies a whole SM: [`SKETCH_BLOCKS_PER_SM`]), and the bytes one
/// group reads over all its splits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitDemand {
    pub groups: u64,
    pub min_splits: u32,
    pub max_splits: u32,
    pub block_slots: u64,
    pub bytes_per_group: u64,
}

impl SplitDemand {
    /// Wave slots one more split takes (a block per group).
    fn split_cost(&self) -> u64 {
        self.groups.max(1).saturating_mul(self.block_slots.max(1))
    }
}

/// Splits for checks that run all at once in one resident wave of `wave` blocks: each check
/// first gets its fewest splits (one for the general kernel), then the blocks left go, one split
/// at a time, to the check whose blocks read the most (largest bytes per group / splits). A
/// uniform share instead gives a 14336-deep check the same 5 splits as a 4096-deep one beside it
/// (48 decode checks on an H100), so its blocks read 3.5x more and the graph waits for them.
/// More groups than blocks: one split each (they take more than one wave whatever the split).
pub fn plan_shared_splits(checks: &[SplitDemand], wave: u64) -> Vec<u32> {
    let mut splits: Vec<u32> = checks.iter().map(|c| c.min_splits.max(1)).collect();
    let base = checks
        .iter()
        .zip(&splits)
        .fold(0u64, |t, (c, &s)| t.saturating_add(c.split_cost().saturating_mul(s as u64)));
    let mut left = wave.saturating_sub(base);
    loop {
        // The check whose blocks read the most and that can still take a split.
        let mut best: Option<usize> = None;
        for (i, c) in checks.iter().enumerate() {
            if splits[i] >= c.max_splits.max(1) || c.split_cost() > left {
                continue;
            }
            // c / s > b / t  <=>  c t > b s (no division: exact for every size).
            let heavier = best.is_none_or(|b| {
                c.bytes_per_group as u128 * splits[b] as u128
                    > checks[b].bytes_per_group as u128 * splits[i] as u128
            });
            if heavier {
                best = Some(i);
            }
        }
        let Some(i) = best else { return splits };
        splits[i] += 1;
        left -= checks[i].split_cost();
    }
}

/// Geometry of one sketch check launch and the scratch it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SketchGeometry {
    pub launch: LaunchConfig,
    pub groups: u32,
    pub splits: u32,
    pub rows_per_group: u32,
    pub kp: u32,
}

impl SketchGeometry {
    /// Groups of `BLOCK_THREADS / warp_size` rows (one warp each) and enough K/N splits to give
    /// the GPU ~2 blocks per SM (one resident wave at the kernel's occupancy), each split at least
    /// [`SKETCH_MIN_SLICE`] elements of the wider of K and N. Few rows (decode) therefore get many
    /// narrow splits: one row of a 4096 x 4096 problem runs as 32 blocks of 128 elements instead
    /// of 8 blocks of 512, so the serial work of each block (its latency) is 4x smaller.
    pub fn new(
        rows: u64,
        k_dim: u64,
        n_dim: u64,
        k: u32,
        sm_count: u32,
        warp_size: u32,
    ) -> Result<Self, AbiError> {
        let kp = padded_probes(k)?;
        let rows_per_group = BLOCK_THREADS / warp_size;
        let groups = rows.max(1).div_ceil(rows_per_group as u64);
        // Rounded down: one more split than fits would start a second wave of blocks (measured on
        // an H100: 256 rows of 4096 x 4096 as 32 x 9 = 288 blocks for 264 resident slots).
        let want = (SKETCH_BLOCKS_PER_SM * sm_count.max(1) as u64 / groups).max(1);
        let widest = k_dim.max(n_dim);
        let splits = want.min(widest.div_ceil(SKETCH_MIN_SLICE).max(1)).min(MAX_SPLITS as u64);
        let launch = LaunchConfig::new([groups, splits, 1], BLOCK_THREADS)?;
        Ok(SketchGeometry { launch, groups: groups as u32, splits: splits as u32, rows_per_group, kp })
    }

    /// Rows the launch covers (whole groups).
    pub fn row_slots(&self) -> u64 {
        self.groups as u64 * self.rows_per_group as u64
    }
    pub fn partials_bytes(&self) -> u64 {
        self.row_slots() * self.splits as u64 * 3 * self.kp as u64 * 8
    }
    /// QsSketchTotals; must be zero before the first launch (the kernel leaves it zero).
    pub fn totals_bytes(&self) -> u64 {
        size_of::<QsSketchTotals>() as u64
    }
    pub fn row_record_bytes(&self) -> u64 {
        self.row_slots() * size_of::<QsSketchRow>() as u64
    }
    /// u32 counters; must be zero before the first launch (the kernel leaves them zero).
    pub fn counters_bytes(&self) -> u64 {
        (self.groups as u64 + 1) * 4
    }
}

/// Geometry of a compare launch: a warp per row for rows up to 8192 elements (measured on an
/// H200 at 8192 x 8192 bf16: 2.7 TB/s a warp per row, 2.2 TB/s a block per row), and for longer
/// rows too when there are enough of them to give every warp of two resident blocks per SM its
/// own row (H100 at 4096 x 14336 bf16 a block per row: 0.69 of copy bandwidth, the per-row block
/// reduction between short streams); a block per row for few long rows (they need the
/// parallelism) and always for logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompareGeometry {
    pub launch: LaunchConfig,
    pub block_per_row: bool,
}

impl CompareGeometry {
    pub fn new(rows: u64, n: u64, logits: bool, sm_count: u32, warp_size: u32) -> Result<Self, AbiError> {
        let warps = (BLOCK_THREADS / warp_size) as u64;
        let fills_gpu = rows >= 2 * sm_count.max(1) as u64 * warps;
        let block_per_row = logits || (n > 8192 && !fills_gpu);
        let units_per_block = if block_per_row { 1 } else { warps };
        let blocks = rows.max(1).div_ceil(units_per_block).clamp(1, 8 * sm_count.max(1) as u64);
        Ok(CompareGeometry { launch: LaunchConfig::new([blocks, 1, 1], BLOCK_THREADS)?, block_per_row })
    }

    pub fn partials_bytes(&self) -> u64 {
        self.launch.grid[0] as u64 * size_of::<QsComparePartial>() as u64
    }
}

// ---------------------------------------------------------------------------------------------
// Kernel registry
// ---------------------------------------------------------------------------------------------

/// One kernel source file; every source includes the shared headers in [`HEADERS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelSource {
    GemmRef,
    Sketch,
    Compare,
    Selftest,
    /// Fault injection (`QUANTSHADOW_INJECT`), see the inject section at the end of this file.
    Inject,
}

/// Headers handed to NVRTC/hipRTC as in-memory headers (name, text).
pub const HEADERS: [(&str, &str); 5] = [
    ("qs_portability.h", include_str!("../../../kernels/qs_portability.h")),
    ("qs_formats.h", include_str!("../../../kernels/qs_formats.h")),
    ("qs_rng.h", include_str!("../../../kernels/qs_rng.h")),
    ("qs_abi.h", include_str!("../../../kernels/qs_abi.h")),
    ("qs_device.h", include_str!("../../../kernels/qs_device.h")),
];

impl KernelSource {
    pub fn file_name(self) -> &'static str {
        match self {
            KernelSource::GemmRef => "qs_gemm_ref.cu",
            KernelSource::Sketch => "qs_sketch.cu",
            KernelSource::Compare => "qs_compare.cu",
            KernelSource::Selftest => "qs_selftest.cu",
            KernelSource::Inject => "qs_inject.cu",
        }
    }

    pub fn text(self) -> &'static str {
        match self {
            KernelSource::GemmRef => include_str!("../../../kernels/qs_gemm_ref.cu"),
            KernelSource::Sketch => include_str!("../../../kernels/qs_sketch.cu"),
            KernelSource::Compare => include_str!("../../../kernels/qs_compare.cu"),
            KernelSource::Selftest => include_str!("../../../kernels/qs_selftest.cu"),
            KernelSource::Inject => include_str!("../../../kernels/qs_inject.cu"),
        }
    }
}

/// What a kernel entry takes as its single by-value parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ParamKind {
    Ref,
    Prep,
    Wproj,
    Sketch,
    /// [`QsSnapParams`] (`qs_sketch_snap_{a}_{d}`, the detached check's snapshot).
    Snap,
    /// [`QsSnapAllParams`] (`qs_sketch_snap_all`, a snapshot of every row).
    SnapAll,
    Compare,
    Selftest,
    /// [`QsInjectParams`].
    Inject,
    /// [`QsPermuteParams`] (`qs_inject_permute`).
    InjectPermute,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KernelEntry {
    pub name: String,
    pub params: ParamKind,
}

/// One program to compile: a source, its `-D` defines, and the entries it exports. Programs are
/// cached by (arch, [`KernelBuild::cache_key`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KernelBuild {
    pub source: KernelSource,
    pub defines: Vec<(String, String)>,
    pub entries: Vec<KernelEntry>,
}

fn operand_format(slot: &'static str, f: Format) -> Result<Format, AbiError> {
    if f.is_scale_only() {
        Err(AbiError::NotElementFormat { slot, format: f })
    } else {
        Ok(f)
    }
}

impl KernelBuild {
    /// `qs_gemm_ref.cu` for A and B formats: `qs_gemm_ref_{a}_{b}`, `qs_gemm_ref_rows_{a}_{b}`.
    pub fn gemm_ref(a: Format, b: Format) -> Result<KernelBuild, AbiError> {
        let (a, b) = (operand_format("a", a)?, operand_format("b", b)?);
        Ok(KernelBuild {
            source: KernelSource::GemmRef,
            defines: vec![
                ("QS_A_FMT".into(), (a as u8).to_string()),
                ("QS_B_FMT".into(), (b as u8).to_string()),
            ],
            entries: vec![
                KernelEntry {
                    name: format!("qs_gemm_ref_{}_{}", a.name(), b.name()),
                    params: ParamKind::Ref,
                },
                KernelEntry {
                    name: format!("qs_gemm_ref_rows_{}_{}", a.name(), b.name()),
                    params: ParamKind::Ref,
                },
            ],
        })
    }

    /// `qs_sketch.cu` for A, B and D formats: `qs_sketch_prep`, `qs_sketch_wproj_{b}`,
    /// `qs_sketch_check_{a}_{d}`, `qs_sketch_snap_{a}_{d}` and its lean forms
    /// `qs_sketch_snap_rows_{a}_{d}` and `qs_sketch_snap_all`, and for [`lean_sketch_formats`]
    /// `qs_sketch_lean_{a}_{d}` and the split check's `qs_sketch_proj_{a}_{d}` and
    /// `qs_sketch_fin_{a}_{d}`.
    pub fn sketch(a: Format, b: Format, d: Format) -> Result<KernelBuild, AbiError> {
        let (a, b, d) = (operand_format("a", a)?, operand_format("b", b)?, operand_format("d", d)?);
        let per_a_d =
            |stem: &str, params| KernelEntry { name: format!("{stem}_{}_{}", a.name(), d.name()), params };
        Ok(KernelBuild {
            source: KernelSource::Sketch,
            defines: vec![
                ("QS_A_FMT".into(), (a as u8).to_string()),
                ("QS_B_FMT".into(), (b as u8).to_string()),
                ("QS_D_FMT".into(), (d as u8).to_string()),
            ],
            entries: vec![
                KernelEntry { name: "qs_sketch_prep".into(), params: ParamKind::Prep },
                KernelEntry { name: format!("qs_sketch_wproj_{}", b.name()), params: ParamKind::Wproj },
                per_a_d("qs_sketch_check", ParamKind::Sketch),
                per_a_d("qs_sketch_snap", ParamKind::Snap),
                per_a_d("qs_sketch_snap_rows", ParamKind::Snap),
                KernelEntry { name: "qs_sketch_snap_all".into(), params: ParamKind::SnapAll },
            ]
            .into_iter()
            .chain(
                lean_sketch_formats(a, d)
                    .then_some(["qs_sketch_lean", "qs_sketch_proj", "qs_sketch_fin"])
                    .into_iter()
                    .flatten()
                    .map(|stem| per_a_d(stem, ParamKind::Sketch)),
            )
            .collect(),
        })
    }

    /// [`Self::sketch`] compiled for one padded probe count only (`QS_SKETCH_KP`): a third of
    /// the code, which the check's latency depends on (instruction-cache misses).
    pub fn sketch_kp(a: Format, b: Format, d: Format, kp: u32) -> Result<KernelBuild, AbiError> {
        if !matches!(kp, 8 | 16 | 32) {
            return Err(AbiError::Probes { k: kp, max: MAX_PROBES });
        }
        let mut build = KernelBuild::sketch(a, b, d)?;
        build.defines.push(("QS_SKETCH_KP".into(), kp.to_string()));
        Ok(build)
    }

    /// `qs_compare.cu` for D's format: `qs_compare_{d}`, `qs_compare_logits_{d}`.
    pub fn compare(d: Format) -> Result<KernelBuild, AbiError> {
        let d = operand_format("d", d)?;
        Ok(KernelBuild {
            source: KernelSource::Compare,
            defines: vec![("QS_D_FMT".into(), (d as u8).to_string())],
            entries: vec![
                KernelEntry { name: format!("qs_compare_{}", d.name()), params: ParamKind::Compare },
                KernelEntry { name: format!("qs_compare_logits_{}", d.name()), params: ParamKind::Compare },
            ],
        })
    }

    /// `qs_selftest.cu`: the element-wise probes of the device helpers.
    pub fn selftest() -> KernelBuild {
        let e = |n: &str| KernelEntry { name: n.into(), params: ParamKind::Selftest };
        KernelBuild {
            source: KernelSource::Selftest,
            defines: vec![],
            entries: vec![
                e("qs_selftest_decode"),
                e("qs_selftest_encode"),
                e("qs_selftest_hash"),
                e("qs_selftest_window"),
                e("qs_selftest_scale_entry"),
                e("qs_selftest_late_copy"),
                e("qs_selftest_early_probe"),
            ],
        }
    }

    /// The programs a check of `p` in `mode` needs (rows and full modes share the GEMM and
    /// compare programs).
    pub fn for_problem(
        p: &GemmProblem,
        mode: crate::record::CheckMode,
    ) -> Result<Vec<KernelBuild>, AbiError> {
        use crate::record::CheckMode;
        match mode {
            CheckMode::Observe => Ok(vec![]),
            CheckMode::Sketch => {
                if !p.epilogue.is_linear() {
                    return Err(AbiError::NonLinearEpilogue { activation: p.epilogue.activation });
                }
                Ok(vec![KernelBuild::sketch(p.a.format, p.b.format, p.d.format)?])
            }
            CheckMode::Rows | CheckMode::Full => {
                Ok(vec![KernelBuild::gemm_ref(p.a.format, p.b.format)?, KernelBuild::compare(p.d.format)?])
            }
        }
    }

    pub fn entry(&self, params: ParamKind) -> Option<&KernelEntry> {
        self.entries.iter().find(|e| e.params == params)
    }

    /// Everything that selects the compiled program, besides the architecture.
    pub fn cache_key(&self) -> String {
        let defs: Vec<String> = self.defines.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{}:{}", self.source.file_name(), defs.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{Bias, Epilogue};

    /// qs_rng.h `qs_window_row`, operation for operation (the f64 quotient estimate and its
    /// corrections): the GPU selftest runs the kernel itself ("eager row windows").
    fn window_row_as_device(a: u64, b: u64, total: u64, start: u64, t: u64) -> u64 {
        if total > u32::MAX as u64 || a >= total || b >= total || start >= total || t >= total {
            return total;
        }
        let mut x = start.wrapping_add(t);
        if x >= total {
            x -= total;
        }
        let y = a.wrapping_mul(x);
        let q = (y as f64 * (1.0 / total as f64)) as u64;
        let mut r = y.wrapping_sub(q.wrapping_mul(total)) as i64;
        if r < 0 {
            r += total as i64;
        }
        if r >= total as i64 {
            r -= total as i64;
        }
        let v = r as u64 + b;
        if v >= total {
            v - total
        } else {
            v
        }
    }

    #[test]
    fn eager_windows_draw_the_permutations_rows_with_the_start_computed_on_the_host() {
        use crate::sketch::RowSample;
        let mut rng = crate::rng::SplitMix64::new(5);
        let totals =
            [2u64, 3, 255, 257, 4097, 65_537, 1 << 31, 3_000_000_019, 4_294_967_291, u32::MAX as u64];
        for &total in &totals {
            for seed in [1u64, 7, 0xdead_beef] {
                let sample = RowSample::new(seed, total, 256.min(total - 1));
                for epoch in [0u64, 1, 5, 1 << 20, u64::MAX / 3, rng.next_u64()] {
                    let mut sel = QsRowSel::eager(&sample, epoch);
                    assert_eq!((sel.mode, sel.epoch_value, sel.count), (ROWS_WINDOW, epoch, sample.count));
                    for t in 0..sample.count {
                        let row = window_row_as_device(sel.perm_a, sel.perm_b, sel.total_rows, sel.stride, t);
                        assert_eq!(
                            row,
                            sample.row(epoch, t),
                            "{total} rows, seed {seed}, epoch {epoch}, t {t}"
                        );
                    }
                    // The next epoch's window, moved on here as the bench moves a copy on.
                    sel.next_epoch();
                    assert_eq!(
                        sel,
                        QsRowSel::eager(&sample, epoch.wrapping_add(1)),
                        "{total} rows, epoch {epoch}"
                    );
                }
            }
        }
        // A corrupt window (start, a, b or t out of range, 2^32 rows or more) gives total_rows,
        // which qs_rows_at flags as out of bounds.
        for (a, b, total, start, t) in [
            (1, 15, 10, 0, 0),
            (11, 0, 10, 0, 0),
            (1, 0, 10, 10, 0),
            (1, 0, 10, 0, 10),
            (1, 0, 0, 0, 0),
            (1, 0, 1 << 32, 0, 0),
        ] {
            assert_eq!(window_row_as_device(a, b, total, start, t), total, "{a} {b} {total} {start} {t}");
        }
        // Every row in one call: no window. 2^32 rows or more: the device computes the start.
        assert_eq!(QsRowSel::eager(&RowSample::new(1, 100, 256), 3).mode, ROWS_ALL);
        let huge = RowSample::new(1, 1 << 33, 256);
        let sel = QsRowSel::eager(&huge, 3);
        assert_eq!((sel.mode, sel.epoch_value, sel.stride), (ROWS_PERM, 3, 256));
    }

    /// A general-kernel check for `plan_shared_splits`: one split at least, a block a slot.
    fn general_demand(groups: u64, max_splits: u32, bytes_per_group: u64) -> SplitDemand {
        SplitDemand { groups, min_splits: 1, max_splits, block_slots: 1, bytes_per_group }
    }

    #[test]
    fn shared_splits_follow_the_bytes_each_check_reads() {
        let d = general_demand;
        // One decode layer set of overhead_mlp.py 8 times (48 one-row checks, k = 32): four
        // 4096-deep checks, a 4096-deep one 14336 wide and a 14336-deep one, on 132 SMs.
        let layer = [
            d(1, 32, 540_000),
            d(1, 32, 540_000),
            d(1, 32, 540_000),
            d(1, 32, 540_000),
            d(1, 64, 561_000),
            d(1, 64, 1_870_000),
        ];
        let checks: Vec<SplitDemand> = layer.iter().copied().cycle().take(48).collect();
        let s = plan_shared_splits(&checks, 264);
        let blocks: u64 = s.iter().map(|&x| x as u64).sum();
        assert!((263..=264).contains(&blocks), "{blocks}");
        // The deep check gets ~3.5x the splits; per-block bytes end within one split of even.
        let per_block = |i: usize| checks[i].bytes_per_group as f64 / s[i] as f64;
        let worst = (0..48).map(per_block).fold(0.0, f64::max);
        let best = (0..48).map(per_block).fold(f64::MAX, f64::min);
        assert!(s[5] >= 3 * s[0], "{s:?}");
        assert!(worst <= 1_870_000.0 / 13.0 && worst / best < 1.6, "{worst} {best} {s:?}");
        // The uniform share this replaces: 5 each, the deep check's blocks reading 374 kB.
        assert!(worst < 1_870_000.0 / 5.0 / 2.0);
    }

    #[test]
    fn shared_splits_respect_each_scratch_and_the_wave() {
        let d = general_demand;
        // Capped by the scratch: the heavy check stops at 4, the rest goes to the light ones.
        assert_eq!(plan_shared_splits(&[d(1, 4, 1 << 30), d(1, 64, 1)], 20), vec![4, 16]);
        // A split costs a block per group: the 8-group check's second split takes 8 of the
        // 11 blocks left, after which only the one-group check fits more (3 of them).
        assert_eq!(plan_shared_splits(&[d(8, 32, 1000), d(1, 32, 1000)], 20), vec![2, 4]);
        assert_eq!(plan_shared_splits(&[d(8, 32, 8000), d(1, 32, 1000)], 20), vec![2, 4]);
        // More groups than the wave: one split each, as before.
        assert_eq!(plan_shared_splits(&[d(200, 32, 5), d(100, 32, 9)], 264), vec![1, 1]);
        assert_eq!(plan_shared_splits(&[], 264), Vec::<u32>::new());
        // Equal checks split evenly.
        assert_eq!(plan_shared_splits(&[d(1, 64, 7); 4], 22), vec![6, 6, 5, 5]);
        // A lean check's cluster fixes its splits; its blocks, a whole SM each, take 2 slots.
        let lean =
            SplitDemand { groups: 2, min_splits: 8, max_splits: 8, block_slots: 2, bytes_per_group: 1 << 30 };
        assert_eq!(plan_shared_splits(&[lean, d(1, 64, 7)], 46), vec![8, 14]);
    }

    #[test]
    fn sketch_view_folds_only_a_plain_tensor_wise_a_scale() {
        let problem = |a_gran, tensor_scalar: Option<Scalar>| {
            let mut p = GemmProblem::row_major(64, 96, 256, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
            p.a_scale = Some(ScaleSpec::new(a_gran, Format::F32));
            p.b_scale = Some(ScaleSpec::new(ScaleGranularity::Tensor, Format::F32));
            p.a_tensor_scale = tensor_scalar;
            p
        };
        let bufs = GemmBuffers {
            a: 0x1000,
            b: 0x2000,
            d: 0x3000,
            a_scale: 0x4000,
            b_scale: 0x5000,
            ..Default::default()
        };
        // FP8 _scaled_mm tensor-wise: the A scale becomes the device scalar at the same address.
        let g = QsGemmDesc::from_problem(&problem(ScaleGranularity::Tensor, None), &bufs).unwrap();
        let v = g.sketch_view();
        assert_eq!(v.a_scale.granularity, GRAN_NONE);
        assert_eq!((v.a_tensor_scale.on_device, v.a_tensor_scale.ptr), (1, 0x4000));
        assert_eq!(v.a_tensor_scale.format, Format::F32 as u32);
        assert_eq!(v.b_scale, g.b_scale, "B's scale is W_R's business");
        assert_eq!(QsGemmDesc { a_scale: g.a_scale, a_tensor_scale: g.a_tensor_scale, ..v }, g);
        // Row-wise scales, or an A that already has a tensor scalar (NVFP4): unchanged.
        let rows = QsGemmDesc::from_problem(&problem(ScaleGranularity::PerOuter, None), &bufs).unwrap();
        assert_eq!(rows.sketch_view(), rows);
        let nv = problem(ScaleGranularity::Tensor, Some(Scalar::Host(0.5)));
        let nv = QsGemmDesc::from_problem(&nv, &bufs).unwrap();
        assert_eq!(nv.sketch_view(), nv);
    }

    #[test]
    fn descriptors_from_a_transposed_fp8_problem() {
        let mut p = GemmProblem::row_major(64, 96, 256, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
        // nn.Linear weight: B stored N x K row-major, used transposed.
        p.trans_b = Transpose::T;
        p.b = MatrixLayout::packed(Format::E4m3fn, Order::RowMajor, 96, 256);
        p.a_scale = Some(ScaleSpec::new(ScaleGranularity::Block { outer: 1, inner: 128 }, Format::F32));
        p.b_scale = Some(ScaleSpec::new(ScaleGranularity::Block { outer: 128, inner: 128 }, Format::F32));
        p.epilogue =
            Epilogue { bias: Some(Bias { format: Format::Bf16, axis: BiasAxis::Cols }), ..Epilogue::NONE };
        let bufs = GemmBuffers {
            a: 0x1000,
            b: 0x2000,
            d: 0x3000,
            a_scale: 0x4000,
            b_scale: 0x5000,
            bias: 0x6000,
            ..Default::default()
        };
        let g = QsGemmDesc::from_problem(&p, &bufs).unwrap();
        assert_eq!(g.a.op_strides(), (256, 1));
        // op(B)(kk, j) = W[j][kk]: stride 1 along kk, ld along j.
        assert_eq!(g.b.op_strides(), (1, 256));
        assert_eq!(g.b.extent, 96 * 256);
        assert_eq!(
            (g.a_scale.block_outer, g.a_scale.block_inner, g.a_scale.grid_outer, g.a_scale.grid_inner),
            (1, 128, 64, 2)
        );
        assert_eq!(g.a_scale.ld, 2);
        assert_eq!(g.b_scale.extent, 2); // grid 1 x 2
        assert_eq!(g.bias.extent, 96);
        assert_eq!(g.bias.axis, BIAS_COLS);
        assert_eq!(g.d_scale.value, 1.0);
        // Every scale entry the device can compute is inside the extent.
        for i in 0..64 {
            for kk in 0..256 {
                let e = g.a_scale.entry(0, i, kk);
                assert_eq!(e, p.a_scale_entry(p.a_scale.as_ref().unwrap(), 0, i, kk));
                assert!(e < g.a_scale.extent);
            }
        }
    }

    #[test]
    fn swizzled_entries_match_problem_rs() {
        let spec =
            ScaleSpec::new(ScaleGranularity::Mx32, Format::Ue8m0).with_storage(ScaleStorage::Swizzled128x4);
        let (m, k) = (300u64, 544u64);
        let d = QsScaleDesc::from_spec(&spec, 0x100, m, k, 1).unwrap();
        for i in (0..m).step_by(7) {
            for kk in (0..k).step_by(5) {
                assert_eq!(d.entry(0, i, kk), spec.entry_for_element(0, i, kk, m, k));
                assert!(d.entry(0, i, kk) < d.extent);
            }
        }
    }

    #[test]
    fn lean_sketch_constants_match_the_kernel() {
        let text = KernelSource::Sketch.text();
        let define = |name: &str| -> u64 {
            let line = text.lines().find(|l| l.starts_with(&format!("#define {name} "))).expect(name);
            line.split_whitespace().nth(2).and_then(|v| v.parse().ok()).expect(name)
        };
        assert_eq!(define("QS_LEAN_ROWS"), LEAN_ROWS);
        assert_eq!(define("QS_LEAN_SPLITS"), LEAN_SPLITS);
    }

    #[test]
    fn a_split_buffer_holds_what_its_two_kernels_address() {
        // qs_sketch.cu: rows right after the header, then [groups][LEAN_SPLITS][2][LEAN_ROWS][kp]
        // f32 partials; the grid has one group per 32 rows, the last one partial.
        let l = SplitLayout::new(300, 32);
        assert_eq!(l.groups, 10);
        assert_eq!(l.rows_offset(), 704);
        assert_eq!(l.partials_offset(), 704 + 10 * 32 * 16);
        assert_eq!(l.bytes(), l.partials_offset() + 10 * 8 * 2 * 32 * 32 * 4);
        assert_eq!(l.status_offset(), 640);
        assert_eq!(lean_sketch_launch(300).unwrap().grid, [10, 8, 1]);
        // 16-byte aligned regions (the kernels' vector stores need none, the header's u64
        // atomics need 8): every offset stays aligned for any row count and kp.
        for (rows, kp) in [(1, 8), (33, 16), (256, 32), (4097, 8)] {
            let l = SplitLayout::new(rows, kp);
            assert_eq!(l.groups, rows.div_ceil(LEAN_ROWS));
            assert_eq!((l.rows_offset() % 16, l.partials_offset() % 16, l.bytes() % 16), (0, 0, 0));
        }
    }

    #[test]
    fn lean_sketch_takes_only_what_its_kernel_reads_as_vectors() {
        let desc = |p: &GemmProblem, a: u64, d: u64| {
            let bufs = GemmBuffers { a, b: 0x20000, c: 0, d, ..Default::default() };
            QsGemmDesc::from_problem(p, &bufs).unwrap().sketch_view()
        };
        let plain = GemmProblem::row_major(4096, 4096, 4096, Format::Bf16, Format::Bf16, Format::Bf16);
        assert!(desc(&plain, 0x10000, 0x30000).lean_sketch_eligible());
        // FP8 _scaled_mm: the tensor-wise A scale is folded, so eligible.
        let mut fp8 = GemmProblem::row_major(4096, 4096, 4096, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
        fp8.a_scale = Some(ScaleSpec::new(ScaleGranularity::Tensor, Format::F32));
        fp8.b_scale = Some(ScaleSpec::new(ScaleGranularity::Tensor, Format::F32));
        let bufs = GemmBuffers {
            a: 0x10000,
            b: 0x20000,
            d: 0x30000,
            a_scale: 0x40000,
            b_scale: 0x50000,
            ..Default::default()
        };
        assert!(QsGemmDesc::from_problem(&fp8, &bufs).unwrap().sketch_view().lean_sketch_eligible());
        // Per-row A scales stay per element: the general kernel.
        fp8.a_scale = Some(ScaleSpec::new(ScaleGranularity::PerOuter, Format::F32));
        assert!(!QsGemmDesc::from_problem(&fp8, &bufs).unwrap().sketch_view().lean_sketch_eligible());
        // Formats, K / N not multiples of 32, rows that are not 16-byte multiples, a D
        // address off 16 bytes, a transposed A (op(A) rows strided).
        let f32_a = GemmProblem::row_major(64, 64, 64, Format::F32, Format::Bf16, Format::Bf16);
        assert!(!desc(&f32_a, 0x10000, 0x30000).lean_sketch_eligible());
        let odd_k = GemmProblem::row_major(64, 64, 80, Format::Bf16, Format::Bf16, Format::Bf16);
        assert!(!desc(&odd_k, 0x10000, 0x30000).lean_sketch_eligible());
        let odd_n = GemmProblem::row_major(64, 48, 64, Format::Bf16, Format::Bf16, Format::Bf16);
        assert!(!desc(&odd_n, 0x10000, 0x30000).lean_sketch_eligible());
        let fp8_k = GemmProblem::row_major(64, 64, 32, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
        assert!(desc(&fp8_k, 0x10000, 0x30000).lean_sketch_eligible());
        let mut fp8_lda = fp8_k.clone();
        fp8_lda.a.ld = 40; // 40 bytes per row
        assert!(!desc(&fp8_lda, 0x10000, 0x30000).lean_sketch_eligible());
        assert!(!desc(&plain, 0x10000, 0x30008).lean_sketch_eligible());
        let mut at = GemmProblem::row_major(64, 64, 64, Format::Bf16, Format::Bf16, Format::Bf16);
        at.trans_a = crate::problem::Transpose::T;
        assert!(!desc(&at, 0x10000, 0x30000).lean_sketch_eligible());
        assert_eq!(wfrag_bytes(4096, 32), 4096 * 32 * 4);
        assert_eq!(wfrag_bytes(4096, 8), 4096 * 16 * 4);
    }

    #[test]
    fn misaligned_and_missing_buffers_are_refused() {
        let p = GemmProblem::row_major(8, 8, 8, Format::Bf16, Format::Bf16, Format::Bf16);
        let bufs = GemmBuffers { a: 0x1001, b: 0x2000, d: 0x3000, ..Default::default() };
        assert!(matches!(QsGemmDesc::from_problem(&p, &bufs), Err(AbiError::Misaligned { what: "a", .. })));
        let bufs = GemmBuffers { a: 0x1000, b: 0, d: 0x3000, ..Default::default() };
        assert!(matches!(QsGemmDesc::from_problem(&p, &bufs), Err(AbiError::MissingBuffer { what: "b" })));
    }

    #[test]
    fn registry_names_and_options() {
        let b = KernelBuild::sketch(Format::E4m3fn, Format::E4m3fn, Format::Bf16).unwrap();
        let names: Vec<&str> = b.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "qs_sketch_prep",
                "qs_sketch_wproj_e4m3fn",
                "qs_sketch_check_e4m3fn_bf16",
                "qs_sketch_snap_e4m3fn_bf16",
                "qs_sketch_snap_rows_e4m3fn_bf16",
                "qs_sketch_snap_all",
                "qs_sketch_lean_e4m3fn_bf16",
                "qs_sketch_proj_e4m3fn_bf16",
                "qs_sketch_fin_e4m3fn_bf16"
            ]
        );
        // Every kernel qs_sketch.cu names through a QS_SKETCH_* macro is an entry of a lean
        // build: a kernel left out of the list cannot be looked up in the loaded program.
        let text = KernelSource::Sketch.text();
        for line in text.lines().filter(|l| l.starts_with("#define QS_SKETCH_") && l.contains("QS_CAT")) {
            let stem = line.split('(').nth(1).and_then(|r| r.split(',').next()).expect(line);
            assert!(names.iter().any(|n| n.starts_with(stem)), "{stem} (from `{line}`) is no entry");
        }
        // No lean entry where qs_sketch.cu compiles none (QS_LEAN_FORMATS).
        let b = KernelBuild::sketch(Format::E5m2, Format::E4m3fn, Format::Bf16).unwrap();
        assert!(b.entries.iter().all(|e| !["qs_sketch_lean", "qs_sketch_proj", "qs_sketch_fin"]
            .iter()
            .any(|stem| e.name.starts_with(stem))));
        assert!(b.defines.iter().any(|(k, v)| k == "QS_D_FMT" && v == "2"));
        assert!(KernelBuild::gemm_ref(Format::Ue8m0, Format::Bf16).is_err());
        let mut p = GemmProblem::row_major(8, 8, 8, Format::Bf16, Format::Bf16, Format::Bf16);
        p.epilogue.activation = Activation::Relu;
        assert!(KernelBuild::for_problem(&p, crate::record::CheckMode::Sketch).is_err());
        assert_eq!(KernelBuild::for_problem(&p, crate::record::CheckMode::Rows).unwrap().len(), 2);
    }

    #[test]
    fn geometry_covers_rows_and_splits() {
        let g = SketchGeometry::new(256, 4096, 4096, 32, 132, 32).unwrap();
        assert_eq!(g.rows_per_group, 8);
        assert_eq!(g.groups, 32);
        assert!(g.splits >= 1 && (g.groups * g.splits) as u64 >= 132 && (g.groups * g.splits) as u64 <= 264);
        assert_eq!(g.kp, 32);
        let one = SketchGeometry::new(1, 64, 64, 8, 132, 32).unwrap();
        assert_eq!((one.groups, one.splits), (1, 1));
        // Decode: one row of 4096 x 4096 is spread over 32 splits of 128 elements.
        let dec = SketchGeometry::new(1, 4096, 4096, 32, 132, 32).unwrap();
        assert_eq!((dec.groups, dec.splits), (1, 32));
        // An LM head row: as many splits as the kernel allows.
        let head = SketchGeometry::new(1, 4096, 128_256, 32, 132, 32).unwrap();
        assert_eq!(head.splits, MAX_SPLITS);
        // 256 rows: at most 2 blocks per SM (one resident wave).
        assert_eq!(g.groups * g.splits, 32 * 8);
        let many_groups = SketchGeometry::new(4096, 4096, 4096, 32, 132, 32).unwrap();
        assert_eq!((many_groups.groups, many_groups.splits), (512, 1));
        assert!(padded_probes(0).is_err() && padded_probes(33).is_err());
        let c = CompareGeometry::new(256, 152_064, true, 132, 32).unwrap();
        assert!(c.block_per_row && c.launch.grid[0] == 256);
        // Long rows: a block each when few, a warp each when they fill the GPU.
        assert!(CompareGeometry::new(256, 14_336, false, 132, 32).unwrap().block_per_row);
        let many = CompareGeometry::new(4096, 14_336, false, 132, 32).unwrap();
        assert!(!many.block_per_row && many.launch.grid[0] == 512);
    }

    #[test]
    fn slot_bytes_round_trip() {
        let mut s = QsResultSlot { kind: CHECK_SKETCH, dot: 2.5, ..Default::default() };
        s.sketch_ref[31] = -1.0;
        let back: QsResultSlot = read_record(s.as_bytes()).unwrap();
        assert_eq!(back, s);
        assert!(read_record::<QsResultSlot>(&s.as_bytes()[..100]).is_none());
    }
}

// =============================================================================================
// Fault injection (kernels/qs_inject.cu, runtime/src/inject): qs_abi.h's appended section.
// Kept apart from the checking ABI above; nothing in a check depends on it.
// =============================================================================================

pub const INJECT_GARBAGE: u32 = 1;
pub const INJECT_HALF: u32 = 2;
pub const INJECT_TILE_ROWS: u32 = 3;
pub const INJECT_NAN: u32 = 4;
pub const INJECT_ZERO: u32 = 5;
pub const INJECT_SCALE_TRANSPOSE: u32 = 6;
pub const INJECT_SCALE_FILL: u32 = 7;

/// qs_abi.h QsInjectParams: one launch of `qs_inject_output_{d}` or `qs_inject_scale`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsInjectParams {
    pub d: QsMatrixDesc,
    pub src: QsScaleDesc,
    pub dst: QsScaleDesc,
    pub m: u64,
    pub n: u64,
    pub batch: u64,
    pub seed: u64,
    pub scale_items: u64,
    pub status_ptr: u64,
    pub op: u32,
    pub tile_period: u32,
    pub tile_offset: u32,
    pub tile_min_m: u32,
    pub fill_code: u32,
    pub reserved: u32,
}

const _: () = {
    assert!(size_of::<QsInjectParams>() == 248);
    assert!(offset_of!(QsInjectParams, src) == 48 && offset_of!(QsInjectParams, dst) == 112);
    assert!(offset_of!(QsInjectParams, m) == 176 && offset_of!(QsInjectParams, op) == 224);
};

// SAFETY: #[repr(C)], plain numeric fields, no padding (size and offsets pinned above).
unsafe impl KernelParams for QsInjectParams {}

impl QsInjectParams {
    /// Parameters of `qs_inject_output_{d}` applying output class `class` to D at `d_ptr`
    /// (in place), with the seed the host transform uses (`inject::apply_output_fault`).
    pub fn output(
        p: &GemmProblem,
        class: crate::inject::FaultClass,
        d_ptr: u64,
        seed: u64,
        status_ptr: u64,
    ) -> Result<QsInjectParams, AbiError> {
        use crate::inject::{FaultClass, TILE_MIN_M, TILE_OFFSET, TILE_PERIOD};
        p.validate()?;
        let op = match class {
            FaultClass::Garbage => INJECT_GARBAGE,
            FaultClass::FnAsFnuz => INJECT_HALF,
            FaultClass::TileRows => INJECT_TILE_ROWS,
            FaultClass::Nan => INJECT_NAN,
            FaultClass::ZeroAfterFirst => INJECT_ZERO,
            _ => return Err(AbiError::Inject { reason: format!("{class} is not an output transform") }),
        };
        if let Some(reason) = crate::inject::output_obstacle(p, class) {
            return Err(AbiError::Inject { reason });
        }
        check_aligned("d", d_ptr, p.d.format)?;
        Ok(QsInjectParams {
            d: QsMatrixDesc::new(&p.d, d_ptr, Transpose::N, p.m, p.n, p.batch),
            m: p.m,
            n: p.n,
            batch: p.batch,
            seed,
            status_ptr,
            op,
            tile_period: TILE_PERIOD as u32,
            tile_offset: TILE_OFFSET as u32,
            tile_min_m: TILE_MIN_M as u32,
            ..Default::default()
        })
    }

    /// Parameters of `qs_inject_scale` writing the rewritten copy of `operand`'s scales
    /// (`inject::prepare_scale_fault`) from `src_ptr` (the caller's buffer) to `dst_ptr` (a
    /// buffer of the same size, pre-filled with a copy of the source when the declared grid
    /// has ld padding the kernel does not touch).
    pub fn scale(
        p: &GemmProblem,
        operand: crate::inject::Operand,
        rewrite: crate::inject::ScaleRewrite,
        src_ptr: u64,
        dst_ptr: u64,
        status_ptr: u64,
    ) -> Result<QsInjectParams, AbiError> {
        use crate::inject::{flipped_storage, one_code, transpose_obstacle, Operand, ScaleRewrite};
        p.validate()?;
        let (outer, spec) = match operand {
            Operand::A => (p.m, p.a_scale),
            Operand::B => (p.n, p.b_scale),
        };
        let spec =
            spec.ok_or_else(|| AbiError::Inject { reason: format!("{} has no scales", operand.name()) })?;
        let items = if spec.batch_stride == 0 { 1 } else { p.batch };
        let dst = QsScaleDesc::from_spec(&spec, dst_ptr, outer, p.k, items)?;
        let (op, src) = match rewrite {
            ScaleRewrite::Ones => (INJECT_SCALE_FILL, QsScaleDesc::default()),
            ScaleRewrite::Transposed => {
                if let Some(reason) = transpose_obstacle(p, operand) {
                    return Err(AbiError::Inject { reason });
                }
                let flipped = flipped_storage(&spec).expect("plain storage");
                (INJECT_SCALE_TRANSPOSE, QsScaleDesc::from_spec(&flipped, src_ptr, outer, p.k, items)?)
            }
        };
        check_aligned("scale src", src_ptr, spec.format)?;
        check_aligned("scale dst", dst_ptr, spec.format)?;
        Ok(QsInjectParams {
            src,
            dst,
            scale_items: items,
            status_ptr,
            op,
            fill_code: one_code(spec.format),
            ..Default::default()
        })
    }
}

/// `qs_inject_output_{d}`: one 256-thread block per row, grid-stride beyond 65535 rows.
pub fn inject_output_launch(params: &QsInjectParams) -> Result<LaunchConfig, AbiError> {
    LaunchConfig::new([(params.batch * params.m).clamp(1, 65_535), 1, 1], BLOCK_THREADS)
}

/// `qs_inject_scale`: one thread per scale entry, grid-stride beyond 4096 blocks.
pub fn inject_scale_launch(params: &QsInjectParams) -> Result<LaunchConfig, AbiError> {
    let entries = params.scale_items * params.dst.grid_outer as u64 * params.dst.grid_inner as u64;
    LaunchConfig::new([entries.div_ceil(BLOCK_THREADS as u64).clamp(1, 4096), 1, 1], BLOCK_THREADS)
}

/// qs_abi.h QsPermuteParams: one launch of `qs_inject_permute` (the `no-transpose` operand
/// rewrite). For every batch item b and logical element (x, y) of op(X) (x < outer, y < inner):
/// `dst[b * dst_batch_stride + x * dst_outer_stride + y * dst_inner_stride] =
/// src[b * src_batch_stride + x * src_outer_stride + y * src_inner_stride]`, elements of
/// `elem_bytes` bytes; an offset at or past its side's extent is not touched (OUT_OF_BOUNDS).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QsPermuteParams {
    pub src_ptr: u64,
    pub dst_ptr: u64,
    pub batch: u64,
    pub outer: u64,
    pub inner: u64,
    pub src_batch_stride: u64,
    pub src_outer_stride: u64,
    pub src_inner_stride: u64,
    pub dst_batch_stride: u64,
    pub dst_outer_stride: u64,
    pub dst_inner_stride: u64,
    /// Elements each side holds.
    pub src_extent: u64,
    pub dst_extent: u64,
    pub status_ptr: u64,
    /// 1, 2 or 4.
    pub elem_bytes: u32,
    pub reserved: u32,
}

const _: () = {
    assert!(size_of::<QsPermuteParams>() == 120);
    assert!(offset_of!(QsPermuteParams, outer) == 24 && offset_of!(QsPermuteParams, src_extent) == 88);
    assert!(offset_of!(QsPermuteParams, elem_bytes) == 112);
};

// SAFETY: #[repr(C)], plain numeric fields, no padding (size and offsets pinned above).
unsafe impl KernelParams for QsPermuteParams {}

impl QsPermuteParams {
    /// Parameters of `qs_inject_permute` writing the `no-transpose` rewrite of `operand`
    /// (`inject::prepare_transpose_fault`): `src_ptr` holds the original operand (a saved copy of
    /// its declared extent), `dst_ptr` receives the rewritten one (the caller's buffer, which
    /// keeps its bytes where the declared layout reads nothing). `flipped` is the call with the
    /// operand's transpose flipped (`inject::flip_transpose`): same buffer, order, ld and batch
    /// stride. Element formats of 8 bits or more.
    pub fn transpose_fault(
        p: &GemmProblem,
        operand: crate::inject::Operand,
        flipped: &GemmProblem,
        src_ptr: u64,
        dst_ptr: u64,
        status_ptr: u64,
    ) -> Result<QsPermuteParams, AbiError> {
        use crate::inject::Operand;
        p.validate()?;
        flipped.validate()?;
        let inject = |reason: String| AbiError::Inject { reason };
        let (layout, flipped_layout, trans, flipped_trans, dims, outer, inner) = match operand {
            Operand::A => (p.a, flipped.a, p.trans_a, flipped.trans_a, p.a_stored_dims(), p.m, p.k),
            Operand::B => (p.b, flipped.b, p.trans_b, flipped.trans_b, p.b_stored_dims(), p.k, p.n),
        };
        let same_call = (p.m, p.n, p.k, p.batch) == (flipped.m, flipped.n, flipped.k, flipped.batch);
        if !same_call || layout != flipped_layout || trans == flipped_trans {
            return Err(inject(format!(
                "the flipped call must differ from the declared one in {}'s transpose only",
                operand.name()
            )));
        }
        let f = layout.format;
        if f.bits() < 8 {
            return Err(inject(format!("{} is packed 4-bit ({f})", operand.name())));
        }
        check_aligned("permute src", src_ptr, f)?;
        check_aligned("permute dst", dst_ptr, f)?;
        let extent = layout.required_elements(dims.0, dims.1, p.batch);
        // op(X)(x, y) strides of each reading of the same stored buffer (problem.rs a_offset /
        // b_offset): (row stride, column stride) of op(X).
        let strides = |t: Transpose| {
            QsMatrixDesc {
                ld: layout.ld,
                order: order_code(layout.order),
                trans: trans_code(t),
                ..Default::default()
            }
            .op_strides()
        };
        let (dst_outer_stride, dst_inner_stride) = strides(trans);
        let (src_outer_stride, src_inner_stride) = strides(flipped_trans);
        Ok(QsPermuteParams {
            src_ptr,
            dst_ptr,
            batch: p.batch,
            outer,
            inner,
            src_batch_stride: layout.batch_stride,
            src_outer_stride,
            src_inner_stride,
            dst_batch_stride: layout.batch_stride,
            dst_outer_stride,
            dst_inner_stride,
            src_extent: extent,
            dst_extent: extent,
            status_ptr,
            elem_bytes: f.bits() / 8,
            reserved: 0,
        })
    }
}

/// `qs_inject_permute`: one thread per element of op(X), grid-stride beyond 16384 blocks.
pub fn inject_permute_launch(params: &QsPermuteParams) -> Result<LaunchConfig, AbiError> {
    let total = params.batch.saturating_mul(params.outer).saturating_mul(params.inner);
    LaunchConfig::new([total.div_ceil(BLOCK_THREADS as u64).clamp(1, 16_384), 1, 1], BLOCK_THREADS)
}

impl KernelBuild {
    /// `qs_inject.cu` for D's format: `qs_inject_output_{d}`, `qs_inject_scale`,
    /// `qs_inject_permute`. D must be an element format of 8 bits or more (the scale and
    /// permute entries do not depend on it: any D format's program serves them).
    pub fn inject(d: Format) -> Result<KernelBuild, AbiError> {
        let d = operand_format("d", d)?;
        if d.bits() < 8 {
            return Err(AbiError::Inject { reason: format!("D format {d} is packed 4-bit") });
        }
        Ok(KernelBuild {
            source: KernelSource::Inject,
            defines: vec![("QS_D_FMT".into(), (d as u8).to_string())],
            entries: vec![
                KernelEntry { name: format!("qs_inject_output_{}", d.name()), params: ParamKind::Inject },
                KernelEntry { name: "qs_inject_scale".into(), params: ParamKind::Inject },
                KernelEntry { name: "qs_inject_permute".into(), params: ParamKind::InjectPermute },
            ],
        })
    }
}

#[cfg(test)]
mod inject_tests {
    use super::*;
    use crate::inject::{FaultClass, Operand, ScaleRewrite};

    #[test]
    fn inject_params_and_build() {
        let mut p = GemmProblem::row_major(64, 96, 512, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
        p.a_scale = Some(ScaleSpec::new(ScaleGranularity::Block { outer: 1, inner: 128 }, Format::F32));
        let o = QsInjectParams::output(&p, FaultClass::Garbage, 0x1000, 9, 0).unwrap();
        assert_eq!((o.op, o.m, o.n, o.d.extent, o.tile_period), (INJECT_GARBAGE, 64, 96, 64 * 96, 16));
        assert_eq!(inject_output_launch(&o).unwrap().grid, [64, 1, 1]);
        assert!(QsInjectParams::output(&p, FaultClass::ScaleIgnore, 0x1000, 0, 0).is_err());
        let s = QsInjectParams::scale(&p, Operand::A, ScaleRewrite::Transposed, 0x2000, 0x3000, 0).unwrap();
        assert_eq!(
            (s.op, s.src.storage, s.dst.storage),
            (INJECT_SCALE_TRANSPOSE, SCALE_INNER_MAJOR, SCALE_OUTER_MAJOR)
        );
        assert_eq!((s.src.ld, s.dst.ld, s.dst.grid_outer, s.dst.grid_inner), (64, 4, 64, 4));
        // The device's entry mapping of both sides is the host transform's.
        let spec = p.a_scale.unwrap();
        let flipped = crate::inject::flipped_storage(&spec).unwrap();
        for (o_, i) in [(0u64, 0u64), (5, 3), (63, 1)] {
            assert_eq!(s.dst.entry(0, o_, i * 128), spec.entry_index(o_, i, (64, 4)));
            assert_eq!(s.src.entry(0, o_, i * 128), flipped.entry_index(o_, i, (64, 4)));
        }
        let f = QsInjectParams::scale(&p, Operand::A, ScaleRewrite::Ones, 0, 0x3000, 0).unwrap();
        assert_eq!((f.op, f.fill_code), (INJECT_SCALE_FILL, 0x3F80_0000));
        assert!(QsInjectParams::scale(&p, Operand::B, ScaleRewrite::Ones, 0, 0x3000, 0).is_err());
        let b = KernelBuild::inject(Format::Bf16).unwrap();
        let names: Vec<&str> = b.entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["qs_inject_output_bf16", "qs_inject_scale", "qs_inject_permute"]);
        assert!(KernelBuild::inject(Format::E2m1).is_err());
    }

    /// What `qs_inject_permute` does, element for element.
    fn permute_on_host(q: &QsPermuteParams, src: &[u8], dst: &mut [u8]) -> u64 {
        let w = q.elem_bytes as usize;
        let mut out_of_bounds = 0;
        for b in 0..q.batch {
            for x in 0..q.outer {
                for y in 0..q.inner {
                    let so = b * q.src_batch_stride + x * q.src_outer_stride + y * q.src_inner_stride;
                    let d = b * q.dst_batch_stride + x * q.dst_outer_stride + y * q.dst_inner_stride;
                    if so >= q.src_extent || d >= q.dst_extent {
                        out_of_bounds += 1;
                        continue;
                    }
                    let (so, d) = (so as usize * w, d as usize * w);
                    dst[d..d + w].copy_from_slice(&src[so..so + w]);
                }
            }
        }
        out_of_bounds
    }

    #[test]
    fn permute_params_are_the_host_transpose_fault() {
        use crate::inject::{flip_transpose, prepare_transpose_fault};
        let mut cases = vec![];
        // Square A transposed (bf16), square A as stored (e4m3fn), f32 with ld padding.
        let mut p = GemmProblem::row_major(48, 20, 48, Format::Bf16, Format::Bf16, Format::Bf16);
        p.trans_a = Transpose::T;
        cases.push((p, Operand::A));
        cases.push((
            GemmProblem::row_major(32, 8, 32, Format::E4m3fn, Format::E4m3fn, Format::Bf16),
            Operand::A,
        ));
        let mut p = GemmProblem::row_major(24, 8, 24, Format::F32, Format::F32, Format::F32);
        p.a.ld = 30;
        p.a.batch_stride = 24 * 30;
        cases.push((p, Operand::A));
        // B: nn.Linear weight (N x K stored, transposed), square; column-major e4m3fn.
        let mut p = GemmProblem::row_major(5, 40, 40, Format::Bf16, Format::Bf16, Format::Bf16);
        p.trans_b = Transpose::T;
        cases.push((p, Operand::B));
        let mut p = GemmProblem::row_major(5, 16, 16, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
        p.b = MatrixLayout::packed(Format::E4m3fn, Order::ColMajor, 16, 16);
        cases.push((p, Operand::B));
        // Batched, items apart by more than one matrix.
        let mut p = GemmProblem::row_major(16, 6, 16, Format::Bf16, Format::Bf16, Format::Bf16);
        p.batch = 3;
        p.a.batch_stride = 16 * 16 + 8;
        p.b.batch_stride = 16 * 6;
        p.d.batch_stride = 16 * 6;
        cases.push((p, Operand::A));
        for (p, op) in cases {
            let flipped = flip_transpose(&p, op).unwrap();
            let (layout, dims) = match op {
                Operand::A => (p.a, p.a_stored_dims()),
                Operand::B => (p.b, p.b_stored_dims()),
            };
            let n = layout.format.bytes_for(layout.required_elements(dims.0, dims.1, p.batch) as usize);
            let src: Vec<u8> = (0..n).map(|i| (i * 131 % 251) as u8).collect();
            let host = prepare_transpose_fault(&p, op, &flipped, &src).unwrap();
            let q = QsPermuteParams::transpose_fault(&p, op, &flipped, 0x1000, 0x2000, 0).unwrap();
            let mut device = src.clone(); // dst is the caller's buffer: it starts as the original
            assert_eq!(permute_on_host(&q, &src, &mut device), 0, "{p}");
            assert_eq!(device, host, "{p} {op:?}");
            assert_ne!(host, src, "{p} {op:?}: the rewrite changes the buffer");
            let cfg = inject_permute_launch(&q).unwrap();
            assert!(cfg.grid[0] as u64 * 256 >= (p.batch * q.outer * q.inner).min(16_384 * 256));
        }
        // The flipped call must be the declared one with one flag flipped; 4-bit is refused.
        let p = GemmProblem::row_major(32, 8, 32, Format::E4m3fn, Format::E4m3fn, Format::Bf16);
        assert!(QsPermuteParams::transpose_fault(&p, Operand::A, &p, 0, 0, 0).is_err());
        let flipped = flip_transpose(&p, Operand::A).unwrap();
        assert!(QsPermuteParams::transpose_fault(&p, Operand::B, &flipped, 0, 0, 0).is_err());
        assert!(QsPermuteParams::transpose_fault(&p, Operand::A, &flipped, 0x1001, 0x2000, 0).is_ok());
        let mut p4 = GemmProblem::row_major(32, 8, 32, Format::E2m1, Format::E2m1, Format::Bf16);
        p4.a.ld = 32;
        let f4 = flip_transpose(&p4, Operand::A).unwrap();
        assert!(QsPermuteParams::transpose_fault(&p4, Operand::A, &f4, 0, 0, 0).is_err());
        let f16 = GemmProblem::row_major(32, 8, 32, Format::Bf16, Format::Bf16, Format::Bf16);
        let ff = flip_transpose(&f16, Operand::A).unwrap();
        assert!(QsPermuteParams::transpose_fault(&f16, Operand::A, &ff, 0x1001, 0x2000, 0).is_err());
    }
}
