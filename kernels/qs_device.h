// Helpers shared by every kernel: operand addressing, scale lookup (the device copy of
// problem.rs ScaleSpec::entry_for_element), scalars, row selection, the epilogue, the metric
// sums (metrics.rs MetricSums), the last-block-done pattern and the result ring.
#pragma once
#include "qs_portability.h"
#include "qs_formats.h"
#include "qs_rng.h"
#include "qs_abi.h"

// ---- status -----------------------------------------------------------------------------------
QS_DEVICE void qs_flag(qs_u64 status_ptr, qs_u32 bits) {
    if (status_ptr) qs_atomic_or_u32((qs_u32*)status_ptr, bits);
}

// ---- scalars ----------------------------------------------------------------------------------
QS_DEVICE double qs_read_scalar(const QsScalar& s) {
    if (!s.on_device || !s.ptr) return s.value;
    return qs_load_f64_rt(s.format, (const qs_u8*)s.ptr, 0);
}

// ---- operand addressing -------------------------------------------------------------------------
// Strides of op(X)(r, c) in elements: (row stride, column stride) from order and transpose.
struct QsOpStrides {
    qs_u64 rs, cs;
};
QS_DEVICE QsOpStrides qs_op_strides(const QsMatrixDesc& m) {
    const bool row_major = m.order == QS_ORDER_ROW;
    const bool t = m.trans == QS_TRANS_T;
    QsOpStrides s;
    // (ROW, N) and (COL, T): op rows are contiguous; (ROW, T) and (COL, N): op columns are.
    if (row_major != t) {
        s.rs = m.ld;
        s.cs = 1;
    } else {
        s.rs = 1;
        s.cs = m.ld;
    }
    return s;
}

// ---- scales -------------------------------------------------------------------------------------
struct QsScaleLookup {
    const qs_u8* ptr;
    qs_u64 ld, batch_stride, extent;
    QsFastDiv bo, bi;
    qs_u32 format, storage, inner_tiles, present;
};

QS_DEVICE QsScaleLookup qs_scale_lookup(const QsScaleDesc& d) {
    QsScaleLookup s;
    s.ptr = (const qs_u8*)d.ptr;
    s.present = d.ptr != 0;
    s.ld = d.ld;
    s.batch_stride = d.batch_stride;
    s.extent = d.extent;
    s.bo = qs_fastdiv_make(d.block_outer);
    s.bi = qs_fastdiv_make(d.block_inner);
    s.format = d.format;
    s.storage = d.storage;
    s.inner_tiles = (d.grid_inner + 3u) / 4u;
    return s;
}

// problem.rs ScaleSpec::entry_index.
QS_DEVICE qs_u64 qs_scale_entry_index(const QsScaleLookup& s, qs_u64 ob, qs_u64 ib) {
    switch (s.storage) {
        case QS_SCALE_INNER_MAJOR: return ib * s.ld + ob;
        case QS_SCALE_SWIZZLED_128X4: {
            qs_u64 tile = (ob / 128) * s.inner_tiles + ib / 4;
            return tile * 512 + (ob % 32) * 16 + (ob % 128) / 32 * 4 + ib % 4;
        }
        default: return ob * s.ld + ib;
    }
}

// Entry of element (outer, inner) of batch item `b` (problem.rs entry_for_element).
QS_DEVICE qs_u64 qs_scale_entry(const QsScaleLookup& s, qs_u64 b, qs_u64 outer, qs_u64 inner) {
    return b * s.batch_stride + qs_scale_entry_index(s, qs_fastdiv(outer, s.bo), qs_fastdiv(inner, s.bi));
}

// Raw code of the scale entry (bounds-checked: out of range reads as NaN's code is not
// portable across formats, so it reads as a flagged 0 code and the caller's check is void).
QS_DEVICE qs_u32 qs_scale_code(const QsScaleLookup& s, qs_u64 entry, qs_u64 status_ptr) {
    if (entry >= s.extent) {
        qs_flag(status_ptr, QS_STATUS_OUT_OF_BOUNDS);
        return 0;
    }
    return qs_load_code_rt(s.format, s.ptr, entry);
}

// Scale formats problem.rs validate() admits; anything else is a bad descriptor. A short switch
// keeps the hot loaders small.
QS_DEVICE bool qs_scale_format_ok(qs_u32 fmt) {
    return fmt == QS_FMT_F32 || fmt == QS_FMT_F16 || fmt == QS_FMT_BF16 || fmt == QS_FMT_UE8M0 || fmt == QS_FMT_UE4M3;
}
QS_DEVICE float qs_decode_scale(qs_u32 fmt, qs_u32 code) {
    switch (fmt) {
        case QS_FMT_F32: return QsFmt<QS_FMT_F32>::f32(code);
        case QS_FMT_F16: return QsFmt<QS_FMT_F16>::f32(code);
        case QS_FMT_BF16: return QsFmt<QS_FMT_BF16>::f32(code);
        case QS_FMT_UE8M0: return QsFmt<QS_FMT_UE8M0>::f32(code);
        case QS_FMT_UE4M3: return QsFmt<QS_FMT_UE4M3>::f32(code);
        default: return qs_nanf();
    }
}

// entry_index(ob, ib) = row_part(ob) + inner_part(ib) for every storage: the loaders keep
// row_part per row and add inner_part per k.
QS_DEVICE qs_u64 qs_scale_row_part(const QsScaleLookup& s, qs_u64 ob) {
    switch (s.storage) {
        case QS_SCALE_INNER_MAJOR: return ob;
        case QS_SCALE_SWIZZLED_128X4: return (ob / 128) * s.inner_tiles * 512 + (ob % 32) * 16 + (ob % 128) / 32 * 4;
        default: return ob * s.ld;
    }
}
QS_DEVICE qs_u64 qs_scale_inner_part(qs_u32 storage, qs_u64 ld, qs_u64 ib) {
    switch (storage) {
        case QS_SCALE_INNER_MAJOR: return ib * ld;
        case QS_SCALE_SWIZZLED_128X4: return (ib >> 2) * 512 + (ib & 3);
        default: return ib;
    }
}

QS_DEVICE float qs_scale_value(const QsScaleLookup& s, qs_u64 b, qs_u64 outer, qs_u64 inner, qs_u64 status_ptr) {
    if (!s.present) return 1.0f;
    return qs_decode_scale(s.format, qs_scale_code(s, qs_scale_entry(s, b, outer, inner), status_ptr));
}

// ---- row selection ------------------------------------------------------------------------------
QS_DEVICE qs_u64 qs_rows_epoch(const QsRowSel& r) {
    if (r.mode == QS_ROWS_PERM && r.epoch_ptr) return qs_load_volatile_u64((const qs_u64*)r.epoch_ptr);
    return r.epoch_value;
}

// Global row of sample position t; returns false (and flags) when the selection points past
// total_rows, which only a corrupt descriptor or list can do.
QS_DEVICE bool qs_rows_at(const QsRowSel& r, qs_u64 epoch, qs_u64 t, qs_u64* row, qs_u64 status_ptr) {
    qs_u64 v;
    switch (r.mode) {
        case QS_ROWS_LIST: v = ((const qs_u64*)r.list_ptr)[t]; break;
        case QS_ROWS_PERM: v = qs_perm_row(r.perm_a, r.perm_b, r.total_rows, r.stride, epoch, t); break;
        case QS_ROWS_WINDOW: v = qs_window_row(r.perm_a, r.perm_b, r.total_rows, r.stride, t); break;
        default: v = t; break;
    }
    if (v >= r.total_rows) {
        qs_flag(status_ptr, QS_STATUS_OUT_OF_BOUNDS);
        return false;
    }
    *row = v;
    return true;
}

// The launch that ends a check moves the per-site epoch on (called by its last block).
QS_DEVICE void qs_rows_advance(const QsRowSel& r) {
    if (r.advance_epoch && r.mode == QS_ROWS_PERM && r.epoch_ptr) {
        qs_u64* p = (qs_u64*)r.epoch_ptr;
        qs_store_volatile_u64(p, qs_load_volatile_u64(p) + 1);
    }
}

// ---- epilogue -----------------------------------------------------------------------------------
// NaN propagates through ReLU (a checker must never turn a NaN into a pass).
QS_DEVICE double qs_activation(qs_u32 act, double t) {
    switch (act) {
        case QS_ACT_RELU: return t > 0.0 ? t : (qs_isnan(t) ? t : 0.0);
        case QS_ACT_GELU_TANH: {
            const double c = 0.7978845608028654;  // sqrt(2 / pi)
            return 0.5 * t * (1.0 + tanh(c * (t + 0.044715 * t * t * t)));
        }
        default: return t;
    }
}

// Element of C (or D) of row i, column j of batch item b, with C's own layout and format.
QS_DEVICE qs_u64 qs_out_offset(const QsMatrixDesc& m, qs_u64 b, qs_u64 i, qs_u64 j) {
    return b * m.batch_stride + (m.order == QS_ORDER_ROW ? i * m.ld + j : j * m.ld + i);
}

QS_DEVICE double qs_load_checked_rt(const QsMatrixDesc& m, qs_u64 off, qs_u64 status_ptr) {
    if (off >= m.extent) {
        qs_flag(status_ptr, QS_STATUS_OUT_OF_BOUNDS);
        return 0.0;
    }
    return qs_load_f64_rt(m.format, (const qs_u8*)m.ptr, off);
}

QS_DEVICE double qs_bias_value(const QsBiasDesc& b, qs_u64 idx, qs_u64 status_ptr) {
    if (!b.ptr) return 0.0;
    if (idx >= b.extent) {
        qs_flag(status_ptr, QS_STATUS_OUT_OF_BOUNDS);
        return 0.0;
    }
    return qs_load_f64_rt(b.format, (const qs_u8*)b.ptr, idx);
}

// ---- metric sums (metrics.rs MetricSums::add / merge, field for field) -----------------------
QS_DEVICE void qs_sums_zero(QsSums& s) {
    s.dot = s.prod_sq = s.ref_sq = s.diff_sq = s.max_abs_err = 0.0;
    s.finite = s.pairs = s.nan_prod = s.inf_prod = s.nan_ref = s.inf_ref = 0;
}
QS_DEVICE void qs_sums_add(QsSums& s, double p, double r) {
    s.pairs += 1;
    s.nan_prod += qs_isnan(p);
    s.inf_prod += qs_isinf(p);
    s.nan_ref += qs_isnan(r);
    s.inf_ref += qs_isinf(r);
    if (!(qs_isfinite(p) && qs_isfinite(r))) return;
    double d = p - r;
    s.dot += p * r;
    s.prod_sq += p * p;
    s.ref_sq += r * r;
    s.diff_sq += d * d;
    s.max_abs_err = qs_fmax(s.max_abs_err, d < 0 ? -d : d);
    s.finite += 1;
}
QS_DEVICE void qs_sums_merge(QsSums& s, const QsSums& o) {
    s.dot += o.dot;
    s.prod_sq += o.prod_sq;
    s.ref_sq += o.ref_sq;
    s.diff_sq += o.diff_sq;
    s.max_abs_err = qs_fmax(s.max_abs_err, o.max_abs_err);
    s.finite += o.finite;
    s.pairs += o.pairs;
    s.nan_prod += o.nan_prod;
    s.inf_prod += o.inf_prod;
    s.nan_ref += o.nan_ref;
    s.inf_ref += o.inf_ref;
}
// Sum of a per-lane QsSums over the warp (every lane gets the total).
QS_DEVICE void qs_sums_warp_reduce(QsSums& s) {
    s.dot = qs_warp_sum(s.dot);
    s.prod_sq = qs_warp_sum(s.prod_sq);
    s.ref_sq = qs_warp_sum(s.ref_sq);
    s.diff_sq = qs_warp_sum(s.diff_sq);
    s.max_abs_err = qs_warp_max(s.max_abs_err);
    s.finite = qs_warp_sum_u64(s.finite);
    s.pairs = qs_warp_sum_u64(s.pairs);
    s.nan_prod = qs_warp_sum_u64(s.nan_prod);
    s.inf_prod = qs_warp_sum_u64(s.inf_prod);
    s.nan_ref = qs_warp_sum_u64(s.nan_ref);
    s.inf_ref = qs_warp_sum_u64(s.inf_ref);
}

// metrics.rs MetricSums::cosine.
QS_DEVICE double qs_cosine(double dot, double pp, double rr) {
    double np = sqrt(pp), nr = sqrt(rr);
    bool zp = np == 0.0, zr = nr == 0.0;
    if (zp && zr) return 1.0;
    if (zp || zr) return 0.0;
    double c = dot / (np * nr);
    return c < -1.0 ? -1.0 : (c > 1.0 ? 1.0 : c);
}

// Per-row cosine with compare_matrix's rule: any non-finite value in the row ranks it worst.
QS_DEVICE double qs_row_rank_cosine(const QsSums& s) {
    if (s.nan_prod + s.inf_prod + s.nan_ref + s.inf_ref > 0) return -qs_inf();
    return qs_cosine(s.dot, s.prod_sq, s.ref_sq);
}

QS_DEVICE void qs_worst_none(QsWorst& w) {
    w.t = ~0ull;
    w.row = ~0ull;
    w.cosine = qs_inf();
    w.dot = w.prod_sq = w.ref_sq = 0.0;
}
// compare_matrix keeps the first row with a strictly lower cosine: lower sample position
// wins ties, so the result does not depend on which block finished first.
QS_DEVICE bool qs_worse(double cos_a, qs_u64 t_a, const QsWorst& w) {
    return cos_a < w.cosine || (cos_a == w.cosine && t_a < w.t);
}
QS_DEVICE void qs_worst_merge(QsWorst& w, const QsWorst& o) {
    if (o.t != ~0ull && qs_worse(o.cosine, o.t, w)) w = o;
}

// ---- reads of other blocks' scratch (after the last-block-done handshake) --------------------
template <class T>
QS_DEVICE void qs_ldcg_copy(T* dst, const T* src) {
    static_assert(sizeof(T) % 8 == 0, "8-byte records");
    const qs_u64* s = (const qs_u64*)src;
    qs_u64* d = (qs_u64*)dst;
#pragma unroll
    for (unsigned w = 0; w < sizeof(T) / 8; ++w) d[w] = qs_ldcg_u64(s + w);
}

// Deterministic warp merges (xor butterfly: lane 0's result depends only on the inputs).
QS_DEVICE void qs_worst_warp_reduce(QsWorst& w) {
#pragma unroll
    for (int m = QS_WARP_SIZE / 2; m > 0; m >>= 1) {
        QsWorst o;
        o.t = (qs_u64)QS_SHFL_XOR((long long)w.t, m);
        o.row = (qs_u64)QS_SHFL_XOR((long long)w.row, m);
        o.cosine = QS_SHFL_XOR(w.cosine, m);
        o.dot = QS_SHFL_XOR(w.dot, m);
        o.prod_sq = QS_SHFL_XOR(w.prod_sq, m);
        o.ref_sq = QS_SHFL_XOR(w.ref_sq, m);
        qs_worst_merge(w, o);
    }
}

// ---- last block done ----------------------------------------------------------------------------
// The block's threads meet at a barrier, then one thread fences and adds one to the counter (the
// grid-barrier pattern of cooperative groups: the barrier orders every thread's scratch writes
// before that thread's fence). The block that sees `expected - 1` is the last, resets the counter
// for the next launch (graph replays reuse it), fences once more and may read everyone's scratch
// (with L2-coherent loads). One fence per block instead of one per warp: ncu on an H100 put ~6% of
// a 256-row sketch check's stall samples on those fences. Must be called by all threads.
QS_DEVICE bool qs_last_block(qs_u32* counter, qs_u32 expected) {
    __shared__ int qs_is_last;
    __syncthreads();
    if (threadIdx.x == 0) {
        qs_fence_device();
        qs_u32 prev = qs_atomic_add_u32(counter, 1u);
        qs_is_last = prev + 1u == expected;
        if (qs_is_last) {
            *(volatile qs_u32*)counter = 0u;
            qs_fence_device();
        }
    }
    __syncthreads();
    return qs_is_last != 0;
}

// ---- device-side sampling gate --------------------------------------------------------------------
// Whether this launch is sampled (graph replays decide per replay, not at capture): every block
// adds one to the u64 launch counter at gate_ptr, so launch L's blocks read values in
// [L * blocks, (L + 1) * blocks) and agree on L (launches of one counter are stream-ordered).
// Launch L is taken when L < first or (every != 0 and (L - first) % every == 0). Block-uniform;
// all threads call it; a block not taken returns before any other work.
QS_DEVICE bool qs_gate_take(qs_u64 gate_ptr, qs_u32 first, qs_u32 every) {
    if (!gate_ptr) return true;
    __shared__ int qs_gate_taken;
    if (threadIdx.x == 0) {
        const qs_u64 blocks = (qs_u64)gridDim.x * gridDim.y * gridDim.z;
        const qs_u64 t = qs_atomic_add_u64((qs_u64*)gate_ptr, 1) / blocks;
        qs_gate_taken = t < first || (every != 0 && (t - first) % every == 0);
    }
    __syncthreads();
    return qs_gate_taken != 0;
}

// ---- result ring --------------------------------------------------------------------------------
// Claims a ticket: fails (and counts a drop) when the host has not consumed `capacity` results.
// Far from full (head - consumed + QS_RING_CLAIM_MARGIN < capacity), one atomic add: a claim never
// retries, so many checks finishing at once do not queue on a compare-and-swap (an H100 decode
// graph's 48 end-of-replay checks spent 3-20 us each in that loop, median 7-8 us, exp75). The
// margin bounds the tickets others can take between this claim's test and its add (a few
// microseconds): each launch claims once, at most 128 grids are resident on current CUDA
// devices, and launches cannot turn over 1024 times in that window. Should it ever be
// exceeded, the host poller counts an overwritten result as lost where it can tell (gpu.rs
// `lapped`; not when the older result lands last). Near full (or a ring too small for the margin), the compare-and-swap loop,
// which never takes a ticket the host has not freed. The host's `consumed` is read across the
// bus (microseconds) only where the device's copy of it says the ring is near full.
#define QS_RING_CLAIM_MARGIN 1024
QS_DEVICE bool qs_ring_claim(const QsRingDesc& r, qs_u64* ticket) {
    QsRingCtl* ctl = (QsRingCtl*)r.ctl_ptr;
    QsRingHeader* hdr = (QsRingHeader*)r.header_ptr;
    if (!ctl || !hdr || !r.slots_ptr || r.capacity == 0) return false;
    qs_u64 seen = qs_load_volatile_u64(&ctl->consumed_seen);
    if (r.capacity >= 2 * QS_RING_CLAIM_MARGIN) {
        const qs_u64 head = qs_load_volatile_u64(&ctl->head);
        if (head - seen + QS_RING_CLAIM_MARGIN >= (qs_u64)r.capacity) {
            const qs_u64 now = qs_load_volatile_u64(&hdr->consumed);
            if (now > seen) {
                seen = now;
                qs_red_max_u64(&ctl->consumed_seen, now);
            }
        }
        if (head - seen + QS_RING_CLAIM_MARGIN < (qs_u64)r.capacity) {
            *ticket = qs_atomic_add_u64(&ctl->head, 1);
            return true;
        }
    }
#pragma unroll 1
    for (int attempt = 0; attempt < 1024; ++attempt) {
        const qs_u64 head = qs_load_volatile_u64(&ctl->head);
        if (head - seen >= (qs_u64)r.capacity) {
            const qs_u64 now = qs_load_volatile_u64(&hdr->consumed);
            if (now <= seen || head - now >= (qs_u64)r.capacity) break;
            seen = now;
            qs_red_max_u64(&ctl->consumed_seen, now);
        }
        if (qs_atomic_cas_u64(&ctl->head, head, head + 1) == head) {
            *ticket = head;
            return true;
        }
    }
    qs_u64 dropped = qs_atomic_add_u64(&ctl->dropped, 1) + 1;
    qs_store_volatile_u64(&hdr->dropped, dropped);
    return false;
}

// Hash of word i of a result slot (runtime/src/device/abi.rs slot_word_hash); `check` is the
// XOR of it over every word but `check` itself.
#define QS_SLOT_CHECK_SEED 0x51534C4F54434B31ull /* "QSLOTCK1" */
QS_DEVICE qs_u64 qs_slot_word_hash(qs_u64 i, qs_u64 w) { return qs_hash3(QS_SLOT_CHECK_SEED, i, w); }

// Writes `slot` (assembled in shared memory by the caller) into the ring under a ticket claimed
// earlier (`claimed` false: the ring was full, the drop is counted). All threads of the block
// call it after a barrier that follows the claim. One warp copies the slot to (mapped host)
// memory together with its hash, and nothing waits for the writes to arrive: the poller takes
// the slot once what it reads hashes to `check` (QsResultSlot). The two system-scope fences
// this replaces, with the host read of the claim, cost ~0.7 us more per check on an H100
// (tests/gpu/publish_latency.cu).
QS_DEVICE void qs_ring_write(const QsRingDesc& r, QsResultSlot* slot, bool claimed, qs_u64 ticket) {
    if (!claimed || threadIdx.x >= QS_WARP_SIZE) return;
    QsResultSlot* dst = (QsResultSlot*)r.slots_ptr + (ticket % r.capacity);
    const qs_u64* src = (const qs_u64*)slot;
    qs_u64* out = (qs_u64*)dst;
    constexpr unsigned WORDS = sizeof(QsResultSlot) / 8, CHECK = WORDS - 1;
    qs_u64 h = 0;
    for (unsigned w = threadIdx.x; w < CHECK; w += QS_WARP_SIZE) {
        const qs_u64 v = w == 0 ? ticket + 1 : w == 1 ? ticket : src[w];  // ready, ticket
        out[w] = v;
        h ^= qs_slot_word_hash(w, v);
    }
#pragma unroll
    for (int m = QS_WARP_SIZE / 2; m > 0; m >>= 1) h ^= QS_SHFL_XOR(h, m);
    if (threadIdx.x == 0) out[CHECK] = h;
}

// Claim and write in one (callers with nothing to overlap the claim with).
QS_DEVICE void qs_ring_publish(const QsRingDesc& r, QsResultSlot* slot) {
    __shared__ qs_u64 qs_ticket;
    __shared__ int qs_claimed;
    if (threadIdx.x == 0) {
        qs_u64 t = 0;
        qs_claimed = qs_ring_claim(r, &t);
        qs_ticket = t;
    }
    __syncthreads();
    qs_ring_write(r, slot, qs_claimed != 0, qs_ticket);
}

// Zeroes a slot in shared memory and fills its common head.
QS_DEVICE void qs_slot_init(QsResultSlot* s, qs_u64 tag, qs_u64 tag2, qs_u32 kind) {
    qs_u64* w = (qs_u64*)s;
    for (unsigned i = threadIdx.x; i < sizeof(QsResultSlot) / 8; i += blockDim.x) w[i] = 0;
    __syncthreads();
    if (threadIdx.x == 0) {
        s->tag = tag;
        s->tag2 = tag2;
        s->kind = kind;
        s->worst_row = ~0ull;
        s->kl_max_row = ~0ull;
    }
    __syncthreads();
}

QS_DEVICE void qs_slot_put_sums(QsResultSlot* s, const QsSums& m) {
    s->dot = m.dot;
    s->prod_sq = m.prod_sq;
    s->ref_sq = m.ref_sq;
    s->diff_sq = m.diff_sq;
    s->max_abs_err = m.max_abs_err;
    s->finite = m.finite;
    s->pairs = m.pairs;
    s->nan_prod = m.nan_prod;
    s->inf_prod = m.inf_prod;
    s->nan_ref = m.nan_ref;
    s->inf_ref = m.inf_ref;
}

QS_DEVICE void qs_slot_put_worst(QsResultSlot* s, const QsWorst& w) {
    if (w.t == ~0ull) return;
    s->worst_row = w.row;
    s->worst_cosine = w.cosine < -1.0 ? -1.0 : w.cosine;
    s->worst_dot = w.dot;
    s->worst_prod_sq = w.prod_sq;
    s->worst_ref_sq = w.ref_sq;
}

// Folds the check's status word (written by earlier kernels of the check) into the slot and
// clears it for the next call.
QS_DEVICE qs_u32 qs_take_status(qs_u64 status_ptr) {
    if (!status_ptr) return 0;
    qs_u32* p = (qs_u32*)status_ptr;
    qs_u32 v = qs_load_volatile_u32(p);
    *(volatile qs_u32*)p = 0u;
    return v;
}

// ---- row streaming ------------------------------------------------------------------------------
// Calls f(j, value) for the elements j in [j0, j1) of one row owned by `lane` of `lanes`,
// where element j sits at element offset first + j * stride of `base`. Contiguous rows take
// 16-byte vector loads for their aligned middle part; the rest (unaligned head and tail,
// strided rows) goes through one scalar loop. Elements at or past `extent` read as 0 and flag
// the check. The callback is instantiated twice (vector word, scalar), which keeps NVRTC
// times and register pressure down; the word loop is deliberately not unrolled.
// T is float (qs_load_f32 decode) or double (qs_load_f64: exact for I32 outputs).
template <int FMT, class T>
QS_DEVICE T qs_decode_as(qs_u32 code) {
    if constexpr (sizeof(T) == 8) return QsFmt<FMT>::f64(code);
    else return QsFmt<FMT>::f32(code);
}

template <int FMT, class T, class F>
QS_DEVICE void qs_stream_row_t(const qs_u8* base, qs_u64 first, qs_u64 stride, qs_u64 j0, qs_u64 j1, qs_u64 extent,
                               qs_u64 status_ptr, unsigned lane, unsigned lanes, F&& f) {
    if (j0 >= j1) return;
    constexpr int BITS = QsFmt<FMT>::BITS;
    constexpr int V = 128 / BITS;  // elements per 16-byte vector
    constexpr int PER_WORD = 32 / BITS;
    qs_u64 ja = j1, jb = j1;  // vector part [ja, jb); empty unless contiguous and in bounds
    if (stride == 1 && first + j1 - 1 < extent) {
        // Bit position of element j0 modulo 128; elements are BITS-aligned, so the head is a
        // whole number of elements.
        const qs_u64 addr_bits = ((qs_u64)base * 8 + (first + j0) * BITS) & 127ull;
        qs_u64 head = addr_bits == 0 ? 0 : (128 - addr_bits) / BITS;
        if (head > j1 - j0) head = j1 - j0;
        ja = j0 + head;
        jb = ja + ((j1 - ja) / V) * V;
        const uint4* vbase = (const uint4*)(base + ((first + ja) * BITS) / 8);
        const qs_u64 nvec = (jb - ja) / V;
        for (qs_u64 v = lane; v < nvec; v += lanes) {
            uint4 q = vbase[v];
            qs_u64 j = ja + v * V;
#pragma unroll 1
            for (int w = 0; w < 4; ++w) {
                const qs_u32 word = q.x;
                q.x = q.y;
                q.y = q.z;
                q.z = q.w;
#pragma unroll
                for (int e = 0; e < PER_WORD; ++e) {
                    const qs_u32 code = BITS == 32 ? word : (word >> (e * BITS)) & ((1u << (BITS & 31)) - 1u);
                    f(j + e, qs_decode_as<FMT, T>(code));
                }
                j += PER_WORD;
            }
        }
    }
    // Scalar part: [j0, ja) and [jb, j1) (the whole row when there is no vector part).
    const qs_u64 n_head = ja - j0, n_rest = n_head + (j1 - jb);
    for (qs_u64 u = lane; u < n_rest; u += lanes) {
        const qs_u64 j = u < n_head ? j0 + u : jb + (u - n_head);
        const qs_u64 off = first + j * stride;
        if (off < extent) {
            f(j, qs_decode_as<FMT, T>(qs_load_code_bits<BITS>(base, off)));
        } else {
            qs_flag(status_ptr, QS_STATUS_OUT_OF_BOUNDS);
            f(j, (T)0);
        }
    }
}

template <int FMT, class F>
QS_DEVICE void qs_stream_row(const qs_u8* base, qs_u64 first, qs_u64 stride, qs_u64 j0, qs_u64 j1, qs_u64 extent,
                             qs_u64 status_ptr, unsigned lane, unsigned lanes, F&& f) {
    qs_stream_row_t<FMT, float>(base, first, stride, j0, j1, extent, status_ptr, lane, lanes, f);
}
template <int FMT, class F>
QS_DEVICE void qs_stream_row_f64(const qs_u8* base, qs_u64 first, qs_u64 stride, qs_u64 j0, qs_u64 j1, qs_u64 extent,
                                 qs_u64 status_ptr, unsigned lane, unsigned lanes, F&& f) {
    qs_stream_row_t<FMT, double>(base, first, stride, j0, j1, extent, status_ptr, lane, lanes, f);
}

// ---- format tags for entry names ------------------------------------------------------------
#define QS_CAT_(a, b) a##b
#define QS_CAT(a, b) QS_CAT_(a, b)
#define QS_CAT3(a, b, c) QS_CAT(QS_CAT(a, b), c)
#define QS_CAT5(a, b, c, d, e) QS_CAT(QS_CAT3(a, b, c), QS_CAT(d, e))

#define QS_TAG_0 f32
#define QS_TAG_1 f16
#define QS_TAG_2 bf16
#define QS_TAG_3 e4m3fn
#define QS_TAG_4 e4m3fnuz
#define QS_TAG_5 e5m2
#define QS_TAG_6 e5m2fnuz
#define QS_TAG_7 e2m1
#define QS_TAG_8 int8
#define QS_TAG_9 int4
#define QS_TAG_10 ue8m0
#define QS_TAG_11 ue4m3
#define QS_TAG_12 i32
#define QS_TAG(id) QS_CAT(QS_TAG_, id)
