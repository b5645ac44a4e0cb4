// Sketch check (DESIGN.md "Checking without paying for a second GEMM"): Freivalds-style
// random projections of the production output and of the reference, fused into one launch per
// checked call.
//
// R is N x k with r(j, p) = +-1 from hash3(seed, p, j) (qs_rng.h). For the sampled rows i:
//   y_i = D[i,:] R / d_scale                            (production, back in epilogue units)
//   x_i = alpha a_ts b_ts A_ref[i,:] W_R + beta C[i,:] R + bias_i colsum(R)  (row bias)
//                                                       + bias R              (column bias)
// with A_ref = a * sa and W_R = op(B)_ref R (K x k, b * sb, computed once per weight by
// qs_sketch_wproj). Since E[r^T P^T Q r] = <P, Q>_F, the MetricSums over the pairs (y_ip,
// x_ip) estimate the whole-tensor metrics; the per-row (dot, yy, xx) estimate per-row cosines.
// Linear epilogues only (activation none); a non-linear one is flagged, never silently wrong.
//
// Build defines: QS_A_FMT, QS_B_FMT, QS_D_FMT (format ids). Entries:
//   qs_sketch_prep                 sign words, colsum(R), bias projection (once per seed/N/bias)
//   qs_sketch_wproj_{b}            W_R = op(B)_ref R                        (once per weight)
//   qs_sketch_check_{a}_{d}        the per-call check, results into the ring
#include "qs_device.h"

#if !defined(QS_A_FMT) || !defined(QS_B_FMT) || !defined(QS_D_FMT)
#error "qs_sketch.cu needs -DQS_A_FMT, -DQS_B_FMT and -DQS_D_FMT"
#endif

#define QS_SKETCH_PREP qs_sketch_prep
#define QS_SKETCH_WPROJ QS_CAT(qs_sketch_wproj_, QS_TAG(QS_B_FMT))
#define QS_SKETCH_CHECK QS_CAT5(qs_sketch_check_, QS_TAG(QS_A_FMT), _, QS_TAG(QS_D_FMT), )

// Accumulates +-v into acc[p] with the sign bits of w, exactly (a sign flip, no multiply).
template <int KP>
QS_DEVICE void qs_signed_add(float (&acc)[KP], float v, qs_u32 w) {
    const qs_u32 vb = qs_f32_bits(v);
#pragma unroll
    for (int p = 0; p < KP; ++p) acc[p] += qs_f32_from_bits(vb ^ ((w << (31 - p)) & 0x80000000u));
}

// ================================================================================================
// qs_sketch_prep: grid-stride over j; grid any size, QS_BLOCK threads.
// ================================================================================================
QS_GLOBAL void __launch_bounds__(QS_BLOCK) QS_SKETCH_PREP(QsPrepParams P) {
    __shared__ double s_part[QS_WARPS_PER_BLOCK][2][QS_MAX_PROBES];
    const unsigned lane = threadIdx.x % QS_WARP_SIZE, warp = threadIdx.x / QS_WARP_SIZE;
    qs_u32 neg[QS_MAX_PROBES];
    double bacc[QS_MAX_PROBES];
#pragma unroll
    for (int p = 0; p < QS_MAX_PROBES; ++p) {
        neg[p] = 0;
        bacc[p] = 0.0;
    }
    const bool col_bias = P.bias.ptr != 0 && P.bias.axis == QS_BIAS_COLS;
    qs_u32* signs = (qs_u32*)P.signs_ptr;
    for (qs_u64 j = (qs_u64)blockIdx.x * blockDim.x + threadIdx.x; j < P.n; j += (qs_u64)gridDim.x * blockDim.x) {
        qs_u32 w = 0;
#pragma unroll 4
        for (int p = 0; p < QS_MAX_PROBES; ++p) w |= qs_probe_negative(P.seed, (qs_u32)p, j) << p;
        signs[j] = w;
        const double bj = col_bias ? qs_bias_value(P.bias, j, P.status_ptr) : 0.0;
#pragma unroll
        for (int p = 0; p < QS_MAX_PROBES; ++p) {
            const qs_u32 bit = (w >> p) & 1u;
            neg[p] += bit;
            bacc[p] += bit ? -bj : bj;
        }
    }
    // Block reduction in warp order, then one partial per block.
#pragma unroll
    for (int p = 0; p < QS_MAX_PROBES; ++p) {
        double r = qs_warp_sum((double)neg[p]);
        double b = qs_warp_sum(bacc[p]);
        if (lane == 0) {
            s_part[warp][0][p] = r;
            s_part[warp][1][p] = b;
        }
    }
    __syncthreads();
    double* partials = (double*)P.partials_ptr;
    if (threadIdx.x < 2 * QS_MAX_PROBES) {
        const unsigned which = threadIdx.x / QS_MAX_PROBES, p = threadIdx.x % QS_MAX_PROBES;
        double s = 0.0;
        for (int w = 0; w < QS_WARPS_PER_BLOCK; ++w) s += s_part[w][which][p];
        partials[((qs_u64)blockIdx.x * 2 + which) * QS_MAX_PROBES + p] = s;
    }
    if (!qs_last_block((qs_u32*)P.counter_ptr, gridDim.x)) return;
    if (threadIdx.x < 2 * QS_MAX_PROBES) {
        const unsigned which = threadIdx.x / QS_MAX_PROBES, p = threadIdx.x % QS_MAX_PROBES;
        double s = 0.0;
        for (unsigned b = 0; b < gridDim.x; ++b) s += qs_ldcg_f64(&partials[((qs_u64)b * 2 + which) * QS_MAX_PROBES + p]);
        if (which == 0) {
            // colsum r(., p) = N - 2 * (number of -1 entries).
            ((double*)P.rsum_ptr)[p] = (double)P.n - 2.0 * s;
        } else {
            ((double*)P.bproj_ptr)[p] = s;
        }
    }
}

// ================================================================================================
// qs_sketch_wproj_{b}: W_R[item][kk][p] = sum_j b(kk, j) sb(kk, j) r(j, p) for p < kp.
// Any grid works (grid-stride over kk); grid.z = items. QS_BLOCK threads.
// Rows of op(B) contiguous along j (row-major B, N): one warp per kk, lanes along j.
// Otherwise (the usual nn.Linear weight, op(B) = W^T): lanes along kk, warps split j.
// ================================================================================================
template <int KP>
QS_DEVICE void qs_fold(double (&dacc)[KP], float (&acc)[KP]) {
#pragma unroll
    for (int p = 0; p < KP; ++p) {
        dacc[p] += (double)acc[p];
        acc[p] = 0.0f;
    }
}

template <int KP>
QS_DEVICE void qs_wproj_body(const QsWprojParams& P) {
    __shared__ double s_red[QS_WARP_SIZE][KP];
    const unsigned lane = threadIdx.x % QS_WARP_SIZE, warp = threadIdx.x / QS_WARP_SIZE;
    const qs_u64 item = blockIdx.z;
    const qs_u64 K = P.k_dim, N = P.n_dim;
    const QsOpStrides os = qs_op_strides(P.b);  // op(B)(kk, j) = kk * rs + j * cs
    const qs_u8* base = (const qs_u8*)P.b.ptr;
    const qs_u64 item_off = item * P.b.batch_stride;
    const QsScaleLookup sc = qs_scale_lookup(P.b_scale);
    const qs_u32* signs = (const qs_u32*)P.signs_ptr;
    float* out = (float*)P.out_ptr + item * K * KP;
    const qs_u64 st = P.status_ptr;

    if (os.cs == 1) {
        for (qs_u64 kk = (qs_u64)blockIdx.x * QS_WARPS_PER_BLOCK + warp; kk < K;
             kk += (qs_u64)gridDim.x * QS_WARPS_PER_BLOCK) {
            float acc[KP];
            double dacc[KP];
#pragma unroll
            for (int p = 0; p < KP; ++p) {
                acc[p] = 0.0f;
                dacc[p] = 0.0;
            }
            unsigned n_in_f32 = 0;
            qs_u64 last_ib = ~0ull, last_ob = ~0ull;
            float s = 1.0f;
            qs_stream_row<QS_B_FMT>(base, item_off + kk * os.rs, 1, 0, N, P.b.extent, st, lane, QS_WARP_SIZE,
                                    [&](qs_u64 j, float v) {
                                        if (sc.present) {
                                            const qs_u64 ob = qs_fastdiv(j, sc.bo), ib = qs_fastdiv(kk, sc.bi);
                                            if (ob != last_ob || ib != last_ib) {
                                                last_ob = ob;
                                                last_ib = ib;
                                                qs_u64 e = item * sc.batch_stride + qs_scale_entry_index(sc, ob, ib);
                                                s = qs_decode_scale(sc.format, qs_scale_code(sc, e, st));
                                            }
                                            v *= s;
                                        }
                                        qs_signed_add<KP>(acc, v, signs[j]);
                                        // f32 partials stay short; the long sum is in double.
                                        if (++n_in_f32 == 64) {
                                            qs_fold<KP>(dacc, acc);
                                            n_in_f32 = 0;
                                        }
                                    });
            qs_fold<KP>(dacc, acc);
#pragma unroll
            for (int p = 0; p < KP; ++p) {
                double t = qs_warp_sum(dacc[p]);
                if (lane == (unsigned)p) out[kk * KP + p] = (float)t;
            }
        }
        return;
    }

    // Lanes along kk, warps interleaved along j, reduction across warps in warp order.
    for (qs_u64 k0 = (qs_u64)blockIdx.x * QS_WARP_SIZE; k0 < K; k0 += (qs_u64)gridDim.x * QS_WARP_SIZE) {
        const qs_u64 kk = k0 + lane;
        const bool kin = kk < K;
        float acc[KP];
        double dacc[KP];
#pragma unroll
        for (int p = 0; p < KP; ++p) {
            acc[p] = 0.0f;
            dacc[p] = 0.0;
        }
        unsigned n_in_f32 = 0;
        for (qs_u64 j = warp; j < N; j += QS_WARPS_PER_BLOCK) {
            float v = 0.0f;
            if (kin) {
                const qs_u64 off = item_off + kk * os.rs + j * os.cs;
                if (off < P.b.extent) {
                    v = qs_load_f32<QS_B_FMT>(base, off);
                } else {
                    qs_flag(st, QS_STATUS_OUT_OF_BOUNDS);
                }
                if (sc.present) v *= qs_scale_value(sc, item, j, kk, st);
            }
            qs_signed_add<KP>(acc, v, signs[j]);
            if (++n_in_f32 == 64) {
                qs_fold<KP>(dacc, acc);
                n_in_f32 = 0;
            }
        }
        qs_fold<KP>(dacc, acc);
        __syncthreads();
        for (unsigned w = 0; w < QS_WARPS_PER_BLOCK; ++w) {
            if (warp == w) {
#pragma unroll
                for (int p = 0; p < KP; ++p) s_red[lane][p] = (w == 0 ? 0.0 : s_red[lane][p]) + dacc[p];
            }
            __syncthreads();
        }
        for (unsigned e = threadIdx.x; e < QS_WARP_SIZE * KP; e += blockDim.x) {
            const unsigned l = e / KP, p = e % KP;
            if (k0 + l < K) out[(k0 + l) * KP + p] = (float)s_red[l][p];
        }
        __syncthreads();
    }
}

QS_GLOBAL void __launch_bounds__(QS_BLOCK) QS_SKETCH_WPROJ(QsWprojParams P) {
    if (P.b.format != QS_B_FMT || blockDim.x != QS_BLOCK) {
        qs_flag(P.status_ptr, QS_STATUS_BAD_DESCRIPTOR);
        return;
    }
    switch (P.kp) {
        case 8: qs_wproj_body<8>(P); break;
        case 16: qs_wproj_body<16>(P); break;
        case 32: qs_wproj_body<32>(P); break;
        default: qs_flag(P.status_ptr, QS_STATUS_BAD_DESCRIPTOR); break;
    }
}

// ================================================================================================
// qs_sketch_check_{a}_{d}: grid (groups, splits <= QS_MAX_SPLITS), QS_BLOCK threads, one warp
// per sampled row (abi.rs SketchGeometry sizes it and its scratch).
//
// Each block projects its rows over one K slice (A W_R, with W_R staged through shared memory
// in software-pipelined chunks) and one N slice (D R and C R, vector loads) and writes f64
// partials. The last split block of a group (last-block-done, per-group counter) sums the
// partials in split order, forms y and x, and reduces the group's rows; the last group block
// (a second counter) merges the groups (strided per thread, warp butterflies, fixed warp order)
// and writes the ring slot: one launch, no host sync, deterministic for a given grid,
// graph-replay safe (counters reset by the blocks that finish them).
// Measured on an H200: 256 rows of a 4096 x 4096 FP8 problem in ~46 us at k = 32, dominated by
// the fixed latency of these stages (8 rows take 44 us); see sketch.rs for the numbers.
// ================================================================================================
#define QS_WR_CHUNK 128

struct QsSketchSmem {
    QsSums sums[QS_WARPS_PER_BLOCK];
    QsWorst worst[QS_WARPS_PER_BLOCK];
    double fy[QS_WARPS_PER_BLOCK][QS_MAX_PROBES];
    double fx[QS_WARPS_PER_BLOCK][QS_MAX_PROBES];
    qs_u64 nonfinite[QS_WARPS_PER_BLOCK][2];
    qs_u64 split_counts[QS_MAX_SPLITS][2];
    // A W_R: a chunk of QS_WR_CHUNK rows of W_R, row stride kp + 4 floats (16-byte aligned rows;
    // lanes reading consecutive rows hit distinct banks).
    float wtile[QS_WR_CHUNK * (QS_MAX_PROBES + 4)];
    QsSketchGroup group;
    QsResultSlot slot;
};

// Slice s of [0, len) in multiples of 128 elements (whole 16-byte vectors for every format).
QS_DEVICE void qs_slice(qs_u64 len, unsigned s, unsigned splits, qs_u64* lo, qs_u64* hi) {
    qs_u64 per = ((len + splits - 1) / splits + 127) & ~127ull;
    qs_u64 a = (qs_u64)s * per;
    *lo = a < len ? a : len;
    *hi = a + per < len ? a + per : len;
}

// Sum of each of the KP per-lane values over the warp, by transposition: at each halving step a
// lane keeps half of its values and trades the other half with its partner, so KP values cost
// KP - 1 shuffles in all (not KP * log2(warp)); the rest of the steps add single values. Lane L
// ends with the total of probe L >> (log2(warp) - log2(KP)), and the first lane of each such
// group writes it. f32 sums of 32 lane partials: ~1e-7 relative, far below any threshold.
template <int KP>
QS_DEVICE void qs_warp_store(double* dst, float (&acc)[KP], unsigned lane) {
    constexpr int LOG_KP = KP == 8 ? 3 : (KP == 16 ? 4 : 5);
    constexpr int LOG_W = QS_WARP_SIZE == 64 ? 6 : 5;
    float v[KP];
#pragma unroll
    for (int p = 0; p < KP; ++p) v[p] = acc[p];
#pragma unroll
    for (int st = 0; st < LOG_KP; ++st) {
        const int o = QS_WARP_SIZE >> (st + 1);
        const int half = KP >> (st + 1);
        const bool upper = (lane & (unsigned)o) != 0;
#pragma unroll
        for (int i = 0; i < half; ++i) {
            const float send = upper ? v[i] : v[i + half];
            const float keep = upper ? v[i + half] : v[i];
            v[i] = keep + QS_SHFL_XOR(send, o);
        }
    }
    float x = v[0];
#pragma unroll
    for (int st = LOG_KP; st < LOG_W; ++st) x += QS_SHFL_XOR(x, QS_WARP_SIZE >> (st + 1));
    constexpr int SHIFT = LOG_W - LOG_KP;
    if ((lane & ((1u << SHIFT) - 1u)) == 0) dst[lane >> SHIFT] = (double)x;
}

// ---- vectorized D phase ----------------------------------------------------------------------
// Contiguous, 16-byte aligned rows of D (the usual case): each lane loads a whole vector of D and
// the sign words of its j's before doing the math, so the loads overlap instead of each element
// waiting for its own. Returns false (nothing done) when the row does not qualify.

// Scale of A element (i, kk), cached by inner block.
struct QsScaleCache {
    qs_u64 ib;
    float s;
};
QS_DEVICE float qs_a_scale(const QsScaleLookup& sc, qs_u64 item, qs_u64 ob, qs_u64 kk, QsScaleCache& c, qs_u64 st) {
    const qs_u64 ib = qs_fastdiv(kk, sc.bi);
    if (ib != c.ib) {
        c.ib = ib;
        c.s = qs_decode_scale(sc.format, qs_scale_code(sc, item * sc.batch_stride + qs_scale_entry_index(sc, ob, ib), st));
    }
    return c.s;
}

template <int DF, int KP>
QS_DEVICE bool qs_sketch_d_vec(const qs_u8* base, qs_u64 first, qs_u64 n0, qs_u64 n1, qs_u64 extent, const qs_u32* signs,
                               unsigned lane, float (&acc)[KP], qs_u64& nan_d, qs_u64& inf_d) {
    constexpr int BITS = QsFmt<DF>::BITS, V = 128 / BITS, PER_WORD = 32 / BITS;
    if (n0 >= n1) return true;
    // Slices start at multiples of 128 elements, so signs + n0 is 16-byte aligned.
    if (first + n1 > extent || (((qs_u64)base * 8 + (first + n0) * BITS) & 127ull) != 0 || (n0 & 3) != 0) return false;
    const uint4* dv = (const uint4*)(base + ((first + n0) * BITS) / 8);
    const qs_u64 nvec = (n1 - n0) / V;
    // Two vectors (D and their sign words) in flight per lane before any math (one for 4-bit D,
    // whose 32 sign words already fill the registers).
    constexpr int UNROLL = V <= 16 ? 2 : 1;
    for (qs_u64 v0 = lane; v0 < nvec; v0 += (qs_u64)UNROLL * QS_WARP_SIZE) {
        uint4 qv[UNROLL];
        uint4 sv[UNROLL][V / 4];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const qs_u64 v = v0 + (qs_u64)u * QS_WARP_SIZE;
            if (v < nvec) {
                qv[u] = dv[v];
                const uint4* s4 = (const uint4*)(signs + n0 + v * V);
#pragma unroll
                for (int i = 0; i < V / 4; ++i) sv[u][i] = s4[i];
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
        if (v0 + (qs_u64)u * QS_WARP_SIZE >= nvec) break;
        const uint4 q = qv[u];
        qs_u32 sw[V];
#pragma unroll
        for (int i = 0; i < V / 4; ++i) {
            const uint4 x = sv[u][i];
            sw[4 * i] = x.x;
            sw[4 * i + 1] = x.y;
            sw[4 * i + 2] = x.z;
            sw[4 * i + 3] = x.w;
        }
        const qs_u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
#pragma unroll
            for (int e = 0; e < PER_WORD; ++e) {
                const float x =
                    QsFmt<DF>::f32(BITS == 32 ? words[w] : (words[w] >> (e * BITS)) & ((1u << (BITS & 31)) - 1u));
                if (!qs_isfinitef(x)) {
                    nan_d += x != x;
                    inf_d += x == x;
                }
                qs_signed_add<KP>(acc, x, sw[w * PER_WORD + e]);
            }
        }
        }
    }
    for (qs_u64 j = n0 + nvec * V + lane; j < n1; j += QS_WARP_SIZE) {
        const float x = qs_load_f32<DF>(base, first + j);
        if (!qs_isfinitef(x)) {
            nan_d += x != x;
            inf_d += x == x;
        }
        qs_signed_add<KP>(acc, x, signs[j]);
    }
    return true;
}

template <int KP>
QS_DEVICE void qs_sketch_check_body(const QsSketchParams& P, bool valid, QsSketchSmem& sm) {
    const unsigned lane = threadIdx.x % QS_WARP_SIZE, warp = threadIdx.x / QS_WARP_SIZE;
    const QsGemmDesc& g = P.g;
    const qs_u64 st = P.status_ptr;
    const unsigned G = gridDim.x, S = gridDim.y, gi = blockIdx.x, si = blockIdx.y;
    const qs_u64 epoch = qs_rows_epoch(P.rows);
    const qs_u64 t = (qs_u64)gi * QS_WARPS_PER_BLOCK + warp;
    qs_u64 row = 0;
    bool active = valid && t < P.rows.count && qs_rows_at(P.rows, epoch, t, &row, st);
    const qs_u64 item = active ? row / g.m : 0, i = active ? row % g.m : 0;

    double* part = (double*)P.partials_ptr + ((((qs_u64)gi * S + si) * QS_WARPS_PER_BLOCK + warp) * 3) * KP;
    float acc[KP];
    qs_u64 nan_d = 0, inf_d = 0;

    // ---- A_ref[i, k-slice] W_R ------------------------------------------------------------
    // Chunks of QS_WR_CHUNK k's: the block stages the chunk's W_R rows in shared memory with
    // coalesced loads that are all in flight at once (the W_R rows serve every row of the
    // group), each warp loads its row's A elements (lane + 32 e, coalesced, any layout), then
    // reads W_R from shared memory. Every warp takes part (barriers), active or not.
#pragma unroll
    for (int p = 0; p < KP; ++p) acc[p] = 0.0f;
    {
        qs_u64 k0, k1;
        qs_slice(g.k, si, S, &k0, &k1);
        const QsOpStrides os = qs_op_strides(g.a);
        const QsScaleLookup sc = qs_scale_lookup(g.a_scale);
        const float4* wr4 = (const float4*)((const float*)P.wr_ptr + item * P.wr_batch_stride);
        const qs_u64 ob = (active && sc.present) ? qs_fastdiv(i, sc.bo) : 0;
        const qs_u64 a_first = item * g.a.batch_stride + i * os.rs;
        const qs_u8* abase = (const qs_u8*)g.a.ptr;
        constexpr int STRIDE = KP + 4;
        constexpr int E = QS_WR_CHUNK / QS_WARP_SIZE;
        QsScaleCache cache;
        cache.ib = ~0ull;
        cache.s = 1.0f;
        const float4* wt4 = (const float4*)sm.wtile;
        // Software pipeline: chunk c + 1's W_R rows and A elements are loaded into registers
        // while chunk c is computed from shared memory, so each chunk costs one overlapped
        // round trip instead of several dependent ones.
        constexpr int WN = QS_WR_CHUNK * (KP / 4) / QS_BLOCK;  // float4s per thread per chunk
        static_assert(WN >= 1 && QS_WR_CHUNK * (KP / 4) % QS_BLOCK == 0, "chunk tiling");
        float4 wreg[WN];
        float anext[E];
        auto load_chunk = [&](qs_u64 kc) {
            const unsigned cnt = (unsigned)qs_min_u64(QS_WR_CHUNK, k1 - kc);
#pragma unroll
            for (int u = 0; u < WN; ++u) {
                const unsigned idx = threadIdx.x + (unsigned)u * QS_BLOCK;
                const unsigned r = idx / (KP / 4), q = idx % (KP / 4);
                wreg[u] = r < cnt ? wr4[(kc + r) * (KP / 4) + q] : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const qs_u64 kk = kc + lane + (unsigned)e * QS_WARP_SIZE;
                anext[e] = 0.0f;
                if (active && kk < k1) {
                    const qs_u64 off = a_first + kk * os.cs;
                    if (off < g.a.extent) {
                        anext[e] = qs_load_f32<QS_A_FMT>(abase, off);
                    } else {
                        qs_flag(st, QS_STATUS_OUT_OF_BOUNDS);
                    }
                }
            }
        };
        if (k0 < k1) load_chunk(k0);
        for (qs_u64 kc = k0; kc < k1; kc += QS_WR_CHUNK) {
            const unsigned cnt = (unsigned)qs_min_u64(QS_WR_CHUNK, k1 - kc);
            __syncthreads();  // the previous chunk's readers are done with the tile
#pragma unroll
            for (int u = 0; u < WN; ++u) {
                const unsigned idx = threadIdx.x + (unsigned)u * QS_BLOCK;
                ((float4*)sm.wtile)[(idx / (KP / 4)) * (STRIDE / 4) + idx % (KP / 4)] = wreg[u];
            }
            float a[E];
#pragma unroll
            for (int e = 0; e < E; ++e) {
                a[e] = anext[e];
                const qs_u64 kk = kc + lane + (unsigned)e * QS_WARP_SIZE;
                if (sc.present && active && kk < k1) a[e] *= qs_a_scale(sc, item, ob, kk, cache, st);
            }
            __syncthreads();
            if (kc + QS_WR_CHUNK < k1) load_chunk(kc + QS_WR_CHUNK);
#pragma unroll
            for (int e = 0; e < E; ++e) {
                const unsigned r = lane + (unsigned)e * QS_WARP_SIZE;
                if (r < cnt) {
#pragma unroll
                    for (int q = 0; q < KP / 4; ++q) {
                        const float4 w = wt4[r * (STRIDE / 4) + q];
                        acc[4 * q + 0] = fmaf(a[e], w.x, acc[4 * q + 0]);
                        acc[4 * q + 1] = fmaf(a[e], w.y, acc[4 * q + 1]);
                        acc[4 * q + 2] = fmaf(a[e], w.z, acc[4 * q + 2]);
                        acc[4 * q + 3] = fmaf(a[e], w.w, acc[4 * q + 3]);
                    }
                }
            }
        }
    }
    qs_warp_store<KP>(part, acc, lane);

    // ---- D[i, n-slice] R, and C[i, n-slice] R ---------------------------------------------
    qs_u64 n0 = 0, n1 = 0;
    qs_slice(g.n, si, S, &n0, &n1);
    const qs_u32* signs = (const qs_u32*)P.signs_ptr;
#pragma unroll
    for (int p = 0; p < KP; ++p) acc[p] = 0.0f;
    if (active) {
        const bool drow = g.d.order == QS_ORDER_ROW;
        const qs_u64 d_first = qs_out_offset(g.d, item, i, 0);
        if (!drow || !qs_sketch_d_vec<QS_D_FMT, KP>((const qs_u8*)g.d.ptr, d_first, n0, n1, g.d.extent, signs, lane, acc,
                                                     nan_d, inf_d))
        qs_stream_row<QS_D_FMT>((const qs_u8*)g.d.ptr, qs_out_offset(g.d, item, i, 0), drow ? 1 : g.d.ld, n0, n1,
                                g.d.extent, st, lane, QS_WARP_SIZE, [&](qs_u64 j, float v) {
                                    if (!qs_isfinitef(v)) {
                                        nan_d += v != v;
                                        inf_d += v == v;
                                    }
                                    qs_signed_add<KP>(acc, v, signs[j]);
                                });
    }
    qs_warp_store<KP>(part + KP, acc, lane);

    if (g.c.ptr) {
#pragma unroll
        for (int p = 0; p < KP; ++p) acc[p] = 0.0f;
        if (active) {
            const qs_u64 c0 = qs_out_offset(g.c, item, i, 0), cs = g.c.order == QS_ORDER_ROW ? 1 : g.c.ld;
            for (qs_u64 j = n0 + lane; j < n1; j += QS_WARP_SIZE)
                qs_signed_add<KP>(acc, (float)qs_load_checked_rt(g.c, c0 + j * cs, st), signs[j]);
        }
        qs_warp_store<KP>(part + 2 * KP, acc, lane);
    } else if (lane < (unsigned)KP) {
        part[2 * KP + lane] = 0.0;  // no C: nothing to reduce
    }

    nan_d = qs_warp_sum_u64(nan_d);
    inf_d = qs_warp_sum_u64(inf_d);
    if (lane == 0) {
        sm.nonfinite[warp][0] = nan_d;
        sm.nonfinite[warp][1] = inf_d;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        qs_u64 a = 0, b = 0;
        for (int w = 0; w < QS_WARPS_PER_BLOCK; ++w) {
            a += sm.nonfinite[w][0];
            b += sm.nonfinite[w][1];
        }
        qs_u64* counts = (qs_u64*)P.counts_ptr + ((qs_u64)gi * S + si) * 2;
        counts[0] = a;
        counts[1] = b;
    }

    qs_u32* counters = (qs_u32*)P.counters_ptr;
    if (!qs_last_block(&counters[gi], S)) return;

    // ---- group: sum the splits of each row, form y and x, reduce the rows -------------------
    const double alpha = qs_read_scalar(g.alpha) * qs_read_scalar(g.a_tensor_scale) * qs_read_scalar(g.b_tensor_scale);
    const double beta = g.c.ptr ? qs_read_scalar(g.beta) : 0.0;
    const double dsc = qs_read_scalar(g.d_scale);
    const bool dsc_ok = qs_isfinite(dsc) && dsc != 0.0;
    if (!dsc_ok && threadIdx.x == 0) qs_flag(st, QS_STATUS_BAD_SCALAR);
    const qs_u32 k = P.k;
    QsSums rs;
    qs_sums_zero(rs);
    double y = 0.0, x = 0.0;
    if (active && lane < (unsigned)KP) {
        double ys = 0.0, xa = 0.0, xc = 0.0;
        // Batches of 8 splits: 24 independent loads in flight, then the sums in split order
        // (up to QS_MAX_SPLITS = 64 splits cost 8 round trips, not 64 / unroll).
        for (unsigned s0 = 0; s0 < S; s0 += 8) {
            double va[8], vy[8], vc[8];
#pragma unroll
            for (unsigned u = 0; u < 8; ++u) {
                va[u] = vy[u] = vc[u] = 0.0;
                if (s0 + u < S) {
                    const double* ps =
                        (const double*)P.partials_ptr + ((((qs_u64)gi * S + s0 + u) * QS_WARPS_PER_BLOCK + warp) * 3) * KP;
                    va[u] = qs_ldcg_f64(ps + lane);
                    vy[u] = qs_ldcg_f64(ps + KP + lane);
                    vc[u] = qs_ldcg_f64(ps + 2 * KP + lane);
                }
            }
#pragma unroll
            for (unsigned u = 0; u < 8; ++u) {
                if (s0 + u < S) {
                    xa += va[u];
                    ys += vy[u];
                    xc += vc[u];
                }
            }
        }
        double bias_term = 0.0;
        if (g.bias.ptr) {
            bias_term = g.bias.axis == QS_BIAS_COLS ? ((const double*)P.bproj_ptr)[lane]
                                                    : qs_bias_value(g.bias, i, st) * ((const double*)P.rsum_ptr)[lane];
        }
        x = alpha * xa + beta * xc + bias_term;
        y = dsc_ok ? ys / dsc : ys;
        if (lane < k) qs_sums_add(rs, y, x);
    }
    qs_sums_warp_reduce(rs);
    if (lane < QS_MAX_PROBES) {
        const bool use = active && lane < k && qs_isfinite(y) && qs_isfinite(x);
        sm.fy[warp][lane] = use ? y : 0.0;
        sm.fx[warp][lane] = use ? x : 0.0;
    }
    if (lane == 0) {
        sm.sums[warp] = rs;
        qs_worst_none(sm.worst[warp]);
        if (active) {
            QsWorst w;
            w.t = t;
            w.row = row;
            w.cosine = qs_row_rank_cosine(rs);
            w.dot = rs.dot;
            w.prod_sq = rs.prod_sq;
            w.ref_sq = rs.ref_sq;
            sm.worst[warp] = w;
            if (P.row_stats_ptr) {
                double* r3 = (double*)P.row_stats_ptr + t * 3;
                r3[0] = rs.dot;
                r3[1] = rs.prod_sq;
                r3[2] = rs.ref_sq;
            }
        }
    }
    // D's non-finite element counts of this group's blocks (one split per thread).
    const unsigned S_counted = S < QS_MAX_SPLITS ? S : QS_MAX_SPLITS;  // S > max is a flagged launch
    if (threadIdx.x < S_counted) {
        const qs_u64* counts = (const qs_u64*)P.counts_ptr + ((qs_u64)gi * S + threadIdx.x) * 2;
        sm.split_counts[threadIdx.x][0] = qs_ldcg_u64(counts);
        sm.split_counts[threadIdx.x][1] = qs_ldcg_u64(counts + 1);
    }
    __syncthreads();
    QsSketchGroup* groups = (QsSketchGroup*)P.group_ptr;
    if (threadIdx.x == 0) {
        QsSketchGroup& gr = sm.group;
        qs_sums_zero(gr.sums);
        qs_worst_none(gr.worst);
        for (int w = 0; w < QS_WARPS_PER_BLOCK; ++w) {
            qs_sums_merge(gr.sums, sm.sums[w]);
            qs_worst_merge(gr.worst, sm.worst[w]);
        }
        gr.elem_nan = gr.elem_inf = 0;
        for (unsigned s = 0; s < S_counted; ++s) {
            gr.elem_nan += sm.split_counts[s][0];
            gr.elem_inf += sm.split_counts[s][1];
        }
    }
    if (threadIdx.x < QS_MAX_PROBES) {
        double a = 0.0, b = 0.0;
        for (int w = 0; w < QS_WARPS_PER_BLOCK; ++w) {
            a += sm.fy[w][threadIdx.x];
            b += sm.fx[w][threadIdx.x];
        }
        sm.group.y_sum[threadIdx.x] = a;
        sm.group.x_sum[threadIdx.x] = b;
    }
    __syncthreads();
    {
        const qs_u64* src = (const qs_u64*)&sm.group;
        qs_u64* dst = (qs_u64*)&groups[gi];
        for (unsigned w = threadIdx.x; w < sizeof(QsSketchGroup) / 8; w += blockDim.x) dst[w] = src[w];
    }

    if (!qs_last_block(&counters[G], G)) return;

    // ---- the whole check: merge the groups, publish ---------------------------------------------
    // Thread t merges groups t, t + blockDim, ... in order, then a warp butterfly and a fixed
    // warp order: deterministic for a given grid, and G records are read in parallel.
    QsSums tot;
    QsWorst worst;
    qs_sums_zero(tot);
    qs_worst_none(worst);
    qs_u64 en = 0, ei = 0;
    for (unsigned gg = threadIdx.x; gg < G; gg += blockDim.x) {
        QsSums gs;
        QsWorst gw;
        qs_ldcg_copy(&gs, &groups[gg].sums);
        qs_ldcg_copy(&gw, &groups[gg].worst);
        qs_sums_merge(tot, gs);
        qs_worst_merge(worst, gw);
        en += qs_ldcg_u64(&groups[gg].elem_nan);
        ei += qs_ldcg_u64(&groups[gg].elem_inf);
    }
    qs_sums_warp_reduce(tot);
    qs_worst_warp_reduce(worst);
    en = qs_warp_sum_u64(en);
    ei = qs_warp_sum_u64(ei);
    // Fingerprints: warp w takes groups w, w + W, ...; lane p reads probe p (coalesced).
    double fy = 0.0, fx = 0.0;
    if (lane < QS_MAX_PROBES) {
#pragma unroll 4
        for (unsigned gg = warp; gg < G; gg += QS_WARPS_PER_BLOCK) {
            fy += qs_ldcg_f64(&groups[gg].y_sum[lane]);
            fx += qs_ldcg_f64(&groups[gg].x_sum[lane]);
        }
    }
    __syncthreads();  // sm.sums/worst/fy/fx are reused below
    if (lane == 0) {
        sm.sums[warp] = tot;
        sm.worst[warp] = worst;
        sm.nonfinite[warp][0] = en;
        sm.nonfinite[warp][1] = ei;
    }
    if (lane < QS_MAX_PROBES) {
        sm.fy[warp][lane] = fy;
        sm.fx[warp][lane] = fx;
    }
    __syncthreads();
    QsResultSlot* slot = &sm.slot;
    qs_slot_init(slot, P.tag, P.tag2, QS_CHECK_SKETCH);
    if (threadIdx.x == 0) {
        qs_sums_zero(tot);
        qs_worst_none(worst);
        en = ei = 0;
        for (int w = 0; w < QS_WARPS_PER_BLOCK; ++w) {
            qs_sums_merge(tot, sm.sums[w]);
            qs_worst_merge(worst, sm.worst[w]);
            en += sm.nonfinite[w][0];
            ei += sm.nonfinite[w][1];
        }
        qs_slot_put_sums(slot, tot);
        qs_slot_put_worst(slot, worst);
        slot->elem_nan_prod = en;
        slot->elem_inf_prod = ei;
        slot->epoch = epoch;
        slot->probes = k;
        slot->rows_checked = valid ? P.rows.count : 0;
    }
    if (threadIdx.x < QS_MAX_PROBES) {
        double a = 0.0, b = 0.0;
        for (int w = 0; w < QS_WARPS_PER_BLOCK; ++w) {
            a += sm.fy[w][threadIdx.x];
            b += sm.fx[w][threadIdx.x];
        }
        slot->sketch_prod[threadIdx.x] = threadIdx.x < k ? a : 0.0;
        slot->sketch_ref[threadIdx.x] = threadIdx.x < k ? b : 0.0;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        qs_u32 status = qs_take_status(st);
        if (!valid) status |= QS_STATUS_BAD_DESCRIPTOR;
        if (g.activation != QS_ACT_NONE) status |= QS_STATUS_NONLINEAR;
        if (tot.nan_ref + tot.inf_ref > 0) status |= QS_STATUS_REF_NONFINITE;
        slot->status = status;
        qs_rows_advance(P.rows);
    }
    __syncthreads();
    qs_ring_publish(P.ring, slot);
}

#ifndef QS_SKETCH_MIN_BLOCKS
#define QS_SKETCH_MIN_BLOCKS 2
#endif
QS_GLOBAL void __launch_bounds__(QS_BLOCK, QS_SKETCH_MIN_BLOCKS) QS_SKETCH_CHECK(QsSketchParams P) {
    // A malformed launch still runs the counter protocol (so counters stay balanced for the
    // next replay) and reports BAD_DESCRIPTOR instead of metrics.
    const bool valid = P.g.a.format == QS_A_FMT && P.g.d.format == QS_D_FMT && blockDim.x == QS_BLOCK &&
                       P.rows_per_group == QS_WARPS_PER_BLOCK && P.splits == gridDim.y && gridDim.y <= QS_MAX_SPLITS && P.k >= 1 &&
                       P.k <= P.kp && P.g.m > 0 && P.rows.count <= (qs_u64)gridDim.x * QS_WARPS_PER_BLOCK;
    __shared__ QsSketchSmem sm;  // one copy for the three probe-count instantiations
    switch (P.kp) {
        case 8: qs_sketch_check_body<8>(P, valid, sm); break;
        case 16: qs_sketch_check_body<16>(P, valid, sm); break;
        case 32: qs_sketch_check_body<32>(P, valid, sm); break;
        default:
            // No body to run: nothing can be published safely without the partial layout.
            qs_flag(P.status_ptr, QS_STATUS_BAD_DESCRIPTOR);
            break;
    }
}
