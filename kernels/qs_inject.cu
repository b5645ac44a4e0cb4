// Fault injection for testing the detector (QUANTSHADOW_INJECT): the device versions of
// runtime/src/inject/transforms.rs, bit-identical to them (same hash, same reduction order,
// explicit fused multiply-adds, no contraction-sensitive expressions).
// Defines: QS_D_FMT (D's element format). Entries (one QsInjectParams by value):
//   qs_inject_output_{d}: grid-stride over rows r = b * M + i, one block (QS_BLOCK = 256
//     threads) per row at a time; ops GARBAGE, HALF, TILE_ROWS, NAN, ZERO, in place on D.
//   qs_inject_scale: grid-stride over (item, outer block, inner block) of a scale grid; ops
//     SCALE_TRANSPOSE (src -> dst with each side's storage) and SCALE_FILL (dst only).
//   qs_inject_permute (QsPermuteParams): grid-stride over (item, x, y) of op(X); the
//     no-transpose operand rewrite (transforms.rs prepare_transpose_fault), src -> dst.
#include "qs_device.h"

#ifndef QS_D_FMT
#error "QS_D_FMT must be defined"
#endif

#if defined(QS_HIP)
#define QS_FMA(a, b, c) __builtin_fma((a), (b), (c))
#else
#define QS_FMA(a, b, c) __fma_rn((a), (b), (c))
#endif

// transforms.rs nan_code: the NaN every side writes.
QS_DEVICE qs_u32 qs_inject_nan_code(qs_u32 fmt) {
    switch (fmt) {
        case QS_FMT_F32: return 0x7FC00000u;
        case QS_FMT_F16: return 0x7E00u;
        case QS_FMT_BF16: return 0x7FC0u;
        case QS_FMT_E4M3FN: return 0x7Fu;
        case QS_FMT_E4M3FNUZ:
        case QS_FMT_E5M2FNUZ: return 0x80u;
        case QS_FMT_E5M2: return 0x7Eu;
        default: return 0u;
    }
}

QS_DEVICE void qs_store_code_bits(qs_u8* base, qs_u32 bits, qs_u64 idx, qs_u32 code) {
    if (bits == 8) base[idx] = (qs_u8)code;
    else if (bits == 16) ((qs_u16*)base)[idx] = (qs_u16)code;
    else ((qs_u32*)base)[idx] = code;
}

// rng.rs unit_f64: 53 high bits, exact.
QS_DEVICE double qs_inject_unit(qs_u64 h) { return (double)(h >> 11) * (1.0 / 9007199254740992.0); }

#define QS_NAME3(a, b) a##b
#define QS_NAME2(a, b) QS_NAME3(a, b)
#if QS_D_FMT == QS_FMT_F32
#define QS_D_NAME f32
#elif QS_D_FMT == QS_FMT_F16
#define QS_D_NAME f16
#elif QS_D_FMT == QS_FMT_BF16
#define QS_D_NAME bf16
#elif QS_D_FMT == QS_FMT_E4M3FN
#define QS_D_NAME e4m3fn
#elif QS_D_FMT == QS_FMT_E4M3FNUZ
#define QS_D_NAME e4m3fnuz
#elif QS_D_FMT == QS_FMT_E5M2
#define QS_D_NAME e5m2
#elif QS_D_FMT == QS_FMT_E5M2FNUZ
#define QS_D_NAME e5m2fnuz
#elif QS_D_FMT == QS_FMT_INT8
#define QS_D_NAME int8
#elif QS_D_FMT == QS_FMT_I32
#define QS_D_NAME i32
#else
#error "qs_inject: D must be an element format of 8 bits or more"
#endif

QS_GLOBAL void QS_NAME2(qs_inject_output_, QS_D_NAME)(QsInjectParams P) {
    __shared__ double partial[QS_BLOCK];
    const qs_u32 fmt = QS_D_FMT;
    const qs_u32 bits = qs_fmt_bits(fmt);
    qs_u8* d = (qs_u8*)P.d.ptr;
    if (P.d.format != fmt || blockDim.x != QS_BLOCK) {
        if (threadIdx.x == 0) qs_flag(P.status_ptr, QS_STATUS_BAD_DESCRIPTOR);
        return;
    }
    const qs_u64 rows = P.batch * P.m;
    qs_u64 nan_g = 0;
    if (P.op == QS_INJECT_NAN) {
        const qs_u64 total = rows * P.n;
        nan_g = qs_hash3(P.seed, QS_INJECT_STREAM_NAN, 0) % (total ? total : 1);
    }
    for (qs_u64 r = blockIdx.x; r < rows; r += gridDim.x) {
        const qs_u64 b = r / P.m, i = r % P.m;
        switch (P.op) {
            case QS_INJECT_GARBAGE: {
                double acc = 0.0;
                for (qs_u64 j = threadIdx.x; j < P.n; j += QS_BLOCK) {
                    const qs_u64 off = qs_out_offset(P.d, b, i, j);
                    double v = off < P.d.extent ? qs_load_f64_rt(fmt, d, off) : 0.0;
                    if (!qs_isfinite(v)) v = 0.0;
                    acc = QS_FMA(v, v, acc);
                }
                partial[threadIdx.x] = acc;
                __syncthreads();
                for (qs_u32 s = QS_BLOCK / 2; s > 0; s >>= 1) {
                    if (threadIdx.x < s) partial[threadIdx.x] = partial[threadIdx.x] + partial[threadIdx.x + s];
                    __syncthreads();
                }
                const double rms = sqrt(partial[0] / (double)P.n);
                __syncthreads();  // partial[0] is read by every thread before the next row reuses it
                for (qs_u64 j = threadIdx.x; j < P.n; j += QS_BLOCK) {
                    const qs_u64 off = qs_out_offset(P.d, b, i, j);
                    if (off >= P.d.extent) {
                        qs_flag(P.status_ptr, QS_STATUS_OUT_OF_BOUNDS);
                        continue;
                    }
                    const double u = qs_inject_unit(qs_hash3(P.seed, QS_INJECT_STREAM_GARBAGE, r * P.n + j));
                    const double t = __dadd_rn(__dmul_rn(u, 2.0), -1.0);
                    const double v = __dmul_rn(__dmul_rn(t, 1.7320508075688772), rms);
                    qs_store_code_bits(d, bits, off, qs_encode_rt(fmt, (double)(float)v));
                }
                break;
            }
            case QS_INJECT_HALF:
                for (qs_u64 j = threadIdx.x; j < P.n; j += QS_BLOCK) {
                    const qs_u64 off = qs_out_offset(P.d, b, i, j);
                    if (off >= P.d.extent) {
                        qs_flag(P.status_ptr, QS_STATUS_OUT_OF_BOUNDS);
                        continue;
                    }
                    const double v = qs_load_f64_rt(fmt, d, off);
                    if (!qs_isnan(v)) qs_store_code_bits(d, bits, off, qs_encode_rt(fmt, v * 0.5));
                }
                break;
            case QS_INJECT_TILE_ROWS:
                if (P.m >= P.tile_min_m && P.tile_period != 0 && i >= 1 && i % P.tile_period == P.tile_offset) {
                    for (qs_u64 j = threadIdx.x; j < P.n; j += QS_BLOCK) {
                        const qs_u64 src = qs_out_offset(P.d, b, i - 1, j), dst = qs_out_offset(P.d, b, i, j);
                        if (src >= P.d.extent || dst >= P.d.extent) {
                            qs_flag(P.status_ptr, QS_STATUS_OUT_OF_BOUNDS);
                            continue;
                        }
                        qs_store_code_bits(d, bits, dst, qs_load_code_rt(fmt, d, src));
                    }
                }
                break;
            case QS_INJECT_NAN:
                if (threadIdx.x == 0 && nan_g / P.n == r) {
                    const qs_u64 off = qs_out_offset(P.d, b, i, nan_g % P.n);
                    if (off < P.d.extent) qs_store_code_bits(d, bits, off, qs_inject_nan_code(fmt));
                    else qs_flag(P.status_ptr, QS_STATUS_OUT_OF_BOUNDS);
                }
                break;
            case QS_INJECT_ZERO:
                for (qs_u64 j = threadIdx.x; j < P.n; j += QS_BLOCK) {
                    const qs_u64 off = qs_out_offset(P.d, b, i, j);
                    if (off < P.d.extent) qs_store_code_bits(d, bits, off, 0u);
                    else qs_flag(P.status_ptr, QS_STATUS_OUT_OF_BOUNDS);
                }
                break;
            default:
                if (threadIdx.x == 0 && r == blockIdx.x) qs_flag(P.status_ptr, QS_STATUS_BAD_DESCRIPTOR);
                return;
        }
    }
}

// Scale rewrites: both descriptors describe the same grid (format, blocks, grid extents); only
// storage, ld and batch stride may differ. qs_scale_entry_index is problem.rs entry_index.
QS_GLOBAL void qs_inject_scale(QsInjectParams P) {
    const QsScaleLookup src = qs_scale_lookup(P.src);
    const QsScaleLookup dst = qs_scale_lookup(P.dst);
    const qs_u32 bits = qs_fmt_bits(P.dst.format);
    const qs_u64 go = P.dst.grid_outer, gi = P.dst.grid_inner;
    const qs_u64 total = P.scale_items * go * gi;
    qs_u8* out = (qs_u8*)P.dst.ptr;
    if (!qs_scale_format_ok(P.dst.format) || (P.op == QS_INJECT_SCALE_TRANSPOSE && P.src.format != P.dst.format)) {
        if (blockIdx.x == 0 && threadIdx.x == 0) qs_flag(P.status_ptr, QS_STATUS_BAD_DESCRIPTOR);
        return;
    }
    for (qs_u64 t = (qs_u64)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (qs_u64)gridDim.x * blockDim.x) {
        const qs_u64 b = t / (go * gi), o = (t / gi) % go, ib = t % gi;
        const qs_u64 de = b * dst.batch_stride + qs_scale_entry_index(dst, o, ib);
        if (de >= dst.extent) {
            qs_flag(P.status_ptr, QS_STATUS_OUT_OF_BOUNDS);
            continue;
        }
        qs_u32 code = P.fill_code;
        if (P.op == QS_INJECT_SCALE_TRANSPOSE) {
            const qs_u64 se = b * src.batch_stride + qs_scale_entry_index(src, o, ib);
            if (se >= src.extent) {
                qs_flag(P.status_ptr, QS_STATUS_OUT_OF_BOUNDS);
                continue;
            }
            code = qs_load_code_rt(P.src.format, src.ptr, se);
        }
        qs_store_code_bits(out, bits, de, code);
    }
}

// No-transpose: dst (the caller's operand) gets, at each element's declared position, what the
// saved original (src) holds at that element's position under the flipped transpose. Positions
// the declared layout never reads keep their bytes. Consecutive threads take consecutive y.
QS_GLOBAL void qs_inject_permute(QsPermuteParams P) {
    if (P.elem_bytes != 1 && P.elem_bytes != 2 && P.elem_bytes != 4) {
        if (blockIdx.x == 0 && threadIdx.x == 0) qs_flag(P.status_ptr, QS_STATUS_BAD_DESCRIPTOR);
        return;
    }
    const qs_u64 plane = P.outer * P.inner;
    const qs_u64 total = P.batch * plane;
    const qs_u8* src = (const qs_u8*)P.src_ptr;
    qs_u8* dst = (qs_u8*)P.dst_ptr;
    for (qs_u64 t = (qs_u64)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (qs_u64)gridDim.x * blockDim.x) {
        const qs_u64 b = t / plane, x = (t % plane) / P.inner, y = t % P.inner;
        const qs_u64 so = b * P.src_batch_stride + x * P.src_outer_stride + y * P.src_inner_stride;
        const qs_u64 de = b * P.dst_batch_stride + x * P.dst_outer_stride + y * P.dst_inner_stride;
        if (so >= P.src_extent || de >= P.dst_extent) {
            qs_flag(P.status_ptr, QS_STATUS_OUT_OF_BOUNDS);
            continue;
        }
        if (P.elem_bytes == 1) dst[de] = src[so];
        else if (P.elem_bytes == 2) ((qs_u16*)dst)[de] = ((const qs_u16*)src)[so];
        else ((qs_u32*)dst)[de] = ((const qs_u32*)src)[so];
    }
}
