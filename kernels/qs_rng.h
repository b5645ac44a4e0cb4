// Counter-based randomness, bit-exact with runtime/src/rng.rs (mix64, hash3) and
// runtime/src/sketch.rs (probe signs, row permutation): the probe matrix R and the row sample
// need no storage and are the same on the host and on every device.
#pragma once
#include "qs_portability.h"

// SplitMix64 finaliser (rng.rs mix64).
QS_DEVICE qs_u64 qs_mix64(qs_u64 x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

// Hash of (seed, stream, index) (rng.rs hash3).
QS_DEVICE qs_u64 qs_hash3(qs_u64 seed, qs_u64 stream, qs_u64 index) {
    return qs_mix64(qs_mix64(seed ^ qs_mix64(stream)) ^ index);
}

// Probe sign r(j, p) of the N x k Rademacher matrix R: stream p (0..31), index j (column of D),
// +1 when the low bit of hash3(seed, p, j) is 0, -1 when it is 1 (sketch.rs probe_sign).
QS_DEVICE qs_u32 qs_probe_negative(qs_u64 seed, qs_u32 p, qs_u64 j) {
    return (qs_u32)(qs_hash3(seed, (qs_u64)p, j) & 1ull);
}

// x mod m for 0 < m < 2^32, exact, without a 64-bit division (a ~100-instruction subroutine on
// GPUs): y = (hi mod m) * 2^32 + lo has the same residue and y / m < 2^32, so its quotient is
// estimated in f64 (error < 1e-5) and the remainder corrected by at most one m either way.
// inv_m = 1.0 / m.
QS_DEVICE qs_u64 qs_mod_small(qs_u64 x, qs_u64 m, double inv_m) {
    if (x < m) return x;
    const qs_u32 hi = (qs_u32)(x >> 32), lo = (qs_u32)x;
    const qs_u64 y = ((qs_u64)(hi % (qs_u32)m) << 32) | lo;
    const qs_u64 q = (qs_u64)((double)y * inv_m);
    long long r = (long long)(y - q * m);
    if (r < 0) r += (long long)m;
    if (r >= (long long)m) r -= (long long)m;
    return (qs_u64)r;
}

// (a * b) mod m for 0 < m < 2^32, inv_m = 1.0 / m.
QS_DEVICE qs_u64 qs_mulmod_small(qs_u64 a, qs_u64 b, qs_u64 m, double inv_m) {
    return qs_mod_small(qs_mod_small(a, m, inv_m) * qs_mod_small(b, m, inv_m), m, inv_m);
}

// (a * b) mod m without overflow. The fast path covers every realistic row count (< 2^32);
// the loop keeps larger ones exact rather than wrong.
QS_DEVICE qs_u64 qs_mulmod(qs_u64 a, qs_u64 b, qs_u64 m) {
    if (m == 0) return 0;
    if (m <= 0xFFFFFFFFull) return qs_mulmod_small(a, b, m, 1.0 / (double)m);
    a %= m;
    b %= m;
    qs_u64 r = 0;
    while (b) {
        if (b & 1) {
            r = (r >= m - a) ? r - (m - a) : r + a;
        }
        a = (a >= m - a) ? a - (m - a) : a + a;
        b >>= 1;
    }
    return r;
}

// Sample position t of epoch e over T rows with an affine permutation (sketch.rs
// RowPermutation::row): x = (e * S + t) mod T, row = (a * x + b) mod T, gcd(a, T) = 1.
// Successive epochs take consecutive windows of x, so ceil(T / S) epochs cover every row.
QS_DEVICE qs_u64 qs_perm_row(qs_u64 a, qs_u64 b, qs_u64 total, qs_u64 stride, qs_u64 epoch, qs_u64 t) {
    if (total == 0) return 0;
    // Fewer than 2^32 rows (always, in practice): one reciprocal serves every reduction.
    const bool small = total <= 0xFFFFFFFFull;
    const double inv = small ? 1.0 / (double)total : 0.0;
    auto mod = [&](qs_u64 v) { return small ? qs_mod_small(v, total, inv) : v % total; };
    auto mulmod = [&](qs_u64 u, qs_u64 v) { return small ? qs_mulmod_small(u, v, total, inv) : qs_mulmod(u, v, total); };
    qs_u64 x = mulmod(epoch, stride);
    const qs_u64 tt = mod(t);
    x = (x >= total - tt) ? x - (total - tt) : x + tt;
    const qs_u64 r = mulmod(a, x);
    const qs_u64 bb = mod(b);
    return (r >= total - bb) ? r - (total - bb) : r + bb;
}

// The same row when the host has computed the window's start, start = (e * S) mod T
// (QS_ROWS_WINDOW, sketch.rs RowPermutation::window_start): row = (a * ((start + t) mod T) + b)
// mod T for T < 2^32, a, b, start < T and t < T. About 20 dependent instructions where
// qs_perm_row's general reductions take ~400: on an H100 those were ~1.2 us of an eager check's
// path to its first loads (docs/measurements/2026-11-27-h100-row-window.md). Inputs outside
// that contract (a corrupt descriptor) return T, which qs_rows_at flags.
QS_DEVICE qs_u64 qs_window_row(qs_u64 a, qs_u64 b, qs_u64 total, qs_u64 start, qs_u64 t) {
    if (total > 0xFFFFFFFFull || a >= total || b >= total || start >= total || t >= total) return total;
    qs_u64 x = start + t;
    if (x >= total) x -= total;
    const qs_u64 y = a * x;  // < T^2 < 2^64
    // y / T to within one: the f64 roundings of y, 1 / T and their product err by < 2^-19
    // on a quotient below 2^32, so the truncated estimate is q - 1, q or q + 1.
    const qs_u64 q = (qs_u64)((double)y * (1.0 / (double)total));
    long long r = (long long)(y - q * total);
    if (r < 0) r += (long long)total;
    if (r >= (long long)total) r -= (long long)total;
    const qs_u64 v = (qs_u64)r + b;
    return v >= total ? v - total : v;
}
