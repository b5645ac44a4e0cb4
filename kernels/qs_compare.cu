// Comparison of production D with an f32 reference (rows and full modes), result into the
// ring: metrics.rs MetricSums over every (prod, ref) pair of the selected rows, per-row cosine
// and the worst row (compare_matrix rules), NaN/Inf counts on each side, max abs error. The
// logits variant (LM-head rows) adds, per row, KL(ref || prod) of the softmaxes, top-1
// agreement and top-k overlap (metrics.rs compare_logits), one block per row.
//
// D is decoded to double (exact for every format, I32 included); the sums are double. Rows
// stream through 16-byte vector loads where D is row-major and aligned; grid-stride over rows,
// one warp per row (block_per_row = 0, short rows) or one block per row (long rows, logits).
// Finalisation uses the last-block-done pattern: the last block merges the per-block partials
// in block order (deterministic) and publishes the ring slot; no host sync, replay-safe.
//
// Build define: QS_D_FMT. Entries (one QsCompareParams by value, QS_BLOCK threads, any grid):
//   qs_compare_{d}, qs_compare_logits_{d}
#include "qs_device.h"

#if !defined(QS_D_FMT)
#error "qs_compare.cu needs -DQS_D_FMT"
#endif
#ifndef QS_COMPARE_F32_PARTIALS
#define QS_COMPARE_F32_PARTIALS 1
#endif
#ifndef QS_COMPARE_UNROLL
#define QS_COMPARE_UNROLL 0 /* vectors in flight per lane; 0: by element size */
#endif

#define QS_COMPARE QS_CAT(qs_compare_, QS_TAG(QS_D_FMT))
#define QS_COMPARE_LOGITS QS_CAT(qs_compare_logits_, QS_TAG(QS_D_FMT))

struct QsCompareSmem {
    QsSums sums[QS_WARPS_PER_BLOCK];
    QsWorst worst[QS_WARPS_PER_BLOCK];
    double red[QS_WARPS_PER_BLOCK][2];
    qs_i64 key[QS_WARPS_PER_BLOCK];
    qs_u32 idx[QS_WARPS_PER_BLOCK];
    qs_u32 top_idx[2][QS_MAX_TOPK];  // [0] ref, [1] prod
    double top_val[2][QS_MAX_TOPK];
    // Running results of each row owner (lane 0 of a warp, or thread 0 in block mode): kept
    // here rather than in registers, which the streaming loop needs (no spills at 2 blocks/SM).
    QsSums tot[QS_WARPS_PER_BLOCK];
    QsWorst wst[QS_WARPS_PER_BLOCK];
    QsComparePartial part;
    QsComparePartial wpart[QS_WARPS_PER_BLOCK];
    QsResultSlot slot;
};

// Per-lane running sums of one row. Only non-finite pairs take the slow branch; `bad` counts
// them, so finite = pairs - bad with pairs = n, known per row (MetricSums::add semantics).
struct QsRowAcc {
    double dot, pp, rr, dd, mx;
    qs_u32 bad, nan_p, inf_p, nan_r, inf_r;
};
QS_DEVICE void qs_rowacc_zero(QsRowAcc& a) {
    a.dot = a.pp = a.rr = a.dd = a.mx = 0.0;
    a.bad = a.nan_p = a.inf_p = a.nan_r = a.inf_r = 0;
}
QS_DEVICE void qs_rowacc_finite(QsRowAcc& a, double p, double r) {
    const double d = p - r;
    a.dot = fma(p, r, a.dot);
    a.pp = fma(p, p, a.pp);
    a.rr = fma(r, r, a.rr);
    a.dd = fma(d, d, a.dd);
    a.mx = qs_fmax(a.mx, fabs(d));
}
QS_DEVICE void qs_rowacc_add(QsRowAcc& a, double p, double r) {
    if (qs_isfinite(p) && qs_isfinite(r)) {
        qs_rowacc_finite(a, p, r);
    } else {
        a.bad += 1;
        a.nan_p += qs_isnan(p);
        a.inf_p += qs_isinf(p);
        a.nan_r += qs_isnan(r);
        a.inf_r += qs_isinf(r);
    }
}
// Element of D by code: decode to f32 (exact) and test finiteness on 32 bits; I32 is exact only
// in double and always finite.
template <int DF>
QS_DEVICE void qs_rowacc_add_code(QsRowAcc& a, qs_u32 code, float r) {
    if constexpr (DF == QS_FMT_I32) {
        if (qs_isfinitef(r)) qs_rowacc_finite(a, (double)(qs_i32)code, (double)r);
        else qs_rowacc_add(a, (double)(qs_i32)code, (double)r);
    } else {
        const float p = QsFmt<DF>::f32(code);
        if (qs_isfinitef(p) && qs_isfinitef(r)) qs_rowacc_finite(a, (double)p, (double)r);
        else qs_rowacc_add(a, (double)p, (double)r);
    }
}
// As QsSums before the row reduction: pairs are set by the row owner afterwards, `finite`
// carries the bad count through the reduction.
QS_DEVICE QsSums qs_rowacc_sums(const QsRowAcc& a) {
    QsSums s;
    s.dot = a.dot;
    s.prod_sq = a.pp;
    s.ref_sq = a.rr;
    s.diff_sq = a.dd;
    s.max_abs_err = a.mx;
    s.finite = a.bad;
    s.pairs = 0;
    s.nan_prod = a.nan_p;
    s.inf_prod = a.inf_p;
    s.nan_ref = a.nan_r;
    s.inf_ref = a.inf_r;
    return s;
}

// One contiguous, 16-byte aligned row of D against a 16-byte aligned f32 reference row: a D
// vector and the matching reference float4s per step, no per-element index work. Returns false
// (nothing done) when the row does not qualify; the caller then takes the general path.
template <int DF>
QS_DEVICE bool qs_compare_row_vec(const QsMatrixDesc& d, qs_u64 first, bool contiguous, const float* rrow, qs_u64 n,
                                  unsigned lane, unsigned lanes, QsRowAcc& a) {
    constexpr int BITS = QsFmt<DF>::BITS;
    constexpr int V = 128 / BITS, PER_WORD = 32 / BITS;
    const qs_u8* base = (const qs_u8*)d.ptr;
    if (!contiguous || n == 0 || first + n > d.extent) return false;
    if ((((qs_u64)base * 8 + first * BITS) & 127ull) != 0 || ((qs_u64)rrow & 15ull) != 0) return false;
    const uint4* dv = (const uint4*)(base + (first * BITS) / 8);
    const float4* rv = (const float4*)rrow;
    const qs_u64 nvec = n / V;
    // UNROLL vectors per lane per step, every load issued before any math: enough bytes in
    // flight per warp to keep HBM busy at 16 resident warps per SM (a warp streams a whole row).
    constexpr int UNROLL = QS_COMPARE_UNROLL > 0 ? QS_COMPARE_UNROLL : (V <= 4 ? 4 : (V <= 16 ? 2 : 1));
    for (qs_u64 v0 = lane; v0 < nvec; v0 += (qs_u64)UNROLL * lanes) {
        uint4 qv[UNROLL];
        float4 rv4[UNROLL][V / 4];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const qs_u64 v = v0 + (qs_u64)u * lanes;
            if (v < nvec) {
                qv[u] = dv[v];
#pragma unroll
                for (int i = 0; i < V / 4; ++i) rv4[u][i] = rv[v * (V / 4) + i];
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (v0 + (qs_u64)u * lanes >= nvec) break;
            const uint4 q = qv[u];
            float r[V];
#pragma unroll
            for (int i = 0; i < V / 4; ++i) {
                const float4 f = rv4[u][i];
                r[4 * i] = f.x;
                r[4 * i + 1] = f.y;
                r[4 * i + 2] = f.z;
                r[4 * i + 3] = f.w;
            }
            const qs_u32 words[4] = {q.x, q.y, q.z, q.w};
#if QS_COMPARE_F32_PARTIALS
            if constexpr (DF != QS_FMT_I32) {
                // Finite pairs of one vector summed in f32 (products of a <= 16-bit value and an f32
                // are within 2^-24 relative; V <= 32 terms), folded into the f64 row sums once per
                // vector: a quarter of the double-precision work per element.
                float sd = 0.0f, sp = 0.0f, sr = 0.0f, sdd = 0.0f, smx = 0.0f;
#pragma unroll
                for (int w = 0; w < 4; ++w) {
#pragma unroll
                    for (int e = 0; e < PER_WORD; ++e) {
                        const qs_u32 code = BITS == 32 ? words[w] : (words[w] >> (e * BITS)) & ((1u << (BITS & 31)) - 1u);
                        const float p = QsFmt<DF>::f32(code), rr = r[w * PER_WORD + e];
                        if (qs_isfinitef(p) && qs_isfinitef(rr)) {
                            const float d = p - rr;
                            sd = fmaf(p, rr, sd);
                            sp = fmaf(p, p, sp);
                            sr = fmaf(rr, rr, sr);
                            sdd = fmaf(d, d, sdd);
                            smx = fmaxf(smx, fabsf(d));
                        } else {
                            qs_rowacc_add(a, (double)p, (double)rr);
                        }
                    }
                }
                a.dot += (double)sd;
                a.pp += (double)sp;
                a.rr += (double)sr;
                a.dd += (double)sdd;
                a.mx = qs_fmax(a.mx, (double)smx);
            } else
#endif
            {
#pragma unroll
                for (int w = 0; w < 4; ++w) {
#pragma unroll
                    for (int e = 0; e < PER_WORD; ++e) {
                        const qs_u32 code = BITS == 32 ? words[w] : (words[w] >> (e * BITS)) & ((1u << (BITS & 31)) - 1u);
                        qs_rowacc_add_code<DF>(a, code, r[w * PER_WORD + e]);
                    }
                }
            }
        }
    }
    for (qs_u64 j = nvec * V + lane; j < n; j += lanes)
        qs_rowacc_add_code<DF>(a, qs_load_code_bits<BITS>(base, first + j), rrow[j]);
    return true;
}

QS_DEVICE void qs_cpart_zero(QsComparePartial& a) {
    qs_sums_zero(a.sums);
    qs_worst_none(a.worst);
    a.logits_rows = a.top1_agree = a.topk_hits = a.kl_nonfinite_rows = 0;
    a.kl_sum = 0.0;
    a.kl_max = -1.0;
    a.kl_max_t = ~0ull;
    a.reserved = 0;
}
// Largest KL, ties to the lower sample position (deterministic).
QS_DEVICE void qs_klmax_merge(double& kl, qs_u64& t, double okl, qs_u64 ot) {
    if (ot != ~0ull && (t == ~0ull || okl > kl || (okl == kl && ot < t))) {
        kl = okl;
        t = ot;
    }
}
QS_DEVICE void qs_cpart_merge(QsComparePartial& a, const QsComparePartial& b) {
    qs_sums_merge(a.sums, b.sums);
    qs_worst_merge(a.worst, b.worst);
    a.logits_rows += b.logits_rows;
    a.top1_agree += b.top1_agree;
    a.topk_hits += b.topk_hits;
    a.kl_nonfinite_rows += b.kl_nonfinite_rows;
    a.kl_sum += b.kl_sum;
    qs_klmax_merge(a.kl_max, a.kl_max_t, b.kl_max, b.kl_max_t);
}
QS_DEVICE void qs_cpart_warp_reduce(QsComparePartial& a) {
    qs_sums_warp_reduce(a.sums);
    qs_worst_warp_reduce(a.worst);
    a.logits_rows = qs_warp_sum_u64(a.logits_rows);
    a.top1_agree = qs_warp_sum_u64(a.top1_agree);
    a.topk_hits = qs_warp_sum_u64(a.topk_hits);
    a.kl_nonfinite_rows = qs_warp_sum_u64(a.kl_nonfinite_rows);
    a.kl_sum = qs_warp_sum(a.kl_sum);
#pragma unroll
    for (int m = QS_WARP_SIZE / 2; m > 0; m >>= 1) {
        const double okl = QS_SHFL_XOR(a.kl_max, m);
        const qs_u64 ot = (qs_u64)QS_SHFL_XOR((long long)a.kl_max_t, m);
        qs_klmax_merge(a.kl_max, a.kl_max_t, okl, ot);
    }
}

// Block-wide sum of QsSums (all threads call; thread 0 gets the total).
QS_DEVICE QsSums qs_block_sums(QsSums s, QsCompareSmem& sm) {
    const unsigned lane = threadIdx.x % QS_WARP_SIZE, warp = threadIdx.x / QS_WARP_SIZE;
    qs_sums_warp_reduce(s);
    __syncthreads();
    if (lane == 0) sm.sums[warp] = s;
    __syncthreads();
    QsSums t;
    qs_sums_zero(t);
    if (threadIdx.x == 0)
        for (int w = 0; w < QS_WARPS_PER_BLOCK; ++w) qs_sums_merge(t, sm.sums[w]);
    return t;
}

// Block-wide (sum or max) of two doubles; every thread gets the result.
QS_DEVICE void qs_block_reduce2(double& a, double& b, bool is_max, QsCompareSmem& sm) {
    const unsigned lane = threadIdx.x % QS_WARP_SIZE, warp = threadIdx.x / QS_WARP_SIZE;
    a = is_max ? qs_warp_max(a) : qs_warp_sum(a);
    b = is_max ? qs_warp_max(b) : qs_warp_sum(b);
    __syncthreads();
    if (lane == 0) {
        sm.red[warp][0] = a;
        sm.red[warp][1] = b;
    }
    __syncthreads();
    a = sm.red[0][0];
    b = sm.red[0][1];
    for (int w = 1; w < QS_WARPS_PER_BLOCK; ++w) {
        a = is_max ? qs_fmax(a, sm.red[w][0]) : a + sm.red[w][0];
        b = is_max ? qs_fmax(b, sm.red[w][1]) : b + sm.red[w][1];
    }
}

// f64::total_cmp order as a signed integer key (metrics.rs top_k sorts with total_cmp).
QS_DEVICE qs_i64 qs_total_key(double v) {
    qs_i64 b = (qs_i64)qs_f64_bits(v);
    return b ^ (qs_i64)(((qs_u64)(b >> 63)) >> 1);
}
QS_DEVICE double qs_total_value(qs_i64 key) {
    qs_i64 b = key ^ (qs_i64)(((qs_u64)(key >> 63)) >> 1);
    return qs_f64_from_bits((qs_u64)b);
}
// Larger value first; equal values: lower index first (metrics.rs top_k).
QS_DEVICE bool qs_ranks_before(qs_i64 ka, qs_u32 ia, qs_i64 kb, qs_u32 ib) { return ka > kb || (ka == kb && ia < ib); }

// A thread's running top-16, sorted, in registers (fixed indices only: fully unrolled).
struct QsTopList {
    qs_i64 key[QS_MAX_TOPK];
    qs_u32 idx[QS_MAX_TOPK];
    QS_DEVICE void clear() {
#pragma unroll
        for (int s = 0; s < QS_MAX_TOPK; ++s) {
            key[s] = (qs_i64)0x8000000000000000ull;
            idx[s] = 0xFFFFFFFFu;  // ranks after every real element
        }
    }
    QS_DEVICE void insert(qs_i64 k, qs_u32 i) {
        if (!qs_ranks_before(k, i, key[QS_MAX_TOPK - 1], idx[QS_MAX_TOPK - 1])) return;
        key[QS_MAX_TOPK - 1] = k;
        idx[QS_MAX_TOPK - 1] = i;
#pragma unroll
        for (int s = QS_MAX_TOPK - 1; s > 0; --s) {
            if (qs_ranks_before(key[s], idx[s], key[s - 1], idx[s - 1])) {
                qs_i64 tk = key[s];
                key[s] = key[s - 1];
                key[s - 1] = tk;
                qs_u32 ti = idx[s];
                idx[s] = idx[s - 1];
                idx[s - 1] = ti;
            }
        }
    }
    QS_DEVICE void pop() {
#pragma unroll
        for (int s = 0; s < QS_MAX_TOPK - 1; ++s) {
            key[s] = key[s + 1];
            idx[s] = idx[s + 1];
        }
        key[QS_MAX_TOPK - 1] = (qs_i64)0x8000000000000000ull;
        idx[QS_MAX_TOPK - 1] = 0xFFFFFFFFu;
    }
};

// Merges the threads' lists: k rounds of a block argmax. Results in sm.top_idx/top_val[side].
QS_DEVICE void qs_block_topk(QsTopList& l, unsigned k, int side, QsCompareSmem& sm) {
    const unsigned lane = threadIdx.x % QS_WARP_SIZE, warp = threadIdx.x / QS_WARP_SIZE;
    for (unsigned r = 0; r < k; ++r) {
        qs_i64 bk = l.key[0];
        qs_u32 bi = l.idx[0];
#pragma unroll
        for (int m = QS_WARP_SIZE / 2; m > 0; m >>= 1) {
            qs_i64 ok = (qs_i64)QS_SHFL_XOR((long long)bk, m);
            qs_u32 oi = (qs_u32)QS_SHFL_XOR((int)bi, m);
            if (qs_ranks_before(ok, oi, bk, bi)) {
                bk = ok;
                bi = oi;
            }
        }
        __syncthreads();
        if (lane == 0) {
            sm.key[warp] = bk;
            sm.idx[warp] = bi;
        }
        __syncthreads();
        bk = sm.key[0];
        bi = sm.idx[0];
        for (int w = 1; w < QS_WARPS_PER_BLOCK; ++w) {
            if (qs_ranks_before(sm.key[w], sm.idx[w], bk, bi)) {
                bk = sm.key[w];
                bi = sm.idx[w];
            }
        }
        if (l.idx[0] == bi && l.key[0] == bk) l.pop();  // indices are unique: one owner pops
        if (threadIdx.x == 0) {
            sm.top_idx[side][r] = bi;
            sm.top_val[side][r] = qs_total_value(bk);
        }
    }
    __syncthreads();
}

template <bool LOGITS>
QS_DEVICE void qs_compare_body(const QsCompareParams& P, bool valid, QsCompareSmem& sm) {
    const unsigned lane = threadIdx.x % QS_WARP_SIZE, warp = threadIdx.x / QS_WARP_SIZE;
    const qs_u64 st = P.status_ptr;
    const bool per_block = LOGITS || P.block_per_row;
    const qs_u64 epoch = qs_rows_epoch(P.rows);
    const qs_u64 count = valid ? P.rows.count : 0;
    const float* ref = (const float*)P.ref_ptr;
    const bool drow = P.d.order == QS_ORDER_ROW;
    const unsigned lanes = per_block ? blockDim.x : QS_WARP_SIZE;
    const unsigned my_lane = per_block ? threadIdx.x : lane;
    const qs_u64 units = per_block ? gridDim.x : (qs_u64)gridDim.x * QS_WARPS_PER_BLOCK;
    const qs_u64 unit = per_block ? blockIdx.x : (qs_u64)blockIdx.x * QS_WARPS_PER_BLOCK + warp;
    const unsigned kk = (unsigned)(P.topk < 1 ? 1 : (P.topk > QS_MAX_TOPK ? QS_MAX_TOPK : P.topk));
    const unsigned topk = (qs_u64)kk < P.n ? kk : (unsigned)(P.n > 0 ? P.n : 1);  // compare_logits k

    // Running results of this thread's rows: the row owner's (lane 0 / thread 0) slot in shared
    // memory, read and written only by that thread until the barrier after the row loop.
    if (lane == 0) {
        qs_sums_zero(sm.tot[warp]);
        qs_worst_none(sm.wst[warp]);
    }
    qs_u64 lrows = 0, top1 = 0, hits = 0, kl_bad = 0, kl_max_t = ~0ull;
    double kl_sum = 0.0, kl_max = -1.0;

    // Every thread of a block runs the same number of iterations in block mode (the loop bound
    // is uniform), as the block reductions inside require.
    for (qs_u64 t = unit; t < count; t += units) {
        qs_u64 row = 0;
        const bool ok = qs_rows_at(P.rows, epoch, t, &row, st);
        const qs_u64 item = ok ? row / P.m : 0, i = ok ? row % P.m : 0;
        const float* rrow = ref + t * P.ref_ld;
        QsSums s;
        qs_sums_zero(s);
        double pmax = -qs_inf(), rmax = -qs_inf();
        bool fast = false;
        if (!LOGITS && ok) {
            QsRowAcc acc;
            qs_rowacc_zero(acc);
            fast = qs_compare_row_vec<QS_D_FMT>(P.d, qs_out_offset(P.d, item, i, 0), drow, rrow, P.n, my_lane, lanes, acc);
            if (fast) s = qs_rowacc_sums(acc);
        }
        if (ok && !fast) {
            qs_stream_row_f64<QS_D_FMT>((const qs_u8*)P.d.ptr, qs_out_offset(P.d, item, i, 0), drow ? 1 : P.d.ld, 0, P.n,
                                        P.d.extent, st, my_lane, lanes, [&](qs_u64 j, double p) {
                                            const double r = (double)rrow[j];
                                            qs_sums_add(s, p, r);
                                            if (LOGITS) {
                                                if (qs_isfinite(p)) pmax = qs_fmax(pmax, p);
                                                if (qs_isfinite(r)) rmax = qs_fmax(rmax, r);
                                            }
                                        });
        }
        QsSums rs;
        if (per_block) {
            rs = qs_block_sums(s, sm);
        } else {
            qs_sums_warp_reduce(s);
            rs = s;
        }
        if (fast) {  // uniform over the row's threads: the vector path's counts -> MetricSums counts
            rs.pairs = P.n;
            rs.finite = P.n - rs.finite;
        }
        const bool owner = per_block ? threadIdx.x == 0 : lane == 0;
        if (owner && ok) {
            qs_sums_merge(sm.tot[warp], rs);
            QsWorst& worst = sm.wst[warp];
            const double c = qs_row_rank_cosine(rs);
            if (qs_worse(c, t, worst)) {
                worst.t = t;
                worst.row = row;
                worst.cosine = c;
                worst.dot = rs.dot;
                worst.prod_sq = rs.prod_sq;
                worst.ref_sq = rs.ref_sq;
            }
            if (P.row_stats_ptr) {
                double* r3 = (double*)P.row_stats_ptr + t * 3;
                r3[0] = rs.dot;
                r3[1] = rs.prod_sq;
                r3[2] = rs.ref_sq;
            }
        }
        if (!LOGITS) continue;

        // ---- logits: softmax KL and top-k, a block per row ----
        __shared__ int s_nonfinite;
        if (threadIdx.x == 0) s_nonfinite = !ok || (rs.nan_prod + rs.inf_prod + rs.nan_ref + rs.inf_ref) > 0 || P.n == 0;
        qs_block_reduce2(pmax, rmax, true, sm);  // syncs: s_nonfinite visible after it
        const bool finite = !s_nonfinite;
        double kl = qs_nan();
        if (finite) {
            double sp = 0.0, sr = 0.0;
            qs_stream_row_f64<QS_D_FMT>((const qs_u8*)P.d.ptr, qs_out_offset(P.d, item, i, 0), drow ? 1 : P.d.ld, 0, P.n,
                                        P.d.extent, st, my_lane, lanes, [&](qs_u64 j, double p) {
                                            sp += exp(p - pmax);
                                            sr += exp((double)rrow[j] - rmax);
                                        });
            qs_block_reduce2(sp, sr, false, sm);
            const double lse_p = pmax + log(sp), lse_r = rmax + log(sr);
            double acc = 0.0, unused = 0.0;
            qs_stream_row_f64<QS_D_FMT>((const qs_u8*)P.d.ptr, qs_out_offset(P.d, item, i, 0), drow ? 1 : P.d.ld, 0, P.n,
                                        P.d.extent, st, my_lane, lanes, [&](qs_u64 j, double p) {
                                            const double lr = (double)rrow[j] - lse_r;
                                            acc += exp(lr) * (lr - (p - lse_p));
                                        });
            qs_block_reduce2(acc, unused, false, sm);
            kl = acc > 0.0 ? acc : 0.0;
        }
        // Top-k of each side over every value (non-finite ones too, as total_cmp orders them).
        QsTopList l;
        l.clear();
        if (ok)
            for (qs_u64 j = threadIdx.x; j < P.n; j += blockDim.x) l.insert(qs_total_key((double)rrow[j]), (qs_u32)j);
        qs_block_topk(l, topk, 0, sm);
        l.clear();
        if (ok)
            qs_stream_row_f64<QS_D_FMT>((const qs_u8*)P.d.ptr, qs_out_offset(P.d, item, i, 0), drow ? 1 : P.d.ld, 0, P.n,
                                        P.d.extent, st, my_lane, lanes,
                                        [&](qs_u64 j, double p) { l.insert(qs_total_key(p), (qs_u32)j); });
        qs_block_topk(l, topk, 1, sm);
        if (threadIdx.x == 0 && ok) {
            qs_u32 h = 0;
            for (unsigned a = 0; a < topk; ++a)
                for (unsigned b = 0; b < topk; ++b) h += sm.top_idx[0][a] == sm.top_idx[1][b];
            const bool agree = sm.top_idx[0][0] == sm.top_idx[1][0];
            lrows += 1;
            top1 += agree;
            hits += h;
            if (qs_isnan(kl)) {
                kl_bad += 1;
            } else {
                kl_sum += kl;
                if (kl > kl_max || (kl == kl_max && t < kl_max_t)) {
                    kl_max = kl;
                    kl_max_t = t;
                }
            }
            if (P.rowout_ptr) {
                QsLogitsRow* o = (QsLogitsRow*)P.rowout_ptr + t;
                o->kl = kl;
                o->top1 = agree;
                o->hits = h;
                for (unsigned a = 0; a < QS_MAX_TOPK; ++a) {
                    const bool in = a < topk;
                    o->ref_idx[a] = in ? sm.top_idx[0][a] : 0xFFFFFFFFu;
                    o->ref_val[a] = in ? (float)sm.top_val[0][a] : 0.0f;
                    o->prod_idx[a] = in ? sm.top_idx[1][a] : 0xFFFFFFFFu;
                    o->prod_val[a] = in ? (float)sm.top_val[1][a] : 0.0f;
                }
            }
        }
        __syncthreads();
    }

    // ---- block partial: merge the row owners in warp order ----
    __syncthreads();
    QsComparePartial* parts = (QsComparePartial*)P.partials_ptr;
    if (threadIdx.x == 0) {
        QsComparePartial& bp = sm.part;
        if (per_block) {
            bp.sums = sm.tot[0];
            bp.worst = sm.wst[0];
        } else {
            qs_sums_zero(bp.sums);
            qs_worst_none(bp.worst);
            for (int w = 0; w < QS_WARPS_PER_BLOCK; ++w) {
                qs_sums_merge(bp.sums, sm.tot[w]);
                qs_worst_merge(bp.worst, sm.wst[w]);
            }
        }
        bp.logits_rows = lrows;
        bp.top1_agree = top1;
        bp.topk_hits = hits;
        bp.kl_nonfinite_rows = kl_bad;
        bp.kl_sum = kl_sum;
        bp.kl_max = kl_max;
        bp.kl_max_t = kl_max_t;
        bp.reserved = 0;
    }
    __syncthreads();
    {
        const qs_u64* src = (const qs_u64*)&sm.part;
        qs_u64* dst = (qs_u64*)&parts[blockIdx.x];
        for (unsigned w = threadIdx.x; w < sizeof(QsComparePartial) / 8; w += blockDim.x) dst[w] = src[w];
    }
    if (!qs_last_block((qs_u32*)P.counter_ptr, gridDim.x)) return;

    // ---- finalise: merge the blocks, publish ----
    // Thread t merges partials t, t + blockDim, ... in order, then a warp butterfly and a fixed
    // warp order: deterministic for a given grid, and the partials are read in parallel.
    {
        QsComparePartial acc, bp;
        qs_cpart_zero(acc);
        for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x) {
            qs_ldcg_copy(&bp, &parts[b]);
            qs_cpart_merge(acc, bp);
        }
        qs_cpart_warp_reduce(acc);
        if (lane == 0) sm.wpart[warp] = acc;
    }
    QsResultSlot* slot = &sm.slot;
    qs_slot_init(slot, P.tag, P.tag2, P.kind);  // syncs: wpart visible after it
    if (threadIdx.x == 0) {
        QsComparePartial acc;
        qs_cpart_zero(acc);
        for (int w = 0; w < QS_WARPS_PER_BLOCK; ++w) qs_cpart_merge(acc, sm.wpart[w]);
        qs_slot_put_sums(slot, acc.sums);
        qs_slot_put_worst(slot, acc.worst);
        slot->elem_nan_prod = acc.sums.nan_prod;
        slot->elem_inf_prod = acc.sums.inf_prod;
        slot->rows_checked = count;
        slot->epoch = epoch;
        if (LOGITS) {
            slot->topk = topk;
            slot->logits_rows = acc.logits_rows;
            slot->top1_agree = acc.top1_agree;
            slot->topk_hits = acc.topk_hits;
            slot->kl_nonfinite_rows = acc.kl_nonfinite_rows;
            slot->kl_sum = acc.kl_sum;
            slot->kl_max = acc.kl_max_t == ~0ull ? 0.0 : acc.kl_max;
            if (acc.kl_max_t != ~0ull && P.rowout_ptr) {
                qs_u64 r = 0;
                slot->kl_max_row = qs_rows_at(P.rows, epoch, acc.kl_max_t, &r, 0) ? r : ~0ull;
                QsLogitsRow lr;
                qs_ldcg_copy(&lr, (const QsLogitsRow*)P.rowout_ptr + acc.kl_max_t);
                for (int a = 0; a < QS_MAX_TOPK; ++a) {
                    slot->prod_top_idx[a] = lr.prod_idx[a];
                    slot->prod_top_val[a] = lr.prod_val[a];
                    slot->ref_top_idx[a] = lr.ref_idx[a];
                    slot->ref_top_val[a] = lr.ref_val[a];
                }
            }
        }
        qs_u32 status = qs_take_status(st);
        if (!valid) status |= QS_STATUS_BAD_DESCRIPTOR;
        if (acc.sums.nan_ref + acc.sums.inf_ref > 0) status |= QS_STATUS_REF_NONFINITE;
        slot->status = status;
        qs_rows_advance(P.rows);
    }
    __syncthreads();
    qs_ring_publish(P.ring, slot);
}

QS_DEVICE bool qs_compare_valid(const QsCompareParams& P) {
    return P.d.format == QS_D_FMT && blockDim.x == QS_BLOCK && P.m > 0 && P.ref_ld >= P.n && P.ref_ptr != 0;
}

#ifndef QS_COMPARE_MIN_BLOCKS
#define QS_COMPARE_MIN_BLOCKS 2
#endif
QS_GLOBAL void __launch_bounds__(QS_BLOCK, QS_COMPARE_MIN_BLOCKS) QS_COMPARE(QsCompareParams P) {
    // Not sampled: return before the counter protocol (nothing to undo).
    if (!qs_gate_take(P.gate_ptr, P.gate_first, P.gate_every)) return;
    __shared__ QsCompareSmem sm;
    qs_compare_body<false>(P, qs_compare_valid(P), sm);
}

QS_GLOBAL void __launch_bounds__(QS_BLOCK) QS_COMPARE_LOGITS(QsCompareParams P) {
    if (!qs_gate_take(P.gate_ptr, P.gate_first, P.gate_every)) return;
    __shared__ QsCompareSmem sm;
    qs_compare_body<true>(P, qs_compare_valid(P) && P.n <= 0xFFFFFFFFull, sm);
}
