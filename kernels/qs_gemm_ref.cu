// Reference GEMM: FP32 accumulation over operands decoded under the call's declared contract
// (formats, scales, layouts), then the epilogue (problem.rs module doc):
//   out[t][j] = d_scale * act(alpha a_ts b_ts sum_k a sa b sb + beta c + bias)  (rounded to D's
//   format when round_to_d), i.e. what D should hold, in D's units.
//
// A classic register-blocked SGEMM: 128 x 128 block tile, BK = 8, 256 threads, 8 x 8 outputs
// per thread, double-buffered shared memory with register prefetch; the tile loaders decode
// (and scale) while staging into shared memory, so the inner loop is plain FFMA on f32. Each
// loader picks its thread mapping from the operand's contiguous dimension (K-contiguous or
// outer-contiguous) so that both nn.Linear weights and row-major activations are read along
// memory. Any M/N/K edge, layout, transpose, batch and leading dimension is handled.
//
// Build defines: QS_A_FMT, QS_B_FMT. Entries (one QsRefParams by value, 256 threads):
//   qs_gemm_ref_{a}_{b}       grid (ceil(N/128), ceil(M/128), batch); rows = ALL, t = b*M + i
//   qs_gemm_ref_rows_{a}_{b}  grid (ceil(N/128), ceil(count/128), B batched ? batch : 1);
//                             row t of the selection -> out row t
#include "qs_device.h"

#if !defined(QS_A_FMT) || !defined(QS_B_FMT)
#error "qs_gemm_ref.cu needs -DQS_A_FMT and -DQS_B_FMT"
#endif

#define QS_GEMM_REF QS_CAT5(qs_gemm_ref_, QS_TAG(QS_A_FMT), _, QS_TAG(QS_B_FMT), )
#define QS_GEMM_REF_ROWS QS_CAT5(qs_gemm_ref_rows_, QS_TAG(QS_A_FMT), _, QS_TAG(QS_B_FMT), )

#define QS_BM 128
#define QS_BN 128
#define QS_BK 8
#define QS_GEMM_THREADS 256
#define QS_PAD 4 /* row pitch 132 floats: conflict-free stores from the K-contiguous mapping */

// Per-tile tables built once per block: for each of the 128 rows of A's tile and columns of
// B's, the element offset of (outer, k = 0) (~0 when the row/column is outside the problem or
// filtered out) and the scale entry's row part (batch item included). Keeping them in shared
// memory rather than registers leaves the registers to the 8 x 8 accumulators.
struct QsTileTables {
    qs_u64 a_off[QS_BM], a_sc[QS_BM];
    qs_u64 b_off[QS_BN], b_sc[QS_BN];
    qs_u64 out_row[QS_BM];  // output row t, ~0 = no output
    qs_u64 row_item[QS_BM], row_i[QS_BM];
};

// Element decode in the loaders: formats of 8 bits or less through a 256-entry table in shared
// memory (one load instead of a dozen integer ops), f16 through the hardware conversion.
template <int FMT>
QS_DEVICE float qs_tile_decode(qs_u32 code, const float* lut) {
    if constexpr (QsFmt<FMT>::BITS <= 8) {
        return lut[code];
    } else if constexpr (FMT == QS_FMT_F16) {
#if defined(QS_CUDA)
        float f;
        const unsigned short h = (unsigned short)code;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
#else
        return QsFmt<FMT>::f32(code);
#endif
    } else {
        return QsFmt<FMT>::f32(code);
    }
}

// One operand's share of a BK x 128 tile: 4 elements per thread per k-step.
// K-contiguous mapping: outer o = tid / 2, k = (tid % 2) * 4 + q (4 consecutive k of one row).
// Outer-contiguous mapping: k = tid / 32, o = (tid % 32) * 4 + q (4 consecutive rows/cols).
// The mapping is a uniform run-time choice (one code path, not four instantiations). The 4
// elements of a thread are adjacent in memory in both mappings (full variant), so interior tiles
// take one vector load per operand per k-step with no per-element checks (`vec`); edge tiles,
// gathered rows and odd leading dimensions go element by element. Codes are held packed between
// the prefetch and the store (4 FP8 codes in one register), which keeps the 8 x 8 accumulators
// out of local memory; scale codes only exist when SCALED, and are fetched once per group of 4
// when the scale block covers the group.
template <int FMT, bool SCALED>
struct QsTileLoader {
    static constexpr int BITS = QsFmt<FMT>::BITS;
    static constexpr int NW = (4 * BITS + 31) / 32;
    bool kcontig, vec, sc_shared;
    qs_u64 vbase;  // vec: element offset of element 0 of the thread's group at k = 0
    qs_u64 sbase;  // vec && sc_shared: scale row part of the group
    qs_u32 ok;     // bit q: element q of the current prefetch is real (else 0)
    qs_u32 pk[NW];
    float sval[SCALED ? 4 : 1];  // general path: decoded scale of each element of the prefetch
    float s_shared;              // fast path: the scale of the whole group of 4
    qs_u64 sc_ib;                // fast path: inner block of s_shared (it changes once per block)

    QS_DEVICE int k_of(int q) const { return kcontig ? (threadIdx.x & 1) * 4 + q : threadIdx.x >> 5; }
    QS_DEVICE int o_of(int q) const { return kcontig ? threadIdx.x >> 1 : (threadIdx.x & 31) * 4 + q; }

    QS_DEVICE qs_u32 code(int q) const {
        if (BITS == 32) return pk[q];
        return (pk[(q * BITS) / 32] >> ((q * BITS) % 32)) & ((1u << (BITS & 31)) - 1u);
    }

    // Uniform set-up: kstride is op(X)'s stride along k; `interior` says every row/column of
    // the tile exists and every element of it over the whole K range is inside the extent.
    QS_DEVICE void setup(const qs_u64* off_tab, const qs_u64* sc_tab, const QsMatrixDesc& mat, qs_u64 kstride,
                         const QsScaleDesc& scd, bool gathered, bool interior) {
        kcontig = kstride == 1;
        const qs_u64 align_bytes = (qs_u64)BITS / 2;  // 4 elements
        sc_shared = SCALED && scd.ptr && (kcontig ? scd.block_inner % 4 == 0 : scd.block_outer % 4 == 0);
        // The fast path holds one scale for the group of 4 (shared scales), or, when the group runs
        // along the outer dimension (one k), the 4 per-element scales, fetched once per scale
        // block: per-channel scales of a row-major B stay on the vector path.
        vec = interior && mat.ld % 4 == 0 && mat.batch_stride % 4 == 0 && mat.ptr % align_bytes == 0 &&
              (kcontig || !gathered) && (!scd.ptr || sc_shared || !kcontig);
        vbase = vec ? off_tab[o_of(0)] + (kcontig ? (qs_u64)k_of(0) : 0) : 0;
        sbase = sc_shared ? sc_tab[o_of(0)] : 0;
        sc_ib = ~0ull;
        s_shared = 1.0f;
    }

    // Scales are decoded when fetched (the k-tiles of one scale block reuse the value, so the
    // dependent load is rare for block scales).
    QS_DEVICE void fetch_scale(int q, qs_u64 e, const QsScaleDesc& scd, qs_u64 st) {
        if (e < scd.extent) {
            sval[q] = qs_decode_scale(scd.format, qs_load_code_rt(scd.format, (const qs_u8*)scd.ptr, e));
        } else {
            sval[q] = 0.0f;
            qs_flag(st, QS_STATUS_OUT_OF_BOUNDS);
        }
    }

    // Interior tile with `vec`: one vector load, no checks (the caller guarantees k0 + BK <= K).
    QS_DEVICE void fetch_vec(qs_u64 k0, const qs_u64* sc_tab, const QsMatrixDesc& mat, qs_u64 kstride,
                             const QsScaleDesc& scd, const QsFastDiv& bi, qs_u64 st) {
        {
            const qs_u64 off = vbase + (kcontig ? k0 : (k0 + (qs_u64)k_of(0)) * kstride);
            const qs_u8* p = (const qs_u8*)mat.ptr + (off * BITS) / 8;
            if constexpr (BITS == 4) {
                pk[0] = *(const qs_u16*)p;
            } else if constexpr (BITS == 8) {
                pk[0] = *(const qs_u32*)p;
            } else if constexpr (BITS == 16) {
                const uint2 v = *(const uint2*)p;
                pk[0] = v.x;
                pk[1] = v.y;
            } else {
                const uint4 v = *(const uint4*)p;
                pk[0] = v.x;
                pk[1] = v.y;
                pk[2] = v.z;
                pk[3] = v.w;
            }
            ok = 0xFu;
            if (SCALED && scd.ptr) {
                const qs_u64 ib = qs_fastdiv(k0 + (qs_u64)k_of(0), bi);
                if (ib != sc_ib) {
                    sc_ib = ib;
                    if (sc_shared) {
                        const qs_u64 e = sbase + qs_scale_inner_part(scd.storage, scd.ld, ib);
                        if (e < scd.extent) {
                            s_shared =
                                qs_decode_scale(scd.format, qs_load_code_rt(scd.format, (const qs_u8*)scd.ptr, e));
                        } else {
                            s_shared = 0.0f;
                            qs_flag(st, QS_STATUS_OUT_OF_BOUNDS);
                        }
                    } else {
                        // Outer-contiguous group (one k): one scale per element.
                        const qs_u64 inner = qs_scale_inner_part(scd.storage, scd.ld, ib);
#pragma unroll
                        for (int q = 0; q < 4; ++q) fetch_scale(q, sc_tab[o_of(q)] + inner, scd, st);
                    }
                }
            }
        }
    }

    // Any tile: element by element, every index checked. off_tab/sc_tab: the operand's tables;
    // mat/scd: its descriptors (parameter space).
    QS_DEVICE void fetch(qs_u64 k0, const qs_u64* off_tab, const qs_u64* sc_tab, const QsMatrixDesc& mat,
                         qs_u64 kstride, const QsScaleDesc& scd, const QsFastDiv& bi, qs_u64 K, qs_u64 st) {
        ok = 0;
        sc_ib = ~0ull;
#pragma unroll
        for (int w = 0; w < NW; ++w) pk[w] = 0;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const qs_u64 k = k0 + k_of(q);
            const qs_u64 ob = off_tab[o_of(q)];
            if (SCALED) sval[q] = 0.0f;
            if (ob != ~0ull && k < K) {
                const qs_u64 off = ob + k * kstride;
                if (off < mat.extent) {
                    const qs_u32 c = qs_load_code_bits<BITS>((const qs_u8*)mat.ptr, off);
                    if (BITS == 32) pk[q] = c;
                    else pk[(q * BITS) / 32] |= c << ((q * BITS) % 32);
                    ok |= 1u << q;
                    if (SCALED && scd.ptr)
                        fetch_scale(q, sc_tab[o_of(q)] + qs_scale_inner_part(scd.storage, scd.ld, qs_fastdiv(k, bi)),
                                    scd, st);
                } else {
                    qs_flag(st, QS_STATUS_OUT_OF_BOUNDS);
                }
            }
        }
    }

    QS_DEVICE void store(float* tile /* [BK][128 + PAD] */, const QsScaleDesc& scd, const float* lut) const {
        float v[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            float x = qs_tile_decode<FMT>(code(q), lut);
            if (SCALED && scd.ptr) x *= sval[q];
            v[q] = ((ok >> q) & 1u) ? x : 0.0f;
        }
        put(tile, v);
    }

    // After fetch_vec: every element real; one scale for the group, or one per element.
    QS_DEVICE void store_vec(float* tile, const QsScaleDesc& scd, const float* lut) const {
        float v[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            v[q] = qs_tile_decode<FMT>(code(q), lut);
            if (SCALED && scd.ptr) v[q] *= sc_shared ? s_shared : sval[q];
        }
        put(tile, v);
    }

    QS_DEVICE void put(float* tile, const float (&v)[4]) const {
        if (kcontig) {
#pragma unroll
            for (int q = 0; q < 4; ++q) tile[k_of(q) * (128 + QS_PAD) + o_of(q)] = v[q];
        } else {
            *(float4*)&tile[k_of(0) * (128 + QS_PAD) + o_of(0)] = make_float4(v[0], v[1], v[2], v[3]);
        }
    }
};

// Epilogue inputs, staged in shared memory once per block.
struct QsEpilogue {
    QsMatrixDesc c;
    QsBiasDesc bias;
    double alpha, beta, d_scale;
    qs_u64 status_ptr;
    qs_u32 activation, d_format, round_to_d, reserved;
};

// d_scale * act(alpha acc + beta c + bias), optionally rounded to D's format.
__device__ __noinline__ float qs_ref_epilogue(const QsEpilogue* e, float acc, qs_u64 item, qs_u64 i, qs_u64 j) {
    double v = e->alpha * (double)acc;
    if (e->c.ptr) v += e->beta * qs_load_checked_rt(e->c, qs_out_offset(e->c, item, i, j), e->status_ptr);
    if (e->bias.ptr) v += qs_bias_value(e->bias, e->bias.axis == QS_BIAS_ROWS ? i : j, e->status_ptr);
    v = qs_activation(e->activation, v) * e->d_scale;
    if (e->round_to_d) v = qs_round_rt(e->d_format, v);
    return (float)v;
}

// acc += As[cur] x Bs[cur] for one BK-deep tile: 8 x 8 outputs per thread, rows ty*4..+3 and
// 64+ty*4..+3, columns tx*4..+3 and 64+tx*4..+3 (float4 shared loads, broadcast across the warp).
QS_DEVICE void qs_tile_fma(float (&acc)[8][8], const float (&As)[QS_BK][QS_BM + QS_PAD],
                           const float (&Bs)[QS_BK][QS_BN + QS_PAD], int tx, int ty) {
#pragma unroll
    for (int kk = 0; kk < QS_BK; ++kk) {
        const float4 a0 = *(const float4*)&As[kk][ty * 4];
        const float4 a1 = *(const float4*)&As[kk][64 + ty * 4];
        const float4 b0 = *(const float4*)&Bs[kk][tx * 4];
        const float4 b1 = *(const float4*)&Bs[kk][64 + tx * 4];
        const float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        const float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
        for (int r = 0; r < 8; ++r)
#pragma unroll
            for (int c = 0; c < 8; ++c) acc[r][c] = fmaf(a[r], b[c], acc[r][c]);
    }
}

// Shared staging, declared once in the dispatcher so the four mapping instantiations share it.
struct QsGemmSmem {
    float a[2][QS_BK][QS_BM + QS_PAD];
    float b[2][QS_BK][QS_BN + QS_PAD];
    QsTileTables tab;
    QsEpilogue epi;
    float lut_a[256], lut_b[256];
};

// Fills the tile tables. Full variant: tile row t -> item blockIdx.z, i = t. Rows variant:
// tile row -> sample position t -> global row (item, i); with a batched B, grid.z walks the
// items and each block keeps only its item's rows.
// Returns, for the calling thread's table entry, whether it is "interior": the row/column exists
// and its last element over the whole K range is inside the operand's extent.
template <bool ROWS>
QS_DEVICE bool qs_gemm_tables(const QsRefParams& P, QsTileTables& tab, bool b_batched, qs_u64 b_item) {
    const QsGemmDesc& g = P.g;
    const int tid = threadIdx.x;
    if (tid < QS_BM) {
        const qs_u64 tl = (qs_u64)blockIdx.y * QS_BM + tid;
        bool ok = false;
        qs_u64 item = 0, i = 0, t = 0;
        if (!ROWS) {
            if (tl < g.m) {
                ok = true;
                item = blockIdx.z;
                i = tl;
                t = item * g.m + tl;
            }
        } else if (tl < P.rows.count) {
            qs_u64 row;
            if (qs_rows_at(P.rows, qs_rows_epoch(P.rows), tl, &row, P.status_ptr)) {
                item = row / g.m;
                i = row % g.m;
                t = tl;
                ok = !b_batched || item == blockIdx.z;
            }
        }
        const QsOpStrides as = qs_op_strides(g.a);
        tab.a_off[tid] = ok ? item * g.a.batch_stride + i * as.rs : ~0ull;
        tab.out_row[tid] = ok ? t : ~0ull;
        tab.row_item[tid] = item;
        tab.row_i[tid] = i;
        const QsScaleLookup sc = qs_scale_lookup(g.a_scale);
        tab.a_sc[tid] = sc.present ? item * sc.batch_stride + qs_scale_row_part(sc, qs_fastdiv(i, sc.bo)) : 0;
        return ok && item * g.a.batch_stride + i * as.rs + (g.k - 1) * as.cs < g.a.extent;
    } else {
        const int o = tid - QS_BM;
        const qs_u64 j = (qs_u64)blockIdx.x * QS_BN + o;
        const QsOpStrides bs = qs_op_strides(g.b);
        tab.b_off[o] = j < g.n ? b_item * g.b.batch_stride + j * bs.cs : ~0ull;
        const QsScaleLookup sc = qs_scale_lookup(g.b_scale);
        tab.b_sc[o] = sc.present ? b_item * sc.batch_stride + qs_scale_row_part(sc, qs_fastdiv(j, sc.bo)) : 0;
        return j < g.n && b_item * g.b.batch_stride + j * bs.cs + (g.k - 1) * bs.rs < g.b.extent;
    }
}

template <bool ROWS, bool SCALED>
QS_DEVICE void qs_gemm_body(const QsRefParams& P, QsGemmSmem& sm) {
    float(&As)[2][QS_BK][QS_BM + QS_PAD] = sm.a;
    float(&Bs)[2][QS_BK][QS_BN + QS_PAD] = sm.b;
    const QsGemmDesc& g = P.g;
    const qs_u64 st = P.status_ptr;
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const bool b_batched = g.b.batch_stride != 0 || (g.b_scale.ptr != 0 && g.b_scale.batch_stride != 0);
    const qs_u64 b_item = ROWS ? (b_batched ? blockIdx.z : 0) : blockIdx.z;

    const bool mine_interior = qs_gemm_tables<ROWS>(P, sm.tab, b_batched, b_item);
    constexpr int A_BITS = QsFmt<QS_A_FMT>::BITS, B_BITS = QsFmt<QS_B_FMT>::BITS;
    if (A_BITS <= 8 && tid < (1 << A_BITS)) sm.lut_a[tid] = QsFmt<QS_A_FMT>::f32(tid);
    if (B_BITS <= 8 && tid < (1 << B_BITS)) sm.lut_b[tid] = QsFmt<QS_B_FMT>::f32(tid);
    // Every row and column of the tile exists and is in bounds over all of K: no checks inside.
    const bool interior = __syncthreads_and(mine_interior);
    bool any_rows = false;
    if (tid < QS_BM) any_rows = sm.tab.a_off[tid] != ~0ull;
    // Blocks whose rows are all filtered out (rows variant, other batch item) skip the K loop.
    any_rows = __syncthreads_or(any_rows);

    const qs_u64 a_ks = qs_op_strides(g.a).cs;  // op(A)(i, k): k stride
    const qs_u64 b_ks = qs_op_strides(g.b).rs;  // op(B)(k, j): k stride
    const QsFastDiv a_bi = qs_fastdiv_make(g.a_scale.block_inner);
    const QsFastDiv b_bi = qs_fastdiv_make(g.b_scale.block_inner);
    QsTileLoader<QS_A_FMT, SCALED> la;
    QsTileLoader<QS_B_FMT, SCALED> lb;
    la.setup(sm.tab.a_off, sm.tab.a_sc, g.a, a_ks, g.a_scale, ROWS, interior);
    lb.setup(sm.tab.b_off, sm.tab.b_sc, g.b, b_ks, g.b_scale, false, interior);

    float acc[8][8];
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int c = 0; c < 8; ++c) acc[r][c] = 0.0f;

    const qs_u64 ktiles = (g.k + QS_BK - 1) / QS_BK;
    const qs_u64 nfull = g.k / QS_BK;
    if (any_rows && ktiles > 0) {
        if (la.vec && lb.vec && nfull > 0) {
            // Fast loop over the full k-tiles of an interior block: vector loads, no checks.
            la.fetch_vec(0, sm.tab.a_sc, g.a, a_ks, g.a_scale, a_bi, st);
            lb.fetch_vec(0, sm.tab.b_sc, g.b, b_ks, g.b_scale, b_bi, st);
            la.store_vec(&As[0][0][0], g.a_scale, sm.lut_a);
            lb.store_vec(&Bs[0][0][0], g.b_scale, sm.lut_b);
            __syncthreads();
            for (qs_u64 kt = 0; kt < nfull; ++kt) {
                const int cur = kt & 1;
                const bool more = kt + 1 < nfull;
                if (more) {
                    la.fetch_vec((kt + 1) * QS_BK, sm.tab.a_sc, g.a, a_ks, g.a_scale, a_bi, st);
                    lb.fetch_vec((kt + 1) * QS_BK, sm.tab.b_sc, g.b, b_ks, g.b_scale, b_bi, st);
                }
                qs_tile_fma(acc, As[cur], Bs[cur], tx, ty);
                if (more) {
                    la.store_vec(&As[cur ^ 1][0][0], g.a_scale, sm.lut_a);
                    lb.store_vec(&Bs[cur ^ 1][0][0], g.b_scale, sm.lut_b);
                }
                __syncthreads();
            }
            if (nfull < ktiles) {
                // The partial last k-tile, peeled so its checks stay out of the fast loop.
                la.fetch(nfull * QS_BK, sm.tab.a_off, sm.tab.a_sc, g.a, a_ks, g.a_scale, a_bi, g.k, st);
                lb.fetch(nfull * QS_BK, sm.tab.b_off, sm.tab.b_sc, g.b, b_ks, g.b_scale, b_bi, g.k, st);
                la.store(&As[0][0][0], g.a_scale, sm.lut_a);
                lb.store(&Bs[0][0][0], g.b_scale, sm.lut_b);
                __syncthreads();
                qs_tile_fma(acc, As[0], Bs[0], tx, ty);
            }
        } else {
            la.fetch(0, sm.tab.a_off, sm.tab.a_sc, g.a, a_ks, g.a_scale, a_bi, g.k, st);
            lb.fetch(0, sm.tab.b_off, sm.tab.b_sc, g.b, b_ks, g.b_scale, b_bi, g.k, st);
            la.store(&As[0][0][0], g.a_scale, sm.lut_a);
            lb.store(&Bs[0][0][0], g.b_scale, sm.lut_b);
            __syncthreads();
            for (qs_u64 kt = 0; kt < ktiles; ++kt) {
                const int cur = kt & 1;
                const bool more = kt + 1 < ktiles;
                if (more) {
                    la.fetch((kt + 1) * QS_BK, sm.tab.a_off, sm.tab.a_sc, g.a, a_ks, g.a_scale, a_bi, g.k, st);
                    lb.fetch((kt + 1) * QS_BK, sm.tab.b_off, sm.tab.b_sc, g.b, b_ks, g.b_scale, b_bi, g.k, st);
                }
                qs_tile_fma(acc, As[cur], Bs[cur], tx, ty);
                if (more) {
                    la.store(&As[cur ^ 1][0][0], g.a_scale, sm.lut_a);
                    lb.store(&Bs[cur ^ 1][0][0], g.b_scale, sm.lut_b);
                }
                __syncthreads();
            }
        }
    }

    // ---- epilogue ----
    // One non-inlined call per output element: the run-time format switches and the minifloat
    // encoder would otherwise be unrolled 64 times per instantiation (minutes of NVRTC time);
    // the epilogue is a negligible share of the GEMM's time.
    if (tid == 0) {
        QsEpilogue& e = sm.epi;
        e.c = g.c;
        e.bias = g.bias;
        e.alpha = qs_read_scalar(g.alpha) * qs_read_scalar(g.a_tensor_scale) * qs_read_scalar(g.b_tensor_scale);
        e.beta = g.c.ptr ? qs_read_scalar(g.beta) : 0.0;
        e.d_scale = qs_read_scalar(g.d_scale);
        e.status_ptr = st;
        e.activation = g.activation;
        e.d_format = g.d.format;
        e.round_to_d = P.round_to_d;
    }
    __syncthreads();
    float* out = (float*)P.out_ptr;
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        const int lr = (r < 4 ? 0 : 64) + ty * 4 + (r & 3);
        const qs_u64 t = sm.tab.out_row[lr];
        if (t == ~0ull) continue;
        const qs_u64 item = sm.tab.row_item[lr], i = sm.tab.row_i[lr];
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            const qs_u64 j = (qs_u64)blockIdx.x * QS_BN + (c < 4 ? 0 : 64) + tx * 4 + (c & 3);
            if (j >= g.n) continue;
            out[t * P.out_ld + j] = qs_ref_epilogue(&sm.epi, acc[r][c], item, i, j);
        }
    }
}

template <bool ROWS>
QS_DEVICE void qs_gemm_dispatch(const QsRefParams& P) {
    __shared__ __align__(16) QsGemmSmem sm;
    const bool scales_ok = (!P.g.a_scale.ptr || qs_scale_format_ok(P.g.a_scale.format)) &&
                           (!P.g.b_scale.ptr || qs_scale_format_ok(P.g.b_scale.format));
    if (P.g.a.format != QS_A_FMT || P.g.b.format != QS_B_FMT || blockDim.x != QS_GEMM_THREADS || P.g.m == 0 ||
        !scales_ok) {
        qs_flag(P.status_ptr, QS_STATUS_BAD_DESCRIPTOR);
        return;
    }
    if (P.g.a_scale.ptr || P.g.b_scale.ptr) qs_gemm_body<ROWS, true>(P, sm);
    else qs_gemm_body<ROWS, false>(P, sm);
}

QS_GLOBAL void __launch_bounds__(QS_GEMM_THREADS, 2) QS_GEMM_REF(QsRefParams P) {
    if (!qs_gate_take(P.gate_ptr, P.gate_first, P.gate_every)) return;
    qs_gemm_dispatch<false>(P);
}

QS_GLOBAL void __launch_bounds__(QS_GEMM_THREADS, 2) QS_GEMM_REF_ROWS(QsRefParams P) {
    if (!qs_gate_take(P.gate_ptr, P.gate_first, P.gate_every)) return;
    qs_gemm_dispatch<true>(P);
}
