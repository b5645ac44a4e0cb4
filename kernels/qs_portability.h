// quantshadow device code: the one place where CUDA (NVRTC) and HIP (hipRTC) differ.
//
// Every kernel source is compiled at run time from one text, with no system headers (NVRTC
// has none), so this header defines the fixed-width types, the warp/wavefront width, the
// shuffles and the bit casts that the rest of the device code uses. Nothing else may test
// QS_HIP / QS_CUDA.
#pragma once

#if defined(__HIPCC_RTC__) || defined(__HIP_DEVICE_COMPILE__) || defined(__HIP_PLATFORM_AMD__)
#define QS_HIP 1
#else
#define QS_CUDA 1
#endif

// ---- fixed-width types (no <stdint.h> under NVRTC) ----------------------------------------
typedef unsigned char qs_u8;
typedef signed char qs_i8;
typedef unsigned short qs_u16;
typedef short qs_i16;
typedef unsigned int qs_u32;
typedef int qs_i32;
typedef unsigned long long qs_u64;
typedef long long qs_i64;
typedef double qs_f64;
typedef float qs_f32;

static_assert(sizeof(qs_u8) == 1, "qs_u8");
static_assert(sizeof(qs_u16) == 2, "qs_u16");
static_assert(sizeof(qs_u32) == 4, "qs_u32");
static_assert(sizeof(qs_u64) == 8, "qs_u64");
static_assert(sizeof(qs_f64) == 8, "qs_f64");
static_assert(sizeof(void*) == 8, "64-bit device pointers");

#define QS_DEVICE __device__ __forceinline__
#define QS_GLOBAL extern "C" __global__

// ---- warp / wavefront ------------------------------------------------------------------------
// CUDA warps are 32 lanes. AMD CDNA wavefronts are 64 (RDNA can run 32): hipRTC defines
// __AMDGCN_WAVEFRONT_SIZE for the target; -DQS_WARP_SIZE overrides both.
#ifndef QS_WARP_SIZE
#if defined(QS_HIP)
#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define QS_WARP_SIZE __AMDGCN_WAVEFRONT_SIZE
#else
#define QS_WARP_SIZE 64
#endif
#else
#define QS_WARP_SIZE 32
#endif
#endif

// Threads per block of the bandwidth kernels (sketch, compare); the GEMM has its own.
#ifndef QS_BLOCK
#define QS_BLOCK 256
#endif
#define QS_WARPS_PER_BLOCK (QS_BLOCK / QS_WARP_SIZE)
static_assert(QS_BLOCK % QS_WARP_SIZE == 0, "block must be whole warps");

#if defined(QS_HIP)
// A wavefront runs in lockstep; the barrier only orders its memory operations.
#define QS_SYNCWARP() __builtin_amdgcn_wave_barrier()
#else
#define QS_SYNCWARP() __syncwarp()
#endif

#if defined(QS_HIP)
// HIP's shuffles act on the whole wavefront and take no mask.
#define QS_SHFL_XOR(v, m) __shfl_xor((v), (m))
#define QS_SHFL(v, src) __shfl((v), (src))
#else
#define QS_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m))
#define QS_SHFL(v, src) __shfl_sync(0xffffffffu, (v), (src))
#endif

// ---- bit casts and special values ---------------------------------------------------------
QS_DEVICE qs_u32 qs_f32_bits(float v) { return __float_as_uint(v); }
QS_DEVICE float qs_f32_from_bits(qs_u32 b) { return __uint_as_float(b); }
QS_DEVICE qs_u64 qs_f64_bits(double v) { return (qs_u64)__double_as_longlong(v); }
QS_DEVICE double qs_f64_from_bits(qs_u64 b) { return __longlong_as_double((long long)b); }

QS_DEVICE double qs_inf() { return qs_f64_from_bits(0x7FF0000000000000ull); }
QS_DEVICE double qs_nan() { return qs_f64_from_bits(0x7FF8000000000000ull); }
QS_DEVICE float qs_inff() { return qs_f32_from_bits(0x7F800000u); }
QS_DEVICE float qs_nanf() { return qs_f32_from_bits(0x7FC00000u); }

// Classification by bits: independent of fast-math flags a runtime might add.
QS_DEVICE bool qs_isnan(double v) { return (qs_f64_bits(v) & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull; }
QS_DEVICE bool qs_isinf(double v) { return (qs_f64_bits(v) & 0x7FFFFFFFFFFFFFFFull) == 0x7FF0000000000000ull; }
QS_DEVICE bool qs_isfinite(double v) { return (qs_f64_bits(v) & 0x7FF0000000000000ull) != 0x7FF0000000000000ull; }
QS_DEVICE bool qs_isfinitef(float v) { return (qs_f32_bits(v) & 0x7F800000u) != 0x7F800000u; }

QS_DEVICE double qs_fmax(double a, double b) { return a > b ? a : b; }
QS_DEVICE qs_u64 qs_min_u64(qs_u64 a, qs_u64 b) { return a < b ? a : b; }
QS_DEVICE unsigned qs_min_u32(unsigned a, unsigned b) { return a < b ? a : b; }
QS_DEVICE qs_u64 qs_max_u64(qs_u64 a, qs_u64 b) { return a > b ? a : b; }

// ---- memory ordering ----------------------------------------------------------------------
// Device-scope fences order scratch writes before a last-block-done counter. Results in mapped
// host memory need none: the poller checks each slot's hash instead (qs_ring_write).
QS_DEVICE void qs_fence_device() { __threadfence(); }
QS_DEVICE void qs_store_volatile_u64(qs_u64* p, qs_u64 v) { *(volatile qs_u64*)p = v; }
QS_DEVICE qs_u64 qs_load_volatile_u64(const qs_u64* p) { return *(const volatile qs_u64*)p; }
QS_DEVICE qs_u32 qs_load_volatile_u32(const qs_u32* p) { return *(const volatile qs_u32*)p; }

// Loads of data other blocks wrote before a fence + counter handshake: coherent at L2 (the
// per-SM L1 is not) but, unlike volatile loads, free to be issued back to back.
#if defined(QS_HIP)
QS_DEVICE qs_u64 qs_ldcg_u64(const qs_u64* p) { return __hip_atomic_load(p, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT); }
#else
QS_DEVICE qs_u64 qs_ldcg_u64(const qs_u64* p) { return (qs_u64)__ldcg((const unsigned long long*)p); }
#endif
QS_DEVICE double qs_ldcg_f64(const double* p) { return qs_f64_from_bits(qs_ldcg_u64((const qs_u64*)p)); }

QS_DEVICE qs_u32 qs_atomic_add_u32(qs_u32* p, qs_u32 v) { return atomicAdd((unsigned int*)p, v); }
QS_DEVICE qs_u64 qs_atomic_add_u64(qs_u64* p, qs_u64 v) {
    return (qs_u64)atomicAdd((unsigned long long*)p, (unsigned long long)v);
}
QS_DEVICE qs_u64 qs_atomic_cas_u64(qs_u64* p, qs_u64 expected, qs_u64 desired) {
    return (qs_u64)atomicCAS((unsigned long long*)p, (unsigned long long)expected, (unsigned long long)desired);
}
QS_DEVICE void qs_atomic_or_u32(qs_u32* p, qs_u32 v) { atomicOr((unsigned int*)p, v); }
// Reductions into global memory whose old value nobody reads. On CUDA a `red.global` keeps
// the generic-address fallback (a shared-memory CAS loop per call) out of the code.
#if defined(QS_HIP)
QS_DEVICE void qs_red_add_f64(double* p, double v) { atomicAdd(p, v); }
QS_DEVICE void qs_red_add_u64(qs_u64* p, qs_u64 v) { atomicAdd((unsigned long long*)p, (unsigned long long)v); }
QS_DEVICE void qs_red_max_u64(qs_u64* p, qs_u64 v) { atomicMax((unsigned long long*)p, (unsigned long long)v); }
#else
QS_DEVICE void qs_red_add_f64(double* p, double v) { asm volatile("red.global.add.f64 [%0], %1;" ::"l"(p), "d"(v) : "memory"); }
QS_DEVICE void qs_red_add_u64(qs_u64* p, qs_u64 v) { asm volatile("red.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"); }
QS_DEVICE void qs_red_max_u64(qs_u64* p, qs_u64 v) { asm volatile("red.global.max.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"); }
#endif

// Lanes of the warp for which `pred` holds.
#if defined(QS_HIP)
QS_DEVICE unsigned qs_warp_count(bool pred) { return (unsigned)__popcll(__ballot(pred)); }
#else
QS_DEVICE unsigned qs_warp_count(bool pred) { return (unsigned)__popc(__ballot_sync(0xffffffffu, pred)); }
#endif

// ---- reductions -----------------------------------------------------------------------------
QS_DEVICE double qs_warp_sum(double v) {
#pragma unroll
    for (int m = QS_WARP_SIZE / 2; m > 0; m >>= 1) v += QS_SHFL_XOR(v, m);
    return v;
}
QS_DEVICE float qs_warp_sumf(float v) {
#pragma unroll
    for (int m = QS_WARP_SIZE / 2; m > 0; m >>= 1) v += QS_SHFL_XOR(v, m);
    return v;
}
QS_DEVICE qs_u32 qs_warp_sumu(qs_u32 v) {
#pragma unroll
    for (int m = QS_WARP_SIZE / 2; m > 0; m >>= 1) v += (qs_u32)QS_SHFL_XOR((int)v, m);
    return v;
}
QS_DEVICE qs_u64 qs_warp_sum_u64(qs_u64 v) {
#pragma unroll
    for (int m = QS_WARP_SIZE / 2; m > 0; m >>= 1) v += (qs_u64)QS_SHFL_XOR((long long)v, m);
    return v;
}
QS_DEVICE double qs_warp_max(double v) {
#pragma unroll
    for (int m = QS_WARP_SIZE / 2; m > 0; m >>= 1) v = qs_fmax(v, QS_SHFL_XOR(v, m));
    return v;
}

// ---- tensor cores (CUDA sm_80+) ---------------------------------------------------------------
// QS_HAVE_MMA: warp-level mma.sync with f32 accumulation (m16n8k8 tf32, m16n8k16 bf16 / f16),
// used by the sketch projections. Fragment layouts (PTX ISA "Matrix Fragments for mma.m16n8k*"),
// with lane = 4 g + t (g = groupID 0..7, t = threadID_in_group 0..3):
//   m16n8k8 tf32   A (16 x 8):  a0 (g, t)  a1 (g + 8, t)  a2 (g, t + 4)  a3 (g + 8, t + 4)
//                  B (8 x 8):   b0 (k = t, n = g)  b1 (k = t + 4, n = g)
//   m16n8k16 16-bit A (16 x 16), two elements per register, low half first:
//                  a[0] (g, 2t..2t+1)  a[1] (g + 8, 2t..2t+1)  a[2] (g, 2t+8..)  a[3] (g + 8, 2t+8..)
//                  B (16 x 8):  b[0] (k = 2t..2t+1, n = g)  b[1] (k = 2t+8..2t+9, n = g)
//   C (16 x 8, f32): c0 (g, 2t)  c1 (g, 2t + 1)  c2 (g + 8, 2t)  c3 (g + 8, 2t + 1)
// HIP (MFMA layouts differ) and older CUDA architectures take the scalar paths.
#if defined(QS_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define QS_HAVE_MMA 1
#else
#define QS_HAVE_MMA 0
#endif

#if QS_HAVE_MMA
QS_DEVICE void qs_mma_tf32(float (&c)[4], qs_u32 a0, qs_u32 a1, qs_u32 a2, qs_u32 a3, qs_u32 b0, qs_u32 b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// F16 = true: f16 inputs, else bf16.
template <bool F16>
QS_DEVICE void qs_mma_16bit(float (&c)[4], qs_u32 a0, qs_u32 a1, qs_u32 a2, qs_u32 a3, qs_u32 b0, qs_u32 b1) {
    if constexpr (F16) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}
// PTX prmt (generic mode): result byte i = source byte sel_i & 7 of {b, a}, or that byte's sign
// bit replicated over 8 bits when sel_i & 8.
QS_DEVICE qs_u32 qs_prmt(qs_u32 a, qs_u32 b, qs_u32 sel) {
    qs_u32 d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}
// Two f32 values as f16x2 (lo in the low half), round to nearest even (exact for the values
// the callers pass: decoded FP8).
QS_DEVICE qs_u32 qs_f16x2_from_f32(float lo, float hi) {
    unsigned short l, h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(l) : "f"(lo));
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(hi));
    return (qs_u32)l | ((qs_u32)h << 16);
}
#if __CUDA_ARCH__ >= 890
#define QS_HAVE_FP8_CVT 1
// Two OCP e4m3 codes (low byte first) as f16x2, exactly (every e4m3 value, NaN included, is an
// f16 value).
QS_DEVICE qs_u32 qs_f16x2_from_e4m3x2(qs_u32 two) {
    qs_u32 d;
    const unsigned short s = (unsigned short)(two & 0xFFFFu);
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(d) : "h"(s));
    return d;
}
#else
#define QS_HAVE_FP8_CVT 0
#endif
#endif

// ---- thread-block clusters (CUDA sm_90+) -------------------------------------------------------
// QS_HAVE_CLUSTER: the blocks of a cluster meet at one barrier and read each other's shared
// memory (distributed shared memory), instead of a global counter and a round trip through L2.
#if defined(QS_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define QS_HAVE_CLUSTER 1
// Every thread of every block of the cluster; orders shared (and global) memory writes before
// it with the reads after it, cluster-wide.
QS_DEVICE void qs_cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The two halves of a cluster barrier, for work in between that no other block waits for.
// An arrival that orders no memory: it does not wait for this thread's loads in flight.
QS_DEVICE void qs_cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
QS_DEVICE void qs_cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
QS_DEVICE qs_u32 qs_cluster_rank() {
    qs_u32 r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
// Stores v at the shared-memory address of `local`, in block `rank` of the cluster (visible to
// that block after the next cluster barrier).
QS_DEVICE void qs_cluster_store_f32(float* local, qs_u32 rank, float v) {
    const qs_u32 a = (qs_u32)__cvta_generic_to_shared(local);
    qs_u32 ra;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(rank));
    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(ra), "f"(v) : "memory");
}
// Two OCP e4m3 codes (low byte first) as bf16x2, exactly (through f16: every e4m3 value, NaN
// included, is an f16 and a bf16 value).
QS_DEVICE qs_u32 qs_bf16x2_from_e4m3x2(qs_u32 two) {
    const qs_u32 h = qs_f16x2_from_e4m3x2(two);
    float lo, hi;
    asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"((unsigned short)(h & 0xFFFFu)));
    asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"((unsigned short)(h >> 16)));
    qs_u32 d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}
#else
#define QS_HAVE_CLUSTER 0
#endif

// ---- early start (programmatic dependent launch, CUDA sm_90+) ----------------------------------
// A kernel the host launches to start before the grid ahead of it on its stream has finished
// (`PreparedLaunch::early_start`) does its set-up that reads none of that grid's memory, then
// waits here: the grid ahead has completed and its writes are visible after this. Returns at once
// for an ordinary launch, and compiles to nothing elsewhere (HIP, CUDA before sm_90). Every block
// of an early-started kernel must reach it before it exits: a kernel launched early behind ours
// waits only for our grid, so ours must not end before the GEMM ahead of it.
QS_DEVICE void qs_wait_prior_grid() {
#if defined(QS_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets a kernel launched to start early behind this one start now (it still waits for this
// grid's end before reading what it writes). Only the early-start selftest's late writer uses it:
// the checks never let the production kernel after them start before they end.
QS_DEVICE void qs_launch_dependents() {
#if defined(QS_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Waits about `ns` nanoseconds (CUDA: the global timer; elsewhere it returns at once).
QS_DEVICE void qs_sleep_ns(qs_u64 ns) {
#if defined(QS_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
    qs_u64 start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
#else
    (void)ns;
#endif
}

// ---- fast division by a run-time invariant divisor ------------------------------------------
// Scale lookups divide element coordinates by block sizes that are only known at run time;
// a hardware-free division costs ~20 instructions, a multiply-high ~2. Valid for numerators
// below 2^31 (coordinates inside one matrix); larger ones take the exact path.
struct QsFastDiv {
    qs_u32 d;
    qs_u32 mul;
    qs_u32 shr;
};
QS_DEVICE QsFastDiv qs_fastdiv_make(qs_u32 d) {
    QsFastDiv f;
    f.d = d < 1 ? 1 : d;
    if (f.d == 1) {
        f.mul = 0;
        f.shr = 0;
    } else {
        qs_u32 l = 0;
        while ((1ull << l) < f.d) ++l;  // ceil(log2 d)
        qs_u32 p = 31 + l;
        f.mul = (qs_u32)(((1ull << p) + f.d - 1) / f.d);
        f.shr = p - 32;
    }
    return f;
}
QS_DEVICE qs_u64 qs_fastdiv(qs_u64 n, const QsFastDiv& f) {
    if (f.d == 1) return n;
    if (n >= 0x80000000ull) return n / f.d;
    return (qs_u64)(__umulhi((qs_u32)n, f.mul) >> f.shr);
}
