// Device decoders and encoders for every element and scale format of runtime/src/formats.rs,
// selected by the numeric id of `Format` (its discriminant, part of the record schema).
//
// Decoders are exact: every code of every format has a value representable in f32 except
// I32 beyond 2^24, so `qs_decode_f32` equals formats.rs `decode_code` as f32 for all codes
// but those, and `qs_decode_f64` equals it for every code (NaN compared as NaN: payload bits
// are not part of the contract). Hot loops use the template form `QsFmt<FMT>`, with the
// format a compile-time constant from the kernel's -D defines; small inputs (C, bias, scales,
// device scalars) use the run-time switch `qs_decode_f64_rt`.
//
// Encoders round to nearest, ties to even, from a double:
// - minifloats (FP8, FP4, UE8M0, UE4M3) exactly as formats.rs `encode`: saturate to the
//   largest finite code, NaN to the format's first NaN code (0 where it has none), negative
//   values that round to zero keep the sign except in fnuz formats;
// - f16 / bf16: IEEE round-to-nearest-even, overflow to infinity (what `cvt.rn` and the
//   `half` crate do for f32 inputs; `half` rounds f64 inputs after dropping their low 32
//   mantissa bits, which differs only for values that are not f32-exact);
// - integers: round half to even, clamp to [-max-1, max], NaN -> 0 (formats.rs).
#pragma once
#include "qs_portability.h"

// Format ids: formats.rs `Format` discriminants. Never renumber.
#define QS_FMT_F32 0
#define QS_FMT_F16 1
#define QS_FMT_BF16 2
#define QS_FMT_E4M3FN 3
#define QS_FMT_E4M3FNUZ 4
#define QS_FMT_E5M2 5
#define QS_FMT_E5M2FNUZ 6
#define QS_FMT_E2M1 7
#define QS_FMT_INT8 8
#define QS_FMT_INT4 9
#define QS_FMT_UE8M0 10
#define QS_FMT_UE4M3 11
#define QS_FMT_I32 12
#define QS_FMT_COUNT 13

QS_DEVICE bool qs_fmt_valid(qs_u32 fmt) { return fmt < QS_FMT_COUNT; }

QS_DEVICE qs_u32 qs_fmt_bits(qs_u32 fmt) {
    switch (fmt) {
        case QS_FMT_F32:
        case QS_FMT_I32:
            return 32;
        case QS_FMT_F16:
        case QS_FMT_BF16:
            return 16;
        case QS_FMT_E2M1:
        case QS_FMT_INT4:
            return 4;
        default:
            return 8;
    }
}

// ---- decoders ------------------------------------------------------------------------------

// Magnitude of a minifloat with exponent field e and mantissa m (no NaN/inf handling), built
// from f32 bits so it is exact: normals are in f32's normal range for every format here and
// subnormals are m * 2^(1 - bias - man_bits) with m < 2^man_bits.
template <int MB, int BIAS>
QS_DEVICE float qs_minifloat_mag(qs_u32 e, qs_u32 m) {
    if (e == 0) {
        const float quantum = qs_f32_from_bits((qs_u32)(1 - BIAS - MB + 127) << 23);
        return (float)m * quantum;
    }
    return qs_f32_from_bits(((e + (qs_u32)(127 - BIAS)) << 23) | (m << (23 - MB)));
}

QS_DEVICE float qs_decode_f16_bits(qs_u32 h) {
    qs_u32 s = (h >> 15) & 1u, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    float mag;
    if (e == 0x1F) {
        mag = m == 0 ? qs_inff() : qs_nanf();
    } else if (e == 0) {
        mag = (float)m * qs_f32_from_bits(103u << 23);  // 2^-24
    } else {
        mag = qs_f32_from_bits(((e + 112u) << 23) | (m << 13));
    }
    return s ? -mag : mag;
}

QS_DEVICE float qs_decode_e4m3fn_bits(qs_u32 c) {
    c &= 0xFFu;
    qs_u32 e = (c >> 3) & 0xFu, m = c & 7u;
    if (e == 0xF && m == 7) return qs_nanf();
    float mag = qs_minifloat_mag<3, 7>(e, m);
    return (c & 0x80u) ? -mag : mag;
}

template <int FMT>
struct QsFmt;

template <>
struct QsFmt<QS_FMT_F32> {
    static constexpr int BITS = 32;
    QS_DEVICE static float f32(qs_u32 c) { return qs_f32_from_bits(c); }
    QS_DEVICE static double f64(qs_u32 c) { return (double)qs_f32_from_bits(c); }
};
template <>
struct QsFmt<QS_FMT_F16> {
    static constexpr int BITS = 16;
    QS_DEVICE static float f32(qs_u32 c) { return qs_decode_f16_bits(c & 0xFFFFu); }
    QS_DEVICE static double f64(qs_u32 c) { return (double)f32(c); }
};
template <>
struct QsFmt<QS_FMT_BF16> {
    static constexpr int BITS = 16;
    QS_DEVICE static float f32(qs_u32 c) { return qs_f32_from_bits((c & 0xFFFFu) << 16); }
    QS_DEVICE static double f64(qs_u32 c) { return (double)f32(c); }
};
template <>
struct QsFmt<QS_FMT_E4M3FN> {
    static constexpr int BITS = 8;
    QS_DEVICE static float f32(qs_u32 c) { return qs_decode_e4m3fn_bits(c); }
    QS_DEVICE static double f64(qs_u32 c) { return (double)f32(c); }
};
template <>
struct QsFmt<QS_FMT_E4M3FNUZ> {
    static constexpr int BITS = 8;
    QS_DEVICE static float f32(qs_u32 c) {
        c &= 0xFFu;
        if (c == 0x80u) return qs_nanf();
        float mag = qs_minifloat_mag<3, 8>((c >> 3) & 0xFu, c & 7u);
        return (c & 0x80u) ? -mag : mag;
    }
    QS_DEVICE static double f64(qs_u32 c) { return (double)f32(c); }
};
template <>
struct QsFmt<QS_FMT_E5M2> {
    static constexpr int BITS = 8;
    QS_DEVICE static float f32(qs_u32 c) {
        c &= 0xFFu;
        qs_u32 e = (c >> 2) & 0x1Fu, m = c & 3u;
        float mag = e == 0x1F ? (m == 0 ? qs_inff() : qs_nanf()) : qs_minifloat_mag<2, 15>(e, m);
        return (c & 0x80u) ? -mag : mag;
    }
    QS_DEVICE static double f64(qs_u32 c) { return (double)f32(c); }
};
template <>
struct QsFmt<QS_FMT_E5M2FNUZ> {
    static constexpr int BITS = 8;
    QS_DEVICE static float f32(qs_u32 c) {
        c &= 0xFFu;
        if (c == 0x80u) return qs_nanf();
        float mag = qs_minifloat_mag<2, 16>((c >> 2) & 0x1Fu, c & 3u);
        return (c & 0x80u) ? -mag : mag;
    }
    QS_DEVICE static double f64(qs_u32 c) { return (double)f32(c); }
};
template <>
struct QsFmt<QS_FMT_E2M1> {
    static constexpr int BITS = 4;
    QS_DEVICE static float f32(qs_u32 c) {
        c &= 0xFu;
        float mag = qs_minifloat_mag<1, 1>((c >> 1) & 3u, c & 1u);
        return (c & 0x8u) ? -mag : mag;
    }
    QS_DEVICE static double f64(qs_u32 c) { return (double)f32(c); }
};
template <>
struct QsFmt<QS_FMT_INT8> {
    static constexpr int BITS = 8;
    QS_DEVICE static float f32(qs_u32 c) { return (float)(qs_i8)(qs_u8)(c & 0xFFu); }
    QS_DEVICE static double f64(qs_u32 c) { return (double)f32(c); }
};
template <>
struct QsFmt<QS_FMT_INT4> {
    static constexpr int BITS = 4;
    QS_DEVICE static float f32(qs_u32 c) { return (float)((qs_i32)(c << 28) >> 28); }
    QS_DEVICE static double f64(qs_u32 c) { return (double)f32(c); }
};
template <>
struct QsFmt<QS_FMT_UE8M0> {
    static constexpr int BITS = 8;
    // 2^(e - 127); e = 0 is 2^-127, an f32 subnormal (exact); 0xFF is NaN; no zero, no sign.
    QS_DEVICE static float f32(qs_u32 c) {
        c &= 0xFFu;
        if (c == 0xFFu) return qs_nanf();
        if (c == 0) return qs_f32_from_bits(0x00400000u);
        return qs_f32_from_bits(c << 23);
    }
    QS_DEVICE static double f64(qs_u32 c) { return (double)f32(c); }
};
template <>
struct QsFmt<QS_FMT_UE4M3> {
    static constexpr int BITS = 8;
    // Unsigned E4M3: the sign bit is ignored (formats.rs decodes code & 0x7F as e4m3fn).
    QS_DEVICE static float f32(qs_u32 c) { return qs_decode_e4m3fn_bits(c & 0x7Fu); }
    QS_DEVICE static double f64(qs_u32 c) { return (double)f32(c); }
};
template <>
struct QsFmt<QS_FMT_I32> {
    static constexpr int BITS = 32;
    // Exact only up to 2^24 in f32; use f64() where larger accumulators matter.
    QS_DEVICE static float f32(qs_u32 c) { return (float)(qs_i32)c; }
    QS_DEVICE static double f64(qs_u32 c) { return (double)(qs_i32)c; }
};

// Code of element `idx` of a buffer in a format of `BITS` bits. Packed 4-bit formats hold
// element 2i in the low nibble of byte i. The base must be aligned to the element size
// (checked by the host builders); multi-byte codes are little-endian as on every GPU.
template <int BITS>
QS_DEVICE qs_u32 qs_load_code_bits(const qs_u8* base, qs_u64 idx) {
    if constexpr (BITS == 4) {
        qs_u32 byte = base[idx >> 1];
        return (idx & 1) ? (byte >> 4) : (byte & 0xFu);
    } else if constexpr (BITS == 8) {
        return base[idx];
    } else if constexpr (BITS == 16) {
        return ((const qs_u16*)base)[idx];
    } else {
        return ((const qs_u32*)base)[idx];
    }
}

template <int FMT>
QS_DEVICE float qs_load_f32(const qs_u8* base, qs_u64 idx) {
    return QsFmt<FMT>::f32(qs_load_code_bits<QsFmt<FMT>::BITS>(base, idx));
}
template <int FMT>
QS_DEVICE double qs_load_f64(const qs_u8* base, qs_u64 idx) {
    return QsFmt<FMT>::f64(qs_load_code_bits<QsFmt<FMT>::BITS>(base, idx));
}

// Run-time format: a uniform switch (every thread of a launch takes the same branch).
QS_DEVICE double qs_decode_f64_rt(qs_u32 fmt, qs_u32 code) {
    switch (fmt) {
        case QS_FMT_F32: return QsFmt<QS_FMT_F32>::f64(code);
        case QS_FMT_F16: return QsFmt<QS_FMT_F16>::f64(code);
        case QS_FMT_BF16: return QsFmt<QS_FMT_BF16>::f64(code);
        case QS_FMT_E4M3FN: return QsFmt<QS_FMT_E4M3FN>::f64(code);
        case QS_FMT_E4M3FNUZ: return QsFmt<QS_FMT_E4M3FNUZ>::f64(code);
        case QS_FMT_E5M2: return QsFmt<QS_FMT_E5M2>::f64(code);
        case QS_FMT_E5M2FNUZ: return QsFmt<QS_FMT_E5M2FNUZ>::f64(code);
        case QS_FMT_E2M1: return QsFmt<QS_FMT_E2M1>::f64(code);
        case QS_FMT_INT8: return QsFmt<QS_FMT_INT8>::f64(code);
        case QS_FMT_INT4: return QsFmt<QS_FMT_INT4>::f64(code);
        case QS_FMT_UE8M0: return QsFmt<QS_FMT_UE8M0>::f64(code);
        case QS_FMT_UE4M3: return QsFmt<QS_FMT_UE4M3>::f64(code);
        case QS_FMT_I32: return QsFmt<QS_FMT_I32>::f64(code);
        default: return qs_nan();
    }
}
QS_DEVICE float qs_decode_f32_rt(qs_u32 fmt, qs_u32 code) {
    switch (fmt) {
        case QS_FMT_F32: return QsFmt<QS_FMT_F32>::f32(code);
        case QS_FMT_F16: return QsFmt<QS_FMT_F16>::f32(code);
        case QS_FMT_BF16: return QsFmt<QS_FMT_BF16>::f32(code);
        case QS_FMT_E4M3FN: return QsFmt<QS_FMT_E4M3FN>::f32(code);
        case QS_FMT_E4M3FNUZ: return QsFmt<QS_FMT_E4M3FNUZ>::f32(code);
        case QS_FMT_E5M2: return QsFmt<QS_FMT_E5M2>::f32(code);
        case QS_FMT_E5M2FNUZ: return QsFmt<QS_FMT_E5M2FNUZ>::f32(code);
        case QS_FMT_E2M1: return QsFmt<QS_FMT_E2M1>::f32(code);
        case QS_FMT_INT8: return QsFmt<QS_FMT_INT8>::f32(code);
        case QS_FMT_INT4: return QsFmt<QS_FMT_INT4>::f32(code);
        case QS_FMT_UE8M0: return QsFmt<QS_FMT_UE8M0>::f32(code);
        case QS_FMT_UE4M3: return QsFmt<QS_FMT_UE4M3>::f32(code);
        case QS_FMT_I32: return QsFmt<QS_FMT_I32>::f32(code);
        default: return qs_nanf();
    }
}

QS_DEVICE qs_u32 qs_load_code_rt(qs_u32 fmt, const qs_u8* base, qs_u64 idx) {
    switch (qs_fmt_bits(fmt)) {
        case 4: return qs_load_code_bits<4>(base, idx);
        case 8: return qs_load_code_bits<8>(base, idx);
        case 16: return qs_load_code_bits<16>(base, idx);
        default: return qs_load_code_bits<32>(base, idx);
    }
}
QS_DEVICE double qs_load_f64_rt(qs_u32 fmt, const qs_u8* base, qs_u64 idx) {
    return qs_decode_f64_rt(fmt, qs_load_code_rt(fmt, base, idx));
}
QS_DEVICE float qs_load_f32_rt(qs_u32 fmt, const qs_u8* base, qs_u64 idx) {
    return qs_decode_f32_rt(fmt, qs_load_code_rt(fmt, base, idx));
}

// ---- encoders ------------------------------------------------------------------------------

// Largest non-negative finite code of each minifloat; codes 0..max have increasing values
// (formats.rs CodeTable::sorted_non_negative is exactly that list).
QS_DEVICE qs_u32 qs_minifloat_max_code(qs_u32 fmt) {
    switch (fmt) {
        case QS_FMT_E4M3FN: return 0x7E;
        case QS_FMT_E4M3FNUZ: return 0x7F;
        case QS_FMT_E5M2: return 0x7B;
        case QS_FMT_E5M2FNUZ: return 0x7F;
        case QS_FMT_E2M1: return 0x7;
        case QS_FMT_UE8M0: return 0xFE;
        case QS_FMT_UE4M3: return 0x7E;
        default: return 0;
    }
}
// The first NaN code in code order (formats.rs: position of the first NaN in the table).
QS_DEVICE qs_u32 qs_minifloat_nan_code(qs_u32 fmt) {
    switch (fmt) {
        case QS_FMT_E4M3FN: return 0x7F;
        case QS_FMT_E4M3FNUZ: return 0x80;
        case QS_FMT_E5M2: return 0x7D;
        case QS_FMT_E5M2FNUZ: return 0x80;
        case QS_FMT_UE8M0: return 0xFF;
        case QS_FMT_UE4M3: return 0x7F;
        default: return 0;  // e2m1 has no NaN
    }
}

// formats.rs encode_minifloat: binary search over the monotone codes 0..max, ties to the even
// code, saturating; computed in double like the host so the choice is the same.
QS_DEVICE qs_u32 qs_encode_minifloat(qs_u32 fmt, double value) {
    if (qs_isnan(value)) return qs_minifloat_nan_code(fmt);
    const bool is_signed = !(fmt == QS_FMT_UE8M0 || fmt == QS_FMT_UE4M3);
    // The sign bit, not `value < 0`: -0.0 encodes as negative zero where the format has one,
    // as formats.rs does (is_sign_negative).
    const bool negative = is_signed && (qs_f64_bits(value) >> 63) != 0;
    const double mag = is_signed ? (negative ? -value : value) : (value > 0.0 ? value : 0.0);
    const qs_u32 max_code = qs_minifloat_max_code(fmt);
    // upper = first code whose value >= mag, or max_code + 1 when none is.
    qs_u32 lo = 0, hi = max_code + 1;
    while (lo < hi) {
        qs_u32 mid = (lo + hi) >> 1;
        if (qs_decode_f64_rt(fmt, mid) < mag) lo = mid + 1;
        else hi = mid;
    }
    qs_u32 code;
    if (lo > max_code) {
        code = max_code;
    } else if (lo == 0) {
        code = 0;
    } else {
        double vlo = qs_decode_f64_rt(fmt, lo - 1), vhi = qs_decode_f64_rt(fmt, lo);
        double dlo = mag - vlo, dhi = vhi - mag;
        code = (dlo < dhi || (dlo == dhi && ((lo - 1) & 1u) == 0)) ? lo - 1 : lo;
    }
    const qs_u32 sign_bit = 1u << (qs_fmt_bits(fmt) - 1);
    if (!negative || code == 0) {
        if (negative && code == 0 && !(fmt == QS_FMT_E4M3FNUZ || fmt == QS_FMT_E5M2FNUZ)) return sign_bit;
        return code;
    }
    return code | sign_bit;
}

// IEEE binary format with EB exponent and MB mantissa bits: round to nearest even from a
// double, overflow to infinity, NaN to the quiet NaN with the sign kept.
template <int EB, int MB>
QS_DEVICE qs_u32 qs_encode_ieee(double value) {
    const int bias = (1 << (EB - 1)) - 1;
    const qs_u32 sign = (qs_f64_bits(value) >> 63) ? (1u << (EB + MB)) : 0u;
    const qs_u32 exp_all = ((1u << EB) - 1u) << MB;
    if (qs_isnan(value)) return sign | exp_all | (1u << (MB - 1));
    double mag = value < 0.0 ? -value : value;
    if (qs_isinf(mag)) return sign | exp_all;
    if (mag == 0.0) return sign;
    int e = (int)((qs_f64_bits(mag) >> 52) & 0x7FF) - 1023;  // floor(log2 mag) for normal doubles
    if ((qs_f64_bits(mag) >> 52) == 0) e = -1023;              // double subnormals: far below
    const int emin = 1 - bias;
    int q_exp = (e < emin ? emin : e) - MB;                    // exponent of one unit in the last place
    if (q_exp < -1074 + 52) q_exp = -1074 + 52;                // keep the scaling exact in double
    // mag / 2^q_exp is exact (power-of-two scaling inside double's range); rint rounds to even.
    double scaled = mag * qs_f64_from_bits((qs_u64)(1023 - q_exp) << 52);
    double q = rint(scaled);
    if (e > bias) return sign | exp_all;
    // q in [2^MB, 2^(MB+1)] for normals (2^(MB+1) carries into the exponent), [0, 2^MB] for
    // subnormals: the code is the biased exponent of the unit plus q, which handles both.
    qs_u64 code = (qs_u64)q;
    if (e >= emin) code += (qs_u64)(e - emin) << MB;
    if (code >= exp_all) return sign | exp_all;
    return sign | (qs_u32)code;
}

QS_DEVICE qs_u32 qs_encode_int(qs_u32 bits, double value) {
    if (qs_isnan(value)) return 0;
    const double max = bits == 32 ? 2147483647.0 : (double)((1 << (bits - 1)) - 1);
    double q = rint(value);
    q = q < -max - 1.0 ? -max - 1.0 : (q > max ? max : q);
    qs_u32 mask = bits == 32 ? 0xFFFFFFFFu : ((1u << bits) - 1u);
    return (qs_u32)(qs_i64)q & mask;
}

// formats.rs Format::encode for every element format.
QS_DEVICE qs_u32 qs_encode_rt(qs_u32 fmt, double value) {
    switch (fmt) {
        case QS_FMT_F32: return qs_f32_bits((float)value);
        case QS_FMT_F16: return qs_encode_ieee<5, 10>(value);
        case QS_FMT_BF16: return qs_encode_ieee<8, 7>(value);
        case QS_FMT_INT8: return qs_encode_int(8, value);
        case QS_FMT_INT4: return qs_encode_int(4, value);
        case QS_FMT_I32: return qs_encode_int(32, value);
        default: return qs_encode_minifloat(fmt, value);
    }
}

// Encode then decode: the value D's format stores for `value` (formats.rs Format::round).
QS_DEVICE double qs_round_rt(qs_u32 fmt, double value) { return qs_decode_f64_rt(fmt, qs_encode_rt(fmt, value)); }
