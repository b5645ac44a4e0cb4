// The binary interface between the Rust runtime and the device kernels: every struct passed
// to a kernel (by value, as its single parameter) and every struct the kernels write (result
// ring slots, scratch). runtime/src/device/abi.rs mirrors each struct field for field with
// #[repr(C)]; both sides assert the sizes and offsets below, so a change on one side that is
// not made on the other fails to compile.
//
// Layout rules: only fixed-width fields; u64/f64 first, then u32; explicit `reserved` padding
// so there is no implicit padding anywhere; every struct a multiple of 8 bytes. Addresses are
// u64 (device pointers, or mapped host pointers for the ring). Element counts, leading
// dimensions and strides are in elements of the buffer's own format (packed 4-bit formats:
// elements, not bytes), as in runtime/src/problem.rs.
#pragma once
#include "qs_portability.h"

#define QS_ABI_VERSION 2u
#define QS_MAX_PROBES 32
#define QS_MAX_TOPK 16
#define QS_MAX_SPLITS 64 /* gridDim.y of qs_sketch_check */
#define QS_RING_MAGIC 0x47525351u /* "QSRG" little-endian */

// Memory order of a stored matrix (problem.rs Order).
#define QS_ORDER_ROW 0u
#define QS_ORDER_COL 1u
// Whether op() transposes the stored matrix (problem.rs Transpose).
#define QS_TRANS_N 0u
#define QS_TRANS_T 1u

// Scale granularity (problem.rs ScaleGranularity). Informational for kernels, which use the
// block and grid dimensions the host resolved with block_shape() and grid().
#define QS_GRAN_NONE 0u
#define QS_GRAN_TENSOR 1u
#define QS_GRAN_PER_OUTER 2u
#define QS_GRAN_PER_INNER 3u
#define QS_GRAN_BLOCK 4u
#define QS_GRAN_MX32 5u
#define QS_GRAN_NVFP4 6u

// Scale storage (problem.rs ScaleStorage).
#define QS_SCALE_OUTER_MAJOR 0u
#define QS_SCALE_INNER_MAJOR 1u
#define QS_SCALE_SWIZZLED_128X4 2u

#define QS_ACT_NONE 0u
#define QS_ACT_RELU 1u
#define QS_ACT_GELU_TANH 2u

#define QS_BIAS_ROWS 0u
#define QS_BIAS_COLS 1u

// Which rows a launch covers (QsRowSel::mode).
#define QS_ROWS_ALL 0u  /* t -> t, for t < count (count <= total_rows) */
#define QS_ROWS_LIST 1u /* t -> list[t] */
#define QS_ROWS_PERM 2u /* t -> perm((epoch * stride + t) mod total_rows) */
/* t -> perm((stride + t) mod total_rows): PERM's window of an epoch the host counted, whose start
   epoch * stride mod total_rows the host puts in `stride` (total_rows < 2^32, count <= total_rows) */
#define QS_ROWS_WINDOW 3u

// Kind of check recorded in a result slot (record CheckMode, plus the logits variant).
#define QS_CHECK_SKETCH 1u
#define QS_CHECK_ROWS 2u
#define QS_CHECK_FULL 3u
#define QS_CHECK_LOGITS 4u

// Status bits (QsResultSlot::status; also OR'ed into a check's status word by earlier kernels).
#define QS_STATUS_OUT_OF_BOUNDS 1u  /* an index fell outside a descriptor's extent; read as 0 */
#define QS_STATUS_BAD_DESCRIPTOR 2u /* format differs from the specialisation, bad grid, k... */
#define QS_STATUS_NONLINEAR 4u      /* sketch of a non-linear epilogue: results meaningless */
#define QS_STATUS_BAD_SCALAR 8u     /* d_scale zero or non-finite: y not rescaled */
#define QS_STATUS_REF_NONFINITE 16u /* the reference side has NaN/Inf */
#define QS_STATUS_WEIGHT_CHANGED 32u /* sketch: B no longer holds what W_R was projected from */
#define QS_WEIGHT_SAMPLES 64 /* 4-byte samples of B kept with W_R to notice a changed weight */

// ---------------------------------------------------------------------------------------------
// Problem descriptors
// ---------------------------------------------------------------------------------------------

// A stored matrix (problem.rs MatrixLayout plus its address and op()).
struct QsMatrixDesc {
    qs_u64 ptr;          // 0: absent (C only)
    qs_u64 ld;           // elements between rows (row-major) or columns (column-major)
    qs_u64 batch_stride; // elements between batch items; 0 = one matrix for every item
    qs_u64 extent;       // elements the buffer holds: no element at or past it is touched
    qs_u32 format;       // QS_FMT_*
    qs_u32 order;        // QS_ORDER_*
    qs_u32 trans;        // QS_TRANS_* (A and B; 0 for C and D)
    qs_u32 reserved;
};

// Scale factors of A or B in outer (M for A, N for B) x inner (K) block coordinates.
// Entry of element (outer, inner) of batch item b:
//   b * batch_stride + entry(outer / block_outer, inner / block_inner)
// with entry() of problem.rs ScaleSpec::entry_index for `storage` (ld already resolved: never 0).
struct QsScaleDesc {
    qs_u64 ptr; // 0: no scale (factor 1)
    qs_u64 ld;
    qs_u64 batch_stride;
    qs_u64 extent; // entries the buffer holds
    qs_u32 format; // QS_FMT_F32 / F16 / BF16 / UE8M0 / UE4M3
    qs_u32 storage;
    qs_u32 granularity;
    qs_u32 block_outer;
    qs_u32 block_inner;
    qs_u32 grid_outer;
    qs_u32 grid_inner;
    qs_u32 reserved;
};

// A scalar: a host value, or one element of `format` at a device address read by the kernel.
struct QsScalar {
    qs_f64 value;
    qs_u64 ptr;
    qs_u32 format;
    qs_u32 on_device; // 1: read ptr, 0: use value
};

struct QsBiasDesc {
    qs_u64 ptr; // 0: no bias
    qs_u64 extent;
    qs_u32 format;
    qs_u32 axis; // QS_BIAS_ROWS (length M) / QS_BIAS_COLS (length N)
};

// One GEMM call (problem.rs GemmProblem + GemmBuffers):
//   acc = sum_k a(i,k) sa(i,k) a_ts * b(k,j) sb(k,j) b_ts
//   t   = alpha acc + beta c(i,j) + bias;   d = round_d(act(t) * d_scale)
struct QsGemmDesc {
    qs_u64 m, n, k, batch;
    QsMatrixDesc a, b, c, d;
    QsScaleDesc a_scale, b_scale;
    QsScalar alpha, beta, a_tensor_scale, b_tensor_scale, d_scale;
    QsBiasDesc bias;
    qs_u32 activation; // QS_ACT_*
    qs_u32 reserved0;
    qs_u64 reserved1;
};

// Rows of D a launch covers. Rows are global: r = batch_item * M + i, total_rows = batch * M.
// PERM: t -> (a * x + b) mod total_rows with x = (epoch * stride + t) mod total_rows, where
// epoch is *epoch_ptr (a per-site u64 counter in device memory) or epoch_value when
// epoch_ptr is 0. The launch with advance_epoch = 1 increments *epoch_ptr once, in its last
// block, after every block has read it: so graph replays advance it and every kernel of one
// check sees the same epoch. WINDOW (eager calls, whose epochs the host counts): the same rows
// of epoch epoch_value, with x = (stride + t) mod total_rows, the host having put the window's
// start epoch * stride mod total_rows in `stride`.
struct QsRowSel {
    qs_u64 total_rows;
    qs_u64 count; // rows covered by this launch, t in [0, count)
    qs_u64 stride;
    qs_u64 perm_a;
    qs_u64 perm_b;
    qs_u64 list_ptr; // u64[count] global row indices (LIST)
    qs_u64 epoch_ptr;
    qs_u64 epoch_value;
    qs_u32 mode; // QS_ROWS_*
    qs_u32 advance_epoch;
};

// ---------------------------------------------------------------------------------------------
// Result ring
// ---------------------------------------------------------------------------------------------

// In mapped pinned host memory, written by the host except `dropped`.
struct QsRingHeader {
    qs_u32 magic;       // QS_RING_MAGIC
    qs_u32 abi_version; // QS_ABI_VERSION
    qs_u32 slot_size;   // sizeof(QsResultSlot)
    qs_u32 capacity;    // slots
    qs_u64 consumed;    // host poller: every ticket below this has been read
    qs_u64 dropped;     // device: copy of QsRingCtl::dropped (a lower bound while running)
    qs_u64 reserved[4];
};

// In device memory (atomics on mapped host memory are not atomic across the bus).
struct QsRingCtl {
    qs_u64 head;          // next ticket
    qs_u64 dropped;       // results not written because the ring was full
    qs_u64 consumed_seen; // last QsRingHeader::consumed read across the bus (a lower bound)
};

struct QsRingDesc {
    qs_u64 header_ptr; // QsRingHeader* (mapped host memory)
    qs_u64 slots_ptr;  // QsResultSlot[capacity] (mapped host memory)
    qs_u64 ctl_ptr;    // QsRingCtl* (device memory)
    qs_u32 capacity;
    qs_u32 reserved;
};

// One result. The finishing block claims ticket T (head - consumed < capacity, else the result
// is dropped and counted; `consumed` is read across the bus only when the device's copy of it
// says the ring is full), then writes slot T % capacity with ready = T + 1 and `check`, a hash
// of every other word (qs_slot_check), without any system-scope fence: the words may reach
// host memory in any order. The poller takes slot (c % capacity) once ready == c + 1 and the
// hash of what it read matches `check` (else it reads again later), then publishes
// consumed = c + 1; a slot is never rewritten before it was consumed.
//
// Sketch slots: the MetricSums fields are over the (row, probe) pairs (y_ip, x_ip) with
// y = D R / d_scale and x = the reference projected likewise, so nan/inf counts count
// projections; elem_nan_prod / elem_inf_prod count elements of D in the sampled rows.
struct QsResultSlot {
    qs_u64 ready;
    qs_u64 ticket;
    qs_u64 tag;  // host-chosen (site id)
    qs_u64 tag2; // host-chosen (call ordinal at enqueue or capture)
    qs_u64 epoch;
    qs_u32 kind;   // QS_CHECK_*
    qs_u32 status; // QS_STATUS_*
    qs_u32 probes; // k (sketch)
    qs_u32 topk;   // logits k
    qs_u64 rows_checked;
    // metrics.rs MetricSums, field for field.
    qs_f64 dot, prod_sq, ref_sq, diff_sq, max_abs_err;
    qs_u64 finite, pairs, nan_prod, inf_prod, nan_ref, inf_ref;
    // Lowest per-row cosine (compare_matrix rules: a row with a non-finite value is -1; ties
    // keep the earlier sample position). worst_row = ~0 when no row was checked.
    qs_u64 worst_row;
    qs_f64 worst_cosine, worst_dot, worst_prod_sq, worst_ref_sq;
    qs_u64 elem_nan_prod, elem_inf_prod;
    // Logits (QS_CHECK_LOGITS): sums over rows; the top lists are those of the row with the
    // largest KL.
    qs_u64 logits_rows, top1_agree, topk_hits, kl_nonfinite_rows;
    qs_f64 kl_sum, kl_max;
    qs_u64 kl_max_row;
    qs_u32 prod_top_idx[QS_MAX_TOPK];
    qs_f32 prod_top_val[QS_MAX_TOPK];
    qs_u32 ref_top_idx[QS_MAX_TOPK];
    qs_f32 ref_top_val[QS_MAX_TOPK];
    // Sketch fingerprints: sum over the sampled rows of y_ip and x_ip (finite pairs only).
    qs_f64 sketch_prod[QS_MAX_PROBES];
    qs_f64 sketch_ref[QS_MAX_PROBES];
    qs_u64 reserved[14];
    qs_u64 check; // qs_slot_check of the other words, written with them (no fence)
};

// ---------------------------------------------------------------------------------------------
// Kernel parameters (each kernel takes one of these by value)
// ---------------------------------------------------------------------------------------------

// qs_gemm_ref_{a}_{b} (rows = ALL over batch * M) and qs_gemm_ref_rows_{a}_{b}.
// Writes out[t * out_ld + j] = d_scale * act(alpha acc + beta c + bias) for the selected rows
// (t = global row for the full variant), rounded to D's format when round_to_d = 1: what D
// should hold, in D's units.
struct QsRefParams {
    QsGemmDesc g;
    QsRowSel rows;
    qs_u64 out_ptr; // f32
    qs_u64 out_ld;
    qs_u64 status_ptr; // u32 status word of the check (0: none)
    qs_u32 round_to_d;
    qs_u32 reserved;
    // Sampling decided on the device per launch (graph replays; qs_gate_take): 0 = always.
    qs_u64 gate_ptr;
    qs_u32 gate_first;
    qs_u32 gate_every;
};

// qs_sketch_prep: sign words, column sums of R and the bias projection, once per (seed, N, bias).
struct QsPrepParams {
    qs_u64 n;
    qs_u64 seed;
    qs_u64 signs_ptr;    // u32[n]: bit p set when r(j, p) = -1
    qs_u64 rsum_ptr;     // f64[QS_MAX_PROBES]: sum_j r(j, p)
    qs_u64 bproj_ptr;    // f64[QS_MAX_PROBES]: sum_j bias_j r(j, p) (column bias), else 0
    qs_u64 partials_ptr; // f64[gridDim.x][2][QS_MAX_PROBES]
    qs_u64 counter_ptr;  // u32, 0 before the first launch; the last block resets it
    qs_u64 status_ptr;
    QsBiasDesc bias;
    qs_u32 k;
    qs_u32 reserved;
};

// qs_sketch_wproj_{b}: W_R[item][kk][p] = sum_j b(kk, j) sb(kk, j) r(j, p), p < kp, f32,
// without b's tensor scale (read per call by the check). One W_R per batch item of B.
struct QsWprojParams {
    QsMatrixDesc b;
    QsScaleDesc b_scale;
    qs_u64 k_dim;
    qs_u64 n_dim;
    qs_u64 items; // W_R matrices (gridDim.z)
    qs_u64 signs_ptr;
    qs_u64 out_ptr; // f32[items][k_dim][kp]
    qs_u64 status_ptr;
    qs_u32 kp; // 8, 16 or 32
    qs_u32 reserved;
    qs_u64 snapshot_ptr; // u32[QS_WEIGHT_SAMPLES]: B's bytes at qs_weight_sample positions; 0 = none
    // W_R again in mma fragment order, bf16 hi + lo (qs_wfrag_index in qs_sketch.cu), for the
    // lean check; 0 = not written. Items == 1 and k_dim % 32 == 0 only.
    qs_u64 frag_ptr;
};

// qs_sketch_check_{a}_{d}: grid (groups, splits), QS_BLOCK threads; group g covers sample
// positions [g * rows_per_group, ...), one warp per row; split s covers one slice of K (for
// A W_R) and of N (for D R and C R).
struct QsSketchParams {
    QsGemmDesc g;
    QsRowSel rows;
    QsRingDesc ring;
    qs_u64 tag;
    qs_u64 tag2;
    qs_u64 signs_ptr;
    qs_u64 wr_ptr;
    qs_u64 wr_batch_stride; // elements between W_R items; 0 = one W_R for every batch item
    qs_u64 rsum_ptr;
    qs_u64 bproj_ptr;
    qs_u64 partials_ptr;  // f64[groups][splits][rows_per_group][3][kp] (A W_R, D R, C R)
    qs_u64 totals_ptr;    // QsSketchTotals, zero before the first launch, reset by the kernel
    qs_u64 rowrec_ptr;    // QsSketchRow[groups * rows_per_group]
    qs_u64 counters_ptr;  // u32[groups + 1], zero before the first launch, reset by the kernel
    qs_u64 status_ptr;    // u32 status word, folded into the slot and reset
    qs_u64 row_stats_ptr; // optional f64[count][3] per-row (dot, yy, xx); 0 = not written
    qs_u32 k;
    qs_u32 kp;
    qs_u32 splits;
    qs_u32 rows_per_group;
    // Sampling decided on the device, per launch (graph replays): 0 = every launch checks.
    // Launch t (counted by an atomic at gate_ptr, u64) checks when t < gate_first or
    // (gate_every != 0 and (t - gate_first) % gate_every == 0); other launches return at once.
    qs_u64 gate_ptr;
    qs_u32 gate_first;
    qs_u32 gate_every;
    // Samples of B taken with W_R (QsWprojParams::snapshot_ptr); a launch that finds B changed
    // flags QS_STATUS_WEIGHT_CHANGED instead of judging against a stale projection. 0 = none.
    qs_u64 snapshot_ptr;
    // Detached check: the QsSnapHeader of the snapshot `g` describes (0: `g` is the call
    // itself). The check reports the snapshot's epoch and status, and row t as the header's
    // rows[t].
    qs_u64 packed_ptr;
    // qs_sketch_lean, qs_sketch_proj and qs_sketch_fin: W_R in fragment order
    // (QsWprojParams::frag_ptr).
    qs_u64 wfrag_ptr;
    // qs_sketch_proj and qs_sketch_fin only: the split check's buffer (QsSplitHeader below).
    qs_u64 split_ptr;
};

// Detached sketch (DESIGN.md; runtime/src/engine/gpu.rs "detached"): qs_sketch_snap_{a}_{d}
// copies the sampled rows of a call on the caller's stream into a snapshot buffer, so that the
// check can run later, off that stream, while the caller reuses A, D and C. The snapshot is a
// GEMM of `count` rows (batch item 0): packed row t holds op(A) row, A's scale entries, C row,
// D row and row bias of sampled row t in the call's own formats. Buffer layout (byte offsets in
// QsSnapParams): this header, the row list u64[count], then the regions.
struct QsSnapHeader {
    qs_u64 tag;        // launch tag, (epoch mod 2^31) + 1: never 0 (1 from a copy of every row)
    qs_u64 epoch;      // row epoch the rows were drawn at
    qs_u64 scalars[5]; // codes of the device-pointer scalars: alpha, a_ts, b_ts, beta, d_scale
    qs_u64 status;     // (tag << 32) | QS_STATUS_* bits of the copy (out-of-bounds reads)
};

// Packed region of a snapshot: row t at off + t * row_bytes (16-byte aligned rows).
struct QsSnapRegion {
    qs_u64 off;
    qs_u64 row_bytes;
};

// qs_sketch_snap_{a}_{d}: grid (count, chunks), QS_BLOCK threads. Block (t, c) copies slice c
// of each row region of sampled row t; blocks (t, 0) also copy the scale entries and the row
// bias. Graph replays count the epoch on the device (epoch_counter_ptr: u64, zero at set-up,
// never reset): every block adds one, so launch L reads values in [L * blocks, (L + 1) *
// blocks) and all blocks agree on L without a barrier. Eager calls pass the epoch in
// rows.epoch_value (epoch_counter_ptr 0). Where the lean copy applies, the host gives a copy of
// every row (QS_ROWS_ALL) qs_sketch_snap_all (QsSnapAllParams), which counts nothing (tag 1);
// calls its 32-bit sizes cannot describe take the counted copy.
struct QsSnapParams {
    QsGemmDesc g;
    QsRowSel rows;     // PERM (epoch from epoch_counter_ptr, else rows.epoch_value), WINDOW or ALL
    qs_u64 out_ptr;    // snapshot buffer
    QsSnapRegion a, a_scale, c, d;
    qs_u64 bias_off;   // row bias entries (bias format), count of them
    qs_u64 epoch_counter_ptr;
};

// qs_sketch_snap_all: the copy of every row (QS_ROWS_ALL: decode) for the calls the lean copy
// serves (snapshot.rs `lean_copy`), format-free: whole 16-byte vectors of each op(A) row and D row
// into the same snapshot layout (QsSnapHeader with tag 1, row list t -> t, regions). Grid (rows,
// chunks), QS_BLOCK threads: block (t, c) copies slice c of row t. The host computes what the
// header holds besides the device-pointer scalars.
struct QsSnapAllParams {
    qs_u64 a_ptr;      // op(A) row 0
    qs_u64 a_ld_bytes; // bytes from one op(A) row to the next
    qs_u64 d_ptr;      // D row 0
    qs_u64 d_ld_bytes;
    qs_u64 out_ptr;    // snapshot buffer
    QsSnapRegion a, d;
    qs_u64 epoch;          // header epoch
    qs_u64 status;         // header status word: (1 << 32) | QS_STATUS_* bits
    qs_u64 scalar_ptr[5];  // device-pointer scalars (alpha, a_ts, b_ts, beta, d_scale); 0: none
    qs_u32 scalar_bits[5]; // their element widths (4, 8, 16 or 32)
    qs_u32 rows;           // rows to copy: t < rows (the grid may have more)
    qs_u32 a_bytes;        // bytes of one op(A) row, a multiple of 16
    qs_u32 d_bytes;        // bytes of one D row, a multiple of 16
};

// qs_compare_{d} and qs_compare_logits_{d}: D rows vs the f32 reference rows. Grid-stride over
// the rows: any grid.x; QS_BLOCK threads. The logits variant always takes a block per row.
struct QsCompareParams {
    QsMatrixDesc d;
    QsRowSel rows;
    QsRingDesc ring;
    qs_u64 tag;
    qs_u64 tag2;
    qs_u64 m; // rows per batch item
    qs_u64 n;
    qs_u64 ref_ptr; // f32: reference row t at ref_ptr + t * ref_ld
    qs_u64 ref_ld;
    qs_u64 partials_ptr;  // QsComparePartial[gridDim.x]
    qs_u64 rowout_ptr;    // QsLogitsRow[count] (logits variant)
    qs_u64 counter_ptr;   // u32
    qs_u64 status_ptr;    // u32 status word of the check, folded into the slot and reset
    qs_u64 row_stats_ptr; // optional f64[count][3] per-row (dot, pp, rr)
    qs_u32 kind;          // QS_CHECK_ROWS / QS_CHECK_FULL / QS_CHECK_LOGITS
    qs_u32 topk;          // logits: 1..QS_MAX_TOPK
    qs_u32 block_per_row; // 1: a block per row (long rows, logits); 0: a warp per row
    qs_u32 reserved;
    // Sampling decided on the device per launch (graph replays; qs_gate_take): 0 = always.
    // A rows/full check's reference and compare count their launches on counters of their own
    // and reach the same decision.
    qs_u64 gate_ptr;
    qs_u32 gate_first;
    qs_u32 gate_every;
};

// qs_selftest_*: element-wise probes of the device helpers, compared bit for bit with the host
// (formats.rs, rng.rs, sketch.rs, problem.rs) by the GPU selftest. Grid-stride over n.
//   decode:      in u32 codes           -> out f64[2n]: (decode_f64, decode_f32 as f64)
//   encode:      in f64 values          -> out u32[n] : encode(format, value)
//   hash:        in u64 indices x       -> out u64[3n]: hash3(seed, stream, x), probe sign bit
//                                                       r(x, stream) (seed), perm row of t = x
//   scale_entry: in u64 (b, outer, inner) triples -> out u64[n]: entry_for_element
struct QsSelftestParams {
    qs_u64 in_ptr;
    qs_u64 out_ptr;
    qs_u64 n;
    qs_u64 seed;
    qs_u64 stream;
    qs_u64 perm_a, perm_b, total, stride, epoch;
    QsScaleDesc scale;
    qs_u32 format;
    qs_u32 reserved;
};

// ---------------------------------------------------------------------------------------------
// Scratch records (device memory, sized by the host)
// ---------------------------------------------------------------------------------------------

struct QsSums {
    qs_f64 dot, prod_sq, ref_sq, diff_sq, max_abs_err;
    qs_u64 finite, pairs, nan_prod, inf_prod, nan_ref, inf_ref;
};

struct QsWorst {
    qs_u64 t;   // sample position (tie-break), ~0 = none
    qs_u64 row; // global row
    qs_f64 cosine, dot, prod_sq, ref_sq;
};

// Whole-check accumulators of one sketch launch, added to atomically by the blocks that finish
// a group of rows and read (and reset to zero) by the block that finishes the check. Zero
// before the first launch.
struct QsSketchTotals {
    qs_f64 sums[4];          // dot, prod_sq, ref_sq, diff_sq over the finite (y, x) pairs
    qs_u64 max_abs_err;      // bits of a non-negative f64: integer max orders like the value
    qs_u64 counts[6];        // finite, pairs, nan_prod, inf_prod, nan_ref, inf_ref
    qs_u64 elem_nonfinite[2]; // NaN, Inf elements of D in the sampled rows
    qs_u64 worst;            // ~qs_sketch_rank_key of the worst row; 0 = no row
    qs_u64 ticket;           // lean check: ring ticket + 1 claimed early by block (0, 0); 0 = none
    qs_u64 reserved;
    qs_f64 y_sum[QS_MAX_PROBES]; // fingerprints (finite pairs)
    qs_f64 x_sum[QS_MAX_PROBES];
};

// One sampled row's estimate, written by the block that finishes its group.
struct QsSketchRow {
    qs_u64 row;    // global row (batch item * M + i)
    qs_f64 cosine; // per-row cosine, -inf when the row has a non-finite value (ranking rule)
    qs_f64 dot, prod_sq, ref_sq;
};

// Split sketch check (eager calls, CUDA sm_90+): qs_sketch_proj_{a}_{d} runs on the caller's
// stream and leaves the projections of the sampled rows in a buffer of its own; then
// qs_sketch_fin_{a}_{d}, on a side stream, finishes them into the ring exactly as the lean check
// would (same sums in the same order). The caller's stream pays for the projections only. Buffer
// (split_ptr): this header, QsSplitRow rows[groups * 32], then f32 partials[groups][8 splits]
// [2: A W_R, D R][32 rows][kp]. The projections' own status bits and D counts go into the header
// (their launch's status_ptr and totals_ptr point there); the finishing folds them into the
// check's and leaves them zero for the buffer's next use.
struct QsSplitHeader {
    QsSketchTotals totals;  // elem_nonfinite only
    qs_u64 status;          // QS_STATUS_* bits (low word)
    qs_f64 scalar[5];       // alpha, a tensor scale, b tensor scale, beta, d_scale
    qs_u64 reserved[2];
};

// A sampled row of a split check: its global row (~0: not checked) and row-axis bias.
struct QsSplitRow {
    qs_u64 row;
    qs_f64 rowbias;
};

struct QsComparePartial {
    QsSums sums;
    QsWorst worst;
    qs_u64 logits_rows, top1_agree, topk_hits, kl_nonfinite_rows;
    qs_f64 kl_sum, kl_max;
    qs_u64 kl_max_t;
    qs_u64 reserved;
};

struct QsLogitsRow {
    qs_f64 kl;
    qs_u32 top1;
    qs_u32 hits;
    qs_u32 prod_idx[QS_MAX_TOPK];
    qs_f32 prod_val[QS_MAX_TOPK];
    qs_u32 ref_idx[QS_MAX_TOPK];
    qs_f32 ref_val[QS_MAX_TOPK];
};

// ---------------------------------------------------------------------------------------------
// Layout pins (abi.rs asserts the same numbers)
// ---------------------------------------------------------------------------------------------
// Sizes are asserted everywhere. Field offsets need __builtin_offsetof in a constant
// expression, which NVRTC 13.5 accepts and NVRTC 13.0 does not: they are asserted when
// QS_CHECK_LAYOUT is defined (kernels/check_compile.py does), the runtime's compile skips them.
static_assert(sizeof(QsMatrixDesc) == 48, "QsMatrixDesc");
static_assert(sizeof(QsScaleDesc) == 64, "QsScaleDesc");
static_assert(sizeof(QsScalar) == 24, "QsScalar");
static_assert(sizeof(QsBiasDesc) == 24, "QsBiasDesc");
static_assert(sizeof(QsGemmDesc) == 512, "QsGemmDesc");
static_assert(sizeof(QsRowSel) == 72, "QsRowSel");
static_assert(sizeof(QsRingHeader) == 64, "QsRingHeader");
static_assert(sizeof(QsRingCtl) == 24, "QsRingCtl");
static_assert(sizeof(QsRingDesc) == 32, "QsRingDesc");
static_assert(sizeof(QsResultSlot) == 1152, "QsResultSlot");
static_assert(sizeof(QsRefParams) == 632, "QsRefParams");
static_assert(sizeof(QsPrepParams) == 96, "QsPrepParams");
static_assert(sizeof(QsWprojParams) == 184, "QsWprojParams");
static_assert(sizeof(QsSketchParams) == 784, "QsSketchParams");
static_assert(sizeof(QsSplitHeader) == 704, "QsSplitHeader");
static_assert(sizeof(QsSplitRow) == 16, "QsSplitRow");
static_assert(sizeof(QsSnapHeader) == 64, "QsSnapHeader");
static_assert(sizeof(QsSnapParams) == 672, "QsSnapParams");
static_assert(sizeof(QsSnapAllParams) == 160, "QsSnapAllParams");
static_assert(sizeof(QsCompareParams) == 272, "QsCompareParams");
static_assert(sizeof(QsSelftestParams) == 152, "QsSelftestParams");
static_assert(sizeof(QsSums) == 88, "QsSums");
static_assert(sizeof(QsWorst) == 48, "QsWorst");
static_assert(sizeof(QsSketchTotals) == 640, "QsSketchTotals");
static_assert(sizeof(QsSketchRow) == 40, "QsSketchRow");
static_assert(sizeof(QsComparePartial) == 200, "QsComparePartial");
static_assert(sizeof(QsLogitsRow) == 272, "QsLogitsRow");
#if defined(QS_CHECK_LAYOUT)
#define QS_OFF(T, f) __builtin_offsetof(T, f)
static_assert(QS_OFF(QsGemmDesc, a) == 32 && QS_OFF(QsGemmDesc, d) == 176, "QsGemmDesc matrices");
static_assert(QS_OFF(QsGemmDesc, a_scale) == 224 && QS_OFF(QsGemmDesc, alpha) == 352, "QsGemmDesc scales");
static_assert(QS_OFF(QsGemmDesc, d_scale) == 448 && QS_OFF(QsGemmDesc, bias) == 472, "QsGemmDesc tail");
static_assert(QS_OFF(QsGemmDesc, activation) == 496, "QsGemmDesc activation");
static_assert(QS_OFF(QsRingHeader, consumed) == 16 && QS_OFF(QsRingHeader, dropped) == 24, "QsRingHeader");
static_assert(QS_OFF(QsResultSlot, kind) == 40 && QS_OFF(QsResultSlot, rows_checked) == 56, "slot head");
static_assert(QS_OFF(QsResultSlot, dot) == 64 && QS_OFF(QsResultSlot, inf_ref) == 144, "slot sums");
static_assert(QS_OFF(QsResultSlot, worst_row) == 152 && QS_OFF(QsResultSlot, elem_nan_prod) == 192, "slot worst");
static_assert(QS_OFF(QsResultSlot, logits_rows) == 208 && QS_OFF(QsResultSlot, kl_max_row) == 256, "slot logits");
static_assert(QS_OFF(QsResultSlot, prod_top_idx) == 264 && QS_OFF(QsResultSlot, ref_top_val) == 456, "slot tops");
static_assert(QS_OFF(QsResultSlot, sketch_prod) == 520 && QS_OFF(QsResultSlot, sketch_ref) == 776, "slot sketch");
static_assert(QS_OFF(QsResultSlot, reserved) == 1032, "slot reserved");
static_assert(QS_OFF(QsRefParams, rows) == 512 && QS_OFF(QsRefParams, out_ptr) == 584, "QsRefParams");
static_assert(QS_OFF(QsPrepParams, bias) == 64 && QS_OFF(QsPrepParams, k) == 88, "QsPrepParams");
static_assert(QS_OFF(QsWprojParams, k_dim) == 112 && QS_OFF(QsWprojParams, kp) == 160, "QsWprojParams");
static_assert(QS_OFF(QsSnapAllParams, epoch) == 72 && QS_OFF(QsSnapAllParams, scalar_bits) == 128, "QsSnapAllParams");
static_assert(QS_OFF(QsSnapAllParams, rows) == 148 && QS_OFF(QsSnapAllParams, d_bytes) == 156, "QsSnapAllParams");
static_assert(QS_OFF(QsSketchParams, ring) == 584 && QS_OFF(QsSketchParams, tag) == 616, "QsSketchParams");
static_assert(QS_OFF(QsSplitHeader, status) == 640 && QS_OFF(QsSplitHeader, scalar) == 648, "QsSplitHeader");
static_assert(QS_OFF(QsSketchParams, row_stats_ptr) == 712 && QS_OFF(QsSketchParams, k) == 720, "QsSketchParams");
static_assert(QS_OFF(QsCompareParams, rows) == 48 && QS_OFF(QsCompareParams, ring) == 120, "QsCompareParams");
static_assert(QS_OFF(QsCompareParams, m) == 168 && QS_OFF(QsCompareParams, kind) == 240, "QsCompareParams");
static_assert(QS_OFF(QsCompareParams, block_per_row) == 248, "QsCompareParams");
static_assert(QS_OFF(QsSelftestParams, scale) == 80 && QS_OFF(QsSelftestParams, format) == 144, "QsSelftestParams");
#endif

// ---------------------------------------------------------------------------------------------
// Fault injection (kernels/qs_inject.cu, runtime/src/inject, abi.rs QsInjectParams): off unless
// QUANTSHADOW_INJECT asks for it. Appended apart from the checking ABI above.
// ---------------------------------------------------------------------------------------------

// QsInjectParams::op
#define QS_INJECT_GARBAGE 1u         /* D: hash noise with each row's RMS */
#define QS_INJECT_HALF 2u            /* D: 0.5x (fn-as-fnuz) */
#define QS_INJECT_TILE_ROWS 3u       /* D: row i = row i - 1 for i % period == offset, M >= min_m */
#define QS_INJECT_NAN 4u             /* D: one NaN at hash3(seed, STREAM_NAN, 0) mod (batch M N) */
#define QS_INJECT_ZERO 5u            /* D: every element code 0 */
#define QS_INJECT_SCALE_TRANSPOSE 6u /* scales: dst[dst entry (o,i)] = src[src entry (o,i)] */
#define QS_INJECT_SCALE_FILL 7u      /* scales: dst[dst entry (o,i)] = fill_code */

#define QS_INJECT_STREAM_GARBAGE 0x47524142ull
#define QS_INJECT_STREAM_NAN 0x004E414Eull

// One injection launch. Output ops use d, m, n, batch, seed and the tile fields; scale ops use
// src, dst (same format, grid and block shape; storage / ld may differ) and scale_items.
struct QsInjectParams {
    QsMatrixDesc d;
    QsScaleDesc src;
    QsScaleDesc dst;
    qs_u64 m, n, batch;
    qs_u64 seed;
    qs_u64 scale_items; // batch items of the scale grid (1 when its batch stride is 0)
    qs_u64 status_ptr;  // u32 status word (QS_STATUS_*), 0 = none
    qs_u32 op;
    qs_u32 tile_period;
    qs_u32 tile_offset;
    qs_u32 tile_min_m;
    qs_u32 fill_code; // scale code of 1.0
    qs_u32 reserved;
};
static_assert(sizeof(QsInjectParams) == 248, "QsInjectParams");
#if defined(QS_CHECK_LAYOUT)
static_assert(__builtin_offsetof(QsInjectParams, src) == 48 && __builtin_offsetof(QsInjectParams, dst) == 112, "QsInjectParams scales");
static_assert(__builtin_offsetof(QsInjectParams, m) == 176 && __builtin_offsetof(QsInjectParams, op) == 224, "QsInjectParams tail");
#endif

// One launch of qs_inject_permute (no-transpose: an operand rewritten so that the library,
// reading the declared layout, computes the call with that operand's transpose flipped). For
// every batch item b and logical element (x, y) of op(X), x < outer, y < inner:
//   dst[b * dst_batch_stride + x * dst_outer_stride + y * dst_inner_stride] =
//   src[b * src_batch_stride + x * src_outer_stride + y * src_inner_stride]
// in elements of elem_bytes bytes (1, 2 or 4). An offset at or past its side's extent is not
// touched (QS_STATUS_OUT_OF_BOUNDS).
struct QsPermuteParams {
    qs_u64 src_ptr, dst_ptr;
    qs_u64 batch, outer, inner;
    qs_u64 src_batch_stride, src_outer_stride, src_inner_stride;
    qs_u64 dst_batch_stride, dst_outer_stride, dst_inner_stride;
    qs_u64 src_extent, dst_extent; // elements each side holds
    qs_u64 status_ptr;             // u32 status word (QS_STATUS_*), 0 = none
    qs_u32 elem_bytes;
    qs_u32 reserved;
};
static_assert(sizeof(QsPermuteParams) == 120, "QsPermuteParams");
#if defined(QS_CHECK_LAYOUT)
static_assert(__builtin_offsetof(QsPermuteParams, outer) == 24 && __builtin_offsetof(QsPermuteParams, src_extent) == 88, "QsPermuteParams extents");
static_assert(__builtin_offsetof(QsPermuteParams, elem_bytes) == 112, "QsPermuteParams tail");
#endif
