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
// Build defines: QS_A_FMT, QS_B_FMT, QS_D_FMT (format ids); optional QS_SKETCH_KP (8, 16 or
// 32): only that padded probe count is compiled. One instantiation instead of three keeps the
// program a third of the size, which matters: the check is bound by instruction-cache misses
// in its serial finishing stages (ncu on an H100), not by its arithmetic. Entries:
//   qs_sketch_prep                 sign words, colsum(R), bias projection (once per seed/N/bias)
//   qs_sketch_wproj_{b}            W_R = op(B)_ref R, and its fragment order (once per weight)
//   qs_sketch_check_{a}_{d}        the per-call check, results into the ring
//   qs_sketch_lean_{a}_{d}         the same check for common calls on CUDA sm_90+ (clusters)
//   qs_sketch_proj_{a}_{d}, qs_sketch_fin_{a}_{d}  the lean check split in two (eager calls)
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

// Runs body(QsKp<kp>{}) for the padded probe count kp: one template instantiation per count
// (only QS_SKETCH_KP's when defined). Any other kp has no body to run, and nothing can be
// published safely without its layout: it flags BAD_DESCRIPTOR.
template <int KP>
struct QsKp {
    static constexpr int V = KP;
};
template <class F>
QS_DEVICE void qs_for_kp(qs_u32 kp, qs_u64 status_ptr, F&& body) {
    switch (kp) {
#if !defined(QS_SKETCH_KP) || QS_SKETCH_KP == 8
        case 8: body(QsKp<8>{}); break;
#endif
#if !defined(QS_SKETCH_KP) || QS_SKETCH_KP == 16
        case 16: body(QsKp<16>{}); break;
#endif
#if !defined(QS_SKETCH_KP) || QS_SKETCH_KP == 32
        case 32: body(QsKp<32>{}); break;
#endif
        default:
            qs_wait_prior_grid();  // an early-started caller waits before any write, this one too
            qs_flag(status_ptr, QS_STATUS_BAD_DESCRIPTOR);
            break;
    }
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

// ---- W_R in mma fragment order (the lean check's A operand) ------------------------------------
// The lean check multiplies W_R^T (probes x k) by rows of A on tensor cores (mma.m16n8k16,
// bf16): W_R is stored once per weight exactly as each lane's A-operand registers, so a lane
// loads a whole fragment as one 16-byte vector and does no conversion. Each f32 element w is
// two bf16 values, pass 0 hi = RN(w) and pass 1 lo = RN(w - hi): |w - hi - lo| <= 2^-17 |w|.
// Order: unit u = kk / 32, step s (a k16 step; two per unit), probe tile mt (16 probes), pass,
// lane (g, t), register r (two bf16, low half first). The k slots of a step map to k's so that
// lane t's four slots {2t, 2t + 1, 2t + 8, 2t + 9} of step s are k = 32 u + 8 t + 4 s + e,
// e = 0..3: the same lane then reads 8 consecutive elements of a row of A (or D) for both
// steps of a unit with one vector load. Register r = 2 (e >> 1) + h holds probe 16 mt + g + 8 h,
// half e & 1 (PTX ISA m16n8k16 A fragment: a[0] (g, 2t..), a[1] (g + 8, 2t..), a[2] (g, 2t + 8..),
// a[3] (g + 8, 2t + 8..)). Tiles: QS_WFRAG_TILES(kp) = ceil(kp / 16); the padding probes of kp = 8
// stay zero. Size: k_dim * tiles * 64 bytes (runtime: abi::wfrag_bytes).
#define QS_WFRAG_TILES(kp) (((kp) + 15) / 16)

QS_DEVICE qs_u64 qs_wfrag_index(qs_u64 kk, unsigned p, unsigned pass, unsigned tiles) {
    const qs_u64 u = kk >> 5;
    const unsigned c = (unsigned)(kk & 31u), t = c >> 3, s = (c >> 2) & 1u, e = c & 3u;
    const unsigned mt = p >> 4, g = p & 7u, h = (p >> 3) & 1u;
    const unsigned lane = 4u * g + t, reg = 2u * (e >> 1) + h;
    return ((((u * 2 + s) * tiles + mt) * 2 + pass) * 32 + lane) * 8 + reg * 2 + (e & 1u);
}

// bf16 code of an f32, round to nearest even (NaN stays NaN).
QS_DEVICE qs_u32 qs_bf16_rn(float v) {
    const qs_u32 b = qs_f32_bits(v);
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;
    return (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
}

QS_DEVICE void qs_wfrag_store(qs_u64 frag_ptr, qs_u64 kk, unsigned p, unsigned tiles, float w) {
    qs_u16* f = (qs_u16*)frag_ptr;
    const qs_u32 hi = qs_bf16_rn(w);
    const qs_u32 lo = qs_bf16_rn(w - qs_f32_from_bits(hi << 16));
    f[qs_wfrag_index(kk, p, 0, tiles)] = (qs_u16)hi;
    f[qs_wfrag_index(kk, p, 1, tiles)] = (qs_u16)lo;
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
                if (lane == (unsigned)p) {
                    out[kk * KP + p] = (float)t;
                    if (P.frag_ptr) qs_wfrag_store(P.frag_ptr, kk, p, QS_WFRAG_TILES(KP), (float)t);
                }
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
            if (k0 + l < K) {
                out[(k0 + l) * KP + p] = (float)s_red[l][p];
                if (P.frag_ptr) qs_wfrag_store(P.frag_ptr, k0 + l, p, QS_WFRAG_TILES(KP), (float)s_red[l][p]);
            }
        }
        __syncthreads();
    }
}

// ---- weight samples ---------------------------------------------------------------------------
// W_R is projected once per weight pointer. Memory can be reused for another tensor (a caching
// allocator, a weight reload, an activation in the B slot): the projection would then be stale
// and every check a false failure. The wproj launch keeps QS_WEIGHT_SAMPLES 4-byte samples of
// B at hashed byte offsets; each check compares them (one warp of one block) and flags
// QS_STATUS_WEIGHT_CHANGED on any difference, so the host re-projects instead of judging.
QS_DEVICE qs_u32 qs_weight_sample(const QsMatrixDesc& b, unsigned i) {
    const qs_u64 bytes = (b.extent * (qs_u64)QsFmt<QS_B_FMT>::BITS + 7) / 8;
    if (bytes < 4) return 0;
    const qs_u8* p = (const qs_u8*)b.ptr + qs_hash3(0x5EED5A11ull, 0, i) % (bytes - 3);
    return (qs_u32)p[0] | ((qs_u32)p[1] << 8) | ((qs_u32)p[2] << 16) | ((qs_u32)p[3] << 24);
}

QS_GLOBAL void __launch_bounds__(QS_BLOCK) QS_SKETCH_WPROJ(QsWprojParams P) {
    if (P.b.format != QS_B_FMT || blockDim.x != QS_BLOCK) {
        qs_flag(P.status_ptr, QS_STATUS_BAD_DESCRIPTOR);
        return;
    }
    if (P.snapshot_ptr && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x < QS_WEIGHT_SAMPLES)
        ((qs_u32*)P.snapshot_ptr)[threadIdx.x] = qs_weight_sample(P.b, threadIdx.x);
    qs_for_kp(P.kp, P.status_ptr, [&](auto k) { qs_wproj_body<decltype(k)::V>(P); });
}

// ================================================================================================
// qs_sketch_check_{a}_{d}: grid (groups, splits <= QS_MAX_SPLITS), QS_BLOCK threads, one warp
// per sampled row (abi.rs SketchGeometry sizes it and its scratch).
//
// Each block projects its rows over one K slice (A W_R) and one N slice (D R and C R) and writes
// f64 partials. On CUDA sm_80+ the A W_R and D R projections
// run on tensor cores with the block's 8 rows as the N = 8 side of mma.sync tiles and the warps
// splitting the slice (see "tensor-core projections" below; D R for bf16, f16 and FP8 D, other
// D formats take the scalar path). Elsewhere (HIP, older CUDA) a warp projects its row: A W_R
// with W_R staged through shared memory in software-pipelined chunks, D R with vector loads and
// sign flips. The last split block of a group (last-block-done, per-group counter) finishes the
// group's rows (y, x, per-row sums, rank keys) and adds them to the check's totals; the last
// group's block (a second counter) reads the totals and writes the ring slot: one launch, no
// host sync, graph-replay safe (counters and totals reset by the blocks that finish them).
// Per-row values are summed in split order (deterministic); the whole-check totals are atomic
// adds of the groups, so their last bits depend on group order (~1e-16 relative). Atomics in
// the projections instead (red.global per row and probe) were measured 2x slower at 256 rows:
// the L2 atomic units, not the loads, became the limit.
// Measured (H100): the old two-stage merge of f64 partials took ~20 of ~32 us per check, in
// its serial, cold-fetched finishing code; see "finishing stages" below.
// ================================================================================================
#define QS_WR_CHUNK 128

// The sampled row a warp owns in the scalar world (warp w <-> row w of the group).
struct QsRowInfo {
    qs_u64 item, i;
    qs_u32 active, reserved;
};

struct QsSketchSmem {
    // Finishing stages: per-warp (= per-row) sums, counts and rank keys, the fingerprints of the
    // group's rows, the check's scalars, and the slot being assembled.
    double scalar[5];  // alpha, a tensor scale, b tensor scale, beta, d_scale
    double rowbias[QS_WARPS_PER_BLOCK];  // row-axis bias of each warp's row
    double rsum[QS_WARPS_PER_BLOCK][5];   // dot, prod_sq, ref_sq, diff_sq, max_abs_err
    qs_u64 rcnt[QS_WARPS_PER_BLOCK][6];   // finite, pairs, nan_prod, inf_prod, nan_ref, inf_ref
    qs_u64 rkey[QS_WARPS_PER_BLOCK];      // ~rank key, 0 = no row
    double fy[QS_WARPS_PER_BLOCK][QS_MAX_PROBES];
    double fx[QS_WARPS_PER_BLOCK][QS_MAX_PROBES];
    double share[QS_WARPS_PER_BLOCK][3][QS_MAX_PROBES];  // a lone row's split sums per warp
    qs_u64 totals[sizeof(QsSketchTotals) / 8];
#if QS_HAVE_MMA
    // Tensor-core path: each warp's f32 projections of the block's rows, [warp][row][probe],
    // summed over the warps in warp order.
    float red[QS_WARPS_PER_BLOCK][QS_WARPS_PER_BLOCK][QS_MAX_PROBES];
    QsRowInfo rinfo[QS_WARPS_PER_BLOCK];
#else
    // A W_R: a chunk of QS_WR_CHUNK rows of W_R, row stride kp + 4 floats (16-byte aligned rows;
    // lanes reading consecutive rows hit distinct banks).
    float wtile[QS_WR_CHUNK * (QS_MAX_PROBES + 4)];
#endif
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

// ---- tensor-core projections (CUDA sm_80+, QS_HAVE_MMA) ----------------------------------------
// The block's 8 sampled rows are the N = 8 columns of warp-level mma.sync tiles, the probes
// their M rows, and the block's K / N slice is the reduction dimension, split between the warps
// in chunks (warp w takes chunks w, w + 8, ...). Each warp's 8 x kp partial projections go to
// shared memory and are summed over the warps in warp order (deterministic for a given grid).
//
// D R (m16n8k16, bf16 or f16 inputs, f32 accumulation): A = R^T (probes x columns, +-1, exact),
// B = D^T (columns x rows). bf16 and f16 D are used as stored, FP8 D is converted to f16
// exactly. Products are exact; only the f32 accumulation order differs from the scalar path.
// Column slots of one k16 step: thread t owns 8 (16-bit D) or 16 (FP8) consecutive columns of
// a chunk and loads them as one 16-byte vector; step s gives slots 2t, 2t+1 to its columns
// 4s, 4s+1 and slots 2t+8, 2t+9 to 4s+2, 4s+3 (any bijection works if A and B agree).
// Probe p = m + 16 T (tile T); the sign fragments come from the sign words by a byte permute:
// z = word << (7 - g) puts the sign of probe g + 8q at bit 7 of byte q, prmt replicates it
// over the byte and a mask turns 0x3F80 (+1) into 0xBF80 (-1). Per 16 columns x 8 rows x 32
// probes: 8 sign registers (prmt + lop3 each) and 2 mma, against 16 x 32 x 4 = 2048
// integer/float operations (128 per lane x 16 lanes' worth) in the scalar qs_signed_add path.
//
// A W_R (m16n8k8 tf32, f32 accumulation): A = W_R^T (probes x k), B = A_ref^T (k x rows).
// W_R (f32) is split as hi = its top 19 bits (exact tf32) + lo = w - hi (exact in f32, passed as
// tf32, i.e. truncated to 11 significant bits): |error| < 2^-20 |w| per element. A_ref is exact
// in tf32 for every element format but f32 / i32 (11 significant bits at most); scaled or f32
// A is split the same way (3 mma: hi.hi, lo.hi, hi.lo). Thread t owns the 8 consecutive k's
// 8t..8t+7 of a 32-k chunk: step s gives slot t to k = 8t + 2s and slot t + 4 to 8t + 2s + 1,
// and its probes are kp/8 consecutive ones (p = (kp/8) g + 2T + h for m = g + 8h of tile T), so
// W_R rows load as float4 / float2 / float. With a batched W_R (one per batch item), rows of
// different items run in separate passes, one per distinct item in row order.
#if QS_HAVE_MMA
template <int DF>
struct QsDMma {
    static constexpr bool OK = DF == QS_FMT_BF16 || DF == QS_FMT_F16 || DF == QS_FMT_E4M3FN ||
                               DF == QS_FMT_E4M3FNUZ || DF == QS_FMT_E5M2 || DF == QS_FMT_E5M2FNUZ;
    static constexpr bool F16 = DF != QS_FMT_BF16;
    static constexpr int BITS = QsFmt<DF>::BITS;
    static constexpr int CPT = 128 / BITS;  // columns per thread per chunk: one 16-byte vector
    static constexpr int WORDS = CPT / 2;   // 16-bit pairs per chunk
    static constexpr qs_u32 ONE2 = F16 ? 0x3C003C00u : 0x3F803F80u;   // +1, +1
    static constexpr qs_u32 EXP2 = F16 ? 0x7C007C00u : 0x7F807F80u;   // exponent fields
    static constexpr qs_u32 ELSB2 = F16 ? 0x04000400u : 0x00800080u;  // their lowest bits
};

// Sign fragment: low half +-1 with the sign of probe g + 8q of column x, high half of column y
// (x, y: sign words shifted left by 7 - g).
// q is a constant after unrolling, so the selector is an immediate.
template <qs_u32 ONE2>
QS_DEVICE qs_u32 qs_sign_pair(qs_u32 x, qs_u32 y, unsigned q) {
    return (qs_prmt(x, y, ((12u + q) << 12) | ((8u + q) << 4)) & 0x80008000u) | ONE2;
}

// The +-1 A fragment of probe tile T (probes 16 T .. 16 T + 15) for one k16 step whose four
// column pairs have sign words z0..z3 (shifted left by 7 - g): a[0], a[2] probe g + 16 T, a[1],
// a[3] probe g + 8 + 16 T (zero when kp = 8).
template <int KP, qs_u32 ONE2>
QS_DEVICE void qs_sign_frags(qs_u32 z0, qs_u32 z1, qs_u32 z2, qs_u32 z3, unsigned T, qs_u32 (&a)[4]) {
    a[0] = qs_sign_pair<ONE2>(z0, z1, 2 * T);
    a[2] = qs_sign_pair<ONE2>(z2, z3, 2 * T);
    a[1] = a[3] = 0u;
    if constexpr (KP > 8) {
        a[1] = qs_sign_pair<ONE2>(z0, z1, 2 * T + 1);
        a[3] = qs_sign_pair<ONE2>(z2, z3, 2 * T + 1);
    }
}

// Non-finite elements among N 16-bit pairs of D: `nonfinite` gathers an exponent-all-ones test
// over the calls (one add per word); only when it fires are the NaN / Inf elements of these
// words counted exactly, and it is cleared (rare; zero padding is finite).
template <int DF, int N>
QS_DEVICE void qs_d_nonfinite(const qs_u32 (&w)[N], qs_u32& nonfinite, qs_u64& nan_d, qs_u64& inf_d) {
    using M = QsDMma<DF>;
#pragma unroll
    for (int i = 0; i < N; ++i) nonfinite |= (w[i] & M::EXP2) + M::ELSB2;
    if ((nonfinite & 0x80008000u) == 0) return;
    constexpr qs_u32 EXPH = M::EXP2 & 0xFFFFu, MANH = M::F16 ? 0x03FFu : 0x007Fu;
#pragma unroll
    for (int i = 0; i < N; ++i) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const qs_u32 x = (w[i] >> (16 * h)) & 0xFFFFu;
            if ((x & EXPH) == EXPH) {
                nan_d += (x & MANH) != 0;
                inf_d += (x & MANH) == 0;
            }
        }
    }
    nonfinite = 0;
}

// 16 bytes of D codes as 16-bit pairs of the mma input format.
template <int DF>
QS_DEVICE void qs_d_words(const uint4 q, qs_u32 (&w)[QsDMma<DF>::WORDS]) {
    if constexpr (QsDMma<DF>::BITS == 16) {
        w[0] = q.x;
        w[1] = q.y;
        w[2] = q.z;
        w[3] = q.w;
    } else {
        const qs_u32 src[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            if constexpr (DF == QS_FMT_E5M2) {
                // e5m2 is the high byte of the f16 with the same value.
                w[2 * i] = qs_prmt(src[i], 0u, 0x1404u);
                w[2 * i + 1] = qs_prmt(src[i], 0u, 0x3424u);
            }
#if QS_HAVE_FP8_CVT
            else if constexpr (DF == QS_FMT_E4M3FN) {
                w[2 * i] = qs_f16x2_from_e4m3x2(src[i] & 0xFFFFu);
                w[2 * i + 1] = qs_f16x2_from_e4m3x2(src[i] >> 16);
            }
#endif
            else {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const qs_u32 c0 = (src[i] >> (16 * h)) & 0xFFu, c1 = (src[i] >> (16 * h + 8)) & 0xFFu;
                    w[2 * i + h] = qs_f16x2_from_f32(QsFmt<DF>::f32(c0), QsFmt<DF>::f32(c1));
                }
            }
        }
    }
}

// D codes of columns [j, j + CPT) of one row (element j at first + j * stride): one vector load
// when contiguous, aligned and in bounds, else element by element (columns >= n1 read as 0,
// elements past the extent as 0 with the check flagged).
template <int DF>
QS_DEVICE uint4 qs_d_codes(const qs_u8* base, qs_u64 first, qs_u64 stride, qs_u64 j, qs_u64 n1, qs_u64 extent,
                           qs_u64 st) {
    constexpr int BITS = QsDMma<DF>::BITS, CPT = QsDMma<DF>::CPT;
    if (stride == 1 && j + CPT <= n1 && first + j + CPT <= extent) {
        const qs_u8* p = base + ((first + j) * BITS) / 8;
        if (((qs_u64)p & 15u) == 0) return *(const uint4*)p;
    }
    qs_u32 w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
    for (int e = 0; e < CPT; ++e) {
        if (j + e < n1) {
            const qs_u64 off = first + (j + e) * stride;
            qs_u32 code = 0;
            if (off < extent) {
                code = qs_load_code_bits<BITS>(base, off);
            } else {
                qs_flag(st, QS_STATUS_OUT_OF_BOUNDS);
            }
            w[(e * BITS) / 32] |= code << ((e * BITS) % 32);
        }
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// Sums of each warp's [row][probe] projections over the warps, in warp order, into the f64
// partials (`which`: 0 = A W_R, 1 = D R) of the block's rows.
template <int KP>
QS_DEVICE void qs_mma_reduce(QsSketchSmem& sm, double* blk, unsigned which) {
    __syncthreads();
    for (unsigned e = threadIdx.x; e < QS_WARPS_PER_BLOCK * KP; e += QS_BLOCK) {
        const unsigned row = e / KP, p = e % KP;
        double s = 0.0;
#pragma unroll
        for (int w = 0; w < QS_WARPS_PER_BLOCK; ++w) s += (double)sm.red[w][row][p];
        blk[((qs_u64)row * 3 + which) * KP + p] = s;
    }
    __syncthreads();
}

template <int KP>
QS_DEVICE void qs_mma_d(const QsSketchParams& P, QsSketchSmem& sm, double* blk, qs_u64 n0, qs_u64 n1, unsigned lane,
                        unsigned warp, qs_u64& nan_d, qs_u64& inf_d) {
    using M = QsDMma<QS_D_FMT>;
    constexpr int NT = KP == 32 ? 2 : 1;  // 16-probe tiles
    constexpr int CPT = M::CPT, CHUNK = 4 * CPT;
    const QsGemmDesc& g = P.g;
    const qs_u64 st = P.status_ptr;
    const unsigned gq = lane >> 2, tq = lane & 3u;
    const QsRowInfo rg = sm.rinfo[gq];
    const qs_u64 first = rg.active ? qs_out_offset(g.d, rg.item, rg.i, 0) : 0;
    const qs_u64 stride = g.d.order == QS_ORDER_ROW ? 1 : g.d.ld;
    const qs_u8* base = (const qs_u8*)g.d.ptr;
    const qs_u32* signs = (const qs_u32*)P.signs_ptr;
    float acc[NT][4];
#pragma unroll
    for (int T = 0; T < NT; ++T) acc[T][0] = acc[T][1] = acc[T][2] = acc[T][3] = 0.0f;
    qs_u32 nonfinite = 0;
    // Two chunks per iteration: both chunks' loads are in flight before any math (more measured
    // slower on an H100: more code on a path bound by instruction issue, not by round trips).
    for (qs_u64 c0 = n0 + (qs_u64)warp * CHUNK; c0 < n1; c0 += 2ull * QS_WARPS_PER_BLOCK * CHUNK) {
        uint4 q[2];
        qs_u32 sw[2][CPT];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const qs_u64 j = c0 + (qs_u64)u * QS_WARPS_PER_BLOCK * CHUNK + (qs_u64)CPT * tq;
            q[u] = make_uint4(0u, 0u, 0u, 0u);
            if (rg.active && j < n1) q[u] = qs_d_codes<QS_D_FMT>(base, first, stride, j, n1, g.d.extent, st);
            if (j + CPT <= n1) {
                const uint4* s4 = (const uint4*)(signs + j);
#pragma unroll
                for (int i = 0; i < CPT / 4; ++i) {
                    const uint4 x = s4[i];
                    sw[u][4 * i] = x.x;
                    sw[u][4 * i + 1] = x.y;
                    sw[u][4 * i + 2] = x.z;
                    sw[u][4 * i + 3] = x.w;
                }
            } else {
#pragma unroll
                for (int e = 0; e < CPT; ++e) sw[u][e] = j + e < n1 ? signs[j + e] : 0u;
            }
        }
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            qs_u32 w[M::WORDS];
            qs_d_words<QS_D_FMT>(q[u], w);
            qs_d_nonfinite<QS_D_FMT>(w, nonfinite, nan_d, inf_d);
            qs_u32 z[CPT];
#pragma unroll
            for (int c = 0; c < CPT; ++c) z[c] = sw[u][c] << (7u - gq);
#pragma unroll
            for (int s = 0; s < M::WORDS / 2; ++s) {
#pragma unroll
                for (int T = 0; T < NT; ++T) {
                    qs_u32 a[4];
                    qs_sign_frags<KP, M::ONE2>(z[4 * s], z[4 * s + 1], z[4 * s + 2], z[4 * s + 3], T, a);
                    qs_mma_16bit<M::F16>(acc[T], a[0], a[1], a[2], a[3], w[2 * s], w[2 * s + 1]);
                }
            }
        }
    }
    // C fragment: (probe g + 16T [+ 8], row 2t [+ 1]).
#pragma unroll
    for (int T = 0; T < NT; ++T) {
        const unsigned p = gq + 16u * T;
        sm.red[warp][2 * tq][p] = acc[T][0];
        sm.red[warp][2 * tq + 1][p] = acc[T][1];
        if constexpr (KP > 8) {
            sm.red[warp][2 * tq][p + 8] = acc[T][2];
            sm.red[warp][2 * tq + 1][p + 8] = acc[T][3];
        }
    }
    qs_mma_reduce<KP>(sm, blk, 1);
}

// tf32 pieces of an f32 value: hi = top 19 bits (exact), lo = v - hi (exact; read as tf32).
QS_DEVICE void qs_tf32_split(float v, qs_u32& hi, qs_u32& lo) {
    hi = qs_f32_bits(v) & 0xFFFFE000u;
    lo = qs_f32_bits(v - qs_f32_from_bits(hi));
}

// Elements k .. k + 7 of one row of A (element k at first + k * cs), decoded; k's at or past k1
// read as 0, elements past the extent as 0 with the check flagged.
template <int AF>
QS_DEVICE void qs_a_load8(const qs_u8* base, qs_u64 first, qs_u64 cs, qs_u64 k, qs_u64 k1, qs_u64 extent, qs_u64 st,
                          float (&a)[8]) {
    constexpr int BITS = QsFmt<AF>::BITS;
    constexpr qs_u64 ALIGN_BITS = BITS * 8 < 128 ? BITS * 8 : 128;  // 8 elements, at most 16 bytes
    if (cs == 1 && k + 8 <= k1 && first + k + 8 <= extent &&
        (((qs_u64)base * 8 + (first + k) * BITS) & (ALIGN_BITS - 1)) == 0) {
        const qs_u8* p = base + ((first + k) * BITS) / 8;
        qs_u32 w[8 * BITS / 32 > 0 ? 8 * BITS / 32 : 1];
        if constexpr (BITS == 4) {
            w[0] = *(const qs_u32*)p;
        } else if constexpr (BITS == 8) {
            const uint2 x = *(const uint2*)p;
            w[0] = x.x;
            w[1] = x.y;
        } else {
#pragma unroll
            for (int v = 0; v < BITS / 16; ++v) {
                const uint4 x = ((const uint4*)p)[v];
                w[4 * v] = x.x;
                w[4 * v + 1] = x.y;
                w[4 * v + 2] = x.z;
                w[4 * v + 3] = x.w;
            }
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const qs_u32 word = w[(e * BITS) / 32];
            const qs_u32 code = BITS == 32 ? word : (word >> ((e * BITS) % 32)) & ((1u << (BITS & 31)) - 1u);
            a[e] = QsFmt<AF>::f32(code);
        }
        return;
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        a[e] = 0.0f;
        if (k + e < k1) {
            const qs_u64 off = first + (k + e) * cs;
            if (off < extent) {
                a[e] = qs_load_f32<AF>(base, off);
            } else {
                qs_flag(st, QS_STATUS_OUT_OF_BOUNDS);
            }
        }
    }
}

template <int KP>
QS_DEVICE void qs_mma_a(const QsSketchParams& P, QsSketchSmem& sm, double* blk, unsigned lane, unsigned warp,
                        unsigned si, unsigned S) {
    constexpr int NT = KP == 32 ? 2 : 1;  // 16-probe tiles
    constexpr int PPT = KP / 8;           // probes per thread per k (consecutive)
    constexpr int CHUNK = 32;
    // Element formats with at most 11 significant bits are exact in tf32.
    constexpr bool A_EXACT = QS_A_FMT != QS_FMT_F32 && QS_A_FMT != QS_FMT_I32;
    const QsGemmDesc& g = P.g;
    const qs_u64 st = P.status_ptr;
    const unsigned gq = lane >> 2, tq = lane & 3u;
    const QsRowInfo rg = sm.rinfo[gq];
    qs_u64 k0, k1;
    qs_slice(g.k, si, S, &k0, &k1);
    const QsOpStrides os = qs_op_strides(g.a);
    const QsScaleLookup sc = qs_scale_lookup(g.a_scale);
    const bool split_a = !A_EXACT || sc.present;
    const bool scale_per8 = sc.present && sc.bi.d % 8u == 0;  // one scale per thread's 8 k's
    const qs_u64 ob = (rg.active && sc.present) ? qs_fastdiv(rg.i, sc.bo) : 0;
    const qs_u64 a_first = rg.item * g.a.batch_stride + rg.i * os.rs;
    const qs_u8* abase = (const qs_u8*)g.a.ptr;
    QsScaleCache cache;
    cache.ib = ~0ull;
    cache.s = 1.0f;
    float acc[NT][4];
#pragma unroll
    for (int T = 0; T < NT; ++T) acc[T][0] = acc[T][1] = acc[T][2] = acc[T][3] = 0.0f;

    // One pass per distinct W_R among the active rows. A shared W_R (the usual case) takes one
    // pass for the first active row without the pairwise search (ncu on an H100: that search was
    // a fifth of the warp instructions of a 256-row check).
    const bool shared_wr = P.wr_batch_stride == 0;
    for (unsigned pr = 0; pr < QS_WARPS_PER_BLOCK; ++pr) {
        const QsRowInfo rp = sm.rinfo[pr];
        if (!rp.active) continue;
        if (!shared_wr) {
            bool seen = false;
            for (unsigned q = 0; q < pr; ++q) {
                const QsRowInfo rq = sm.rinfo[q];
                seen = seen || (rq.active && rq.item == rp.item);
            }
            if (seen) continue;
        }
        const bool use = rg.active && (shared_wr || rg.item == rp.item);
        const float* wr = (const float*)P.wr_ptr + rp.item * P.wr_batch_stride;
        for (qs_u64 kc = k0 + (qs_u64)warp * CHUNK; kc < k1; kc += (qs_u64)QS_WARPS_PER_BLOCK * CHUNK) {
            const qs_u64 kt = kc + 8u * tq;
            const bool whole = kt + 8 <= k1;  // one compare for the usual whole chunk
            float wv[8][PPT];
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const qs_u64 k = kt + e;
#pragma unroll
                for (int h = 0; h < PPT; ++h) wv[e][h] = 0.0f;
                if (whole || k < k1) {
                    const float* src = wr + k * KP + (qs_u64)PPT * gq;
                    if constexpr (PPT == 4) {
                        const float4 x = *(const float4*)src;
                        wv[e][0] = x.x;
                        wv[e][1] = x.y;
                        wv[e][2] = x.z;
                        wv[e][3] = x.w;
                    } else if constexpr (PPT == 2) {
                        const float2 x = *(const float2*)src;
                        wv[e][0] = x.x;
                        wv[e][1] = x.y;
                    } else {
                        wv[e][0] = *src;
                    }
                }
            }
            float av[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) av[e] = 0.0f;
            if (use && kt < k1) {
                qs_a_load8<QS_A_FMT>(abase, a_first, os.cs, kt, k1, g.a.extent, st, av);
                if (sc.present) {
                    if (scale_per8) {
                        const float s = qs_a_scale(sc, rg.item, ob, kt, cache, st);
#pragma unroll
                        for (int e = 0; e < 8; ++e) av[e] *= s;
                    } else {
#pragma unroll
                        for (int e = 0; e < 8; ++e)
                            if (kt + e < k1) av[e] *= qs_a_scale(sc, rg.item, ob, kt + e, cache, st);
                    }
                }
            }
#pragma unroll
            for (int s = 0; s < 4; ++s) {
                qs_u32 b0h, b0l, b1h, b1l;
                if (split_a) {
                    qs_tf32_split(av[2 * s], b0h, b0l);
                    qs_tf32_split(av[2 * s + 1], b1h, b1l);
                } else {
                    b0h = qs_f32_bits(av[2 * s]);
                    b1h = qs_f32_bits(av[2 * s + 1]);
                    b0l = b1l = 0u;
                }
#pragma unroll
                for (int T = 0; T < NT; ++T) {
                    // a0 (m = g, slot t), a1 (m = g + 8, slot t), a2 (m = g, slot t + 4), a3 (m = g + 8, slot t + 4)
                    qs_u32 h0, l0, h1 = 0u, l1 = 0u, h2, l2, h3 = 0u, l3 = 0u;
                    qs_tf32_split(wv[2 * s][PPT >= 2 ? 2 * T : 0], h0, l0);
                    qs_tf32_split(wv[2 * s + 1][PPT >= 2 ? 2 * T : 0], h2, l2);
                    if constexpr (PPT >= 2) {
                        qs_tf32_split(wv[2 * s][2 * T + 1], h1, l1);
                        qs_tf32_split(wv[2 * s + 1][2 * T + 1], h3, l3);
                    }
                    qs_mma_tf32(acc[T], h0, h1, h2, h3, b0h, b1h);
                    qs_mma_tf32(acc[T], l0, l1, l2, l3, b0h, b1h);
                    if (split_a) qs_mma_tf32(acc[T], h0, h1, h2, h3, b0l, b1l);
                }
            }
        }
        if (shared_wr) break;
    }
    // C fragment: (probe PPT g + 2T [+ 1], row 2t [+ 1]).
#pragma unroll
    for (int T = 0; T < NT; ++T) {
        const unsigned p = PPT * gq + (PPT >= 2 ? 2u * T : 0u);
        sm.red[warp][2 * tq][p] = acc[T][0];
        sm.red[warp][2 * tq + 1][p] = acc[T][1];
        if constexpr (PPT >= 2) {
            sm.red[warp][2 * tq][p + 1] = acc[T][2];
            sm.red[warp][2 * tq + 1][p + 1] = acc[T][3];
        }
    }
    qs_mma_reduce<KP>(sm, blk, 0);
}
#endif

// ---- stage timing (experiment builds: QUANTSHADOW_KERNEL_DEFINES=QS_SKETCH_TIMING=1) ----------
// The last block prints, per launch, nanoseconds from the first block's start to: the last
// block's projections done, the group merge done, the final merge done, the ring claimed, the
// slot published. CUDA only (%globaltimer); printf costs time itself, so only the deltas count.
#if defined(QS_SKETCH_TIMING) && defined(QS_CUDA)
__device__ qs_u64 qs_tm_start = ~0ull;
__device__ qs_u64 qs_tm_proj = 0;
__device__ qs_u64 qs_tm_last_start = 0;
__device__ qs_u64 qs_tm_a = 0;
QS_DEVICE qs_u64 qs_tm_now() {
    qs_u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#define QS_TM_BLOCK_START()                        \
    if (threadIdx.x == 0) {                        \
        const qs_u64 now_ = qs_tm_now();           \
        atomicMin(&qs_tm_start, now_);             \
        atomicMax(&qs_tm_last_start, now_);        \
    }
#define QS_TM_A_DONE() \
    if (threadIdx.x == 0) atomicMax(&qs_tm_a, qs_tm_now())
#define QS_TM_PROJ_DONE() \
    if (threadIdx.x == 0) atomicMax(&qs_tm_proj, qs_tm_now())
#define QS_TM_MARK(var) \
    const qs_u64 var = qs_tm_now()
// det: 0 in place, 1 detached; the lean kernel adds 2. QS_SKETCH_TIMING=2 also prints the
// last block's stage marks as absolute %globaltimer values (QS_TIMING_ABS): with many checks at
// once (a decode graph's end) the shared first-block start above mixes them up.
#if QS_SKETCH_TIMING == 2
#define QS_TM_ABS(group_done, final_done, claimed)                                                    \
    printf("QS_TIMING_ABS n %llu k %llu group %llu final %llu claim %llu publish %llu\n", P.g.n, P.g.k, \
           group_done, final_done, claimed, qs_tm_now())
#else
#define QS_TM_ABS(group_done, final_done, claimed) ((void)0)
#endif
// The split check's projections (no last block of their own): the last block to end prints
// the grid's latest start, loop end (thread 0's) and end, and its own thread 0's marks (body
// entered, W_R and sign loads issued, its rows drawn, the barrier after them, loop end, end),
// all from the grid's first start.
__device__ unsigned qs_tm_proj_blocks = 0;
QS_DEVICE void qs_split_proj_timing(qs_u64 begin, qs_u64 issued, qs_u64 drawn_own, qs_u64 rows_drawn, qs_u64 loop_done,
                                    qs_u64 n, qs_u64 k) {
    __syncthreads();  // the block's stores issued
    if (threadIdx.x != 0) return;
    const qs_u64 end = qs_tm_now();
    atomicMax(&qs_tm_proj, end);
    __threadfence();
    if (atomicAdd(&qs_tm_proj_blocks, 1u) + 1 != gridDim.x * gridDim.y) return;
    const qs_u64 s0 = qs_tm_start;
    printf("QS_PROJ_STAGES af %d n %llu k %llu last_start %llu loop_max %llu end_max %llu own: begin %llu issued %llu "
           "drawn_own %llu drawn %llu loop %llu end %llu\n",
           QS_A_FMT, n, k, qs_tm_last_start - s0, qs_tm_a - s0, qs_tm_proj - s0, begin - s0, issued - s0, drawn_own - s0,
           rows_drawn - s0, loop_done - s0, end - s0);
    qs_tm_start = ~0ull;
    qs_tm_proj = 0;
    qs_tm_last_start = 0;
    qs_tm_a = 0;
    qs_tm_proj_blocks = 0;
}
#define QS_TM_REPORT(group_done, final_done, claimed, kernel)                                                 \
    if (threadIdx.x == 0) {                                                                                  \
        QS_TM_ABS(group_done, final_done, claimed);                                                          \
        const qs_u64 s0 = qs_tm_start, end = qs_tm_now();                                                    \
        printf("QS_TIMING af %d m %llu n %llu k %llu det %d last_start %llu a %llu proj %llu group %llu final %llu " \
               "claim %llu publish %llu\n",                                                                     \
               QS_A_FMT, P.g.m, P.g.n, P.g.k, (int)(P.packed_ptr != 0) + (kernel), qs_tm_last_start - s0, qs_tm_a - s0, qs_tm_proj - s0, group_done - s0, final_done - s0,       \
               claimed - s0, end - s0);                                                                      \
        qs_tm_start = ~0ull;                                                                                 \
        qs_tm_proj = 0;                                                                                      \
        qs_tm_last_start = 0;                                                                                \
        qs_tm_a = 0;                                                                                         \
    }
#else
#define QS_TM_BLOCK_START() ((void)0)
#define QS_TM_PROJ_DONE() ((void)0)
#define QS_TM_A_DONE() ((void)0)
#define QS_TM_MARK(var) const qs_u64 var = 0
#define QS_TM_REPORT(group_done, final_done, claimed, kernel) ((void)(group_done + final_done + claimed))
#endif

// ---- finishing stages ----------------------------------------------------------------------
// They run once per group (the group's last split block) and once per check (the last group),
// on one block each, so their instructions come cold from L2 every launch: ncu and stage
// timestamps on an H100 put ~20 us of a ~32 us check in the old finishing code (6k SASS
// instructions of struct merges, split loops and inlined format switches). These are written to
// be short: one batch of loads per 8 splits, one butterfly per row value, and the whole-check
// totals as atomics of the groups instead of a second merge of group records.

// A scalar of the check, and a row-axis bias value: one out-of-line copy of the run-time
// format decode each. Arguments by value: a reference into the kernel's parameter space would
// make every thread copy the whole parameter block to local memory first (ncu on an H100:
// 49 MB of local stores per 256-row check, twice the check's time).
__device__ __noinline__ double qs_sketch_scalar(QsScalar s) { return qs_read_scalar(s); }

__device__ __noinline__ double qs_sketch_row_bias(QsBiasDesc b, qs_u64 i, qs_u64 st) { return qs_bias_value(b, i, st); }

// Ranking key of a row: lower cosine first, then lower sample position (compare_matrix's
// tie rule). The cosine is ranked at f32 resolution (its rounding is monotonic); the slot
// reports the worst row's f64 values.
QS_DEVICE qs_u64 qs_sketch_rank_key(double cosine, qs_u64 t) {
    const qs_u32 b = qs_f32_bits((float)cosine);
    const qs_u32 ordered = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((qs_u64)ordered << 32) | (t & 0xFFFFFFFFull);
}

// Adds one row's (A W_R, D R, C R) partials of splits first, first + step, ... (8 of them, those
// below S) to xa, ya, xc in that order, with all 24 loads in flight before any addition.
template <int KP>
QS_DEVICE void qs_add_splits8(const double* base, unsigned first, unsigned step, unsigned S, qs_u64 split_stride,
                              bool has_c, double& xa, double& ya, double& xc) {
    double va[8], vy[8], vc[8];
#pragma unroll
    for (unsigned u = 0; u < 8; ++u) {
        const unsigned s = first + u * step;
        const double* ps = base + s * split_stride;
        const bool in = s < S;
        va[u] = in ? qs_ldcg_f64(ps) : 0.0;
        vy[u] = in ? qs_ldcg_f64(ps + KP) : 0.0;
        vc[u] = in && has_c ? qs_ldcg_f64(ps + 2 * KP) : 0.0;
    }
#pragma unroll
    for (unsigned u = 0; u < 8; ++u) {
        xa += va[u];
        ya += vy[u];
        xc += vc[u];
    }
}

// Before the rows are finished: the check's scalars, and each warp's row-axis bias. Everything
// that calls out of line or branches per lane happens here, before a barrier, so the
// butterflies of qs_sketch_finish_rows run converged (no per-shuffle collective fix-up code).
QS_DEVICE void qs_sketch_finish_prologue(const QsSketchParams& P, double* scalar, double* rowbias, qs_u64 row,
                                         bool active, unsigned lane, unsigned warp) {
    const QsGemmDesc& g = P.g;
    if (warp == 0 && lane < 5) {
        // 0 alpha, 1 A tensor scale, 2 B tensor scale, 3 beta (only with C), 4 d_scale.
        const QsScalar sc = lane == 0 ? g.alpha : lane == 1 ? g.a_tensor_scale : lane == 2 ? g.b_tensor_scale
                                                    : lane == 3 ? g.beta
                                                                : g.d_scale;
        scalar[lane] = lane == 3 && !g.c.ptr ? 0.0 : qs_sketch_scalar(sc);
    }
    if (lane == 0) {
        rowbias[warp] = active && g.bias.ptr && g.bias.axis != QS_BIAS_COLS
                               ? qs_sketch_row_bias(g.bias, row % g.m, P.status_ptr)
                               : 0.0;
    }
}

// Warp w's row (sample position t) from its projections (lane p: probe p's A W_R, D R and C R
// sums): the row's sums, counts, fingerprints and rank key, added over the block's warps to the
// check's totals. After qs_sketch_finish_prologue and a barrier; every thread calls it.
template <int KP>
QS_DEVICE void qs_sketch_finish_rows(const QsSketchParams& P, QsSketchSmem& sm, qs_u64 t, qs_u64 row, bool active,
                                     unsigned lane, unsigned warp, double xa, double ya, double xc) {
    const QsGemmDesc& g = P.g;
    const qs_u32 k = P.k;
    const double alpha = sm.scalar[0] * sm.scalar[1] * sm.scalar[2], beta = sm.scalar[3], dsc = sm.scalar[4];
    const bool dsc_ok = qs_isfinite(dsc) && dsc != 0.0;
    if (!dsc_ok && threadIdx.x == 0) qs_flag(P.status_ptr, QS_STATUS_BAD_SCALAR);
    const bool use = active && lane < k;
    const unsigned pl = lane < (unsigned)QS_MAX_PROBES ? lane : 0u;
    double bias_term = 0.0;
    if (g.bias.ptr) {
        bias_term = g.bias.axis == QS_BIAS_COLS ? ((const double*)P.bproj_ptr)[pl]
                                                : sm.rowbias[warp] * ((const double*)P.rsum_ptr)[pl];
    }
    const double xv = alpha * xa + beta * xc + bias_term;
    const double yv = dsc_ok ? ya / dsc : ya;
    const double x = use ? xv : 0.0, y = use ? yv : 0.0;
    QS_SYNCWARP();
    const bool fin = use && qs_isfinite(y) && qs_isfinite(x);
    const double d = fin ? y - x : 0.0;
    double v[5] = {fin ? y * x : 0.0, fin ? y * y : 0.0, fin ? x * x : 0.0, d * d, d < 0.0 ? -d : d};
#pragma unroll
    for (int m = QS_WARP_SIZE / 2; m > 0; m >>= 1) {
#pragma unroll
        for (int q = 0; q < 4; ++q) v[q] += QS_SHFL_XOR(v[q], m);
        v[4] = qs_fmax(v[4], QS_SHFL_XOR(v[4], m));
    }
    const unsigned c_fin = qs_warp_count(fin), c_nanp = qs_warp_count(use && qs_isnan(y)),
                   c_infp = qs_warp_count(use && qs_isinf(y)), c_nanr = qs_warp_count(use && qs_isnan(x)),
                   c_infr = qs_warp_count(use && qs_isinf(x));
    if (lane < QS_MAX_PROBES) {
        sm.fy[warp][lane] = fin ? y : 0.0;
        sm.fx[warp][lane] = fin ? x : 0.0;
    }
    if (lane == 0) {
#pragma unroll
        for (int q = 0; q < 5; ++q) sm.rsum[warp][q] = v[q];
        sm.rcnt[warp][0] = c_fin;
        sm.rcnt[warp][1] = active ? k : 0;
        sm.rcnt[warp][2] = c_nanp;
        sm.rcnt[warp][3] = c_infp;
        sm.rcnt[warp][4] = c_nanr;
        sm.rcnt[warp][5] = c_infr;
        sm.rkey[warp] = 0;
        if (active) {
            const double cosine = c_nanp + c_infp + c_nanr + c_infr > 0 ? -qs_inf() : qs_cosine(v[0], v[1], v[2]);
            sm.rkey[warp] = ~qs_sketch_rank_key(cosine, t);
            QsSketchRow* r = (QsSketchRow*)P.rowrec_ptr + t;
            r->row = P.packed_ptr ? ((const qs_u64*)(P.packed_ptr + sizeof(QsSnapHeader)))[t] : row;
            r->cosine = cosine;
            r->dot = v[0];
            r->prod_sq = v[1];
            r->ref_sq = v[2];
            if (P.row_stats_ptr) {
                double* r3 = (double*)P.row_stats_ptr + t * 3;
                r3[0] = v[0];
                r3[1] = v[1];
                r3[2] = v[2];
            }
        }
    }
    __syncthreads();
    // One thread per total: the group's eight rows in warp order, then one atomic.
    QsSketchTotals* tot = (QsSketchTotals*)P.totals_ptr;
    const unsigned f = threadIdx.x;
    if (f < 4) {
        double a = 0.0;
        for (int w = 0; w < QS_WARPS_PER_BLOCK; ++w) a += sm.rsum[w][f];
        if (a != 0.0) qs_red_add_f64(&tot->sums[f], a);
    } else if (f == 4) {
        double a = 0.0;
        for (int w = 0; w < QS_WARPS_PER_BLOCK; ++w) a = qs_fmax(a, sm.rsum[w][4]);
        if (a != 0.0) qs_red_max_u64(&tot->max_abs_err, qs_f64_bits(a));
    } else if (f < 11) {
        qs_u64 a = 0;
        for (int w = 0; w < QS_WARPS_PER_BLOCK; ++w) a += sm.rcnt[w][f - 5];
        if (a != 0) qs_red_add_u64(&tot->counts[f - 5], a);
    } else if (f == 11) {
        qs_u64 a = 0;
        for (int w = 0; w < QS_WARPS_PER_BLOCK; ++w) a = qs_max_u64(a, sm.rkey[w]);
        if (a != 0) qs_red_max_u64(&tot->worst, a);
    } else if (f >= 32 && f < 32 + 2 * QS_MAX_PROBES) {
        const unsigned p = (f - 32) % QS_MAX_PROBES;
        const bool ys = f < 32 + QS_MAX_PROBES;
        if (p < k) {
            double a = 0.0;
            for (int w = 0; w < QS_WARPS_PER_BLOCK; ++w) a += ys ? sm.fy[w][p] : sm.fx[w][p];
            if (a != 0.0) qs_red_add_f64(ys ? &tot->y_sum[p] : &tot->x_sum[p], a);
        }
    }
}

// The group's rows: warp w finishes row w of the group, lane p probe p, from the partials of
// every split.
template <int KP>
QS_DEVICE void qs_sketch_finish_group(const QsSketchParams& P, QsSketchSmem& sm, qs_u64 t, qs_u64 row, bool active,
                                      unsigned lane, unsigned warp) {
    const QsGemmDesc& g = P.g;
    const qs_u32 k = P.k;
    qs_sketch_finish_prologue(P, sm.scalar, sm.rowbias, row, active, lane, warp);
    // The row's partials of every split, summed in split order (deterministic): batches of 8
    // splits with all their loads in flight (16 would spill under the 128-register bound).
    // A group with a single row (decode: M = 1) has every warp sum a share of its splits
    // (warp w: w, w + 8, ...; one batch of loads for up to 64 splits), then warp 0 adds the
    // shares in warp order: one round trip instead of one per 8 splits.
    double xa = 0.0, ya = 0.0, xc = 0.0;
    const unsigned S = gridDim.y;
    const bool has_c = g.c.ptr != 0;
    const qs_u64 split_stride = (qs_u64)QS_WARPS_PER_BLOCK * 3 * KP;
    const bool lone = P.rows.count - (qs_u64)blockIdx.x * QS_WARPS_PER_BLOCK == 1;
    if (lone) {
        if (lane < k) {
            const double* base = (const double*)P.partials_ptr + (((qs_u64)blockIdx.x * S * QS_WARPS_PER_BLOCK) * 3) * KP + lane;
            qs_add_splits8<KP>(base, warp, QS_WARPS_PER_BLOCK, S, split_stride, has_c, xa, ya, xc);
            sm.share[warp][0][lane] = xa;
            sm.share[warp][1][lane] = ya;
            sm.share[warp][2][lane] = xc;
        }
    } else if (active && lane < k) {
        const double* base = (const double*)P.partials_ptr + (((qs_u64)blockIdx.x * S * QS_WARPS_PER_BLOCK + warp) * 3) * KP + lane;
        for (unsigned s0 = 0; s0 < S; s0 += 8) qs_add_splits8<KP>(base, s0, 1, S, split_stride, has_c, xa, ya, xc);
    }
    __syncthreads();
    if (lone && warp == 0 && lane < k) {
        xa = ya = xc = 0.0;
#pragma unroll
        for (int w = 0; w < QS_WARPS_PER_BLOCK; ++w) {
            xa += sm.share[w][0][lane];
            ya += sm.share[w][1][lane];
            xc += sm.share[w][2][lane];
        }
    }
    qs_sketch_finish_rows<KP>(P, sm, t, row, active, lane, warp, xa, ya, xc);
}

// The whole check (the last group's block): read and reset the totals, publish the slot.
// Status bits of a snapshot's copy, when they belong to the launch that took it.
QS_DEVICE qs_u32 qs_snap_status(const QsSnapHeader* h) {
    const qs_u64 w = h->status;
    return (w >> 32) == h->tag ? (qs_u32)(w & 0xFFFFFFFFull) : 0u;
}

// claimed_early (the lean check): block (0, 0) claimed the ticket (QsSketchTotals::ticket) and
// compared the weight samples while its projections loaded (qs_sketch_claim_early).
QS_DEVICE void qs_sketch_finish_check(const QsSketchParams& P, QsSketchSmem& sm, bool valid, qs_u64 epoch,
                                      bool claimed_early = false) {
    // The ring claim (a read of host memory and a device CAS) runs on warp 2 while the other
    // warps read the totals: its round trips overlap theirs.
    // The weight samples are compared here too, where their round trip overlaps the claim's
    // and the totals' (at the start of a block it held that block, and with it a group, back).
    // The slot is zeroed before any of them, and each thread's totals word is loaded before its
    // other loads: the slot's barriers after them held the totals' loads behind the claim's
    // and the samples' round trips (read of the code, session 21; not yet timed).
    __shared__ qs_u64 ticket;
    __shared__ int claimed, weight_changed;
    __shared__ qs_u32 status_word;
    if (threadIdx.x == 0) weight_changed = 0;
    QsResultSlot* slot = &sm.slot;
    // Its barriers publish weight_changed, and they order this block's own totals adds (and row
    // records) before the loads below: a check of one group has no second last-block count
    // (qs_sketch_check_body), so these barriers must stay ahead of the totals' loads.
    qs_slot_init(slot, P.tag, P.tag2, QS_CHECK_SKETCH);
    constexpr unsigned TOTAL_WORDS = sizeof(QsSketchTotals) / 8;
    qs_u64* tw = (qs_u64*)P.totals_ptr;
    const qs_u64 total_word = threadIdx.x < TOTAL_WORDS ? qs_ldcg_u64(tw + threadIdx.x) : 0;
    // The status word (and a snapshot's) and the row epoch on their own threads, so that their
    // round trips overlap the totals' instead of following them on thread 0. Every block
    // flagged and read its epoch before its last-block count.
    if (threadIdx.x == QS_WARP_SIZE) {
        qs_u32 st = qs_take_status(P.status_ptr);
        if (P.packed_ptr) st |= qs_snap_status((const QsSnapHeader*)P.packed_ptr);
        status_word = st;
    }
    if (threadIdx.x == QS_WARP_SIZE * 3) qs_rows_advance(P.rows);
    if (threadIdx.x == QS_WARP_SIZE * 2 && !claimed_early) {
        qs_u64 t = 0;
        claimed = qs_ring_claim(P.ring, &t);
        ticket = t;
    }
    if (!claimed_early && P.snapshot_ptr && P.g.b.ptr && threadIdx.x < QS_WEIGHT_SAMPLES &&
        qs_weight_sample(P.g.b, threadIdx.x) != ((const qs_u32*)P.snapshot_ptr)[threadIdx.x])
        weight_changed = 1;
    if (threadIdx.x < TOTAL_WORDS) {
        sm.totals[threadIdx.x] = total_word;
        tw[threadIdx.x] = 0;  // ready for the next launch
    }
    for (unsigned w = threadIdx.x + blockDim.x; w < TOTAL_WORDS; w += blockDim.x) {  // fewer threads than words
        sm.totals[w] = qs_ldcg_u64(tw + w);
        tw[w] = 0;
    }
    __syncthreads();
    const QsSketchTotals& tot = *(const QsSketchTotals*)sm.totals;
    const qs_u32 k = P.k;
    if (claimed_early && threadIdx.x == 0) {
        claimed = tot.ticket != 0;
        ticket = tot.ticket - 1;
    }
    if (threadIdx.x == 0) {
        slot->dot = tot.sums[0];
        slot->prod_sq = tot.sums[1];
        slot->ref_sq = tot.sums[2];
        slot->diff_sq = tot.sums[3];
        slot->max_abs_err = qs_f64_from_bits(tot.max_abs_err);
        slot->finite = tot.counts[0];
        slot->pairs = tot.counts[1];
        slot->nan_prod = tot.counts[2];
        slot->inf_prod = tot.counts[3];
        slot->nan_ref = tot.counts[4];
        slot->inf_ref = tot.counts[5];
        slot->elem_nan_prod = tot.elem_nonfinite[0];
        slot->elem_inf_prod = tot.elem_nonfinite[1];
        if (tot.worst != 0) {
            const qs_u64 wt = (~tot.worst) & 0xFFFFFFFFull;
            const QsSketchRow* r = (const QsSketchRow*)P.rowrec_ptr + wt;
            slot->worst_row = qs_ldcg_u64(&r->row);
            slot->worst_cosine = qs_ldcg_f64(&r->cosine);
            slot->worst_dot = qs_ldcg_f64(&r->dot);
            slot->worst_prod_sq = qs_ldcg_f64(&r->prod_sq);
            slot->worst_ref_sq = qs_ldcg_f64(&r->ref_sq);
        }
        slot->epoch = epoch;
        slot->probes = k;
        slot->rows_checked = valid ? P.rows.count : 0;
        qs_u32 status = status_word;
        if (!valid) status |= QS_STATUS_BAD_DESCRIPTOR;
        if (weight_changed) status |= QS_STATUS_WEIGHT_CHANGED;
        if (P.g.activation != QS_ACT_NONE) status |= QS_STATUS_NONLINEAR;
        if (tot.counts[4] + tot.counts[5] > 0) status |= QS_STATUS_REF_NONFINITE;
        slot->status = status;
    }
    if (threadIdx.x < QS_MAX_PROBES) {
        slot->sketch_prod[threadIdx.x] = threadIdx.x < k ? tot.y_sum[threadIdx.x] : 0.0;
        slot->sketch_ref[threadIdx.x] = threadIdx.x < k ? tot.x_sum[threadIdx.x] : 0.0;
    }
    __syncthreads();
    qs_ring_write(P.ring, slot, claimed != 0, ticket);
}

template <int KP>
QS_DEVICE void qs_sketch_check_body(const QsSketchParams& P, bool valid, QsSketchSmem& sm) {
    const unsigned lane = threadIdx.x % QS_WARP_SIZE, warp = threadIdx.x / QS_WARP_SIZE;
    const QsGemmDesc& g = P.g;
    const qs_u64 st = P.status_ptr;
    const unsigned G = gridDim.x, S = gridDim.y, gi = blockIdx.x, si = blockIdx.y;
    const qs_u64 epoch = P.packed_ptr ? ((const QsSnapHeader*)P.packed_ptr)->epoch : qs_rows_epoch(P.rows);
    const qs_u64 t = (qs_u64)gi * QS_WARPS_PER_BLOCK + warp;
    qs_u64 row = 0;
    bool active = valid && t < P.rows.count && qs_rows_at(P.rows, epoch, t, &row, st);
    const qs_u64 item = active ? row / g.m : 0, i = active ? row % g.m : 0;

    // This block's partials: this warp's row (scalar paths), the block's rows (tensor cores).
    double* part = (double*)P.partials_ptr + ((((qs_u64)gi * S + si) * QS_WARPS_PER_BLOCK + warp) * 3) * KP;
    float acc[KP];
    qs_u64 nan_d = 0, inf_d = 0;

    // ---- A_ref[i, k-slice] W_R ------------------------------------------------------------
#if QS_HAVE_MMA
    // Tensor cores: the warps share the block's rows (see qs_mma_a above).
    double* blk = (double*)P.partials_ptr + (((qs_u64)gi * S + si) * QS_WARPS_PER_BLOCK) * 3 * KP;
    if (lane == 0) {
        QsRowInfo r;
        r.item = item;
        r.i = i;
        r.active = active;
        r.reserved = 0;
        sm.rinfo[warp] = r;
    }
    __syncthreads();
#ifndef QS_EXP_NO_A  // experiment builds: phase timing (QS_SKETCH_TIMING) without A W_R
    qs_mma_a<KP>(P, sm, blk, lane, warp, si, S);
#endif
    QS_TM_A_DONE();
#else
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
#endif

    // ---- D[i, n-slice] R, and C[i, n-slice] R ---------------------------------------------
    qs_u64 n0 = 0, n1 = 0;
    qs_slice(g.n, si, S, &n0, &n1);
    const qs_u32* signs = (const qs_u32*)P.signs_ptr;
#if QS_HAVE_MMA
    constexpr bool D_MMA = QsDMma<QS_D_FMT>::OK;
#else
    constexpr bool D_MMA = false;
#endif
    if constexpr (D_MMA) {
#if QS_HAVE_MMA && !defined(QS_EXP_NO_D)  // experiment builds: without D R
        qs_mma_d<KP>(P, sm, blk, n0, n1, lane, warp, nan_d, inf_d);
#endif
    } else {
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
    }

    if (g.c.ptr) {
#pragma unroll
        for (int p = 0; p < KP; ++p) acc[p] = 0.0f;
        if (active) {
            const qs_u64 c0 = qs_out_offset(g.c, item, i, 0), cs = g.c.order == QS_ORDER_ROW ? 1 : g.c.ld;
            for (qs_u64 j = n0 + lane; j < n1; j += QS_WARP_SIZE)
                qs_signed_add<KP>(acc, (float)qs_load_checked_rt(g.c, c0 + j * cs, st), signs[j]);
        }
        qs_warp_store<KP>(part + 2 * KP, acc, lane);
    }

    // Non-finite elements of D: rare, so a block adds them only when it saw some.
    // 32-bit sums: a warp's count of one slice is far below 2^32, and 64-bit shuffles cost
    // twice the instructions on the path every block runs.
    nan_d = qs_warp_sumu((qs_u32)nan_d);
    inf_d = qs_warp_sumu((qs_u32)inf_d);
    QsSketchTotals* totals = (QsSketchTotals*)P.totals_ptr;
    if (lane == 0 && (nan_d | inf_d) != 0) {
        if (nan_d) qs_red_add_u64(&totals->elem_nonfinite[0], nan_d);
        if (inf_d) qs_red_add_u64(&totals->elem_nonfinite[1], inf_d);
    }

    qs_u32* counters = (qs_u32*)P.counters_ptr;
    QS_TM_PROJ_DONE();
    if (!qs_last_block(&counters[gi], S)) return;
    qs_sketch_finish_group<KP>(P, sm, t, row, active, lane, warp);
    QS_TM_MARK(tm_group);
    // One group (up to 8 sampled rows: decode) is its own last: no second count (a fence, an
    // atomic and a fence on the check's critical path). finish_check reads the totals this
    // block's threads added to only after barriers (qs_slot_init's), which order those adds.
    if (G > 1 && !qs_last_block(&counters[G], G)) return;
    QS_TM_MARK(tm_final);
    qs_sketch_finish_check(P, sm, valid, epoch);
    QS_TM_MARK(tm_claim);
    QS_TM_REPORT(tm_group, tm_final, tm_claim, 0);
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
    QS_TM_BLOCK_START();
    // An early start: the production GEMM's A and D after this. First, so that every block
    // waits whatever path it takes (a grid that ended before the GEMM would let a kernel that
    // was launched early behind it read D too soon).
    qs_wait_prior_grid();
    // Not sampled on this replay: return before the counter protocol (nothing to undo).
    if (!qs_gate_take(P.gate_ptr, P.gate_first, P.gate_every)) return;
    qs_for_kp(P.kp, P.status_ptr, [&](auto k) { qs_sketch_check_body<decltype(k)::V>(P, valid, sm); });
}

// ================================================================================================
// qs_sketch_lean_{a}_{d}: the same check as qs_sketch_check for the common case, with a short
// serial path (CUDA sm_90+; the host picks it, gpu.rs `lean_sketch`): A bf16 or e4m3fn in
// contiguous, 16-byte aligned rows without A scales (a tensor-wise f32 one is folded into the
// scalar, QsGemmDesc::sketch_view); D bf16 or f16, row-major and aligned; no C; one W_R for every
// batch item, also in fragment order (wfrag_ptr); K and N multiples of 32.
//
// Grid (groups of QS_LEAN_ROWS rows, QS_LEAN_SPLITS splits), one cluster per group (its splits),
// QS_BLOCK threads; 8 clusters of 8 blocks for 256 rows, one wave at one block per SM (16
// clusters did not fit at once on an H100). Measured there (docs/measurements/2026-11-26-h100-
// lean-sketch.md), the general kernel spends most of a 256-row check in instruction latency:
// per-element fragment assembly (tf32 splits, register moves) and three serial merge stages
// through L2. Here:
//  - each warp issues every load of its share of a split at once (W_R fragments as stored, rows
//    of A and D and the sign words as 16-byte vectors), then runs the mma's: one round trip per
//    iteration instead of a chain of dependent ones;
//  - A W_R is bf16 x bf16 on tensor cores (W_R as hi + lo, two passes; e4m3 A converted to bf16
//    exactly), D R as in the general kernel (signs as +-1 fragments);
//  - the 8 warps' partials meet in a register tree through shared memory, the 8 splits' through
//    distributed shared memory (a cluster barrier, no global counter), and block s of the
//    cluster finishes rows 4s .. 4s + 3 of the group with the general kernel's finishing code;
//    the last block of the grid publishes the slot (qs_sketch_finish_check) under the ring
//    ticket block (0, 0) claimed while its first loads were in flight.
// Per-row values are summed in warp and split order: deterministic for a given grid.
// ================================================================================================
#define QS_LEAN_ROWS 32
#define QS_LEAN_SPLITS 8
#define QS_SKETCH_LEAN QS_CAT5(qs_sketch_lean_, QS_TAG(QS_A_FMT), _, QS_TAG(QS_D_FMT), )
#define QS_SKETCH_PROJ QS_CAT5(qs_sketch_proj_, QS_TAG(QS_A_FMT), _, QS_TAG(QS_D_FMT), )
#define QS_SKETCH_FIN QS_CAT5(qs_sketch_fin_, QS_TAG(QS_A_FMT), _, QS_TAG(QS_D_FMT), )
#define QS_LEAN_FORMATS                                              \
    ((QS_A_FMT == QS_FMT_BF16 || QS_A_FMT == QS_FMT_E4M3FN) && \
     (QS_D_FMT == QS_FMT_BF16 || QS_D_FMT == QS_FMT_F16))

// 32-element units per warp and iteration. e4m3 A: 2 (H100, session 26: the split projections
// 8.8 -> 7.8 us at 4096 x 4096 and 0.4-0.5 us faster at the 14336 shapes than 3, which leaves 2
// of 8 warps idle at a 512-element slice). 16-bit A (W_R in two passes): 2. Experiment builds
// may set either (QUANTSHADOW_KERNEL_DEFINES="QS_LEAN_UNITS_E4M3=3 QS_LEAN_UNITS_16=1").
#ifndef QS_LEAN_UNITS_E4M3
#define QS_LEAN_UNITS_E4M3 2
#endif
#ifndef QS_LEAN_UNITS_16
#define QS_LEAN_UNITS_16 2
#endif
static_assert(QS_LEAN_UNITS_16 >= 1 && QS_LEAN_UNITS_16 <= 2, "1 or 2 units per warp and iteration");
static_assert(QS_LEAN_UNITS_E4M3 >= 1 && QS_LEAN_UNITS_E4M3 <= 3, "1 to 3 units per warp and iteration");

#if QS_LEAN_FORMATS
#if QS_HAVE_CLUSTER && QS_HAVE_MMA && QS_HAVE_FP8_CVT
// A sampled row of the group: byte addresses of its A and D rows (0: the row is not checked).
struct QsLeanRow {
    qs_u64 a, d, row;
    qs_u32 active, reserved;
};

// Accumulators of one warp: A W_R and D R tiles (probe tile mt, row tile nt), C fragments.
template <int MT, int NT>
struct QsLeanAcc {
    float v[2][MT][NT][4];
};
constexpr int QS_LEAN_ACC_MAX = 2 * 2 * (QS_LEAN_ROWS / 8) * 4;  // floats per lane, kp = 32

struct QsLeanSmem {
    union {
        // The block's warps add their accumulators in a tree (4 + 4, 2 + 2, 1 + 1): lane-major
        // so that each lane reads back exactly what its partner lane wrote, conflict-free.
        float tree[QS_WARPS_PER_BLOCK / 2][QS_LEAN_ACC_MAX][QS_WARP_SIZE];
        QsSketchSmem fin;  // the finishing stages, once the tree is done
    } u;
    // The projections of this block's FIN rows from every split of the cluster [split][A W_R |
    // D R][row][probe], stored there by the splits' blocks (distributed shared memory).
    float recv[QS_LEAN_SPLITS][2][QS_LEAN_ROWS / QS_LEAN_SPLITS][QS_MAX_PROBES];
    QsLeanRow rows[QS_LEAN_ROWS];
    double scalar[5];                          // read before the projections (finish prologue)
    double rowbias[QS_LEAN_ROWS / QS_LEAN_SPLITS];
};

// A unit (32 elements) of a row as this lane's B fragments: b[s][0..1] for steps s = 0, 1.
template <int F>
struct QsLeanRowUnit;
template <>
struct QsLeanRowUnit<2> {  // 16-bit elements: one 16-byte vector
    uint4 v;
    QS_DEVICE void load(qs_u64 row_addr, qs_u64 elem) { v = *(const uint4*)(row_addr + elem * 2); }
    QS_DEVICE void zero() { v = make_uint4(0u, 0u, 0u, 0u); }
    QS_DEVICE void frags(qs_u32 (&b)[2][2]) const {
        b[0][0] = v.x;
        b[0][1] = v.y;
        b[1][0] = v.z;
        b[1][1] = v.w;
    }
};
template <>
struct QsLeanRowUnit<1> {  // e4m3: 8 bytes, converted to bf16 exactly
    uint2 v;
    QS_DEVICE void load(qs_u64 row_addr, qs_u64 elem) { v = *(const uint2*)(row_addr + elem); }
    QS_DEVICE void zero() { v = make_uint2(0u, 0u); }
    QS_DEVICE void frags(qs_u32 (&b)[2][2]) const {
        b[0][0] = qs_bf16x2_from_e4m3x2(v.x & 0xFFFFu);
        b[0][1] = qs_bf16x2_from_e4m3x2(v.x >> 16);
        b[1][0] = qs_bf16x2_from_e4m3x2(v.y & 0xFFFFu);
        b[1][1] = qs_bf16x2_from_e4m3x2(v.y >> 16);
    }
};

// Block (0, 0), while its first loads are in flight: the ring ticket (into the totals, where
// the publishing block reads it with them) and the weight samples (WEIGHT_CHANGED into the
// status word). Off the check's tail: there they cost ~1.5 us of dependent round trips.
QS_DEVICE void qs_sketch_claim_early(const QsSketchParams& P, unsigned lane) {
    if (lane == 0) {
        qs_u64 t = 0;
        const bool claimed = qs_ring_claim(P.ring, &t);
        ((QsSketchTotals*)P.totals_ptr)->ticket = claimed ? t + 1 : 0;
    }
    if (P.snapshot_ptr && P.g.b.ptr) {
        bool changed = false;
        for (unsigned i = lane; i < QS_WEIGHT_SAMPLES; i += QS_WARP_SIZE)
            changed = changed || qs_weight_sample(P.g.b, i) != ((const qs_u32*)P.snapshot_ptr)[i];
        if (changed) qs_flag(P.status_ptr, QS_STATUS_WEIGHT_CHANGED);
    }
}

// PROJ: the projections of a split check (qs_sketch_proj): a plain grid, no cluster; the block
// leaves its sums and its rows' finishing inputs in the split buffer and ends there.
template <int KP, bool PROJ>
QS_DEVICE void qs_lean_body(const QsSketchParams& P, bool valid, QsLeanSmem& sm) {
    constexpr int MT = QS_WFRAG_TILES(KP);  // 16-probe tiles
    constexpr int NT = QS_LEAN_ROWS / 8;    // 8-row tiles
    // W_R passes: bf16 hi + lo (|error| <= 2^-17 |w|) for 16-bit A, the wide class with an NMSE
    // bound of 2e-5; hi only for e4m3 A (abi.rs lean_sketch_hi_only): |error| <= 2^-9 |w|, an
    // unbiased reference noise of ~1.3e-6 NMSE against the fp8 class bound of 2e-3, for half
    // the W_R bytes and A-side mma's.
    constexpr int PASSES = QS_A_FMT == QS_FMT_E4M3FN ? 1 : 2;
    constexpr int UA = PASSES == 1 ? QS_LEAN_UNITS_E4M3 : QS_LEAN_UNITS_16, UD = UA;  // 32-element units per warp and iteration
    constexpr int AB = QsFmt<QS_A_FMT>::BITS / 8;
    constexpr int FIN = QS_LEAN_ROWS / QS_LEAN_SPLITS;  // rows each block of the cluster finishes
    constexpr int ACC = 2 * MT * NT * 4;
    using DM = QsDMma<QS_D_FMT>;
    const unsigned lane = threadIdx.x % QS_WARP_SIZE, warp = threadIdx.x / QS_WARP_SIZE;
    const unsigned gq = lane >> 2, tq = lane & 3u;
    QS_TM_MARK(tm_begin);
    const QsGemmDesc& g = P.g;
    const qs_u64 st = P.status_ptr;
    // The split is the block's rank in its cluster (0..7 whatever the grid: a malformed grid is
    // refused by `valid`, and shared memory is never indexed past the cluster).
    const unsigned gi = blockIdx.x, si = PROJ ? blockIdx.y : qs_cluster_rank();
    qs_u64 k0, k1, n0, n1;
    qs_slice(g.k, si, QS_LEAN_SPLITS, &k0, &k1);
    qs_slice(g.n, si, QS_LEAN_SPLITS, &n0, &n1);
    const unsigned units_a = valid ? (unsigned)((k1 - k0) >> 5) : 0u, units_d = valid ? (unsigned)((n1 - n0) >> 5) : 0u;
    const qs_u64 ua0 = k0 >> 5, ud0 = n0 >> 5;
    const uint4* wf = (const uint4*)P.wfrag_ptr;
    const qs_u32* signs = (const qs_u32*)P.signs_ptr;
    // W_R fragments and sign words of a warp's iteration: they do not depend on the sampled
    // rows, so the first iteration's are in flight while the rows are drawn.
    uint4 w[UA][2][MT][PASSES];
    uint4 sv[UD][2];
    auto load_w = [&](unsigned ia) {
#pragma unroll
        for (int u = 0; u < UA; ++u) {
            if (ia + u < units_a) {
                const qs_u64 gu = ua0 + ia + u;
#pragma unroll
                for (int s = 0; s < 2; ++s)
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                        for (int pass = 0; pass < PASSES; ++pass)
                            w[u][s][mt][pass] = wf[(((gu * 2 + s) * MT + mt) * 2 + pass) * 32 + lane];
            }
        }
    };
    auto load_signs = [&](unsigned id) {
#pragma unroll
        for (int u = 0; u < UD; ++u) {
            if (id + u < units_d) {
                const qs_u64 j = (ud0 + id + u) * 32 + 8 * tq;
                sv[u][0] = *(const uint4*)(signs + j);
                sv[u][1] = *(const uint4*)(signs + j + 4);
            }
        }
    };
    // The epoch first: its round trip then does not queue behind the W_R burst.
    const qs_u64 epoch = P.packed_ptr ? ((const QsSnapHeader*)P.packed_ptr)->epoch : qs_rows_epoch(P.rows);
    load_w(warp * UA);
    load_signs(warp * UD);
    QS_TM_MARK(tm_issued);

    // Status bits found while drawing rows, published after the wait: before it, the site's
    // previous check (whose status word this is) may not have landed its writes yet when the
    // GEMM between was itself started early.
    __shared__ qs_u32 s_row_flags;
    static_assert(QS_LEAN_ROWS == QS_WARP_SIZE, "rows are drawn by warp 0");
    if (threadIdx.x < QS_LEAN_ROWS) {
        if (threadIdx.x == 0) s_row_flags = 0;
        __syncwarp();
        const qs_u64 flags = (qs_u64)&s_row_flags;
        const qs_u64 t = (qs_u64)gi * QS_LEAN_ROWS + threadIdx.x;
        QsLeanRow r;
        r.a = r.d = r.row = 0;
        r.active = r.reserved = 0;
        qs_u64 row = 0;
        if (valid && t < P.rows.count && qs_rows_at(P.rows, epoch, t, &row, flags)) {
            // One batch item (the usual case): no 64-bit division subroutines on the way to the
            // first row loads.
            const qs_u64 item = g.batch > 1 ? row / g.m : 0, i = g.batch > 1 ? row % g.m : row;
            const qs_u64 af = item * g.a.batch_stride + i * qs_op_strides(g.a).rs;
            const qs_u64 df = qs_out_offset(g.d, item, i, 0);
            const qs_u64 a = g.a.ptr + af * AB, d = g.d.ptr + df * 2;
            r.row = row;
            if (af + g.k > g.a.extent || df + g.n > g.d.extent) {
                qs_flag(flags, QS_STATUS_OUT_OF_BOUNDS);
            } else if (((a | d) & 15u) != 0) {
                qs_flag(flags, QS_STATUS_BAD_DESCRIPTOR);
            } else {
                r.a = a;
                r.d = d;
                r.active = 1;
            }
        }
        sm.rows[threadIdx.x] = r;
    }
    QS_TM_MARK(tm_drawn_own);  // thread 0's rows, before the barrier
    __syncthreads();
    QS_TM_MARK(tm_rows);
    (void)tm_begin;  // printed by the projections' timing only
    (void)tm_issued;
    (void)tm_drawn_own;
    // Distributed shared memory may be written only once every block of the cluster runs: this
    // arrival, waited for before the first remote store, guarantees it at no cost by then.
    // Relaxed: a release arrival would wait for the W_R loads in flight (~1.7 us on an H100).
    if (!PROJ) qs_cluster_arrive_relaxed();
    bool prologue = warp < (unsigned)FIN;  // the finishing stage's scalars and row biases
    // Everything above reads only this tool's memory (row epoch, W_R, signs); A, D, the scalars
    // and row biases may be the production GEMM's, which an early start may still be running.
    qs_wait_prior_grid();
    if (threadIdx.x == 0 && s_row_flags != 0) qs_flag(st, s_row_flags);  // after the barrier above

    // ---- projections: this lane's row of tile nt is 8 nt + gq --------------------------------
    qs_u64 arow[NT], drow[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        const QsLeanRow r = sm.rows[8 * nt + gq];
        arow[nt] = r.active ? r.a : 0;
        drow[nt] = r.active ? r.d : 0;
    }
    QsLeanAcc<MT, NT> acc;
#pragma unroll
    for (int x = 0; x < 2; ++x)
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int c = 0; c < 4; ++c) acc.v[x][mt][nt][c] = 0.0f;
    qs_u64 nan_d = 0, inf_d = 0;
    qs_u32 nonfinite = 0;
    bool claim = !PROJ && gi == 0 && si == 0 && warp == QS_WARPS_PER_BLOCK - 1;
#if defined(QS_SKETCH_TIMING) && defined(QS_CUDA)
    qs_u64 tm_it[4] = {0, 0, 0, 0};  // experiment builds: when warp 0's iterations start
    unsigned n_it = 0;
#endif
    for (unsigned ia = warp * UA, id = warp * UD; ia < units_a || id < units_d;
         ia += QS_WARPS_PER_BLOCK * UA, id += QS_WARPS_PER_BLOCK * UD) {
#if defined(QS_SKETCH_TIMING) && defined(QS_CUDA)
        if (n_it < 4) tm_it[n_it++] = qs_tm_now();
#endif
        // Every load of the iteration first (the first iteration's W_R and signs are in flight).
        if (ia != warp * UA || id != warp * UD) {
            load_w(ia);
            load_signs(id);
        }
        QsLeanRowUnit<AB> av[UA][NT];
#pragma unroll
        for (int u = 0; u < UA; ++u) {
            if (ia + u < units_a) {
                const qs_u64 gu = ua0 + ia + u;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    if (arow[nt]) {
                        av[u][nt].load(arow[nt], gu * 32 + 8 * tq);
                    } else {
                        av[u][nt].zero();
                    }
                }
            }
        }
        uint4 dv[UD][NT];
#pragma unroll
        for (int u = 0; u < UD; ++u) {
            if (id + u < units_d) {
                const qs_u64 j = (ud0 + id + u) * 32 + 8 * tq;
#pragma unroll
                for (int nt = 0; nt < NT; ++nt)
                    dv[u][nt] = drow[nt] ? *(const uint4*)(drow[nt] + j * 2) : make_uint4(0u, 0u, 0u, 0u);
            }
        }
        if (claim) {
            qs_sketch_claim_early(P, lane);
            claim = false;
        }
        if (prologue) {
            // Behind the first loads, not in front of them: out-of-line scalar decodes.
            const QsLeanRow r = sm.rows[FIN * si + warp];
            qs_sketch_finish_prologue(P, sm.scalar, sm.rowbias, r.row, r.active != 0, lane, warp);
            prologue = false;
        }
        // A W_R: PASSES passes (hi, lo) per step.
#pragma unroll
        for (int u = 0; u < UA; ++u) {
            if (ia + u >= units_a) break;
            qs_u32 b[NT][2][2];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) av[u][nt].frags(b[nt]);
#pragma unroll
            for (int s = 0; s < 2; ++s)
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int pass = 0; pass < PASSES; ++pass) {
                        const uint4 a = w[u][s][mt][pass];
#pragma unroll
                        for (int nt = 0; nt < NT; ++nt)
                            qs_mma_16bit<false>(acc.v[0][mt][nt], a.x, a.y, a.z, a.w, b[nt][s][0], b[nt][s][1]);
                    }
        }
        // D R: +-1 fragments from the sign words (qs_sign_pair), D as stored.
#pragma unroll
        for (int u = 0; u < UD; ++u) {
            if (id + u >= units_d) break;
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const uint4 q = dv[u][nt];
                const qs_u32 words[4] = {q.x, q.y, q.z, q.w};
                qs_d_nonfinite<QS_D_FMT>(words, nonfinite, nan_d, inf_d);
            }
            const qs_u32 sw[8] = {sv[u][0].x, sv[u][0].y, sv[u][0].z, sv[u][0].w,
                                  sv[u][1].x, sv[u][1].y, sv[u][1].z, sv[u][1].w};
#pragma unroll
            for (int s = 0; s < 2; ++s) {
                const qs_u32 z0 = sw[4 * s] << (7u - gq), z1 = sw[4 * s + 1] << (7u - gq),
                             z2 = sw[4 * s + 2] << (7u - gq), z3 = sw[4 * s + 3] << (7u - gq);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    qs_u32 a[4];
                    qs_sign_frags<KP, DM::ONE2>(z0, z1, z2, z3, mt, a);
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt) {
                        const uint4 q = dv[u][nt];
                        qs_mma_16bit<DM::F16>(acc.v[1][mt][nt], a[0], a[1], a[2], a[3], s == 0 ? q.x : q.z,
                                              s == 0 ? q.y : q.w);
                    }
                }
            }
        }
    }
    if (claim) qs_sketch_claim_early(P, lane);  // a warp without loads
    if (prologue) {
        const QsLeanRow r = sm.rows[FIN * si + warp];
        qs_sketch_finish_prologue(P, sm.scalar, sm.rowbias, r.row, r.active != 0, lane, warp);
    }
    QS_TM_A_DONE();
    QS_TM_MARK(tm_loop);
    nan_d = qs_warp_sumu((qs_u32)nan_d);
    inf_d = qs_warp_sumu((qs_u32)inf_d);
    QsSketchTotals* totals = (QsSketchTotals*)P.totals_ptr;
    if (lane == 0 && (nan_d | inf_d) != 0) {
        if (nan_d) qs_red_add_u64(&totals->elem_nonfinite[0], nan_d);
        if (inf_d) qs_red_add_u64(&totals->elem_nonfinite[1], inf_d);
    }

    // ---- the block's sums over its warps: ((w0 + w4) + (w1 + w5)) + ((w2 + w6) + (w3 + w7)) -----
    // Warps 4..7 hand their accumulators to warps 0..3, which add and hand on the four sums;
    // then every thread adds the four for a share of the values and stores each into the block
    // of the cluster that finishes its row. Lane-major slots: each lane reads back what its
    // partner lane wrote, conflict-free.
    float* a = &acc.v[0][0][0][0];
    if (warp >= QS_WARPS_PER_BLOCK / 2) {
#pragma unroll
        for (int x = 0; x < ACC; ++x) sm.u.tree[warp - QS_WARPS_PER_BLOCK / 2][x][lane] = a[x];
    }
    __syncthreads();
    if (warp < QS_WARPS_PER_BLOCK / 2) {
#pragma unroll
        for (int x = 0; x < ACC; ++x) a[x] += sm.u.tree[warp][x][lane];
    }
    __syncthreads();
    if (warp < QS_WARPS_PER_BLOCK / 2) {
#pragma unroll
        for (int x = 0; x < ACC; ++x) sm.u.tree[warp][x][lane] = a[x];
    }
    __syncthreads();
    static_assert(ACC * QS_WARP_SIZE % QS_BLOCK == 0, "tree values per thread");
    // The split check's projections (PROJ) store the sums the cluster merge would take into the
    // finishing block's shared memory in this block's place in the buffer, with the finishing
    // inputs of its FIN rows (qs_sketch_fin then adds the splits in the same order).
    QsSplitRow* srows = (QsSplitRow*)(P.split_ptr + sizeof(QsSplitHeader));
    float* part = (float*)(srows + (qs_u64)gridDim.x * QS_LEAN_ROWS) + ((qs_u64)gi * QS_LEAN_SPLITS + si) * 2 * QS_LEAN_ROWS * KP;
    if (!PROJ) qs_cluster_wait();  // every block of the cluster runs (the relaxed arrival above)
#pragma unroll
    for (int j = 0; j < ACC * QS_WARP_SIZE / QS_BLOCK; ++j) {
        const unsigned v = threadIdx.x + (unsigned)j * QS_BLOCK, x = v / QS_WARP_SIZE, l = v % QS_WARP_SIZE;
        // Fragment x = [A W_R | D R][mt][nt][c] of lane l = 4 g + t: probe 16 mt + g (+ 8 for
        // c >= 2), row 8 nt + 2 t (+ 1 for odd c).
        const unsigned c = x % 4, nt = (x / 4) % NT, mt = (x / (4 * NT)) % MT, which = x / (4 * NT * MT);
        if (KP == 8 && c >= 2) continue;  // the padding probes of kp = 8
        const float sum = (sm.u.tree[0][x][l] + sm.u.tree[1][x][l]) + (sm.u.tree[2][x][l] + sm.u.tree[3][x][l]);
        const unsigned p = 16u * mt + (l >> 2) + 8u * (c >> 1), r = 8u * nt + 2u * (l & 3u) + (c & 1u);
        if constexpr (PROJ) {
            part[(which * QS_LEAN_ROWS + r) * KP + p] = sum;
        } else {
            qs_cluster_store_f32(&sm.recv[si][which][r % FIN][p], r / FIN, sum);
        }
    }
    if constexpr (PROJ) {
        if (threadIdx.x < (unsigned)FIN) {
            const QsLeanRow r = sm.rows[FIN * si + threadIdx.x];
            QsSplitRow& out = srows[(qs_u64)gi * QS_LEAN_ROWS + FIN * si + threadIdx.x];
            out.row = r.active ? r.row : ~0ull;
            out.rowbias = sm.rowbias[threadIdx.x];
        }
        if (gi == 0 && si == 0 && threadIdx.x < 5) ((QsSplitHeader*)P.split_ptr)->scalar[threadIdx.x] = sm.scalar[threadIdx.x];
#if defined(QS_SKETCH_TIMING) && defined(QS_CUDA)
        qs_split_proj_timing(tm_begin, tm_issued, tm_drawn_own, tm_rows, tm_loop, P.g.n, P.g.k);
#endif
        return;
    }
    QS_TM_PROJ_DONE();
    QS_TM_MARK(tm_tree);
    // ---- the group's splits, through the cluster's shared memory --------------------------------
    qs_cluster_sync();
    QS_TM_MARK(tm_sync1);
    // Block s of the cluster finishes rows FIN s + w (warp w < FIN) of the group, its splits'
    // sums now in its own shared memory, added in split order. Nothing reads another block's
    // shared memory after the barrier, so no block waits for the others to leave.
    const unsigned lr = FIN * si + (warp % FIN);
    const QsLeanRow rr = sm.rows[lr];
    const bool active = warp < (unsigned)FIN && rr.active != 0;
    const qs_u64 t = (qs_u64)gi * QS_LEAN_ROWS + lr;
    double xa = 0.0, ya = 0.0;
    if (warp < (unsigned)FIN && lane < P.k) {
#pragma unroll
        for (int s = 0; s < QS_LEAN_SPLITS; ++s) {
            xa += (double)sm.recv[s][0][warp][lane];
            ya += (double)sm.recv[s][1][warp][lane];
        }
    }
    if (threadIdx.x < 5) sm.u.fin.scalar[threadIdx.x] = sm.scalar[threadIdx.x];
    if (lane == 0 && warp < (unsigned)FIN) sm.u.fin.rowbias[warp] = sm.rowbias[warp];
    __syncthreads();  // fin.scalar / rowbias above
    QS_TM_MARK(tm_sync2);
    qs_sketch_finish_rows<KP>(P, sm.u.fin, t, rr.row, active, lane, warp, xa, ya, 0.0);
    QS_TM_MARK(tm_group);
    if (!qs_last_block((qs_u32*)P.counters_ptr, gridDim.x * gridDim.y)) return;
    QS_TM_MARK(tm_final);
    qs_sketch_finish_check(P, sm.u.fin, valid, epoch, true);
    QS_TM_MARK(tm_claim);
#if defined(QS_SKETCH_TIMING) && defined(QS_CUDA)
    // The last block's own timeline (us from the first block's start, like QS_TIMING).
    if (threadIdx.x == 0)
        printf("QS_LEAN_ITERS af %d n %llu k %llu it0 %llu it1 %llu it2 %llu it3 %llu\n", QS_A_FMT, P.g.n, P.g.k,
               tm_it[0] - qs_tm_start, tm_it[1] ? tm_it[1] - qs_tm_start : 0, tm_it[2] ? tm_it[2] - qs_tm_start : 0,
               tm_it[3] ? tm_it[3] - qs_tm_start : 0);
    if (threadIdx.x == 0)
        printf("QS_LEAN_STAGES af %d n %llu k %llu drawn %llu loop %llu tree %llu sync1 %llu arrive %llu rows %llu "
               "count %llu publish %llu\n",
               QS_A_FMT, P.g.n, P.g.k, tm_rows - qs_tm_start, tm_loop - qs_tm_start, tm_tree - qs_tm_start, tm_sync1 - qs_tm_start,
               tm_sync2 - qs_tm_start, tm_group - qs_tm_start, tm_final - qs_tm_start, tm_claim - qs_tm_start);
#endif
    (void)tm_rows;
    (void)tm_loop;
    (void)tm_tree;
    (void)tm_sync1;
    (void)tm_sync2;
    QS_TM_REPORT(tm_group, tm_final, tm_claim, 2);
}

// The calls the lean check (and the split check's two kernels) can take: the host's rule
// (gpu.rs `sketch_takes_lean`), checked again so that a wrong launch is refused, not misread.
QS_DEVICE bool qs_lean_valid(const QsSketchParams& P) {
    const QsGemmDesc& g = P.g;
    return g.a.format == QS_A_FMT && g.d.format == QS_D_FMT && blockDim.x == QS_BLOCK &&
           P.rows_per_group == QS_LEAN_ROWS && P.splits == QS_LEAN_SPLITS && gridDim.y == QS_LEAN_SPLITS &&
           P.k >= 1 && P.k <= P.kp && g.m > 0 && P.rows.count <= (qs_u64)gridDim.x * QS_LEAN_ROWS &&
           P.wfrag_ptr != 0 && (P.wfrag_ptr & 15u) == 0 && P.wr_batch_stride == 0 && g.c.ptr == 0 &&
           g.a_scale.ptr == 0 && qs_op_strides(g.a).cs == 1 && g.d.order == QS_ORDER_ROW && g.k % 32 == 0 &&
           g.n % 32 == 0 && (P.signs_ptr & 15u) == 0;
}

QS_GLOBAL void __launch_bounds__(QS_BLOCK, 1) __cluster_dims__(1, QS_LEAN_SPLITS, 1) QS_SKETCH_LEAN(QsSketchParams P) {
    const bool valid = qs_lean_valid(P);
    __shared__ QsLeanSmem sm;
    QS_TM_BLOCK_START();
    if (!qs_gate_take(P.gate_ptr, P.gate_first, P.gate_every)) {
        qs_wait_prior_grid();  // every block waits for the GEMM ahead whatever its path
        return;
    }
    qs_for_kp(P.kp, P.status_ptr, [&](auto k) { qs_lean_body<decltype(k)::V, false>(P, valid, sm); });
    qs_wait_prior_grid();  // returns at once after the body's wait; covers any path without it
}

// ================================================================================================
// qs_sketch_proj_{a}_{d} and qs_sketch_fin_{a}_{d}: the lean check split in two (QsSplitHeader in
// qs_abi.h). An eager check's serial part after the projections (cluster merge, row finishing,
// last-block count, ring slot: ~6.5 us at 4096 x 4096 on an H100) leaves the caller's stream:
// the projections run there (grid as the lean check's, no cluster), the finishing on a side
// stream behind an event. Eager only (the host never gates or captures them).
// ================================================================================================

QS_DEVICE bool qs_split_valid(const QsSketchParams& P) {
    return qs_lean_valid(P) && P.split_ptr != 0 && (P.split_ptr & 15u) == 0 && P.gate_ptr == 0 && P.packed_ptr == 0;
}

// Launch parameters: status_ptr and totals_ptr point into the split buffer's header.
QS_GLOBAL void __launch_bounds__(QS_BLOCK, 1) QS_SKETCH_PROJ(QsSketchParams P) {
    const bool valid = qs_split_valid(P);
    __shared__ QsLeanSmem sm;
    QS_TM_BLOCK_START();
    if (P.split_ptr != 0)  // else nowhere to write; the finishing reports the bad launch
        qs_for_kp(P.kp, P.status_ptr, [&](auto k) { qs_lean_body<decltype(k)::V, true>(P, valid, sm); });
    // Every path waits for the grid ahead before it writes or ends (returns at once for an
    // ordinary launch, which is how the host launches these today).
    qs_wait_prior_grid();
    if (!valid && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) qs_flag(P.status_ptr, QS_STATUS_BAD_DESCRIPTOR);
}

// Block (g, s) finishes rows FIN s + w of group g (warp w < FIN) from the splits' sums, as the
// lean check's block of rank s does after its cluster merge; the last block publishes the slot.
template <int KP>
QS_DEVICE void qs_split_finish_body(const QsSketchParams& P, bool valid, QsSketchSmem& sm) {
    constexpr int FIN = QS_LEAN_ROWS / QS_LEAN_SPLITS;
    const unsigned lane = threadIdx.x % QS_WARP_SIZE, warp = threadIdx.x / QS_WARP_SIZE;
    const unsigned gi = blockIdx.x, si = blockIdx.y;
    QsSplitHeader* hdr = (QsSplitHeader*)P.split_ptr;
    const QsSplitRow* srows = (const QsSplitRow*)(P.split_ptr + sizeof(QsSplitHeader));
    const float* part =
        (const float*)(srows + (qs_u64)gridDim.x * QS_LEAN_ROWS) + (qs_u64)gi * QS_LEAN_SPLITS * 2 * QS_LEAN_ROWS * KP;
    if (gi == 0 && si == 0 && warp == QS_WARPS_PER_BLOCK - 1) qs_sketch_claim_early(P, lane);
    const unsigned lr = FIN * si + (warp % FIN);
    const qs_u64 t = (qs_u64)gi * QS_LEAN_ROWS + lr;
    const qs_u64 row = srows[t].row;
    const bool active = valid && warp < (unsigned)FIN && row != ~0ull;
    double xa = 0.0, ya = 0.0;
    if (warp < (unsigned)FIN && lane < P.k) {
#pragma unroll
        for (int s = 0; s < QS_LEAN_SPLITS; ++s) {
            xa += (double)part[((s * 2 + 0) * QS_LEAN_ROWS + lr) * KP + lane];
            ya += (double)part[((s * 2 + 1) * QS_LEAN_ROWS + lr) * KP + lane];
        }
    }
    if (threadIdx.x < 5) sm.scalar[threadIdx.x] = hdr->scalar[threadIdx.x];
    if (lane == 0 && warp < (unsigned)FIN) sm.rowbias[warp] = srows[t].rowbias;
    if (gi == 0 && si == 0 && threadIdx.x == QS_WARP_SIZE) {
        // The projections' status bits and D counts into the check's (before this block's
        // last-block count), then zero for the buffer's next use.
        const qs_u32 st = (qs_u32)hdr->status;
        if (st) qs_flag(P.status_ptr, st);
        hdr->status = 0;
        QsSketchTotals* totals = (QsSketchTotals*)P.totals_ptr;
        for (int i = 0; i < 2; ++i) {
            const qs_u64 c = hdr->totals.elem_nonfinite[i];
            if (c) qs_red_add_u64(&totals->elem_nonfinite[i], c);
            hdr->totals.elem_nonfinite[i] = 0;
        }
    }
    __syncthreads();
    qs_sketch_finish_rows<KP>(P, sm, t, row, active, lane, warp, xa, ya, 0.0);
    if (!qs_last_block((qs_u32*)P.counters_ptr, gridDim.x * gridDim.y)) return;
    qs_sketch_finish_check(P, sm, valid, qs_rows_epoch(P.rows), true);
}

QS_GLOBAL void __launch_bounds__(QS_BLOCK, 1) QS_SKETCH_FIN(QsSketchParams P) {
    const bool valid = qs_split_valid(P);
    __shared__ QsSketchSmem sm;
    if (P.split_ptr == 0) {  // nothing to finish from: the check is reported, refused
        if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) qs_flag(P.status_ptr, QS_STATUS_BAD_DESCRIPTOR);
        return;
    }
    qs_for_kp(P.kp, P.status_ptr, [&](auto k) { qs_split_finish_body<decltype(k)::V>(P, valid, sm); });
}
#else
// Not a cluster-capable CUDA device (HIP, CUDA before sm_90): the entries exist so that every
// program of these formats has the same entries; the host never launches them here.
QS_GLOBAL void QS_SKETCH_LEAN(QsSketchParams P) { qs_flag(P.status_ptr, QS_STATUS_BAD_DESCRIPTOR); }
QS_GLOBAL void QS_SKETCH_PROJ(QsSketchParams P) { qs_flag(P.status_ptr, QS_STATUS_BAD_DESCRIPTOR); }
QS_GLOBAL void QS_SKETCH_FIN(QsSketchParams P) { qs_flag(P.status_ptr, QS_STATUS_BAD_DESCRIPTOR); }
#endif
#endif

// ================================================================================================
// qs_sketch_snap_{a}_{d}: the snapshot of a detached check (QsSnapParams in qs_abi.h). Runs on
// the caller's stream right after the call; the check reads only the snapshot, so it can run
// later on a side stream or as a graph branch nobody waits for. A copy, no arithmetic: the
// packed rows hold the call's codes, and the check decodes them exactly as it would in place.
// ================================================================================================
#define QS_SKETCH_SNAP QS_CAT5(qs_sketch_snap_, QS_TAG(QS_A_FMT), _, QS_TAG(QS_D_FMT), )

// Stores `code` as element `idx` of a buffer of `bits`-bit codes (8, 16 or 32 bits).
QS_DEVICE void qs_store_code(qs_u8* dst, qs_u64 idx, qs_u32 bits, qs_u32 code) {
    if (bits == 8) {
        dst[idx] = (qs_u8)code;
    } else if (bits == 16) {
        ((qs_u16*)dst)[idx] = (qs_u16)code;
    } else {
        ((qs_u32*)dst)[idx] = code;
    }
}

// Elements [lo, hi) of a row whose element e is at element offset first + e * step of `src`
// (bits per element, `extent` elements in the buffer) into dst, packed from element 0. The
// block's threads share the work. Contiguous byte-format rows at 16-byte aligned addresses
// move as 16-byte vectors; everything else element by element (4-bit formats a byte, i.e. two
// elements, per thread). Elements past the extent read as code 0 and flag the copy.
QS_DEVICE void qs_snap_row(const qs_u8* src, qs_u64 first, qs_u64 step, qs_u64 extent, qs_u32 bits, qs_u8* dst,
                           qs_u64 lo, qs_u64 hi, qs_u64 st) {
    if (lo >= hi) return;
    const qs_u32 fmt = bits == 4 ? QS_FMT_E2M1 : bits == 8 ? QS_FMT_INT8 : bits == 16 ? QS_FMT_F16 : QS_FMT_F32;
    const bool in_bounds = first + (hi - 1) * step < extent;
    if (bits >= 8 && step == 1 && in_bounds) {
        const qs_u64 B = bits / 8;
        const qs_u8* s = src + (first + lo) * B;
        qs_u8* d = dst + lo * B;
        const qs_u64 bytes = (hi - lo) * B;
        if ((((qs_u64)s | (qs_u64)d) & 15u) == 0) {
            const qs_u64 vecs = bytes / 16;
            for (qs_u64 v = threadIdx.x; v < vecs; v += blockDim.x) ((uint4*)d)[v] = ((const uint4*)s)[v];
            for (qs_u64 b = vecs * 16 + threadIdx.x; b < bytes; b += blockDim.x) d[b] = s[b];
        } else {
            for (qs_u64 b = threadIdx.x; b < bytes; b += blockDim.x) d[b] = s[b];
        }
        return;
    }
    if (bits == 4) {
        // lo is even (slices are multiples of 128 elements): output byte q holds e = 2q, 2q + 1.
        for (qs_u64 q = lo / 2 + threadIdx.x; q < (hi + 1) / 2; q += blockDim.x) {
            qs_u32 byte = 0;
            for (qs_u64 h = 0; h < 2; ++h) {
                const qs_u64 e = 2 * q + h;
                if (e >= hi) break;
                const qs_u64 off = first + e * step;
                qs_u32 code = 0;
                if (off < extent) {
                    code = qs_load_code_rt(fmt, src, off);
                } else {
                    qs_flag(st, QS_STATUS_OUT_OF_BOUNDS);
                }
                byte |= code << (4 * h);
            }
            dst[q] = (qs_u8)byte;
        }
        return;
    }
    for (qs_u64 e = lo + threadIdx.x; e < hi; e += blockDim.x) {
        const qs_u64 off = first + e * step;
        qs_u32 code = 0;
        if (off < extent) {
            code = qs_load_code_rt(fmt, src, off);
        } else {
            qs_flag(st, QS_STATUS_OUT_OF_BOUNDS);
        }
        qs_store_code(dst, e, bits, code);
    }
}

// Code of a device-pointer scalar, widened to 64 bits (the check reads it with the format).
QS_DEVICE qs_u64 qs_snap_scalar(const QsScalar& s) {
    if (!s.on_device || !s.ptr) return 0;
    return qs_load_code_rt(s.format, (const qs_u8*)s.ptr, 0);
}

// The copy's status bits reach the header tagged with the launch: the check takes them only
// when the tag matches the header's `tag` (a buffer never needs zeroing, even one set up while
// a stream captures).
QS_DEVICE void qs_snap_merge_status(QsSnapHeader* hdr, qs_u64 tag, qs_u32 bits) {
    qs_u64* w = (qs_u64*)&hdr->status;
    qs_u64 old = qs_load_volatile_u64(w);
    for (;;) {
        const qs_u64 want = (tag << 32) | ((old >> 32) == tag ? (old & 0xFFFFFFFFull) : 0) | bits;
        const qs_u64 seen = qs_atomic_cas_u64(w, old, want);
        if (seen == old) return;
        old = seen;
    }
}

QS_DEVICE void qs_snap_body(const QsSnapParams& P, qs_u64 epoch, qs_u64 st) {
    const QsGemmDesc& g = P.g;
    const qs_u64 t = blockIdx.x;
    qs_u64 row = 0;
    if (t >= P.rows.count || !qs_rows_at(P.rows, epoch, t, &row, st)) return;
    qs_u8* out = (qs_u8*)P.out_ptr;
    if (blockIdx.y == 0 && threadIdx.x == 0) ((qs_u64*)(out + sizeof(QsSnapHeader)))[t] = row;
    const qs_u64 item = row / g.m, i = row % g.m;
    const unsigned c = blockIdx.y, C = gridDim.y;
    qs_u64 lo, hi;
    {
        // op(A) row i.
        const QsOpStrides os = qs_op_strides(g.a);
        qs_slice(g.k, c, C, &lo, &hi);
        qs_snap_row((const qs_u8*)g.a.ptr, item * g.a.batch_stride + i * os.rs, os.cs, g.a.extent, QsFmt<QS_A_FMT>::BITS,
                    out + P.a.off + t * P.a.row_bytes, lo, hi, st);
    }
    // D row i, and C row i.
    qs_slice(g.n, c, C, &lo, &hi);
    {
        const bool rowm = g.d.order == QS_ORDER_ROW;
        qs_snap_row((const qs_u8*)g.d.ptr, item * g.d.batch_stride + (rowm ? i * g.d.ld : i), rowm ? 1 : g.d.ld,
                    g.d.extent, QsFmt<QS_D_FMT>::BITS, out + P.d.off + t * P.d.row_bytes, lo, hi, st);
    }
    if (g.c.ptr) {
        const bool rowm = g.c.order == QS_ORDER_ROW;
        qs_snap_row((const qs_u8*)g.c.ptr, item * g.c.batch_stride + (rowm ? i * g.c.ld : i), rowm ? 1 : g.c.ld,
                    g.c.extent, qs_fmt_bits(g.c.format), out + P.c.off + t * P.c.row_bytes, lo, hi, st);
    }
    if (c != 0) return;
    if (g.a_scale.ptr) {
        // A's scale entries of row i (any storage, swizzled included), packed outer-major.
        const QsScaleLookup sc = qs_scale_lookup(g.a_scale);
        const qs_u64 ob = qs_fastdiv(i, sc.bo);
        const qs_u32 bits = qs_fmt_bits(g.a_scale.format);
        qs_u8* dst = out + P.a_scale.off + t * P.a_scale.row_bytes;
        for (qs_u64 ib = threadIdx.x; ib < g.a_scale.grid_inner; ib += blockDim.x) {
            qs_store_code(dst, ib, bits, qs_scale_code(sc, item * sc.batch_stride + qs_scale_entry_index(sc, ob, ib), st));
        }
    }
    if (threadIdx.x == 0 && g.bias.ptr && g.bias.axis == QS_BIAS_ROWS) {
        // Row bias entry i.
        const qs_u32 bits = qs_fmt_bits(g.bias.format);
        qs_u32 code = 0;
        if (i < g.bias.extent) {
            code = qs_load_code_rt(g.bias.format, (const qs_u8*)g.bias.ptr, i);
        } else {
            qs_flag(st, QS_STATUS_OUT_OF_BOUNDS);
        }
        qs_store_code(out + P.bias_off, t, bits, code);
    }
}

// A snapshot copy's row epoch, in two steps so that a copy can overlap the count's round trip:
// eager calls pass the epoch (the host counts them: no atomic on the copy's critical path);
// graph replays take launch L from a counter every block bumps once (called by one thread per
// block), and stream order makes the blocks of one launch see [L * blocks, (L + 1) * blocks).
QS_DEVICE qs_u64 qs_snap_count_launch(const QsSnapParams& P) {
    return P.epoch_counter_ptr ? qs_atomic_add_u64((qs_u64*)P.epoch_counter_ptr, 1) : 0;
}
QS_DEVICE qs_u64 qs_snap_epoch(const QsSnapParams& P, qs_u64 counted) {
    return P.epoch_counter_ptr ? counted / ((qs_u64)gridDim.x * gridDim.y) : P.rows.epoch_value;
}
// The launch tag a snapshot's header carries: (epoch mod 2^31) + 1, never 0.
QS_DEVICE qs_u64 qs_snap_tag(qs_u64 epoch) { return (epoch & 0x7FFFFFFFull) + 1; }

QS_GLOBAL void __launch_bounds__(QS_BLOCK) QS_SKETCH_SNAP(QsSnapParams P) {
    QsSnapHeader* hdr = (QsSnapHeader*)P.out_ptr;
    __shared__ qs_u64 s_epoch;
    __shared__ qs_u32 s_status;  // this block's status bits (qs_flag works on shared addresses)
    if (threadIdx.x == 0) {
        s_epoch = qs_snap_epoch(P, qs_snap_count_launch(P));
        s_status = 0;
    }
    __syncthreads();
    qs_wait_prior_grid();  // an early start: the production GEMM's A, D and scalars after this
    const qs_u64 epoch = s_epoch;
    const qs_u64 tag = qs_snap_tag(epoch);
    if (blockIdx.x == 0 && blockIdx.y == 0) {
        if (threadIdx.x == 0) {
            hdr->tag = tag;
            hdr->epoch = epoch;
        }
        if (threadIdx.x < 5) {
            const QsScalar& sc = threadIdx.x == 0   ? P.g.alpha
                                 : threadIdx.x == 1 ? P.g.a_tensor_scale
                                 : threadIdx.x == 2 ? P.g.b_tensor_scale
                                 : threadIdx.x == 3 ? P.g.beta
                                                    : P.g.d_scale;
            hdr->scalars[threadIdx.x] = qs_snap_scalar(sc);
        }
    }
    qs_snap_body(P, epoch, (qs_u64)&s_status);
    __syncthreads();
    if (threadIdx.x == 0 && s_status != 0) qs_snap_merge_status(hdr, tag, s_status);
}

// qs_sketch_snap_rows_{a}_{d}: the snapshot copy for the common case only, chosen by the host
// (snapshot.rs `lean_copy`): one batch item, contiguous op(A) rows and row-major D rows of byte
// formats whose slices are whole 16-byte vectors inside the buffers, and no C, A scales or row
// bias (device-pointer scalars, such as FP8 tensor scales, are copied into the header). Same
// parameters, grid and result as QS_SKETCH_SNAP (a copy of every row takes qs_sketch_snap_all
// where its 32-bit sizes hold); its small code is the point: the general kernel's size costs ~1.1 us per copy in a decode graph (H100, instruction fetch after each
// GEMV; 0.8 us per FP8 copy node, docs/measurements/2026-11-26-h100-batched-checks.md).
#define QS_SKETCH_SNAP_ROWS QS_CAT5(qs_sketch_snap_rows_, QS_TAG(QS_A_FMT), _, QS_TAG(QS_D_FMT), )

// `na` 16-byte vectors from `sa` to `da` and `nd` from `sd` to `dd` over the block's threads;
// both rows' loads of an iteration are issued before their stores. `I`: the counts' type (the
// every-row copy keeps to 32 bits).
template <typename I>
QS_DEVICE void qs_copy_row_pair(const uint4* sa, uint4* da, I na, const uint4* sd, uint4* dd, I nd) {
    for (I v = threadIdx.x; v < (na > nd ? na : nd); v += blockDim.x) {
        uint4 x, y;
        if (v < na) x = sa[v];
        if (v < nd) y = sd[v];
        if (v < na) da[v] = x;
        if (v < nd) dd[v] = y;
    }
}

// Row t's slice (blockIdx.y of gridDim.y) of op(A) and D into the snapshot, and the row list.
QS_DEVICE void qs_snap_rows_slice(const QsSnapParams& P, qs_u64 t, qs_u64 row) {
    const QsGemmDesc& g = P.g;
    qs_u8* out = (qs_u8*)P.out_ptr;
    if (blockIdx.y == 0 && threadIdx.x == 0) ((qs_u64*)(out + sizeof(QsSnapHeader)))[t] = row;
    const qs_u64 a_bytes = QsFmt<QS_A_FMT>::BITS / 8, d_bytes = QsFmt<QS_D_FMT>::BITS / 8;
    qs_u64 ka, kb, na, nb;
    qs_slice(g.k, blockIdx.y, gridDim.y, &ka, &kb);
    qs_slice(g.n, blockIdx.y, gridDim.y, &na, &nb);
    const uint4* sa = (const uint4*)((const qs_u8*)g.a.ptr + (row * qs_op_strides(g.a).rs + ka) * a_bytes);
    uint4* da = (uint4*)(out + P.a.off + t * P.a.row_bytes + ka * a_bytes);
    const uint4* sd = (const uint4*)((const qs_u8*)g.d.ptr + (row * g.d.ld + na) * d_bytes);
    uint4* dd = (uint4*)(out + P.d.off + t * P.d.row_bytes + na * d_bytes);
    qs_copy_row_pair<qs_u64>(sa, da, (kb - ka) * a_bytes / 16, sd, dd, (nb - na) * d_bytes / 16);
}

// Header tag of a copy of every row (QS_ROWS_ALL): constant, the rows do not depend on the epoch.
#define QS_SNAP_ALL_ROWS_TAG 1ull

// qs_sketch_snap_all: the copy of every row (QsSnapAllParams) for the calls the lean copy serves.
// In a decode graph each copy node sits on the production chain right after its GEMM, so its
// code and parameters are kept to what that copy needs: QS_SKETCH_SNAP_ROWS's code and 672-byte
// parameters cost ~0.3 us more per node (Llama small graph decode, H100, session 22 `exp93`).
// It needs no launch count (its rows do not depend on an epoch), and block (0, 0) writes the
// whole header (tag 1, the host's epoch, scalars, the host's status: rows past the end is the
// only one, known from the parameters) without waiting for the other blocks: the count's round
// trip and a barrier before the header cost ~0.25 us per copy node (H100, session 21 `exp87`).
QS_DEVICE qs_u64 qs_snap_all_scalar(qs_u64 ptr, qs_u32 bits) {
    if (!ptr) return 0;
    const qs_u8* p = (const qs_u8*)ptr;  // element 0's code, as qs_load_code_rt
    return bits == 32 ? *(const qs_u32*)p : bits == 16 ? *(const qs_u16*)p : bits == 8 ? *p : (*p & 0xFu);
}

QS_GLOBAL void __launch_bounds__(QS_BLOCK) qs_sketch_snap_all(QsSnapAllParams P) {
    qs_wait_prior_grid();  // an early start: the production GEMM's A, D and scalars after this
    qs_u8* out = (qs_u8*)P.out_ptr;
    if (blockIdx.x == 0 && blockIdx.y == 0) {
        QsSnapHeader* hdr = (QsSnapHeader*)out;
        const unsigned i = threadIdx.x;
        if (i < 5) {
            // Selected, not indexed: an indexed parameter array would go through local memory.
            hdr->scalars[i] = qs_snap_all_scalar(i == 0   ? P.scalar_ptr[0]
                                                 : i == 1 ? P.scalar_ptr[1]
                                                 : i == 2 ? P.scalar_ptr[2]
                                                 : i == 3 ? P.scalar_ptr[3]
                                                          : P.scalar_ptr[4],
                                                 i == 0   ? P.scalar_bits[0]
                                                 : i == 1 ? P.scalar_bits[1]
                                                 : i == 2 ? P.scalar_bits[2]
                                                 : i == 3 ? P.scalar_bits[3]
                                                          : P.scalar_bits[4]);
        } else if (i == QS_WARP_SIZE) {
            hdr->tag = QS_SNAP_ALL_ROWS_TAG;
            hdr->epoch = P.epoch;
            hdr->status = P.status;
        }
    }
    const unsigned t = blockIdx.x;
    if (t >= P.rows) return;
    if (blockIdx.y == 0 && threadIdx.x == 0) ((qs_u64*)(out + sizeof(QsSnapHeader)))[t] = t;
    // Slice blockIdx.y of gridDim.y of each row, in 16-byte vectors.
    const unsigned va = P.a_bytes / 16, vd = P.d_bytes / 16, splits = gridDim.y, s = blockIdx.y;
    const unsigned pa = (va + splits - 1) / splits, pd = (vd + splits - 1) / splits;
    // qs_min_u32 rather than min(): no overload of the runtime compiler's headers needed.
    const unsigned a0 = qs_min_u32(s * pa, va), a1 = qs_min_u32(a0 + pa, va);
    const unsigned d0 = qs_min_u32(s * pd, vd), d1 = qs_min_u32(d0 + pd, vd);
    const uint4* sa = (const uint4*)(P.a_ptr + t * P.a_ld_bytes) + a0;
    uint4* da = (uint4*)(out + P.a.off + t * P.a.row_bytes) + a0;
    const uint4* sd = (const uint4*)(P.d_ptr + t * P.d_ld_bytes) + d0;
    uint4* dd = (uint4*)(out + P.d.off + t * P.d.row_bytes) + d0;
    qs_copy_row_pair<unsigned>(sa, da, a1 - a0, sd, dd, d1 - d0);
}

QS_GLOBAL void __launch_bounds__(QS_BLOCK) QS_SKETCH_SNAP_ROWS(QsSnapParams P) {
    __shared__ qs_u64 s_epoch;
    __shared__ qs_u32 s_status;
    const QsGemmDesc& g = P.g;
    qs_u64 counted = 0;
    if (threadIdx.x == 0) {
        counted = qs_snap_count_launch(P);
        s_status = 0;
    }
    // Rows drawn by epoch wait for it; a row list's copy starts at once (thread 0 reads
    // `counted` only where it stores the epoch).
    const bool rows_by_epoch = P.rows.mode == QS_ROWS_PERM;
    if (rows_by_epoch && threadIdx.x == 0) s_epoch = qs_snap_epoch(P, counted);
    __syncthreads();
    qs_wait_prior_grid();  // an early start: the production GEMM's A and D after this
    // Device-pointer scalars (FP8 scales are tensors) into the header: loaded here, so that the
    // round trip overlaps the rows' instead of following them.
    const bool header = blockIdx.x == 0 && blockIdx.y == 0;
    qs_u64 scalar = 0;
    if (header && threadIdx.x < 5) {
        scalar = qs_snap_scalar(threadIdx.x == 0   ? g.alpha
                                : threadIdx.x == 1 ? g.a_tensor_scale
                                : threadIdx.x == 2 ? g.b_tensor_scale
                                : threadIdx.x == 3 ? g.beta
                                                   : g.d_scale);
    }
    const qs_u64 t = blockIdx.x;
    qs_u64 row = 0;
    if (t < P.rows.count && qs_rows_at(P.rows, rows_by_epoch ? s_epoch : 0, t, &row, (qs_u64)&s_status))
        qs_snap_rows_slice(P, t, row);
    if (!rows_by_epoch && threadIdx.x == 0) s_epoch = qs_snap_epoch(P, counted);
    __syncthreads();
    QsSnapHeader* hdr = (QsSnapHeader*)P.out_ptr;
    const qs_u64 tag = qs_snap_tag(s_epoch);
    if (header) {
        if (threadIdx.x == 0) {
            hdr->tag = tag;
            hdr->epoch = s_epoch;
        }
        if (threadIdx.x < 5) hdr->scalars[threadIdx.x] = scalar;
    }
    if (threadIdx.x == 0 && s_status != 0) qs_snap_merge_status(hdr, tag, s_status);
}
