#include <cstdio>
#include <cstdint>
#include <random>
typedef uint64_t qs_u64; typedef uint32_t qs_u32;
static qs_u64 qs_mod_small(qs_u64 x, qs_u64 m, double inv_m) {
    if (x < m) return x;
    const qs_u32 hi = (qs_u32)(x >> 32), lo = (qs_u32)x;
    const qs_u64 y = ((qs_u64)(hi % (qs_u32)m) << 32) | lo;
    const qs_u64 q = (qs_u64)((double)y * inv_m);
    long long r = (long long)(y - q * m);
    if (r < 0) r += (long long)m;
    if (r >= (long long)m) r -= (long long)m;
    return (qs_u64)r;
}
int main() {
    std::mt19937_64 g(1); long bad = 0, n = 0;
    qs_u64 ms[] = {1, 2, 3, 7, 255, 256, 4095, 4096, 4097, 65535, 1000003, 0x7FFFFFFF, 0x80000000ull, 0xFFFFFFFEull, 0xFFFFFFFFull};
    for (int it = 0; it < 2000000; ++it) {
        qs_u64 m = (it % 3 == 0) ? ms[it % 15] : (g() >> (g() % 63 + 1)) % 0xFFFFFFFFull + 1;
        double inv = 1.0 / (double)m;
        qs_u64 xs[] = {g(), g() >> (g() % 64), ~0ull, ~0ull - 1, m * (g() % 1000), (qs_u64)(m) * 0xFFFFFFFFull, m - 1, m, m + 1};
        for (qs_u64 x : xs) { ++n; if (qs_mod_small(x, m, inv) != x % m) { if (bad++ < 5) printf("bad x=%llu m=%llu\n", (unsigned long long)x, (unsigned long long)m); } }
        qs_u64 a = g() % m, b = g() % m; ++n;
        if (qs_mod_small(a * b, m, inv) != (qs_u64)(((unsigned __int128)a * b) % m)) { if (bad++ < 5) printf("bad mul\n"); }
    }
    printf("%ld of %ld wrong\n", bad, n);
    return bad != 0;
}
